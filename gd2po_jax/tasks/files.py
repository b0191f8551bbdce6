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
from typing import Any, cast

from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.data.columns import GROUND_TRUTH, TARGET, TASK_COLUMNS
from gd2po_jax.data.loaders import DataFormatError, dataset_columns
from gd2po_jax.data.schema import OnError
from gd2po_jax.data.sources import load_source
from gd2po_jax.rewards.base import column_problems
from gd2po_jax.tasks.base import Task, register_task

logger = logging.getLogger(__name__)

NAME = "files"

PROMPT_ONLY_REWARD_KINDS = ("reward_model",)
"""Reward kinds that score without a ground truth: their verl parquet files may be prompt-only (no
``reward_model.ground_truth``, as the safety runs' Alpaca files). So may a run whose rewards are only
``rewards.functions``."""


def read_columns(config: RunConfig, field: str) -> dict[str, str]:
    """The schema columns a JSONL row may give (`gd2po_jax.data.columns.TASK_COLUMNS`) that the files
    task reads from the data of ``config.<field>``, each with what reads it (named in a type error):
    ``target`` for the warm start (``sft.enabled``; the SFT data: ``sft.data``, else ``data.train``),
    ``ground_truth`` for a built-in reward family that scores against one. Any other column is the
    user's own, of any type (`gd2po_jax.data.formats.jsonl.jsonl_row`)."""
    typed = {}
    sft_field = "sft.data" if config.sft.data else "data.train"
    if config.sft.enabled and field == sft_field:
        typed[TARGET] = f"the {NAME} task's warm start (config.sft.enabled) reads it as the text to imitate"
    if config.rewards.kind and config.rewards.kind not in PROMPT_ONLY_REWARD_KINDS:
        typed[GROUND_TRUTH] = f"the {NAME} task's config.rewards.kind={config.rewards.kind!r} scores against it"
    return typed


def load_file(source: str, config: RunConfig, field: str, *, what: str = "") -> Any:
    """The dataset of one data source, the value of ``config.<field>`` (a file, a directory or glob
    of files, a ``save_to_disk`` folder, a Hub id: `gd2po_jax.data.sources.load_source`) in
    ``data.kind`` with ``data.on_error``; ``what`` names the source in errors (default
    ``config.<field>``; ``--data`` for eval.py's data of your own).
    Verl data may be prompt-only when the reward needs no ground truth (`PROMPT_ONLY_REWARD_KINDS`).

    Raises:
      ConfigError: naming the field, when the source is none of the forms or a Hub id that cannot be had.
      DataFormatError: a malformed row or file, naming it and the row.
    """
    # Verl files need a ground truth only for a family that scores against one (not reward models, not
    # functions of your own alone, which read whatever columns they need).
    prompt_only = config.rewards.kind in PROMPT_ONLY_REWARD_KINDS or not config.rewards.kind
    options: dict[str, Any] = {"require_ground_truth": False} if prompt_only else {}
    options["typed"] = read_columns(config, field)
    try:
        on_error = cast(OnError, config.data.on_error)  # "raise" or "skip": DataConfig checks it
        result = load_source(
            source, kind=config.data.kind, on_error=on_error, what=what or f"config.{field}", **options
        )
    except FileNotFoundError as err:
        raise ConfigError(str(err)) from None
    if result.num_skipped:
        logger.warning("%s: skipped %d malformed rows (config.data.on_error='skip')", source, result.num_skipped)
    return result.dataset


def scorable_rows(dataset, path: str, reward_fn, config: RunConfig) -> Any:
    """``dataset`` checked against the reward function (`column_problems`: a ground truth it cannot
    parse, a missing one): such rows raise `DataFormatError` naming the file, the row and the
    column, or with ``data.on_error='skip'`` are left out (all of them left out: an error too)."""
    columns = dataset_columns(dataset, where=path)  # the extra columns decoded, as reward functions get them
    for name in TASK_COLUMNS:  # what a family reads and the data lacks: None in every row, each row's problem
        if name not in columns and name in dataset.column_names:
            columns[name] = list(dataset[name])
    problems = column_problems(reward_fn, columns)
    if not problems:
        return dataset
    rows = dataset["row"]
    errors = [DataFormatError(path, rows[i], column, problem) for i, column, problem in problems]
    bad = sorted({i for i, _, _ in problems})
    if len(bad) == len(dataset) and config.data.on_error == "skip":
        raise DataFormatError(
            path,
            None,
            None,
            f"no usable rows: the reward {config.rewards.kind!r} cannot "
            f"score any of the {len(bad)} rows; first: {errors[0]}",
        )
    if config.data.on_error == "raise":
        first = errors[0]
        others = f" ({len(bad) - 1} more rows like it)" if len(bad) > 1 else ""
        raise DataFormatError(
            path,
            first.row,
            first.field,
            f"{first.problem}{others}; the reward "
            f"{config.rewards.kind!r} cannot score it (fix the data, or set "
            "config.data.on_error='skip' to leave such rows out)",
        )
    logger.warning(
        "%s: skipped %d rows the reward cannot score (config.data.on_error='skip'); first: %s",
        path,
        len(bad),
        errors[0],
    )
    keep = sorted(set(range(len(dataset))) - set(bad))
    return dataset.select(keep)


PUBLIC_DATA = {
    "tool_calling": "ToolRL's RLLA 4K, dataset/rlla_4k/train.parquet (validation and test: test.parquet) of "
    "github.com/qiancheng0/ToolRL",
    "reward_model": "GD2PO's Alpaca prompts, safe-alignment/dataset/alpaca_prompt_only/train.parquet (validation "
    "and test: test.parquet) of github.com/Qwen-Applications/GD2PO",
}
"""Where the paper's data for a reward kind is published (configs/toolrl.py, configs/safety.py), named by
the errors about an empty data field."""


def _public_data(config: RunConfig) -> str:
    """`` (the paper's runs of this reward kind use ...)`` for an error about an empty data field."""
    where = PUBLIC_DATA.get(config.rewards.kind)
    return f" (the paper's {config.rewards.kind} runs use {where})" if where else ""


@register_task(NAME)
class FilesTask(Task):
    """Prompts from ``data.train`` (required), ``data.validation`` and ``data.test`` (optional);
    the policy in ``model.path`` (required)."""

    def check_config(self, config: RunConfig) -> None:
        if not config.data.train:
            raise ConfigError(f"config.data.train: the files task needs a training data file{_public_data(config)}")
        if not config.model.path:
            raise ConfigError("config.model.path: the files task needs a Hugging Face model directory")

    def load_splits(self, config: RunConfig, workdir: pathlib.Path) -> tuple[dict, pathlib.Path]:
        splits = {"train": load_file(config.data.train, config, "data.train")}
        for split in ("validation", "test"):
            if getattr(config.data, split):
                splits[split] = load_file(getattr(config.data, split), config, f"data.{split}")
        return splits, pathlib.Path(config.model.path)

    def usable_rows(self, config: RunConfig, splits: dict[str, Any], reward_fn) -> dict[str, Any]:
        return {
            split: scorable_rows(dataset, getattr(config.data, split), reward_fn, config)
            for split, dataset in splits.items()
        }
