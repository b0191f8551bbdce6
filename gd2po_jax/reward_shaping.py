"""Reward shaping on the reward tensor, before `compute_advantages`.

These act on the raw rewards ``[..., K]`` (``[P, G, K]`` in the step, ``[N, K]`` on the host) and
are pure jnp, so they can run inside the jitted step or on host arrays alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp


def resolve_reward_weights(
    reward_names: Sequence[str], weights: Mapping[str, float] | Sequence[float] | None
) -> jax.Array:
    """[K] float32 weights in the order of ``reward_names``.

    Args:
      reward_names: the K reward names, in the order of the reward tensor's last axis.
      weights: None (all ones, the official setting), a sequence of K floats, or a mapping from
        reward name to weight (rewards it does not name get 1).

    Raises:
      ValueError: a sequence of the wrong length, or a mapping that names an unknown reward.
    """
    names = list(reward_names)
    if weights is None:
        return jnp.ones((len(names),), jnp.float32)
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise ValueError(f"reward weights name unknown rewards {unknown}; the rewards are {names}")
        return jnp.asarray([float(weights.get(name, 1.0)) for name in names], jnp.float32)
    values = [float(w) for w in weights]
    if len(values) != len(names):
        raise ValueError(
            f"reward weights has {len(values)} entries but there are {len(names)} rewards {names}"
        )
    return jnp.asarray(values, jnp.float32)


def condition_reward(
    rewards: jax.Array,
    target: int,
    condition: int,
    threshold: float | jax.Array,
    otherwise: float = 0.0,
) -> jax.Array:
    """Make reward ``target`` count only where reward ``condition`` reaches ``threshold``.

    The GDPO paper's conditioned length reward: the length reward is granted only when the
    correctness reward is at its maximum (``threshold=3.0`` for the ToolRL correctness), so the
    policy cannot collect it by thinking longer while answering wrongly. Missing (NaN) conditions
    leave the target missing.

    Args:
      rewards: [..., K] float.
      target: index of the reward to condition.
      condition: index of the reward that must reach the threshold.
      threshold: the value ``rewards[..., condition]`` must be >= to.
      otherwise: the value the target takes where the condition fails.

    Returns:
      [..., K], a copy of ``rewards`` with column ``target`` conditioned.
    """
    num_rewards = rewards.shape[-1]
    for name, index in (("target", target), ("condition", condition)):
        if not -num_rewards <= index < num_rewards:
            raise ValueError(f"{name} index {index} out of range for K = {num_rewards} rewards")
    condition_values = rewards[..., condition]
    met = condition_values >= threshold
    conditioned = jnp.where(met, rewards[..., target], otherwise)
    conditioned = jnp.where(jnp.isnan(condition_values), jnp.nan, conditioned)
    return rewards.at[..., target].set(conditioned.astype(rewards.dtype))
