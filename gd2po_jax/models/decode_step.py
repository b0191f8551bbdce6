"""One decoding step (one new token per row) in feature-major layout: the sampler's inner loop.

    weights = decode_weights(model)                        # once per generate call
    logits, cache = decode_step(model.config, weights, tokens, cache)   # [V, N] float32

A decode step multiplies N rows (N = prompts x samples, 32 in the speed frame) by every weight
matrix. With activations held as ``[N, D]`` each projection is an ``[N, K] @ [K, F]`` product whose
output has only N rows; the same product computed as ``[F, K] @ [K, N]`` (an ``[out, in]`` weight
times feature-major activations ``[K, N]``) has F rows, the shape matrix-multiply kernels are built
for. On XLA:CPU (YNNPACK) the second form was faster for most of the small model's shapes at N = 32
(up to ~2x, not for every shape in every run: bench/decode_layouts.py) and 1.4x faster over a whole
loop of the step's products; for a GPU or TPU the two are the same product with transposed
operands. So here the residual stream is ``h [D, N]``, every matrix is ``[out, in]``, and the
products ``W @ h`` give ``[out, N]``.

The parameters are stored ``[in, out]`` (`gd2po_jax.models.decoder`); `decode_weights` makes the
``[out, in]`` copies once per `gd2po_jax.models.sampling.generate` call, before the decode loop: a second
copy of the matrices lives while the loop runs. q, k and v are one ``[(H + 2 KV) hd, D]`` matrix
and gate and up one ``[2 F, D]``: fewer, larger products.

Attention stays batch-major: queries ``[N, KV, G, hd]`` against the cache's keys ``[N, KV, hd, S]``
and values ``[N, KV, S, hd]`` (`gd2po_jax.models.decoder.KVCache`, the layouts prefill writes), as
batched products over (row, kv head); only the step's own q/k/v/output vectors are transposed,
``[hd, N]``-sized. The cache may come in segments (a tuple of `KVCache`, in slot order): the
scores of all segments go through one softmax, and the output sums each segment's product, so a
sampler can attend over only the chunks it has written (`gd2po_jax.models.sampling`).

The step computes what ``Decoder.__call__(tokens[:, None], ones, cache=cache)`` computes (tested to
give the same logits within float tolerance and the same greedy tokens): positions continue from
the number of valid cache slots (of all segments), the new token's key and value go to slot
``index`` of the last segment.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import jax
import jax.numpy as jnp
from flax import struct

from gd2po_jax.models.config import ModelConfig, rope_inv_freq
from gd2po_jax.models.decoder import MASK_VALUE, Decoder, KVCache, apply_rope, effective_kernel, rms_norm


@struct.dataclass
class LayerWeights:
    """One layer's matrices ``[out, in]`` and vectors ``[dim, 1]`` (None where absent).

    qkv: [(H + 2 KV) hd, D]; qkv_bias: [(H + 2 KV) hd, 1]; o: [D, H hd]; o_bias: [D, 1];
    gate_up: [2 F, D]; gate_up_bias: [2 F, 1]; down: [D, F]; down_bias: [D, 1];
    attn_norm, mlp_norm: [D, 1]; q_norm, k_norm: [hd, 1].
    adapters: LoRA applied per token (`decode_weights(..., merge_adapters=False)`): target -> (A^T
    [r, in], scale B^T [out, r]); empty when merged into the matrices or absent.
    """

    qkv: jax.Array
    qkv_bias: jax.Array | None
    o: jax.Array
    o_bias: jax.Array | None
    gate_up: jax.Array
    gate_up_bias: jax.Array | None
    down: jax.Array
    down_bias: jax.Array | None
    attn_norm: jax.Array
    mlp_norm: jax.Array
    q_norm: jax.Array | None
    k_norm: jax.Array | None
    adapters: dict = dataclasses.field(default_factory=dict)


@struct.dataclass
class DecodeWeights:
    """Every weight of a decode step. embed: [V, D] (the token table, also the tied output matrix);
    unembed: [V, D] untied output matrix or None; final_norm: [D, 1]; layers: one `LayerWeights` each."""

    embed: jax.Array
    unembed: jax.Array | None
    final_norm: jax.Array
    layers: tuple[LayerWeights, ...]


def _column(param) -> jax.Array | None:
    return None if param is None else param[...].reshape(-1, 1)


def _rows(*kernels) -> jax.Array:
    """``[in, ...out]`` kernels -> one ``[sum out, in]`` matrix (each flattened to 2-D, transposed)."""
    return jnp.concatenate([k.reshape(k.shape[0], -1).T for k in kernels], axis=0)


def _concat_bias(*biases) -> jax.Array | None:
    """One ``[sum dims, 1]`` column of the biases (a layer has all of them or none)."""
    if biases[0] is None:
        return None
    return jnp.concatenate([b[...].reshape(-1) for b in biases])[:, None]


def decode_weights(model: Decoder, merge_adapters: bool = True) -> DecodeWeights:
    """The ``[out, in]`` copies of ``model``'s weights that `decode_step` multiplies by (inside a
    jitted program: computed once, before the decode loop).

    A LoRA model's adapters are merged into them (`gd2po_jax.models.decoder.effective_kernel`): the
    copies exist anyway, so the merge costs one ``[in, r] @ [r, out]`` product per adapter per call
    and no memory, and each decode step runs as the base model's. ``merge_adapters=False`` keeps
    them apart (`LayerWeights.adapters`), two small products more per adapter per token: slower
    (docs/lora.md, ``python -m bench.bench_lora``), kept to measure that."""
    layers = []
    for layer in model.layers:
        attn, mlp = layer.attn, layer.mlp
        h, hd, d = attn.o_kernel.shape

        def kernel(module, name):
            adapter = getattr(module, f"{name}_lora") if merge_adapters else None
            return effective_kernel(getattr(module, f"{name}_kernel"), adapter, module.lora_scale)

        adapters = (
            {}
            if merge_adapters
            else {
                name: (adapter.lora_a[...].T, (module.lora_scale * adapter.lora_b[...].T).astype(adapter.lora_b.dtype))
                for module, names in ((attn, ("q", "k", "v", "o")), (mlp, ("gate", "up", "down")))
                for name in names
                if (adapter := getattr(module, f"{name}_lora")) is not None
            }
        )
        layers.append(
            LayerWeights(
                qkv=_rows(kernel(attn, "q"), kernel(attn, "k"), kernel(attn, "v")),
                qkv_bias=_concat_bias(attn.q_bias, attn.k_bias, attn.v_bias),
                o=kernel(attn, "o").reshape(h * hd, d).T,
                o_bias=_column(attn.o_bias),
                gate_up=_rows(kernel(mlp, "gate"), kernel(mlp, "up")),
                gate_up_bias=_concat_bias(mlp.gate_bias, mlp.up_bias),
                down=kernel(mlp, "down").T,
                down_bias=_column(mlp.down_bias),
                attn_norm=cast(jax.Array, _column(layer.attn_norm.scale)),  # a norm's scale is never None
                mlp_norm=cast(jax.Array, _column(layer.mlp_norm.scale)),
                q_norm=None if attn.q_norm is None else _column(attn.q_norm.scale),
                k_norm=None if attn.k_norm is None else _column(attn.k_norm.scale),
                adapters=adapters,
            )
        )
    if not model.has_lm_head:
        raise ValueError("this Decoder was built with lm_head=False (a score model's body): it cannot decode")
    return DecodeWeights(
        embed=model.embed[...],
        unembed=None if model.lm_head is None else model.lm_head[...].T,
        final_norm=cast(jax.Array, _column(model.final_norm.scale)),
        layers=tuple(layers),
    )


def _attend(q: jax.Array, keys: list[jax.Array], values: list[jax.Array], key_masks: list[jax.Array]) -> jax.Array:
    """Attention over a cache held in segments (one softmax over all of their slots).

    q: [N, KV, G, hd]; keys[j]: [N, KV, hd, S_j]; values[j]: [N, KV, S_j, hd] (`KVCache`'s
    layouts); key_masks[j]: [N, S_j]. Returns [N, KV, G, hd] in the values' dtype.
    """
    hd = q.shape[-1]
    scores = [
        jnp.where(
            mask[:, None, None, :],
            jnp.einsum("bkgd,bkds->bkgs", q, k, preferred_element_type=jnp.float32) * (hd**-0.5),
            MASK_VALUE,
        )
        for k, mask in zip(keys, key_masks)
    ]
    probs = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1).astype(values[0].dtype)
    out, start = None, 0
    for v in values:
        part = jnp.einsum(
            "bkgs,bksd->bkgd", probs[..., start : start + v.shape[2]], v, preferred_element_type=jnp.float32
        )
        out = part if out is None else out + part
        start += v.shape[2]
    return cast(jax.Array, out).astype(values[0].dtype)  # values has one segment at least


def decode_step(
    config: ModelConfig, weights: DecodeWeights, tokens: jax.Array, caches: tuple[KVCache, ...]
) -> tuple[jax.Array, tuple[KVCache, ...]]:
    """Feeds one token per row and returns the next-token logits.

    Args:
      config: the model's architecture.
      weights: `decode_weights` of the model.
      tokens: [N] int32, the token each row feeds (its last sampled one).
      caches: the rows' cache in segments, in slot order (`KVCache` each, of N rows; e.g. the
        prompt's, then the completion's chunks so far: `gd2po_jax.models.sampling`); the step attends over
        the valid slots of all of them, and slot ``index`` of the last one receives its keys and
        values. A one-segment tuple is the plain cache.

    Returns:
      logits ``[V, N]`` float32 (feature-major: transpose for per-row sampling) and the new caches
      (only the last one changed).
    """
    h_heads, kv_heads, hd = config.num_heads, config.num_kv_heads, config.head_dim
    groups = h_heads // kv_heads
    n = tokens.shape[0]
    *done, cache = caches
    index = cache.index
    # [N] the new token's position
    past = cast(jax.Array, sum(jnp.sum(c.valid, axis=-1, dtype=jnp.int32) for c in caches))
    key_valid = jax.lax.dynamic_update_slice(cache.valid, jnp.ones((n, 1), bool), (0, index))
    key_masks = [c.valid for c in done] + [key_valid & (jnp.arange(cache.max_length) <= index)[None, :]]
    angles = jnp.asarray(rope_inv_freq(config))[:, None] * past.astype(jnp.float32)[None, :]  # [hd/2, N]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    eps = config.rms_norm_eps

    h = jnp.take(weights.embed, tokens, axis=0).T  # [D, N]
    keys, values = [], []
    for i, layer in enumerate(weights.layers):
        q, k, v = layer_qkv(config, layer, h, cos, sin)
        cache_k, cache_v = cache.keys[i], cache.values[i]
        cache_k = jax.lax.dynamic_update_slice(
            cache_k, k.transpose(2, 0, 1)[..., None].astype(cache_k.dtype), (0, 0, 0, index)
        )
        cache_v = jax.lax.dynamic_update_slice(
            cache_v, v.transpose(2, 0, 1)[:, :, None].astype(cache_v.dtype), (0, 0, index, 0)
        )
        keys.append(cache_k)
        values.append(cache_v)
        q_rows = q.reshape(kv_heads, groups, hd, n).transpose(3, 0, 1, 2)  # [N, KV, G, hd]
        out = _attend(
            q_rows,
            [c.keys[i].astype(q.dtype) for c in done] + [cache_k.astype(q.dtype)],
            [c.values[i].astype(q.dtype) for c in done] + [cache_v.astype(q.dtype)],
            key_masks,
        )
        h = layer_output(config, layer, h, out.reshape(n, h_heads * hd).T)
    h = rms_norm(h, weights.final_norm, eps, axis=0)
    unembed = weights.embed if weights.unembed is None else weights.unembed
    logits = jnp.matmul(unembed, h, preferred_element_type=jnp.float32)  # [V, N]
    # Keeps the product [V, N]-shaped: without the barrier XLA folds the caller's transpose into it,
    # and an [N, V] output is the slow orientation again.
    logits = jax.lax.optimization_barrier(logits)
    return logits, (*done, KVCache(tuple(keys), tuple(values), key_valid, index + 1))


def layer_qkv(
    config: ModelConfig, layer: LayerWeights, h: jax.Array, cos: jax.Array, sin: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A layer's queries ``[H, hd, N]``, keys and values ``[KV, hd, N]`` of the residual stream
    ``h [D, N]`` (attention norm, one qkv product, biases, q/k norms, RoPE by ``cos, sin [hd/2, N]``)."""
    h_heads, kv_heads, hd, eps = config.num_heads, config.num_kv_heads, config.head_dim, config.rms_norm_eps
    n = h.shape[1]
    x = rms_norm(h, layer.attn_norm, eps, axis=0)
    qkv = layer.qkv @ x
    if layer.adapters:
        sizes = {"q": h_heads * hd, "k": kv_heads * hd, "v": kv_heads * hd}
        qkv = qkv + jnp.concatenate([_adapted(layer, name, x, sizes[name]) for name in "qkv"], axis=0)
    if layer.qkv_bias is not None:
        qkv = qkv + layer.qkv_bias
    q = qkv[: h_heads * hd].reshape(h_heads, hd, n)
    k = qkv[h_heads * hd : (h_heads + kv_heads) * hd].reshape(kv_heads, hd, n)
    v = qkv[(h_heads + kv_heads) * hd :].reshape(kv_heads, hd, n)
    if layer.q_norm is not None:
        q = rms_norm(q, layer.q_norm, eps, axis=1)
        k = rms_norm(k, cast(jax.Array, layer.k_norm), eps, axis=1)  # q_norm and k_norm come together
    return apply_rope(q, cos, sin, axis=1), apply_rope(k, cos, sin, axis=1), v


