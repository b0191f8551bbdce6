"""Tests for gd2po_jax/rewards: ToolRL tool-calling rewards, bounded JSON, batch interface."""

import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gd2po_jax.data import load_verl_parquet
from gd2po_jax.rewards.scorers import tool_calling_scorer
from gd2po_jax.rewards import (
    TOOL_CALLING_SETTINGS,
    RewardFunction,
    ToolCallingReward,
    build_reward_function,
    is_correct,
    reward_kinds,
    score_tool_call,
)
from gd2po_jax.rewards.bounded_json import MAX_JSON_DEPTH, loads_bounded, nesting_depth
from gd2po_jax.rewards.tool_calling import multiset_match, parse_response_calls
from tests.fakes import REFERENCE, data_files

GT_TOOL = (
    "<think> I should use the appropriate tool. </think>\n<tool_call>\n"
    '{"name": "GetNews", "parameters": {"page": "1", "lang": "en"}}\n</tool_call>'
)
GT_RESP = (
    "<think> I should directly respond. </think>\n<response> Please provide the text. </response>"
)
GOOD_CALL = '{"name": "GetNews", "parameters": {"page": "1", "lang": "en"}}'


def tool_response(*lines: str, think: str = "x", sep: str = "\n") -> str:
    """A response in the tool-call layout with the given JSON lines."""
    return f"<think> {think} </think>{sep}<tool_call>{sep}" + sep.join(lines) + f"{sep}</tool_call>"


def gt_with(*calls: dict) -> str:
    return (
        "<think> t </think>\n<tool_call>\n"
        + "\n".join(json.dumps(c) for c in calls)
        + "\n</tool_call>"
    )


# ---------------------------------------------------------------- reference vectors


def _reference_cases():
    data = json.loads((REFERENCE / "toolrl_reward_vectors.json").read_text())
    return [(case, data[case["ground_truth"]]) for case in data["results"]]


def test_reference_vectors():
    cases = _reference_cases()
    assert len(cases) == 10
    for case, ground_truth in cases:
        s = score_tool_call(case["response"], ground_truth)
        got = (s.correctness, s.format, s.length)
        want = (case["correctness"], case["format"], case["length"])
        assert got == pytest.approx(want, abs=1e-12), case["case"]
        assert s.total == pytest.approx(case["total"], abs=1e-12), case["case"]


@pytest.fixture(params=["tiny", "real"])
def rlla_file(request):
    """The RLLA-format parquet of tests/fixture_data.py, or the real RLLA test split where
    ``GD2PO_JAX_DATA_DIR`` names it (tests/conftest.py's ``data_dir``)."""
    directory = data_files() if request.param == "tiny" else request.getfixturevalue("data_dir")
    return directory / "rlla_4k" / "test.parquet"


def test_every_rlla_ground_truth_scores_itself(rlla_file):
    """The reward reads every ground truth of the data: as a response to itself it has the format and,
    for a tool call, full correctness (a plain reply's ground truth gives 0)."""
    ground_truths = load_verl_parquet(rlla_file).dataset["ground_truth"]
    assert any("<tool_call>" in gt for gt in ground_truths) and any("<tool_call>" not in gt for gt in ground_truths)
    for gt in ground_truths:
        score = score_tool_call(gt, gt)
        assert (score.format, score.correctness) == (1.0, 3.0 if "<tool_call>" in gt else 0.0), gt


# ---------------------------------------------------------------- spec section 6, one test each


def test_ground_truth_without_tool_call_gives_zero_correctness_whatever_the_response():
    for response in [tool_response(GOOD_CALL), "garbage", "", "<tool_call>\n{\n</tool_call>"]:
        assert score_tool_call(response, GT_RESP).correctness == 0.0


def test_exact_match_scores_three():
    assert score_tool_call(tool_response(GOOD_CALL), GT_TOOL).correctness == 3.0


def test_missing_tool_call_tags_give_minimum():
    assert score_tool_call("<think> x </think>\n" + GOOD_CALL, GT_TOOL).correctness == -3.0
    assert (
        score_tool_call("<think> x </think>\n<tool_call>\n" + GOOD_CALL, GT_TOOL).correctness
        == -3.0
    )


