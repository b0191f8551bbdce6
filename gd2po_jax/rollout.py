"""From prompts to a `RolloutBatch`: sample on device, decode, score on the host.

The sampled tokens, masks and log-probs never leave the device; only the token ids are copied to
the host to be decoded into text for the reward functions, and the [P, G, K] rewards come back.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gd2po_jax.prompts import PromptSet
from gd2po_jax.rewards.base import RewardFunction, check_reward_output
from gd2po_jax.sampling import GenerateOutput, generate
from gd2po_jax.tokenization import decode_completions
from gd2po_jax.train_step import RolloutBatch

logger = logging.getLogger(__name__)


class RewardError(RuntimeError):
    """A reward function raised on a rollout; the message names the rollout and the exception."""


def reward_minimums(reward_fn: RewardFunction) -> np.ndarray:
    """[K] minimum of each reward, from the function's ``min_values`` (required for on_error=min)."""
    minimums = getattr(reward_fn, "min_values", None)
    if minimums is None:
        raise ValueError(
            f"config.rewards.on_error='min' needs the reward function {type(reward_fn).__name__} "
            "to declare min_values; use on_error='raise'"
        )
    return np.asarray(minimums, np.float32)


def _score_chunk(reward_fn, prompts, responses, columns, start, on_error) -> np.ndarray:
    """Scores rows ``start..`` together; on failure, row by row to find (or floor) the bad ones."""
    try:
        return check_reward_output(reward_fn, reward_fn(prompts, responses, columns), len(responses))
    except Exception:  # noqa: BLE001 - re-raised below with the rollout that failed
        pass
    rows = []
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        one = {name: values[i : i + 1] for name, values in columns.items()}
        try:
            rows.append(check_reward_output(reward_fn, reward_fn([prompt], [response], one), 1)[0])
        except Exception as err:  # noqa: BLE001
            if on_error != "min":
                raise RewardError(
                    f"reward function {type(reward_fn).__name__} failed on rollout {start + i} "
                    f"(response {response[:200]!r}): {type(err).__name__}: {err}. Fix the reward or "
                    "set config.rewards.on_error='min' to score such rollouts as the minimum"
                ) from err
            logger.warning("reward failed on rollout %d (scored as the minimum): %s", start + i, err)
            rows.append(reward_minimums(reward_fn))
    return np.stack(rows)


def score_rollouts(
    reward_fn: RewardFunction,
    prompts: list[str],
    responses: list[str],
    columns: dict[str, list[Any]],
    *,
    on_error: str = "raise",
    num_workers: int = 1,
) -> np.ndarray:
    """[N, K] float32 rewards of N responses, scored in ``num_workers`` parallel chunks."""
    if on_error == "min":
        reward_minimums(reward_fn)  # fail early, not on the first bad rollout
    n = len(responses)
    bounds = np.linspace(0, n, min(num_workers, n) + 1).astype(int)
    chunks = [
        (prompts[a:b], responses[a:b], {k: v[a:b] for k, v in columns.items()}, int(a))
        for a, b in zip(bounds[:-1], bounds[1:])
    ]
    if len(chunks) == 1:
        parts = [_score_chunk(reward_fn, *chunks[0], on_error)]
    else:
        with concurrent.futures.ThreadPoolExecutor(len(chunks)) as pool:
            parts = list(pool.map(lambda c: _score_chunk(reward_fn, *c, on_error), chunks))
    return np.concatenate(parts).astype(np.float32)


@dataclasses.dataclass
class Rollouts:
    """One step's rollouts: the device batch for the update, plus host-side texts for logging."""

    batch: RolloutBatch
    responses: list[str]
    rewards: np.ndarray  # [P, G, K]
    truncated: np.ndarray  # [P * G] bool, no EOS within max_new_tokens
    generated_tokens: int
    sampling_seconds: float  # generation, until the tokens are on the host
    reward_seconds: float  # decoding and scoring


