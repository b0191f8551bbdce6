"""The rollout engine: a fixed number of slots that rows flow through, continuous batching on device.

    run = run_engine(model, ids, mask, params, num_samples=G, rng=key, slots=64)   # an `EngineRun`

A static batch prefills every row together and decodes them in lock-step until the longest one
stops, so a row that stopped after 40 tokens keeps its place, its KV reads and its FLOPs for the
rest. Here the N = P x G rows wait in a queue and flow through ``slots`` places:

* **Prompts** are prefilled a few at a time (`admit_prompts`, a power-of-two number of them per
  call, padded) into a table of prompt regions: each prompt's keys and values are written once and
  read by its G rows (no G-fold copy); the prefill's last logits give each row its token 0.
* **Slots** hold one row each: its own completion cache of M - 1 positions, the region of its
  prompt, its next position. The host drives the decode in **chunks** (`run_chunk`: a
  `jax.lax.fori_loop` of ``chunk`` steps, a known trip count, no host round trip inside): between
  chunks it reads two ``[slots]`` arrays (the one sync), frees the slots of rows that emitted EOS or
  reached their budget, and hands them to waiting rows (assignments are arguments of the next
  chunk: the other slots run on undisturbed).
* **The drain**: once no row waits, the slots empty one by one while the last long rows decode; when
  at most half of them are busy the busy ones are moved into a program with half the slots
  (`compact`, one step down at a time), down to ``min_slots``: decode row-steps stay close to the
  tokens generated.
* **Keys per row**: token t of row r is drawn with ``fold_in(fold_in(rng, r), t)``
  (`row_uniforms`), as `gd2po_jax.models.sampling`'s one-shot path draws it, so a completion does not
  depend on which slot or chunk it ran in, nor on the number of slots.
* **One loop**: a chunk is one ``fori_loop`` over a step (the static path compiles four segment
  loops) whose layers run in a ``scan`` on GPU and TPU (`scanned_slot_decode_step`) and unrolled
  on CPU (`slot_decode_step`; `layer_scan`); on GPU each layer attends with a Pallas kernel that
  reads only the cache positions a slot has written (`gd2po_jax.models.decode_attention`).
* **One write a step** (the unrolled step): a slot's cache is a ring whose columns every slot's row
  fills in step with the others: a row placed when the next write goes to column c puts its
  completion position j at column ``(c + j) % C`` (`EngineState.slot_shift`), so a step writes
  the same column of every slot, one in-place update as the static path's, where per-slot
  positions took a scatter (5% of the CPU's step on the harness's workload W, where no row stops
  early). Attention masks the columns a row wrote; the order of keys is immaterial to it. The
  layer scan keeps position j at column j, which the GPU kernel reads as a prefix.

Why slots and not pages: every row here has the same budget M, fixed for a run, so a slot of M - 1
positions wastes no memory that pages would save (pages pay off when budgets differ per request or
prompts share prefixes across requests), while a slot's cache is a plain dense array that the
batched products read without a gather; the prompt, which G rows share, lives once in the region
table (gathered per step, ``[slots, KV, hd, Lp]``, by XLA's attention; the GPU's Pallas kernel
reads it by index: `decode_attention_kind`).

Rows finish in any order; a group (the G rows of one prompt) is complete when its last row is:
``on_group(prompt_index, group)`` gets the group's rows (`GroupOutput`) while the next chunk decodes
(`drive`; `EngineRun.completed_groups` keeps the order): the trainer scores it then
(`gd2po_jax.rl.rollout.GroupScoring`). `EngineStats` counts what the decode
computed (slot-steps) against the tokens it produced.

**Prompts allowed while it runs**: ``run_engine(..., allowed=...)`` admits only the prompts the
caller allows so far and asks again before each chunk, so dynamic sampling replaces a group that
does not count by a new prompt mid-run (`gd2po_jax.rl.rollout.Refill`); a drained engine grows its
slots back for them (`compact` with new free slots, `Scheduler.grow_to`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from gd2po_jax.models.config import ModelConfig, rope_inv_freq
from gd2po_jax.models.decode_attention import pallas_attention_supported, slot_decode_attention
from gd2po_jax.models.decode_step import DecodeWeights, LayerWeights, decode_weights, layer_output, layer_qkv
from gd2po_jax.models.decoder import MASK_VALUE, Decoder, init_cache, rms_norm
from gd2po_jax.models.draws import activation_dtype, is_eos, row_uniforms, sample_rows

logger = logging.getLogger(__name__)

CACHE_ALIGN = 8
"""A slot's cache positions C are rounded up to a multiple of this (M - 1 = 511 -> 512): a key
cache ``[.., hd, C]`` then starts each row of C on a 16-byte boundary (8 bf16 or 4 fp32 values),
which the GPU kernel's vector loads need (`gd2po_jax.models.decode_attention`)."""


@struct.dataclass
class EngineState:
    """What the engine keeps on device between calls (Q regions, S slots, N rows, M tokens).

    prompt_keys: one [Q, KV, hd, Lp] per layer; prompt_values: one [Q, KV, Lp, hd] per layer (or,
    for the layer scan, one array each with the layers stacked first: [L, Q, ...]; the same for the
    slots' caches, `stacked_layers`);
    prompt_valid: [Q, Lp] the regions' real (non-pad) prompt tokens; prompt_lengths: [Q] int32 their count.
    slot_keys: one [S, KV, hd, C] per layer; slot_values: one [S, KV, C, hd] per layer, C = max(M - 1, 1)
    rounded up to a multiple of `CACHE_ALIGN`: they hold the keys/values of the completion tokens of the
    slot's row (where: ``slot_shift``); slot_row: [S] int32 the row a slot decodes (N: none);
    slot_region: [S] int32 its prompt's region; slot_next: [S] int32 the next token index it samples;
    slot_last: [S] int32 the token it feeds next; slot_active: [S] bool still decoding;
    slot_shift: [S] int32 the cache column of its row's completion position 0, and write_column: []
    int32 the column every slot's next key and value go to (the unrolled step's ring layout,
    `slot_layer`: position j of a slot's row lies at column ``(slot_shift + j) % C``, so one step
    writes the same column of every slot; the layer scan's layout keeps position j at column j and
    both at 0).
    tokens: [N, M] int32 (pad after EOS); logprobs: [N, M] float32; lengths: [N] int32 (EOS
    included); finished: [N] bool (EOS emitted); rng: the base key of `row_uniforms`.
    """

    prompt_keys: tuple[jax.Array, ...]
    prompt_values: tuple[jax.Array, ...]
    prompt_valid: jax.Array
    prompt_lengths: jax.Array
    slot_keys: tuple[jax.Array, ...]
    slot_values: tuple[jax.Array, ...]
    slot_row: jax.Array
    slot_region: jax.Array
    slot_next: jax.Array
    slot_last: jax.Array
    slot_active: jax.Array
    slot_shift: jax.Array
    write_column: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    finished: jax.Array
    rng: jax.Array

    if TYPE_CHECKING:  # flax.struct.dataclass adds replace() (dataclasses.replace), undeclared in its typing

        def replace(self, **changes: Any) -> EngineState: ...

    @property
    def num_slots(self) -> int:
        return self.slot_row.shape[0]

    @property
    def stacked_layers(self) -> bool:
        """Whether the caches hold every layer in one ``[L, ...]`` array (the step scans the layers)."""
        return self.slot_keys[0].ndim == 5


