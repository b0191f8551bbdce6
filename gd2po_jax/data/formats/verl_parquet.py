"""The verl RL parquet format: `prompt` (chat messages), `reward_model.ground_truth` and
`data_source` columns, every other column kept as an extra column; its file loader and row converter."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gd2po_jax.data.columns import PROMPT
from gd2po_jax.data.schema import (
    DataFormatError,
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


def load_verl_parquet(
    path: str | os.PathLike, *, require_ground_truth: bool = True, on_error: OnError = "raise"
) -> LoadResult:
    """Load a verl RL parquet file (`prompt`, `reward_model.ground_truth`, `data_source`); its other
    columns (``extra_info``, ``ability``, ...) and these two are the rows' extra columns.

    Args:
      require_ground_truth: when False, a file without `reward_model.ground_truth` (prompt-only
        data) loads with ground_truth None; rows of a file that has the field still need it.
    """
    path = check_file(path)
    try:
        parquet = pq.ParquetFile(path)
        schema = parquet.schema_arrow
    except (pa.ArrowException, OSError) as err:
        raise DataFormatError(path, None, None, f"not a readable parquet file ({type(err).__name__}: {err})") from None
    if PROMPT not in schema.names:
        raise DataFormatError(path, None, PROMPT, f"no 'prompt' column; columns are {schema.names}")
    has_gt = _has_ground_truth_field(schema)
    if require_ground_truth and not has_gt:
        raise missing_ground_truth(path)

    def records() -> Iterator[tuple[int, None, dict]]:
        index = 0
        batches = parquet.iter_batches(batch_size=1024)  # every column: the others are extra columns
        while True:
            try:
                batch = next(batches, None)
                batch_records = [] if batch is None else batch.to_pylist()
            except (pa.ArrowException, OSError, UnicodeDecodeError) as err:  # a corrupt page
                raise DataFormatError(
                    path, None, None, f"unreadable from row {index} on ({type(err).__name__}: {err})"
                ) from None
            if batch is None:
                return
            for record in batch_records:
                yield index, None, record
                index += 1

    return build_dataset(path, records(), functools.partial(verl_row, has_ground_truth=has_gt), on_error)


def verl_row(record: Any, index: int, *, has_ground_truth: bool) -> dict:
    """A verl record (`prompt` messages, `reward_model.ground_truth` when ``has_ground_truth``,
    `data_source`) as a row of `FEATURES`."""
    record = dict_record(record)
    ground_truth = None
    if has_ground_truth:
        reward_model = record.get("reward_model")
        if not isinstance(reward_model, dict):
            raise FieldError("reward_model", "missing (null)")
        ground_truth = require_str(reward_model.get("ground_truth"), "reward_model.ground_truth", allow_empty=False)
    source = optional_str(record.get("data_source"), "data_source") or "verl"
    return schema_row(
        record, chat_messages(record.get(PROMPT), PROMPT), ground_truth=ground_truth, source=source, row=index
    )


def missing_ground_truth(where: str | os.PathLike) -> DataFormatError:
    """The error for verl data (a file or ``where`` records) without `reward_model.ground_truth` when
    it is required."""
    return DataFormatError(
        where, None, "reward_model.ground_truth", "missing; pass require_ground_truth=False to load prompt-only data"
    )


def _has_ground_truth_field(schema: pa.Schema) -> bool:
    """Whether a parquet schema has a `reward_model` struct with a `ground_truth` field."""
    if "reward_model" not in schema.names:
        return False
    reward_model = schema.field("reward_model").type
    return pa.types.is_struct(reward_model) and reward_model.get_field_index("ground_truth") >= 0
