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
    # Only the data's own columns: no ground_truth, target or level it does not have, no loader's source label.
    assert list(columns) == ["prompt", "row", "prompt_text", "answer"]
    with pytest.raises(ValueError, match=r"^train data: the extra columns \['answer'\] have the names of columns"):
        dataset_columns(ds.add_column("answer", [5]), where="train data")


def test_on_error_must_be_known(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [json.dumps(JSONL_ROWS[0])])
    with pytest.raises(ValueError, match="on_error"):
        load_jsonl(path, on_error="ignore")


def test_the_task_columns_a_row_gives_reach_reward_functions_as_they_are(tmp_path):
    """A JSONL row's own ground_truth / target / level / source, of any type, where the task does not read
    them (``typed`` names those it reads): kept as the user's columns with their exact values; the schema's
    column holds a value of its type or None. Typed, a wrong type names what reads the column."""
    rows = [{"prompt": "p", "ground_truth": 7, "target": {"a": 1}, "level": "hard", "source": ["x"]},
            {"prompt": "q", "ground_truth": "8", "level": 2}]
    path = write_jsonl(tmp_path / "d.jsonl", [json.dumps(row) for row in rows])
    ds = load_jsonl(path, typed={}).dataset
    assert ds["ground_truth"] == [None, "8"] and ds["level"] == [None, 2] and ds["target"] == [None, None]
    assert ds["source"] == ["jsonl", "jsonl"]
    columns = dataset_columns(ds)
    assert columns["ground_truth"] == [7, "8"] and columns["target"] == [{"a": 1}, None]
    assert columns["level"] == ["hard", 2] and columns["source"] == [["x"], None]
    reason = "the files task's warm start (config.sft.enabled) reads it as the text to imitate"
    with pytest.raises(DataFormatError, match=r"row 0 .*field 'target': expected a string, got dict; the files "
                                              r"task's warm start \(config.sft.enabled\) reads it"):
        load_jsonl(path, typed={"target": reason})
    with pytest.raises(DataFormatError, match=r"field 'ground_truth': expected a string, got int$"):
        load_jsonl(path)  # typed=None: every schema column typed, as before
