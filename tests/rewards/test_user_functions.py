"""Reward functions of your own (`gd2po_jax.rewards.user_functions`): import paths, TRL's call exactly as
TRL makes it, the batch interface, per-entry failure policies, and the errors before compute.

TRL's example reward functions below are written from TRL's documented signature
(``fn(prompts, completions, completion_ids, **kwargs) -> list[float | None]``, the GRPOTrainer docs'
"Using a custom reward function" section): they run here unchanged.
"""

from __future__ import annotations

import math
import re
import textwrap

import numpy as np
import pytest

from gd2po_jax.config import ConfigError, FunctionEntry, RunConfig
from gd2po_jax.rewards.base import (
    RESPONSE_IDS,
    ROLLOUT_INDEX,
    CombinedReward,
    RewardOutputError,
    reward_step_extras,
    reward_step_metrics,
)
from gd2po_jax.rewards.scoring import RewardError, score_batch
from gd2po_jax.rewards.user_functions import (
    LOG_METRIC_PREFIX,
    RewardFunctionError,
    TrainerState,
    check_call,
    load_function,
    run_reward_weights,
    trial_call,
)
from gd2po_jax.tasks.setup import build_run_reward, load_user_functions
from tests.fakes import tiny_run_config

# ---------------------------------------------------------------- TRL's documented examples, verbatim in form


def reward_len(completions, **kwargs):
    """TRL docs: 'Example 1: Reward longer completions' (here: closeness to 20 characters)."""
    return [-abs(20 - len(completion)) for completion in completions]


