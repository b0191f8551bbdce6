"""gd2po_jax.rewards.base: the reward registry, CombinedReward and the output check."""

import dataclasses

import numpy as np
import pytest

from gd2po_jax.rewards import base
from gd2po_jax.rewards.base import (
    CombinedReward,
    RewardFunction,
    RewardOutputError,
    build_reward_function,
    check_reward_output,
    register_reward_kind,
    reward_kinds,
    reward_step_metrics,
)


@dataclasses.dataclass(frozen=True)
class Constant:
    """K rewards, each a constant: column k of every response is ``values[k]``."""

    names: tuple = ("helpfulness",)
    values: tuple = (0.5,)
    min_values: tuple | None = (0.0,)

    def __call__(self, prompts, responses, columns):
        return np.tile(np.asarray(self.values, np.float64), (len(responses), 1))


class NoMinimum:
    names = ("raw",)

    def __call__(self, prompts, responses, columns):
        return [[float(len(r))] for r in responses]


@pytest.fixture
def registry(monkeypatch):
    """A copy of the registry, so kinds registered by a test do not outlive it."""
    monkeypatch.setattr(base, "_REWARD_KINDS", dict(base._REWARD_KINDS))
    return base._REWARD_KINDS


BATCH = (["p", "p", "p"], ["a", "bb", "ccc"], {"ground_truth": ["x", "y", "z"]})


# ---------------------------------------------------------------- the registry


def test_register_builds_a_kind_with_its_options(registry):
    calls = []

    @register_reward_kind("constant")
    def constant(**options):
        calls.append(options)
        return Constant(**options)

    assert constant.__name__ == "constant"  # the decorator returns the factory unchanged
    assert "constant" in reward_kinds() and list(reward_kinds()) == sorted(reward_kinds())
    fn = build_reward_function({"kind": "constant", "names": ("a", "b"), "values": (1, 2)})
    assert calls == [{"names": ("a", "b"), "values": (1, 2)}]  # "kind" is not passed on
    assert fn == Constant(names=("a", "b"), values=(1, 2)) and isinstance(fn, RewardFunction)
    register_reward_kind("constant")(constant)  # the same factory again is harmless
    with pytest.raises(ValueError, match="reward kind 'constant' is already registered"):
        register_reward_kind("constant")(Constant)


def test_unknown_kind_and_bad_options_name_the_spec(registry):
    register_reward_kind("constant")(Constant)
    with pytest.raises(ValueError, match=r"unknown reward kind 'nope' in \{'kind': 'nope'\}; known: \(.*'constant'"):
        build_reward_function({"kind": "nope"})
    with pytest.raises(ValueError, match="unknown reward kind None"):
        build_reward_function({"names": ("a",)})
    with pytest.raises(ValueError, match=r"bad options for reward kind 'constant' in .*'temperature': 1"):
        build_reward_function({"kind": "constant", "temperature": 1})


def test_a_list_of_specs_is_combined_in_order(registry):
    register_reward_kind("constant")(Constant)
    fn = build_reward_function([
        {"kind": "constant", "names": ("b",), "values": (2.0,)},
        {"kind": "constant", "names": ("a", "c"), "values": (1.0, 3.0), "min_values": (-1.0, -3.0)},
    ])
    assert isinstance(fn, CombinedReward)
    assert fn.names == ("b", "a", "c")
    np.testing.assert_array_equal(fn(*BATCH), [[2.0, 1.0, 3.0]] * 3)
    with pytest.raises(ValueError, match=r"unique across functions; repeated: \['a'\]"):
        build_reward_function([{"kind": "constant", "names": ("a",)}, {"kind": "constant", "names": ("a",)}])


# ---------------------------------------------------------------- CombinedReward


def test_combined_reward_concatenates_checked_columns():
    combined = CombinedReward([Constant(), NoMinimum()])
    assert isinstance(combined.functions, tuple)
    assert combined.names == ("helpfulness", "raw")
    out = combined(*BATCH)
    assert out.dtype == np.float32 and out.shape == (3, 2)
    np.testing.assert_array_equal(out, [[0.5, 1.0], [0.5, 2.0], [0.5, 3.0]])


