"""Loaders for the tool-calling data users already have on disk, into one `datasets.Dataset` schema.

Every loader returns a `LoadResult` whose `dataset` has exactly these columns (`FEATURES`), so
datasets from different files can be concatenated and the trainer reads one layout:

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

Supported files (local only; nothing is downloaded):

  verl RL parquet        `prompt` (chat messages), `reward_model.ground_truth`, `data_source`
                         -> `load_verl_parquet` (prompt-only files allowed with
                         `require_ground_truth=False`); every column is read
  ToolRL SFT JSON        a JSON list of {"instruction", "input", "output"} -> `load_toolrl_sft`;
                         prompt = [system: instruction, user: input], target = output
  API-Bank JSON          a JSON list of {"system", "user", "answer", ...}; `answer` is a list of
                         {"name", "parameters"} dicts, one such dict, or a Python-literal string of
                         either (parsed with `ast.literal_eval`) -> `load_api_bank_file`,
                         `load_api_bank` (a directory of level-{1,2,3}-api_processed.json)
  JSONL                  one JSON object per line -> `load_jsonl`, with fields
                           "prompt": str (one user message) or a list of {"role", "content"}
                           "messages": alias of "prompt" (give exactly one of the two)
                           "ground_truth": str (optional), "target": str (optional),
                           "level": int (optional), "source": str (optional, default "jsonl")
                         other fields are extra columns; blank lines are skipped.

Malformed rows raise `DataFormatError` naming the file, the 0-based row (and the 1-based line for
JSONL) and the field. With `on_error="skip"` they are left out instead, logged as a warning, and
returned in `LoadResult.skipped`. Problems with a whole file (missing, not a JSON list or not a
parquet file, no `prompt` column, no rows, or every row skipped) always raise `DataFormatError`
naming the file. Text must be valid UTF-8 (in JSON files, also after `\\u` escapes: no lone
surrogates); a row that is not is malformed like any other.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import logging
import os
import pathlib
import pickle
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

import datasets
import pyarrow as pa
import pyarrow.parquet as pq

from gd2po_jax.config import DATA_KINDS

logger = logging.getLogger(__name__)

OnError = Literal["raise", "skip"]

FEATURES = datasets.Features(
    {
        "prompt": datasets.List(
            {"role": datasets.Value("string"), "content": datasets.Value("string")}
        ),
        "ground_truth": datasets.Value("string"),
        "target": datasets.Value("string"),
        "level": datasets.Value("int64"),
        "source": datasets.Value("string"),
        "row": datasets.Value("int64"),
        "prompt_text": datasets.Value("string"),
        "extra_columns": datasets.Value("binary"),
    }
)
"""The schema of every loaded dataset (see the module docstring)."""

PROMPT_TEXT = "prompt_text"
"""The column of the prompt as the data gave it when it was one string (else None)."""

EXTRA_COLUMNS = "extra_columns"
"""The column of a row's other columns, pickled (`decode_extra_columns`)."""

PROMPT_ALIAS = "messages"
"""The JSONL name of ``prompt`` (not an extra column)."""

RESERVED_COLUMNS = ("row", PROMPT_TEXT, EXTRA_COLUMNS, "response_ids", "rollout_index")
"""Record keys that are refused (`DataFormatError`, "rename it"): each would be silently shadowed,
by a `FEATURES` column the loader sets, or by a column rollouts give reward functions
(`gd2po_jax.rewards.base.RESPONSE_IDS`, `gd2po_jax.rewards.base.ROLLOUT_INDEX`; not imported: that
package loads JAX)."""

_API_BANK_FILE = re.compile(r"level-(\d+)-api_processed\.json$")


class DataFormatError(ValueError):
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


class _FieldError(Exception):
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


