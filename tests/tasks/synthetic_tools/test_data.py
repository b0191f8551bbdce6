"""The synthetic tool-calling world: determinism, splits, ground truths and demonstrations."""

import json
import random
import re

import datasets
import pytest

from gd2po_jax.data.loaders import FEATURES
from gd2po_jax.rewards.tool_calling import is_correct, score_tool_call
from gd2po_jax.tasks.synthetic_tools import data as st

SMALL = st.SyntheticToolsConfig(num_train=300, num_validation=40, num_test=60)


@pytest.fixture(scope="module")
def default_splits():
    return st.make_splits()


@pytest.fixture(scope="module")
def requests():
    return st.generate_requests(
        st.SyntheticToolsConfig(num_train=1500, num_validation=0, num_test=0)
    )


def _perfect(response: str, ground_truth: str) -> bool:
    """Correct (as Correct Acc counts it) and in the right format: a demonstration without a mistake."""
    return is_correct(response, ground_truth) and score_tool_call(response, ground_truth).format == 1.0


def _perfect_rate(responses, ground_truths) -> float:
    assert len(responses) == len(ground_truths) > 0
    return sum(map(_perfect, responses, ground_truths)) / len(responses)


def _think_words(text: str) -> int:
    return len(text.partition("<think>")[2].partition("</think>")[0].split())


# ---------------------------------------------------------------- requests and prompts


def test_sample_call_fills_every_slot_and_respects_distinct():
    rng = random.Random(0)
    for tool in st.TOOLS:
        for _ in range(20):
            text, params = st.sample_call(tool, rng)
            assert "{" not in text and set(params) == {p.name for p in tool.params}
            if tool.distinct:
                assert len({params[k] for k in tool.distinct}) == len(tool.distinct)


def test_system_prompt_lists_tools_in_the_toolrl_layout():
    text = st.system_prompt(["get_weather", "lock_door"])
    assert "1. Name: get_weather\nDescription: Weather forecast for a city.\nParameters: " in text
    assert "2. Name: lock_door\n" in text
    schemas = re.findall(r"^Parameters: (.*)$", text, flags=re.M)
    assert json.loads(schemas[0]) == {
        "city": {"type": "string"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    }
    assert text.startswith("You are a helpful assistant")
    format_line = text.split("Parameters: ")[-1]  # after the last tool: the format instruction
    assert all(tag in format_line for tag in ("<think>", "<tool_call>", "<response>"))
    assert st.user_message("Hi") == "**Dialogue Records History**\n<user> Hi </user>"


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_train", -1),
        ("num_candidates", 1),
        ("num_candidates", 99),
        ("mistake_rate", 1.5),
        ("response_fraction", True),
        ("max_think_words", 0),
        ("mistakes", ("typo",)),
    ],
)
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        st.SyntheticToolsConfig(**{field: value})


# ---------------------------------------------------------------- splits


def test_splits_are_deterministic_by_seed():
    a, b = st.make_splits(SMALL), st.make_splits(SMALL)
    for split in st.SPLITS:
        assert a[split].to_list() == b[split].to_list()
    other = st.make_splits(
        st.SyntheticToolsConfig(seed=1, num_train=300, num_validation=40, num_test=60)
    )
    assert other["train"]["prompt"] != a["train"]["prompt"]


def test_splits_are_disjoint_sized_and_in_the_loader_schema():
    splits = st.make_splits(SMALL)
    users = {s: [p[1]["content"] for p in splits[s]["prompt"]] for s in st.SPLITS}
    assert {s: len(u) for s, u in users.items()} == {"train": 300, "validation": 40, "test": 60}
    everything = [u for s in st.SPLITS for u in users[s]]
    assert len(set(everything)) == len(everything)
    for split in st.SPLITS:
        ds = splits[split]
        assert ds.features == FEATURES
        assert ds["row"] == list(range(len(ds)))
        assert set(ds["source"]) == {"synthetic_tools"}
        assert [m["role"] for m in ds[0]["prompt"]] == ["system", "user"]
    datasets.concatenate_datasets([splits["train"], splits["test"]])  # same schema, concatenates


def test_validation_and_test_do_not_depend_on_num_train():
    bigger = st.make_splits(st.SyntheticToolsConfig(num_train=500, num_validation=40, num_test=60))
    smaller = st.make_splits(SMALL)
    for split in ("validation", "test"):
        assert bigger[split].to_list() == smaller[split].to_list()
    assert bigger["train"].to_list()[:300] == smaller["train"].to_list()