def format_reward_func(completions, **kwargs):
    """TRL docs: 'Example 2: Reward completions with a specific format' (conversational completions)."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def reward_func(completions, ground_truth, **kwargs):
    """TRL docs: 'Example 3: Reward completions based on a reference' (reads a dataset column)."""
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def math_reward_func(completions, task, **kwargs):
    """TRL docs: 'Example 4: Multi-task reward functions': None where the task is not its own."""
    return [None if t != "math" else float(len(c) > 0) for c, t in zip(completions, task)]


def _entry(fn: str, index: int = 0, **fields) -> FunctionEntry:
    return FunctionEntry.parse({"fn": fn, **fields}, index)


def _here(name: str) -> str:
    return f"tests.rewards.test_user_functions:{name}"


def _columns(n: int = 2, *, conversational: bool = False, **extra) -> dict:
    """Columns as `gd2po_jax.rl.rollout.collect_rollouts` gives them for ``n`` rollouts."""
    columns = {
        "prompt": [[{"role": "user", "content": f"question {i}"}] for i in range(n)],
        "prompt_text": [None if conversational else f"question {i}" for i in range(n)],
        "ground_truth": [None] * n, "target": [None] * n, "level": [None] * n, "source": ["jsonl"] * n,
        "row": list(range(n)), RESPONSE_IDS: [[5, 6, i] for i in range(n)], ROLLOUT_INDEX: list(range(10, 10 + n)),
    }
    columns.update(extra)
    return columns


# ---------------------------------------------------------------- TRL's call


def test_trl_examples_run_unchanged_with_their_own_argument_forms():
    texts = ["a" * 20, "<think>x</think><answer>4</answer>"]
    assert load_function(_entry(_here("reward_len")))(["p0", "p1"], texts, _columns())[:, 0].tolist() == [0, -14]
    conversational = _columns(conversational=True)
    assert load_function(_entry(_here("format_reward_func")))(
        ["p0", "p1"], texts, conversational)[:, 0].tolist() == [0.0, 1.0]
    boxed = ["so \\boxed{4}", "\\boxed{5}"]
    scores = load_function(_entry(_here("reward_func")))(["p0", "p1"], boxed, _columns(ground_truth=["4", "4"]))
    assert scores[:, 0].tolist() == [1.0, 0.0]
    abstains = load_function(_entry(_here("math_reward_func")))(["p0", "p1"], texts, _columns(task=["math", "code"]))
    assert abstains[0, 0] == 1.0 and math.isnan(abstains[1, 0])  # None: abstained


def test_the_call_has_trls_arguments_and_every_data_column():
    seen = {}

    def spy(prompts, completions, completion_ids, trainer_state, **kwargs):
        seen.update(prompts=prompts, completions=completions, completion_ids=completion_ids,
                    trainer_state=trainer_state, kwargs=kwargs)
        return [0.5] * len(completions)

    function = load_function(_entry(_here("reward_len")))
    function.fn, function.entry = spy, _entry(_here("reward_len"), options={"scale": 2})
    function.begin_step(3, 10)
    function(["<rendered 0>", "<rendered 1>"], ["one", "two"], _columns(answer=[1, "x"], meta=[{"a": 1}, None]))
    assert seen["prompts"] == ["question 0", "question 1"]  # the data's own text, not the rendered prompt
    assert seen["completions"] == ["one", "two"]
    assert seen["completion_ids"] == [[5, 6, 0], [5, 6, 1]]
    assert seen["trainer_state"] == TrainerState(global_step=3, max_steps=10)
    kwargs = seen["kwargs"]
    assert kwargs["answer"] == [1, "x"] and kwargs["meta"] == [{"a": 1}, None] and kwargs["scale"] == 2
    assert kwargs["ground_truth"] == [None, None] and kwargs["source"] == ["jsonl", "jsonl"]
    assert not {"prompt", "prompt_text", "row", RESPONSE_IDS, ROLLOUT_INDEX} & set(kwargs)
    assert callable(kwargs["log_extra"]) and callable(kwargs["log_metric"])

    function(["r"], ["three"], _columns(1, conversational=True))
    assert seen["prompts"] == [[{"role": "user", "content": "question 0"}]]
    assert seen["completions"] == [[{"role": "assistant", "content": "three"}]]


def test_log_metric_and_log_extra_reach_the_step_metrics_and_the_rollouts():
    def logs(completions, log_metric, log_extra, **kwargs):
        log_metric("mean_chars", float(np.mean([len(c) for c in completions])))
        log_extra("chars", [len(c) for c in completions])
        return [1.0] * len(completions)

    function = load_function(_entry(_here("reward_len")))
    function.fn = logs
    combined = CombinedReward((function,))
    combined(["a", "b"], ["xx", "xxxx"], _columns())
    assert reward_step_metrics(combined) == {f"{LOG_METRIC_PREFIX}mean_chars": 3.0}
    assert reward_step_extras(combined) == {"chars": {10: 2, 11: 4}}  # by the rollouts' index in the step
    assert reward_step_metrics(combined) == {} and reward_step_extras(combined) == {}


def test_async_functions_are_awaited(tmp_path, monkeypatch):
    (tmp_path / "async_rewards.py").write_text(textwrap.dedent("""
        async def judge(completions, **kwargs):
            return [float(len(c)) for c in completions]
    """))
    monkeypatch.chdir(tmp_path)
    function = load_function(_entry("async_rewards:judge"))
    assert function(["p"], ["abc"], _columns(1))[:, 0].tolist() == [3.0]


# ---------------------------------------------------------------- the batch interface, classes, names, weights


class TwoColumns:
    """The project's batch interface with options: K = 2 columns."""

    names = ("chars", "words")

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def __call__(self, prompts, responses, columns):
        return [[self.scale * len(r), float(len(r.split()))] for r in responses]


def test_a_class_with_names_is_built_with_its_options_and_gives_its_columns():
    function = load_function(_entry(_here("TwoColumns"), options={"scale": 0.5}))
    assert function.names == ("chars", "words") and not function.trl_form
    assert function(["p"], ["ab cd"], _columns(1)).tolist() == [[2.5, 2.0]]


def test_names_and_weights_of_a_run_mixing_a_family_and_functions(tmp_path):
    config = tiny_run_config().replace({"rewards.functions": (
        _here("reward_len"), {"fn": _here("TwoColumns"), "weight": 0.5}, {"fn": _here("reward_len"), "name": "len2"})})
    reward_fn = build_run_reward(config)
    assert reward_fn.names == ("correctness", "format", "length", "reward_len", "chars", "words", "len2")
    assert run_reward_weights(config, reward_fn) == (1, 1, 1, 1, 0.5, 0.5, 1)
    assert run_reward_weights(config.replace({"rewards.functions": (_here("reward_len"),)}),
                              build_run_reward(config.replace({"rewards.functions": (_here("reward_len"),)}))) == ()
    with pytest.raises(ConfigError, match=r"config\.rewards\.weights: 2 weights for the run's 4 reward columns"):
        weights = config.replace({"rewards.functions": (_here("reward_len"),), "rewards.weights": (1, 2)})
        run_reward_weights(weights, build_run_reward(weights))
    twice = config.replace({"rewards.functions": (_here("reward_len"), _here("reward_len"))})
    with pytest.raises(ConfigError, match=r"repeated: \['reward_len'\].*distinct names"):
        build_run_reward(twice)


