"""gd2po_jax.rewards.scoring: abstentions (NaN / None) from the reward function to the advantages,
kept apart from crashes and timeouts (on_error, counted per step, with a limit) and from invalid
outputs (+-inf, strings, bools)."""

import dataclasses
import re
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gd2po_jax.config import SamplingConfig
from gd2po_jax.data.prompts import PromptSet
from gd2po_jax.models import Decoder
from gd2po_jax.rewards import CombinedReward, ToolCallingReward
from gd2po_jax.rewards.base import RewardOutputError
from gd2po_jax.rewards.scoring import (
    RewardError,
    RewardFailuresError,
    RewardMinimumError,
    RewardTimeoutError,
    StreamScorer,
    abandoned_calls,
    abstained_fraction,
    check_failures,
    failed_fraction,
    failure_modes,
    repeat_columns,
    score_batch,
)
from gd2po_jax.rl.advantages import compute_advantages
from gd2po_jax.rl.rollout import RolloutSettings, collect_rollouts
from gd2po_jax.jobs.train import host_metrics
from tests.fakes import DigitTokenizer, as_run_config, tiny_model_config

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
    one = score_batch(combined, ["p"] * 6, responses, columns).rewards
    assert one.dtype == np.float32 and one.shape == (6, 2)
    np.testing.assert_array_equal(one[:, 0], [-3.0] * 6)  # correctness never abstains
    np.testing.assert_array_equal(np.isnan(one[:, 1]), [_abstains(r, judge) for r in responses])
    np.testing.assert_array_equal(one[[0, 4, 5], 1], [2.0, 3.0, 1.0])
    np.testing.assert_array_equal(score_batch(combined, ["p"] * 6, responses, columns, num_workers=4).rewards, one)


def test_abstaining_is_not_crashing_on_error_min_floors_only_the_crash():
    responses = ["1 2", "7", "5 5", "8"]
    judge = Judge(fail_on="5")
    with pytest.raises(RewardError, match=r"failed on rollout 2 \(response '5 5'\).*judge crashed"):
        score_batch(judge, ["p"] * 4, responses, {}, num_workers=2).rewards
    floored = score_batch(judge, ["p"] * 4, responses, {}, on_error="min", num_workers=2).rewards
    np.testing.assert_array_equal(floored[[0, 2, 3], 0], [2.0, -1.0, 1.0])  # the crash gets the minimum
    assert np.isnan(floored[1, 0])  # the abstention stays missing


@pytest.mark.parametrize("workers", [1, 3])
def test_a_batch_scored_in_parts_as_they_arrive_equals_it_scored_whole(workers):
    """`StreamScorer`: the groups of a step added as the engine completes them (in any order), each
    part's calls started at once: the same rewards, failures and first error as `score_batch`."""
    responses = ["1 2", "7", "5 5", "", "3 7 3", "4 4 4", "5", "9 9"]
    combined = CombinedReward((ToolCallingReward(names=("correctness",)), Judge(fail_on="5")))
    columns = {"ground_truth": [GT_CALL] * 8}
    whole = score_batch(combined, ["p"] * 8, responses, columns, on_error="min", num_workers=workers)
    scorer = StreamScorer(combined, 8, on_error="min", num_workers=workers)
    for first in (6, 2, 0, 4):  # groups of 2, completed out of order
        scorer.add(first, ["p"] * 2, responses[first : first + 2], {"ground_truth": [GT_CALL] * 2})
    parts = scorer.result()
    np.testing.assert_array_equal(parts.rewards, whole.rewards)
    np.testing.assert_array_equal(parts.failed, whole.failed)
    assert parts.first_error == whole.first_error and "rollout 2" in parts.first_error