def test_partial_score_formula():
    # names match (1) + keys match (1) + 1 of 2 values equal = 3 of local_max 1 + (1 + 2) = 4.
    wrong_lang = '{"name": "GetNews", "parameters": {"page": "1", "lang": "fr"}}'
    assert score_tool_call(tool_response(wrong_lang), GT_TOOL).correctness == 6 * 3 / 4 - 3


def test_multiset_jaccard_match():
    assert multiset_match(["a", "b"], ["b", "a"]) == 1.0
    assert multiset_match([], ["a"]) == 0.0
    assert multiset_match([], []) == 1.0
    assert multiset_match(["a", "a", "b"], ["a", "c"]) == pytest.approx(1 / 4)
    assert multiset_match(["a", "a"], ["a", "a", "a"]) == pytest.approx(2 / 3)


def test_blank_line_between_calls_gives_minimum_but_format_can_pass():
    gt = gt_with({"name": "A", "parameters": {}}, {"name": "B", "parameters": {}})
    response = tool_response(
        '{"name": "A", "parameters": {}}', "", '{"name": "B", "parameters": {}}'
    )
    s = score_tool_call(response, gt)
    assert (s.correctness, s.format) == (-3.0, 1.0)


def test_pretty_printed_json_gives_minimum_but_format_can_pass():
    pretty = json.dumps(json.loads(GOOD_CALL), indent=2)
    s = score_tool_call(tool_response(pretty), GT_TOOL)
    assert (s.correctness, s.format) == (-3.0, 1.0)


def test_windows_line_endings_fail_format_but_not_correctness():
    s = score_tool_call(tool_response(GOOD_CALL, sep="\r\n"), GT_TOOL)
    assert (s.correctness, s.format) == (3.0, 0.0)


def test_values_compare_with_python_equality_after_json_loads():
    gt = gt_with({"name": "A", "parameters": {"n": 8000, "flag": False}})
    same = '{"name": "A", "parameters": {"n": 8000.0, "flag": 0}}'
    assert score_tool_call(tool_response(same), gt).correctness == 3.0
    # "1" and 1 differ: names 1 + keys 1 + 1 equal value ("lang") of local_max 4.
    int_page = '{"name": "GetNews", "parameters": {"page": 1, "lang": "en"}}'
    assert score_tool_call(tool_response(int_page), GT_TOOL).correctness == 1.5


def test_correctness_is_a_float_needing_tolerance():
    gt = gt_with({"name": "A", "parameters": {"a": 1, "b": 2, "c": 3}})
    one_wrong = '{"name": "A", "parameters": {"a": 1, "b": 2, "c": 4}}'
    c = score_tool_call(tool_response(one_wrong), gt).correctness
    assert c == 1.7999999999999998  # 6 * 4 / 5 - 3 in float64, as the official code computes
    assert c == pytest.approx(1.8)


def test_reordered_tools_still_score_three():
    calls = [{"name": "A", "parameters": {"x": 1}}, {"name": "B", "parameters": {"y": "z"}}]
    response = tool_response(*(json.dumps(c) for c in reversed(calls)))
    assert score_tool_call(response, gt_with(*calls)).correctness == 3.0


def test_missing_parameters_key_gives_minimum():
    assert score_tool_call(tool_response('{"name": "GetNews"}'), GT_TOOL).correctness == -3.0


def test_parameters_as_string_gives_minimum():
    response = tool_response('{"name": "GetNews", "parameters": "page=1"}')
    assert score_tool_call(response, GT_TOOL).correctness == -3.0


def test_missing_name_key_gives_minimum():
    response = tool_response('{"parameters": {"page": "1", "lang": "en"}}')
    assert score_tool_call(response, GT_TOOL).correctness == -3.0


def test_extra_call_fields_are_read_only_when_the_official_code_reads_them():
    # A surplus call with another name is never matched, so its missing "parameters" is never
    # read: names match 1/2, GetNews best 1 + 2, local_max 4 -> 6 * 3.5 / 4 - 3 = 2.25.
    response = tool_response(GOOD_CALL, '{"name": "Other"}')
    assert score_tool_call(response, GT_TOOL).correctness == 2.25


