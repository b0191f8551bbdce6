"""A Pallas GPU (Triton) kernel for the engine's decode attention: one query token per slot against
its prompt region and the filled part of its completion cache.

    out = slot_decode_attention(q, prompt_k, prompt_v, prompt_valid, slot_region,
                                cache_k, cache_v, write_at, own_k, own_v)     # [S, KV, G, hd]

What it reads. The XLA path of `gd2po_jax.models.engine.scanned_slot_decode_step` gathers each
slot's prompt region out of the region table (``prompt_k[slot_region]``: a copy of the region for
every one of its G rows, at every layer of every step) and then multiplies the query by all C
allocated positions of the slot's cache, masking the unwritten ones after the fact. Here each
program (one slot, one kv head) reads

* the prompt region straight out of the table, by the slot's region index (no gathered copy), in
  blocks over the Lp prompt positions, masked by ``prompt_valid``;
* its cache only up to ``write_at``: the cache loop runs ``cdiv(min(write_at, C), block_k)`` blocks,
  a trip count known only at run time, so a slot that has written 40 tokens reads one block of 64,
  not C positions;
* the new token's own key and value (not in the cache yet), one more position, always valid.

Why: a decode step computes one query per row, so its attention is a matrix-vector product per
(slot, kv head) whose time is the bytes it reads; on a GPU the step is near the memory-bandwidth
bound, and the bytes of masked positions and of the gathered regions are wasted reads and writes.

The math is `gd2po_jax.models.engine._slot_attention`'s: one softmax, scale ``hd ** -0.5``, over
(prompt region, cache positions before ``write_at``, own token), computed online (running max,
running sum, rescaled accumulator) in float32. The own token goes first, so the running max is a
real score from the start and a block with no valid position adds exactly nothing.

Shapes (S slots, Q regions, KV kv heads, G query heads per kv head, hd head dim, Lp prompt length,
C cache positions): q ``[S, KV, G, hd]``; prompt_k ``[Q, KV, hd, Lp]``; prompt_v ``[Q, KV, Lp, hd]``;
prompt_valid ``[Q, Lp]`` bool; slot_region ``[S]`` int32; cache_k ``[S, KV, hd, C]``; cache_v
``[S, KV, C, hd]``; write_at ``[S]`` int32; own_k, own_v ``[S, KV, hd]``. In the layer scan, pass
the stacked ``[L, ...]`` prompt tables and caches and the scan's layer index (``layer=``): the kernel
reads that layer in place, whereas a per-layer slice given to ``jax.lax.scan`` as ``xs`` is expected to
reach it as a copied buffer, a whole layer's cache every step.

Tiles. The grid is (slot, kv head); one program holds its G queries as a ``[R, hd]`` tile, R =
`padded_query_rows` (G rounded up to a power of two, at least 16: Triton tiles are powers of two and
its dot needs every dimension >= 16), with the padding rows loaded as zeros and never stored. The
scores and the value sums are ``tt.dot`` products (``[R, hd] @ [hd, B]``, ``[R, B] @ [B, hd]``) on
the tensor cores rather than broadcast-multiply-and-sum over a ``[R, hd, B]`` tensor, which would
hold R x hd x B values in registers; the padded rows cost arithmetic, not memory reads, and the
kernel is bound by the latter. Tails (Lp or C not a multiple of the block, prompt pads, unwritten
positions) are masked loads: nothing outside them is read, and no padding of the inputs is needed.
A key tile ``[hd, B]`` is hd rows C (or Lp) elements apart: when C is not a multiple of 8 (C = M - 1
= 511, say) the rows are not 16-byte aligned and Triton cannot use vector loads for them.

The engine picks this kernel by backend (GPU, where `pallas_attention_supported` holds) and keeps
the XLA path elsewhere; ``interpret=True`` runs the same kernel in Pallas's interpreter (the CPU
tests). It is lowered through Triton (``jax.experimental.pallas.triton``), not Mosaic GPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

MIN_DOT_DIM = 16
"""Triton's matrix product (``tt.dot``) needs every dimension of its operands to be at least 16."""

MAX_QUERY_ROWS = 64
"""The most query heads per kv head (after padding to a power of two) that one program holds: its
``[rows, hd]`` float32 accumulator lives in registers."""