def test_combined_reward_min_values_only_when_every_function_declares_them():
    two = CombinedReward((Constant(names=("x", "y"), values=(1, 1), min_values=(-3, 0)), Constant()))
    assert two.min_values == (-3.0, 0.0, 0.0)
    assert CombinedReward((Constant(), NoMinimum())).min_values is None


def test_combined_reward_rejects_no_function_and_passes_abstentions_on():
    with pytest.raises(ValueError, match="at least one reward function"):
        CombinedReward(())
    abstaining = Constant(names=("maybe",), values=(np.nan,))
    out = CombinedReward((Constant(), abstaining))(*BATCH)
    assert np.isnan(out[:, 1]).all() and (out[:, 0] == 0.5).all()
    broken = Constant(names=("broken",), values=(np.inf,))
    with pytest.raises(RewardOutputError, match="reward function Constant, reward 'broken', rollout 0"):
        CombinedReward((Constant(), broken))(*BATCH)


# ---------------------------------------------------------------- check_reward_output


def test_check_accepts_numbers_and_abstentions():
    fn = Constant(names=("a", "b"))
    out = check_reward_output(fn, [[1, None], [np.float64(2.5), float("nan")], [np.int32(-3), 0.25]], 3)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[1.0, np.nan], [2.5, np.nan], [-3.0, 0.25]])
    np.testing.assert_array_equal(check_reward_output(fn, np.ones((3, 2), np.int64), 3), np.ones((3, 2)))


@pytest.mark.parametrize("value, shown", [
    (np.inf, "returned inf, not finite"), (-np.inf, "returned -inf, not finite"),
    ("2.5", "returned '2.5' (str)"), (True, "returned True (bool)"), (object, "(type)"),
    (1e39, "returned 1e+39, not finite in float32"),
])
def test_check_rejects_inf_and_non_numbers_naming_reward_rollout_value(value, shown):
    fn = Constant(names=("a", "b"))
    rewards = [[0.0, 0.0], [0.0, 0.0], [0.0, value]]
    with pytest.raises(RewardOutputError, match=r"Constant, reward 'b', rollout 2: ") as err:
        check_reward_output(fn, rewards, 3)
    assert shown in str(err.value) and (err.value.reward, err.value.rollout) == ("b", 2)
    assert err.value.shifted(10).rollout == 12 and "rollout 12" in str(err.value.shifted(10))


def test_check_rejects_arrays_of_bools_and_wrong_shapes():
    fn = Constant(names=("a",))
    with pytest.raises(RewardOutputError, match="reward 'a', rollout 0: returned np.True_"):
        check_reward_output(fn, np.ones((2, 1), bool), 2)
    with pytest.raises(RewardOutputError, match=r"returned shape \(2,\) for rewards \('a',\), expected \(2, 1\)"):
        check_reward_output(fn, [1.0, 2.0], 2)
    with pytest.raises(RewardOutputError, match=r"returned shape \(\)"):
        check_reward_output(fn, None, 2)
    with pytest.raises(RewardOutputError, match=r"expected \(3, 1\)"):
        check_reward_output(fn, [[1.0], [2.0]], 3)


def test_step_metrics_are_collected_from_every_function_and_forgotten():
    class Counting:
        def __init__(self, name):
            self.names, self.calls = (name,), 0

        def __call__(self, prompts, responses, columns):
            self.calls += 1
            return np.zeros((len(responses), 1), np.float32)

        def step_metrics(self):
            calls, self.calls = self.calls, 0
            return {f"{self.names[0]}/calls": calls}

    combined = CombinedReward((Counting("a"), Counting("b"), Constant()))  # Constant keeps no metrics
    combined(["p"], ["r"], {})
    assert reward_step_metrics(combined) == {"a/calls": 1.0, "b/calls": 1.0}
    assert reward_step_metrics(combined) == {"a/calls": 0.0, "b/calls": 0.0}
    assert reward_step_metrics(Constant()) == {}
