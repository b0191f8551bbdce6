"""The API-Bank processed JSON format: a JSON list of {"system", "user", "answer", ...} per level
file (level-<N>-api_processed.json); its file and directory loaders, row converter, and the
parsing and JSON encoding of its `answer` calls (the rows' ground truth)."""

from __future__ import annotations

import ast
import functools
import json
import os
import pathlib
import re
from collections.abc import Sequence
from typing import Any

import datasets

from gd2po_jax.data.schema import (
    FieldError,
    LoadResult,
    OnError,
    build_dataset,
    check_file,
    dict_record,
    json_list,
    numbered,
    require_str,
    schema_row,
)

_API_BANK_FILE = re.compile(r"level-(\d+)-api_processed\.json$")


def _api_bank_answer(value: Any) -> list[dict]:
    """The answer as a non-empty list of {"name": str, "parameters": dict} calls; raises
    `FieldError` naming the part of `answer` that is wrong."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as err:
            raise FieldError("answer", f"not a Python literal ({type(err).__name__}: {err})") from None
    calls = [value] if isinstance(value, dict) else value
    if not isinstance(calls, list) or not calls:
        raise FieldError("answer", f"expected a non-empty list of calls or one call, got {value!r:.80}")
    for i, call in enumerate(calls):
        if not (
            isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(call.get("parameters"), dict)
        ):
            raise FieldError(f"answer[{i}]", f"expected {{'name': str, 'parameters': dict}}, got {call!r:.80}")
    return calls


def parse_api_bank_answer(value: Any) -> list[dict]:
    """An API-Bank `answer` as a non-empty list of {"name": str, "parameters": dict} calls.

    `value` is what the files hold: a list of calls, one call (level-2 files store a bare dict), or
    a Python-literal string of either (parsed with `ast.literal_eval`, never evaluated). The first
    call is the reference that evaluation scores against.

    Raises:
      ValueError: naming the part of the answer that is wrong.
    """
    try:
        return _api_bank_answer(value)
    except FieldError as err:
        raise ValueError(f"bad API-Bank answer, {err.field}: {err.problem}") from None


def encode_api_bank_answer(calls: list[dict]) -> str:
    """The `ground_truth` column of an API-Bank row: its parsed answer, JSON-encoded."""
    return json.dumps(calls, ensure_ascii=False)


def decode_api_bank_answer(ground_truth: str) -> list[dict]:
    """The answer calls of an API-Bank row from its `ground_truth` column (`encode_api_bank_answer`).

    Raises:
      ValueError: when `ground_truth` is not a JSON-encoded API-Bank answer (e.g. a ToolRL ground
        truth given to the API-Bank scorer).
    """
    try:
        value = json.loads(ground_truth)
    except (TypeError, json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"bad API-Bank answer: the ground truth is not JSON ({err}): {ground_truth!r:.200}") from None
    return parse_api_bank_answer(value)


def load_api_bank_file(path: str | os.PathLike, *, level: int | None = None, on_error: OnError = "raise") -> LoadResult:
    """Load one API-Bank processed file: a JSON list of {"system", "user", "answer", ...}.

    Args:
      level: the difficulty level; by default taken from a `level-<N>-api_processed.json` name.
    """
    path = check_file(path)
    if level is None:
        match = _API_BANK_FILE.search(path.name)
        level = int(match.group(1)) if match else None

    return build_dataset(path, numbered(json_list(path)), functools.partial(api_bank_row, level=level), on_error)


def api_bank_row(record: Any, index: int, *, level: int | None) -> dict:
    """An API-Bank record ({"system", "user", "answer", ...}) as a row of `FEATURES`."""
    record = dict_record(record)
    system = require_str(record.get("system"), "system")
    user = require_str(record.get("user"), "user", allow_empty=False)
    calls = _api_bank_answer(record.get("answer"))
    try:
        ground_truth = encode_api_bank_answer(calls)
    except (TypeError, ValueError) as err:
        raise FieldError("answer", f"not representable as JSON ({err})") from None
    require_str(ground_truth, "answer")  # no lone surrogates in its strings
    prompt = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return schema_row(record, prompt, ground_truth=ground_truth, level=level, source="api_bank", row=index)


def load_api_bank(
    directory: str | os.PathLike, *, levels: Sequence[int] = (1, 2, 3), on_error: OnError = "raise"
) -> LoadResult:
    """Load `level-<N>-api_processed.json` for each level in `directory`, concatenated in order."""
    directory = pathlib.Path(directory)
    results = [
        load_api_bank_file(directory / f"level-{lv}-api_processed.json", level=lv, on_error=on_error) for lv in levels
    ]
    if not results:
        raise ValueError("load_api_bank needs at least one level")
    dataset = datasets.concatenate_datasets([r.dataset for r in results])
    return LoadResult(dataset, tuple(e for r in results for e in r.skipped))