def test_functions_alone_need_no_family():
    config = tiny_run_config().replace({"rewards.kind": "", "rewards.names": (),
                                        "rewards.functions": (_here("reward_len"),)})
    assert build_run_reward(config).names == ("reward_len",)
    with pytest.raises(ConfigError, match=r"^config\.rewards\.functions: no rewards"):
        config.replace({"rewards.functions": ()})
    with pytest.raises(ConfigError, match=r"^config\.rewards\.names: .* names rewards of no family"):
        config.replace({"rewards.names": ("x",)})


# ---------------------------------------------------------------- failure policies per entry


def raises_on_b(completions, **kwargs):
    if any("b" in c for c in completions):
        raise RuntimeError("cannot score b")
    return [1.0] * len(completions)


@pytest.mark.parametrize("policy, expected", [("abstain", float("nan")), ("min", -1.0)])
def test_an_entry_may_abstain_or_score_the_minimum_on_its_own_failures(policy, expected):
    function = load_function(_entry(_here("raises_on_b"), on_error=policy, min_value=-1.0))
    scores = score_batch(function, ["p"] * 3, ["a", "b", "c"], _columns(3), on_error="raise")
    assert scores.rewards[0, 0] == 1.0 and scores.rewards[2, 0] == 1.0
    assert np.isnan(scores.rewards[1, 0]) if math.isnan(expected) else scores.rewards[1, 0] == expected
    assert scores.failed[:, 0].tolist() == [False, True, False] and "cannot score b" in scores.first_error
    with pytest.raises(RewardError, match=r"tests\.rewards\.test_user_functions:raises_on_b .*failed on rollout 1"):
        score_batch(load_function(_entry(_here("raises_on_b"))), ["p"] * 3, ["a", "b", "c"], _columns(3))


# ---------------------------------------------------------------- errors before compute, each naming the entry


def test_a_module_that_cannot_be_found_is_named_with_what_to_do(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RewardFunctionError, match=r"^config\.rewards\.functions\[0\] \('my_rewards:brevity'\): cannot "
                       r"import module 'my_rewards' \(no my_rewards\.py in .*\); run from the directory that holds it, "
                       r"or give the file's path: path/to/my_rewards\.py:brevity$"):
        load_function(_entry("my_rewards:brevity"))


def test_a_module_that_raises_on_import_names_its_file_and_line(tmp_path, monkeypatch):
    (tmp_path / "broken.py").write_text("import os\nx = undefined_name\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RewardFunctionError, match=r"\('broken:fn'\): importing module 'broken' raised NameError: "
                       r"name 'undefined_name' is not defined \(.*broken\.py, line 2\)"):
        load_function(_entry("broken:fn"))
    (tmp_path / "syntax.py").write_text("def fn(:\n")
    with pytest.raises(RewardFunctionError, match=r"importing .*syntax\.py raised SyntaxError"):
        load_function(_entry(f"{tmp_path / 'syntax.py'}:fn"))


def test_a_missing_callable_lists_what_the_file_defines(tmp_path):
    path = tmp_path / "rewards_file.py"
    path.write_text("import helper_module\n\ndef brevity(completions, **kwargs):\n"
                    "    return helper_module.ones(completions)\n"
                    "\nclass Judge:\n    pass\n\nLIMIT = 3\n")
    (tmp_path / "helper_module.py").write_text("def ones(xs):\n    return [1.0] * len(xs)\n")
    assert load_function(_entry(f"{path}:brevity"))(["p"], ["x"], _columns(1))[:, 0].tolist() == [1.0]  # a neighbour
    with pytest.raises(RewardFunctionError,
                       match=rf"{re.escape(str(path))} has no 'brevty'; it defines Judge, brevity$"):
        load_function(_entry(f"{path}:brevty"))
    with pytest.raises(RewardFunctionError, match=r"'LIMIT' in .* is a int, not a function or class"):
        load_function(_entry(f"{path}:LIMIT"))
    with pytest.raises(RewardFunctionError, match=r"no file .*nowhere\.py; give an existing"):
        load_function(_entry(f"{tmp_path / 'nowhere.py'}:brevity"))


