"""Tests of gd2po_jax.rl.rollout: chunked sampling, reward scoring and its error handling."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gd2po_jax.config import SamplingConfig
from gd2po_jax.data.prompts import PromptSet
from gd2po_jax.data.tokenization import decode_completions
from gd2po_jax.models import Decoder
from gd2po_jax.models.sampling import generate
from gd2po_jax.rewards.base import RESPONSE_IDS
from gd2po_jax.rewards.scoring import RewardError, score_batch
from gd2po_jax.rl.micro_batches import verl_update_layout
from gd2po_jax.rl.rollout import RolloutSettings, collect_rollouts
from tests.fakes import DigitTokenizer, tiny_model_config

CONFIG = tiny_model_config(vocab_size=48)


@dataclasses.dataclass
class CountReward:
    """K=2: number of tokens, and whether the response mentions the ground truth token."""

    names: tuple = ("count", "hit")
    min_values: tuple = (0.0, 0.0)
    fail_on: str | None = None

    def __call__(self, prompts, responses, columns):
        out = []
        for response, truth in zip(responses, columns["ground_truth"]):
            if self.fail_on is not None and self.fail_on in response.split():
                raise RuntimeError("cannot score this")
            out.append([len(response.split()), float(truth in response.split())])
        return np.asarray(out, np.float32)


SAMPLING = SamplingConfig(max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=0)  # config.sampling


def settings(**changes) -> RolloutSettings:
    """3 rollouts of at most 6 tokens per prompt, EOS 1, padding 0, prompts padded to 16, with ``changes``."""
    return RolloutSettings(**({"num_generations": 3, "sampling": SAMPLING, "eos_token_ids": (1,), "pad_token_id": 0,
                               "prompt_length": 16} | changes))


def _prompts(count):
    rng = np.random.default_rng(0)
    ids = [list(rng.integers(3, 48, size=int(rng.integers(2, 7)))) for _ in range(count)]
    return PromptSet(texts=[f"p{i}" for i in range(count)], token_ids=ids,
                     columns={"ground_truth": [str(i % 5 + 3) for i in range(count)]})


@pytest.mark.parametrize("per_call", [0, 2])
def test_collect_rollouts_shapes_and_chunking(per_call):
    model = Decoder(CONFIG, rngs=nnx.Rngs(0))
    out = collect_rollouts(model, _prompts(4), DigitTokenizer(), CountReward(), settings(prompts_per_call=per_call),
                           rng=jax.random.PRNGKey(1))
    batch = out.batch
    assert batch.input_ids.shape == (12, 16 + 6)
    assert batch.rewards.shape == (4, 3, 2)
    lengths = np.asarray(jnp.sum(batch.response_mask, axis=1))
    # Reward "count" is the decoded length: rollouts and rewards are aligned row by row.
    np.testing.assert_array_equal(out.rewards[..., 0].reshape(-1), lengths)
    assert out.generated_tokens == lengths.sum()
    assert len(out.responses) == 12
    with pytest.raises(ValueError, match="prompts_per_call=3 must divide the 4 prompts"):
        collect_rollouts(model, _prompts(4), DigitTokenizer(), CountReward(), settings(prompts_per_call=3),
                         rng=jax.random.PRNGKey(1))


@dataclasses.dataclass
class SampledIdsReward:
    """K=1: the sum of the sampled token ids the rollout gives the reward (``columns[RESPONSE_IDS]``);
    its step metrics count its calls."""

    names: tuple = ("ids",)
    calls: int = 0

    def __call__(self, prompts, responses, columns):
        self.calls += 1
        return np.array([[sum(ids)] for ids in columns[RESPONSE_IDS]], np.float32)

    def step_metrics(self):
        calls, self.calls = self.calls, 0
        return {"ids_reward/calls": calls}


def test_rewards_get_the_sampled_ids_and_their_step_metrics_come_back():
    model = Decoder(CONFIG, rngs=nnx.Rngs(0))
    out = collect_rollouts(model, _prompts(4), DigitTokenizer(), SampledIdsReward(), settings(),
                           rng=jax.random.PRNGKey(1))
    completions = np.asarray(out.batch.input_ids)[:, 16:] * np.asarray(out.batch.response_mask)  # EOS included
    np.testing.assert_array_equal(out.rewards.reshape(-1), completions.sum(axis=1))
    assert out.reward_metrics == {"ids_reward/calls": 4.0}  # one call per group, as each completes
    whole = collect_rollouts(model, _prompts(4), DigitTokenizer(), SampledIdsReward(), settings(score_groups=False),
                             rng=jax.random.PRNGKey(1))
    assert whole.reward_metrics == {"ids_reward/calls": 1.0}  # rewards.score_groups=False: the batch at once
    np.testing.assert_array_equal(whole.rewards, out.rewards)
    lock_step = dataclasses.replace(SAMPLING, engine=False)  # groups handed over after the decode
    static = collect_rollouts(model, _prompts(4), DigitTokenizer(), SampledIdsReward(), settings(sampling=lock_step),
                              rng=jax.random.PRNGKey(1))
    assert static.reward_metrics == {"ids_reward/calls": 4.0}
    completions = np.asarray(static.batch.input_ids)[:, 16:] * np.asarray(static.batch.response_mask)
    np.testing.assert_array_equal(static.rewards.reshape(-1), completions.sum(axis=1))


def test_each_group_is_scored_while_the_engine_decodes_the_rest(monkeypatch):
    """`GroupScoring`: a group's reward call starts as soon as its rows are done, before the engine's
    last chunk; the rewards and responses equal those of the whole batch scored after the decode."""
    from gd2po_jax.models import engine

    dispatched = []
    chunk_fn = engine.chunk_fn
    monkeypatch.setattr(engine, "chunk_fn", lambda *a, **k: (dispatched.append(1), chunk_fn(*a, **k))[1])
    chunks_at_call = []

    def reward(prompts, responses, columns):
        chunks_at_call.append(len(dispatched))
        return [[float(len(r))] for r in responses]

    reward.names = ("length",)
    model = Decoder(CONFIG, rngs=nnx.Rngs(0))
    step = settings(sampling=dataclasses.replace(SAMPLING, max_new_tokens=12, engine_slots=4, engine_chunk=2))
    out = collect_rollouts(model, _prompts(6), DigitTokenizer(), reward, step, rng=jax.random.PRNGKey(3))
    assert len(chunks_at_call) == 6 and min(chunks_at_call) < len(dispatched)  # scored while decoding
    tokens, lengths = np.asarray(out.batch.input_ids)[:, 16:], np.asarray(out.batch.response_mask).sum(axis=1)
    assert out.responses == decode_completions(DigitTokenizer(), tokens, lengths)  # in row order
    np.testing.assert_array_equal(out.rewards.reshape(-1), [len(r) for r in out.responses])


def test_old_logprobs_are_at_the_logprob_temperature():
    model = Decoder(CONFIG, rngs=nnx.Rngs(0))
    key = jax.random.PRNGKey(1)
    plain = collect_rollouts(model, _prompts(2), DigitTokenizer(), CountReward(), settings(num_generations=2),
                             rng=key).batch
    tempered = collect_rollouts(model, _prompts(2), DigitTokenizer(), CountReward(),
                                settings(num_generations=2, logprob_temperature=0.5), rng=key).batch
    np.testing.assert_array_equal(tempered.input_ids, plain.input_ids)  # the same tokens
    expected = generate(model, _prompts(2).token_ids, max_new_tokens=6, eos_token_ids=[1], pad_token_id=0,
                        rng=jax.random.PRNGKey(1), num_samples=2, prompt_length=16, logprob_temperature=0.5)
    np.testing.assert_array_equal(tempered.old_logp, expected.logprobs)
    assert np.abs(np.asarray(tempered.old_logp - plain.old_logp)).max() > 0.1


def test_rollouts_carry_verls_layout_of_the_update_when_asked():
    model = Decoder(CONFIG, rngs=nnx.Rngs(0))
    key = jax.random.PRNGKey(1)
    plain = collect_rollouts(model, _prompts(4), DigitTokenizer(), CountReward(), settings(), rng=key).batch
    assert plain.row_order is None and plain.segment_ids is None
    laid_out = collect_rollouts(model, _prompts(4), DigitTokenizer(), CountReward(),
                                settings(micro_batch_max_tokens=24, micro_batch_ranks=2, num_minibatches=2),
                                rng=key).batch
    # The layout of the rows' tokens (attention mask: prompt + response, EOS included), as verl counts them.
    tokens = np.asarray(laid_out.attention_mask[:, :16]).sum(-1) + np.asarray(laid_out.response_mask).sum(-1)
    expected = verl_update_layout(tokens, num_minibatches=2, max_tokens=24, ranks=2)
    np.testing.assert_array_equal(laid_out.row_order, expected.row_order)
    np.testing.assert_array_equal(laid_out.segment_ids, expected.segment_ids)
    assert laid_out.row_order.dtype == laid_out.segment_ids.dtype == jnp.int32
    assert int(np.max(laid_out.segment_ids)) >= 1  # several micro-batches
    np.testing.assert_array_equal(laid_out.input_ids, plain.input_ids)  # the same rollouts


def test_scores_errors_and_workers():
    responses = ["3 4", "5", "7 7 7", "4 9"]
    columns = {"ground_truth": ["3", "3", "7", "9"]}
    prompts = ["a"] * 4
    one = score_batch(CountReward(), prompts, responses, columns).rewards
    np.testing.assert_array_equal(one, [[2, 1], [1, 0], [3, 1], [2, 1]])
    np.testing.assert_array_equal(score_batch(CountReward(), prompts, responses, columns, num_workers=3).rewards, one)
    with pytest.raises(RewardError, match=r"failed on rollout 2 \(response '7 7 7'\).*cannot score this"):
        score_batch(CountReward(fail_on="7"), prompts, responses, columns, num_workers=2).rewards
    floored = score_batch(CountReward(fail_on="7"), prompts, responses, columns, on_error="min").rewards
    np.testing.assert_array_equal(floored, [[2, 1], [1, 0], [0, 0], [2, 1]])


def test_the_engines_layers_setting_reaches_the_sampler(monkeypatch):
    from gd2po_jax.rl import rollout

    seen = []
    real_generate = rollout.generate

    def spy(*args, **kwargs):
        seen.append(kwargs["scan_layers"])
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(rollout, "generate", spy)
    model = Decoder(CONFIG, rngs=nnx.Rngs(0))
    batches = {}
    for layers in ("scan", "loop", "auto"):
        sampling = dataclasses.replace(SAMPLING, engine_layers=layers)
        batches[layers] = collect_rollouts(model, _prompts(2), DigitTokenizer(), CountReward(),
                                           settings(num_generations=2, sampling=sampling), rng=jax.random.PRNGKey(2)).batch
    assert seen == [True, False, None]
    np.testing.assert_array_equal(batches["scan"].input_ids, batches["loop"].input_ids)
    np.testing.assert_allclose(np.asarray(batches["scan"].old_logp), np.asarray(batches["loop"].old_logp), atol=1e-5)