def test_a_part_starts_scoring_before_the_rest_arrives_and_every_row_must_arrive():
    started = threading.Event()

    def reward(prompts, responses, columns):
        started.set()
        return [[1.0] for _ in responses]

    reward.names = ("r",)
    scorer = StreamScorer(reward, 4)
    scorer.add(0, ["p"] * 2, ["a", "b"], {})
    assert started.wait(5)  # on a worker thread, while the caller goes on
    with pytest.raises(ValueError, match="outside the 4 or were added before"):
        scorer.add(1, ["p"] * 2, ["b", "c"], {})
    with pytest.raises(ValueError, match="response 2 of the 4 was never added"):
        scorer.result()
    scorer.add(2, ["p"] * 2, ["c", "d"], {})
    np.testing.assert_array_equal(scorer.result().rewards, [[1.0]] * 4)


def test_parts_are_scored_one_after_another_without_the_caller_and_failures_reach_it():
    """One worker: the second part's call starts when the first ends, not at the caller's next `add`
    (the scorer's own thread drives the calls); a failure with on_error='raise' reaches `result`, and
    an `add` after it."""
    started = []

    def reward(prompts, responses, columns):
        started.append(responses[0])
        time.sleep(0.1)
        if "bad" in responses:
            raise RuntimeError("cannot score")
        return [[1.0] for _ in responses]

    reward.names = ("r",)
    scorer = StreamScorer(reward, 4)
    scorer.add(0, ["p"] * 2, ["a", "b"], {})
    scorer.add(2, ["p"] * 2, ["c", "d"], {})
    deadline = time.monotonic() + 5
    while len(started) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started == ["a", "c"]  # both ran while the caller only waited
    np.testing.assert_array_equal(scorer.result().rewards, [[1.0]] * 4)
    failing = StreamScorer(reward, 6)
    failing.add(0, ["p"] * 2, ["bad", "x"], {})
    failing._driver.join(timeout=30)  # the row-by-row retry fails the scoring: the thread stops
    with pytest.raises(RewardError, match="cannot score"):
        failing.add(2, ["p"] * 2, ["c", "d"], {})
    with pytest.raises(RewardError, match=r"rollout 0 \(response 'bad'\)"):
        failing.result()


def test_a_part_s_rewards_are_waited_for_while_the_rest_is_scored():
    """`StreamScorer.rewards_of` (dynamic sampling's refill decides a group by it): a part's rewards
    once its calls settle, as `result` gives them (a crash floored by on_error='min'), while later
    parts are still running; `result` of the first rows added when no more come; errors as `result`."""
    release = threading.Event()
    responses = ["1 2", "5 5", "4", "3 3 3"]
    judge = Judge(fail_on="5")

    def reward(prompts, responses, columns):
        if "4" in responses:
            assert release.wait(10)  # the second part's call hangs until the first part was read
        return judge(prompts, responses, columns)

    reward.names, reward.min_values = judge.names, judge.min_values
    scorer = StreamScorer(reward, 6, on_error="min", num_workers=2)
    scorer.add(0, ["p"] * 2, responses[:2], {})
    scorer.add(2, ["p"] * 2, responses[2:], {})
    np.testing.assert_array_equal(scorer.rewards_of(0, 2), [[2.0], [-1.0]])  # rollout 1 crashed: the minimum
    release.set()
    np.testing.assert_array_equal(scorer.rewards_of(2, 4), [[1.0], [3.0]])
    with pytest.raises(ValueError, match="were not all added"):
        scorer.rewards_of(4, 6)
    whole = scorer.result(4)
    np.testing.assert_array_equal(whole.rewards, [[2.0], [-1.0], [1.0], [3.0]])
    raising = StreamScorer(judge, 2)
    raising.add(0, ["p"] * 2, ["5", "x"], {})
    with pytest.raises(RewardError, match="judge crashed"):
        raising.rewards_of(0, 2)


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
        score_batch(judge, ["p"] * 6, responses, {}, on_error=on_error, num_workers=3).rewards


