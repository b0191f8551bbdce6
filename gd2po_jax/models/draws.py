"""Drawing tokens from logits, one key per row, and what the sampler and the engine share.

`sample_rows` draws token t of row r with one uniform, the one ``fold_in(fold_in(rng, r), t)`` gives
(`row_uniforms`): a row's completion does not depend on the rows decoded beside it, so the one-shot
sampler (`gd2po_jax.models.sampling`) and the rollout engine (`gd2po_jax.models.engine`) give the
same completions for the same seed.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.random import threefry2x32_p

from gd2po_jax.models.decoder import Decoder


def row_keys(rng: jax.Array, rows: jax.Array, positions: jax.Array) -> jax.Array:
    """``[R]`` keys ``fold_in(fold_in(rng, row), position)`` of rows ``[R]`` at token positions ``[R]``."""
    return jax.vmap(lambda row, position: jax.random.fold_in(jax.random.fold_in(rng, row), position))(rows, positions)


def row_uniforms(rng: jax.Array, rows: jax.Array, positions: jax.Array) -> jax.Array:
    """``[R]`` float32 in [0, 1): ``jax.random.uniform(k, ())`` for each key ``k`` of `row_keys`,
    bit for bit.

    For a threefry key (jax's default) the three hashes this takes (two ``fold_in``, one draw) are
    one threefry block applied three times in a loop, so the program holds one copy of it instead
    of three: the hash's rounds are most of a sampling step's compile time on XLA:CPU (the engine's
    chunk program: docs/speed.md#the-rollout-engine-issue-58). Other key kinds take `row_keys`.
    """
    if str(jax.random.key_impl(rng)) != "threefry2x32" or not getattr(jax.config, "jax_threefry_partitionable"):
        return jax.vmap(lambda key: jax.random.uniform(key, ()))(row_keys(rng, rows, positions))
    key = jax.random.key_data(rng)  # [2] uint32
    zeros = jnp.zeros(rows.shape, jnp.uint32)
    # Stage i hashes the counter pair (0, data[i]) under the previous stage's output: fold_in(rng,
    # row), fold_in(., position), then the draw's counter (0, 0).
    data = jnp.stack([rows.astype(jnp.uint32), positions.astype(jnp.uint32), zeros])  # [3, R]

    def stage(i, pair):
        return tuple(threefry2x32_p.bind(pair[0], pair[1], zeros, data[i]))

    first = (jnp.broadcast_to(key[0], rows.shape), jnp.broadcast_to(key[1], rows.shape))
    high, low = jax.lax.fori_loop(0, 3, stage, first)
    bits = high ^ low  # a 32-bit draw from the block's two words, as jax.random.bits makes it
    mantissa = jax.lax.bitcast_convert_type((bits >> 9) | jnp.uint32(0x3F800000), jnp.float32)  # [1, 2)
    return jnp.maximum(mantissa - 1.0, 0.0)


def nucleus_filter(sorted_logits: jax.Array, top_p: float) -> jax.Array:
    """Keeps the smallest prefix of descending ``sorted_logits [N, K]`` whose mass reaches top_p;
    the rest becomes -inf (the first token is always kept)."""
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    return jnp.where(mass_before < top_p, sorted_logits, -jnp.inf)


def categorical(rng: jax.Array, logits: jax.Array, block: int = 128) -> jax.Array:
    """One draw per row from ``softmax(logits [N, K])``; returns [N] int32 indices.

    Inverse-CDF sampling with a single uniform per row (`inverse_cdf`), so it costs O(K) instead of
    the K random numbers of Gumbel-max: on CPU, `jax.random.categorical` over a 12k vocabulary took
    longer than the model's LM head. Entries of -inf have probability 0 and are never drawn.
    """
    n = logits.shape[0]
    probs = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
    return inverse_cdf(probs, jax.random.uniform(rng, (n,)), block)


def inverse_cdf(weights: jax.Array, uniforms: jax.Array, block: int = 128) -> jax.Array:
    """The index where each row's cumulative ``weights [N, K]`` (>= 0, unnormalized) passes
    ``uniforms [N]`` (in [0, 1)) times the row's total: [N] int32.

    In two levels (block sums, then within the chosen block); a zero weight is never chosen.
    """
    n, k = weights.shape
    pad = -k % block
    probs = jnp.pad(weights, ((0, 0), (0, pad))).reshape(n, -1, block)
    block_mass = jnp.cumsum(jnp.sum(probs, axis=-1), axis=-1)  # [N, K/block]
    target = uniforms[:, None] * block_mass[:, -1:]
    block_idx = jnp.minimum(jnp.sum(block_mass <= target, axis=-1), block_mass.shape[1] - 1)
    before = jnp.take_along_axis(block_mass, block_idx[:, None], axis=-1)[:, 0]
    before = before - jnp.sum(jnp.take_along_axis(probs, block_idx[:, None, None], axis=1)[:, 0], axis=-1)
    inner = jnp.cumsum(jnp.take_along_axis(probs, block_idx[:, None, None], axis=1)[:, 0], axis=-1)
    inner_idx = jnp.sum(before[:, None] + inner <= target, axis=-1)
    # Round-off can push the index past the last non-zero entry of the block: step back onto it.
    row = jnp.take_along_axis(probs, block_idx[:, None, None], axis=1)[:, 0]
    last_nonzero = block - 1 - jnp.argmax(row[:, ::-1] > 0, axis=-1)
    inner_idx = jnp.minimum(inner_idx, last_nonzero)
    return (block_idx * block + inner_idx).astype(jnp.int32)


def sample_rows(logits: jax.Array, uniforms: jax.Array, params: Any) -> tuple[jax.Array, jax.Array]:
    """Draws one token per row from ``logits [N, V]`` (float32), row i by its own uniform
    ``uniforms[i]`` (`row_uniforms`; `inverse_cdf`), so a row's draw does not depend on the rows
    beside it.

    Returns (tokens [N] int32, logprobs [N] float32): ``log_softmax(logits /
    params.logprob_temperature)`` at the drawn tokens, without the filters. Top-k runs before top-p
    (`jax.lax.top_k`: no sort of the vocabulary when top_k is set); without filters, at the
    log-probs' temperature, the draw and the log-prob share one max and one sum.
    """
    vocab = logits.shape[-1]
    if params.temperature == 0:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    else:
        scaled = logits / params.temperature
        if 0 < params.top_k < vocab or params.top_p < 1:
            if 0 < params.top_k < vocab:
                values, order = jax.lax.top_k(scaled, params.top_k)
            else:
                order = jnp.argsort(-scaled, axis=-1)
                values = jnp.take_along_axis(scaled, order, axis=-1)
            if params.top_p < 1:
                values = nucleus_filter(values, params.top_p)
            weights = jnp.exp(values - values[:, :1])  # values descend: the first is the max
            choice = inverse_cdf(weights, uniforms)
            tokens = jnp.take_along_axis(order, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)
        else:
            peak = jnp.max(scaled, axis=-1, keepdims=True)
            weights = jnp.exp(scaled - peak)
            tokens = inverse_cdf(weights, uniforms)
            if params.temperature == params.logprob_temperature:
                total = jnp.sum(weights, axis=-1)
                picked = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0]
                return tokens, picked - peak[:, 0] - jnp.log(total)
    if params.logprob_temperature != 1.0:
        logits = logits / params.logprob_temperature
    logp = jax.nn.log_softmax(logits, axis=-1)
    return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]


def is_eos(tokens: jax.Array, eos_token_ids: tuple[int, ...]) -> jax.Array:
    if not eos_token_ids:
        return jnp.zeros(tokens.shape, bool)
    return jnp.any(tokens[:, None] == jnp.asarray(eos_token_ids, jnp.int32)[None, :], axis=-1)


def activation_dtype(model: Decoder) -> jnp.dtype:
    """The dtype the model computes its activations (hence keys and values) in: that of its
    parameters. After `gd2po_jax.models.logprobs.merge_model` it is the compute dtype, while ``model.dtype``
    still names the dtype the module was built with (the master weights')."""
    return model.embed[...].dtype
