"""Tests of gd2po_jax.models.logprobs: log-probs and entropy from logits, chunked from hidden states, of a
model (tied and untied heads), the compute-dtype merge and the reference policy's function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gd2po_jax.models import load_pretrained
from gd2po_jax.models.logprobs import (
    LOGITS_GRADS,
    chunked_token_logprobs,
    completion_logprobs,
    merge_model,
    reference_logprobs_fn,
    token_entropy,
    token_logprobs,
    unembedding,
)
from tests.fakes import logits_of, ragged_batch, random_normal, tiny_checkpoint
from tests.tolerances import ulps


def test_token_logprobs_and_entropy_match_log_softmax():
    logits = random_normal((2, 5, 11), 0, scale=3.0)
    targets = jnp.asarray(np.random.default_rng(1).integers(0, 11, size=(2, 5)))
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    expected = np.take_along_axis(np.asarray(log_probs), np.asarray(targets)[..., None], -1)[..., 0]
    np.testing.assert_allclose(token_logprobs(logits, targets), expected, atol=ulps(expected, 4))
    expected_entropy = -np.sum(np.exp(log_probs) * log_probs, axis=-1)
    np.testing.assert_allclose(token_entropy(logits), expected_entropy, atol=1e-5)
    # bf16 logits are promoted: the result is float32 and close to the float32 computation.
    low = token_logprobs(logits.astype(jnp.bfloat16), targets)
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(low, expected, atol=0.1)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 64])
def test_chunked_logprobs_equal_full_and_have_same_gradient(chunk_size):
    hidden = random_normal((2, 7, 8), 2)
    projection = random_normal((8, 13), 3)
    targets = jnp.asarray(np.random.default_rng(4).integers(0, 13, size=(2, 7)))

    def full(hidden, projection):
        logits = hidden @ projection
        return token_logprobs(logits, targets), token_entropy(logits)

    def chunked(hidden, projection):
        return chunked_token_logprobs(hidden, projection, targets, chunk_size=chunk_size, with_entropy=True)

    (logp_full, ent_full), (logp_chunk, ent_chunk) = full(hidden, projection), chunked(hidden, projection)
    np.testing.assert_allclose(logp_chunk, logp_full, atol=1e-5)
    np.testing.assert_allclose(ent_chunk, ent_full, atol=1e-5)
    objective = lambda fn: lambda h, u: jnp.sum(fn(h, u)[0] * 0.3 + fn(h, u)[1])  # noqa: E731
    grads_full = jax.grad(objective(full), argnums=(0, 1))(hidden, projection)
    grads_chunk = jax.grad(objective(chunked), argnums=(0, 1))(hidden, projection)
    for got, want in zip(grads_chunk, grads_full):
        np.testing.assert_allclose(got, want, atol=1e-4)
    logp_only, entropy = chunked_token_logprobs(hidden, projection, targets, chunk_size=chunk_size)
    assert entropy is None
    np.testing.assert_allclose(logp_only, logp_full, atol=1e-5)


def _head_values_and_grads(logits_grad: str, dtype, temperature: float):
    """An objective of `chunked_token_logprobs` (log-probs and entropy, each with its own weights) at
    ``dtype``, its value and gradients in hidden and projection (float32 inputs)."""
    hidden, projection = random_normal((3, 10, 16), 5), random_normal((16, 50), 6, scale=0.5)
    targets = jnp.asarray(np.random.default_rng(7).integers(0, 50, size=(3, 10)))
    weights = random_normal((2, 3, 10), 8)

    def objective(hidden, projection):
        logp, entropy = chunked_token_logprobs(hidden.astype(dtype), projection.astype(dtype), targets, chunk_size=4,
                                               with_entropy=True, temperature=temperature, logits_grad=logits_grad)
        return jnp.sum(logp * weights[0]) + jnp.sum(entropy * weights[1])

    return jax.jit(jax.value_and_grad(objective, argnums=(0, 1)))(hidden, projection)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_heads_compute_dtype_backward_is_autodiffs_in_float32(temperature):
    """`head_logprobs`'s backward (the logits' gradient from the saved logsumexp, cast to the
    compute dtype, a no-op here) gives autodiff's gradients to float32 rounding."""
    want_value, want = _head_values_and_grads("float32", jnp.float32, temperature)
    got_value, got = _head_values_and_grads("compute", jnp.float32, temperature)
    assert float(got_value) == pytest.approx(float(want_value), abs=ulps(want_value, 4))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=ulps(w, 16))


def test_the_heads_bfloat16_backward_is_within_bfloat16_rounding_of_float32():
    """In bfloat16 ("auto" takes the compute-dtype backward there) the gradients are within a few
    bfloat16 roundings (2^-8 each) of the float32 ones, as close as autodiff's own bfloat16 ones."""
    _, want = _head_values_and_grads("float32", jnp.float32, 1.0)
    _, autodiff = _head_values_and_grads("float32", jnp.bfloat16, 1.0)
    _, got = _head_values_and_grads("auto", jnp.bfloat16, 1.0)
    for g, a, w in zip(got, autodiff, want):
        assert g.dtype == jnp.float32  # the inputs' dtype (the cast is inside)
        error = float(jnp.linalg.norm(g - w) / jnp.linalg.norm(w))
        assert error < 4 * 2.0**-8, error
        assert error < 2 * float(jnp.linalg.norm(a - w) / jnp.linalg.norm(w)) + 2.0**-8
    with pytest.raises(ValueError, match="logits_grad"):
        chunked_token_logprobs(jnp.zeros((1, 2, 4)), jnp.zeros((4, 5)), jnp.zeros((1, 2), jnp.int32), logits_grad="x")
    assert "auto" in LOGITS_GRADS