def test_request_kinds_follow_the_configured_fractions(requests):
    train = requests["train"]
    share = {
        k: sum(r.kind == k for r in train) / len(train)
        for k in ("call", "multi_call", "small_talk", "unservable")
    }
    assert share["small_talk"] + share["unservable"] == pytest.approx(0.2, abs=0.035)
    assert share["multi_call"] == pytest.approx(0.1, abs=0.03)
    assert share["small_talk"] > 0.05 and share["unservable"] > 0.05
    for r in train:
        assert len(r.candidates) == 3 and len(set(r.candidates)) == 3
        assert {name for name, _ in r.calls} <= set(r.candidates)
        assert len({name for name, _ in r.calls}) == len(r.calls)
        if r.kind == "unservable":
            [wanted] = [t for t in st.TOOLS if t.need == r.needs[0]]
            listed = [st.TOOLS_BY_NAME[c] for c in r.candidates]
            assert wanted not in listed
            assert not wanted.family or all(t.family != wanted.family for t in listed)


def test_every_ground_truth_scores_the_maximum(default_splits):
    for split in st.SPLITS:
        for row in default_splits[split]:
            gt = row["ground_truth"]
            score = score_tool_call(gt, gt)
            if row["level"] == 0:
                assert "<tool_call>" not in gt and re.fullmatch(
                    r"<think> .+ </think>\n<response> .+ </response>", gt
                )
                assert (score.correctness, score.format) == (0.0, 1.0)
            else:
                calls = gt.split("<tool_call>\n")[1].split("\n</tool_call>")[0].split("\n")
                assert len(calls) == row["level"]
                assert all(set(json.loads(c)) == {"name", "parameters"} for c in calls)
                assert (score.correctness, score.format) == (3.0, 1.0), gt
            assert _perfect(gt, gt)


# ---------------------------------------------------------------- demonstrations


def test_demonstrations_are_correct_exactly_without_a_mistake(requests):
    config = st.SyntheticToolsConfig()
    seen = set()
    for i, request in enumerate(requests["train"]):
        target, mistake = st.demonstration(request, config, random.Random(i))
        gt = st.ground_truth(request)
        assert _perfect(target, gt) == (mistake is None), (mistake, target)
        if mistake in ("wrong_value", "missing_parameter", "wrong_tool"):
            assert not is_correct(target, gt), (mistake, target)
        if target.startswith("<think>"):  # a malformed answer may lack the think block
            assert config.min_think_words <= _think_words(target) <= config.max_think_words
        else:
            assert mistake == "malformed"
        seen.add(mistake)
    assert seen == {None, *st.MISTAKES}


@pytest.mark.parametrize("kind", st.MISTAKES)
def test_each_mistake_kind_breaks_what_it_says(requests, kind):
    config = st.SyntheticToolsConfig(mistake_rate=1.0, mistakes=(kind,))
    tool_requests = [r for r in requests["train"] if r.calls][:200]
    for i, request in enumerate(tool_requests):
        target, mistake = st.demonstration(request, config, random.Random(i))
        assert mistake == kind
        gt = st.ground_truth(request)
        score = score_tool_call(target, gt)
        if kind == "malformed":
            assert score.format == 0.0 or score.correctness == -3.0, target
            continue
        assert score.format == 1.0 and score.correctness < 3.0, target
        if kind != "wrong_tool":  # a call to the right tool earns partial credit
            assert score.correctness > -3.0, target
        got = [
            json.loads(line)
            for line in target.split("<tool_call>\n")[1].split("\n</tool_call>")[0].split("\n")
        ]
        names = [c["name"] for c in got]
        if kind == "wrong_tool":
            assert names != [n for n, _ in request.calls]
        elif kind == "wrong_value":
            assert names == [n for n, _ in request.calls]
            assert [set(c["parameters"]) for c in got] == [set(p) for _, p in request.calls]
        else:  # missing_parameter: a parameter or a whole call is gone
            assert sum(len(c["parameters"]) for c in got) < sum(len(p) for _, p in request.calls)


