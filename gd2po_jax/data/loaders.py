"""Loading the tool-calling data users already have on disk: `load_data` picks the format of a file
(or an API-Bank directory) by its kind or its extension and keys, `load_records` that of the records
of a `datasets.Dataset`, and each format's loader (`gd2po_jax.data.formats`) returns the one row
schema of `gd2po_jax.data.schema`.

This module is the entry the rest of the package imports: it re-exports the schema's public names
and the format loaders, so ``from gd2po_jax.data.loaders import FEATURES, load_verl_parquet`` reads
as before. The formats (local files only; nothing is downloaded):

  verl RL parquet   `load_verl_parquet`               kind "verl",       .parquet
  ToolRL SFT JSON   `load_toolrl_sft`                 kind "toolrl_sft", .json with instruction, output
  API-Bank JSON     `load_api_bank_file`,             kind "api_bank",   .json with system, user, answer,
                    `load_api_bank` (a directory)                        or a directory
  JSONL             `load_jsonl`                      kind "jsonl",      .jsonl
  JSONL rows in     `load_jsonl_parquet`              kind "jsonl",      .parquet without verl's
  parquet                                                                reward_model / data_source

Malformed rows raise `DataFormatError` naming the file, the row and the field (or, with
``on_error="skip"``, are left out and returned in `LoadResult.skipped`): `gd2po_jax.data.schema`.
"""

from __future__ import annotations

import functools
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import datasets

from gd2po_jax.config import DATA_KINDS
from gd2po_jax.data.columns import PROMPT, PROMPT_ALIAS
from gd2po_jax.data.formats.api_bank import (
    api_bank_row,
    decode_api_bank_answer,
    encode_api_bank_answer,
    load_api_bank,
    load_api_bank_file,
    parse_api_bank_answer,
)
from gd2po_jax.data.formats.jsonl import jsonl_row, load_jsonl, load_jsonl_parquet
from gd2po_jax.data.formats.toolrl_sft import load_toolrl_sft, toolrl_sft_row
from gd2po_jax.data.formats.verl_parquet import load_verl_parquet, missing_ground_truth, verl_row
from gd2po_jax.data.schema import (
    FEATURES,
    DataFormatError,
    LoadResult,
    OnError,
    build_dataset,
    check_file,
    dataset_columns,
    decode_extra_columns,
    json_list,
    numbered,
)

__all__ = [
    "FEATURES",
    "KINDS",
    "DataFormatError",
    "LoadResult",
    "OnError",
    "dataset_columns",
    "decode_api_bank_answer",
    "decode_extra_columns",
    "detect_kind",
    "detect_record_kind",
    "encode_api_bank_answer",
    "load_api_bank",
    "load_api_bank_file",
    "load_data",
    "load_jsonl",
    "load_records",
    "load_toolrl_sft",
    "load_verl_parquet",
    "parse_api_bank_answer",
]

KINDS = DATA_KINDS
"""The formats `load_data` reads (``config.data.kind``, besides auto)."""


# ---------------------------------------------------------------- files