def init_state(
    config: ModelConfig,
    *,
    regions: int,
    slots: int,
    rows: int,
    prompt_length: int,
    max_new_tokens: int,
    dtype,
    pad_token_id: int,
    rng: jax.Array,
    stacked_layers: bool = False,
) -> EngineState:
    """An empty `EngineState` (every slot free, every row unsampled); ``stacked_layers``: the caches
    as one ``[L, ...]`` array each, for the layer scan (`layer_scan`)."""
    layers, kv, hd = config.num_layers, config.num_kv_heads, config.head_dim
    cache = -(-max(max_new_tokens - 1, 1) // CACHE_ALIGN) * CACHE_ALIGN

    def per_layer(shape: tuple[int, ...]) -> tuple[jax.Array, ...]:
        if stacked_layers:
            return (jnp.zeros((layers, *shape), dtype),)
        return tuple(jnp.zeros(shape, dtype) for _ in range(layers))

    return EngineState(
        prompt_keys=per_layer((regions, kv, hd, prompt_length)),
        prompt_values=per_layer((regions, kv, prompt_length, hd)),
        prompt_valid=jnp.zeros((regions, prompt_length), bool),
        prompt_lengths=jnp.zeros((regions,), jnp.int32),
        slot_keys=per_layer((slots, kv, hd, cache)),
        slot_values=per_layer((slots, kv, cache, hd)),
        slot_row=jnp.full((slots,), rows, jnp.int32),
        slot_region=jnp.zeros((slots,), jnp.int32),
        slot_next=jnp.zeros((slots,), jnp.int32),
        slot_last=jnp.zeros((slots,), jnp.int32),
        slot_active=jnp.zeros((slots,), bool),
        slot_shift=jnp.zeros((slots,), jnp.int32),
        write_column=jnp.zeros((), jnp.int32),
        tokens=jnp.full((rows, max_new_tokens), pad_token_id, jnp.int32),
        logprobs=jnp.zeros((rows, max_new_tokens), jnp.float32),
        lengths=jnp.zeros((rows,), jnp.int32),
        finished=jnp.zeros((rows,), bool),
        # A copy: the state is donated to each program, the caller's key must outlive it.
        rng=jax.random.wrap_key_data(jnp.copy(jax.random.key_data(rng)), impl=jax.random.key_impl(rng)),
    )


# ----------------------------------------------------------------------------------------------
# The decode step over slots.
# ----------------------------------------------------------------------------------------------


def _slot_attention(q, prompt_k, prompt_v, prompt_mask, slot_k, slot_v, slot_mask, own_k=None, own_v=None):
    """One softmax over a row's prompt region and its completion cache (and, when given, the new
    token's own key and value, not in the cache yet: `scanned_slot_decode_step`).

    q: [S, KV, G, hd]; prompt_k: [S, KV, hd, Lp]; prompt_v: [S, KV, Lp, hd]; prompt_mask: [S, Lp];
    slot_k: [S, KV, hd, C]; slot_v: [S, KV, C, hd]; slot_mask: [S, C]; own_k, own_v: [S, KV, hd].
    Returns [S, KV, G, hd] in the values' dtype (scores and softmax in float32).

    The parts share one max; each part's exponentials multiply its values and the sum is divided
    by the total once, after the products: no concatenated scores to build and split again (fewer
    kernels for XLA:CPU to compile: docs/speed.md#the-rollout-engine-issue-58).
    """
    scale = q.shape[-1] ** -0.5

    def scores(keys, mask):
        s = jnp.einsum("bkgd,bkds->bkgs", q, keys, preferred_element_type=jnp.float32) * scale
        return jnp.where(mask[:, None, None, :], s, MASK_VALUE)

    prompt_s, slot_s = scores(prompt_k, prompt_mask), scores(slot_k, slot_mask)
    peak = jnp.maximum(jnp.max(prompt_s, axis=-1), jnp.max(slot_s, axis=-1))  # [S, KV, G]
    own_s = None
    if own_k is not None:
        own_s = jnp.einsum("bkgd,bkd->bkg", q, own_k, preferred_element_type=jnp.float32) * scale
        peak = jnp.maximum(peak, own_s)
    prompt_e = jnp.exp(prompt_s - peak[..., None])
    slot_e = jnp.exp(slot_s - peak[..., None])
    total = jnp.sum(prompt_e, axis=-1) + jnp.sum(slot_e, axis=-1)
    dtype = prompt_v.dtype
    out = jnp.einsum("bkgs,bksd->bkgd", prompt_e.astype(dtype), prompt_v, preferred_element_type=jnp.float32)
    out = out + jnp.einsum("bkgs,bksd->bkgd", slot_e.astype(dtype), slot_v, preferred_element_type=jnp.float32)
    if own_s is not None:
        own_e = jnp.exp(own_s - peak)
        total = total + own_e
        out = out + own_e[..., None] * own_v[:, :, None, :].astype(jnp.float32)
    out = out / total[..., None]
    return out.astype(prompt_v.dtype)


def row_logits(unembed: jax.Array, h: jax.Array, feature_major: bool | None = None) -> jax.Array:
    """The output layer's logits ``[S, V]`` float32, one row per slot, of ``unembed [V, D]`` and the
    feature-major stream ``h [D, S]``.

    ``feature_major`` (None: on CPU) computes the product ``[V, S]``-shaped and transposes it: on
    XLA:CPU that orientation is the fast one (`gd2po_jax.models.decode_step`), and the barrier stops
    XLA from folding the transpose into the product. Elsewhere the product is ``[S, V]`` directly
    (the device's matrix units take either operand transposed), with no transposing pass.
    """
    if feature_major is None:
        feature_major = jax.default_backend() == "cpu"
    if feature_major:
        return jax.lax.optimization_barrier(jnp.matmul(unembed, h, preferred_element_type=jnp.float32)).T
    return jnp.matmul(h.T, unembed.T, preferred_element_type=jnp.float32)


@functools.partial(jax.jit, static_argnums=(0,))
def slot_layer(
    config: ModelConfig,
    lw: LayerWeights,
    h: jax.Array,
    cos: jax.Array,
    sin: jax.Array,
    cache_k: jax.Array,
    cache_v: jax.Array,
    prompt_k: jax.Array,
    prompt_v: jax.Array,
    slot_region: jax.Array,
    prompt_mask: jax.Array,
    slot_mask: jax.Array,
    column: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One layer of `slot_decode_step`: writes the new token's key and value at ``column`` of every
    slot's cache (the ring layout: the same column for all, one in-place write as the static path's)
    and attends over the slot's prompt region and cache.

    A jitted function, so the L calls of the step trace and lower it once (one private function
    called L times, which XLA inlines): 0.06-0.08 s less of the chunk's trace and lowering on the
    small model (docs/speed.md#the-rollout-engine-issue-58).

    h: [D, S] the feature-major stream; cos, sin: [hd/2, S]; cache_k: [S, KV, hd, C], cache_v:
    [S, KV, C, hd] this layer's slot caches; prompt_k: [Q, KV, hd, Lp], prompt_v: [Q, KV, Lp, hd] its
    region tables; slot_region: [S]; prompt_mask: [S, Lp]; slot_mask: [S, C]; column: [] int32.
    Returns the new stream [D, S] and caches.
    """
    h_heads, kv_heads, hd = config.num_heads, config.num_kv_heads, config.head_dim
    s = h.shape[1]
    q, k, v = layer_qkv(config, lw, h, cos, sin)
    cache_k = jax.lax.dynamic_update_slice(
        cache_k, k.transpose(2, 0, 1)[..., None].astype(cache_k.dtype), (0, 0, 0, column)
    )
    cache_v = jax.lax.dynamic_update_slice(
        cache_v, v.transpose(2, 0, 1)[:, :, None].astype(cache_v.dtype), (0, 0, column, 0)
    )
    q_rows = q.reshape(kv_heads, h_heads // kv_heads, hd, s).transpose(3, 0, 1, 2)  # [S, KV, G, hd]
    dtype = q.dtype
    out = _slot_attention(
        q_rows,
        prompt_k[slot_region].astype(dtype),
        prompt_v[slot_region].astype(dtype),
        prompt_mask,
        cache_k.astype(dtype),
        cache_v.astype(dtype),
        slot_mask,
    )
    return layer_output(config, lw, h, out.reshape(s, h_heads * hd).T), cache_k, cache_v


def slot_decode_step(
    config: ModelConfig,
    weights: DecodeWeights,
    tokens: jax.Array,
    positions: jax.Array,
    written: jax.Array,
    state: EngineState,
) -> tuple[jax.Array, tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    """Feeds one token per slot: its key and value go to column ``state.write_column`` of every
    slot's cache (the ring layout, `EngineState`), and it attends over its prompt region and its
    row's cache up to that token.

    The layers are a Python loop over per-layer caches (`slot_layer` each), as
    `gd2po_jax.models.decode_step`: the CPU's step (`layer_scan`); `scanned_slot_decode_step` is the
    GPU's and TPU's.

    Args:
      config: the model's architecture.
      weights: `decode_weights` of the model.
      tokens: [S] int32 the token each slot feeds; positions: [S] int32 its RoPE position;
      written: [S] int32 the completion position of the token each slot feeds (an active slot's
        ``(slot_shift + written) % C`` is ``write_column``); keys at positions ``<= written`` are
        attended to (a slot with no row: what it computes is not kept).
      state: the slots' regions and caches (`EngineState`).

    Returns:
      logits ``[S, V]`` float32 (`row_logits`), and
      the slots' new keys and values (one array per layer each).
    """
    eps = config.rms_norm_eps
    prompt_mask = state.prompt_valid[state.slot_region]  # [S, Lp]
    cache = state.slot_keys[0].shape[-1]
    slot_mask = (jnp.arange(cache)[None, :] - state.slot_shift[:, None]) % cache <= written[:, None]  # [S, C]
    angles = jnp.asarray(rope_inv_freq(config))[:, None] * positions.astype(jnp.float32)[None, :]  # [hd/2, S]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    h = jnp.take(weights.embed, tokens, axis=0).T  # [D, S]
    keys, values = [], []
    for i, lw in enumerate(weights.layers):
        h, cache_k, cache_v = slot_layer(
            config,
            lw,
            h,
            cos,
            sin,
            state.slot_keys[i],
            state.slot_values[i],
            state.prompt_keys[i],
            state.prompt_values[i],
            state.slot_region,
            prompt_mask,
            slot_mask,
            state.write_column,
        )
        keys.append(cache_k)
        values.append(cache_v)
    h = rms_norm(h, weights.final_norm, eps, axis=0)
    unembed = weights.embed if weights.unembed is None else weights.unembed
    logits = row_logits(unembed, h)
    return logits, tuple(keys), tuple(values)


def layer_scan(scan_layers: bool | None) -> bool:
    """Whether the engine's step scans the layers: ``scan_layers``, or by backend when None (a scan
    on GPU and TPU, the unrolled loop on CPU)."""
    return jax.default_backend() != "cpu" if scan_layers is None else bool(scan_layers)


ATTENTION_KINDS = ("xla", "pallas", "interpret")
"""How the scanned step attends: XLA's products over every allocated position (``xla``), or the
Pallas kernel that reads the filled ones (`gd2po_jax.models.decode_attention`), compiled for the GPU
(``pallas``) or run in Pallas's interpreter (``interpret``: tests on CPU)."""


def decode_attention_kind(attention: str | None, config: ModelConfig, dtype, scanned: bool) -> str:
    """The attention the chunk's step runs (`ATTENTION_KINDS`): ``attention``, or by backend when
    None: the Pallas kernel on GPU where it applies (the layer scan, a head dim and dtype it takes:
    `pallas_attention_supported`), XLA's products elsewhere.

    Raises:
      ValueError: an unknown kind, or the kernel asked for where it does not apply.
    """
    groups = config.num_heads // config.num_kv_heads
    applies = scanned and pallas_attention_supported(config.head_dim, groups, dtype)
    if attention is None:
        on_gpu = applies and jax.default_backend() == "gpu"
        return "pallas" if on_gpu and kernel_works(config.head_dim, groups, jnp.dtype(dtype).name) else "xla"
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {ATTENTION_KINDS} or None (by backend), got {attention!r}")
    if attention != "xla" and not applies:
        raise ValueError(
            f"attention={attention!r} needs the layer scan and a head dim and dtype the kernel takes "
            f"(head_dim={config.head_dim}, {groups} query heads per kv head, {jnp.dtype(dtype).name})"
        )
    return attention


@functools.cache
def kernel_works(head_dim: int, groups: int, dtype: str, interpret: bool = False) -> bool:
    """Whether the Pallas kernel compiles and runs on this device for these tile shapes and gives
    XLA's attention (`_slot_attention`) on a small random case, once per process and shape; when it
    does not, a warning says why and the engine attends with XLA's products (the kernel is chosen
    by default on GPU, where a Triton compile can fail on a GPU or a jax this code never ran on)."""
    keys = iter(jax.random.split(jax.random.key(0), 8))
    kv, slots, regions, length = 2, 3, 2, 80  # 80: a full block of 64 and a masked tail

    def normal(*shape):
        return jax.random.normal(next(keys), shape, jnp.float32).astype(dtype)

    q = normal(slots, kv, groups, head_dim)
    prompt_k, prompt_v = normal(regions, kv, head_dim, length), normal(regions, kv, length, head_dim)
    cache_k, cache_v = normal(slots, kv, head_dim, length), normal(slots, kv, length, head_dim)
    own_k, own_v = normal(slots, kv, head_dim), normal(slots, kv, head_dim)
    valid = jnp.arange(length)[None, :] >= jnp.asarray([[3], [70]])
    region, write_at = jnp.asarray([0, 1, 1], jnp.int32), jnp.asarray([0, 33, 80], jnp.int32)
    try:
        kernel = functools.partial(slot_decode_attention, interpret=interpret)
        got = jax.jit(kernel)(q, prompt_k, prompt_v, valid, region, cache_k, cache_v, write_at, own_k, own_v)
        want = _slot_attention(
            q,
            prompt_k[region],
            prompt_v[region],
            valid[region],
            cache_k,
            cache_v,
            jnp.arange(length)[None, :] < write_at[:, None],
            own_k,
            own_v,
        )
        error = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
    except Exception as err:  # noqa: BLE001 - any failure of the kernel means: do not use it
        logger.warning(
            "the Pallas decode attention does not run here (%s: %s); the engine attends with XLA's products",
            type(err).__name__,
            str(err).splitlines()[0] if str(err) else "",
        )
        return False
    tolerance = 1e-3 if dtype == "float32" else 5e-2
    if not error <= tolerance:
        logger.warning(
            "the Pallas decode attention differs from XLA's by %.3g (> %g) here; the engine attends "
            "with XLA's products",
            error,
            tolerance,
        )
        return False
    return True


def scanned_slot_decode_step(
    config: ModelConfig,
    weights: DecodeWeights,
    tokens: jax.Array,
    positions: jax.Array,
    write_at: jax.Array,
    state: EngineState,
    attention: str = "xla",
) -> tuple[jax.Array, tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    """`slot_decode_step` with the layers in one ``jax.lax.scan``: the layer's program is compiled
    once, not L times.

    ``weights.layers`` is one `LayerWeights` whose arrays are stacked ``[L, ...]``
    (`engine_weights(stacked=True)`) and the state's caches are ``[L, ...]`` arrays
    (`init_state(stacked_layers=True)`). Inside the scan the caches are only read: a layer attends
    over its prompt region, its slot's cache before ``write_at``, and the new token's own key and
    value (one softmax over all three); the L new keys and values come out of the scan and are
    written into the caches after it, one scatter each. Writing them inside would make each layer's
    cache slice a value the loop carries and updates.

    XLA:CPU copies each layer's slice of the caches out of the stacked array at every step (a
    dynamic slice cannot feed its matrix-product kernels in place): a prototype step ran 2x slower at 64
    slots x 511 positions on the small model, so the CPU runs the unrolled loop (`layer_scan`).

    ``attention`` (`decode_attention_kind`): ``pallas``/``interpret``: each layer attends with
    `gd2po_jax.models.decode_attention.slot_decode_attention`, which reads that layer of the stacked
    region table and caches in place (the scan carries only the layer index: no per-layer slice), the
    region by index (no gathered copy) and each cache up to ``write_at`` (a slot with no row reads none).

    Returns logits ``[S, V]`` float32 (`row_logits`) and the new stacked caches (1-tuples).
    """
    h_heads, kv_heads, hd = config.num_heads, config.num_kv_heads, config.head_dim
    groups = h_heads // kv_heads
    s = tokens.shape[0]
    slots = jnp.arange(s)
    prompt_mask = state.prompt_valid[state.slot_region]  # [S, Lp]
    slot_keys, slot_values = state.slot_keys[0], state.slot_values[0]  # [L, S, KV, hd, C], [L, S, KV, C, hd]
    before = jnp.arange(slot_keys.shape[-1])[None, :] < write_at[:, None]  # [S, C]
    angles = jnp.asarray(rope_inv_freq(config))[:, None] * positions.astype(jnp.float32)[None, :]  # [hd/2, S]
    cos, sin = jnp.cos(angles), jnp.sin(angles)

    def xla_attention(q_rows, own_k, own_v, per_layer):
        prompt_k, prompt_v, cache_k, cache_v = per_layer  # this layer's slices (the scan's xs)
        dtype = q_rows.dtype
        return _slot_attention(
            q_rows,
            prompt_k[state.slot_region].astype(dtype),
            prompt_v[state.slot_region].astype(dtype),
            prompt_mask,
            cache_k.astype(dtype),
            cache_v.astype(dtype),
            before,
            own_k,
            own_v,
        )

    def kernel_attention(q_rows, own_k, own_v, index):
        # The stacked arrays whole, the layer by index: the kernel reads that layer where it lies.
        return slot_decode_attention(
            q_rows,
            state.prompt_keys[0],
            state.prompt_values[0],
            state.prompt_valid,
            state.slot_region,
            slot_keys,
            slot_values,
            filled,
            own_k,
            own_v,
            layer=index,
            interpret=attention == "interpret",
        ).astype(q_rows.dtype)

    attend = xla_attention if attention == "xla" else kernel_attention

    def layer(h, xs):
        lw, per_layer = xs
        q, k, v = layer_qkv(config, lw, h, cos, sin)
        dtype = q.dtype
        q_rows = q.reshape(kv_heads, groups, hd, s).transpose(3, 0, 1, 2)  # [S, KV, G, hd]
        k_rows = k.transpose(2, 0, 1).astype(slot_keys.dtype)  # [S, KV, hd], as the cache will hold it
        v_rows = v.transpose(2, 0, 1).astype(slot_values.dtype)
        out = attend(q_rows, k_rows.astype(dtype), v_rows.astype(dtype), per_layer)
        return layer_output(config, lw, h, out.reshape(s, h_heads * hd).T), (k_rows, v_rows)

    filled = jnp.where(write_at < slot_keys.shape[-1], write_at, 0)  # the kernel's: a slot with no row reads none
    if attention == "xla":
        per_layer: Any = (state.prompt_keys[0], state.prompt_values[0], slot_keys, slot_values)
    else:
        per_layer = jnp.arange(slot_keys.shape[0], dtype=jnp.int32)
    h = jnp.take(weights.embed, tokens, axis=0).T  # [D, S]
    h, (new_keys, new_values) = jax.lax.scan(layer, h, (weights.layers[0], per_layer))  # new_*: [L, S, KV, hd]
    slot_keys = slot_keys.at[:, slots, :, :, write_at].set(new_keys.transpose(1, 0, 2, 3), mode="drop")
    slot_values = slot_values.at[:, slots, :, write_at, :].set(new_values.transpose(1, 0, 2, 3), mode="drop")
    h = rms_norm(h, weights.final_norm, config.rms_norm_eps, axis=0)
    unembed = weights.embed if weights.unembed is None else weights.unembed
    logits = row_logits(unembed, h)
    return logits, (slot_keys,), (slot_values,)


# ----------------------------------------------------------------------------------------------
# The device programs: admit prompts, run a chunk, compact the slots.
# ----------------------------------------------------------------------------------------------


def engine_weights(graphdef, params_state, merge_adapters: bool, stacked: bool = False) -> DecodeWeights:
    """The ``[out, in]`` decode weights of the model (once per engine run); ``stacked``: the layers'
    as one `LayerWeights` of ``[L, ...]`` arrays (`scanned_slot_decode_step`)."""
    model: Decoder = nnx.merge(graphdef, params_state)
    weights = decode_weights(model, merge_adapters)
    if stacked:
        weights = dataclasses.replace(weights, layers=(jax.tree.map(lambda *xs: jnp.stack(xs), *weights.layers),))
    return weights


def _record(state: EngineState, rows: jax.Array, index: jax.Array, tokens: jax.Array, logp: jax.Array, eos):
    """Writes token ``index [R]`` of ``rows [R]`` (rows >= N are dropped); returns the new state."""
    return state.replace(
        tokens=state.tokens.at[rows, index].set(tokens, mode="drop"),
        logprobs=state.logprobs.at[rows, index].set(logp, mode="drop"),
        lengths=state.lengths.at[rows].set(index + 1, mode="drop"),
        finished=state.finished.at[rows].set(eos, mode="drop"),
    )


def admit_prompts(graphdef, params_state, state: EngineState, ids, mask, regions, first_rows, params, num_samples):
    """Prefills A prompts into their regions and samples token 0 of their G rows each.

    ids, mask: [A, Lp] left-padded prompts; regions: [A] int32 (Q for a padding entry: dropped);
    first_rows: [A] int32 row of sample 0 (N for padding; rows are ``first_rows + g``).
    """
    model: Decoder = nnx.merge(graphdef, params_state)
    a, lp = ids.shape
    cache = init_cache(model.config, a, lp, activation_dtype(model))
    hidden, cache = model.hidden_states(ids, mask, cache=cache)
    logits = model.logits(hidden[:, -1:])[:, 0]  # [A, V]
    keys, values = cache.keys, cache.values
    if state.stacked_layers:
        keys, values = (jnp.stack(keys),), (jnp.stack(values),)
    at = (slice(None), regions) if state.stacked_layers else regions  # the regions' axis
    state = state.replace(
        prompt_keys=tuple(
            table.at[at].set(k.astype(table.dtype), mode="drop") for table, k in zip(state.prompt_keys, keys)
        ),
        prompt_values=tuple(
            table.at[at].set(v.astype(table.dtype), mode="drop") for table, v in zip(state.prompt_values, values)
        ),
        prompt_valid=state.prompt_valid.at[regions].set(mask.astype(bool), mode="drop"),
        prompt_lengths=state.prompt_lengths.at[regions].set(jnp.sum(mask, axis=-1, dtype=jnp.int32), mode="drop"),
    )
    rows = (first_rows[:, None] + jnp.arange(num_samples, dtype=jnp.int32)[None, :]).reshape(-1)  # [A G]
    sample_logits = jnp.repeat(logits, num_samples, axis=0)
    zeros = jnp.zeros_like(rows)
    tokens, logp = sample_rows(sample_logits, row_uniforms(state.rng, rows, zeros), params)
    return _record(state, rows, zeros, tokens, logp, is_eos(tokens, params.eos_token_ids))


def run_chunk(
    config: ModelConfig,
    weights: DecodeWeights,
    state: EngineState,
    assign_rows,
    assign_regions,
    params,
    steps,
    attention: str = "xla",
):
    """Places waiting rows into slots, then runs ``steps`` decode steps over every slot (the layer
    scan's attention: ``attention``, `decode_attention_kind`).

    assign_rows: [S] int32 the row each slot takes now (N: the slot keeps what it has);
    assign_regions: [S] int32 that row's prompt region. A row placed here feeds its token 0 (from
    `admit_prompts`); a slot whose row emitted EOS or reached M tokens stops (``slot_active``) and
    computes nothing that is kept until it is given another row.

    On CPU the loop also ends once no slot is active (its condition is read where it runs; on GPU
    and TPU a ``fori_loop`` of known trip count keeps the condition off the host): the steps left
    would keep nothing (on the harness's workload W, the 64th step of 63 needed).
    """
    n, m = state.tokens.shape
    placing = assign_rows < n
    row = jnp.minimum(assign_rows, n - 1)
    state = state.replace(
        slot_row=jnp.where(placing, assign_rows, state.slot_row),
        slot_region=jnp.where(placing, assign_regions, state.slot_region),
        slot_next=jnp.where(placing, 1, state.slot_next),
        slot_last=jnp.where(placing, state.tokens[row, 0], state.slot_last),
        slot_active=jnp.where(placing, ~state.finished[row] & (m > 1), state.slot_active),
        # The ring layout: the row's position 0 goes to the column the next step writes.
        slot_shift=state.slot_shift
        if state.stacked_layers
        else jnp.where(placing, state.write_column, state.slot_shift),
    )

    def step(_, s: EngineState) -> EngineState:
        written = s.slot_next - 1  # completion tokens whose keys are in the cache: the fed one goes there
        positions = s.prompt_lengths[s.slot_region] + written
        if s.stacked_layers:
            at = jnp.where(s.slot_active, written, s.slot_keys[0].shape[-1])  # out of range: written nowhere
            logits, slot_keys, slot_values = scanned_slot_decode_step(
                config, weights, s.slot_last, positions, at, s, attention
            )
        else:
            logits, slot_keys, slot_values = slot_decode_step(config, weights, s.slot_last, positions, written, s)
        rows = jnp.where(s.slot_active, s.slot_row, n)
        tokens, logp = sample_rows(logits, row_uniforms(s.rng, jnp.minimum(rows, n - 1), s.slot_next), params)
        eos = is_eos(tokens, params.eos_token_ids)
        s = _record(s.replace(slot_keys=slot_keys, slot_values=slot_values), rows, s.slot_next, tokens, logp, eos)
        return s.replace(
            slot_last=jnp.where(s.slot_active, tokens, s.slot_last),
            slot_next=s.slot_next + s.slot_active.astype(jnp.int32),
            slot_active=s.slot_active & ~eos & (s.slot_next + 1 < m),
            write_column=s.write_column if s.stacked_layers else (s.write_column + 1) % s.slot_keys[0].shape[-1],
        )

    if jax.default_backend() != "cpu":
        return jax.lax.fori_loop(0, steps, step, state)
    _, state = jax.lax.while_loop(
        lambda c: (c[0] < steps) & jnp.any(c[1].slot_active), lambda c: (c[0] + 1, step(c[0], c[1])), (0, state)
    )
    return state


def compact(state: EngineState, keep: jax.Array) -> EngineState:
    """The state with the slots ``keep [S']`` (in that order): a program of S' slots. An entry >= S
    is a new free slot (no row, inactive: the slots grow back when rows arrive after a drain)."""
    s = state.num_slots
    new = keep >= s
    pick = lambda x, axis=0: jnp.take(x, jnp.minimum(keep, s - 1), axis=axis)  # noqa: E731
    cache_axis = 1 if state.stacked_layers else 0
    return state.replace(
        slot_keys=tuple(pick(x, cache_axis) for x in state.slot_keys),  # a free slot's cache is never read
        slot_values=tuple(pick(x, cache_axis) for x in state.slot_values),
        slot_row=jnp.where(new, state.tokens.shape[0], pick(state.slot_row)),
        slot_region=pick(state.slot_region),
        slot_next=pick(state.slot_next),
        slot_last=pick(state.slot_last),
        slot_active=jnp.where(new, False, pick(state.slot_active)),
        slot_shift=pick(state.slot_shift),
    )


@struct.dataclass
class GroupOutput:
    """The rows of one completed group (G of them): tokens, logprobs [G, M]; lengths, finished [G]."""

    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    finished: jax.Array


def group_rows(outputs: EngineState | GroupOutput, rows: jax.Array) -> GroupOutput:
    """The rows ``rows [R]`` of the outputs (tokens, logprobs, lengths, finished) of an `EngineState`
    or of all rows (a copy: the state goes on to the next chunk)."""
    return GroupOutput(outputs.tokens[rows], outputs.logprobs[rows], outputs.lengths[rows], outputs.finished[rows])


group_rows_fn = jax.jit(group_rows)
weights_fn = jax.jit(engine_weights, static_argnums=(0, 2, 3))
# One program for the empty state, instead of a dispatch per array (4L + 12 of them).
init_state_fn = jax.jit(
    init_state,
    static_argnums=(0,),
    static_argnames=(
        "regions",
        "slots",
        "rows",
        "prompt_length",
        "max_new_tokens",
        "dtype",
        "pad_token_id",
        "stacked_layers",
    ),
)
admit_fn = jax.jit(admit_prompts, static_argnums=(0, 7, 8), donate_argnums=(2,))


class JitByBackend:
    """``jax.jit(fn)`` compiled with extra XLA options on the backends named in ``options`` (the
    default backend's when it is called), plainly elsewhere; ``lower`` and ``_cache_size`` as jit's.
    An option that the process's ``XLA_FLAGS`` sets is left to them (e.g. the test suite's level 0)."""

    def __init__(self, fn: Callable, options: dict[str, dict[str, Any]], **jit_kwargs: Any):
        flags = os.environ.get("XLA_FLAGS", "")
        self.options = {
            name: {k: v for k, v in opts.items() if f"--{k}=" not in flags} for name, opts in options.items()
        }
        self._by_backend = {
            name: jax.jit(fn, compiler_options=opts, **jit_kwargs) for name, opts in self.options.items()
        }
        self._plain = jax.jit(fn, **jit_kwargs)

    def _pick(self):
        return self._by_backend.get(jax.default_backend(), self._plain)

    def __call__(self, *args, **kwargs):
        return self._pick()(*args, **kwargs)

    def lower(self, *args, **kwargs):
        return self._pick().lower(*args, **kwargs)

    def _cache_size(self) -> int:
        return sum(fn._cache_size() for fn in (*self._by_backend.values(), self._plain))  # type: ignore[attr-defined]


# On XLA:CPU the chunk's time is in the matrix products (library kernels) and its compile time in
# LLVM's optimization of the fused loops: at LLVM level 1 instead of 2 the chunk program compiles
# 20% faster and runs as fast (docs/speed.md#the-rollout-engine-issue-58).
CPU_CHUNK_OPTIONS = {"xla_backend_optimization_level": 1}
chunk_fn = JitByBackend(run_chunk, {"cpu": CPU_CHUNK_OPTIONS}, static_argnums=(0, 5, 6, 7), donate_argnums=(2,))
compact_fn = jax.jit(compact)


# ----------------------------------------------------------------------------------------------
# The host side: the queue, the slots, the regions.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class EngineStats:
    """What one engine run computed.

    slot_steps: decode steps x slots dispatched (busy or idle: the work paid for; a CPU chunk whose
    slots all stopped ends early, `run_chunk`, and is counted whole); tokens: tokens
    generated (EOS included); chunks: decode chunks run (one host sync each); prefills: prefill
    calls; slot_counts: the slot counts the chunks ran with, in order of first use; grown: times
    the slots grew back after a drain (prompts allowed late, `run_engine`'s ``allowed``).
    """

    slot_steps: int = 0
    tokens: int = 0
    chunks: int = 0
    prefills: int = 0
    slot_counts: list[int] = dataclasses.field(default_factory=list)
    grown: int = 0

    @property
    def slot_steps_per_token(self) -> float:
        """Decode row-steps computed per generated token (1 = no idle slot; a static batch: rows x
        its longest row / tokens)."""
        return self.slot_steps / max(self.tokens, 1)


def _power_of_two_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def slot_counts(slots: int, min_slots: int) -> tuple[int, ...]:
    """The slot counts the drain steps down through: ``slots``, then halves down to ``min_slots``
    (at least 1). E.g. (64, 4) -> (64, 32, 16, 8, 4)."""
    counts = [slots]
    while counts[-1] // 2 >= max(min_slots, 1):
        counts.append(counts[-1] // 2)
    return tuple(counts)


class Scheduler:
    """The host's bookkeeping of a run: which row waits, which slot holds which row, which prompt
    region is in use, which groups are complete. Pure Python over small integers (no device):
    `run_engine` feeds it what each chunk reports; tests and simulations drive it directly.

    Rows are prompt-major (row ``p * G + g``); prompts are admitted in order, up to ``limit`` (the
    prompts the caller allows so far: all P unless `run_engine`'s ``allowed`` says fewer).
    """

    def __init__(self, num_prompts: int, num_samples: int, slots: int, regions: int, max_prefill: int):
        self.num_prompts, self.num_samples = num_prompts, num_samples
        self.limit = num_prompts
        self.rows = num_prompts * num_samples
        self.slot_rows: list[int] = [self.rows] * slots  # self.rows: free
        self.free_regions = deque(range(regions))
        self.region_of_prompt: dict[int, int] = {}
        self.rows_left = [num_samples] * num_prompts  # rows of each prompt not yet done
        self.waiting: deque[int] = deque()  # rows prefilled, not yet in a slot
        self.next_prompt = 0
        self.max_prefill = max_prefill
        self.completed: list[int] = []

    @property
    def busy(self) -> int:
        return sum(r < self.rows for r in self.slot_rows)

    @property
    def drained(self) -> bool:
        """No row waits and no allowed prompt is left to admit: only the slots' rows remain."""
        return not self.waiting and self.next_prompt >= self.limit

    @property
    def done(self) -> bool:
        return self.drained and self.busy == 0

    def prompts_to_admit(self) -> list[int]:
        """The prompts to prefill now: enough that every free slot gets a row, as regions allow."""
        free = len(self.slot_rows) - self.busy
        want = -(-max(free - len(self.waiting), 0) // self.num_samples)
        count = min(want, self.limit - self.next_prompt, len(self.free_regions), self.max_prefill)
        prompts = list(range(self.next_prompt, self.next_prompt + count))
        for p in prompts:
            self.region_of_prompt[p] = self.free_regions.popleft()
            self.waiting.extend(range(p * self.num_samples, (p + 1) * self.num_samples))
        self.next_prompt += count
        return prompts

    def place(self) -> list[tuple[int, int, int]]:
        """Waiting rows into free slots: ``(slot, row, region)`` each."""
        placed = []
        for slot, row in enumerate(self.slot_rows):
            if row >= self.rows and self.waiting:
                new = self.waiting.popleft()
                self.slot_rows[slot] = new
                placed.append((slot, new, self.region_of_prompt[new // self.num_samples]))
        return placed

    def finish(self, slot_active: Sequence[bool]) -> list[int]:
        """Frees the slots whose rows stopped; returns the prompts whose groups completed."""
        completed = []
        for slot, (row, active) in enumerate(zip(self.slot_rows, slot_active)):
            if row < self.rows and not active:
                self.slot_rows[slot] = self.rows
                prompt = row // self.num_samples
                self.rows_left[prompt] -= 1
                if self.rows_left[prompt] == 0:
                    self.free_regions.append(self.region_of_prompt.pop(prompt))
                    completed.append(prompt)
        self.completed.extend(completed)
        return completed

    def shrink_to(self, counts: Sequence[int]) -> list[int] | None:
        """Once drained, the busy slots to keep (in slot order, padded with free ones) when they fit
        in the next smaller of ``counts`` (one step down: a compiled copy per pair of neighbours);
        None to keep the current slots. Called again until it gives None."""
        current = len(self.slot_rows)
        smaller = [c for c in counts if c < current]
        if not self.drained or not smaller or max(smaller) < self.busy:
            return None
        target = max(smaller)
        busy = [s for s, r in enumerate(self.slot_rows) if r < self.rows]
        free = [s for s, r in enumerate(self.slot_rows) if r >= self.rows]
        keep = busy + free[: target - len(busy)]
        self.slot_rows = [self.slot_rows[s] for s in keep]
        return keep

    def grow_to(self, counts: Sequence[int]) -> list[int] | None:
        """When more rows are to come than the slots hold (the caller allowed prompts after the drain
        shrank them): the slots to keep, every current one and free ones up to the fewest of
        ``counts`` that hold the busy rows, the waiting ones and those of the allowed prompts not yet
        admitted (`compact`'s entries >= S); None when they fit."""
        current = len(self.slot_rows)
        needed = self.busy + len(self.waiting) + self.num_samples * max(0, self.limit - self.next_prompt)
        larger = [c for c in counts if c > current]
        if needed <= current or not larger:
            return None
        target = min([c for c in larger if c >= needed] or [max(larger)])
        self.slot_rows += [self.rows] * (target - current)
        return list(range(target))


@dataclasses.dataclass
class EngineRun:
    """The result of `run_engine`: the device arrays of every row, the order groups completed in,
    and the work done."""

    tokens: jax.Array  # [N, M]
    logprobs: jax.Array  # [N, M]
    lengths: jax.Array  # [N]
    finished: jax.Array  # [N]
    completed_groups: list[int]
    stats: EngineStats


def drive(
    scheduler: Scheduler,
    *,
    admit: Callable[[list[int]], None],
    chunk: Callable[[list[tuple[int, int, int]]], Callable[[], Sequence[bool]]],
    compact: Callable[[list[int]], None],
    slot_counts: Sequence[int],
    single_token: bool = False,
    collect: Callable[[list[int]], list[Any]] | None = None,
    on_group: Callable[[int, Any], None] | None = None,
    allowed: Callable[[bool], int] | None = None,
) -> None:
    """The engine's host loop, over the device through callbacks (`run_engine` runs the programs;
    `simulate` counts): until every row is done, admit prompts for the free slots
    (``admit(prompts)``), place waiting rows and start a chunk (``chunk(placed)`` dispatches it and
    returns the wait for every slot's ``slot_active`` after it: the one sync), free the slots of the
    rows that stopped, and once drained shrink the slots (``compact(keep)``) while a chunk may still
    run on them (not after the last rows stopped, unless ``allowed`` may admit more).

    Completed groups: ``collect(prompts)`` takes what they produced (before the next chunk reuses
    the state), and ``on_group(prompt, collected)`` hands it over while the next chunk runs on the
    device (the host's work on a group overlaps the decode of the rest); the last ones after the loop.
    ``single_token``: M = 1, the prefill samples every row's only token (no chunk runs).

    ``allowed(wait)``: how many prompts (the first, in order) may be admitted so far, asked before each
    chunk with ``wait=False`` (answer at once) and, once every allowed row is done and every completed
    group reported, with ``wait=True`` (the caller may first wait for what it decides on, e.g. the
    groups' rewards): the loop ends when that answer admits nothing new. A run whose slots shrank in
    the drain grows them back to the most (``compact`` with new slots) when new rows wait.
    """
    pending: list[tuple[int, Any]] = []

    def completed(prompts: list[int]) -> list[tuple[int, Any]]:
        payloads = collect(prompts) if collect is not None and prompts else [None] * len(prompts)
        return list(zip(prompts, payloads))

    def report(groups: list[tuple[int, Any]]) -> None:
        if on_group is not None:
            for prompt, payload in groups:
                on_group(prompt, payload)

    def allow(wait: bool) -> None:
        if allowed is not None:
            scheduler.limit = min(max(scheduler.limit, int(allowed(wait))), scheduler.num_prompts)

    if allowed is not None:
        scheduler.limit = 0  # what the first answer allows
    while True:
        allow(False)
        if scheduler.done:
            report(pending)
            pending = []
            allow(True)
            if scheduler.done:
                break
        if (keep := scheduler.grow_to(slot_counts)) is not None:
            compact(keep)
        admitted = scheduler.prompts_to_admit()
        if admitted:
            admit(admitted)
        if single_token:
            scheduler.waiting.clear()
            for prompt in admitted:
                scheduler.rows_left[prompt] = 0
                scheduler.free_regions.append(scheduler.region_of_prompt.pop(prompt))
                scheduler.completed.append(prompt)
            report(completed(admitted))
            continue
        wait = chunk(scheduler.place())
        report(pending)  # while the chunk runs
        pending = completed(scheduler.finish(wait()))
        if allowed is None and scheduler.done:
            continue  # the run is over: no chunk will run on smaller slots
        while (keep := scheduler.shrink_to(slot_counts)) is not None:
            compact(keep)


def engine_layout(rows: int, num_samples: int, slots: int, min_slots: int) -> tuple[int, int, int, tuple[int, ...]]:
    """``(slots, max_prefill, regions, slot_counts)`` of an engine for ``rows`` rows of groups of
    ``num_samples``: ``slots`` capped at the rows (0: one per row); at most one slot's worth of
    prompts per prefill; a region for every prompt that can be in flight; the drain's slot counts."""
    slots = min(slots or rows, rows)
    max_prefill = max(1, -(-slots // num_samples))
    return slots, max_prefill, slots + max_prefill, slot_counts(slots, min(min_slots, slots))


def simulate(
    lengths: Sequence[int], num_samples: int, *, slots: int = 0, min_slots: int = 4, chunk: int = 16
) -> EngineStats:
    """The `EngineStats` `run_engine` would report for rows whose completions have these
    ``lengths [N]`` (tokens, EOS included, >= 1; prompt-major): the same host loop (`drive`) over
    a model of the device's slots that only counts. For choosing slots and chunk without a model."""
    lengths = [int(n) for n in lengths]
    rows = len(lengths)
    slots, max_prefill, regions, counts = engine_layout(rows, num_samples, slots, min_slots)
    scheduler = Scheduler(rows // num_samples, num_samples, slots, regions, max_prefill)
    stats = EngineStats(tokens=sum(lengths))
    next_token = [0] * slots  # index of the next token each slot samples; 0: empty

    def admit(prompts):
        stats.prefills += 1

    def run(placed):
        for slot, row, _ in placed:
            next_token[slot] = 1
        stats.chunks += 1
        stats.slot_steps += len(scheduler.slot_rows) * chunk
        if len(scheduler.slot_rows) not in stats.slot_counts:
            stats.slot_counts.append(len(scheduler.slot_rows))
        active = []
        for slot, row in enumerate(scheduler.slot_rows):
            if row < rows:
                next_token[slot] = min(next_token[slot] + chunk, lengths[row])
            active.append(row < rows and next_token[slot] < lengths[row])
        return lambda: active

    def shrink(keep):
        next_token[:] = [next_token[s] for s in keep]

    drive(scheduler, admit=admit, chunk=run, compact=shrink, slot_counts=counts, single_token=max(lengths) == 1)
    return stats


def warm_up(
    model: Decoder,
    ids: np.ndarray,
    mask: np.ndarray,
    params,
    *,
    num_samples: int,
    slots: int = 0,
    min_slots: int = 4,
    chunk: int = 16,
    scan_layers: bool | None = None,
    attention: str | None = None,
) -> int:
    """Compiles every program `run_engine` can run for these shapes (the empty state, the weights' copy, a prefill
    per power-of-two admission size, a chunk per slot count, a compaction per step down) by running
    each once on empty slots; returns how many programs ran. For benchmarks that time without
    compiling: a real run compiles only the programs its lengths reach, on first use."""
    p, lp = ids.shape
    n, m = p * num_samples, params.max_new_tokens
    slots, max_prefill, regions, counts = engine_layout(n, num_samples, slots, min_slots)
    graphdef, params_state = nnx.split(model)
    scanned = layer_scan(scan_layers)
    state = init_state_fn(
        model.config,
        regions=regions,
        slots=slots,
        rows=n,
        prompt_length=lp,
        max_new_tokens=m,
        dtype=activation_dtype(model),
        pad_token_id=params.pad_token_id,
        rng=jax.random.key(0),
        stacked_layers=scanned,
    )
    weights = weights_fn(graphdef, params_state, params.merge_adapters, scanned)
    attention = decode_attention_kind(attention, model.config, activation_dtype(model), scanned)
    programs = 2  # the empty state and the weights' copy
    size = 1
    while size <= _power_of_two_at_least(max_prefill):
        drop = np.full(size, regions, np.int32)  # every entry padding: nothing is written
        state = admit_fn(
            graphdef,
            params_state,
            state,
            ids[:1].repeat(size, 0),
            mask[:1].repeat(size, 0),
            drop,
            np.full(size, n, np.int32),
            params,
            num_samples,
        )
        programs, size = programs + 1, size * 2
    if m > 1:
        for count, smaller in zip(counts, (*counts[1:], None)):
            state = chunk_fn(
                model.config,
                weights,
                state,
                np.full(count, n, np.int32),
                np.zeros(count, np.int32),
                params,
                chunk,
                attention,
            )
            programs += 1
            if smaller is not None:
                state = compact_fn(state, np.arange(smaller, dtype=np.int32))
                programs += 1
    jax.block_until_ready(state.tokens)
    return programs


def run_engine(
    model: Decoder,
    ids: np.ndarray,
    mask: np.ndarray,
    params,
    *,
    num_samples: int,
    rng: jax.Array,
    slots: int = 0,
    min_slots: int = 4,
    chunk: int = 16,
    on_group: Callable[[int, GroupOutput], None] | None = None,
    scan_layers: bool | None = None,
    attention: str | None = None,
    allowed: Callable[[bool], int] | None = None,
) -> EngineRun:
    """Generates ``num_samples`` completions of each of the P left-padded prompts ``ids, mask``
    ``[P, Lp]`` through ``slots`` slots (0: one per row, P x G).

    Args:
      model: the `Decoder` to sample from (unsharded or on one device).
      ids, mask: [P, Lp] int32 left-padded prompts (`gd2po_jax.models.sampling.left_pad`).
      params: `gd2po_jax.models.sampling.SamplingParams` (static).
      num_samples: G rows per prompt.
      rng: base key of the rows' draws (`row_uniforms`).
      slots: S, rows decoded at once; min_slots: the fewest the drain shrinks to; chunk: decode
        steps per host sync.
      on_group: ``on_group(prompt, group)`` with a prompt's index and its rows' `GroupOutput`
        (device arrays) when its G rows are all done, while the next chunk decodes (`drive`).
      scan_layers: the step scans the layers (True) or runs them unrolled (False); None: by
        backend (`layer_scan`).
      attention: the scanned step's attention, ``xla``, ``pallas`` or ``interpret``; None: by backend
        (`decode_attention_kind`: the Pallas kernel on GPU).
      allowed: ``allowed(wait)``, how many of the P prompts (the first ones) may be admitted so far
        (None: all): the caller grows it while the engine runs, e.g. one more prompt for each group
        that dynamic sampling drops, and is asked with ``wait=True`` before the run ends (`drive`).
        A prompt's ``ids``/``mask`` rows are read when it is admitted, so the caller may write them
        until it allows the prompt. Rows of prompts never allowed stay empty (length 0).
    """
    p, lp = ids.shape
    n, m = p * num_samples, params.max_new_tokens
    slots, max_prefill, regions, counts = engine_layout(n, num_samples, slots, min_slots)
    graphdef, params_state = nnx.split(model)
    scanned = layer_scan(scan_layers)
    holder = [
        init_state_fn(
            model.config,
            regions=regions,
            slots=slots,
            rows=n,
            prompt_length=lp,
            max_new_tokens=m,
            dtype=activation_dtype(model),
            pad_token_id=params.pad_token_id,
            rng=rng,
            stacked_layers=scanned,
        )
    ]
    weights = weights_fn(graphdef, params_state, params.merge_adapters, scanned)
    attention = decode_attention_kind(attention, model.config, activation_dtype(model), scanned)
    scheduler = Scheduler(p, num_samples, slots, regions, max_prefill)
    stats = EngineStats()
    prefill_size = _power_of_two_at_least(max_prefill)

    def admit(prompts: list[int]) -> None:
        size = min(_power_of_two_at_least(len(prompts)), prefill_size)
        pad = size - len(prompts)
        pick = np.asarray(prompts + [0] * pad)
        regions_in = np.asarray([scheduler.region_of_prompt[q] for q in prompts] + [regions] * pad, np.int32)
        first_rows = np.asarray([q * num_samples for q in prompts] + [n] * pad, np.int32)
        holder[0] = admit_fn(
            graphdef, params_state, holder[0], ids[pick], mask[pick], regions_in, first_rows, params, num_samples
        )
        stats.prefills += 1

    def run(placed: list[tuple[int, int, int]]) -> Callable[[], Sequence[bool]]:
        state = holder[0]
        assign_rows = np.full(state.num_slots, n, np.int32)
        assign_regions = np.zeros(state.num_slots, np.int32)
        for slot, row, region in placed:
            assign_rows[slot], assign_regions[slot] = row, region
        state = holder[0] = chunk_fn(
            model.config, weights, state, assign_rows, assign_regions, params, chunk, attention
        )
        stats.chunks += 1
        stats.slot_steps += state.num_slots * chunk
        if state.num_slots not in stats.slot_counts:
            stats.slot_counts.append(state.num_slots)
        return lambda: np.asarray(jax.device_get(state.slot_active)).tolist()

    def collect(prompts: list[int]) -> list[GroupOutput]:
        # One program per group (rows [G]: one compiled shape), no slicing of a joint copy (a
        # program per slice).
        rows = np.asarray(prompts, np.int32)[:, None] * num_samples + np.arange(num_samples, dtype=np.int32)
        return [group_rows_fn(holder[0], group) for group in rows]

    def resize(keep: list[int]) -> None:
        stats.grown += len(keep) > holder[0].num_slots
        holder[0] = compact_fn(holder[0], np.asarray(keep, np.int32))

    drive(
        scheduler,
        admit=admit,
        chunk=run,
        compact=resize,
        slot_counts=counts,
        single_token=m == 1,
        collect=collect if on_group is not None else None,
        on_group=on_group,
        allowed=allowed,
    )
    state = holder[0]
    stats.tokens = int(np.sum(jax.device_get(state.lengths)))
    return EngineRun(
        tokens=state.tokens,
        logprobs=state.logprobs,
        lengths=state.lengths,
        finished=state.finished,
        completed_groups=list(scheduler.completed),
        stats=stats,
    )