def test_invalid_value_inside_a_combined_reward_names_the_rollout_of_the_step():
    combined = CombinedReward((ToolCallingReward(names=("format",)), Judge(bad_on="6", bad="2.5")))
    responses = ["1", "2", "3", "4", "6", "8"]
    with pytest.raises(RewardOutputError, match=r"Judge, reward 'judge', rollout 4: returned '2\.5'"):
        score_batch(combined, ["p"] * 6, responses, {"ground_truth": [GT_CALL] * 6}, num_workers=2).rewards
    # Also when another rollout crashes the batch and scoring goes row by row.
    crashing = CombinedReward((Judge(names=("a",), fail_on="1"), Judge(bad_on="6", bad="2.5")))
    with pytest.raises(RewardOutputError, match=r"reward 'judge', rollout 4: returned '2\.5'"):
        score_batch(crashing, ["p"] * 6, responses, {}, on_error="min", num_workers=2).rewards


def test_wrong_shape_is_rejected():
    class Short:
        names = ("a", "b")

        def __call__(self, prompts, responses, columns):
            return np.zeros((len(responses), 1))

    with pytest.raises(RewardOutputError, match=r"Short: returned shape \(2, 1\).*expected \(2, 2\)"):
        score_batch(Short(), ["p", "p"], ["x", "y"], {}).rewards


@pytest.mark.parametrize("output", [np.array([["2.5"]] * 3), [[b"2.5"]] * 3, np.array([[2.5]] * 3, object).astype(str)])
def test_numbers_written_as_text_are_rejected_not_read(output):
    """A reward that returns "2.5" (in a list, or as a NumPy string array) is a bug, not 2.5."""

    class Text:
        names = ("judge",)
        min_values = (0.0,)

        def __call__(self, prompts, responses, columns):
            return output

    for on_error in ("raise", "min"):
        with pytest.raises(RewardOutputError, match=r"reward 'judge', rollout 0: returned .*2\.5"):
            score_batch(Text(), ["p"] * 3, ["a", "b", "c"], {}, on_error=on_error).rewards


def test_failures_are_counted_per_reward_and_floor_only_the_failing_function():
    """on_error='min': the failing function's columns of the failed rollouts get its minimum and are
    marked failed; the other function of a CombinedReward keeps its scores; the first error names
    the function and the rollout."""
    combined = CombinedReward((ToolCallingReward(names=("format",)), Judge(fail_on="5")))
    responses = ["1 2", GOOD, "5 5", "8", "5", GOOD]
    scores = score_batch(combined, ["p"] * 6, responses, {"ground_truth": [GT_CALL] * 6}, on_error="min",
                         num_workers=2)
    assert scores.failed.shape == scores.rewards.shape == (6, 2)
    np.testing.assert_array_equal(scores.failed[:, 0], [False] * 6)
    np.testing.assert_array_equal(scores.failed[:, 1], [False, False, True, False, True, False])
    np.testing.assert_array_equal(scores.rewards[:, 0], [0, 1, 0, 0, 0, 1])  # format still scored
    np.testing.assert_array_equal(scores.rewards[:, 1], [2, len(GOOD.split()), -1, 1, -1, len(GOOD.split())])
    assert scores.first_error == "reward function Judge failed on rollout 2: RuntimeError: judge crashed"
    clean = score_batch(combined, ["p"] * 2, ["1", GOOD], {"ground_truth": [GT_CALL] * 2}, on_error="min")
    assert clean.first_error is None and not clean.failed.any()


@dataclasses.dataclass
class Hangs:
    """K=1: hangs (until ``release`` is set, at most 60 s) on a batch containing "hang", else 1."""

    release: threading.Event
    names: tuple = ("judge",)
    min_values: tuple = (0.0,)

    def __call__(self, prompts, responses, columns):
        if "hang" in responses:
            self.release.wait(60)
        return [[1.0]] * len(responses)