def test_candidate_with_zero_match_score_is_never_used():
    # Empty ground-truth parameters: match([], ["x"]) = 0 and no values -> the candidate scores 0
    # and is not used. Score = names 1 of local_max 2 -> 0.0.
    gt = gt_with({"name": "A", "parameters": {}})
    response = tool_response('{"name": "A", "parameters": {"x": 1}}')
    assert score_tool_call(response, gt).correctness == 0.0
    # Empty vs empty is an equal-lists match (1), so the candidate is used: exact anyway.
    assert score_tool_call(tool_response('{"name": "A", "parameters": {}}'), gt).correctness == 3.0


def test_unused_candidate_stays_available_for_a_later_ground_truth_call():
    # gt: A{} then A{"x": 1}. pred: A{"x": 1} only. The first gt call scores the candidate 0 (not
    # used), so the second gets it: names match([A, A], [A]) = 1/2, plus keys 1 + values 1 = 2.5
    # of local_max 1 + 1 + 2 = 4 -> 6 * 2.5 / 4 - 3 = 0.75.
    gt = gt_with({"name": "A", "parameters": {}}, {"name": "A", "parameters": {"x": 1}})
    response = tool_response('{"name": "A", "parameters": {"x": 1}}')
    assert score_tool_call(response, gt).correctness == 0.75


def test_tool_call_tag_inside_think_changes_the_parsed_block():
    response = (
        "<think> I will emit <tool_call> now </think>\n<tool_call>\n" + GOOD_CALL + "\n</tool_call>"
    )
    s = score_tool_call(response, GT_TOOL)
    assert (s.correctness, s.format) == (-3.0, 0.0)


def test_two_think_blocks_pass_format_and_length_counts_only_the_last():
    words = " ".join(["w"] * 300)
    response = (
        f"<think> {words} </think>\n<think> a b c d e f g h i j </think>\n"
        f"<tool_call>\n{GOOD_CALL}\n</tool_call>"
    )
    s = score_tool_call(response, GT_TOOL)
    assert (s.format, s.length) == (1.0, 0.02)


def test_format_tool_call_layout():
    assert score_tool_call(tool_response(GOOD_CALL), GT_TOOL).format == 1.0
    no_newline = "<think> x </think><tool_call>\n" + GOOD_CALL + "\n</tool_call>"
    assert score_tool_call(no_newline, GT_TOOL).format == 0.0
    two_blocks = tool_response(GOOD_CALL) + "\n<tool_call>\n" + GOOD_CALL + "\n</tool_call>"
    assert score_tool_call(two_blocks, GT_TOOL).format == 0.0
    with_response = tool_response(GOOD_CALL) + "\n<response> hi </response>"
    assert score_tool_call(with_response, GT_TOOL).format == 0.0


def test_format_response_layout():
    assert score_tool_call("<think> a </think>\n<response> ok </response>", GT_RESP).format == 1.0
    twice = "<think> a </think>\n<response> ok </response><response> again </response>"
    assert score_tool_call(twice, GT_RESP).format == 0.0
    assert score_tool_call("<response> ok </response>", GT_RESP).format == 0.0


def test_format_both_layout():
    gt = GT_TOOL + "\n<response> done </response>"
    both = tool_response(GOOD_CALL) + "\n<response> done </response>"
    assert score_tool_call(both, gt).format == 1.0
    assert score_tool_call(tool_response(GOOD_CALL), gt).format == 0.0
    swapped = (
        "<think> x </think>\n<response> done </response>\n<tool_call>\n"
        + GOOD_CALL
        + "\n</tool_call>"
    )
    assert score_tool_call(swapped, gt).format == 0.0


def test_format_neither_layout():
    gt = "<think> nothing to do </think>"
    assert score_tool_call("<think> ok </think>", gt).format == 1.0
    assert score_tool_call("<think> ok </think>\n<response> x </response>", gt).format == 0.0


