"""Tasks as plug-ins: where a run's prompts come from and what comes with them.

A task is an object registered under a name, as reward kinds are
(`gd2po_jax.rewards.base.register_reward_kind`); ``config.task`` names the one a run uses and
`task_of` looks it up. The trainer, the warm start, evaluation and sweeps ask the task, never its
name:

============================  ==================================================================
`Task.check_config`           the fields this task needs, checked before anything is computed
`Task.load_splits`            the datasets by split, and the policy's model directory (a task may
                              build one, as the embedded tasks build a tiny random Qwen2)
`Task.prepare`                what must exist before RL (the safety task's reward models); it
                              returns the config the run then uses
`Task.usable_rows`            the splits' rows left after a check against the reward function
`Task.split_field`            the config field that sets a split's rows (named in errors)
`Task.eval_scorer`            how evaluation scores greedy responses
`Task.eval_summary`           what the task adds to an evaluation's summary
`Task.split_table_extra`      what ``eval.py`` prints under a split evaluation's table
`Task.habit_breakdown`        ``eval.py --habits``: what saved evaluations say of the policy's
                              habits (the synthetic_tools task's); `Task.habit_table` prints it
`Task.results_table`          the before/after table ``train.py`` prints
`Task.test_metrics`           the test metrics a sweep report shows
============================  ==================================================================

The defaults serve a task whose rows are scored by the run's reward functions: evaluation by the
run's reward functions (each reward's mean and their sum), or by the tool-calling metrics for the
ToolRL family alone; the generic table. A task defined outside the package needs no edit of it::

    # my_module.py
    from gd2po_jax.tasks import Task

    class MyTask(Task):
        def load_splits(self, config, workdir):
            ...

run with ``--config.task=my_module:MyTask`` (or ``path/to/my_module.py:MyTask``; an instance works
too): the trainer imports it and registers it under that path (`register_task` registers one under
a short name, for code that imports it first).
"""

from __future__ import annotations

import abc
import json
import pathlib
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import datasets
import jax.numpy as jnp
from flax import nnx

from gd2po_jax.config import ConfigError, RunConfig, TinyModelConfig
from gd2po_jax.data.columns import EXTRA_COLUMNS, PROMPT_TEXT
from gd2po_jax.data.corpus_tokenizer import build_tokenizer
from gd2po_jax.data.loaders import FEATURES
from gd2po_jax.errors import UserError
from gd2po_jax.models import Decoder, save_pretrained
from gd2po_jax.models.config import tiny_qwen2_config
from gd2po_jax.rewards.scorers import RewardFunctionScorer, RewardModelScorer, tool_calling_scorer
from gd2po_jax.rewards.user_functions import load_function, run_reward_weights
from gd2po_jax.runtime.imports import import_object, is_import_path
from gd2po_jax.runtime.run_dir import publish_dir, staging_name

SPLITS = ("train", "validation", "test")
"""The split names a task may give (`Task.load_splits`); train is required."""

TOOL_CALLING_TEST_METRICS = (
    ("test/correct_acc", "Correct Acc"),
    ("test/format_acc", "Format Acc"),
    ("test/length", "Length"),
)
"""(key, label) of the tool-calling test metrics (eval/test.json's ``correct_acc`` ...)."""


class NoHabitsError(UserError, ValueError):
    """``eval.py --habits`` on a run whose task has no habit breakdown (`Task.habit_breakdown`)."""


