"""gd2po_jax.models.decode_step: the feature-major decode step computes what the decoder's cache
path computes, for every family and option (biases, per-head q/k norms, untied head, bf16, a mesh)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gd2po_jax.logprobs import merge_model
from gd2po_jax.models import Decoder, init_cache, load_pretrained
from gd2po_jax.models.decode_step import decode_step, decode_weights
from gd2po_jax.sharding import make_mesh
from tests.fakes import ragged_batch, tiny_checkpoint, tiny_model_config
from tests.tolerances import ulps


def _prefilled(model, seed=0):
    """(cache after a left-padded prompt batch, next tokens [N])."""
    ids, mask = ragged_batch(seed)
    cache = init_cache(model.config, ids.shape[0], ids.shape[1] + 4, model.embed[...].dtype)
    _, cache = nnx.jit(lambda m, i, a, c: m(i, a, cache=c))(model, jnp.asarray(ids), jnp.asarray(mask), cache)
    tokens = jnp.asarray(np.random.RandomState(seed).randint(0, model.config.vocab_size, ids.shape[0]), jnp.int32)
    return cache, tokens


def _two_ways(model, cache, tokens):
    """Logits [N, V] and caches of two consecutive steps, by the decoder's cache call and by decode_step."""
    @nnx.jit
    def reference(m, c, t):
        ones = jnp.ones((t.shape[0], 1), bool)
        first, c = m(t[:, None], ones, cache=c)
        second, c = m(jnp.argmax(first[:, 0], -1).astype(jnp.int32)[:, None], ones, cache=c)
        return jnp.stack([first[:, 0], second[:, 0]]), c

    @nnx.jit
    def stepwise(m, c, t):
        weights = decode_weights(m)
        first, c = decode_step(m.config, weights, t, c)
        second, c = decode_step(m.config, weights, jnp.argmax(first, 0).astype(jnp.int32), c)
        return jnp.stack([first.T, second.T]), c

    return reference(model, cache, tokens), stepwise(model, cache, tokens)


@pytest.mark.parametrize("family,tie", [("qwen2", True), ("qwen3", False), ("llama3", False)])
def test_decode_step_equals_the_decoder_cache_call(family, tie):
    directory, _ = tiny_checkpoint(family, tie=tie)
    model = load_pretrained(directory, dtype=jnp.float32)
    cache, tokens = _prefilled(model)
    (want, want_cache), (got, got_cache) = _two_ways(model, cache, tokens)
    np.testing.assert_allclose(got, want, rtol=0, atol=ulps(want, 64))
    for a, b in zip(jax.tree.leaves(got_cache), jax.tree.leaves(want_cache)):
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=0, atol=ulps(b, 64))
    assert int(got_cache.index) == int(cache.index) + 2


@pytest.mark.parametrize("options", [dict(o_bias=True, mlp_bias=True, qkv_bias=True),
                                     dict(qkv_bias=False, qk_norm=True, tie_word_embeddings=False)])
def test_decode_step_with_every_bias_and_norm(options):
    """Options no supported checkpoint family combines (Llama's attention_bias sets o_bias, its
    mlp_bias the MLP's): random nonzero weights so a missed bias or norm shows."""
    model = nnx.jit(lambda: Decoder(tiny_model_config(**options), rngs=nnx.Rngs(3)))()
    graphdef, state = nnx.split(model)
    state = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.key(x.size), x.shape), state)
    model = nnx.merge(graphdef, state)
    cache, tokens = _prefilled(model, seed=1)
    (want, _), (got, _) = _two_ways(model, cache, tokens)
    np.testing.assert_allclose(got, want, rtol=0, atol=ulps(want, 64))


def test_decode_step_in_bfloat16_and_on_a_mesh():
    directory, _ = tiny_checkpoint("qwen2", tie=True)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    master = load_pretrained(directory, dtype=jnp.float32, mesh=mesh)
    graphdef, state = nnx.split(master)
    model = merge_model(graphdef, state, jnp.bfloat16)
    cache, tokens = _prefilled(model)
    (want, _), (got, _) = _two_ways(model, cache, tokens)
    # bf16 activations: products rounded to 8 bits of mantissa in another order.
    bf16_eps = float(jnp.finfo(jnp.bfloat16).eps)
    want = np.asarray(want, np.float32)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=0, atol=16 * bf16_eps * np.max(np.abs(want)))


def test_a_score_model_body_cannot_decode():
    body = nnx.jit(lambda: Decoder(tiny_model_config(), rngs=nnx.Rngs(0), lm_head=False))()
    with pytest.raises(ValueError, match="lm_head=False"):
        decode_weights(body)
