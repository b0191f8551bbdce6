"""gd2po_jax.rewards.scoring: abstentions (NaN / None) from the reward function to the advantages,
kept apart from crashes (on_error) and from invalid outputs (+-inf, strings, bools)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gd2po_jax.advantages import compute_advantages
from gd2po_jax.models import Decoder
from gd2po_jax.prompts import PromptSet
from gd2po_jax.rewards import CombinedReward, ToolCallingReward
from gd2po_jax.rewards.base import RewardOutputError
from gd2po_jax.rewards.scoring import RewardError, abstained_fraction, repeat_columns, score_rollouts
from gd2po_jax.rollout import collect_rollouts
from tests.fakes import DigitTokenizer, tiny_model_config

CONFIG = tiny_model_config(vocab_size=48)
GT_CALL = ('<think> t </think>\n<tool_call>\n{"name": "GetNews", "parameters": {"page": "1"}}\n'
           '</tool_call>')
GOOD = GT_CALL.replace("<think> t </think>", "<think> let me see </think>")


@dataclasses.dataclass
class Judge:
    """A stand-in reward model: K=1, abstains (None) on responses containing ``abstain_on``, NaN on
    empty ones, else the number of tokens; raises on ``fail_on``; returns ``bad`` on ``bad_on``."""

    names: tuple = ("judge",)
    min_values: tuple = (-1.0,)
    abstain_on: str = "7"
    fail_on: str | None = None
    bad_on: str | None = None
    bad: object = None

    def __call__(self, prompts, responses, columns):
        out = []
        for response in responses:
            words = response.split()
            if self.fail_on is not None and self.fail_on in words:
                raise RuntimeError("judge crashed")
            if self.bad_on is not None and self.bad_on in words:
                out.append([self.bad])
            elif self.abstain_on in words:
                out.append([None])
            elif not words:
                out.append([float("nan")])
            else:
                out.append([len(words)])
        return out


def _abstains(response: str, judge: Judge) -> bool:
    return judge.abstain_on in response.split() or not response.split()


# ---------------------------------------------------------------- scoring on the host


def test_none_and_nan_become_missing_rewards_whatever_the_chunking():
    judge = Judge()
    responses = ["1 2", "7", "", "3 7 3", "4 4 4", "9"]
    combined = CombinedReward((ToolCallingReward(names=("correctness",)), judge))
    columns = {"ground_truth": [GT_CALL] * 6}
    one = score_rollouts(combined, ["p"] * 6, responses, columns)
    assert one.dtype == np.float32 and one.shape == (6, 2)
    np.testing.assert_array_equal(one[:, 0], [-3.0] * 6)  # correctness never abstains
    np.testing.assert_array_equal(np.isnan(one[:, 1]), [_abstains(r, judge) for r in responses])
    np.testing.assert_array_equal(one[[0, 4, 5], 1], [2.0, 3.0, 1.0])
    np.testing.assert_array_equal(score_rollouts(combined, ["p"] * 6, responses, columns, num_workers=4), one)


def test_abstaining_is_not_crashing_on_error_min_floors_only_the_crash():
    responses = ["1 2", "7", "5 5", "8"]
    judge = Judge(fail_on="5")
    with pytest.raises(RewardError, match=r"failed on rollout 2 \(response '5 5'\).*judge crashed"):
        score_rollouts(judge, ["p"] * 4, responses, {}, num_workers=2)
    floored = score_rollouts(judge, ["p"] * 4, responses, {}, on_error="min", num_workers=2)
    np.testing.assert_array_equal(floored[[0, 2, 3], 0], [2.0, -1.0, 1.0])  # the crash gets the minimum
    assert np.isnan(floored[1, 0])  # the abstention stays missing


@pytest.mark.parametrize("bad, shown", [
    (float("inf"), "inf"), (-np.inf, "-inf"), ("2.5", "'2.5' (str)"), (True, "True (bool)"),
    (np.bool_(False), "(bool)"), ([1.0], "[1.0] (list)"), (1e39, "not finite in float32"),
])
@pytest.mark.parametrize("on_error", ["raise", "min"])
def test_invalid_values_are_rejected_naming_reward_rollout_and_value(bad, shown, on_error):
    responses = ["1", "2", "3", "4", "5 6", "8"]
    judge = Judge(bad_on="6", bad=bad)
    expected = r"reward function Judge, reward 'judge', rollout 4: returned .*" + re.escape(shown)
    with pytest.raises(RewardOutputError, match=expected):
        score_rollouts(judge, ["p"] * 6, responses, {}, on_error=on_error, num_workers=3)


def test_invalid_value_inside_a_combined_reward_names_the_rollout_of_the_step():
    combined = CombinedReward((ToolCallingReward(names=("format",)), Judge(bad_on="6", bad="2.5")))
    responses = ["1", "2", "3", "4", "6", "8"]
    with pytest.raises(RewardOutputError, match=r"Judge, reward 'judge', rollout 4: returned '2\.5'"):
        score_rollouts(combined, ["p"] * 6, responses, {"ground_truth": [GT_CALL] * 6}, num_workers=2)
    # Also when another rollout crashes the batch and scoring goes row by row.
    crashing = CombinedReward((Judge(names=("a",), fail_on="1"), Judge(bad_on="6", bad="2.5")))
    with pytest.raises(RewardOutputError, match=r"reward 'judge', rollout 4: returned '2\.5'"):
        score_rollouts(crashing, ["p"] * 6, responses, {}, on_error="min", num_workers=2)


def test_wrong_shape_is_rejected():
    class Short:
        names = ("a", "b")

        def __call__(self, prompts, responses, columns):
            return np.zeros((len(responses), 1))

    with pytest.raises(RewardOutputError, match=r"Short: returned shape \(2, 1\).*expected \(2, 2\)"):
        score_rollouts(Short(), ["p", "p"], ["x", "y"], {})


def test_abstained_fraction_counts_valid_rollouts_per_reward():
    nan = np.nan
    rewards = np.array([[[1, nan], [nan, nan]], [[0, 0], [0, nan]], [[nan, nan], [nan, nan]]], np.float32)
    np.testing.assert_allclose(abstained_fraction(rewards), [3 / 6, 5 / 6])
    np.testing.assert_allclose(abstained_fraction(rewards, np.array([True, True, False])), [1 / 4, 3 / 4])
    np.testing.assert_array_equal(abstained_fraction(rewards, np.zeros(3, bool)), [0.0, 0.0])


# ---------------------------------------------------------------- end to end


@dataclasses.dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 5
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


def _group_advantages(values: np.ndarray) -> np.ndarray:
    """GDPO's group-normalized advantages of one reward of one group of ``len(values)`` rollouts."""
    rewards = jnp.asarray(values, jnp.float32)[None, :, None]
    out = compute_advantages(rewards, jnp.ones((1, len(values)), jnp.int32), "gdpo")
    return np.asarray(out.reward_advantages)[0, :, 0]