def test_habit_tools_are_always_demonstrated_with_their_habit(requests):
    config = st.SyntheticToolsConfig(habit_fraction=0.25, mistake_rate=0.0)
    habits = st.habit_tools(config.seed, config.habit_fraction)
    assert len(habits) == round(0.25 * len(st.TOOLS))
    assert st.habit_tools(1, 0.25) != habits and st.habit_tools(0, 0.0) == frozenset()
    counts = {"habit": 0, None: 0}
    for i, request in enumerate(requests["train"]):
        target, mistake = st.demonstration(request, config, random.Random(i))
        has_habit = any(name in habits for name, _ in request.calls)
        assert mistake == ("habit" if has_habit else None)
        assert is_correct(target, st.ground_truth(request)) == (not has_habit)
        counts[mistake] += 1
        if has_habit:
            got = target.split("<tool_call>\n")[1].split("\n</tool_call>")[0].split("\n")
            for line, (name, params) in zip(got, request.calls, strict=True):
                want = list(params)[:-1] if name in habits else list(params)
                assert list(json.loads(line)["parameters"]) == want
    assert counts["habit"] > 100 and counts[None] > 100


def test_habit_rate_keeps_the_right_call_as_the_minority_of_habit_demonstrations(requests):
    config = st.SyntheticToolsConfig(habit_fraction=1.0, habit_rate=0.7, mistake_rate=0.0)
    kinds = []
    for i, request in enumerate(requests["train"]):
        if not request.calls:
            continue
        target, mistake = st.demonstration(request, config, random.Random(i))
        kinds.append(mistake)
        assert is_correct(target, st.ground_truth(request)) == (mistake is None)
    share = kinds.count("habit") / len(kinds)
    assert set(kinds) == {"habit", None}
    assert share == pytest.approx(0.7, abs=0.05)
    # habit_rate 1 is the old behaviour, drawn without touching the random stream of other rows.
    always = st.SyntheticToolsConfig(habit_fraction=1.0, mistake_rate=0.0)
    assert {st.demonstration(r, always, random.Random(0))[1] for r in requests["train"] if r.calls} == {"habit"}
    with pytest.raises(ValueError, match="habit_rate"):
        st.SyntheticToolsConfig(habit_rate=1.5)


def test_share_of_perfect_demonstrations_follows_the_mistake_rate(default_splits):
    train = default_splits["train"]
    rate = _perfect_rate(train["target"], train["ground_truth"])
    assert 0.2 <= rate <= 0.6
    assert rate == pytest.approx(1 - st.SyntheticToolsConfig().mistake_rate, abs=0.04)
    clean = st.make_splits(
        st.SyntheticToolsConfig(num_train=200, num_validation=0, num_test=0, mistake_rate=0.0)
    )
    assert _perfect_rate(clean["train"]["target"], clean["train"]["ground_truth"]) == 1.0
    noisy = st.make_splits(
        st.SyntheticToolsConfig(num_train=200, num_validation=0, num_test=0, mistake_rate=0.8)
    )
    assert _perfect_rate(
        noisy["train"]["target"], noisy["train"]["ground_truth"]
    ) == pytest.approx(0.2, abs=0.08)


def test_think_lengths_span_the_configured_range():
    config = st.SyntheticToolsConfig(
        num_train=400,
        num_validation=0,
        num_test=0,
        min_think_words=10,
        max_think_words=60,
        multi_call_fraction=0.0,
        mistake_rate=0.0,
    )
    words = [_think_words(t) for t in st.make_splits(config)["train"]["target"]]
    assert min(words) == 10 and max(words) == 60
    assert 30 <= sum(words) / len(words) <= 40


def test_think_text_has_exactly_the_asked_words():
    request = st.generate_requests(SMALL)["train"][0]
    for n in (1, 3, 17, 80):
        text = st.think_text(request, n, random.Random(n))
        assert len(text.split()) == n and text.endswith(".")


def test_corpus_holds_every_text_of_the_splits():
    splits = st.make_splits(SMALL)
    texts = list(st.iter_corpus(splits["train"], splits["test"]))
    assert len(texts) == 4 * (300 + 60)
    row = splits["test"][5]
    assert {
        row["prompt"][0]["content"],
        row["prompt"][1]["content"],
        row["target"],
        row["ground_truth"],
    } <= set(texts)
    world = "\n".join(st.tool_corpus())
    assert all(t.name in world for t in st.TOOLS)
