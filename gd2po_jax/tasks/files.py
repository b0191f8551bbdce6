"""The files task, ``task="files"``: prompts from a user's data files (``data.train``,
``data.validation``, ``data.test``: a verl parquet, ToolRL JSON, API-Bank JSON or JSONL file,
`gd2po_jax.data.loaders`) and the policy in ``model.path`` (configs/toolrl.py, configs/safety.py).

Rows are checked against the run's reward function when they are loaded (`scorable_rows`), not
when a bad row is first sampled: a ground truth the reward cannot parse is an error naming the
file, the row and the column, or with ``data.on_error='skip'`` the row is left out.
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any

from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.data.loaders import DataFormatError, detect_kind, load_data
from gd2po_jax.rewards.base import column_problems
from gd2po_jax.tasks.base import Task, register_task

logger = logging.getLogger(__name__)

NAME = "files"

PROMPT_ONLY_REWARD_KINDS = ("reward_model",)
"""Reward kinds that score without a ground truth: their verl parquet files may be prompt-only (no
``reward_model.ground_truth``, as the safety runs' Alpaca files)."""


def load_file(path: str, config: RunConfig) -> Any:
    """The dataset of one data file (``data.kind``, ``data.on_error``). A verl parquet file may be
    prompt-only when the reward needs no ground truth (`PROMPT_ONLY_REWARD_KINDS`)."""
    options = {}
    if config.rewards.kind in PROMPT_ONLY_REWARD_KINDS and (
            config.data.kind == "verl" or config.data.kind == "auto" and detect_kind(path) == "verl"):
        options["require_ground_truth"] = False
    result = load_data(path, kind=config.data.kind, on_error=config.data.on_error, **options)
    if result.num_skipped:
        logger.warning("%s: skipped %d malformed rows (config.data.on_error='skip')", path, result.num_skipped)
    return result.dataset


def scorable_rows(dataset, path: str, reward_fn, config: RunConfig) -> Any:
    """``dataset`` checked against the reward function (`column_problems`: a ground truth it cannot
    parse, a missing one): such rows raise `DataFormatError` naming the file, the row and the
    column, or with ``data.on_error='skip'`` are left out (all of them left out: an error too)."""
    columns = {name: dataset[name] for name in dataset.column_names}
    problems = column_problems(reward_fn, columns)
    if not problems:
        return dataset
    rows = dataset["row"]
    errors = [DataFormatError(path, rows[i], column, problem) for i, column, problem in problems]
    bad = sorted({i for i, _, _ in problems})
    if len(bad) == len(dataset) and config.data.on_error == "skip":
        raise DataFormatError(path, None, None, f"no usable rows: the reward {config.rewards.kind!r} cannot "
                              f"score any of the {len(bad)} rows; first: {errors[0]}")
    if config.data.on_error == "raise":
        first = errors[0]
        others = f" ({len(bad) - 1} more rows like it)" if len(bad) > 1 else ""
        raise DataFormatError(path, first.row, first.field, f"{first.problem}{others}; the reward "
                              f"{config.rewards.kind!r} cannot score it (fix the data, or set "
                              "config.data.on_error='skip' to leave such rows out)")
    logger.warning("%s: skipped %d rows the reward cannot score (config.data.on_error='skip'); first: %s",
                   path, len(bad), errors[0])
    keep = sorted(set(range(len(dataset))) - set(bad))
    return dataset.select(keep)


@register_task(NAME)
class FilesTask(Task):
    """Prompts from ``data.train`` (required), ``data.validation`` and ``data.test`` (optional);
    the policy in ``model.path`` (required)."""

    def check_config(self, config: RunConfig) -> None:
        if not config.data.train:
            raise ConfigError("config.data.train: the files task needs a training data file")
        if not config.model.path:
            raise ConfigError("config.model.path: the files task needs a Hugging Face model directory")

    def load_splits(self, config: RunConfig, workdir: pathlib.Path) -> tuple[dict, pathlib.Path]:
        splits = {"train": load_file(config.data.train, config)}
        for split in ("validation", "test"):
            if getattr(config.data, split):
                splits[split] = load_file(getattr(config.data, split), config)
        return splits, pathlib.Path(config.model.path)

    def usable_rows(self, config: RunConfig, splits: dict[str, Any], reward_fn) -> dict[str, Any]:
        return {split: scorable_rows(dataset, getattr(config.data, split), reward_fn, config)
                for split, dataset in splits.items()}
