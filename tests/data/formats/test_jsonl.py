"""gd2po_jax/data/formats/jsonl.py: JSONL files: the schema, each row's extra columns, corrupted lines, invalid UTF-8.

Tests on a data file run on the tiny files (``[tiny]``) and the real public ones (``[real]``, where
``GD2PO_JAX_DATA_DIR`` names them): the ``files`` fixture of tests/data/conftest.py."""

import json

import pytest

from gd2po_jax.data import (
    FEATURES,
    PROMPT_TEXT,
    DataFormatError,
    decode_extra_columns,
    load_jsonl,
)
from tests.data.loader_files import JSONL_ROWS, write_jsonl


def test_jsonl_schema(tmp_path):
    lines = [json.dumps(JSONL_ROWS[0]), "", json.dumps(JSONL_ROWS[1]), json.dumps(JSONL_ROWS[2])]
    ds = load_jsonl(write_jsonl(tmp_path / "d.jsonl", lines)).dataset
    assert ds["row"] == [0, 2, 3]
    assert ds[0]["prompt"] == [{"role": "user", "content": "What is the weather in Paris?"}]
    assert ds[0]["ground_truth"].endswith("</response>") and ds[0]["source"] == "jsonl"
    assert ds[1]["prompt"][0] == {"role": "system", "content": "sys"}
    assert (ds[1]["target"], ds[1]["level"], ds[1]["ground_truth"]) == ("hello", 2, None)
    assert ds[2]["source"] == "mine"


def test_jsonl_extra_columns_keep_each_rows_own_values(tmp_path):
    """A column that is an int in one row, text in another and missing in a third keeps each row's
    value (None where missing); the FEATURES columns and the `messages` alias are not extras."""
    records = [
        {"prompt": "What is 2+2?", "answer": 4, "meta": {"tags": ["math"]}},
        {"messages": [{"role": "user", "content": "Spell four"}], "answer": "four", "ground_truth": "g",
         "level": 1, "source": "s", "target": "t"},
        {"prompt": [{"role": "user", "content": "Nothing"}], "meta": None, "hint": 1.5},
    ]
    ds = load_jsonl(write_jsonl(tmp_path / "d.jsonl", [json.dumps(r) for r in records])).dataset
    assert ds.features == FEATURES
    # The schema's columns a row gives are the row's own too (exact values, for reward functions).
    assert decode_extra_columns(ds) == {"answer": [4, "four", None], "meta": [{"tags": ["math"]}, None, None],
                                        "ground_truth": [None, "g", None], "level": [None, 1, None],
                                        "source": [None, "s", None], "target": [None, "t", None],
                                        "hint": [None, None, 1.5]}
    assert ds[PROMPT_TEXT] == ["What is 2+2?", None, None]  # only a prompt given as one string
    assert ds[0]["prompt"] == [{"role": "user", "content": "What is 2+2?"}]
    assert (ds[1]["ground_truth"], ds[1]["level"], ds[1]["source"], ds[1]["target"]) == ("g", 1, "s", "t")


def test_jsonl_corrupted_lines(tmp_path):
    lines = [
        json.dumps(JSONL_ROWS[0]),
        json.dumps(JSONL_ROWS[1]),
        '{"prompt": "unterminated',
        json.dumps({"prompt": "a", "messages": []}),
        json.dumps({"prompt": [{"role": "user", "content": 3}]}),
        json.dumps({"prompt": "ok", "level": "two"}),
    ]
    path = write_jsonl(tmp_path / "bad.jsonl", lines)
    with pytest.raises(
        DataFormatError,
        match=r"bad\.jsonl, row 2 \(0-based\), line 3, field '<line>': not valid JSON",
    ):
        load_jsonl(path)
    result = load_jsonl(path, on_error="skip")
    assert [(e.row, e.line, e.field) for e in result.skipped] == [
        (2, 3, "<line>"),
        (3, 4, "prompt"),
        (4, 5, "prompt[0].content"),
        (5, 6, "level"),
    ]
    assert len(result.dataset) == 2


def test_invalid_utf8_in_jsonl_is_a_malformed_row(tmp_path):
    """Bytes that are not UTF-8 make their line malformed (named, and skipped with on_error='skip'),
    and so does a JSON escape of a lone surrogate, which no text can hold."""
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n{"prompt": "\\ud800 alone"}\n'
                     b'{"prompt": [{"role": "user", "content": "fine"}], "target": "\\udfff"}\n{"prompt": "end"}\r\n')
    with pytest.raises(DataFormatError, match=r"bytes\.jsonl, row 1 \(0-based\), line 2, field '<line>': not valid "
                                              r"UTF-8: byte 0xe9 at byte 15 of the line"):
        load_jsonl(path)
    result = load_jsonl(path, on_error="skip")
    assert [(e.row, e.field) for e in result.skipped] == [(1, "<line>"), (2, "prompt"), (3, "target")]
    assert "lone surrogate" in result.skipped[1].problem
    assert result.dataset["row"] == [0, 4]
    assert result.dataset[1]["prompt"] == [{"role": "user", "content": "end"}]  # a CRLF line reads