def _require_str(value: Any, field: str, *, allow_empty: bool = True) -> str:
    if not isinstance(value, str):
        raise _FieldError(field, f"expected a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate, e.g. from a JSON "\ud800" escape
        raise _FieldError(field, f"not valid Unicode text: {value[err.start]!r} at character {err.start} "
                                 "(a lone surrogate)") from None
    if not allow_empty and not value.strip():
        raise _FieldError(field, "expected a non-empty string")
    return value


def _optional_str(value: Any, field: str) -> str | None:
    return None if value is None else _require_str(value, field)


def _messages(value: Any, field: str) -> list[dict[str, str]]:
    """A non-empty list of {"role": str, "content": str} messages (extra keys dropped)."""
    if not isinstance(value, (list, tuple)) or not value:
        raise _FieldError(field, f"expected a non-empty list of chat messages, got {value!r:.80}")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise _FieldError(
                f"{field}[{i}]", f"expected a message dict, got {type(message).__name__}"
            )
        role = _require_str(message.get("role"), f"{field}[{i}].role", allow_empty=False)
        content = _require_str(message.get("content"), f"{field}[{i}].content")
        messages.append({"role": role, "content": content})
    return messages


def _extra_columns(record: dict) -> dict[str, Any]:
    """The record's keys that are not `FEATURES` names (nor `PROMPT_ALIAS`), with their values;
    raises `_FieldError` on a key of `RESERVED_COLUMNS`."""
    for name in RESERVED_COLUMNS:
        if name in record:
            raise _FieldError(name, f"is a reserved column name ({', '.join(RESERVED_COLUMNS)}): the loader or "
                                    "the rollouts set a column of that name, which would hide this one; rename it")
    return {name: value for name, value in record.items() if name not in FEATURES and name != PROMPT_ALIAS}


_UNPICKLABLE = (pickle.PicklingError, TypeError, AttributeError, RecursionError)


def _pickled(extras: dict[str, Any]) -> bytes:
    """``pickle.dumps(extras)``; raises `_FieldError` naming a column whose value cannot be pickled."""
    try:
        return pickle.dumps(extras)
    except _UNPICKLABLE:
        for name, value in extras.items():
            try:
                pickle.dumps(value)
            except _UNPICKLABLE as err:
                raise _FieldError(name, f"cannot be kept as an extra column: its value cannot be pickled "
                                        f"({type(err).__name__}: {err})") from None
        raise


def _row(
    record: dict, prompt, *, prompt_text=None, ground_truth=None, target=None, level=None, source: str, row: int
) -> dict[str, Any]:
    """A row of `FEATURES`; the record's other keys become its extra columns."""
    return {
        "prompt": prompt,
        "ground_truth": ground_truth,
        "target": target,
        "level": level,
        "source": source,
        "row": row,
        PROMPT_TEXT: prompt_text,
        EXTRA_COLUMNS: _pickled(_extra_columns(record)),
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
    decoded extra columns (`decode_extra_columns`), one value per row each.

    Raises:
      ValueError: an extra column with the name of a column of the dataset, naming ``where``.
    """
    columns = {name: list(dataset[name]) for name in dataset.column_names if name != EXTRA_COLUMNS}
    extras = decode_extra_columns(dataset)
    clashes = sorted(set(columns) & set(extras))
    if clashes:
        raise ValueError(f"{where}: the extra columns {clashes} have the names of columns of the dataset; rename them")
    return columns | extras


def _build(
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
        except _FieldError as err:
            error = DataFormatError(path, index, err.field, err.problem, line=line)
            if on_error == "raise":
                raise error from None
            skipped.append(error)
    if not rows:
        problem = (f"no usable rows: all {len(skipped)} rows are malformed (skipped with on_error='skip'); "
                   f"first: {skipped[0]}") if skipped else "holds no rows"
        raise DataFormatError(path, None, None, problem)
    if skipped:
        logger.warning("%s: skipped %d malformed row(s); first: %s", path, len(skipped), skipped[0])
    return LoadResult(datasets.Dataset.from_list(rows, features=FEATURES), tuple(skipped))


def _check_file(path: str | os.PathLike) -> pathlib.Path:
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    return path


def _json_list(path: pathlib.Path) -> list[Any]:
    """The records of a file holding one JSON list."""
    try:
        with open(path, encoding="utf-8") as f:
            records = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataFormatError(path, None, None, f"not valid JSON ({err})") from err
    if not isinstance(records, list):
        raise DataFormatError(
            path, None, None, f"expected a JSON list of records, got {type(records).__name__}"
        )
    return records


def _dict_record(record: Any) -> dict:
    if not isinstance(record, dict):
        raise _FieldError("<record>", f"expected a JSON object, got {type(record).__name__}")
    return record


# ---------------------------------------------------------------- verl parquet


def load_verl_parquet(
    path: str | os.PathLike, *, require_ground_truth: bool = True, on_error: OnError = "raise"
) -> LoadResult:
    """Load a verl RL parquet file (`prompt`, `reward_model.ground_truth`, `data_source`); its other
    columns (``extra_info``, ``ability``, ...) and these two are the rows' extra columns.

    Args:
      require_ground_truth: when False, a file without `reward_model.ground_truth` (prompt-only
        data) loads with ground_truth None; rows of a file that has the field still need it.
    """
    path = _check_file(path)
    try:
        parquet = pq.ParquetFile(path)
        schema = parquet.schema_arrow
    except (pa.ArrowException, OSError) as err:
        raise DataFormatError(path, None, None, f"not a readable parquet file ({type(err).__name__}: {err})") from None
    if "prompt" not in schema.names:
        raise DataFormatError(
            path, None, "prompt", f"no 'prompt' column; columns are {schema.names}"
        )
    has_gt = _has_ground_truth_field(schema)
    if require_ground_truth and not has_gt:
        raise DataFormatError(
            path,
            None,
            "reward_model.ground_truth",
            "missing; pass require_ground_truth=False to load prompt-only data",
        )
    def records() -> Iterator[tuple[int, None, dict]]:
        index = 0
        batches = parquet.iter_batches(batch_size=1024)  # every column: the others are extra columns
        while True:
            try:
                batch = next(batches, None)
                batch_records = [] if batch is None else batch.to_pylist()
            except (pa.ArrowException, OSError, UnicodeDecodeError) as err:  # a corrupt page
                raise DataFormatError(path, None, None, f"unreadable from row {index} on "
                                      f"({type(err).__name__}: {err})") from None
            if batch is None:
                return
            for record in batch_records:
                yield index, None, record
                index += 1

    return _build(path, records(), functools.partial(_verl_row, has_ground_truth=has_gt), on_error)


def _verl_row(record: Any, index: int, *, has_ground_truth: bool) -> dict:
    """A verl record (`prompt` messages, `reward_model.ground_truth` when ``has_ground_truth``,
    `data_source`) as a row of `FEATURES`."""
    record = _dict_record(record)
    ground_truth = None
    if has_ground_truth:
        reward_model = record.get("reward_model")
        if not isinstance(reward_model, dict):
            raise _FieldError("reward_model", "missing (null)")
        ground_truth = _require_str(
            reward_model.get("ground_truth"), "reward_model.ground_truth", allow_empty=False
        )
    source = _optional_str(record.get("data_source"), "data_source") or "verl"
    return _row(record, _messages(record.get("prompt"), "prompt"), ground_truth=ground_truth, source=source,
                row=index)


def _has_ground_truth_field(schema: pa.Schema) -> bool:
    """Whether a parquet schema has a `reward_model` struct with a `ground_truth` field."""
    if "reward_model" not in schema.names:
        return False
    reward_model = schema.field("reward_model").type
    return pa.types.is_struct(reward_model) and reward_model.get_field_index("ground_truth") >= 0


# ---------------------------------------------------------------- ToolRL SFT JSON


def _toolrl_sft_row(record: Any, index: int) -> dict:
    record = _dict_record(record)
    instruction = _require_str(record.get("instruction"), "instruction", allow_empty=False)
    user = _require_str(record.get("input"), "input")
    output = _require_str(record.get("output"), "output", allow_empty=False)
    prompt = [{"role": "system", "content": instruction}, {"role": "user", "content": user}]
    return _row(record, prompt, target=output, source="toolrl_sft", row=index)


def load_toolrl_sft(path: str | os.PathLike, *, on_error: OnError = "raise") -> LoadResult:
    """Load ToolRL SFT data: a JSON list of {"instruction", "input", "output"}.

    The prompt is [system: instruction, user: input] (as ToolRL builds its RL prompts from the
    same kind of records) and `target` is the output to imitate. `ground_truth` is None: SFT
    outputs are not all valid reward ground truths (some mention `<tool_call>` inside the think
    text, which the ToolRL reward would parse as the call block).
    """
    path = _check_file(path)
    records = ((i, None, r) for i, r in enumerate(_json_list(path)))
    return _build(path, records, _toolrl_sft_row, on_error)


# ---------------------------------------------------------------- API-Bank JSON


def _api_bank_answer(value: Any) -> list[dict]:
    """The answer as a non-empty list of {"name": str, "parameters": dict} calls; raises
    `_FieldError` naming the part of `answer` that is wrong."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as err:
            raise _FieldError(
                "answer", f"not a Python literal ({type(err).__name__}: {err})"
            ) from None
    calls = [value] if isinstance(value, dict) else value
    if not isinstance(calls, list) or not calls:
        raise _FieldError(
            "answer", f"expected a non-empty list of calls or one call, got {value!r:.80}"
        )
    for i, call in enumerate(calls):
        if not (
            isinstance(call, dict)
            and isinstance(call.get("name"), str)
            and isinstance(call.get("parameters"), dict)
        ):
            raise _FieldError(
                f"answer[{i}]", f"expected {{'name': str, 'parameters': dict}}, got {call!r:.80}"
            )
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
    except _FieldError as err:
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
        raise ValueError(
            f"bad API-Bank answer: the ground truth is not JSON ({err}): {ground_truth!r:.200}"
        ) from None
    return parse_api_bank_answer(value)


def load_api_bank_file(
    path: str | os.PathLike, *, level: int | None = None, on_error: OnError = "raise"
) -> LoadResult:
    """Load one API-Bank processed file: a JSON list of {"system", "user", "answer", ...}.

    Args:
      level: the difficulty level; by default taken from a `level-<N>-api_processed.json` name.
    """
    path = _check_file(path)
    if level is None:
        match = _API_BANK_FILE.search(path.name)
        level = int(match.group(1)) if match else None

    records = ((i, None, r) for i, r in enumerate(_json_list(path)))
    return _build(path, records, functools.partial(_api_bank_row, level=level), on_error)


def _api_bank_row(record: Any, index: int, *, level: int | None) -> dict:
    """An API-Bank record ({"system", "user", "answer", ...}) as a row of `FEATURES`."""
    record = _dict_record(record)
    system = _require_str(record.get("system"), "system")
    user = _require_str(record.get("user"), "user", allow_empty=False)
    calls = _api_bank_answer(record.get("answer"))
    try:
        ground_truth = encode_api_bank_answer(calls)
    except (TypeError, ValueError) as err:
        raise _FieldError("answer", f"not representable as JSON ({err})") from None
    _require_str(ground_truth, "answer")  # no lone surrogates in its strings
    prompt = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return _row(record, prompt, ground_truth=ground_truth, level=level, source="api_bank", row=index)


def load_api_bank(
    directory: str | os.PathLike, *, levels: Sequence[int] = (1, 2, 3), on_error: OnError = "raise"
) -> LoadResult:
    """Load `level-<N>-api_processed.json` for each level in `directory`, concatenated in order."""
    directory = pathlib.Path(directory)
    results = [
        load_api_bank_file(
            directory / f"level-{lv}-api_processed.json", level=lv, on_error=on_error
        )
        for lv in levels
    ]
    if not results:
        raise ValueError("load_api_bank needs at least one level")
    dataset = datasets.concatenate_datasets([r.dataset for r in results])
    return LoadResult(dataset, tuple(e for r in results for e in r.skipped))


# ---------------------------------------------------------------- JSONL


def _jsonl_row(record: Any, index: int) -> dict:
    record = _dict_record(record)
    if ("prompt" in record) == (PROMPT_ALIAS in record):
        raise _FieldError("prompt", f"give exactly one of 'prompt' and {PROMPT_ALIAS!r}")
    field = "prompt" if "prompt" in record else PROMPT_ALIAS
    value = record[field]
    prompt_text = _require_str(value, field, allow_empty=False) if isinstance(value, str) else None
    prompt = [{"role": "user", "content": prompt_text}] if prompt_text is not None else _messages(value, field)
    level = record.get("level")
    if level is not None and (isinstance(level, bool) or not isinstance(level, int)):
        raise _FieldError("level", f"expected an integer, got {level!r:.40}")
    return _row(
        record,
        prompt,
        prompt_text=prompt_text,
        ground_truth=_optional_str(record.get("ground_truth"), "ground_truth"),
        target=_optional_str(record.get("target"), "target"),
        level=level,
        source=_optional_str(record.get("source"), "source") or "jsonl",
        row=index,
    )


def load_jsonl(path: str | os.PathLike, *, on_error: OnError = "raise") -> LoadResult:
    """Load a JSONL file in the schema of the module docstring (row = 0-based line index)."""
    path = _check_file(path)

    def records() -> Iterator[tuple[int, int, bytes]]:
        with open(path, "rb") as f:  # lines end at b"\n" only; each is decoded on its own
            for index, line in enumerate(f):
                if line.strip():
                    yield index, index + 1, line

    def convert(raw: bytes, index: int) -> dict:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise _FieldError("<line>", f"not valid UTF-8: byte {raw[err.start]:#04x} at byte "
                                        f"{err.start} of the line") from None
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as err:
            raise _FieldError("<line>", f"not valid JSON ({err})") from None
        return _jsonl_row(record, index)

    return _build(path, records(), convert, on_error)


# ---------------------------------------------------------------- dispatch

KINDS = DATA_KINDS
"""The formats `load_data` reads (``config.data.kind``, besides auto)."""


def detect_kind(path: str | os.PathLike) -> str:
    """The loader kind of a path: by extension, and for .json by the first record's keys; a
    directory is an API-Bank directory."""
    path = pathlib.Path(path)
    if path.is_dir():
        return "api_bank"
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return "verl"
    if suffix == ".jsonl":
        return "jsonl"
    if suffix == ".json":
        records = _json_list(_check_file(path))
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
    raise ValueError(
        f"cannot tell the data format of {path} from its extension; pass kind= one of {KINDS}"
    )


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
    loaders: dict[str, Callable[..., LoadResult]] = {
        "verl": load_verl_parquet,
        "toolrl_sft": load_toolrl_sft,
        "api_bank": load_api_bank if pathlib.Path(path).is_dir() else load_api_bank_file,
        "jsonl": load_jsonl,
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
    if "prompt" in names and names & {"reward_model", "data_source"}:
        return "verl"
    if names & {"prompt", "messages"}:
        return "jsonl"
    raise DataFormatError("<records>", None, None, f"cannot tell the format from columns {sorted(names)}; "
                          f"pass kind= one of {KINDS}")


def load_records(name: str, records: datasets.Dataset, *, kind: str = "auto", on_error: OnError = "raise",
                 require_ground_truth: bool = True) -> LoadResult:
    """The rows of ``records`` (a `datasets.Dataset` in one of the formats of the module docstring,
    e.g. from ``datasets.load_from_disk`` or ``datasets.load_dataset``) in the `FEATURES` schema, its
    other columns kept as extra columns (a column a row lacks holds None there, as `datasets` gives it).
    ``name`` (a folder or a Hub id) is what errors name, with the 0-based row.

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
            raise DataFormatError(name, None, "reward_model.ground_truth",
                                  "missing; pass require_ground_truth=False to load prompt-only data")
        convert = functools.partial(_verl_row, has_ground_truth=has_ground_truth)
    elif kind == "api_bank":
        convert = functools.partial(_api_bank_row, level=None)
    elif kind in ("toolrl_sft", "jsonl"):
        convert = _toolrl_sft_row if kind == "toolrl_sft" else _jsonl_row
    else:
        raise ValueError(f"unknown data kind {kind!r}; expected 'auto' or one of {KINDS}")
    return _build(name, ((index, None, record) for index, record in enumerate(records)), convert, on_error)