def test_a_hung_reward_fails_when_the_step_timeout_runs_out():
    """rewards.timeout_s bounds the step's scoring: the chunk that hangs fails (min) or stops the run
    naming the function, the rollouts and the timeout (raise); the other chunk is scored."""
    release = threading.Event()
    responses = ["a", "b", "hang", "c"]  # chunks (a, b) and (hang, c) with 2 workers
    try:
        start = time.monotonic()
        scores = score_batch(Hangs(release), ["p"] * 4, responses, {}, on_error="min", num_workers=2, timeout_s=0.5)
        assert time.monotonic() - start < 10
        np.testing.assert_array_equal(scores.rewards[:, 0], [1, 1, 0, 0])
        np.testing.assert_array_equal(scores.failed[:, 0], [False, False, True, True])
        assert "Hangs gave no result for rollouts 2-3 within config.rewards.timeout_s=0.5 s" in scores.first_error
        with pytest.raises(RewardTimeoutError, match=r"Hangs gave no result for rollouts 2-3 within "
                                                     r"config.rewards.timeout_s=0.5 s.*abandoned"):
            score_batch(Hangs(release), ["p"] * 4, responses, {}, num_workers=2, timeout_s=0.5)
        # A reward that returns within the timeout is scored as without one.
        in_time = score_batch(Hangs(release), ["p"] * 2, ["a", "b"], {}, timeout_s=30).rewards
        np.testing.assert_array_equal(in_time, [[1], [1]])
    finally:
        release.set()


def test_check_failures_stops_naming_step_rewards_limit_and_first_error():
    failed = np.zeros((3, 2, 2), bool)
    failed[0, :, 1] = True  # reward "b" failed on both rollouts of prompt 0
    failed[2, :, 0] = True  # prompt 2 is a filler prompt: not counted
    valid = np.array([True, True, False])
    shares = failed_fraction(failed, valid)
    np.testing.assert_array_equal(shares, [0.0, 0.5])
    check_failures(shares, ("a", "b"), 0.5, step=7, first_error="x")  # at the limit: goes on
    with pytest.raises(RewardFailuresError, match=r"^step 7: reward 'b' \(50%\) failed on more than "
                                                  r"config.rewards.max_failed_fraction=0.1 .*first error: boom"):
        check_failures(shares, ("a", "b"), 0.1, step=7, first_error="boom")
    with pytest.raises(RewardFailuresError, match=r"rewards 'a' \(100%\), 'b' \(100%\)"):
        check_failures(np.ones(2), ("a", "b"), 0.99, step=1, first_error="boom")


def test_abstained_fraction_counts_valid_rollouts_per_reward():
    nan = np.nan
    rewards = np.array([[[1, nan], [nan, nan]], [[0, 0], [0, nan]], [[nan, nan], [nan, nan]]], np.float32)
    np.testing.assert_allclose(abstained_fraction(rewards), [3 / 6, 5 / 6])
    np.testing.assert_allclose(abstained_fraction(rewards, np.array([True, True, False])), [1 / 4, 3 / 4])
    np.testing.assert_array_equal(abstained_fraction(rewards, np.zeros(3, bool)), [0.0, 0.0])


# ---------------------------------------------------------------- end to end


SAMPLING = SamplingConfig(max_new_tokens=5, temperature=1.0, top_p=1.0, top_k=0)  # config.sampling


def _prompt_set(num_prompts: int) -> PromptSet:
    """``num_prompts`` random 4-token prompts with a ground-truth column."""
    rng = np.random.default_rng(0)
    return PromptSet(texts=[f"p{i}" for i in range(num_prompts)],
                     token_ids=[list(rng.integers(3, 48, size=4)) for _ in range(num_prompts)],
                     columns={"ground_truth": ["x"] * num_prompts})


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
    num_prompts, group = 4, 8
    prompts = _prompt_set(num_prompts)
    model = Decoder(CONFIG, rngs=nnx.Rngs(0))
    valid = np.array([True, True, True, False])
    settings = RolloutSettings(num_generations=group, sampling=SAMPLING, eos_token_ids=(1,), pad_token_id=0,
                               prompt_length=8, num_workers=2)
    out = collect_rollouts(model, prompts, DigitTokenizer(), reward_fn, settings, rng=jax.random.PRNGKey(3),
                           valid=valid)

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