def no_kwargs(prompts, completions):
    return [0.0] * len(completions)


def needs_a_column(completions, answer, **kwargs):
    return [0.0] * len(completions)


def test_a_signature_that_cannot_take_trls_call_is_named_before_compute():
    with pytest.raises(RewardFunctionError, match=r"^config\.rewards\.functions\[0\] .* in .*test_user_functions\.py: "
                       r"no_kwargs\(prompts, completions\) cannot take TRL's call .*unexpected keyword argument "
                       r".*; add \*\*kwargs to its parameters"):
        check_call(load_function(_entry(_here("no_kwargs"))), ("prompt", "answer"))
    with pytest.raises(RewardFunctionError, match=r"needs_a_column\(completions, answer, \*\*kwargs\) cannot take .*"
                       r"missing a required argument: 'answer'; give its other parameters defaults"):
        check_call(load_function(_entry(_here("needs_a_column"))), ("prompt", "ground_truth"))
    check_call(load_function(_entry(_here("needs_a_column"))), ("prompt", "answer"))
    with pytest.raises(RewardFunctionError, match=r"options \['answer'\] have the names of .* data columns"):
        check_call(load_function(_entry(_here("needs_a_column"), options={"answer": 1})), ("prompt", "answer"))


def wrong_length(completions, **kwargs):
    return [1.0]


def not_a_number(completions, **kwargs):
    return ["2.5" for _ in completions]


def test_a_trial_call_names_a_wrong_length_or_a_value_that_is_not_a_number():
    columns = _columns(3, target=["t0", None, "t2"])
    with pytest.raises(RewardFunctionError, match=r"^config\.rewards\.functions\[0\] \('tests.rewards."
                       r"test_user_functions:wrong_length'\) in .*: on a trial call with the first 2 training rows: "
                       r"returned 1 rewards for "
                       r"2 completions; return one float \(or None to abstain\) per completion, in order$"):
        trial_call(load_function(_entry(_here("wrong_length"))), ["a", "b", "c"], columns, on_error="raise")
    with pytest.raises(RewardFunctionError,
                       match=r"returned '2\.5' \(str\); a reward is a finite number, or None / NaN"):
        trial_call(load_function(_entry(_here("not_a_number"))), ["a", "b", "c"], columns, on_error="raise")
    with pytest.raises(RewardFunctionError, match=r"a trial call .* raised RuntimeError: cannot score b .*set the "
                       r"entry's on_error"):
        trial_call(load_function(_entry(_here("raises_on_b"))), ["a", "b"], _columns(2, target=["a", "b"]),
                   on_error="raise")
    trial_call(load_function(_entry(_here("raises_on_b"), on_error="abstain")), ["a", "b"],
               _columns(2, target=["a", "b"]), on_error="raise")


@pytest.mark.parametrize("entry, message", [
    ("no_colon", r"^config\.rewards\.functions\[0\]\.fn: 'no_colon' is not 'module:callable'"),
    ({"fn": "m:f", "weigth": 2}, r"^config\.rewards\.functions\[0\]: unknown key \['weigth'\]; an entry has fn, name"),
    ({"fn": "m:f", "on_error": "skip"},
     r"functions\[0\]\.on_error: 'skip' is not one of \('raise', 'min', 'abstain'\)"),
    ({"fn": "m:f", "options": [1]}, r"functions\[0\]\.options: must be a mapping"),
    (3, r"^config\.rewards\.functions\[0\]: must be 'module:callable'"),
])
def test_entries_are_checked_when_the_config_is_read(entry, message):
    with pytest.raises(ConfigError, match=message):
        tiny_run_config().replace({"rewards.functions": (entry,)})


def test_weights_in_two_places_are_refused():
    with pytest.raises(ConfigError, match=r"^config\.rewards\.weights: is given, and so is a weight of "
                       r"rewards\.functions\[0\]"):
        tiny_run_config().replace({"rewards.functions": ({"fn": "m:f", "weight": 2},), "rewards.weights": (1, 1, 1, 1)})


