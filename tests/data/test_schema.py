"""gd2po_jax/data/schema.py: reserved column names, the extra columns and their decoding, the columns
reward functions see, and the ``on_error`` modes."""

import json
import pickle

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gd2po_jax.data import (
    EXTRA_COLUMNS,
    FEATURES,
    PROMPT_TEXT,
    RESERVED_COLUMNS,
    DataFormatError,
    dataset_columns,
    decode_extra_columns,
    load_jsonl,
    load_verl_parquet,
)
from gd2po_jax.data.columns import RESPONSE_IDS, ROLLOUT_INDEX
from tests.data.loader_files import JSONL_ROWS, rlla_parquet, write_jsonl


@pytest.mark.parametrize("name", RESERVED_COLUMNS)
def test_a_reserved_column_name_is_a_malformed_row_naming_it(tmp_path, name):
    lines = [json.dumps({"prompt": "fine"}), json.dumps({"prompt": "shadowed", name: 1})]
    path = write_jsonl(tmp_path / "d.jsonl", lines)
    with pytest.raises(DataFormatError, match=rf"d\.jsonl, row 1 \(0-based\), line 2, field '{name}': is a reserved "
                                              r"column name .*; rename it"):
        load_jsonl(path)
    assert load_jsonl(path, on_error="skip").dataset[PROMPT_TEXT] == ["fine"]


def test_reserved_names_cover_what_rollouts_add_and_parquet_columns_too(tmp_path):
    assert {RESPONSE_IDS, ROLLOUT_INDEX, "row", PROMPT_TEXT, EXTRA_COLUMNS} == set(RESERVED_COLUMNS)
    rows = pq.read_table(rlla_parquet()).slice(0, 2).to_pylist()
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.Table.from_pylist([r | {"response_ids": [1, 2]} for r in rows]), path)
    with pytest.raises(DataFormatError, match=r"ids\.parquet, row 0 \(0-based\), field 'response_ids': is a reserved"):
        load_verl_parquet(path)


def test_decode_extra_columns_fills_none_and_reads_values_or_a_dataset():
    values = [pickle.dumps({"a": 1}), None, pickle.dumps({"b": b"x", "a": "one"}), pickle.dumps({})]
    assert decode_extra_columns(values) == {"a": [1, None, "one", None], "b": [None, None, b"x", None]}
    assert decode_extra_columns(datasets.Dataset.from_dict({"prompt": ["p"]})) == {}  # no such column
    assert decode_extra_columns([]) == {}


def test_dataset_columns_decode_the_extras_and_refuse_a_clash(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [json.dumps({"prompt": "p", "answer": 4})])
    ds = load_jsonl(path).dataset
    columns = dataset_columns(ds)
    assert EXTRA_COLUMNS not in columns and columns["answer"] == [4] and columns["row"] == [0]
    assert list(columns) == [*(n for n in FEATURES if n != EXTRA_COLUMNS), "answer"]
    with pytest.raises(ValueError, match=r"^train data: the extra columns \['answer'\] have the names of columns"):
        dataset_columns(ds.add_column("answer", [5]), where="train data")


def test_on_error_must_be_known(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [json.dumps(JSONL_ROWS[0])])
    with pytest.raises(ValueError, match="on_error"):
        load_jsonl(path, on_error="ignore")
