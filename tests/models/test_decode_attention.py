"""gd2po_jax.models.decode_attention: the Pallas decode-attention kernel, run in Pallas's interpreter,
computes the engine's `_slot_attention` (prompt region by index, cache before write_at, own token);
its cache loop reads only written positions; it lowers to a Triton custom call for CUDA on a CPU host."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gd2po_jax.models.decode_attention import (
    cache_blocks,
    padded_query_rows,
    pallas_attention_supported,
    slot_decode_attention,
)
from gd2po_jax.models.engine import _slot_attention


def _inputs(seed, *, slots, kv, groups, hd, prompt_length, cache_length, regions, dtype=jnp.float32):
    """Random kernel arguments: left-padded regions (one with a single real token, one full), slots
    sharing regions, write_at cycling through 0, 1, mid, C - 1, C."""
    rs = np.random.RandomState(seed)

    def normal(*shape):
        return jnp.asarray(rs.randn(*shape), dtype)

    lengths = [prompt_length, 1, max(prompt_length // 2, 1)] + list(rs.randint(1, prompt_length + 1, regions))
    lengths = np.asarray(lengths[:regions])
    prompt_valid = jnp.asarray(np.arange(prompt_length)[None, :] >= prompt_length - lengths[:, None])
    cycle = [0, 1, cache_length // 2, cache_length - 1, cache_length]
    write_at = jnp.asarray([cycle[s % len(cycle)] for s in range(slots)], jnp.int32)
    return dict(
        q=normal(slots, kv, groups, hd),
        prompt_k=normal(regions, kv, hd, prompt_length),
        prompt_v=normal(regions, kv, prompt_length, hd),
        prompt_valid=prompt_valid,
        slot_region=jnp.asarray(np.arange(slots) % regions, jnp.int32),  # slots s and s + Q share a region
        cache_k=normal(slots, kv, hd, cache_length),
        cache_v=normal(slots, kv, cache_length, hd),
        write_at=write_at,
        own_k=normal(slots, kv, hd),
        own_v=normal(slots, kv, hd),
    )


def _reference(args, dtype=None):
    """The engine's XLA path: gathered regions, the whole cache masked, everything in q's dtype."""
    dtype = args["q"].dtype if dtype is None else dtype
    region = args["slot_region"]
    cache_length = args["cache_k"].shape[-1]
    before = jnp.arange(cache_length)[None, :] < args["write_at"][:, None]
    return _slot_attention(
        args["q"].astype(dtype),
        args["prompt_k"][region].astype(dtype),
        args["prompt_v"][region].astype(dtype),
        args["prompt_valid"][region],
        args["cache_k"].astype(dtype),
        args["cache_v"].astype(dtype),
        before,
        args["own_k"].astype(dtype),
        args["own_v"].astype(dtype),
    )


@functools.partial(jax.jit, static_argnames=("block_k",))
def _kernel(args, block_k):
    return slot_decode_attention(**args, block_k=block_k, interpret=True)


# (slots, kv heads, groups, head dim, prompt length, cache length, regions, block_k)
SHAPES = [
    (5, 2, 2, 16, 20, 37, 3, 16),  # Lp and C not multiples of the block; 5 slots cover every write_at case
    (5, 1, 7, 32, 16, 32, 2, 16),  # G = 7 (Qwen2.5-0.5B) padded to 16 rows; Lp, C multiples of the block
    (6, 2, 3, 16, 9, 70, 2, 32),  # the prompt shorter than one block; 3 cache blocks
    (3, 1, 20, 64, 24, 19, 2, 64),  # G = 20 padded to 32 rows; one block holds everything
]


def _shape_inputs(seed, shape, dtype=jnp.float32):
    slots, kv, groups, hd, lp, c, regions, _ = shape
    return _inputs(
        seed, slots=slots, kv=kv, groups=groups, hd=hd, prompt_length=lp, cache_length=c, regions=regions, dtype=dtype
    )


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_engine_attention_float32(shape):
    args = _shape_inputs(0, shape)
    out = _kernel(args, shape[-1])
    assert out.shape == args["q"].shape and out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), np.asarray(_reference(args)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_matches_engine_attention_bfloat16(shape):
    args = _shape_inputs(1, shape, jnp.bfloat16)
    out = _kernel(args, shape[-1])
    assert out.dtype == jnp.bfloat16
    got = np.asarray(out, np.float32)
    # Against the engine's bfloat16 path, and against float32 math on the same (bfloat16) inputs.
    np.testing.assert_allclose(got, np.asarray(_reference(args), np.float32), atol=3e-2, rtol=3e-2)
    np.testing.assert_allclose(got, np.asarray(_reference(args, jnp.float32)), atol=2e-2, rtol=2e-2)


def test_tables_and_caches_are_cast_to_the_query_dtype():
    """float32 tables and caches with bfloat16 queries: read as they are, cast in the kernel, as the
    engine casts them before its XLA path."""
    args = _inputs(2, slots=5, kv=2, groups=2, hd=16, prompt_length=20, cache_length=37, regions=3)
    args["q"] = args["q"].astype(jnp.bfloat16)
    out = _kernel(args, 16)
    expected = _reference(args, jnp.bfloat16)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(expected, np.float32), atol=3e-2, rtol=3e-2)


def test_layer_index_reads_stacked_tables_in_a_layer_scan():
    """``layer``: the stacked ``[L, ...]`` tables and caches, the layer chosen by a traced index (the
    layer scan's counter, as `scanned_slot_decode_step` would pass it), equal each layer's own call."""
    layers = [_shape_inputs(10 + i, SHAPES[0]) for i in range(3)]
    stacked = {name: jnp.stack([a[name] for a in layers]) for name in ("prompt_k", "prompt_v", "cache_k", "cache_v")}
    shared = {name: layers[0][name] for name in ("prompt_valid", "slot_region", "write_at")}  # the same at every layer

    @jax.jit
    def scanned(q, own_k, own_v):  # [L, ...] per-layer queries and own keys/values
        def step(carry, xs):
            layer, q, own_k, own_v = xs
            args = dict(shared, **stacked, q=q, own_k=own_k, own_v=own_v)
            return carry, slot_decode_attention(**args, layer=layer, block_k=16, interpret=True)

        xs = (jnp.arange(len(layers), dtype=jnp.int32), q, own_k, own_v)
        return jax.lax.scan(step, None, xs)[1]

    out = scanned(*(jnp.stack([a[name] for a in layers]) for name in ("q", "own_k", "own_v")))
    for i, args in enumerate(layers):
        args = dict(args, **shared)  # layer i's tables, queries and own keys and values
        np.testing.assert_allclose(np.asarray(out[i]), np.asarray(_reference(args)), atol=1e-5, rtol=1e-5)


def test_reads_no_unwritten_cache_position_nor_prompt_pad():
    """NaN in every cache position at or after write_at and in every prompt pad position: the kernel's
    output is the clean inputs' (the XLA path, which multiplies masked positions by 0, would give NaN);
    a slot with write_at > C (no row) reads all C positions and stays finite."""
    slots, c, lp = 6, 37, 20
    args = _inputs(3, slots=slots, kv=2, groups=2, hd=16, prompt_length=lp, cache_length=c, regions=3)
    args["write_at"] = jnp.asarray([0, 1, 16, 17, c - 1, c + 5], jnp.int32)
    clean = _kernel(args, 16)
    written = np.arange(c)[None, :] < np.asarray(args["write_at"])[:, None]  # [S, C]
    pad = ~np.asarray(args["prompt_valid"])  # [Q, Lp]
    poisoned = dict(
        args,
        cache_k=jnp.where(written[:, None, None, :], args["cache_k"], jnp.nan),
        cache_v=jnp.where(written[:, None, :, None], args["cache_v"], jnp.nan),
        prompt_k=jnp.where(pad[:, None, None, :], jnp.nan, args["prompt_k"]),
        prompt_v=jnp.where(pad[:, None, :, None], jnp.nan, args["prompt_v"]),
    )
    out = np.asarray(_kernel(poisoned, 16))
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out, np.asarray(clean))
    np.testing.assert_allclose(out[:-1], np.asarray(_reference(args))[:-1], atol=1e-5, rtol=1e-5)


def test_cache_loop_trip_count_follows_write_at():
    """The cache loop runs cdiv(min(write_at, C), block_k) blocks: a loop with a run-time trip count
    (a ``while`` in the kernel's jaxpr; the prompt's, of static length, is a ``scan``)."""
    write_at = jnp.asarray([-3, 0, 1, 16, 17, 40, 41, 1000], jnp.int32)
    np.testing.assert_array_equal(np.asarray(cache_blocks(write_at, 41, 16)), [0, 0, 1, 1, 2, 3, 3, 3])

    args = _inputs(4, slots=2, kv=1, groups=2, hd=16, prompt_length=20, cache_length=37, regions=2)
    jaxpr = jax.make_jaxpr(functools.partial(slot_decode_attention, block_k=16))(**args)
    [call] = [eqn for eqn in jaxpr.eqns if eqn.primitive.name == "pallas_call"]
    loops = [eqn.primitive.name for eqn in call.params["jaxpr"].eqns if eqn.primitive.name in ("while", "scan")]
    assert loops == ["scan", "while"]


def test_supported_shapes():
    assert padded_query_rows(1) == 16 and padded_query_rows(7) == 16 and padded_query_rows(20) == 32
    assert pallas_attention_supported(64, 7, jnp.bfloat16)
    assert pallas_attention_supported(128, 8, jnp.float32, block_k=32)
    assert not pallas_attention_supported(80, 7)  # not a power of two
    assert not pallas_attention_supported(8, 2)  # below Triton's 16
    assert not pallas_attention_supported(64, 7, block_k=48)
    assert not pallas_attention_supported(64, 100)  # 128 query rows
    assert not pallas_attention_supported(64, 7, jnp.float64)
    args = _inputs(5, slots=2, kv=1, groups=2, hd=8, prompt_length=4, cache_length=4, regions=1)
    with pytest.raises(ValueError, match="pallas_attention_supported"):
        slot_decode_attention(**args, interpret=True)


@pytest.mark.parametrize(
    "dtype, groups, hd, prompt_length, cache_length, block_k, layers",
    [
        (jnp.bfloat16, 7, 64, 256, 511, 64, 24),  # Qwen2.5-0.5B's heads, stacked layers
        (jnp.float32, 2, 128, 20, 37, 32, None),
        (jnp.bfloat16, 2, 16, 9, 70, 16, None),
    ],
)
def test_lowers_for_cuda_on_cpu(dtype, groups, hd, prompt_length, cache_length, block_k, layers):
    """Pallas's Triton lowering (block shapes, dtypes, the ops the kernel uses) runs on a CPU host:
    the kernel becomes Triton IR inside a ``__gpu$xla.gpu.triton`` custom call. Triton's own compile
    to PTX happens only on a GPU, so this does not check register or shared-memory limits."""
    slots, kv, regions = 8, 2, 4
    sd = jax.ShapeDtypeStruct
    stack = () if layers is None else (layers,)
    shapes = dict(
        q=sd((slots, kv, groups, hd), dtype),
        prompt_k=sd((*stack, regions, kv, hd, prompt_length), dtype),
        prompt_v=sd((*stack, regions, kv, prompt_length, hd), dtype),
        prompt_valid=sd((regions, prompt_length), jnp.bool_),
        slot_region=sd((slots,), jnp.int32),
        cache_k=sd((*stack, slots, kv, hd, cache_length), dtype),
        cache_v=sd((*stack, slots, kv, cache_length, hd), dtype),
        write_at=sd((slots,), jnp.int32),
        own_k=sd((slots, kv, hd), dtype),
        own_v=sd((slots, kv, hd), dtype),
    )
    if layers is not None:
        shapes["layer"] = sd((), jnp.int32)
    f = jax.jit(functools.partial(slot_decode_attention, block_k=block_k))
    text = f.trace(**shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert "__gpu$xla.gpu.triton" in text
    assert 'name = "slot_decode_attention"' in text