def test_response_is_stripped_and_cut_to_the_assistant_turn():
    assert score_tool_call("  \n" + tool_response(GOOD_CALL) + "\n\n", GT_TOOL).format == 1.0
    wrapped = (
        "<|im_start|>user\nhi<|im_end|><|im_start|>assistant\n"
        + tool_response(GOOD_CALL)
        + "<|im_end|>\n"
    )
    s = score_tool_call(wrapped, GT_TOOL)
    assert (s.correctness, s.format) == (3.0, 1.0)


def test_length_uses_python_round_half_to_even():
    # 64 / 512 = 0.125 and 320 / 512 = 0.625 are exact: half-to-even gives 0.12 and 0.62.
    for words, want in [(64, 0.12), (320, 0.62), (192, 0.38), (5, 0.01), (2, 0.0)]:
        response = tool_response(GOOD_CALL, think=" ".join(["w"] * words))
        assert score_tool_call(response, GT_TOOL).length == want, words


def test_length_is_capped_and_needs_both_think_tags():
    assert score_tool_call(tool_response(GOOD_CALL, think=" w" * 600), GT_TOOL).length == 1.0
    assert score_tool_call("<think> a b c d e f", GT_TOOL).length == 0.0
    assert score_tool_call("a b c </think>", GT_TOOL).length == 0.0


def test_max_think_words_sets_the_length_scale():
    response = tool_response(GOOD_CALL, think=" ".join(["w"] * 50))
    assert score_tool_call(response, GT_TOOL, max_think_words=100).length == 0.5
    with pytest.raises(ValueError, match="max_think_words"):
        score_tool_call(response, GT_TOOL, max_think_words=0)


def test_malformed_ground_truth_is_a_data_error():
    with pytest.raises(ValueError, match="ground truth"):
        score_tool_call(tool_response(GOOD_CALL), "<tool_call>\nnot json\n</tool_call>")
    with pytest.raises(ValueError, match="ground truth"):
        score_tool_call(tool_response(GOOD_CALL), None)


# ---------------------------------------------------------------- adversarial outputs


def _timed_score(response, ground_truth=GT_TOOL):
    start = time.perf_counter()
    s = score_tool_call(response, ground_truth)
    return s, time.perf_counter() - start


def test_ten_megabytes_of_braces_is_prompt_and_minimal():
    for body in ["{" * 10_000_000, "[" * 5_000_000 + "]" * 5_000_000, '"\\' * 5_000_000]:
        for response in [body, tool_response(body)]:
            s, seconds = _timed_score(response)
            assert s.correctness == -3.0
            assert seconds < 1.0


def test_deeply_nested_json_is_prompt_and_minimal():
    deep = "[" * 100_000 + "]" * 100_000
    s, seconds = _timed_score(tool_response(deep))
    assert s.correctness == -3.0 and seconds < 1.0
    nested_value = '{"name": "GetNews", "parameters": {"page": ' + "[" * 5000 + "]" * 5000 + "}}"
    s, seconds = _timed_score(tool_response(nested_value))
    assert s.correctness == -3.0 and seconds < 1.0


def test_many_short_lines_are_prompt():
    s, seconds = _timed_score(tool_response(*(["{}"] * 60_000)))
    assert s.correctness == -3.0 and seconds < 1.0


def test_invalid_utf8_and_lone_surrogates_do_not_raise():
    raw = b"<think> \xff\xfe </think>\n<tool_call>\n\xc3\x28\n</tool_call>"
    assert score_tool_call(raw, GT_TOOL).correctness == -3.0
    decoded = raw.decode("utf-8", errors="surrogateescape")
    assert score_tool_call(decoded, GT_TOOL).correctness == -3.0
    lone = tool_response('{"name": "GetNews\ud800", "parameters": {"page": "\\udc00"}}')
    s = score_tool_call(lone, GT_TOOL)
    assert s.correctness == -3.0 and s.format == 1.0


def test_tags_inside_json_strings_cut_the_block():
    inside = '{"name": "GetNews", "parameters": {"page": "</tool_call>", "lang": "en"}}'
    s = score_tool_call(tool_response(inside), GT_TOOL)
    assert (s.correctness, s.format) == (-3.0, 0.0)


