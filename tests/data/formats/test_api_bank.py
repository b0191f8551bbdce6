"""gd2po_jax/data/formats/api_bank.py: API-Bank JSON files and directories: the rows, the answer
forms and their parsing, corrupted answers, lone surrogates.

Tests on a data file run on the tiny files (``[tiny]``) and the real public ones (``[real]``, where
``GD2PO_JAX_DATA_DIR`` names them): the ``files`` fixture of tests/data/conftest.py."""

import json

import pytest

from gd2po_jax.data import (
    DataFormatError,
    decode_api_bank_answer,
    decode_extra_columns,
    encode_api_bank_answer,
    load_api_bank,
    load_api_bank_file,
    parse_api_bank_answer,
)
from tests.data.loader_files import api_bank_file


@pytest.mark.parametrize("level", [1, 2, 3])
def test_api_bank_files(files, level):
    data_dir, expected = files
    ds = load_api_bank_file(data_dir / "api_bank" / f"level-{level}-api_processed.json").dataset
    assert len(ds) == expected.api_bank_rows[level]
    assert set(ds["level"]) == {level} and set(ds["source"]) == {"api_bank"}
    assert [m["role"] for m in ds[0]["prompt"]] == ["system", "user"]
    raw = json.loads((data_dir / "api_bank" / f"level-{level}-api_processed.json").read_text())
    assert decode_extra_columns(ds) == {name: [r[name] for r in raw] for name in ("system", "user", "answer", "other")}
    for gt in ds["ground_truth"]:
        calls = decode_api_bank_answer(gt)
        assert isinstance(calls[0]["name"], str) and isinstance(calls[0]["parameters"], dict)


def test_api_bank_directory_and_answer_values(files):
    data_dir, expected = files
    rows = expected.api_bank_rows
    ds = load_api_bank(data_dir / "api_bank").dataset
    assert len(ds) == sum(rows.values()) and ds["level"].count(1) == rows[1] and ds["level"].count(3) == rows[3]
    assert decode_api_bank_answer(ds[0]["ground_truth"]) == expected.api_bank_first[1]
    # Level 2 stores a bare dict; it is normalised to a one-call list.
    assert decode_api_bank_answer(ds[rows[1]]["ground_truth"]) == expected.api_bank_first[2]
    assert ds[rows[1]]["row"] == 0 and ds[rows[1]]["level"] == 2


def test_api_bank_python_literal_answers(tmp_path):
    original = json.loads(api_bank_file(1).read_text())[:5]
    as_literals = [dict(r, answer=repr(r["answer"])) for r in original]
    path = tmp_path / "level-1-api_processed.json"
    path.write_text(json.dumps(as_literals))
    ds = load_api_bank_file(path).dataset
    assert ds["level"] == [1] * 5
    assert [decode_api_bank_answer(gt) for gt in ds["ground_truth"]] == [
        r["answer"] for r in original
    ]


def test_api_bank_corrupted_answers(tmp_path):
    records = json.loads(api_bank_file(3).read_text())[:6]
    records[1]["answer"] = "[{'name': 'QueryMeeting', "
    records[2]["answer"] = []
    records[3]["answer"] = [{"name": 7, "parameters": {}}]
    records[4]["answer"] = "__import__('os').system('echo pwned')"
    path = tmp_path / "level-3-api_processed.json"
    path.write_text(json.dumps(records))
    with pytest.raises(
        DataFormatError, match=r"row 1 \(0-based\), field 'answer': not a Python literal"
    ):
        load_api_bank_file(path)
    result = load_api_bank_file(path, on_error="skip")
    assert [(e.row, e.field) for e in result.skipped] == [
        (1, "answer"),
        (2, "answer"),
        (3, "answer[0]"),
        (4, "answer"),
    ]
    assert result.dataset["row"] == [0, 5]


def test_api_bank_answer_forms_parse_to_one_call_list():
    call = {"name": "QueryMeeting", "parameters": {"user_name": "John", "n": 8000}}
    for form in ([call], call, repr([call]), repr(call)):
        assert parse_api_bank_answer(form) == [call]
    assert decode_api_bank_answer(encode_api_bank_answer([call, call])) == [call, call]
    assert encode_api_bank_answer([{"name": "Café", "parameters": {}}]) == '[{"name": "Café", "parameters": {}}]'
    with pytest.raises(ValueError, match=r"bad API-Bank answer, answer\[1\]: expected"):
        parse_api_bank_answer([call, {"name": "B"}])
    with pytest.raises(ValueError, match="bad API-Bank answer, answer: not a Python literal"):
        parse_api_bank_answer("__import__('os')")
    with pytest.raises(ValueError, match="bad API-Bank answer, answer: expected a non-empty list"):
        decode_api_bank_answer("[]")
    with pytest.raises(ValueError, match="the ground truth is not JSON"):
        decode_api_bank_answer("<think> t </think>")


def test_lone_surrogates_in_json_files_are_malformed_rows(tmp_path):
    records = json.loads(api_bank_file(2).read_text())[:3]
    records[1]["user"] = "\ud800"
    records[2]["answer"] = [{"name": "Tool", "parameters": {"q": "\udc00"}}]
    path = tmp_path / "level-2-api_processed.json"
    path.write_text(json.dumps(records))  # ensure_ascii: the file holds \\ud800 escapes
    result = load_api_bank_file(path, on_error="skip")
    assert [(e.row, e.field) for e in result.skipped] == [(1, "user"), (2, "answer")]
    assert len(result.dataset) == 1
