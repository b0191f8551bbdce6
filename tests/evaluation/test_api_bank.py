"""Tests for gd2po_jax/evaluation/api_bank.py: the API-Bank metrics and their aggregation."""

import json
import time

import pytest

from gd2po_jax.evaluation.api_bank import (
    ApiBankReport,
    ApiBankScore,
    aggregate_api_bank,
    api_bank_report,
    api_bank_scorer,
    format_score,
    parse_tool_calls,
    reference_call,
    score_api_bank,
)
from tests import fixture_data
from tests.fakes import data_files

ANSWER = [{"name": "QueryMeeting", "parameters": {"user_name": "John", "n": 8000}}]


def output(*lines: str, think: str = "check the calendar", tail: str = "") -> str:
    return f"<think> {think} </think>\n<tool_call>\n" + "\n".join(lines) + "\n</tool_call>" + tail


def call(name="QueryMeeting", **parameters) -> str:
    return json.dumps({"name": name, "parameters": parameters or {"user_name": "John", "n": 8000}})


# ---------------------------------------------------------------- correct


def test_exact_call_is_correct():
    assert score_api_bank(output(call()), ANSWER) == ApiBankScore(correct=1, format=1, length=0.01)


def test_values_compare_with_python_equality():
    assert score_api_bank(output(call(user_name="John", n=8000.0)), ANSWER).correct == 1
    assert score_api_bank(output(call(user_name="John", n="8000")), ANSWER).correct == 0
    assert score_api_bank(output(call(user_name="John")), ANSWER).correct == 0


def test_extra_calls_do_not_hurt_and_wrong_name_fails():
    assert score_api_bank(output(call("Other"), call()), ANSWER).correct == 1
    assert score_api_bank(output(call("Other")), ANSWER).correct == 0


def test_bare_parameters_object_counts_as_a_call_to_the_reference_tool():
    bare = json.dumps({"user_name": "John", "n": 8000})
    assert score_api_bank(output(bare), ANSWER).correct == 1


def test_double_encoded_call_is_decoded_once_more():
    assert score_api_bank(output(json.dumps(call())), ANSWER).correct == 1


def test_unreadable_call_ends_the_search():
    # A number cannot be searched for keys: the official loop stops there with 0.
    assert score_api_bank(output("3", call()), ANSWER).correct == 0
    assert score_api_bank(output(call(), "3"), ANSWER).correct == 1
    assert score_api_bank(output('"not json"', call()), ANSWER).correct == 0


def test_unparsable_and_blank_lines_are_skipped():
    assert score_api_bank(output("{broken", "", "   ", call()), ANSWER).correct == 1
    pretty = json.dumps(json.loads(call()), indent=2)
    assert score_api_bank(output(pretty), ANSWER).correct == 0


def test_splitlines_splits_on_unicode_line_breaks():
    assert parse_tool_calls(f"<tool_call>{call('A')}\u2028{call('B')}</tool_call>") == [
        json.loads(call("A")),
        json.loads(call("B")),
    ]


def test_call_outside_tool_tags_is_not_read():
    assert score_api_bank(f"<think> x </think>\n{call()}", ANSWER).correct == 0
    assert score_api_bank(f"<think> x </think>\n<tool_call>\n{call()}", ANSWER).correct == 0


def test_level_two_answer_as_bare_dict():
    assert score_api_bank(output(call()), ANSWER[0]).correct == 1


def test_answer_as_python_literal_string_is_read_like_the_loader_reads_it():
    assert reference_call(repr(ANSWER)) == ("QueryMeeting", {"user_name": "John", "n": 8000})
    assert score_api_bank(output(call()), repr(ANSWER[0])).correct == 1


def test_malformed_answer_is_a_data_error():
    for bad in [[], "QueryMeeting", [{"name": "Q"}], [{"name": 1, "parameters": {}}], None]:
        with pytest.raises(ValueError, match="API-Bank answer"):
            score_api_bank(output(call()), bad)


# ---------------------------------------------------------------- format


@pytest.mark.parametrize(
    "text, want",
    [
        ("<think> a </think>\n<tool_call>\n{}\n</tool_call>", 1),
        ("<think> a </think><response> hi </response>", 1),
        ("<think> a </think>\n<tool_call>\n{}\n</tool_call>\n<response> hi </response>", 1),
        ("Sure! <think> a </think>\n<response> hi </response>", 1),  # text before <think> passes
        ("<think> a </think>", 0),  # neither tool_call nor response
        ("<tool_call>\n{}\n</tool_call>", 0),  # no think
        ("</think> a <think><response> hi </response>", 0),  # think out of order
        ("<think> a </think><think> b </think><response> c </response>", 0),  # two think blocks
        ("<think> a </think><response> hi", 0),  # unbalanced response
        ("<think> a <response> hi </response></think>", 0),  # response before </think>
        ("<think> a </think><response> hi </response><tool_call>{}</tool_call>", 0),  # order
        ("<think> a </think></tool_call><tool_call>", 0),  # closes before it opens
        ("   ", 0),
    ],
)
def test_format(text, want):
    assert format_score(text) == want


# ---------------------------------------------------------------- length