class Task(abc.ABC):
    """One source of prompts and what comes with them (the interface of the module docstring).

    Subclasses implement `load_splits`; every other method has a default.
    """

    name: str = ""
    """The registered name (set by `register_task`)."""

    def check_config(self, config: RunConfig) -> None:
        """Raise `ConfigError`, naming the field, for a config this task cannot run. Default: none."""

    @abc.abstractmethod
    def load_splits(self, config: RunConfig, workdir: pathlib.Path) -> tuple[dict[str, Any], pathlib.Path]:
        """(the ``datasets.Dataset`` of each split by name (`SPLITS`; train required), the policy's
        Hugging Face model directory). Rows follow `gd2po_jax.data.loaders.FEATURES`. Several
        processes: every process calls this; one that builds files builds them on process 0
        (`gd2po_jax.runtime.distributed.is_primary`) and waits at a barrier."""

    def prepare(self, config: RunConfig, workdir: pathlib.Path, *, progress: bool = True) -> RunConfig:
        """What must exist before RL, built once (a later call finds it); returns the config the run
        uses from then on. Called on process 0, then after a barrier on every process with
        ``progress=False``. Default: nothing to build, ``config`` unchanged."""
        return config

    def usable_rows(self, config: RunConfig, splits: dict[str, Any], reward_fn) -> dict[str, Any]:
        """``splits`` once checked against the run's reward function (rows it could never score are
        errors, or left out). Default: unchanged."""
        return splits

    def split_field(self, config: RunConfig, split: str) -> str:
        """The config field (dotted, without ``config.``) that gives ``split`` its rows, for errors
        about a split the data lacks. Default: ``data.<split>``."""
        return f"data.{split}"

    def has_split(self, config: RunConfig, split: str) -> bool:
        """Whether the config gives ``split`` any rows. Default: the field `split_field` is set."""
        value: Any = config
        for name in self.split_field(config, split).split("."):
            value = getattr(value, name)
        return bool(value)

    def eval_scorer(self, config: RunConfig, reward_fn):
        """How evaluation scores a split's greedy responses
        (`gd2po_jax.rewards.scorers.Scorer`): with ``rewards.functions``, the run's reward
        functions (each reward and their weighted sum); the run's reward models (each reward's score
        and their sum) with ``rewards.kind='reward_model'``; else the tool-calling metrics."""
        if config.rewards.functions:
            rewards = config.rewards
            return RewardFunctionScorer(
                reward_fn,
                run_reward_weights(config, reward_fn),
                on_error=rewards.on_error,
                num_workers=rewards.num_workers,
                timeout_s=rewards.timeout_s,
            )
        if config.rewards.kind == "reward_model":
            return RewardModelScorer(reward_fn)
        return tool_calling_scorer(config.rewards.max_think_words)

    def eval_summary(self, config: RunConfig, summary: dict[str, Any]) -> dict[str, Any]:
        """An evaluation's summary with what the task adds to it. Default: unchanged."""
        return summary

    def split_table_extra(self, config: RunConfig, summary: Mapping[str, Any]) -> str:
        """Lines ``eval.py`` prints under the table of a split evaluation's ``summary`` (what
        `eval_summary` added to it, as text). Default: none (empty)."""
        return ""

    def habit_breakdown(
        self, config: RunConfig, names: Sequence[str], generations: Callable[[str], Iterable[Mapping[str, Any]]]
    ) -> dict[str, Any]:
        """``eval.py --habits``: what the saved evaluations ``names`` of a run of ``config`` say of the
        policy's habits, by name (``generations(name)``: the rows of ``eval/<name>.jsonl``, at least
        ``response``, ``ground_truth`` and ``correct``). Default: the task has no habits.

        Raises:
          NoHabitsError: one line naming ``config.task`` and the registered tasks that have habits.
        """
        having = [
            name for name, task in sorted(_TASKS.items()) if type(task).habit_breakdown is not Task.habit_breakdown
        ]
        raise NoHabitsError(
            f"has task {config.task!r}, which has no habit breakdown"
            + (f" (tasks with one: {', '.join(having)})" if having else "")
        )

    def habit_table(self, config: RunConfig, breakdown: Mapping[str, Any]) -> str:
        """`habit_breakdown` as the text ``eval.py --habits`` prints. Default: one line per evaluation,
        its breakdown as JSON."""
        return "\n".join(f"{name}: {json.dumps(value, sort_keys=True)}" for name, value in breakdown.items())

    def results_table(self, config: RunConfig, results: Mapping[str, Any]) -> str:
        """The before/after table that ``train.py`` prints from ``results.json``."""
        return results_table(results)

    def test_metrics(self, config: RunConfig) -> tuple[tuple[str, str], ...]:
        """(key, label) of the test metrics a sweep report shows for a run of ``config``
        (``test/<summary key>``): each reward's mean and their sum for reward models, else the
        tool-calling metrics (`TOOL_CALLING_TEST_METRICS`); with ``rewards.functions``, each of the
        run's rewards (its functions are imported to learn their names) and their sum."""
        if config.rewards.functions:
            names = tuple(config.rewards.names) + tuple(
                name for entry in config.rewards.function_entries() for name in load_function(entry).names
            )
            return tuple((f"test/{name}", name) for name in names) + (("test/reward_sum", "sum"),)
        if config.rewards.kind == "reward_model":
            return tuple((f"test/{name}", name) for name in config.rewards.names) + (("test/reward_sum", "sum"),)
        return TOOL_CALLING_TEST_METRICS


_TASKS: dict[str, Task] = {}


def register_task(name: str) -> Callable:
    """Decorator registering a `Task` subclass (instantiated without arguments) or instance under
    ``name``; a second registration of a name replaces the first.

    Raises:
      TypeError: when the decorated object is not a `Task`.
    """

    def register(task):
        instance = task() if isinstance(task, type) else task
        if not isinstance(instance, Task):
            raise TypeError(f"register_task({name!r}): {task!r} is not a gd2po_jax.tasks.Task")
        instance.name = name
        _TASKS[name] = instance
        return task

    return register


def registered_tasks() -> tuple[str, ...]:
    """The names `task_of` accepts, sorted."""
    return tuple(sorted(_TASKS))


def task_of(config: RunConfig) -> Task:
    """The task ``config.task`` names (`task_named`), after its `Task.check_config`.

    Raises:
      ConfigError: naming ``config.task`` and the registered tasks when none has that name, or the
        field the task's check refuses.
    """
    task = task_named(config.task)
    task.check_config(config)
    return task


