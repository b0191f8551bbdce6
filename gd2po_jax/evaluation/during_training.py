"""What the trainer calls to evaluate a run: before RL, every ``eval.every_steps`` and after RL.

`eval_target` says what a run evaluates (a split of its data, or the helpfulness-safety sets of
``config.eval.sets``), checked when the run starts; `evaluate_run` evaluates the policy on it
greedily (`evaluate_split`: scored as the run's task says, `gd2po_jax.tasks.Task.eval_scorer`);
`eval_metrics` / `logged_before_rl` turn a summary into metrics.jsonl's ``eval/...``.
"""

from __future__ import annotations

import pathlib
from typing import Any, Mapping

from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.evaluation.generation import evaluate, write_report
from gd2po_jax.evaluation.policy import Policy
from gd2po_jax.evaluation.safe_alignment import evaluate_safe_alignment, resolve_sets, set_metrics
from gd2po_jax.rewards.reward_model import RewardModelReward
from gd2po_jax.tasks import task_of
from gd2po_jax.tasks.setup import RunSetup, eval_split

SETS = "sets"
"""What a training run with ``eval.sets`` evaluates, in place of a split's name (`eval_target`)."""


def evaluate_split(
    config: RunConfig,
    setup: RunSetup,
    model,
    split: str,
    out_dir: pathlib.Path,
    name: str,
    *,
    progress: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Greedy evaluation on ``split`` of the run's data, scored as its task says
    (`gd2po_jax.tasks.Task.eval_scorer`); writes ``out_dir/<name>.json``
    (with the fields of ``extra``, e.g. which policy it was) and ``<name>.jsonl`` and returns the
    summary (``correct_acc``, ``format_acc``, ``length``, ...; for reward models each reward's mean,
    ``reward_sum`` and ``reward_names``). Each file is written once, atomically: a summary on disk is
    a finished evaluation."""
    task = task_of(config)
    scorer = task.eval_scorer(config, setup.reward_fn)
    summary: dict[str, Any]  # the numbers, then the report (split, names, extra)
    summary, records = evaluate(
        model,
        setup.evals[split],
        setup.tokenizer,
        scorer,
        batch_size=config.eval.batch_size,
        max_new_tokens=config.sampling.max_new_tokens,
        eos_token_ids=setup.eos_ids,
        pad_token_id=setup.pad_id,
        prompt_length=setup.prompt_length,
        progress=progress,
        desc=f"eval {name}",
    )
    reward_names = getattr(scorer, "names", None)  # scored by the run's reward functions or reward models
    if reward_names is None and config.rewards.kind == "reward_model":
        reward_names = config.rewards.names  # a task's own scorer around the reward models
    if reward_names is not None:
        summary = {"split": split, **summary, "reward_names": list(reward_names), **(extra or {})}
    else:
        summary = {
            "split": split,
            **summary,
            "correct_acc": summary.get("correct"),
            "format_acc": summary.get("format"),
            **(extra or {}),
        }
    summary = task.eval_summary(config, summary)
    write_report(out_dir, name, summary, records)
    return summary


def eval_target(config: RunConfig, setup: RunSetup) -> str | None:
    """What a training run evaluates before RL, every ``eval.every_steps`` and after RL: `SETS` when
    ``config.eval.sets`` names helpfulness-safety sets, else the split (`gd2po_jax.tasks.setup.eval_split`;
    None: nothing). Called when the run starts, before anything is computed.

    Raises:
      ConfigError: naming ``config.eval.sets``: no such directory or file (or one without parquet
        sets), or a run whose rewards are not the reward models alone (which score the sets); or
        `eval_split`'s.
    """
    if not config.eval.sets:
        return eval_split(config, setup)
    try:
        resolve_sets(config.eval.sets)
    except FileNotFoundError as err:
        raise ConfigError(f"config.eval.sets={config.eval.sets!r}: {err}") from None
    if not isinstance(setup.reward_fn, RewardModelReward):
        raise ConfigError(
            f"config.eval.sets: helpfulness-safety sets are scored by the run's reward models, but its "
            f"rewards are config.rewards.kind={config.rewards.kind!r}"
            f"{' with rewards.functions' if config.rewards.functions else ''}: use "
            "rewards.kind='reward_model' without rewards.functions, or leave config.eval.sets empty"
        )
    return SETS


def evaluate_run(
    config: RunConfig,
    setup: RunSetup,
    model,
    split: str,
    out_dir: pathlib.Path,
    name: str,
    *,
    progress: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One evaluation of a training run (``name``: before_rl, step_<N>, after_rl) on what `eval_target`
    gave: with `SETS`, the sets of ``config.eval.sets``, greedy at the run's ``sampling.max_new_tokens``,
    prompts as the training prompts (``data.max_prompt_tokens``, ``data.prompt_truncation``), the
    first ``eval.max_examples`` of each, scored by the run's reward models
    (`gd2po_jax.evaluation.safe_alignment.evaluate_safe_alignment`); else the split (`evaluate_split`).
    Writes ``out_dir/<name>.json`` and ``.jsonl``; returns the summary (`eval_metrics` reads it)."""
    if split != SETS:
        return evaluate_split(config, setup, model, split, out_dir, name, progress=progress, extra=extra)
    policy = Policy(model=model, tokenizer=setup.tokenizer, eos_ids=setup.eos_ids, pad_id=setup.pad_id, source={})
    return evaluate_safe_alignment(
        policy,
        resolve_sets(config.eval.sets),
        setup.reward_fn,
        out_dir,
        batch_size=config.eval.batch_size,
        max_new_tokens=config.sampling.max_new_tokens,
        max_examples=config.eval.max_examples,
        max_prompt_tokens=config.data.max_prompt_tokens,
        truncation=config.data.prompt_truncation,
        template_kwargs=config.data.template_kwargs,
        progress=progress,
        extra=extra,
        name=name,
    )


def eval_metrics(summary: Mapping[str, Any]) -> dict[str, Any]:
    """An evaluation's numbers as metrics.jsonl's ``eval/...``: a split's ``eval/<metric>``; a sets
    evaluation's overall mean as ``eval/<metric>`` and each set's as ``eval/<set>/<metric>``
    (`gd2po_jax.evaluation.safe_alignment.set_metrics`: ``eval/alpaca_test/useful`` ...)."""
    if "sets" in summary:
        return {f"eval/{k}": v for k, v in set_metrics(summary).items()}
    return {f"eval/{k}": v for k, v in summary.items() if isinstance(v, (int, float))}


def logged_before_rl(config: RunConfig, before: Mapping[str, Any] | None) -> dict[str, Any]:
    """The before-RL evaluation's `eval_metrics`, logged as step 0 of metrics.jsonl (as verl's
    ``val_before_train`` logs at step 0) for a run that validates on ``eval.sets``; empty otherwise
    (a split's before-RL evaluation is in ``eval/before_rl.json`` only)."""
    return eval_metrics(before) if before is not None and config.eval.sets else {}