def layer_output(config: ModelConfig, layer: LayerWeights, h: jax.Array, attended: jax.Array) -> jax.Array:
    """The residual stream ``h [D, N]`` after a layer, from its attention's output ``[H hd, N]``
    (output projection, then the MLP, each added to the stream)."""
    attn_out = _affine(layer.o, attended, layer.o_bias)
    h = h + (attn_out if not layer.adapters else attn_out + _adapted(layer, "o", attended, layer.o.shape[0]))
    x = rms_norm(h, layer.mlp_norm, config.rms_norm_eps, axis=0)
    gate_up = _affine(layer.gate_up, x, layer.gate_up_bias)
    if layer.adapters:
        f = layer.down.shape[1]
        gate_up = gate_up + jnp.concatenate([_adapted(layer, name, x, f) for name in ("gate", "up")], axis=0)
    gate, up = jnp.split(gate_up, 2, axis=0)
    x = jax.nn.silu(gate) * up
    mlp_out = _affine(layer.down, x, layer.down_bias)
    return h + (mlp_out if not layer.adapters else mlp_out + _adapted(layer, "down", x, layer.down.shape[0]))


def _adapted(layer: LayerWeights, name: str, x: jax.Array, out: int) -> jax.Array:
    """``scale B^T (A^T x)`` ``[out, N]`` of adapter ``name`` applied unmerged (zeros without one:
    a block where its rows are concatenated with others')."""
    if name not in layer.adapters:
        return jnp.zeros((out, x.shape[1]), x.dtype)
    a_t, b_t = layer.adapters[name]
    return b_t.astype(x.dtype) @ (a_t.astype(x.dtype) @ x)


def _affine(matrix: jax.Array, x: jax.Array, bias: jax.Array | None) -> jax.Array:
    y = matrix @ x
    return y if bias is None else y + bias
