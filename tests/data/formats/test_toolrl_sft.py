"""gd2po_jax/data/formats/toolrl_sft.py: ToolRL SFT JSON files: the rows, corrupted rows, files that
are not a JSON list.

Tests on a data file run on the tiny files (``[tiny]``) and the real public ones (``[real]``, where
``GD2PO_JAX_DATA_DIR`` names them): the ``files`` fixture of tests/data/conftest.py."""

import json

import pytest

from gd2po_jax.data import (
    DataFormatError,
    decode_extra_columns,
    load_toolrl_sft,
)
from tests import fixture_data
from tests.fakes import data_files


def test_toolrl_sft_file(files):
    data_dir, expected = files
    ds = load_toolrl_sft(data_dir / "rlla_4k" / "rlla_sft.json").dataset
    raw = json.loads((data_dir / "rlla_4k" / "rlla_sft.json").read_text())
    assert len(ds) == expected.sft_rows
    assert ds[0]["prompt"] == [
        {"role": "system", "content": raw[0]["instruction"]},
        {"role": "user", "content": raw[0]["input"]},
    ]
    assert ds[0]["target"] == raw[0]["output"] and ds[0]["target"].startswith("<think>")
    assert ds[0]["ground_truth"] is None and ds[0]["source"] == "toolrl_sft"
    assert expected.sft_first_user in ds[0]["prompt"][1]["content"]
    assert decode_extra_columns(ds.select([0])) == {name: [raw[0][name]] for name in ("instruction", "input", "output")}


def _corrupt_sft(tmp_path):
    raw = json.loads((data_files() / "rlla_4k" / "rlla_sft.json").read_text())
    raw[3]["output"] = 5
    del raw[10]["instruction"]
    raw[12] = "not an object"
    path = tmp_path / "sft.json"
    path.write_text(json.dumps(raw))
    return path


def test_toolrl_sft_corrupted_rows(tmp_path):
    path = _corrupt_sft(tmp_path)
    with pytest.raises(
        DataFormatError, match=r"row 3 \(0-based\), field 'output': expected a string, got int"
    ):
        load_toolrl_sft(path)
    result = load_toolrl_sft(path, on_error="skip")
    assert [(e.row, e.field) for e in result.skipped] == [
        (3, "output"),
        (10, "instruction"),
        (12, "<record>"),
    ]
    assert len(result.dataset) == fixture_data.ROWS["rlla_4k/rlla_sft.json"] - 3


def test_json_file_that_is_not_a_list(tmp_path):
    path = tmp_path / "obj.json"
    path.write_text('{"instruction": "x"}')
    with pytest.raises(DataFormatError, match="expected a JSON list"):
        load_toolrl_sft(path)
    path.write_text("[{")
    with pytest.raises(DataFormatError, match="not valid JSON"):
        load_toolrl_sft(path)
    with pytest.raises(FileNotFoundError):
        load_toolrl_sft(tmp_path / "missing.json")
