"""Helpfulness-safety evaluation: greedy responses scored by a run's reward models.

    python eval.py --workdir=RUN --data=DIR_OR_PARQUET [--max_examples=N] [--model_path=HF_DIR]

A set is one verl parquet file (prompt-only: ``prompt`` holds the chat messages), named by its file
stem: the paper's ``alpaca_test`` (512 prompts), ``hh_rlhf_test`` (8,520 multi-turn histories) and
``pku_saferlhf_test`` (8,211), in one directory that the user passes (`SETS_ORIGIN` says where they
are published). Each prompt gets one greedy response (the run's
``sampling.max_new_tokens``, or ``--max_new_tokens``), which every reward model of the run
(``config.rewards.reward_models``) scores as during training (`gd2po_jax.rewards.reward_model`).
Prompts are rendered and limited as the run's training prompts were (``data.max_prompt_tokens``,
``data.prompt_truncation``: the safety config keeps the last 512 tokens); the reward models read the
whole prompt. ``--max_examples=N`` keeps the first N prompts of each set, in file order.

The report, ``RUN/eval/safe_alignment.json`` (one generation a line in ``safe_alignment.jsonl``,
with its ``set``; a training run with ``eval.sets`` writes the same report as ``eval/before_rl.json``,
``step_<N>.json`` and ``after_rl.json``):

  sets.<set>.<name>      the mean score of reward <name> (useful, harmless) over the set's responses
  sets.<set>.reward_sum  the mean over the set of each response's summed scores (= the sum of the
                         means: the paper's per-set "sum")
  sets.<set>.reward_truncated/<name>  the share of conversations cut to that model's max_length
  sets.<set>.truncation_rate, response_tokens  responses that hit the token budget; mean length
  overall.<metric>       the unweighted mean over the evaluated sets of sets.<set>.<metric>: every
                         set counts once, whatever its size (the paper's "Overall Avg" averages its
                         per-set columns this way); overall.num_examples is the total
  <metric>               overall.<metric> again at the top level, where a split's summary has its
                         metrics (train.py's before/after table, `set_metrics`)
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gd2po_jax.data.loaders import load_data
from gd2po_jax.data.prompts import build_prompt_set
from gd2po_jax.evaluation.generation import evaluate, write_report
from gd2po_jax.models.sampling import bucket_length
from gd2po_jax.rewards.reward_model import RewardModelReward
from gd2po_jax.rewards.scorers import REWARD_SUM, RewardModelScorer

SAFE_ALIGNMENT = "safe_alignment"
"""The name of the report. As ``--data=``, it names no directory: an error asks for ``--data=DIR``."""
SETS_ORIGIN = (
    "alpaca_test.parquet, hh_rlhf_test.parquet and pku_saferlhf_test.parquet: the test.parquet files of "
    "safe-alignment/dataset/{alpaca_prompt_only,anthropic_hh_rlhf,pku-saferlhf}/ in "
    "github.com/Qwen-Applications/GD2PO, renamed"
)
"""The paper's helpfulness-safety test sets and where they are published (for errors that ask for them)."""


def is_safe_alignment_data(data: str) -> bool:
    """Whether ``--data`` names helpfulness-safety sets: a ``.parquet`` file, a directory holding
    ``.parquet`` files (API-Bank's hold ``.json`` files), or ``safe_alignment`` (which `resolve_sets`
    refuses, asking for the directory)."""
    path = pathlib.Path(data)
    return data == SAFE_ALIGNMENT or path.suffix == ".parquet" or (path.is_dir() and any(path.glob("*.parquet")))


def resolve_sets(data: str) -> dict[str, pathlib.Path]:
    """Set name (file stem) -> parquet file of ``--data``: a directory (its ``*.parquet`` files,
    sorted by name) or one parquet file.

    Raises:
      FileNotFoundError: for ``safe_alignment`` (no default directory: it asks for ``--data=DIR`` and
        names the paper's sets, `SETS_ORIGIN`), or naming the path that does not exist or holds no
        parquet file.
    """
    if data == SAFE_ALIGNMENT:
        raise FileNotFoundError(
            f"pass --data=DIR, a directory of helpfulness-safety sets (the paper's: "
            f"{SETS_ORIGIN}), or --data=FILE.parquet"
        )
    path = pathlib.Path(data)
    if path.is_dir():
        files = sorted(path.glob("*.parquet"))
        if not files:
            raise FileNotFoundError(f"{path} holds no .parquet file (a helpfulness-safety set is a verl parquet file)")
        return {file.stem: file for file in files}
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (a directory of verl parquet sets, or one such file)")
    return {path.stem: path}