def test_failed_rollouts_reach_the_step_metrics():
    """collect_rollouts counts the failed rollouts per reward over the valid prompts; the trainer's
    host metrics log them as reward_failed/<name>."""
    judge = Judge(fail_on="7", abstain_on="never")
    reward_fn = CombinedReward((Judge(names=("length",), abstain_on="never"), judge))
    num_prompts, group = 4, 8
    prompts = _prompt_set(num_prompts)
    valid = np.array([True, True, True, False])
    settings = RolloutSettings(num_generations=group, sampling=SAMPLING, eos_token_ids=(1,), pad_token_id=0,
                               prompt_length=8, num_workers=2, on_error="min")
    out = collect_rollouts(Decoder(CONFIG, rngs=nnx.Rngs(0)), prompts, DigitTokenizer(), reward_fn, settings,
                           rng=jax.random.PRNGKey(3), valid=valid)
    crashed = np.array(["7" in r.split() for r in out.responses]).reshape(num_prompts, group)
    assert 0 < crashed[valid].sum() < crashed[valid].size  # the seed gives both kinds
    np.testing.assert_allclose(out.failed, [0.0, crashed[valid].mean()])
    assert re.fullmatch(r"reward function Judge failed on rollout \d+: RuntimeError: judge crashed", out.first_failure)
    metrics = host_metrics(out, {"rollout": 1.0}, ("length", "judge"))
    assert metrics["reward_failed/length"] == 0.0
    assert metrics["reward_failed/judge"] == pytest.approx(crashed[valid].mean(), rel=1e-6)


def test_repeat_columns_is_prompt_major():
    assert repeat_columns({"gt": ["a", "b"]}, 3) == {"gt": ["a", "a", "a", "b", "b", "b"]}


class DownBackend:
    """A reward whose backend is down: every call raises (a connection error)."""

    def __init__(self, names, **_options):
        self.names, self.min_values = tuple(names), (0.0,) * len(names)

    def __call__(self, prompts, responses, columns):
        raise ConnectionError("reward server unreachable")


@pytest.mark.slow
def test_a_run_whose_reward_backend_is_down_stops_at_the_first_step(tmp_path, monkeypatch):
    """on_error='min' no longer hides a dead reward: more than rewards.max_failed_fraction of the
    step's rollouts failed, so the run stops before the update, naming the step, the rewards, the
    limit and the first error."""
    from gd2po_jax.rewards import base
    from gd2po_jax.jobs.train import train_and_evaluate
    from tests.fakes import tiny_config

    monkeypatch.setattr(base, "_REWARD_KINDS", dict(base._REWARD_KINDS))
    base.register_reward_kind("down_backend")(DownBackend)
    config = tiny_config(sft__enabled=False, rewards__kind="down_backend", rewards__on_error="min",
                         eval__split="none")
    with pytest.raises(RewardFailuresError, match=r"^step 1: rewards 'correctness' \(100%\), 'format' \(100%\), "
                                                  r"'length' \(100%\) failed on more than config\.rewards\."
                                                  r"max_failed_fraction=0\.1 .*first error: reward function "
                                                  r"DownBackend failed on rollout 0: ConnectionError"):
        train_and_evaluate(as_run_config(config), tmp_path, progress=False)
    assert not (tmp_path / "checkpoints" / "1").exists()


# ---------------------------------------------------------------- side by side, deadlines per call, what may not pass silently


@dataclasses.dataclass
class Meets:
    """K=1: every call waits (at most 10 s) until ``barrier.parties`` calls are in flight at once; 1 then."""

    barrier: threading.Barrier
    names: tuple = ("meets",)

    def __call__(self, prompts, responses, columns):
        self.barrier.wait(10)
        return [[1.0]] * len(responses)


