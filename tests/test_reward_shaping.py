"""Tests of gd2po_jax.reward_shaping."""

import jax.numpy as jnp
import numpy as np
import pytest

from gd2po_jax.advantages import compute_advantages
from gd2po_jax.reward_shaping import condition_reward, resolve_reward_weights


def test_resolve_reward_weights():
    names = ["correctness", "format", "length"]
    np.testing.assert_array_equal(resolve_reward_weights(names, None), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(resolve_reward_weights(names, [2, 1, 0.5]), [2.0, 1.0, 0.5])
    np.testing.assert_array_equal(resolve_reward_weights(names, {"length": 0.25}), [1.0, 1.0, 0.25])
    with pytest.raises(ValueError, match=r"unknown rewards \['lenght'\]"):
        resolve_reward_weights(names, {"lenght": 1.0})
    with pytest.raises(ValueError, match="has 2 entries but there are 3 rewards"):
        resolve_reward_weights(names, [1.0, 2.0])


def test_condition_reward_grants_length_only_at_max_correctness():
    # [N, K] = (correctness, length)
    rewards = jnp.asarray([[3.0, 0.4], [1.5, 0.9], [-3.0, 1.0], [3.0, 0.0], [jnp.nan, 0.7]])
    shaped = condition_reward(rewards, target=1, condition=0, threshold=3.0)
    np.testing.assert_array_equal(shaped[:4, 1], np.float32([0.4, 0.0, 0.0, 0.0]))
    assert np.isnan(float(shaped[4, 1]))
    np.testing.assert_array_equal(shaped[:, 0], rewards[:, 0])  # the condition column is unchanged
    np.testing.assert_array_equal(rewards[1, 1], np.float32(0.9))  # no in-place change
    # Works on the [P, G, K] step tensor and changes the advantages accordingly.
    step = rewards[:4].reshape(1, 4, 2)
    before = compute_advantages(step, jnp.ones((1, 4), jnp.int32), "gdpo").reward_advantages
    after = compute_advantages(condition_reward(step, 1, 0, 3.0), jnp.ones((1, 4), jnp.int32), "gdpo")
    assert not np.allclose(before[..., 1], after.reward_advantages[..., 1])
    with pytest.raises(ValueError, match="target index 2 out of range for K = 2"):
        condition_reward(rewards, target=2, condition=0, threshold=3.0)