def test_non_json_literals_and_huge_numbers_are_minimal():
    for line in [
        "{'name': 'GetNews'}",
        "__import__('os')",
        "9" * 5000,
        '{"name": NaN}',
        "\ufeff" + GOOD_CALL,
    ]:
        assert score_tool_call(tool_response(line), GT_TOOL).correctness == -3.0, line[:20]


def test_non_string_response_gets_the_minimum():
    for response in [None, 3, ["<think>"]]:
        s = score_tool_call(response, GT_TOOL)
        assert (s.correctness, s.format, s.length) == (-3.0, 0.0, 0.0)
    assert score_tool_call(None, GT_RESP).correctness == 0.0


def test_non_object_calls_are_minimal():
    for line in ["[1, 2]", '"GetNews"', "3", "null", json.dumps(json.dumps(json.loads(GOOD_CALL)))]:
        assert score_tool_call(tool_response(line), GT_TOOL).correctness == -3.0, line
    unhashable_name = '{"name": ["GetNews"], "parameters": {"page": "1", "lang": "en"}}'
    assert score_tool_call(tool_response(unhashable_name), GT_TOOL).correctness == -3.0


# ---------------------------------------------------------------- bounded JSON


def test_nesting_depth_ignores_brackets_in_strings():
    assert nesting_depth('{"a": "[[[[{{{{", "b": [1, [2]]}') == 3
    assert nesting_depth('["\\"]]]]", [[]]]') == 3
    assert nesting_depth("no brackets") == 0
    assert nesting_depth('"unterminated [[[[') == 0