def test_the_functions_of_a_combined_reward_run_side_by_side_up_to_num_workers():
    """Three functions that each wait for the other two (a barrier): scored with num_workers=3, one chunk
    each, all in flight at once (one after another, the first would wait 10 s and break the barrier)."""
    barrier = threading.Barrier(3)
    combined = CombinedReward(tuple(Meets(barrier, names=(f"m{i}",)) for i in range(3)))
    scores = score_batch(combined, ["p"] * 4, ["a", "b", "c", "d"], {}, num_workers=3)
    np.testing.assert_array_equal(scores.rewards, np.ones((4, 3)))
    barrier.reset()
    calls = []

    class Counts(Meets):
        def __call__(self, prompts, responses, columns):
            calls.append(len(responses))
            return [[1.0]] * len(responses)

    counted = CombinedReward(tuple(Counts(barrier, names=(f"c{i}",)) for i in range(2)))
    score_batch(counted, ["p"] * 4, ["a", "b", "c", "d"], {}, num_workers=4)
    assert calls == [2, 2, 2, 2]  # 4 workers dealt out: 2 chunks of each function


@dataclasses.dataclass
class Exits:
    """K=1: raises ``error`` (a BaseException) on every call."""

    error: BaseException
    names: tuple = ("exits",)
    min_values: tuple = (0.0,)

    def __call__(self, prompts, responses, columns):
        raise self.error


@pytest.mark.parametrize("error, shown", [(SystemExit(3), "SystemExit(3)"), (KeyboardInterrupt(), "KeyboardInterrupt()"),
                                          (GeneratorExit(), "GeneratorExit()")])
@pytest.mark.parametrize("on_error", ["raise", "min", "abstain"])
def test_sys_exit_or_any_base_exception_in_a_reward_is_one_line_naming_it(error, shown, on_error):
    with pytest.raises(RewardError, match=rf"^reward function Exits raised {re.escape(shown)} on rollouts 0-1: .*stops "
                                          r"the run here$") as caught:
        score_batch(Exits(error), ["p"] * 2, ["a", "b"], {}, on_error=on_error)
    assert "\n" not in str(caught.value)


@dataclasses.dataclass
class Blocks:
    """K=1: every call waits on ``release`` (at most 30 s); counts its calls."""

    release: threading.Event
    names: tuple = ("blocks",)
    min_values: tuple = (0.0,)
    calls: list = dataclasses.field(default_factory=list)

    def __call__(self, prompts, responses, columns):
        self.calls.append(len(responses))
        self.release.wait(30)
        return [[1.0]] * len(responses)


def test_a_reward_that_hangs_every_step_holds_its_threads_not_one_more_per_step():
    """Issue 63 #10: abandoned calls are bounded: a function whose abandoned call still runs is not called
    again (its rollouts fail at once, naming why), and the pool replaces the stuck thread once."""
    release = threading.Event()
    hangs = Blocks(release)
    combined = CombinedReward((hangs, Judge()))
    try:
        score_batch(combined, ["p"] * 4, ["1", "2", "3", "4"], {}, on_error="abstain", num_workers=2, timeout_s=0.2)
        before = threading.active_count()
        for _ in range(8):
            scores = score_batch(combined, ["p"] * 4, ["1", "2", "3", "4"], {}, on_error="abstain", num_workers=2,
                                 timeout_s=0.2)
            assert scores.failed[:, 0].all() and not scores.failed[:, 1].any()
            np.testing.assert_array_equal(scores.rewards[:, 1], [1, 1, 1, 1])  # the other function is scored
        assert hangs.calls == [4]  # called on the first step only
        assert "was not called for rollouts 0-3: its call on an earlier batch (rollouts 0-3) gave no result in time" \
            in scores.first_error
        assert threading.active_count() <= before
        with pytest.raises(RewardTimeoutError, match=r"not called .* still running\. Fix the reward, or set "
                                                     r"config\.rewards\.on_error to 'min'"):
            score_batch(combined, ["p"] * 4, ["1", "2", "3", "4"], {}, num_workers=2, timeout_s=0.2)
    finally:
        release.set()
    deadline = time.monotonic() + 10
    while abandoned_calls() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert abandoned_calls() == 0  # the call returned at last: the function may be called again
    assert score_batch(hangs, ["p"], ["1"], {}, timeout_s=5).rewards.tolist() == [[1.0]]


