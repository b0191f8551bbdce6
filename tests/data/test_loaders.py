"""gd2po_jax/data/loaders.py: the format picked by kind or detected (`load_data`, `detect_kind`), one
schema across formats, and whole-file problems naming the file, in every format.

Each test on a data file runs twice: on the tiny files of tests/fixture_data.py (``[tiny]``, always)
and on the real public files (``[real]``, where ``GD2PO_JAX_DATA_DIR`` names them: tests/conftest.py),
with what each holds (tests/data/loader_files.py ``EXPECTED``)."""

import re

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gd2po_jax.data import (
    DataFormatError,
    detect_kind,
    load_data,
)
from tests.data.loader_files import rlla_parquet, write_jsonl

# ---------------------------------------------------------------- dispatch and uniform schema


def test_detect_kind_and_load_data(files, tmp_path):
    data_dir, expected = files
    assert detect_kind(data_dir / "rlla_4k" / "test.parquet") == "verl"
    assert detect_kind(data_dir / "rlla_4k" / "rlla_sft.json") == "toolrl_sft"
    assert detect_kind(data_dir / "api_bank" / "level-2-api_processed.json") == "api_bank"
    assert detect_kind(data_dir / "api_bank") == "api_bank"
    assert len(load_data(data_dir / "api_bank", levels=(2,)).dataset) == expected.api_bank_rows[2]
    assert len(load_data(data_dir / "api_bank" / "level-3-api_processed.json").dataset) == expected.api_bank_rows[3]
    with pytest.raises(ValueError, match="kind"):
        load_data(tmp_path / "x.csv")
    with pytest.raises(ValueError, match="unknown data kind"):
        load_data(data_dir / "rlla_4k" / "test.parquet", kind="csv")


def test_loaders_share_one_schema(files):
    data_dir, expected = files
    parts = [
        load_data(data_dir / "rlla_4k" / "test.parquet").dataset,
        load_data(data_dir / "rlla_4k" / "rlla_sft.json").dataset,
        load_data(data_dir / "api_bank" / "level-2-api_processed.json").dataset,
    ]
    combined = datasets.concatenate_datasets(parts)
    assert len(combined) == expected.rlla_rows + expected.sft_rows + expected.api_bank_rows[2]
    assert set(combined["source"]) == {"rlla", "toolrl_sft", "api_bank"}


# ---------------------------------------------------------------- whole-file problems name the file


def _empty_files(tmp_path):
    """(path, load_data options) of files with no rows, one per format."""
    parquet = tmp_path / "empty.parquet"
    pq.write_table(pq.read_table(rlla_parquet()).slice(0, 0), parquet)
    (tmp_path / "empty.json").write_text("[]")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    return [(parquet, {}), (tmp_path / "empty.json", {"kind": "toolrl_sft"}),
            (tmp_path / "empty.json", {"kind": "api_bank"}), (tmp_path / "empty.json", {}),
            (tmp_path / "blank.jsonl", {})]


def test_a_file_without_rows_is_an_error_naming_it(tmp_path):
    for path, options in _empty_files(tmp_path):
        with pytest.raises(DataFormatError, match=rf"^{path}: holds no rows") as info:
            load_data(path, **options)
        assert (info.value.path, info.value.row) == (str(path), None), options


def test_a_file_whose_rows_are_all_skipped_is_an_error_naming_it_and_the_first_row(tmp_path):
    rows = pq.read_table(rlla_parquet()).slice(0, 3).to_pylist()
    for row in rows:
        row["prompt"] = []
    parquet = tmp_path / "all_bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    jsonl = write_jsonl(tmp_path / "all_bad.jsonl", ['{"x": 1}', '{"y": 2}'])
    for path, first in [(parquet, "row 0 (0-based), field 'prompt'"), (jsonl, "row 0 (0-based), line 1")]:
        with pytest.raises(DataFormatError, match=rf"^{path}: no usable rows: all \d rows are malformed "
                                                  rf"\(skipped with on_error='skip'\); first: .*{re.escape(first)}"):
            load_data(path, on_error="skip")


def test_a_file_that_is_not_parquet_is_an_error_naming_it(tmp_path):
    real = rlla_parquet().read_bytes()
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not a parquet file")
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(real[: len(real) // 2])
    for path in (garbage, truncated):
        with pytest.raises(DataFormatError, match=rf"^{path}: not a readable parquet file \(ArrowInvalid: "
                                                  "Parquet magic bytes"):
            load_data(path)
    corrupt = tmp_path / "corrupt_page.parquet"  # a data page overwritten: the footer still reads
    corrupt.write_bytes(real[: len(real) // 10] + bytes(64) + real[len(real) // 10 + 64 :])
    with pytest.raises(DataFormatError, match=rf"^{corrupt}: unreadable from row 0 on \("):
        load_data(corrupt)