def test_loads_bounded_limits():
    assert loads_bounded("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    with pytest.raises(ValueError, match="nested"):
        loads_bounded("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    with pytest.raises(ValueError, match="characters"):
        loads_bounded('"' + "a" * 20 + '"', max_chars=10)
    with pytest.raises(ValueError):
        loads_bounded(b"{}")
    with pytest.raises(ValueError):
        loads_bounded("{")


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(_json_values)
def test_loads_bounded_agrees_with_json_loads(value):
    text = json.dumps(value)
    assert loads_bounded(text) == json.loads(text)


# ---------------------------------------------------------------- batch interface


def _batch(responses, ground_truths):
    return ["prompt"] * len(responses), responses, {"ground_truth": ground_truths}


def test_tool_calling_reward_settings_shapes_and_order():
    responses = [tool_response(GOOD_CALL, think="a b c d e"), "nonsense"]
    batch = _batch(responses, [GT_TOOL, GT_TOOL])
    three = ToolCallingReward(names=TOOL_CALLING_SETTINGS["correctness_format_length"])
    out = three(*batch)
    assert three.names == ("correctness", "format", "length")
    assert out.dtype == np.float32 and out.shape == (2, 3)
    np.testing.assert_allclose(out, [[3.0, 1.0, 0.01], [-3.0, 0.0, 0.0]], atol=1e-7)
    two = ToolCallingReward(names=TOOL_CALLING_SETTINGS["correctness_length"])
    np.testing.assert_allclose(two(*batch), [[3.0, 0.01], [-3.0, 0.0]], atol=1e-7)
    reordered = ToolCallingReward(names=["length", "correctness"])
    np.testing.assert_allclose(reordered(*batch), [[0.01, 3.0], [0.0, -3.0]], atol=1e-7)


def test_conditional_length_counts_only_at_maximal_correctness():
    think = " ".join(["w"] * 256)
    wrong = '{"name": "GetNews", "parameters": {"page": "2", "lang": "en"}}'
    responses = [tool_response(GOOD_CALL, think=think), tool_response(wrong, think=think)]
    batch = _batch(responses, [GT_TOOL, GT_TOOL])
    plain = ToolCallingReward(names=("correctness", "length"))
    conditional = ToolCallingReward(names=("correctness", "length"), conditional_length=True)
    np.testing.assert_allclose(plain(*batch)[:, 1], [0.5, 0.5])
    np.testing.assert_allclose(conditional(*batch)[:, 1], [0.5, 0.0])


def test_reward_rejects_bad_names_and_missing_columns():
    with pytest.raises(ValueError, match="names"):
        ToolCallingReward(names=("correctness", "helpfulness"))
    with pytest.raises(ValueError, match="names"):
        ToolCallingReward(names=("length", "length"))
    with pytest.raises(ValueError, match="ground_truth"):
        ToolCallingReward()(["p"], ["r"], {"answer": ["x"]})
    with pytest.raises(ValueError, match="batch sizes"):
        ToolCallingReward()(["p"], ["r", "s"], {"ground_truth": [GT_TOOL]})


def test_reward_names_the_batch_row_of_a_bad_ground_truth():
    with pytest.raises(ValueError, match="batch row 1"):
        ToolCallingReward()(
            ["p", "p"], ["r", "r"], {"ground_truth": [GT_TOOL, "<tool_call>\n{\n</tool_call>"]}
        )


def test_tool_calling_is_a_registered_reward_kind():
    assert "tool_calling" in reward_kinds()
    fn = build_reward_function(
        {"kind": "tool_calling", "names": ["correctness", "length"], "conditional_length": True}
    )
    assert (
        isinstance(fn, ToolCallingReward)
        and fn.conditional_length
        and fn.names == ("correctness", "length")
    )
    assert isinstance(fn, RewardFunction)
    assert fn.min_values == (-3.0, 0.0)
    with pytest.raises(ValueError, match="bad options"):
        build_reward_function({"kind": "tool_calling", "temperature": 1.0})


# ---------------------------------------------------------------- what "correct" means


def test_is_correct_wants_exact_calls_or_a_plain_response_and_not_the_format():
    exact = tool_response(GOOD_CALL)
    assert is_correct(exact, GT_TOOL)
    no_think = f"<tool_call>\n{GOOD_CALL}\n</tool_call>"  # format 0, calls exact
    assert score_tool_call(no_think, GT_TOOL).format == 0.0 and is_correct(no_think, GT_TOOL)
    partial = tool_response('{"name": "GetNews", "parameters": {"page": "2", "lang": "en"}}')
    assert not is_correct(partial, GT_TOOL)
    assert is_correct(partial, GT_TOOL, correctness=3.0)  # a given correctness is trusted
    assert is_correct(exact, GT_TOOL, correctness=3.0 - 1e-12)  # float error of the matching
    assert not is_correct(exact, GT_TOOL, correctness=2.99)
    assert is_correct("<think> x </think>\n<response> sure </response>", GT_RESP)
    assert is_correct("<response> sure", GT_RESP)  # unclosed: format 0, still a plain response
    assert not is_correct(exact, GT_RESP)  # a needless call
    assert not is_correct("<think> x </think>\n<response> a </response>\n<tool_call>", GT_RESP)
    assert not is_correct("<think> just thinking </think>", GT_RESP)


def test_eval_scorer_counts_correct_with_is_correct():
    scorer = tool_calling_scorer(max_think_words=512)
    no_think = f"<tool_call>\n{GOOD_CALL}\n</tool_call>"
    assert scorer(no_think, {"ground_truth": GT_TOOL}) == {
        "correct": 1.0, "format": 0.0, "length": 0.0, "correctness": 3.0}
    assert scorer("<response> hi", {"ground_truth": GT_RESP})["correct"] == 1.0
    assert scorer(tool_response(GOOD_CALL), {"ground_truth": GT_RESP})["correct"] == 0.0


def test_parse_response_calls_returns_none_for_what_correctness_scores_as_malformed():
    assert parse_response_calls('<tool_call>\n{"name": "a", "parameters": {}}\n[1]\n</tool_call>') == [
        {"name": "a", "parameters": {}}, [1]]
    assert parse_response_calls('<tool_call>\n{"name": "a"\n</tool_call>') is None  # not JSON
    assert parse_response_calls('<tool_call>\n{"name": "a"}\n\n{"name": "b"}\n</tool_call>') is None  # blank line
    assert parse_response_calls("<response> hi </response>") is None  # no block
