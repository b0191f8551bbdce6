"""examples/aggregators/quantile_gdpo.py, an aggregator of your own (``rl.algorithm=path.py:callable``):
its quantiles by hand, its invariance to any increasing transform of a reward, and that it runs through
`compute_advantages` under jit like the built-in methods."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gd2po_jax.rl.advantages import compute_advantages
from tests.fakes import REPO

PATH = f"{REPO / 'examples' / 'aggregators' / 'quantile_gdpo.py'}:quantile_gdpo"


def _example():
    from gd2po_jax.runtime.imports import import_object

    module_fn, _ = import_object(PATH.replace(":quantile_gdpo", ":group_quantiles"), "test")
    return module_fn


def test_group_quantiles_by_hand():
    rewards = jnp.asarray([[[1.0], [5.0], [3.0], [3.0]], [[2.0], [2.0], [2.0], [2.0]]])  # [P=2, G=4, K=1]
    present = jnp.asarray([[[True], [True], [True], [True]], [[True], [True], [True], [False]]])
    quantiles = np.asarray(_example()(rewards, present))[..., 0]
    # group 0: ranks 0, 3, 1.5, 1.5 of n - 1 = 3 -> 2q - 1
    np.testing.assert_allclose(quantiles[0], [-1.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(quantiles[1], [0.0, 0.0, 0.0, 0.0])  # all equal; the absent one 0


def test_any_increasing_transform_of_a_reward_gives_the_same_advantages():
    """GDPO's z-scores move with an outlier; the quantiles do not (the point of the rank normalization)."""
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(3, 6, 2)).astype(np.float32)
    lengths = jnp.asarray(rng.integers(1, 9, size=(3, 6)))
    transformed = rewards.copy()
    transformed[..., 1] = np.exp(3 * rewards[..., 1]) * 1000.0
    ours = [compute_advantages(jnp.asarray(r), lengths, PATH).advantages for r in (rewards, transformed)]
    np.testing.assert_allclose(ours[0], ours[1], atol=1e-6)
    gdpo = [compute_advantages(jnp.asarray(r), lengths, "gdpo").advantages for r in (rewards, transformed)]
    assert not np.allclose(gdpo[0], gdpo[1], atol=1e-3)


def test_it_runs_jitted_in_the_step_like_a_built_in():
    rewards = jnp.asarray(np.random.default_rng(1).normal(size=(2, 4, 3)), jnp.float32)
    lengths = jnp.full((2, 4), 5)
    valid = jnp.asarray([True, False])
    eager = compute_advantages(rewards, lengths, PATH, valid=valid)
    jitted = jax.jit(lambda r, n, v: compute_advantages(r, n, PATH, valid=v))(rewards, lengths, valid)
    np.testing.assert_allclose(eager.advantages, jitted.advantages, atol=1e-6)
    assert bool(jnp.all(eager.keep[0])) and not bool(jnp.any(eager.keep[1]))  # the padded prompt: nothing
    np.testing.assert_array_equal(eager.advantages[1], 0.0)
    assert abs(float(jnp.sum(eager.advantages[0] * 5))) < 1e-4  # whitened over the kept tokens: mean 0