@pytest.mark.parametrize("tie", [True, False])
def test_completion_logprobs_equal_log_softmax_of_the_models_logits(tie):
    path, _ = tiny_checkpoint("qwen2", tie)
    model = load_pretrained(path)
    ids, mask = ragged_batch()
    logits = logits_of(model, ids, mask)  # [B, T, V] of the full forward pass
    num_completion = ids.shape[1] - 5  # the tokens after position 5, each given everything before
    logp, entropy = nnx.jit(lambda m, i, a: completion_logprobs(m, i, a, num_completion, chunk_size=3,
                                                                with_entropy=True))(model, ids, mask)
    log_probs = np.asarray(jax.nn.log_softmax(logits[:, 4:-1], axis=-1))
    expected = np.take_along_axis(log_probs, ids[:, 5:, None], axis=-1)[..., 0]
    np.testing.assert_allclose(np.asarray(logp), expected, atol=1e-5)
    np.testing.assert_allclose(np.asarray(entropy), -np.sum(np.exp(log_probs) * log_probs, -1), atol=1e-4)
    # The head: the transposed embedding when tied, lm_head otherwise.
    head = model.embed[...].T if tie else model.lm_head[...]
    np.testing.assert_array_equal(np.asarray(unembedding(model)), np.asarray(head))


@pytest.mark.parametrize("temperature", [0.5, 0.7])
def test_logprobs_at_a_temperature_are_verls_log_softmax_of_scaled_logits(temperature):
    # verl divides the logits by the rollout temperature for the old, new and reference log-probs
    # (and the entropy): log_softmax(logits / T).
    path, _ = tiny_checkpoint("qwen2", True)
    model = load_pretrained(path)
    ids, mask = ragged_batch()
    logits = logits_of(model, ids, mask)[:, 4:-1] / temperature
    log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    expected = np.take_along_axis(log_probs, ids[:, 5:, None], axis=-1)[..., 0]
    logp, entropy = nnx.jit(lambda m, i, a: completion_logprobs(
        m, i, a, ids.shape[1] - 5, chunk_size=3, with_entropy=True, temperature=temperature))(model, ids, mask)
    np.testing.assert_allclose(np.asarray(logp), expected, atol=ulps(expected, 64))
    np.testing.assert_allclose(np.asarray(entropy), -np.sum(np.exp(log_probs) * log_probs, -1), atol=1e-4)
    untempered, _ = completion_logprobs(model, ids, mask, ids.shape[1] - 5)
    assert np.abs(np.asarray(logp) - np.asarray(untempered)).max() > 0.1  # not the temperature-1 ones
    # The reference policy's log-probs take the same temperature.
    graphdef, params = nnx.split(model, nnx.Param)
    ref = reference_logprobs_fn(graphdef, "float32", temperature=temperature)(params, jnp.asarray(ids),
                                                                               jnp.asarray(mask), ids.shape[1] - 5)
    np.testing.assert_allclose(np.asarray(ref), expected, atol=ulps(expected, 64))


def test_merge_model_casts_to_the_compute_dtype_and_grads_reach_the_master_weights():
    path, _ = tiny_checkpoint("qwen2", True)
    graphdef, params = nnx.split(load_pretrained(path), nnx.Param)
    ids, mask = ragged_batch()
    low = merge_model(graphdef, params, "bfloat16")
    assert {x.dtype for x in jax.tree.leaves(nnx.state(low, nnx.Param))} == {jnp.dtype(jnp.bfloat16)}

    def loss(params):
        model = merge_model(graphdef, params, "bfloat16")
        return -jnp.mean(completion_logprobs(model, ids, mask, 4)[0])

    grads = jax.grad(loss)(params)
    assert {x.dtype for x in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    assert float(jnp.abs(grads["embed"][...]).max()) > 0


def test_reference_logprobs_fn_is_the_cast_models_completion_logprobs():
    path, _ = tiny_checkpoint("llama3", False)
    graphdef, params = nnx.split(load_pretrained(path), nnx.Param)
    ids, mask = (jnp.asarray(x) for x in ragged_batch())
    got = reference_logprobs_fn(graphdef, "float32", chunk_size=5)(params, ids, mask, 6)
    want, _ = completion_logprobs(merge_model(graphdef, params, "float32"), ids, mask, 6, chunk_size=5)
    assert got.shape == (ids.shape[0], 6) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    low = reference_logprobs_fn(graphdef, "bfloat16")(params, ids, mask, 6)
    assert low.dtype == jnp.float32
    difference = np.abs(np.asarray(low) - np.asarray(got)).max()
    assert 1e-4 < difference < 0.2  # the compute dtype is honoured: bfloat16 rounding, no more
