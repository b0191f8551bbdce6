"""The one row schema every loader returns, its validation, and the helpers the formats share.

Every loader (`gd2po_jax.data.formats`) returns a `LoadResult` whose `dataset` has exactly these
columns (`FEATURES`; their names are in `gd2po_jax.data.columns`), so datasets from different files
can be concatenated and the trainer reads one layout:

  prompt         list of {"role": str, "content": str}  the chat messages before the answer
  ground_truth   str or None   what the reward scores against (ToolRL ground-truth text; for
                               API-Bank the JSON-encoded `answer` list; None for prompt-only
                               and SFT data)
  target         str or None   the assistant text to imitate (supervised warm start), if any
  level          int or None   API-Bank difficulty level (1, 2, 3), if any
  source         str           where the row comes from ("rlla", "toolrl_sft", "api_bank", ...)
  row            int           the row's 0-based index in its file (JSON list index, parquet row,
                               or JSONL line index so that line = row + 1)
  prompt_text    str or None   the prompt exactly as the data gave it when it was one string
                               (JSONL ``"prompt": "What is 2+2?"``); None when it gave chat messages
  extra_columns  bytes         the record's other columns: ``pickle.dumps`` of {name: value},
                               read back with `decode_extra_columns` (or `dataset_columns`)

(`PROMPT_TEXT` and `EXTRA_COLUMNS` name the last two.)

The extra columns are every key of a record that is not a `FEATURES` name (nor the JSONL prompt
alias ``messages``), with its exact Python value: verl's ``reward_model``, ``data_source``,
``extra_info`` and ``ability``, API-Bank's ``system``, ``user``, ``answer`` and ``other``, a JSONL
file's own ``answer``. They reach reward functions as columns of their own
(`gd2po_jax.data.prompts.build_prompt_set`). They are pickled rather than Arrow columns because a
user's column may change type from row to row (an int in one JSONL row, a string in the next) or
hold what JSON cannot (parquet dates, bytes), which one Arrow column cannot hold. A record key in
`RESERVED_COLUMNS` is a malformed row: it would be shadowed by the column of that name (``row``,
``prompt_text``, ``extra_columns``) or by what rollouts add for reward functions (``response_ids``,
``rollout_index``). Only the loaders write ``extra_columns``, so nothing unpickled comes from a file.

Malformed rows raise `DataFormatError` naming the file, the 0-based row (and the 1-based line for
JSONL) and the field. With `on_error="skip"` they are left out instead, logged as a warning, and
returned in `LoadResult.skipped`. Problems with a whole file (missing, not a JSON list or not a
parquet file, no `prompt` column, no rows, or every row skipped) always raise `DataFormatError`
naming the file. Text must be valid UTF-8 (in JSON files, also after `\\u` escapes: no lone
surrogates); a row that is not is malformed like any other.

For the format modules: a row converter ``convert(record, index) -> dict`` checks fields with
`require_str`, `optional_str`, `chat_messages` and `dict_record`, raising `FieldError`, and returns
`schema_row`; `build_dataset` turns the converted rows into a `LoadResult`, raising or skipping.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import datasets

from gd2po_jax.data.columns import (
    EXTRA_COLUMNS,
    GROUND_TRUTH,
    LEVEL,
    PROMPT,
    PROMPT_ALIAS,
    PROMPT_TEXT,
    RESERVED_COLUMNS,
    ROW,
    SOURCE,
    TARGET,
    TASK_COLUMNS,
)
from gd2po_jax.errors import UserError

logger = logging.getLogger("gd2po_jax.data.loaders")  # the loaders' warnings keep their logger's name

OnError = Literal["raise", "skip"]

FEATURES = datasets.Features(
    {
        PROMPT: datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")}),
        GROUND_TRUTH: datasets.Value("string"),
        TARGET: datasets.Value("string"),
        LEVEL: datasets.Value("int64"),
        SOURCE: datasets.Value("string"),
        ROW: datasets.Value("int64"),
        PROMPT_TEXT: datasets.Value("string"),
        EXTRA_COLUMNS: datasets.Value("binary"),
    }
)
"""The schema of every loaded dataset (see the module docstring)."""


class DataFormatError(UserError, ValueError):
    """A data file, or one row of it, is not in the expected format.

    Attributes:
      path: the file.
      row: 0-based row index in the file (None for a problem with the whole file).
      line: 1-based line number, for JSONL files (None otherwise).
      field: the offending field (None when not specific to one).
      problem: what is wrong.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        row: int | None,
        field: str | None,
        problem: str,
        *,
        line: int | None = None,
    ):
        self.path = str(path)
        self.row, self.line, self.field, self.problem = row, line, field, problem
        where = [str(path)]
        if row is not None:
            where.append(f"row {row} (0-based)" + (f", line {line}" if line is not None else ""))
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(": ".join([", ".join(where), problem]))