DEFAULT_BLOCK_K = 64
"""Positions per block of the prompt and cache loops: a ``[hd, 64]`` key tile and a ``[64, hd]``
value tile (16 KiB each at hd 128 in bfloat16), small enough that a slot with few written tokens
reads little past them, large enough for whole-sector loads and a 16-row ``tt.dot``."""

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def padded_query_rows(groups: int) -> int:
    """The kernel's query-row count for ``groups`` query heads per kv head: the next power of two,
    at least `MIN_DOT_DIM` (Triton's dot needs M >= 16; Qwen2.5-0.5B has G = 7). The padding rows
    hold zeros and are never stored; the extra rows cost tensor-core work, not memory reads."""
    return max(MIN_DOT_DIM, 1 << max(groups - 1, 0).bit_length())


def pallas_attention_supported(head_dim: int, groups: int, dtype=jnp.bfloat16, block_k: int = DEFAULT_BLOCK_K) -> bool:
    """Whether `slot_decode_attention` applies: ``head_dim`` a power of two >= 16 (Triton tiles are
    powers of two and its dot needs K, N >= 16), ``groups`` query heads per kv head padding to at
    most `MAX_QUERY_ROWS` rows, ``block_k`` a power of two >= 16, and an activation ``dtype`` of
    float32, bfloat16 or float16. Otherwise the engine keeps its XLA path."""
    return (
        _is_power_of_two(head_dim)
        and head_dim >= MIN_DOT_DIM
        and 0 < groups
        and padded_query_rows(groups) <= MAX_QUERY_ROWS
        and _is_power_of_two(block_k)
        and block_k >= MIN_DOT_DIM
        and jnp.dtype(dtype) in SUPPORTED_DTYPES
    )


def cache_blocks(write_at: jax.Array, cache_length: int, block_k: int) -> jax.Array:
    """The cache loop's trip count: the blocks of ``block_k`` positions that hold the first
    ``min(write_at, cache_length)`` positions (0 for a slot that has written nothing)."""
    filled = jnp.clip(write_at, 0, cache_length)
    # filled >= 0, so lax.div's rounding toward zero is the floor (no sign fix-up in the kernel).
    return jax.lax.div(filled + (block_k - 1), jnp.asarray(block_k, filled.dtype))


