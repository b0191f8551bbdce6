"""gd2po_jax/data/loaders.py: the loaders on files in the real formats and on corrupted copies, one
schema.

Each test on a data file runs twice: on the tiny files of tests/fixture_data.py (``[tiny]``, always)
and on the real public files (``[real]``, where ``GD2PO_JAX_DATA_DIR`` names them: tests/conftest.py),
with what each holds (`EXPECTED`)."""

import dataclasses
import datetime
import json
import pathlib
import pickle
import re

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
    decode_api_bank_answer,
    decode_extra_columns,
    detect_kind,
    encode_api_bank_answer,
    load_api_bank,
    load_api_bank_file,
    load_data,
    load_jsonl,
    load_toolrl_sft,
    load_verl_parquet,
    parse_api_bank_answer,
)
from gd2po_jax.rewards.base import RESPONSE_IDS, ROLLOUT_INDEX
from tests import fixture_data
from tests.fakes import data_files


@dataclasses.dataclass(frozen=True)
class Expected:
    """What a data directory's files hold."""

    rlla_rows: int
    rlla_tool_calls: int  # RLLA rows whose ground truth has a <tool_call>
    rlla_first_call: str  # in the first row's ground truth
    rlla_first_user: str  # in the first row's user message
    system_prefix: str  # how the tool-calling system messages begin
    sft_rows: int
    sft_first_user: str  # in the first SFT record's user message
    api_bank_rows: dict  # level -> rows
    api_bank_first: dict  # level -> the first row's answer, as a list of calls
    alpaca_rows: int
    alpaca_first: str  # how the first Alpaca prompt begins


EXPECTED = {
    "tiny": Expected(
        rlla_rows=fixture_data.ROWS["rlla_4k/test.parquet"],
        rlla_tool_calls=sum("<tool_call>" in r["reward_model"]["ground_truth"] for r in fixture_data.rlla_rows()),
        rlla_first_call='"name": "GetNews"', rlla_first_user="Azure", system_prefix=fixture_data.SYSTEM_PREFIX,
        sft_rows=fixture_data.ROWS["rlla_4k/rlla_sft.json"], sft_first_user="LH 402",
        api_bank_rows={level: fixture_data.ROWS[f"api_bank/level-{level}-api_processed.json"] for level in (1, 2, 3)},
        api_bank_first={1: [{"name": "FlightStatus", "parameters": {"flight_number": "LH402", "date": "2024-03-26"}}],
                        2: [{"name": "GetNews", "parameters": {"page": 1, "topic": "Google Cloud"}}]},
        alpaca_rows=fixture_data.ROWS["safe_alignment/alpaca_test.parquet"],
        alpaca_first="Describe a time when a small act of kindness",
    ),
    "real": Expected(
        rlla_rows=80, rlla_tool_calls=71, rlla_first_call='"name": "GetNews"', rlla_first_user="Azure",
        system_prefix="You are a helpful multi-turn dialogue assistant", sft_rows=400, sft_first_user="Alex Ferguson",
        api_bank_rows={1: 399, 2: 67, 3: 131},
        api_bank_first={1: [{"name": "ModifyRegistration",
                             "parameters": {"appointment_id": "34567890", "new_appointment_date": "2023-03-26",
                                            "new_appointment_doctor": "Dr. Lee"}}],
                        2: [{"name": "SymptomSearch", "parameters": {"symptom": "rash"}}]},
        alpaca_rows=512, alpaca_first="Describe an example of a time you used influence",
    ),
}


@pytest.fixture(params=["tiny", "real"])
def files(request) -> tuple[pathlib.Path, Expected]:
    """(a data directory, what its files hold): the tiny files, or the real ones (``data_dir``)."""
    directory = data_files() if request.param == "tiny" else request.getfixturevalue("data_dir")
    return directory, EXPECTED[request.param]


# ---------------------------------------------------------------- verl parquet


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
    rows = pq.read_table(_rlla_parquet()).slice(0, 2).to_pylist()
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


def _rlla_parquet() -> pathlib.Path:
    return data_files() / "rlla_4k" / "test.parquet"


def _corrupt_parquet(tmp_path):
    rows = pq.read_table(_rlla_parquet()).to_pylist()
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


# ---------------------------------------------------------------- ToolRL SFT JSON


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


# ---------------------------------------------------------------- API-Bank


def _api_bank_file(level: int) -> pathlib.Path:
    return data_files() / "api_bank" / f"level-{level}-api_processed.json"


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
    original = json.loads(_api_bank_file(1).read_text())[:5]
    as_literals = [dict(r, answer=repr(r["answer"])) for r in original]
    path = tmp_path / "level-1-api_processed.json"
    path.write_text(json.dumps(as_literals))
    ds = load_api_bank_file(path).dataset
    assert ds["level"] == [1] * 5
    assert [decode_api_bank_answer(gt) for gt in ds["ground_truth"]] == [
        r["answer"] for r in original
    ]


def test_api_bank_corrupted_answers(tmp_path):
    records = json.loads(_api_bank_file(3).read_text())[:6]
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


# ---------------------------------------------------------------- JSONL