class Sleeps:
    """An async function behind the batch interface: K=1, awaits ``seconds`` per call (cancellable)."""

    names = ("sleeps",)
    is_async = True

    def __init__(self, seconds: float, timeout_s: float | None = None):
        self.seconds, self.timeout_s, self.cancelled = seconds, timeout_s, threading.Event()

    def __call__(self, prompts, responses, columns):
        raise AssertionError("the scorer awaits acall")

    async def acall(self, prompts, responses, columns):
        import asyncio

        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return np.ones((len(responses), 1))


def test_an_async_call_past_its_own_timeout_fails_and_is_cancelled():
    """A function's own timeout_s bounds each call (the step's deadline is longer); an async call is
    cancelled at its next await, so nothing of it keeps running."""
    slow = Sleeps(60, timeout_s=0.2)
    scores = score_batch(slow, ["p"] * 2, ["a", "b"], {}, on_error="abstain", timeout_s=30)
    assert scores.failed.all() and np.isnan(scores.rewards).all()
    assert "Sleeps gave no result for rollouts 0-1 within its timeout_s=0.2 s per call" in scores.first_error
    assert slow.cancelled.wait(5)
    fast = Sleeps(0.0, timeout_s=5)
    assert score_batch(fast, ["p"] * 3, ["a", "b", "c"], {}, num_workers=3).rewards.tolist() == [[1.0]] * 3


def test_advice_that_can_be_followed_and_on_error_min_without_a_minimum_is_one_line():
    """Issue 62 #5: a failure's advice suggests 'min' only with what it needs (min_value); 'min' without
    a minimum is one line before any scoring, not a traceback."""

    class NoMinimum:
        names = ("judge",)

        def __call__(self, prompts, responses, columns):
            raise RuntimeError("judge crashed")

    with pytest.raises(RewardError, match=r"failed on rollout 0 .*Fix the reward, or set config\.rewards\.on_error to "
                                          r"'abstain' \(leave such rollouts unscored\), or to 'min' with a min_value"):
        score_batch(NoMinimum(), ["p"] * 2, ["a", "b"], {})
    with pytest.raises(RewardMinimumError, match=r"^on_error='min' needs a minimum of reward function NoMinimum .*"
                                                 r"min_value.*'abstain'"):
        score_batch(NoMinimum(), ["p"] * 2, ["a", "b"], {}, on_error="min")
    abstained = score_batch(NoMinimum(), ["p"] * 2, ["a", "b"], {}, on_error="abstain")
    assert abstained.failed.all() and np.isnan(abstained.rewards).all()


def test_the_failure_limit_names_the_mode_the_failures_were_handled_by():
    with pytest.raises(RewardFailuresError, match=r"failed on more than .*=0\.1 of the rollouts \(left unscored, "
                                                  r"on_error='abstain'\); first error: boom"):
        check_failures(np.array([0.5]), ("judge",), 0.1, step=2, first_error="boom", modes=("abstain",))
    with pytest.raises(RewardFailuresError, match=r"\(scored as the minimum, on_error='min'\)"):
        check_failures(np.array([0.5]), ("judge",), 0.1, step=2, first_error="boom")
    assert failure_modes(CombinedReward((ToolCallingReward(names=("format", "length")), Judge())), "abstain") == (
        "abstain", "abstain", "abstain")
