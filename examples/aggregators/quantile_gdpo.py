"""A multi-reward aggregator of your own: GDPO with each reward normalized by its quantile in the group.

In the spirit of RDPO (arXiv 2605.13641, proposed to TRL as a ``multi_objective_aggregation`` mode):
instead of GDPO's z-score ``(r - mean) / std`` per reward and group, each reward is replaced by its
mid-rank quantile among the group's present values, centred to [-1, 1]::

    q[p, g, k] = (#{h: r[p, h, k] < r[p, g, k]} + (#{h: r[p, h, k] = r[p, g, k]} - 1) / 2) / (n - 1)
    u[p, g, k] = 2 q - 1          (0 for a group whose values are all equal, or with fewer than 2)
    S = sum_k w_k u_k;             A = batch_normalize(S)        (GDPO's batch step, rl.batch_norm)

so a reward's scale and outliers do not matter (any increasing transform of a reward gives the same
advantages), and every reward counts for the same spread in each group. Missing rewards (NaN) and
padded prompts move nothing, as in the built-in methods.

Use it with ``--config.rl.algorithm=examples/aggregators/quantile_gdpo.py:quantile_gdpo`` (or any copy
of this file): `gd2po_jax.rl.advantages` imports it and calls it inside the jitted step, with the
statistics every method shares (`RewardSignals`), the eligible rollouts and the options.
"""

import jax
import jax.numpy as jnp

from gd2po_jax.rl.advantages import AdvantageOptions, RewardSignals, batch_normalize


def group_quantiles(rewards: jax.Array, present: jax.Array) -> jax.Array:
    """[P, G, K] -> [P, G, K] u in [-1, 1]: each present value's centred mid-rank quantile in its group
    (axis 1) among the present values; 0 where absent or where the group has fewer than two values."""
    mine, theirs = rewards[:, :, None, :], rewards[:, None, :, :]  # [P, G, 1, K], [P, 1, G, K]
    counted = present[:, None, :, :]  # the other rollout's value is present
    below = jnp.sum(counted & (theirs < mine), axis=2)  # [P, G, K]
    equal = jnp.sum(counted & (theirs == mine), axis=2)  # itself included
    count = jnp.sum(present, axis=1, keepdims=True)  # [P, 1, K]
    quantile = (below + (equal - 1) / 2) / jnp.maximum(count - 1, 1)
    return jnp.where(present & (count >= 2), 2.0 * quantile - 1.0, 0.0)


def quantile_gdpo(s: RewardSignals, eligible: jax.Array, o: AdvantageOptions) -> tuple[jax.Array, jax.Array]:
    """Keep every eligible rollout; advantages: GDPO's batch step over the weighted sum of the rewards'
    group quantiles (the module docstring)."""
    summed = jnp.sum(group_quantiles(s.rewards, s.present) * s.weights, axis=-1)  # [P, G]
    return eligible, batch_normalize(summed, eligible, s.lengths, mode=o.batch_norm, eps=o.batch_eps)