JSONL_ROWS = [
    {
        "prompt": "What is the weather in Paris?",
        "ground_truth": "<think> t </think>\n<response> sunny </response>",
    },
    {
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        "target": "hello",
        "level": 2,
    },
    {"prompt": [{"role": "user", "content": "x"}], "source": "mine", "extra": [1, 2]},
]


def _write_jsonl(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_schema(tmp_path):
    lines = [json.dumps(JSONL_ROWS[0]), "", json.dumps(JSONL_ROWS[1]), json.dumps(JSONL_ROWS[2])]
    ds = load_jsonl(_write_jsonl(tmp_path / "d.jsonl", lines)).dataset
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
    ds = load_jsonl(_write_jsonl(tmp_path / "d.jsonl", [json.dumps(r) for r in records])).dataset
    assert ds.features == FEATURES
    assert decode_extra_columns(ds) == {"answer": [4, "four", None], "meta": [{"tags": ["math"]}, None, None],
                                        "hint": [None, None, 1.5]}
    assert ds[PROMPT_TEXT] == ["What is 2+2?", None, None]  # only a prompt given as one string
    assert ds[0]["prompt"] == [{"role": "user", "content": "What is 2+2?"}]
    assert (ds[1]["ground_truth"], ds[1]["level"], ds[1]["source"], ds[1]["target"]) == ("g", 1, "s", "t")


@pytest.mark.parametrize("name", RESERVED_COLUMNS)
def test_a_reserved_column_name_is_a_malformed_row_naming_it(tmp_path, name):
    lines = [json.dumps({"prompt": "fine"}), json.dumps({"prompt": "shadowed", name: 1})]
    path = _write_jsonl(tmp_path / "d.jsonl", lines)
    with pytest.raises(DataFormatError, match=rf"d\.jsonl, row 1 \(0-based\), line 2, field '{name}': is a reserved "
                                              r"column name .*; rename it"):
        load_jsonl(path)
    assert load_jsonl(path, on_error="skip").dataset[PROMPT_TEXT] == ["fine"]


def test_reserved_names_cover_what_rollouts_add_and_parquet_columns_too(tmp_path):
    assert {RESPONSE_IDS, ROLLOUT_INDEX, "row", PROMPT_TEXT, EXTRA_COLUMNS} == set(RESERVED_COLUMNS)
    rows = pq.read_table(_rlla_parquet()).slice(0, 2).to_pylist()
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
    path = _write_jsonl(tmp_path / "d.jsonl", [json.dumps({"prompt": "p", "answer": 4})])
    ds = load_jsonl(path).dataset
    columns = dataset_columns(ds)
    assert EXTRA_COLUMNS not in columns and columns["answer"] == [4] and columns["row"] == [0]
    assert list(columns) == [*(n for n in FEATURES if n != EXTRA_COLUMNS), "answer"]
    with pytest.raises(ValueError, match=r"^train data: the extra columns \['answer'\] have the names of columns"):
        dataset_columns(ds.add_column("answer", [5]), where="train data")


def test_jsonl_corrupted_lines(tmp_path):
    lines = [
        json.dumps(JSONL_ROWS[0]),
        json.dumps(JSONL_ROWS[1]),
        '{"prompt": "unterminated',
        json.dumps({"prompt": "a", "messages": []}),
        json.dumps({"prompt": [{"role": "user", "content": 3}]}),
        json.dumps({"prompt": "ok", "level": "two"}),
    ]
    path = _write_jsonl(tmp_path / "bad.jsonl", lines)
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


def test_on_error_must_be_known(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [json.dumps(JSONL_ROWS[0])])
    with pytest.raises(ValueError, match="on_error"):
        load_jsonl(path, on_error="ignore")


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
    pq.write_table(pq.read_table(_rlla_parquet()).slice(0, 0), parquet)
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
    rows = pq.read_table(_rlla_parquet()).slice(0, 3).to_pylist()
    for row in rows:
        row["prompt"] = []
    parquet = tmp_path / "all_bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    jsonl = _write_jsonl(tmp_path / "all_bad.jsonl", ['{"x": 1}', '{"y": 2}'])
    for path, first in [(parquet, "row 0 (0-based), field 'prompt'"), (jsonl, "row 0 (0-based), line 1")]:
        with pytest.raises(DataFormatError, match=rf"^{path}: no usable rows: all \d rows are malformed "
                                                  rf"\(skipped with on_error='skip'\); first: .*{re.escape(first)}"):
            load_data(path, on_error="skip")


def test_a_file_that_is_not_parquet_is_an_error_naming_it(tmp_path):
    real = _rlla_parquet().read_bytes()
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


def test_lone_surrogates_in_json_files_are_malformed_rows(tmp_path):
    records = json.loads(_api_bank_file(2).read_text())[:3]
    records[1]["user"] = "\ud800"
    records[2]["answer"] = [{"name": "Tool", "parameters": {"q": "\udc00"}}]
    path = tmp_path / "level-2-api_processed.json"
    path.write_text(json.dumps(records))  # ensure_ascii: the file holds \\ud800 escapes
    result = load_api_bank_file(path, on_error="skip")
    assert [(e.row, e.field) for e in result.skipped] == [(1, "user"), (2, "answer")]
    assert len(result.dataset) == 1
