"""What ``python eval.py`` does: pick a policy, generate greedily, score, write a report.

The policy is a training run's (``--workdir=DIR``, checkpoint ``--checkpoint_step`` or the latest,
else ``DIR/policy``) or a plain model's (``--model_path=HF_DIR``): `gd2po_jax.evaluation.policy`.

Four kinds of evaluation:

  a split          ``--split=test|validation`` of the run's own data, scored as the run's task says
                   (`gd2po_jax.evaluation.during_training.evaluate_split`: the tool-calling metrics,
                   or the run's reward models for a reward_model run) -> ``DIR/eval/<split>.json``
                   (+ ``.jsonl``).
  API-Bank         ``--data=PATH`` of an API-Bank directory / level file (or ``--data=api_bank`` with
                   ``--api_bank_dir=DIR``), scored as docs/algorithm.md#api-bank-metric says
                   -> ``DIR/eval/api_bank.json`` (+ ``.jsonl``).
  safe alignment   ``--data=PATH`` of a directory of verl parquet sets / one such file, scored by the
                   reward models of the run in ``--workdir`` (`gd2po_jax.evaluation.safe_alignment`)
                   -> ``DIR/eval/safe_alignment.json`` (+ ``.jsonl``).
  your own data    ``--data=SOURCE``, anything else the run's loaders read (a JSONL, parquet or JSON
                   file, a directory or glob of them, a ``save_to_disk`` folder, a Hub id:
                   `gd2po_jax.data.sources.load_source`), rendered as the run's prompts and scored as
                   a split of the run is (its own reward functions, reward models or family)
                   -> ``DIR/eval/data-<name>.json`` (+ ``.jsonl``; `data_report_name`).

Every table lists the metrics the run is scored by (`summary_rows`): each reward and their sum for
a run of reward functions or reward models, the tool-calling metrics for the ToolRL family.

No data set has a default location: the user passes the directory (`API_BANK_ORIGIN` and
`gd2po_jax.evaluation.safe_alignment.SETS_ORIGIN` say where they are published).

Generation is greedy (`gd2po_jax.evaluation.generation.evaluate`). ``--habits`` generates nothing:
it prints the habit breakdown that the run's task gives (`gd2po_jax.tasks.Task.habit_breakdown`,
the synthetic_tools task's) of its saved generations ``DIR/eval/<name>.jsonl`` (before_rl and
after_rl, or ``--split``'s).

Errors are `gd2po_jax.evaluation.policy.EvalError`s naming the flag or file to fix (eval.py prints
them in one line: `gd2po_jax.cli.user_errors`).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections import defaultdict
from typing import Any, Mapping, Sequence, cast

from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.data.loaders import DataFormatError, detect_kind, load_data
from gd2po_jax.data.prompts import PromptSet, build_prompt_set
from gd2po_jax.evaluation.api_bank import (
    DEFAULT_MAX_THINK_WORDS,
    ApiBankReport,
    api_bank_report,
    api_bank_scorer,
)
from gd2po_jax.evaluation.during_training import evaluate_split
from gd2po_jax.evaluation.generation import evaluate, response_budgets, write_report
from gd2po_jax.evaluation.policy import EvalError, Policy, policy_from_model_path, policy_from_run
from gd2po_jax.evaluation.safe_alignment import (
    SAFE_ALIGNMENT,
    evaluate_safe_alignment,
    is_safe_alignment_data,
    resolve_sets,
    safe_alignment_table,
)
from gd2po_jax.models.sampling import bucket_length
from gd2po_jax.rewards.base import build_reward_function
from gd2po_jax.rewards.reward_model import RewardModelReward
from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.distributed import is_primary
from gd2po_jax.runtime.run_dir import RunDir, RunDirError
from gd2po_jax.runtime.sharding import mesh_of
from gd2po_jax.tasks import task_named, task_of
from gd2po_jax.tasks.base import NoHabitsError
from gd2po_jax.tasks.files import load_file
from gd2po_jax.tasks.setup import build_setup, reward_spec

API_BANK = "api_bank"
"""``--data=api_bank``: the API-Bank directory ``--api_bank_dir`` names (no default)."""
API_BANK_ORIGIN = (
    "the level-{1,2,3}-api_processed.json files of tool-calling/API_Bank/ in github.com/Qwen-Applications/GD2PO"
)
"""Where the API-Bank evaluation files are published (for errors that ask for them)."""
API_BANK_MAX_NEW_TOKENS = 4096  # docs/algorithm.md#api-bank-metric
API_BANK_MAX_TOTAL_TOKENS = 4096
"""Prompt + response tokens of an API-Bank example with ``--model_path`` (no run config): the official
generate_deterministic.py's vLLM ``max_model_len`` default (a run's is ``eval.max_total_tokens``)."""
MODEL_PATH_BATCH_SIZE = 32


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """eval.py's flags (see eval.py for their help).

    ``max_new_tokens`` / ``batch_size`` None: the run's config values for a split; for API-Bank
    4096 new tokens and the run's ``eval.batch_size`` (32 with ``model_path``).
    ``max_total_tokens`` None: for API-Bank the run's ``eval.max_total_tokens`` (4096 with
    ``model_path``, `API_BANK_MAX_TOTAL_TOKENS`); 0: no cap.
    ``max_examples`` 0: every example (per level for API-Bank).
    ``habits``: names of saved evaluations (``before_rl``, ``after_rl``, ``test`` ...) whose habit
    breakdown to print instead of evaluating.
    """

    workdir: str = ""
    split: str = "test"
    checkpoint_step: int | None = None
    data: str = ""
    api_bank_dir: str = ""
    model_path: str = ""
    dtype: str = "bfloat16"
    max_new_tokens: int | None = None
    max_total_tokens: int | None = None
    batch_size: int | None = None
    max_examples: int = 0
    max_think_words: int = DEFAULT_MAX_THINK_WORDS
    max_prompt_tokens: int = 4096
    habits: tuple[str, ...] = ()
    progress: bool = True


# ----------------------------------------------------------------------------------------------
# Where things are.
# ----------------------------------------------------------------------------------------------


def output_dir(options: EvalOptions) -> pathlib.Path:
    """The workdir reports go to: ``--workdir``, or ``runs/eval/<model dir name>`` for a plain
    model evaluated without one."""
    if options.workdir:
        return pathlib.Path(options.workdir)
    if options.model_path:
        return pathlib.Path("runs") / "eval" / pathlib.Path(options.model_path).resolve().name
    raise EvalError("pass --workdir=DIR (a training run directory) or --model_path=HF_DIR")


def reports_dir(workdir: pathlib.Path) -> pathlib.Path:
    """Where the reports of an evaluation of the run in ``workdir`` go: ``workdir/eval``; for a run on
    storage this process cannot write (a finished run on a read-only mount: `run_dir.is_read_only`),
    ``runs/eval/<workdir name>/eval`` under the current directory, as for a ``--model_path``."""
    if run_dir.is_read_only(workdir):
        return RunDir(pathlib.Path("runs") / "eval" / pathlib.Path(workdir).resolve().name).eval_dir
    return RunDir(workdir).eval_dir


def load_run_config_or_eval_error(workdir: pathlib.Path) -> RunConfig:
    """`run_dir.load_run_config` of the training run in ``workdir``, its errors as `EvalError` (a
    missing ``config.json`` with a hint to ``--model_path``)."""
    file = RunDir(workdir).config
    if not file.is_file():
        raise EvalError(
            f"{file} not found: --workdir must be a directory written by train.py; to evaluate a "
            "Hugging Face model directory instead, pass --model_path=HF_DIR"
        )
    try:
        return run_dir.load_run_config(workdir)
    except (ConfigError, RunDirError) as err:  # both name the file
        raise EvalError(str(err)) from None


def resolve_api_bank(data: str, api_bank_dir: str) -> pathlib.Path:
    """The API-Bank directory or level file ``--data`` names (``api_bank``: ``--api_bank_dir``).

    Raises:
      EvalError: ``api_bank`` without ``--api_bank_dir``, or a path that does not exist, naming the
        flag and where the files are published (`API_BANK_ORIGIN`).
    """
    if data == API_BANK and not api_bank_dir:
        raise EvalError(
            f"--data=api_bank needs --api_bank_dir=DIR (or pass --data=DIR): a directory of {API_BANK_ORIGIN}"
        )
    path = pathlib.Path(api_bank_dir if data == API_BANK else data)
    if not path.exists():
        flag = f"--api_bank_dir={api_bank_dir}" if data == API_BANK else f"--data={data}"
        raise EvalError(
            f"{flag}: {path} does not exist (an API-Bank directory of level-N files, or one such "
            f"file: {API_BANK_ORIGIN})"
        )
    return path


def habits_of_workdir(workdir: pathlib.Path, names: Sequence[str]) -> tuple[dict[str, Any], str]:
    """(the habit breakdown, its table) that the task of the run in ``workdir`` gives
    (`gd2po_jax.tasks.Task.habit_breakdown`, `Task.habit_table`) of the saved generations
    ``eval/<name>.jsonl`` of each of ``names``.

    Raises:
      EvalError: the run's task has no habit breakdown, or an evaluation was not saved.
    """
    config = load_run_config_or_eval_error(workdir)
    task = task_named(config.task)  # a finished run: its config is read, not checked again

    def generations(name: str):
        file = RunDir(workdir).eval_generations(name)
        if not file.is_file():
            raise EvalError(
                f"--habits: {file} not found (evaluations are saved by train.py as "
                "before_rl / after_rl, by eval.py as test / validation)"
            )
        return run_dir.read_jsonl(file)

    try:
        breakdown = task.habit_breakdown(config, names, generations)
    except NoHabitsError as err:
        raise EvalError(f"--habits: {RunDir(workdir).config} {err}") from None
    return breakdown, task.habit_table(config, breakdown)


# ----------------------------------------------------------------------------------------------
# API-Bank.
# ----------------------------------------------------------------------------------------------


def first_per_level(levels: list[Any], max_examples: int) -> list[int]:
    """Indices of the first ``max_examples`` rows of each level, in file order (0: all rows)."""
    seen: dict[Any, int] = defaultdict(int)
    keep = []
    for index, level in enumerate(levels):
        if not max_examples or seen[level] < max_examples:
            keep.append(index)
            seen[level] += 1
    return keep


def api_bank_prompts(
    path: pathlib.Path,
    tokenizer,
    max_examples: int,
    max_prompt_tokens: int,
    template_kwargs: Mapping[str, Any] | None = None,
) -> PromptSet:
    """API-Bank system + user messages through the chat template (first ``max_examples`` per level),
    with ``template_kwargs`` (a run's ``data.template_kwargs``)."""
    dataset = load_data(path, kind="api_bank").dataset
    dataset = dataset.select(first_per_level(list(dataset["level"]), max_examples))
    return build_prompt_set(
        dataset,
        tokenizer,
        max_prompt_tokens=max_prompt_tokens,
        where=f"API-Bank data {path} (--max_prompt_tokens)",
        template_kwargs=template_kwargs,
    )


def evaluate_api_bank(
    policy: Policy,
    path: pathlib.Path,
    out_dir: pathlib.Path,
    *,
    batch_size: int,
    max_new_tokens: int,
    max_examples: int,
    max_think_words: int,
    max_prompt_tokens: int,
    progress: bool,
    template_kwargs: Mapping[str, Any] | None = None,
    max_total_tokens: int = 0,
) -> dict[str, Any]:
    """Greedy generation over API-Bank; writes ``out_dir/api_bank.json`` and ``api_bank.jsonl``.

    Each example gets at most ``max_new_tokens`` (the official ``max_tokens``) and, with
    ``max_total_tokens`` > 0, at most ``max_total_tokens`` minus its prompt's tokens (the official
    vLLM ``max_model_len``, tool-calling/API_Bank/generate_deterministic.py: 4096 for both):
    `gd2po_jax.evaluation.generation.evaluate` generates the set in one program at its shortest
    prompt's budget and cuts each response to its own."""
    prompts = api_bank_prompts(path, policy.tokenizer, max_examples, max_prompt_tokens, template_kwargs)
    try:  # before any generation: a prompt that leaves no token of a response
        response_budgets([len(ids) for ids in prompts.token_ids], max_new_tokens, max_total_tokens, f"API-Bank {path}")
    except ValueError as err:
        raise EvalError(str(err)) from None
    summary, records = evaluate(
        policy.model,
        prompts,
        policy.tokenizer,
        api_bank_scorer(max_think_words),
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        eos_token_ids=policy.eos_ids,
        pad_token_id=policy.pad_id,
        prompt_length=bucket_length(prompts.max_tokens),
        progress=progress,
        desc="API-Bank",
        max_total_tokens=max_total_tokens,
    )
    report = api_bank_report(records)
    result = {
        **report.to_dict(),
        "num_examples": len(records),
        "data": str(path),
        "policy": policy.source,
        "max_new_tokens": max_new_tokens,
        "max_total_tokens": max_total_tokens,
        "max_think_words": max_think_words,
        "truncation_rate": summary["truncation_rate"],
        "response_tokens": summary["response_tokens"],
    }
    write_report(out_dir, API_BANK, result, records)
    return result


# ----------------------------------------------------------------------------------------------
# Entry point.
# ----------------------------------------------------------------------------------------------


TOOL_CALLING_ROWS = (
    ("Correct Acc", "correct_acc"),
    ("Format Acc", "format_acc"),
    ("Length", "length"),
    ("Correctness", "correctness"),
)
"""(label, summary key) of the tool-calling metrics (a split scored by the ToolRL family alone)."""


def summary_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, summary key) of the metrics an evaluation was scored by: each of its ``reward_names``
    and their (weighted) sum when the run's rewards scored it (reward functions, reward models), else
    the tool-calling metrics (`TOOL_CALLING_ROWS`); then the truncation rate and response tokens."""
    names = summary.get("reward_names")
    rows = [(name, name) for name in names] + [("Sum", "reward_sum")] if names else list(TOOL_CALLING_ROWS)
    return [("examples", "num_examples"), *rows, ("Truncation", "truncation_rate"), ("Resp. tokens", "response_tokens")]


def split_table(summary: dict[str, Any], task_lines: str = "") -> str:
    """The headline metrics of a split evaluation (`summary_rows`) as a two-column text table,
    ``task_lines`` under it (the run's `gd2po_jax.tasks.Task.split_table_extra`: e.g. the
    safety_embedded task's per request type)."""
    where = f"{summary['data']}" if summary.get("data") else f"{summary['split']} split"
    lines = [f"{where}  ({_describe(summary['policy'])})"]
    width = max(14, *(len(label) + 2 for label, _ in summary_rows(summary)))
    for label, key in summary_rows(summary):
        value = summary.get(key)
        lines.append(f"{label:<{width}}{'-' if value is None else format(value, '.4g'):>10}")
    if task_lines:
        lines.append(task_lines)
    return "\n".join(lines)


def _describe(source: dict[str, Any]) -> str:
    if "step" in source:
        return f"checkpoint step {source['step']}"
    return source["model_path"]


def _run_setup(options: EvalOptions, workdir: pathlib.Path):
    """(config, setup) of the training run in ``workdir``, with the eval flags applied to the config."""
    changes = {"eval.max_examples": options.max_examples}
    if options.batch_size:
        changes["eval.batch_size"] = options.batch_size
    if options.max_new_tokens and not options.data:
        changes["sampling.max_new_tokens"] = options.max_new_tokens
    config = load_run_config_or_eval_error(workdir).replace(changes)
    return config, build_setup(config, workdir)


def _evaluate_split(options: EvalOptions, workdir: pathlib.Path) -> tuple[dict[str, Any], str]:
    """(the summary, its `split_table`) of ``--split`` of the run in ``workdir``."""
    if options.model_path:
        raise EvalError(
            "--model_path needs --data (api_bank, safe_alignment, or a path to such data): a plain "
            "model has no training config to take a --split from"
        )
    config, setup = _run_setup(options, workdir)
    if options.split not in setup.evals:
        raise EvalError(
            f"--split={options.split}: the run has no such split (config.data.{options.split} "
            f"is empty); available: {sorted(setup.evals)}"
        )
    policy = policy_from_run(config, setup, workdir, options.checkpoint_step)
    summary = evaluate_split(
        config,
        setup,
        policy.model,
        options.split,
        reports_dir(workdir),
        options.split,
        progress=options.progress,
        extra={"policy": policy.source},
    )
    return summary, split_table(summary, task_of(config).split_table_extra(config, summary))


def data_report_name(data: str) -> str:
    """The report name of ``--data=SOURCE`` (your own data): ``data-<its file, folder or repository
    name without the extension>``, e.g. ``val.jsonl`` -> ``data-val`` (eval/data-val.json)."""
    location = data.rstrip("/").rsplit(":", 1)[0] if not pathlib.Path(data).exists() else data.rstrip("/")
    stem = pathlib.PurePath(location).name
    for suffix in (".jsonl", ".json", ".parquet"):
        stem = stem.removesuffix(suffix)
    return "data-" + ("".join(c if c.isalnum() or c in "-_." else "_" for c in stem) or "data")


def is_api_bank_data(data: str) -> bool:
    """Whether ``--data`` names API-Bank: ``api_bank``, a directory of ``level-N-api_processed.json``
    files, or one such file (a JSON file with API-Bank's keys)."""
    if data == API_BANK:
        return True
    path = pathlib.Path(data)
    if path.is_dir():
        return any(path.glob("level-*-api_processed.json"))
    if path.is_file() and path.suffix == ".json":
        try:
            return detect_kind(path) == "api_bank"
        except (ValueError, DataFormatError):
            return False
    return False


def _evaluate_data(options: EvalOptions, workdir: pathlib.Path) -> tuple[dict[str, Any], str]:
    """(the summary, its `split_table`) of ``--data``, data of your own in any form the run's loaders
    read, rendered as the run's prompts and scored as the run's splits are (`evaluate_split`)."""
    if options.model_path or not RunDir(workdir).config.is_file():
        raise EvalError(
            f"--data={options.data}: data of your own is scored by a training run's rewards: pass "
            "--workdir=RUN (a directory written by train.py), not --model_path"
        )
    config, setup = _run_setup(options, workdir)
    try:
        dataset = load_file(options.data, config, "data", what="--data")
    except ConfigError as err:
        raise EvalError(str(err)) from None
    if options.max_examples:
        dataset = dataset.select(range(min(options.max_examples, len(dataset))))
    try:
        prompts = build_prompt_set(
            dataset,
            setup.tokenizer,
            max_prompt_tokens=config.data.max_prompt_tokens,
            where=f"--data={options.data}",
            truncation=config.data.prompt_truncation,
            template_kwargs=config.data.template_kwargs,
            tools_column=config.data.tools_column,
        )
    except ValueError as err:
        raise EvalError(str(err)) from None
    name = data_report_name(options.data)
    setup = dataclasses.replace(
        setup,
        evals={**setup.evals, name: prompts},
        prompt_length=max(setup.prompt_length, bucket_length(prompts.max_tokens)),
    )
    policy = policy_from_run(config, setup, workdir, options.checkpoint_step)
    summary = evaluate_split(
        config,
        setup,
        policy.model,
        name,
        RunDir(workdir).eval_dir,
        name,
        progress=options.progress,
        extra={"policy": policy.source, "data": options.data},
    )
    return summary, split_table(summary, task_of(config).split_table_extra(config, summary))


def _evaluate_api_bank(options: EvalOptions, workdir: pathlib.Path) -> dict[str, Any]:
    path = resolve_api_bank(options.data, options.api_bank_dir)
    template_kwargs = None
    if options.model_path:
        policy, batch_size = policy_from_model_path(options.model_path, options.dtype), MODEL_PATH_BATCH_SIZE
        max_total_tokens = API_BANK_MAX_TOTAL_TOKENS
    else:
        config, setup = _run_setup(options, workdir)
        policy, batch_size = policy_from_run(config, setup, workdir, options.checkpoint_step), config.eval.batch_size
        template_kwargs = config.data.template_kwargs  # rendered as the run's prompts were
        max_total_tokens = config.eval.max_total_tokens
    if options.max_total_tokens is not None:
        max_total_tokens = options.max_total_tokens
    if max_total_tokens < 0:
        raise EvalError(f"--max_total_tokens={max_total_tokens}: must be >= 0 (0: no cap)")
    return evaluate_api_bank(
        policy,
        path,
        reports_dir(workdir),
        batch_size=options.batch_size or batch_size,
        max_new_tokens=options.max_new_tokens or API_BANK_MAX_NEW_TOKENS,
        max_examples=options.max_examples,
        max_think_words=options.max_think_words,
        max_prompt_tokens=options.max_prompt_tokens,
        progress=options.progress,
        template_kwargs=template_kwargs,
        max_total_tokens=max_total_tokens,
    )


def _evaluate_safe_alignment(options: EvalOptions, workdir: pathlib.Path) -> dict[str, Any]:
    """The helpfulness-safety sets of ``--data``, scored by the reward models of the run in ``workdir``;
    the policy is the run's, or ``--model_path`` (its own tokenizer decodes its responses)."""
    try:
        sets = resolve_sets(options.data)
    except FileNotFoundError as err:
        raise EvalError(f"--data={options.data}: {err}") from None
    config = load_run_config_or_eval_error(workdir)
    if config.rewards.kind != "reward_model":
        raise EvalError(
            f"--data={options.data}: helpfulness-safety sets are scored by a run's reward models, but "
            f"the run in {workdir} has config.rewards.kind={config.rewards.kind!r} (train with "
            "configs/safety.py, or pass its --workdir)"
        )
    if options.model_path:
        policy = policy_from_model_path(options.model_path, options.dtype)
        config = task_of(config).prepare(config, workdir, progress=options.progress)  # e.g. the run's own reward models
        reward_fn = build_reward_function(
            reward_spec(config, tokenizer=policy.tokenizer, eos_ids=policy.eos_ids, mesh=mesh_of(policy.model))
        )
        batch_size = MODEL_PATH_BATCH_SIZE
    else:
        config, setup = _run_setup(options, workdir)
        policy, reward_fn = policy_from_run(config, setup, workdir, options.checkpoint_step), setup.reward_fn
        batch_size = config.eval.batch_size
    return evaluate_safe_alignment(
        policy,
        sets,
        cast(RewardModelReward, reward_fn),  # config.rewards.kind == "reward_model" (checked above)
        reports_dir(workdir),
        batch_size=options.batch_size or batch_size,
        max_new_tokens=options.max_new_tokens or config.sampling.max_new_tokens,
        max_examples=options.max_examples,
        max_prompt_tokens=config.data.max_prompt_tokens,
        truncation=config.data.prompt_truncation,
        template_kwargs=config.data.template_kwargs,
        progress=options.progress,
        extra={"policy": policy.source},
    )


def _scored_by_reward_models(options: EvalOptions, workdir: pathlib.Path) -> bool:
    """Whether parquet ``--data`` means the helpfulness-safety sets: ``safe_alignment``, a plain
    model (scored by a run's reward models), or a run of ``rewards.kind='reward_model'`` without
    reward functions; else it is data of your own, scored as the run's splits are."""
    if options.data == SAFE_ALIGNMENT or options.model_path or not RunDir(workdir).config.is_file():
        return True
    config = load_run_config_or_eval_error(workdir)
    return config.rewards.kind == "reward_model" and not config.rewards.functions


def run(options: EvalOptions) -> dict[str, Any]:
    """Evaluate as ``options`` ask; returns the summary written to ``<workdir>/eval/<name>.json``
    and prints a table when ``options.progress``. With ``options.habits``, returns (and prints) the
    habit breakdown of saved generations instead, and writes nothing.

    An evaluation holds the workdir's lock (`run_dir.lock_workdir`): it stops at once, naming the
    holder, while train.py (or another eval.py) works there. ``--habits`` only reads: no lock. A
    finished run on storage this process cannot write is read without the lock, and the reports go
    to `reports_dir` (``runs/eval/<workdir name>/eval``).

    Raises:
      EvalError: naming the flag or file to fix.
      RunDirError: the workdir is busy, or a checkpoint is damaged (naming it).
    """
    workdir = output_dir(options)
    if not is_primary():  # several processes evaluate together; process 0 reports (and writes)
        options = dataclasses.replace(options, progress=False)
    if options.habits:
        if options.model_path or options.data:
            raise EvalError("--habits reads a training run's saved generations: pass only --workdir=DIR")
        result, table = habits_of_workdir(workdir, options.habits)
        if options.progress:
            print(table)
        return result
    # Evaluations write into the workdir and read its checkpoints, which a running train.py
    # prunes: one process at a time (a workdir without config.json fails below, unlocked).
    # Several processes: process 0 holds the lock for all.
    locks = (options.model_path or RunDir(workdir).config.is_file()) and is_primary()
    lock = run_dir.lock_workdir(workdir, "eval.py", readers_ok=True) if locks else None  # read-only: no lock
    try:
        if lock is not None and not lock.read_only:
            run_dir.remove_stale_staging(RunDir(workdir).eval_dir, all_stale=True)
        if options.data and is_api_bank_data(options.data):
            result = _evaluate_api_bank(options, workdir)
            table = api_bank_table(result)
        elif options.data and is_safe_alignment_data(options.data) and _scored_by_reward_models(options, workdir):
            result = _evaluate_safe_alignment(options, workdir)
            table = safe_alignment_table(result, f"helpfulness-safety ({_describe(result['policy'])})")
        elif options.data:
            result, table = _evaluate_data(options, workdir)
        else:
            result, table = _evaluate_split(options, workdir)
    finally:
        if lock is not None:
            lock.release()
    if options.progress:
        print(table)
        print(f"written to {reports_dir(workdir)}")
    return result


def api_bank_table(result: dict[str, Any]) -> str:
    """`ApiBankReport.table` with a title line naming the policy and the data."""
    report = ApiBankReport.from_dict(result)
    return f"API-Bank ({_describe(result['policy'])}, {result['data']})\n{report.table()}"