def task_named(name: str) -> Task:
    """The task registered as ``name``, or the one an import path ``module:object`` names; its config
    is not checked (for what reads a finished run, e.g. ``eval.py --habits``: `task_of` checks it).

    Raises:
      ConfigError: naming ``config.task`` and the registered tasks when none has that name.
    """
    task = _TASKS.get(name)
    if task is None and is_import_path(name):
        task = _import_task(name)
    if task is None:
        raise ConfigError(
            f"config.task: {name!r} is not a registered task; registered: "
            f"{', '.join(registered_tasks())}; a task of your own: module:object or "
            "path/to/file.py:object (a Task subclass or instance)"
        )
    return task


def _import_task(path: str) -> Task:
    """The `Task` that ``config.task = "module:object"`` names (a subclass, built without arguments, or an
    instance), registered under ``path`` so that later lookups find it.

    Raises:
      ConfigError: naming ``config.task``: the import fails, or the object is not a Task.
    """
    target, source = import_object(path, f"config.task ({path!r})")
    if isinstance(target, type) and issubclass(target, Task):
        target = target()
    if not isinstance(target, Task):
        raise ConfigError(
            f"config.task ({path!r}): {path.rpartition(':')[2]!r} in {source} is a "
            f"{type(target).__name__}, not a gd2po_jax.tasks.Task subclass or instance"
        )
    register_task(path)(target)
    return target


def dataset_splits(
    rows_by_split: Mapping[str, Sequence[Mapping[str, Any]]], features: datasets.Features = FEATURES
) -> datasets.DatasetDict:
    """The ``DatasetDict`` of generated rows (split -> rows, each a dict with every column of
    ``features``), each split typed by ``features`` (an empty split too). Default: the prompt
    schema `gd2po_jax.data.loaders.FEATURES`, whose ``prompt_text`` and ``extra_columns`` a row may
    leave out (None: no prompt string, no extra columns)."""
    optional = (PROMPT_TEXT, EXTRA_COLUMNS)

    def value(row: Mapping[str, Any], name: str) -> Any:
        return row.get(name) if name in optional else row[name]

    return datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict(
                {name: [value(row, name) for row in rows] for name in features}, features=features
            )
            for split, rows in rows_by_split.items()
        }
    )


def build_tiny_model(
    out_dir: pathlib.Path, corpus: Iterable[str], tiny: TinyModelConfig, vocab_size: int
) -> pathlib.Path:
    """Write a tokenizer trained on ``corpus`` and a random tiny Qwen2 to ``out_dir`` (once), so a
    generated task runs the code paths of a real checkpoint (config.json + safetensors + tokenizer
    files + chat template).

    Args:
      out_dir: target directory; if it already holds config.json the existing model is kept.
      corpus: the tokenizer's training texts.
      tiny: ``config.model.tiny`` (hidden_size, num_layers, ... and seed).
      vocab_size: tokenizer vocabulary budget.

    Returns:
      ``out_dir``.
    """
    out_dir = pathlib.Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    staging = staging_name(out_dir)  # unique to this process: concurrent builders never share it
    tokenizer = build_tokenizer(corpus, vocab_size)
    model = Decoder(
        tiny_qwen2_config(tiny, len(tokenizer), max_position_embeddings=4096),
        dtype=jnp.float32,
        rngs=nnx.Rngs(tiny.seed),
    )
    try:
        save_pretrained(model, staging, tokenizer=tokenizer)
        publish_dir(staging, out_dir)  # False: another process built the same model meanwhile
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def results_table(results: Mapping[str, Any]) -> str:
    """A small before/after table of the headline validation metrics of ``results.json`` (the
    tool-calling ones, or each reward model's mean score and their sum)."""
    rows = [
        ("Correct Acc", "correct_acc"),
        ("Correctness", "correctness"),
        ("Format Acc", "format_acc"),
        ("Length", "length"),
        ("Truncation", "truncation_rate"),
    ]
    before, after = results.get("before_rl") or {}, results.get("after_rl") or {}
    if not before and not after:  # no evaluation split: no metric to show, the built-in task's least of all
        return (
            f"no evaluation ({results['algorithm']}, {results['steps']} RL steps): the run has no validation "
            "or test split (config.eval.split); metrics.jsonl has the training rewards"
        )
    reward_names = after.get("reward_names") or before.get("reward_names")
    if reward_names:  # scored by reward models (evaluation.during_training.evaluate_split)
        rows = [(name, name) for name in reward_names] + [("Sum", "reward_sum"), ("Truncation", "truncation_rate")]
    lines = [
        f"{results['split'] or 'no eval split'} ({results['algorithm']}, {results['steps']} RL steps)",
        f"{'metric':<14}{'before RL':>12}{'after RL':>12}",
    ]
    for label, key in rows:
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"{label:<14}{fmt(before.get(key)):>12}{fmt(after.get(key)):>12}")
    return "\n".join(lines)