def test_an_unknown_family_is_a_config_error_pointing_to_functions():
    config = tiny_run_config().replace({"rewards.kind": "my_reward"})
    with pytest.raises(ConfigError, match=r"^config\.rewards\.kind: 'my_reward' is not a registered reward family; "
                       r"registered: .*tool_calling.*config\.rewards\.functions"):
        load_user_functions(config)


def test_the_config_round_trips_its_entries():
    entries = ("a:b", {"fn": "x.py:y", "weight": 2.0, "options": {"k": 1}})
    config = tiny_run_config().replace({"rewards.functions": entries})
    assert RunConfig.from_dict(config.to_dict()) == config
    assert config.rewards.function_entries()[1].options == {"k": 1}


# ---------------------------------------------------------------- components, bools, side by side, deadlines (issue 61)


def judge_components(completions, **kwargs):
    """One call scoring two criteria: a mapping of component -> value per completion (None abstains)."""
    return [None if c == "skip" else {"correct": float("4" in c), "cites": "[1]" in c} for c in completions]


def test_a_function_returning_components_gives_a_column_each_fixed_by_its_first_call():
    function = load_function(_entry(_here("judge_components"), weight={"cites": 0.5}))
    assert function.names == ("judge_components",) and function.components is None  # unknown before a call
    scores = function(["p"] * 3, ["4 [1]", "5", "skip"], _columns(3))
    assert function.names == ("judge_components/correct", "judge_components/cites")
    np.testing.assert_array_equal(scores[:2], [[1.0, 1.0], [0.0, 0.0]])  # the bool True counts as 1.0
    assert np.isnan(scores[2]).all()
    assert function.column_weights() == {"judge_components/correct": 1.0, "judge_components/cites": 0.5}

    def other_keys(completions, **kwargs):
        return [{"correct": 1.0, "style": 0.0} for _ in completions]

    function.fn = other_keys
    with pytest.raises(RewardOutputError, match=r"test_user_functions:judge_components .*rollout 0: returned components "
                                                r"\['correct', 'style'\] where its first call gave the components "
                                                r"\['correct', 'cites'\]"):
        function(["p"], ["x"], _columns(1))
    named = load_function(_entry(_here("judge_components"), names={"correct": "acc", "cites": "refs"}))
    assert named.names == ("acc", "refs")  # fixed by the entry before any call
    assert named(["p"], ["4"], _columns(1)).tolist() == [[1.0, 0.0]]


def test_components_reach_the_runs_columns_and_weights_after_the_trial_call():
    config = tiny_run_config().replace({"rewards.kind": "", "rewards.names": (), "rewards.functions": (
        {"fn": _here("judge_components"), "weight": {"correct": 2.0}}, _here("reward_len"))})
    reward_fn = build_run_reward(config)
    trial_call(reward_fn.functions[0], ["a", "b"], _columns(2, target=["4", "5"]), on_error="raise")
    assert reward_fn.names == ("judge_components/correct", "judge_components/cites", "reward_len")
    assert run_reward_weights(config, reward_fn) == (2.0, 1.0, 1.0)


def bools(completions, **kwargs):
    return [len(c) > 2 for c in completions]


def test_bools_count_as_one_and_zero_as_in_trl():
    function = load_function(_entry(_here("bools")))
    assert function(["p"] * 2, ["abc", "a"], _columns(2)).tolist() == [[1.0], [0.0]]
    assert score_batch(function, ["p"] * 2, ["abc", "a"], _columns(2)).rewards.tolist() == [[1.0], [0.0]]


def test_three_functions_one_async_are_scored_side_by_side(tmp_path, monkeypatch):
    """Two plain functions and an async one, each waiting until all three are in flight (num_workers=3):
    they meet only when scored at once (the async one on the scorer's event loop)."""
    (tmp_path / "meeting.py").write_text(textwrap.dedent("""
        import asyncio, threading
        BARRIER = threading.Barrier(3)

        def first(completions, **kwargs):
            BARRIER.wait(10)
            return [1.0] * len(completions)

        def second(completions, **kwargs):
            BARRIER.wait(10)
            return [2.0] * len(completions)

        async def third(completions, **kwargs):
            await asyncio.to_thread(BARRIER.wait, 10)
            return [3.0] * len(completions)
    """))
    monkeypatch.chdir(tmp_path)
    combined = CombinedReward(tuple(load_function(_entry(f"meeting:{name}", i))
                                    for i, name in enumerate(("first", "second", "third"))))
    assert combined.functions[2].is_async
    scores = score_batch(combined, ["p"] * 2, ["a", "b"], _columns(2), num_workers=3)
    assert scores.rewards.tolist() == [[1.0, 2.0, 3.0]] * 2