def test_abstentions_reach_the_advantages_as_missing_rewards():
    """Sampled rollouts -> scoring -> the RolloutBatch rewards [P, G, K] -> compute_advantages: a
    reward a rollout abstained on gets no advantage, and the group statistics of that reward are
    those of the rollouts that have it (as if the abstaining rollout were not in the group)."""
    judge = Judge(abstain_on="7")
    reward_fn = CombinedReward((Judge(names=("length",), abstain_on="never"), judge))
    rng = np.random.default_rng(0)
    num_prompts, group = 4, 8
    prompts = PromptSet(texts=[f"p{i}" for i in range(num_prompts)],
                        token_ids=[list(rng.integers(3, 48, size=4)) for _ in range(num_prompts)],
                        columns={"ground_truth": ["x"] * num_prompts})
    model = Decoder(CONFIG, rngs=nnx.Rngs(0))
    valid = np.array([True, True, True, False])
    out = collect_rollouts(model, prompts, DigitTokenizer(), reward_fn, num_generations=group, sampling=Sampling(),
                           eos_token_ids=[1], pad_token_id=0, prompt_length=8, rng=jax.random.PRNGKey(3),
                           valid=valid, num_workers=2)

    abstained = np.array([_abstains(r, judge) for r in out.responses]).reshape(num_prompts, group)
    assert 0 < abstained[valid].sum() < abstained[valid].size  # the seed gives both kinds
    batch_rewards = np.asarray(out.batch.rewards)
    assert batch_rewards.shape == (num_prompts, group, 2)
    np.testing.assert_array_equal(np.isnan(batch_rewards[..., 1]), abstained)
    assert not np.isnan(batch_rewards[..., 0]).any()
    np.testing.assert_allclose(out.abstained, [0.0, abstained[valid].mean()])

    lengths = jnp.sum(out.batch.response_mask, axis=1).reshape(num_prompts, group)
    adv = compute_advantages(out.batch.rewards, lengths, "gdpo", valid=out.batch.valid)
    reward_adv = np.asarray(adv.reward_advantages)
    assert np.isfinite(np.asarray(adv.advantages)).all() and np.isfinite(reward_adv).all()
    assert (reward_adv[..., 1][abstained] == 0).all()
    for p in np.flatnonzero(valid):
        present = ~abstained[p]
        np.testing.assert_allclose(reward_adv[p, present, 1], _group_advantages(batch_rewards[p, present, 1]),
                                   atol=1e-5)
        np.testing.assert_allclose(reward_adv[p, :, 0], _group_advantages(batch_rewards[p, :, 0]), atol=1e-5)
    # A rollout missing only the judge's reward is still trained on (with its other reward); the
    # filler prompt is not.
    np.testing.assert_array_equal(np.asarray(adv.keep), np.broadcast_to(valid[:, None], abstained.shape))


def test_repeat_columns_is_prompt_major():
    assert repeat_columns({"gt": ["a", "b"]}, 3) == {"gt": ["a", "a", "a", "b", "b", "b"]}