class FieldError(Exception):
    """Raised by row converters; becomes a DataFormatError once the row is known."""

    def __init__(self, field: str, problem: str):
        super().__init__(problem)
        self.field, self.problem = field, problem


@dataclasses.dataclass(frozen=True)
class LoadResult:
    """A loaded dataset and the rows left out of it (only with `on_error="skip"`)."""

    dataset: datasets.Dataset
    skipped: tuple[DataFormatError, ...] = ()

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)


# ---------------------------------------------------------------- field checks


def require_str(value: Any, field: str, *, allow_empty: bool = True) -> str:
    """``value`` when it is a string of valid Unicode text (non-blank unless ``allow_empty``);
    else raises `FieldError` naming ``field``."""
    if not isinstance(value, str):
        raise FieldError(field, f"expected a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate, e.g. from a JSON "\ud800" escape
        raise FieldError(
            field, f"not valid Unicode text: {value[err.start]!r} at character {err.start} (a lone surrogate)"
        ) from None
    if not allow_empty and not value.strip():
        raise FieldError(field, "expected a non-empty string")
    return value


def optional_str(value: Any, field: str) -> str | None:
    """None, or `require_str` of ``value``."""
    return None if value is None else require_str(value, field)


def chat_messages(value: Any, field: str) -> list[dict[str, str]]:
    """A non-empty list of {"role": str, "content": str} messages (extra keys dropped)."""
    if not isinstance(value, (list, tuple)) or not value:
        raise FieldError(field, f"expected a non-empty list of chat messages, got {value!r:.80}")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise FieldError(f"{field}[{i}]", f"expected a message dict, got {type(message).__name__}")
        role = require_str(message.get("role"), f"{field}[{i}].role", allow_empty=False)
        content = require_str(message.get("content"), f"{field}[{i}].content")
        messages.append({"role": role, "content": content})
    return messages


def dict_record(record: Any) -> dict:
    """``record`` when it is a dict (a JSON object); else raises `FieldError`."""
    if not isinstance(record, dict):
        raise FieldError("<record>", f"expected a JSON object, got {type(record).__name__}")
    return record


# ---------------------------------------------------------------- rows and their extra columns


def _extra_columns(record: dict, keep: Iterable[str] = ()) -> dict[str, Any]:
    """The record's keys that are not `FEATURES` names (nor `PROMPT_ALIAS`), and those of ``keep`` (the
    `TASK_COLUMNS` a JSONL row gives as its own), with their values; raises `FieldError` on a key of
    `RESERVED_COLUMNS`."""
    for name in RESERVED_COLUMNS:
        if name in record:
            raise FieldError(
                name,
                f"is a reserved column name ({', '.join(RESERVED_COLUMNS)}): the loader or "
                "the rollouts set a column of that name, which would hide this one; rename it",
            )
    keep = set(keep)
    return {
        name: value for name, value in record.items() if (name not in FEATURES and name != PROMPT_ALIAS) or name in keep
    }


_UNPICKLABLE = (pickle.PicklingError, TypeError, AttributeError, RecursionError)


def _pickled(extras: dict[str, Any]) -> bytes:
    """``pickle.dumps(extras)``; raises `FieldError` naming a column whose value cannot be pickled."""
    try:
        return pickle.dumps(extras)
    except _UNPICKLABLE:
        for name, value in extras.items():
            try:
                pickle.dumps(value)
            except _UNPICKLABLE as err:
                raise FieldError(
                    name,
                    f"cannot be kept as an extra column: its value cannot be pickled ({type(err).__name__}: {err})",
                ) from None
        raise


def schema_row(
    record: dict,
    prompt,
    *,
    prompt_text=None,
    ground_truth=None,
    target=None,
    level=None,
    source: str,
    row: int,
    keep: Iterable[str] = (),
) -> dict[str, Any]:
    """A row of `FEATURES`; the record's other keys become its extra columns, and so do its keys of
    ``keep`` (`TASK_COLUMNS` the record gives as columns of its own, kept with their exact values)."""
    return {
        PROMPT: prompt,
        GROUND_TRUTH: ground_truth,
        TARGET: target,
        LEVEL: level,
        SOURCE: source,
        ROW: row,
        PROMPT_TEXT: prompt_text,
        EXTRA_COLUMNS: _pickled(_extra_columns(record, keep)),
    }


def decode_extra_columns(dataset_or_values: datasets.Dataset | Iterable[bytes | None]) -> dict[str, list[Any]]:
    """The extra columns of a loaded dataset (or of its `EXTRA_COLUMNS` values): name -> one value
    per row, names in order of first appearance, None where a row lacks the column (as `datasets`
    fills a JSON column missing from a row). A dataset without the column, or a row whose value is
    None (a generated task's row), has none. Each row is unpickled once."""
    if isinstance(dataset_or_values, datasets.Dataset):
        if EXTRA_COLUMNS not in dataset_or_values.column_names:
            return {}
        dataset_or_values = dataset_or_values[EXTRA_COLUMNS]
    rows = [{} if value is None else pickle.loads(value) for value in dataset_or_values]
    names = dict.fromkeys(name for row in rows for name in row)
    return {name: [row.get(name) for row in rows] for name in names}


def dataset_columns(dataset: datasets.Dataset, *, where: str = "data") -> dict[str, list[Any]]:
    """The columns reward functions see: every column of ``dataset`` but `EXTRA_COLUMNS`, then the
    decoded extra columns (`decode_extra_columns`), one value per row each. Of the `TASK_COLUMNS`,
    only those the data has: one the rows give as their own holds their exact values (a JSONL
    ``"ground_truth": 7`` stays 7); ``source`` is otherwise the loader's label, left out; the others
    are left out when None in every row (the data has no such column: no ``target`` keyword argument
    for a data set without targets), and kept when the format derived them (verl's ground truth,
    API-Bank's level).

    Raises:
      ValueError: an extra column with the name of a column of the dataset, naming ``where``.
    """
    columns = {name: list(dataset[name]) for name in dataset.column_names if name != EXTRA_COLUMNS}
    extras = decode_extra_columns(dataset)
    for name in TASK_COLUMNS:
        if name in extras:
            columns[name] = extras.pop(name)
        elif name in columns and (name == SOURCE or all(value is None for value in columns[name])):
            del columns[name]
    clashes = sorted(set(columns) & set(extras))
    if clashes:
        raise ValueError(f"{where}: the extra columns {clashes} have the names of columns of the dataset; rename them")
    return columns | extras


# ---------------------------------------------------------------- files and datasets


def build_dataset(
    path,
    records: Iterable[tuple[int, int | None, Any]],
    convert: Callable[[Any, int], dict],
    on_error: OnError,
) -> LoadResult:
    """Convert (row, line, record) triples into a dataset, raising or skipping on bad rows."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    rows, skipped = [], []
    for index, line, record in records:
        try:
            rows.append(convert(record, index))
        except FieldError as err:
            error = DataFormatError(path, index, err.field, err.problem, line=line)
            if on_error == "raise":
                raise error from None
            skipped.append(error)
    if not rows:
        problem = (
            (
                f"no usable rows: all {len(skipped)} rows are malformed (skipped with on_error='skip'); "
                f"first: {skipped[0]}"
            )
            if skipped
            else "holds no rows"
        )
        raise DataFormatError(path, None, None, problem)
    if skipped:
        logger.warning("%s: skipped %d malformed row(s); first: %s", path, len(skipped), skipped[0])
    return LoadResult(datasets.Dataset.from_list(rows, features=FEATURES), tuple(skipped))


def numbered(records: Iterable[Any]) -> Iterator[tuple[int, None, Any]]:
    """The (row, line, record) triples `build_dataset` takes of records without lines: (index, None, record)."""
    return ((index, None, record) for index, record in enumerate(records))


def check_file(path: str | os.PathLike) -> pathlib.Path:
    """``path`` as a `pathlib.Path`; raises FileNotFoundError when it is not a file."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    return path


def json_list(path: pathlib.Path) -> list[Any]:
    """The records of a file holding one JSON list."""
    try:
        with open(path, encoding="utf-8") as f:
            records = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataFormatError(path, None, None, f"not valid JSON ({err})") from err
    if not isinstance(records, list):
        raise DataFormatError(path, None, None, f"expected a JSON list of records, got {type(records).__name__}")
    return records
