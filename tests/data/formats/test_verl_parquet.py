"""gd2po_jax/data/formats/verl_parquet.py: verl RL parquet files: the rows, the extra columns,
prompt-only files, corrupted rows.

Tests on a data file run on the tiny files (``[tiny]``) and the real public ones (``[real]``, where
``GD2PO_JAX_DATA_DIR`` names them): the ``files`` fixture of tests/data/conftest.py."""

import datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gd2po_jax.data import (
    FEATURES,
    PROMPT_TEXT,
    DataFormatError,
    decode_extra_columns,
    load_verl_parquet,
)
from tests import fixture_data
from tests.data.loader_files import rlla_parquet


def test_verl_parquet_file(files):
    data_dir, expected = files
    result = load_verl_parquet(data_dir / "rlla_4k" / "test.parquet")
    ds = result.dataset
    assert result.num_skipped == 0
    assert len(ds) == expected.rlla_rows and ds.features == FEATURES
    first = ds[0]
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    assert first["prompt"][0]["content"].startswith(expected.system_prefix)
    assert expected.rlla_first_user in first["prompt"][1]["content"]
    assert first["ground_truth"].startswith("<think>") and expected.rlla_first_call in first["ground_truth"]
    assert (first["source"], first["target"], first["level"]) == ("rlla", None, None)
    assert ds["row"] == list(range(expected.rlla_rows))
    assert sum("<tool_call>" in gt for gt in ds["ground_truth"]) == expected.rlla_tool_calls


def test_verl_parquet_keeps_every_other_column_as_extras(files):
    data_dir, _ = files
    path = data_dir / "rlla_4k" / "test.parquet"
    raw = pq.read_table(path).to_pylist()
    ds = load_verl_parquet(path).dataset
    extras = decode_extra_columns(ds)
    assert set(extras) == {"data_source", "reward_model", "extra_info", "ability"}  # every column but prompt
    for name, values in extras.items():
        assert values == [record[name] for record in raw], name
    assert extras["reward_model"][0]["ground_truth"] == ds[0]["ground_truth"]  # still extracted
    assert set(ds[PROMPT_TEXT]) == {None}  # chat messages


def test_verl_parquet_extras_keep_values_json_cannot_hold(tmp_path):
    rows = pq.read_table(rlla_parquet()).slice(0, 2).to_pylist()
    rows[0] |= {"asked_on": datetime.date(2024, 3, 26), "blob": b"\x00\xff"}
    rows[1] |= {"asked_on": None, "blob": b""}
    path = tmp_path / "dated.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    extras = decode_extra_columns(load_verl_parquet(path).dataset)
    assert extras["asked_on"] == [datetime.date(2024, 3, 26), None] and extras["blob"] == [b"\x00\xff", b""]


def test_verl_prompt_only_parquet(files):
    data_dir, expected = files
    path = data_dir / "safe_alignment" / "alpaca_test.parquet"
    with pytest.raises(DataFormatError, match="require_ground_truth=False"):
        load_verl_parquet(path)
    ds = load_verl_parquet(path, require_ground_truth=False).dataset
    assert len(ds) == expected.alpaca_rows and set(ds["ground_truth"]) == {None}
    assert ds[0]["prompt"][0]["content"].startswith(expected.alpaca_first)


def _corrupt_parquet(tmp_path):
    rows = pq.read_table(rlla_parquet()).to_pylist()
    rows[5]["reward_model"]["ground_truth"] = None
    rows[7]["prompt"] = []
    path = tmp_path / "corrupt.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_verl_corrupted_row_fails_with_row_and_field(tmp_path):
    path = _corrupt_parquet(tmp_path)
    with pytest.raises(
        DataFormatError, match=r"row 5 \(0-based\).*reward_model\.ground_truth"
    ) as info:
        load_verl_parquet(path)
    assert (info.value.path, info.value.row, info.value.field) == (
        str(path),
        5,
        "reward_model.ground_truth",
    )
    assert str(path) in str(info.value)


def test_verl_skip_mode_counts(tmp_path):
    result = load_verl_parquet(_corrupt_parquet(tmp_path), on_error="skip")
    assert result.num_skipped == 2
    assert [(e.row, e.field) for e in result.skipped] == [
        (5, "reward_model.ground_truth"),
        (7, "prompt"),
    ]
    assert (
        len(result.dataset) == fixture_data.ROWS["rlla_4k/test.parquet"] - 2
        and 5 not in result.dataset["row"]
        and 7 not in result.dataset["row"]
    )


def test_parquet_without_prompt_column(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"question": ["hi"]}), path)
    with pytest.raises(DataFormatError, match="no 'prompt' column"):
        load_verl_parquet(path)