def _is_jsonl_parquet(path: pathlib.Path) -> bool:
    """Whether a parquet file holds rows in the JSONL schema: a ``prompt`` or ``messages`` column and
    neither of verl's ``reward_model`` / ``data_source`` (a file that does not read: False, verl's
    loader names the problem)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
    except (pa.ArrowException, OSError):
        return False
    return bool(names & {PROMPT, PROMPT_ALIAS}) and not names & {"reward_model", "data_source"}


def detect_kind(path: str | os.PathLike) -> str:
    """The loader kind of a path: by extension, for .json by the first record's keys, for .parquet by
    its columns (verl's, else rows in the JSONL schema); a directory is an API-Bank directory."""
    path = pathlib.Path(path)
    if path.is_dir():
        return "api_bank"
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return "jsonl" if _is_jsonl_parquet(path) else "verl"
    if suffix == ".jsonl":
        return "jsonl"
    if suffix == ".json":
        records = json_list(check_file(path))
        if not records:
            raise DataFormatError(path, None, None, "holds no rows (an empty JSON list)")
        keys = set(records[0]) if isinstance(records[0], dict) else set()
        if {"instruction", "output"} <= keys:
            return "toolrl_sft"
        if {"system", "user", "answer"} <= keys:
            return "api_bank"
        raise DataFormatError(
            path,
            0,
            None,
            f"cannot tell the format from keys {sorted(keys)}; pass kind= one of {KINDS}",
        )
    raise ValueError(f"cannot tell the data format of {path} from its extension; pass kind= one of {KINDS}")


def load_data(
    path: str | os.PathLike, *, kind: str = "auto", on_error: OnError = "raise", **options: Any
) -> LoadResult:
    """Load any supported file (or an API-Bank directory) by kind, or detected with kind="auto".

    `options` go to the specific loader (e.g. `require_ground_truth=False`, `levels=(1,)`);
    `require_ground_truth` only concerns verl files (the other formats never require one).
    """
    if kind == "auto":
        kind = detect_kind(path)
    if kind != "verl":
        options.pop("require_ground_truth", None)
    if kind != "jsonl":
        options.pop("typed", None)  # the other formats derive their schema columns, never a row's own
    loaders: dict[str, Callable[..., LoadResult]] = {
        "verl": load_verl_parquet,
        "toolrl_sft": load_toolrl_sft,
        "api_bank": load_api_bank if pathlib.Path(path).is_dir() else load_api_bank_file,
        "jsonl": load_jsonl_parquet if pathlib.Path(path).suffix.lower() == ".parquet" else load_jsonl,
    }
    if kind not in loaders:
        raise ValueError(f"unknown data kind {kind!r}; expected 'auto' or one of {KINDS}")
    return loaders[kind](path, on_error=on_error, **options)


# ---------------------------------------------------------------- records of a `datasets.Dataset`


def detect_record_kind(columns: Sequence[str]) -> str:
    """The loader kind of records with these columns (a `datasets.Dataset` from a `save_to_disk`
    folder or the Hub): ToolRL SFT (instruction, output), API-Bank (system, user, answer), verl
    (a ``reward_model`` or ``data_source`` column beside ``prompt``), else the JSONL schema (prompt or
    messages, optional ground_truth / target / level / source)."""
    names = set(columns)
    if {"instruction", "output"} <= names:
        return "toolrl_sft"
    if {"system", "user", "answer"} <= names:
        return "api_bank"
    if PROMPT in names and names & {"reward_model", "data_source"}:
        return "verl"
    if names & {PROMPT, PROMPT_ALIAS}:
        return "jsonl"
    raise DataFormatError(
        "<records>", None, None, f"cannot tell the format from columns {sorted(names)}; pass kind= one of {KINDS}"
    )


def load_records(
    name: str,
    records: datasets.Dataset,
    *,
    kind: str = "auto",
    on_error: OnError = "raise",
    require_ground_truth: bool = True,
    typed: Mapping[str, str] | None = None,
) -> LoadResult:
    """The rows of ``records`` (a `datasets.Dataset` in one of the formats of `gd2po_jax.data.formats`,
    e.g. from ``datasets.load_from_disk`` or ``datasets.load_dataset``) in the `FEATURES` schema, its
    other columns kept as extra columns (a column a row lacks holds None there, as `datasets` gives it).
    ``name`` (a folder or a Hub id) is what errors name, with the 0-based row. ``typed``: the JSONL
    schema's columns the task reads (`gd2po_jax.data.formats.jsonl.jsonl_row`).

    Raises:
      DataFormatError: a malformed row (or, with ``on_error="skip"``, no usable row), naming
        ``name``, the row and the field; records whose format cannot be told.
    """
    if kind == "auto":
        try:
            kind = detect_record_kind(records.column_names)
        except DataFormatError as err:
            raise DataFormatError(name, None, None, err.problem) from None
    if kind == "verl":
        has_ground_truth = "reward_model" in records.column_names
        if require_ground_truth and not has_ground_truth:
            raise missing_ground_truth(name)
        convert: Callable[[Any, int], dict] = functools.partial(verl_row, has_ground_truth=has_ground_truth)
    elif kind == "api_bank":
        convert = functools.partial(api_bank_row, level=None)
    elif kind in ("toolrl_sft", "jsonl"):
        convert = toolrl_sft_row if kind == "toolrl_sft" else functools.partial(jsonl_row, typed=typed)
    else:
        raise ValueError(f"unknown data kind {kind!r}; expected 'auto' or one of {KINDS}")
    return build_dataset(name, numbered(records), convert, on_error)
