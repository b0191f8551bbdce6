"""The JSONL format: one JSON object per line with "prompt" (a string or chat messages) or its alias
"messages", and optional "ground_truth", "target", "level", "source" (typed only where the task reads
them: `jsonl_row`); its file loader and row converter (blank lines are skipped; row = 0-based line
index)."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from gd2po_jax.data.columns import GROUND_TRUTH, LEVEL, PROMPT, PROMPT_ALIAS, SOURCE, TARGET, TASK_COLUMNS
from gd2po_jax.data.schema import (
    DataFormatError,
    FieldError,
    LoadResult,
    OnError,
    build_dataset,
    chat_messages,
    check_file,
    dict_record,
    numbered,
    optional_str,
    require_str,
    schema_row,
)


def _level(value: Any, field: str) -> int | None:
    """None, or ``value`` when it is an integer (not a bool); else raises `FieldError`."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise FieldError(field, f"expected an integer, got {value!r:.40}")
    return value


_CHECKS = {GROUND_TRUTH: optional_str, TARGET: optional_str, LEVEL: _level, SOURCE: optional_str}
"""How each of `TASK_COLUMNS` is typed when a task reads it."""


def _task_value(record: dict, name: str, typed: Mapping[str, str] | None) -> Any:
    """The schema value of ``record[name]`` (one of `TASK_COLUMNS`): checked when the task reads the
    column (``typed`` None: every one is read; else ``typed[name]`` says what reads it, for the error);
    otherwise the value when it has the schema's type, else None (the row keeps its own value as a
    column of its own)."""
    value, check = record.get(name), _CHECKS[name]
    if typed is None:
        return check(value, name)
    if name in typed:
        try:
            return check(value, name)
        except FieldError as err:
            raise FieldError(name, f"{err.problem}; {typed[name]} (rename the column if it is your own)") from None
    try:
        return check(value, name)
    except FieldError:
        return None


def jsonl_row(record: Any, index: int, *, typed: Mapping[str, str] | None = None) -> dict:
    """A JSONL record as a row of `FEATURES`: a string prompt is one user message (kept as
    ``prompt_text``), the rest are extra columns. The `TASK_COLUMNS` the record gives are kept as its
    own columns too, with their exact values, and fill the schema's columns: typed (a string, an
    integer level) where the task reads them, ``typed`` naming each such column and what reads it
    (None: all of them, with no reason); a value of another type in a column the task does not read
    leaves the schema's None."""
    record = dict_record(record)
    if (PROMPT in record) == (PROMPT_ALIAS in record):
        raise FieldError(PROMPT, f"give exactly one of 'prompt' and {PROMPT_ALIAS!r}")
    field = PROMPT if PROMPT in record else PROMPT_ALIAS
    value = record[field]
    prompt_text = require_str(value, field, allow_empty=False) if isinstance(value, str) else None
    prompt = [{"role": "user", "content": prompt_text}] if prompt_text is not None else chat_messages(value, field)
    values = {name: _task_value(record, name, typed) for name in TASK_COLUMNS}
    return schema_row(
        record,
        prompt,
        prompt_text=prompt_text,
        ground_truth=values[GROUND_TRUTH],
        target=values[TARGET],
        level=values[LEVEL],
        source=values[SOURCE] or "jsonl",
        row=index,
        keep=[name for name in TASK_COLUMNS if name in record],
    )


def load_jsonl(
    path: str | os.PathLike, *, on_error: OnError = "raise", typed: Mapping[str, str] | None = None
) -> LoadResult:
    """Load a JSONL file in the schema of `gd2po_jax.data.schema` (row = 0-based line index);
    ``typed``: `jsonl_row`'s."""
    path = check_file(path)

    def records() -> Iterator[tuple[int, int, bytes]]:
        with open(path, "rb") as f:  # lines end at b"\n" only; each is decoded on its own
            for index, line in enumerate(f):
                if line.strip():
                    yield index, index + 1, line

    def convert(raw: bytes, index: int) -> dict:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise FieldError(
                "<line>", f"not valid UTF-8: byte {raw[err.start]:#04x} at byte {err.start} of the line"
            ) from None
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as err:
            raise FieldError("<line>", f"not valid JSON ({err})") from None
        return jsonl_row(record, index, typed=typed)

    return build_dataset(path, records(), convert, on_error)


def load_jsonl_parquet(
    path: str | os.PathLike, *, on_error: OnError = "raise", typed: Mapping[str, str] | None = None
) -> LoadResult:
    """A parquet file of rows in the JSONL schema (``prompt`` as text or chat messages, or
    ``messages``; no verl ``reward_model`` / ``data_source``): each row as a JSONL record (`jsonl_row`),
    row = 0-based row index."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = check_file(path)
    try:
        records = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
        raise DataFormatError(path, None, None, f"not a readable parquet file ({type(err).__name__}: {err})") from None
    return build_dataset(path, numbered(records), functools.partial(jsonl_row, typed=typed), on_error)
