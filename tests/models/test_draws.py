"""Per-row draws: `row_uniforms` is `jax.random.uniform` of `row_keys`' keys, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gd2po_jax.models.draws import inverse_cdf, row_keys, row_uniforms


def _by_keys(rng, rows, positions):
    return np.asarray(jax.vmap(lambda key: jax.random.uniform(key, ()))(row_keys(rng, rows, positions)))


@pytest.mark.parametrize("seed", [0, 7, 2**31 - 1])
def test_row_uniforms_equal_the_uniforms_of_the_row_keys(seed):
    generator = np.random.default_rng(seed)
    rows = jnp.asarray(generator.integers(0, 2**31 - 1, 512), jnp.int32)
    positions = jnp.asarray(generator.integers(0, 4096, 512), jnp.int32)
    for rng in (jax.random.key(seed), jax.random.PRNGKey(seed)):
        got = np.asarray(jax.jit(row_uniforms)(rng, rows, positions))
        np.testing.assert_array_equal(got, _by_keys(rng, rows, positions))
        assert got.dtype == np.float32 and got.min() >= 0 and got.max() < 1


def test_other_key_kinds_take_the_keys():
    rng = jax.random.key(3, impl="rbg")
    rows, positions = jnp.arange(8), jnp.arange(8)[::-1]
    np.testing.assert_array_equal(np.asarray(row_uniforms(rng, rows, positions)), _by_keys(rng, rows, positions))


def test_a_row_draw_depends_on_its_row_and_position_only():
    rng = jax.random.key(11)
    alone = row_uniforms(rng, jnp.asarray([5]), jnp.asarray([9]))
    among = row_uniforms(rng, jnp.asarray([1, 5, 2]), jnp.asarray([0, 9, 9]))
    assert float(alone[0]) == float(among[1])
    assert len({float(u) for u in among}) == 3


def test_inverse_cdf_never_picks_a_zero_weight():
    weights = jnp.asarray([[0.0, 1.0, 0.0, 2.0], [3.0, 0.0, 0.0, 0.0]])
    picks = jax.vmap(lambda u: inverse_cdf(weights, jnp.full((2,), u), block=2))(jnp.linspace(0, 0.999, 50))
    assert set(np.asarray(picks[:, 0]).tolist()) <= {1, 3}
    assert set(np.asarray(picks[:, 1]).tolist()) == {0}
