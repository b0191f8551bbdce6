"""gd2po_jax.models.decode_step: the feature-major decode step computes what the decoder's cache
path computes, for every family and option (biases, per-head q/k norms, untied head, bf16, a mesh)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gd2po_jax.models import Decoder, init_cache, load_pretrained
from gd2po_jax.models.decode_step import decode_step, decode_weights
from gd2po_jax.models.logprobs import merge_model
from gd2po_jax.runtime.sharding import make_mesh
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
        first, (c,) = decode_step(m.config, weights, t, (c,))
        second, (c,) = decode_step(m.config, weights, jnp.argmax(first, 0).astype(jnp.int32), (c,))
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


def test_a_cache_in_segments_gives_the_one_cache_steps():
    """The sampler's layout: the prompt's cache (exactly its slots), then chunks of the completion's
    cache; two steps write the first chunk, two more a second one, attending over all of them."""
    directory, _ = tiny_checkpoint("qwen2", tie=True)
    model = load_pretrained(directory, dtype=jnp.float32)
    ids, mask = ragged_batch(2)
    n, lp = ids.shape
    dtype = model.embed[...].dtype

    def prefill(m, size):
        return nnx.jit(lambda m: m(jnp.asarray(ids), jnp.asarray(mask), cache=init_cache(m.config, n, size, dtype))[1])(m)

    @functools.partial(nnx.jit, static_argnums=3)
    def four_steps(m, caches, tokens, chunked):
        weights, logits = decode_weights(m), []
        for step in range(4):
            if chunked and step in (0, 2):  # a new chunk of two slots
                caches = (*caches, init_cache(m.config, n, 2, dtype))
            out, caches = decode_step(m.config, weights, tokens, caches)
            logits.append(out.T)
            tokens = jnp.argmax(out, 0).astype(jnp.int32)
        return jnp.stack(logits), caches

    tokens = jnp.asarray(np.random.RandomState(2).randint(0, model.config.vocab_size, n), jnp.int32)
    want, (one,) = four_steps(model, (prefill(model, lp + 4),), tokens, False)
    got, segments = four_steps(model, (prefill(model, lp),), tokens, True)
    np.testing.assert_allclose(got, want, rtol=0, atol=ulps(want, 64))
    assert [s.max_length for s in segments] == [lp, 2, 2] and int(segments[-1].index) == 2
    valid = np.concatenate([s.valid for s in segments], 1)
    np.testing.assert_array_equal(valid, one.valid)
    # The same keys and values, slot for slot, where a token is (a left-pad slot's key depends on
    # the cache size, through its fully masked attention row, and is never attended).
    for i in range(model.config.num_layers):
        keys = np.concatenate([s.keys[i] for s in segments], -1).transpose(0, 3, 1, 2)[valid]
        values = np.concatenate([s.values[i] for s in segments], 2).transpose(0, 2, 1, 3)[valid]
        want_keys, want_values = (np.asarray(one.keys[i]).transpose(0, 3, 1, 2)[valid],
                                  np.asarray(one.values[i]).transpose(0, 2, 1, 3)[valid])
        np.testing.assert_allclose(keys, want_keys, rtol=0, atol=ulps(want_keys, 64))
        np.testing.assert_allclose(values, want_values, rtol=0, atol=ulps(want_values, 64))


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