def set_prompts(
    path: pathlib.Path,
    tokenizer,
    *,
    max_examples: int,
    max_prompt_tokens: int,
    truncation: str | None,
    template_kwargs: Mapping[str, Any] | None = None,
):
    """The `PromptSet` of one set: its first ``max_examples`` prompts (0: all), rendered with the
    policy's chat template (and the run's ``data.template_kwargs``) and limited as the run's training prompts."""
    dataset = load_data(path, kind="verl", require_ground_truth=False).dataset
    if max_examples:
        dataset = dataset.select(range(min(max_examples, len(dataset))))
    return build_prompt_set(
        dataset,
        tokenizer,
        max_prompt_tokens=max_prompt_tokens,
        where=str(path),
        truncation=truncation,
        template_kwargs=template_kwargs,
    )


def overall(per_set: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """The unweighted mean over the sets of each numeric metric every set has (each set counts once),
    with ``num_examples`` summed and ``num_sets``."""
    summaries = list(per_set.values())
    metrics = [
        k
        for k, v in summaries[0].items()
        if k != "num_examples" and isinstance(v, float) and all(isinstance(s.get(k), float) for s in summaries)
    ]
    result = {name: float(np.mean([s[name] for s in summaries])) for name in metrics}
    result["num_examples"] = int(sum(s["num_examples"] for s in summaries))
    result["num_sets"] = len(summaries)
    return result


def evaluate_safe_alignment(
    policy,
    sets: Mapping[str, pathlib.Path],
    reward_fn: RewardModelReward,
    out_dir: pathlib.Path,
    *,
    batch_size: int,
    max_new_tokens: int,
    max_examples: int,
    max_prompt_tokens: int,
    truncation: str | None,
    progress: bool,
    extra: Mapping[str, Any] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    name: str = SAFE_ALIGNMENT,
) -> dict[str, Any]:
    """Greedy generation on every set, scored by ``reward_fn``'s models; writes
    ``out_dir/<name>.json`` (the module docstring's report, with ``extra``) and ``<name>.jsonl``, and
    returns the report.

    Args:
      policy: a `gd2po_jax.evaluation.policy.Policy` (model, tokenizer, EOS and pad ids).
      sets: set name -> parquet file (`resolve_sets`).
      name: the report's name (eval.py: `SAFE_ALIGNMENT`; a training run: before_rl, step_<N>, after_rl).
    """
    scorer = RewardModelScorer(reward_fn)
    per_set: dict[str, dict[str, float]]
    records: list[dict[str, Any]]
    per_set, records = {}, []
    for set_name, path in sets.items():
        prompts = set_prompts(
            path,
            policy.tokenizer,
            max_examples=max_examples,
            max_prompt_tokens=max_prompt_tokens,
            truncation=truncation,
            template_kwargs=template_kwargs,
        )
        summary, set_records = evaluate(
            policy.model,
            prompts,
            policy.tokenizer,
            scorer,
            batch_size=batch_size,
            max_new_tokens=max_new_tokens,
            eos_token_ids=policy.eos_ids,
            pad_token_id=policy.pad_id,
            prompt_length=bucket_length(prompts.max_tokens),
            progress=progress,
            desc=f"{set_name} ({len(prompts)} prompts)",
        )
        per_set[set_name] = summary
        records.extend({"set": set_name, **record} for record in set_records)
    average = overall(per_set)
    report = {
        **average,
        "sets": per_set,
        "overall": average,
        "reward_names": list(scorer.names),
        "data": {set_name: str(path) for set_name, path in sets.items()},
        "max_new_tokens": max_new_tokens,
        "max_examples": max_examples,
        "reward_models": {name: model.path for name, model in reward_fn.models.items()},
        **(extra or {}),
    }
    write_report(out_dir, name, report, records)
    return report


def set_metrics(report: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a report (`evaluate_safe_alignment`) as metrics.jsonl names them (without the
    ``eval/`` prefix): ``<metric>`` of ``overall`` (the mean of the sets) and ``<set>/<metric>`` of
    each set (``alpaca_test/useful``, ``alpaca_test/harmless``, ``alpaca_test/reward_sum`` ...)."""

    def numbers(summary: Mapping[str, Any]) -> dict[str, float]:
        return {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}

    metrics = numbers(report["overall"])
    for set_name, summary in report["sets"].items():
        metrics.update({f"{set_name}/{k}": v for k, v in numbers(summary).items()})
    return metrics


def safe_alignment_table(report: Mapping[str, Any], title: str = "") -> str:
    """The report as a text table: a row per set and the overall average; columns: each reward's
    mean, their sum, the truncation rate and the number of prompts."""
    names: Sequence[str] = report["reward_names"]
    columns = [*names, REWARD_SUM, "truncation_rate"]
    width = max(12, *(len(c) + 2 for c in columns))
    lines = [title] if title else []
    lines.append(f"{'set':<24}" + "".join(f"{c:>{width}}" for c in columns) + f"{'prompts':>9}")
    rows = [*report["sets"].items(), ("overall (mean of sets)", report["overall"])]
    for name, summary in rows:
        cells = "".join(f"{summary.get(c, float('nan')):>{width}.4f}" for c in columns)
        lines.append(f"{name:<24}{cells}{summary['num_examples']:>9}")
    return "\n".join(lines)