def repeat_columns(columns: dict[str, list[Any]], times: int) -> dict[str, list[Any]]:
    """Each value repeated ``times`` in place (prompt-major rollout order)."""
    return {name: [v for v in values for _ in range(times)] for name, values in columns.items()}


def collect_rollouts(
    model,
    prompt_set: PromptSet,
    tokenizer,
    reward_fn: RewardFunction,
    *,
    num_generations: int,
    sampling,
    eos_token_ids: list[int],
    pad_token_id: int,
    prompt_length: int,
    rng: jax.Array,
    on_error: str = "raise",
    num_workers: int = 1,
    valid: np.ndarray | None = None,
    prompts_per_call: int = 0,
) -> Rollouts:
    """Sample ``num_generations`` completions of every prompt, decode and score them.

    Args:
      model: the policy `Decoder` to sample from.
      prompt_set: P prompts.
      sampling: ``config.sampling`` (max_new_tokens, temperature, top_p, top_k).
      prompt_length: padded prompt length Lp (fixed for a run: one compiled program).
      valid: [P] bool, False for filler prompts of a partly filled batch.
      prompts_per_call: sample this many prompts (x G rollouts) per sampler call, to bound the KV
        cache of large steps; 0 (or at least P) samples the whole step at once.
    """
    num_prompts = len(prompt_set)
    start = time.perf_counter()
    chunk = min(prompts_per_call, num_prompts) or num_prompts
    if num_prompts % chunk:
        raise ValueError(
            f"config.sampling.prompts_per_call={chunk} must divide the {num_prompts} prompts of a step"
        )
    parts = [
        generate(
            model, prompt_set.token_ids[i : i + chunk], max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
            eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
            rng=rng if chunk == num_prompts else jax.random.fold_in(rng, i // chunk),
            num_samples=num_generations, prompt_length=prompt_length,
        )
        for i in range(0, num_prompts, chunk)
    ]
    out: GenerateOutput = parts[0] if len(parts) == 1 else jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)
    tokens, lengths, finished = jax.device_get((out.tokens, out.lengths, out.finished))
    sampled = time.perf_counter()
    responses = decode_completions(tokenizer, tokens, lengths)
    prompts = [t for t in prompt_set.texts for _ in range(num_generations)]
    rewards = score_rollouts(
        reward_fn, prompts, responses, repeat_columns(prompt_set.columns, num_generations),
        on_error=on_error, num_workers=num_workers,
    ).reshape(num_prompts, num_generations, -1)
    scored = time.perf_counter()
    valid = np.ones(num_prompts, bool) if valid is None else np.asarray(valid, bool)
    batch = rollout_batch(out, jnp.asarray(rewards), jnp.asarray(valid))
    return Rollouts(batch=batch, responses=responses, rewards=rewards, truncated=~np.asarray(finished),
                    generated_tokens=int(np.sum(lengths)), sampling_seconds=sampled - start,
                    reward_seconds=scored - sampled)


def rollout_batch(out: GenerateOutput, rewards: jax.Array, valid: jax.Array,
                  ref_logp: jax.Array | None = None) -> RolloutBatch:
    """A `RolloutBatch` from sampler output (device arrays stay on device)."""
    max_new = out.tokens.shape[1]
    response_mask = jnp.arange(max_new)[None, :] < out.lengths[:, None]
    return RolloutBatch(
        input_ids=jnp.concatenate([out.prompt_tokens, out.tokens], axis=1).astype(jnp.int32),
        attention_mask=jnp.concatenate(
            [out.prompt_mask.astype(bool), jnp.ones(out.tokens.shape, bool)], axis=1
        ),
        response_mask=response_mask,
        old_logp=out.logprobs,
        ref_logp=jnp.zeros_like(out.logprobs) if ref_logp is None else ref_logp,
        rewards=rewards.astype(jnp.float32),
        valid=valid,
    )