def _matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a [M, K] @ b [K, N]`` accumulated in float32 (a ``tt.dot``). HIGHEST: float32 inputs are
    multiplied at IEEE precision (Triton's default for them is TF32, 10 mantissa bits); 16-bit
    inputs are unaffected."""
    dims = (((1,), (0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def _online_update(carry, scores, valid, values, value_dtype):
    """Folds one block of positions into the running softmax.

    carry: (acc [R, hd] float32 unnormalized output, row_max [R] float32, row_sum [R] float32);
    scores: [R, B] float32 (scaled); valid: [1, B] or [R, B] bool; values: [B, hd] (zeros where not
    valid). Invalid positions get weight exactly 0; ``row_max`` stays the max of valid scores only.
    """
    acc, row_max, row_sum = carry
    block_max = jnp.max(jnp.where(valid, scores, row_max[:, None]), axis=1)
    new_max = jnp.maximum(row_max, block_max)
    rescale = jnp.exp(row_max - new_max)
    weights = jnp.where(valid, jnp.exp(scores - new_max[:, None]), 0.0)  # [R, B]
    new_sum = row_sum * rescale + jnp.sum(weights, axis=1)
    new_acc = acc * rescale[:, None] + _matmul(weights.astype(value_dtype), values)
    return new_acc, new_max, new_sum


def _decode_kernel(
    q_ref,
    own_k_ref,
    own_v_ref,
    layer_ref,
    slot_region_ref,
    write_at_ref,
    prompt_valid_ref,
    prompt_k_ref,
    prompt_v_ref,
    cache_k_ref,
    cache_v_ref,
    out_ref,
    *,
    groups: int,
    block_k: int,
    prompt_length: int,
    cache_length: int,
):
    """One program: slot ``program_id(0)``, kv head ``program_id(1)``.

    q_ref, out_ref: [R, hd] blocks (R = `padded_query_rows`, rows >= G masked); own_k_ref,
    own_v_ref: [hd]; layer_ref: [1]; slot_region_ref, write_at_ref: [S]; prompt_valid_ref: [Q, Lp];
    prompt_k_ref: [L, Q, KV, hd, Lp]; prompt_v_ref: [L, Q, KV, Lp, hd]; cache_k_ref: [L, S, KV, hd, C];
    cache_v_ref: [L, S, KV, C, hd] (whole arrays: the layer and the region are data, read in the kernel).
    """
    rows, head_dim = q_ref.shape
    slot, head = pl.program_id(0), pl.program_id(1)
    compute_dtype = q_ref.dtype
    scale = head_dim**-0.5
    offsets = jnp.arange(block_k)
    row_mask = (jnp.arange(rows) < groups)[:, None]  # [R, 1]

    q = pltriton.load(q_ref, mask=row_mask, other=0)  # [R, hd]
    q_f32 = q.astype(jnp.float32)
    own_k = own_k_ref[...].astype(jnp.float32)  # [hd]
    own_v = own_v_ref[...].astype(compute_dtype).astype(jnp.float32)
    # The own token first: the running max starts at a real score, weight exp(0) = 1.
    row_max = jnp.sum(q_f32 * own_k[None, :], axis=1) * scale  # [R]
    row_sum = jnp.ones((rows,), jnp.float32)
    acc = jnp.broadcast_to(own_v[None, :], (rows, head_dim))

    # One indexer per load: the Triton lowering does not chain ``.at`` views.
    layer, region = layer_ref[0], slot_region_ref[slot]

    def fold(carry, keys, values, valid):
        """One block's keys [hd, B] and values [B, hd] (valid [B]) into the running softmax."""
        scores = _matmul(q, keys.astype(compute_dtype)) * scale  # [R, B]
        return _online_update(carry, scores, valid[None, :], values.astype(compute_dtype), compute_dtype)

    def prompt_block(i, carry):
        start = i * block_k
        in_range = start + offsets < prompt_length  # [B]
        valid = pltriton.load(prompt_valid_ref.at[region, pl.ds(start, block_k)], mask=in_range, other=False)
        # Pad positions are not read at all (their keys and values may hold anything).
        keys = pltriton.load(
            prompt_k_ref.at[layer, region, head, :, pl.ds(start, block_k)], mask=valid[None, :], other=0
        )  # [hd, B]
        values = pltriton.load(
            prompt_v_ref.at[layer, region, head, pl.ds(start, block_k), :], mask=valid[:, None], other=0
        )  # [B, hd]
        return fold(carry, keys, values, valid)

    carry = jax.lax.fori_loop(0, pl.cdiv(prompt_length, block_k), prompt_block, (acc, row_max, row_sum))

    filled = jnp.clip(write_at_ref[slot], 0, cache_length)

    def cache_block(i, carry):
        start = i * block_k
        written = start + offsets < filled  # [B]
        keys = pltriton.load(
            cache_k_ref.at[layer, slot, head, :, pl.ds(start, block_k)], mask=written[None, :], other=0
        )  # [hd, B]
        values = pltriton.load(
            cache_v_ref.at[layer, slot, head, pl.ds(start, block_k), :], mask=written[:, None], other=0
        )  # [B, hd]
        return fold(carry, keys, values, written)

    acc, _, row_sum = jax.lax.fori_loop(0, cache_blocks(filled, cache_length, block_k), cache_block, carry)
    out = acc / row_sum[:, None]
    pltriton.store(out_ref, out.astype(out_ref.dtype), mask=row_mask)


def slot_decode_attention(
    q: jax.Array,
    prompt_k: jax.Array,
    prompt_v: jax.Array,
    prompt_valid: jax.Array,
    slot_region: jax.Array,
    cache_k: jax.Array,
    cache_v: jax.Array,
    write_at: jax.Array,
    own_k: jax.Array,
    own_v: jax.Array,
    *,
    layer: jax.Array | int | None = None,
    block_k: int = DEFAULT_BLOCK_K,
    num_warps: int = 4,
    num_stages: int = 2,
    interpret: bool = False,
) -> jax.Array:
    """Attention of each slot's query over its prompt region, its cache before ``write_at`` and its
    own key and value, in one softmax (`_slot_attention` of the engine, without its gathers).

    Args:
      q: [S, KV, G, hd] queries in the activation dtype (float32, bfloat16 or float16).
      prompt_k: [Q, KV, hd, Lp]; prompt_v: [Q, KV, Lp, hd] the region table.
      prompt_valid: [Q, Lp] bool, the regions' real (non-pad) tokens, pads anywhere.
      slot_region: [S] int32 the region slot s reads.
      cache_k: [S, KV, hd, C]; cache_v: [S, KV, C, hd] the slots' completion caches.
      write_at: [S] int32 slot s attends to cache positions ``j < write_at[s]`` (clamped to [0, C];
        a slot with no row, write_at >= C, reads all C: its output is finite, not meaningful).
      own_k, own_v: [S, KV, hd] the new token's key and value, one more always-valid position.
      layer: None, or a layer index (an int32 scalar, e.g. the layer scan's counter): then prompt_k,
        prompt_v, cache_k and cache_v are the stacked ``[L, ...]`` arrays of every layer and the
        kernel reads layer ``layer`` in place. Inside ``jax.lax.scan`` this is the way to call it:
        a per-layer slice of a stacked array passed as the scan's ``xs`` is a dynamic slice that XLA
        is expected to materialize for a custom call (a copy of the whole layer's cache every step:
        not checked on a GPU yet), which is the read the kernel exists to avoid.
      block_k: positions per block of both loops, a power of two >= 16; Lp and C need not be
        multiples of it (the tail block's loads are masked).
      num_warps, num_stages: Triton's launch parameters (4 warps: one program's tiles are small).
      interpret: run the kernel in Pallas's interpreter (CPU tests) instead of compiling it.

    Keys and values are cast to q's dtype inside the kernel (as the engine casts its caches before
    the XLA path), scores and softmax are float32, the unnormalized probabilities are cast to q's
    dtype for the value products (float32 accumulation). Returns [S, KV, G, hd] in prompt_v's dtype.
    """
    slots, kv_heads, groups, head_dim = q.shape
    prompt_length, cache_length = prompt_k.shape[-1], cache_k.shape[-1]
    if layer is None:  # one layer's arrays: a leading axis of 1 (a bitcast, no copy)
        prompt_k, prompt_v, cache_k, cache_v = (x[None] for x in (prompt_k, prompt_v, cache_k, cache_v))
        layer = 0
    if not pallas_attention_supported(head_dim, groups, q.dtype, block_k):
        raise ValueError(
            f"slot_decode_attention does not apply to head_dim={head_dim}, groups={groups}, dtype={q.dtype}, "
            f"block_k={block_k} (pallas_attention_supported)"
        )
    rows = padded_query_rows(groups)
    kernel = functools.partial(
        _decode_kernel, groups=groups, block_k=block_k, prompt_length=prompt_length, cache_length=cache_length
    )
    per_head = lambda s, h: (s, h, 0)  # noqa: E731
    per_head_tile = lambda s, h: (s, h, 0, 0)  # noqa: E731
    whole = pl.BlockSpec()  # the whole array in every program (indexed by data inside the kernel)
    tile = pl.BlockSpec((None, None, rows, head_dim), per_head_tile)  # q and out, rows >= G padded
    return pl.pallas_call(
        kernel,
        grid=(slots, kv_heads),
        in_specs=[
            tile,  # q
            pl.BlockSpec((None, None, head_dim), per_head),  # own_k
            pl.BlockSpec((None, None, head_dim), per_head),  # own_v
            whole,  # layer
            whole,  # slot_region
            whole,  # write_at
            whole,  # prompt_valid
            whole,  # prompt_k
            whole,  # prompt_v
            whole,  # cache_k
            whole,  # cache_v
        ],
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct((slots, kv_heads, groups, head_dim), prompt_v.dtype),
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="slot_decode_attention",
    )(
        q,
        own_k,
        own_v,
        jnp.asarray(layer, jnp.int32).reshape(1),
        slot_region.astype(jnp.int32),
        write_at.astype(jnp.int32),
        prompt_valid.astype(bool),
        prompt_k,
        prompt_v,
        cache_k,
        cache_v,
    )
