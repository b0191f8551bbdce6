"""The JSONL format: one JSON object per line with "prompt" (a string or chat messages) or its alias
"messages", and optional "ground_truth", "target", "level", "source"; its file loader and row
converter (blank lines are skipped; row = 0-based line index)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from gd2po_jax.data.columns import GROUND_TRUTH, LEVEL, PROMPT, PROMPT_ALIAS, SOURCE, TARGET
from gd2po_jax.data.schema import (
    FieldError,
    LoadResult,
    OnError,
    build_dataset,
    chat_messages,
    check_file,
    dict_record,
    optional_str,
    require_str,
    schema_row,
)


def jsonl_row(record: Any, index: int) -> dict:
    """A JSONL record as a row of `FEATURES`: a string prompt is one user message (kept as
    ``prompt_text``), other keys of the schema are taken as they are, the rest are extra columns."""
    record = dict_record(record)
    if (PROMPT in record) == (PROMPT_ALIAS in record):
        raise FieldError(PROMPT, f"give exactly one of 'prompt' and {PROMPT_ALIAS!r}")
    field = PROMPT if PROMPT in record else PROMPT_ALIAS
    value = record[field]
    prompt_text = require_str(value, field, allow_empty=False) if isinstance(value, str) else None
    prompt = [{"role": "user", "content": prompt_text}] if prompt_text is not None else chat_messages(value, field)
    level = record.get(LEVEL)
    if level is not None and (isinstance(level, bool) or not isinstance(level, int)):
        raise FieldError(LEVEL, f"expected an integer, got {level!r:.40}")
    return schema_row(
        record,
        prompt,
        prompt_text=prompt_text,
        ground_truth=optional_str(record.get(GROUND_TRUTH), GROUND_TRUTH),
        target=optional_str(record.get(TARGET), TARGET),
        level=level,
        source=optional_str(record.get(SOURCE), SOURCE) or "jsonl",
        row=index,
    )


def load_jsonl(path: str | os.PathLike, *, on_error: OnError = "raise") -> LoadResult:
    """Load a JSONL file in the schema of `gd2po_jax.data.schema` (row = 0-based line index)."""
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
        return jsonl_row(record, index)

    return build_dataset(path, records(), convert, on_error)