HANG = __import__("threading").Event()


def hangs_forever(completions, **kwargs):
    HANG.wait(30)
    return [1.0] * len(completions)


def exits(completions, **kwargs):
    import sys

    sys.exit(3)


def test_a_trial_call_that_hangs_stops_at_the_timeout_with_one_line():
    """Issue 63 #4: the trial call before compute runs under rewards.timeout_s (and the entry's own)."""
    try:
        with pytest.raises(RewardFunctionError, match=r"^config\.rewards\.functions\[0\] .* a trial call with the first "
                                                      r"2 training rows .* gave no result within config\.rewards\."
                                                      r"timeout_s=0\.3 s \(the call is abandoned\); fix the function"):
            trial_call(load_function(_entry(_here("hangs_forever"))), ["a", "b"], _columns(2), on_error="raise",
                       timeout_s=0.3)
        with pytest.raises(RewardFunctionError, match=r"gave no result within its timeout_s=0\.2 s"):
            trial_call(load_function(_entry(_here("hangs_forever"), timeout_s=0.2)), ["a", "b"], _columns(2),
                       on_error="raise", timeout_s=600)
    finally:
        HANG.set()


def test_sys_exit_in_a_trial_call_is_one_line_naming_the_function():
    with pytest.raises(RewardFunctionError, match=r"^config\.rewards\.functions\[0\] \('tests\.rewards\.test_user_"
                                                  r"functions:exits'\) in .*: a trial call .*: reward function .*exits.* "
                                                  r"raised SystemExit\(3\) on rollouts 0-1: .*stops the run here$"):
        trial_call(load_function(_entry(_here("exits"), on_error="abstain")), ["a", "b"], _columns(2),
                   on_error="raise")


def test_on_error_min_without_a_minimum_is_refused_before_compute():
    """Issue 62 #5: the advice 'min' works only with a minimum: without one, one line naming the entry."""
    with pytest.raises(RewardFunctionError, match=r"^config\.rewards\.functions\[0\] .*: config\.rewards\.on_error="
                                                  r"'min' scores a failed rollout with the function's minimum, and it "
                                                  r"declares none: give the entry a min_value"):
        trial_call(load_function(_entry(_here("reward_len"))), ["a"], _columns(1), on_error="min")
    trial_call(load_function(_entry(_here("reward_len"), min_value=-5)), ["a"], _columns(1), on_error="min")


@pytest.mark.parametrize("entry, message", [
    ({"fn": "m:f", "timeout_s": 0}, r"functions\[0\]\.timeout_s: must be a number of seconds > 0"),
    ({"fn": "m:f", "names": {"a": "x", "b": "x"}}, r"functions\[0\]\.names: must map each component"),
    ({"fn": "m:f", "weight": {"a": "x"}}, r"functions\[0\]\.weight: must be a finite number, or a mapping"),
])
def test_the_new_entry_keys_are_checked_when_the_config_is_read(entry, message):
    with pytest.raises(ConfigError, match=message):
        tiny_run_config().replace({"rewards.functions": (entry,)})


def test_the_entrys_names_rename_a_batch_functions_columns_each_one():
    function = load_function(_entry(_here("TwoColumns"), names={"chars": "c", "words": "w"}, weight={"w": 2.0}))
    assert function.names == ("c", "w") and function.column_weights() == {"c": 1.0, "w": 2.0}
    with pytest.raises(RewardFunctionError, match=r"functions\[0\] \(.*TwoColumns'\)\.names: renames \['chars'\], but .* gives the "
                                                  r"rewards \['chars', 'words'\]; map each of them"):
        load_function(_entry(_here("TwoColumns"), names={"chars": "c"}))
    with pytest.raises(RewardFunctionError, match=r"functions\[0\] \(.*\)\.weight: \['x'\] is not among its rewards"):
        load_function(_entry(_here("TwoColumns"), weight={"x": 2.0})).column_weights()