def test_length_counts_the_first_think_block_with_python_rounding():
    assert score_api_bank(output(call(), think=" ".join(["w"] * 64)), ANSWER).length == 0.12
    assert score_api_bank(output(call(), think=" ".join(["w"] * 320)), ANSWER).length == 0.62
    assert score_api_bank(output(call(), think=" ".join(["w"] * 900)), ANSWER).length == 1.0
    two = "<think> a b c d e </think> <think> " + " ".join(["w"] * 400) + " </think>"
    assert score_api_bank(two, ANSWER).length == 0.01
    assert score_api_bank(f"<tool_call>\n{call()}\n</tool_call>", ANSWER).length == 0.0
    assert (
        score_api_bank(
            output(call(), think=" ".join(["w"] * 50)), ANSWER, max_think_words=100
        ).length
        == 0.5
    )


# ---------------------------------------------------------------- untrusted output


def test_adversarial_outputs_are_prompt_and_score_zero():
    for text in [
        "{" * 10_000_000,
        output("[" * 100_000 + "]" * 100_000),
        output(*(["{}"] * 60_000)),
        None,
        b"\xff",
    ]:
        start = time.perf_counter()
        s = score_api_bank(text, ANSWER)
        assert time.perf_counter() - start < 1.0
        assert s.correct == 0


# ---------------------------------------------------------------- aggregation


def test_aggregate_per_level_and_overall():
    scores = [
        (1, ApiBankScore(1, 1, 0.10)),
        (1, ApiBankScore(0, 1, 0.20)),
        (1, ApiBankScore(1, 0, 0.30)),
        (2, ApiBankScore(1, 1, 1.00)),
        (3, ApiBankScore(0, 0, 0.00)),
        (3, ApiBankScore(0, 1, 0.50)),
    ]
    report = aggregate_api_bank(scores)
    assert report.count == {"level_1": 3, "level_2": 1, "level_3": 2, "overall": 6}
    assert report.correct_acc == {
        "level_1": 66.67,
        "level_2": 100.0,
        "level_3": 0.0,
        "overall": 50.0,
    }
    assert report.format_acc == {
        "level_1": 66.67,
        "level_2": 100.0,
        "level_3": 50.0,
        "overall": 66.67,
    }
    assert report.length == {"level_1": 0.2, "level_2": 1.0, "level_3": 0.25, "overall": 0.35}
    assert json.loads(json.dumps(report.to_dict()))["correct_acc"]["overall"] == 50.0
    lines = report.table().splitlines()
    assert len(lines) == 5 and lines[-1].split() == ["overall", "6", "50.0", "66.67", "0.35"]


def test_scorer_reads_the_loaded_ground_truth_and_report_aggregates_records():
    answer = json.dumps([{"name": "ToolSearcher", "parameters": {"keywords": "weather", "n": 8000}}])
    row = {"ground_truth": answer}
    thought = " ".join(["w"] * 10)
    good = (f"<think>{thought}</think>\n<tool_call>\n"
            '{"name": "ToolSearcher", "parameters": {"keywords": "weather", "n": 8000.0}}\n</tool_call>')
    scorer = api_bank_scorer(max_think_words=512)
    assert scorer(good, row) == {"correct": 1.0, "format": 1.0, "length": 0.02}
    assert scorer("no tags at all", row) == {"correct": 0.0, "format": 0.0, "length": 0.0}
    with pytest.raises(ValueError, match="API-Bank answer: the ground truth is not JSON"):
        scorer(good, {"ground_truth": "<think> x </think>\n<response> y </response>"})

    records = [{"level": 1, **scorer(good, row)}, {"level": 1, **scorer("x", row)}, {"level": 2, **scorer("x", row)}]
    report = api_bank_report(records)
    assert report.correct_acc == {"level_1": 50.0, "level_2": 0.0, "overall": 33.33}
    assert report.length == {"level_1": 0.01, "level_2": 0.0, "overall": 0.0067}
    summary = {**json.loads(json.dumps(report.to_dict())), "num_examples": 3, "data": "x"}
    assert ApiBankReport.from_dict(summary) == report


def test_aggregate_of_nothing_is_none():
    report = aggregate_api_bank([])
    assert report.count == {"overall": 0}
    assert report.correct_acc == {"overall": None} and report.length == {"overall": None}
    assert "N/A" in report.table()


# ---------------------------------------------------------------- the data files: tiny, and the real ones

REAL_ROWS = {1: 399, 2: 67, 3: 131}  # rows of the real level-N files


@pytest.fixture(params=["tiny", "real"])
def api_bank_files(request):
    """(an API-Bank directory, its rows per level): the tiny files of tests/fixture_data.py, or the real
    ones where ``GD2PO_JAX_DATA_DIR`` names them (tests/conftest.py's ``data_dir``)."""
    if request.param == "real":
        return request.getfixturevalue("data_dir") / "api_bank", REAL_ROWS
    return data_files() / "api_bank", {level: fixture_data.ROWS[f"api_bank/level-{level}-api_processed.json"]
                                       for level in (1, 2, 3)}


@pytest.mark.parametrize("level", [1, 2, 3])
def test_answers_parse_and_score_themselves(api_bank_files, level):
    directory, rows = api_bank_files
    records = json.loads((directory / f"level-{level}-api_processed.json").read_text())
    assert len(records) == rows[level]
    for record in records:
        name, parameters = reference_call(record["answer"])
        perfect = output(json.dumps({"name": name, "parameters": parameters}))
        assert score_api_bank(perfect, record["answer"]) == ApiBankScore(1, 1, 0.01)
        assert score_api_bank(output(call("NoSuchTool")), record["answer"]).correct == 0
