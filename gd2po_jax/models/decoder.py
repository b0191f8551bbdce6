"""Decoder-only transformer in Flax NNX: Qwen2/Qwen2.5, Qwen3 and Llama 3 in one module.

One module serves training forward passes, prefill and decode:

    logits = model(input_ids, attention_mask=mask)                 # [B, T, V] float32
    logits, cache = model(input_ids, attention_mask=mask, cache=cache)
    hidden, cache = model.hidden_states(input_ids, mask)           # [B, T, D], final norm applied
    logits = model.logits(hidden[:, a:b])                          # logits for a slice of positions
    hidden, _ = model.hidden_states(input_ids, mask, window=(a, n))  # [B, n, D]: positions a..a+n-1 only

Log-probs of tokens are computed from ``hidden_states`` by `gd2po_jax.models.logprobs`.

With ``window=(a, n)`` (training forwards, no cache) the last layer computes its queries, attention
output and MLP only at the ``n`` positions whose hidden states are returned (every layer still
computes keys and values at every position): the loss of a completion needs the last layer at the
completion's positions alone.

Left padding is handled through ``attention_mask``; positions default to ``cumsum(mask) - 1`` (plus
the number of tokens already in the cache), as Hugging Face ``generate`` does.

Attention (``Decoder(..., attention=...)``, `ATTENTION_IMPLEMENTATIONS`, resolved per backend by
`attention_implementation`): "plain" is `dot_product_attention` below (float32 scores under a
``[B, T, S]`` mask, a hand-written backward), the only path with a cache (sampling). "xla" and
"cudnn" are `jax.nn.dot_product_attention` with ``is_causal=True`` and no ``mask=`` (in JAX's cuDNN
path a mask becomes a bias whose gradient is always computed): the forward without a cache rolls
each row left by its number of leading pads (`roll_rows`), so that all its padding is on the right
and the causal mask alone is exact for every real token, and rolls the hidden states back after the
last layer. That needs rows without holes: pads before the tokens (the policy's left padding), after
them (score models' right padding) or both, never between two tokens. Pad positions' own outputs
differ from the plain path's (they are no token's input), and LoRA dropout's masks fall on other
positions (same distribution). "cudnn" (cuDNN's flash attention)
keeps no ``[T, S]`` score tensor; "xla" computes the same as plain and materializes float32 scores
(`jax.nn`'s XLA implementation is an einsum and a softmax).

Remat (``Decoder(..., remat=...)``, `REMAT_POLICIES`): every projection's output carries a
`jax.ad_checkpoint.checkpoint_name` (`PROJECTION_NAMES`), which the "minimal" policy saves.

Weight layout (``in`` before ``out``; heads kept as their own axis so they can be sharded):
``q_kernel [D, H, hd]``, ``k_kernel``/``v_kernel [D, KV, hd]``, ``o_kernel [H, hd, D]``,
``gate_kernel``/``up_kernel [D, F]``, ``down_kernel [F, D]``, ``embed [V, D]``, ``lm_head [D, V]``.
Every projection is `linear` (the plain product, with a backward pass that reads both operands of
the weight gradient in their natural layouts). Every parameter carries an ``out_sharding``
annotation over the mesh axes "fsdp" and "tensor" (see `gd2po_jax.runtime.sharding`).

LoRA (``Decoder(..., lora=LoRASpec(...))``): a projection named in ``LoRASpec.targets`` gets an
adapter, Flax's own `nnx.LoRA` (``lora_a [in, r]``, ``lora_b [r, out]``, `nnx.LoRAParam` variables,
so ``nnx.split(model, nnx.LoRAParam, nnx.Param)`` separates them from the base), and computes
``x @ W + (alpha / r) * (x @ A) @ B``, as PEFT's ``lora.Linear`` does. The in/out of an adapter are
its projection's flattened ones: q ``[D, H*hd]``, k/v ``[D, KV*hd]``, o ``[H*hd, D]``, gate/up
``[D, F]``, down ``[F, D]`` (PEFT's ``lora_A.weight [r, in]`` and ``lora_B.weight [out, r]`` are
their transposes). A is initialised as PEFT does (kaiming-uniform, bound ``1/sqrt(in)``), B to
zeros: a fresh adapter leaves the model as it was. `effective_kernel` is a projection's kernel with
its adapter merged in (the sampler's decode weights and the merged export).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.ad_checkpoint import checkpoint_name

from gd2po_jax.config import ATTENTION_IMPLEMENTATIONS, LORA_TARGETS, REMAT_POLICIES, remat_policy_name
from gd2po_jax.models.config import ModelConfig, rope_inv_freq

log = logging.getLogger(__name__)

MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
"""A masked key's attention score: finite, so a fully masked row (a left-pad query) softmaxes to uniform, not NaN."""

PROJECTION_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The `checkpoint_name` of each projection's output (its adapter included), in the order of the
layers' dropout slots 0..6; the ``minimal`` remat policy saves them."""

FLASH_IMPLEMENTATIONS = ("xla", "cudnn")
"""The `jax.nn.dot_product_attention` implementations (rows rolled to right padding, causal mask only)."""

CUDNN_DTYPES = ("bfloat16", "float16")
"""The compute dtypes of cuDNN's flash attention (a float32 model on a GPU attends with the plain path)."""


def remat_policy(name: str) -> Callable[..., bool] | None:
    """The `jax.checkpoint` policy of a `REMAT_POLICIES` name other than "none": None (save nothing
    but the layer's input) for "full"; `jax.checkpoint_policies.save_only_these_names` of
    `PROJECTION_NAMES` for "minimal" (MaxText's); ``dots_with_no_batch_dims_saveable`` for "dots"."""
    policies = {
        "full": None,
        "minimal": jax.checkpoint_policies.save_only_these_names(*PROJECTION_NAMES),
        "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    }
    if name not in policies:
        raise ValueError(f'remat policy {name!r}: one of {tuple(policies)} ("none" is no remat)')
    return policies[name]


def select_attention(requested: str, platform: str, dtype, head_dim: int) -> str:
    """The attention a forward without a cache asks for (pure: no device is queried).

    requested: one of `ATTENTION_IMPLEMENTATIONS`; platform: the backend's (``jax.default_backend()``:
    "cpu", "gpu", "tpu"); dtype: the compute dtype; head_dim: the width of a head.

    "auto" is "cudnn" on a GPU when cuDNN's flash attention takes the shape (bfloat16 or float16,
    a head width that is a multiple of 8 up to 128), else "plain": on XLA:CPU the plain path's
    hand-written backward is the faster one (docs/speed.md, `bench/gpu_gains.py --cpu-smoke`
    measures both), and "xla" materializes the same float32 scores. Any other request is returned
    as it is (`attention_implementation` checks that cuDNN runs).
    """
    if requested not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"attention {requested!r}: one of {ATTENTION_IMPLEMENTATIONS}")
    if requested != "auto":
        return requested
    cudnn_shape = jnp.dtype(dtype).name in CUDNN_DTYPES and head_dim % 8 == 0 and head_dim <= 128
    return "cudnn" if platform in ("gpu", "cuda") and cudnn_shape else "plain"


@functools.cache
def cudnn_attention_failure(head_dim: int, dtype_name: str) -> str | None:
    """None when cuDNN's flash attention (causal, grouped queries) compiles, runs forward and backward
    on the default backend at this head width and dtype; else why not, in one line. Cached: asked
    once per process and shape (a run's log says a failure once)."""
    try:
        with jax.ensure_compile_time_eval():  # concrete even when asked while a program is traced
            dtype = jnp.dtype(dtype_name)
            q = jnp.ones((1, 128, 2, head_dim), dtype)
            kv = jnp.ones((1, 128, 1, head_dim), dtype)

            def total(q, k, v):
                out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
                return jnp.sum(out.astype(jnp.float32))

            jax.block_until_ready(jax.jit(jax.grad(total, argnums=(0, 1, 2)))(q, kv, kv))
    except Exception as error:  # noqa: BLE001  any failure (no cuDNN, a version without the kernel) -> plain
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    return None


def attention_implementation(requested: str, platform: str, dtype, head_dim: int) -> str:
    """`select_attention`, with "cudnn" checked on the device (`cudnn_attention_failure`): where it
    fails, "plain", said once in the log."""
    chosen = select_attention(requested, platform, dtype, head_dim)
    if chosen != "cudnn":
        return chosen
    failure = cudnn_attention_failure(int(head_dim), jnp.dtype(dtype).name)
    if failure is None:
        return "cudnn"
    _log_fallback(requested, failure)
    return "plain"


@functools.cache
def _log_fallback(requested: str, failure: str) -> None:
    log.warning(
        "model.attention=%s: cuDNN's flash attention does not run here (%s); the plain path attends", requested, failure
    )


def roll_rows(x: jax.Array, shift: jax.Array) -> jax.Array:
    """``x [B, T, ...]`` with row b rolled left by ``shift[b]`` (``[B]`` int): ``out[b, t] = x[b, (t +
    shift[b]) mod T]``. Rolling by the number of left pads puts them on the right; ``-shift`` rolls back."""
    t = x.shape[1]
    index = (jnp.arange(t, dtype=jnp.int32)[None, :] + shift.astype(jnp.int32)[:, None]) % t
    return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


@struct.dataclass
class RolledRows:
    """The mask argument of the layers on the flash path (instead of a ``[B, T, S]`` mask): the rows
    are rolled left by ``shift [B]`` (their leading pads, now on the right), and attention is
    `jax.nn.dot_product_attention` with ``implementation`` ("xla" or "cudnn") and a causal mask."""

    shift: jax.Array
    implementation: str = struct.field(pytree_node=False, default="xla")


def _param(rngs: nnx.Rngs | None, shape, sharding, dtype, init: str = "normal") -> nnx.Param:
    """A parameter with a partition annotation (placement is done by `gd2po_jax.runtime.sharding`)."""
    if init == "normal":
        assert rngs is not None  # a random init needs the keys
        value = 0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)
    elif init == "ones":
        value = jnp.ones(shape, jnp.float32)
    else:
        value = jnp.zeros(shape, jnp.float32)
    return nnx.Param(value.astype(dtype), out_sharding=sharding, eager_sharding=False)


LORA_A_INIT = jax.nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")
"""PEFT's init of ``lora_A`` (torch's kaiming_uniform_ with a=sqrt(5)): uniform in ``+-1/sqrt(in)``."""


@dataclasses.dataclass(frozen=True)
class LoRASpec:
    """The adapters of a `Decoder` (static: part of its graph).

    rank: r (> 0); alpha: the adapters' output is scaled by ``alpha / rank`` (PEFT's ``lora_alpha``);
    targets: projections with an adapter, a subset of `LORA_TARGETS`; dtype: the adapters' parameter
    dtype (the base may be held in a lower one).
    """

    rank: int
    alpha: float
    targets: tuple[str, ...] = LORA_TARGETS
    dtype: str = "float32"

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
        unknown = sorted(set(self.targets) - set(LORA_TARGETS))
        if unknown or not self.targets:
            raise ValueError(f"LoRA targets {self.targets!r}: each must be one of {LORA_TARGETS}")

    @property
    def scale(self) -> float:
        return float(self.alpha) / self.rank


def _adapter(spec: LoRASpec, in_features: int, out_features: int, in_axis, out_axis, rngs: nnx.Rngs) -> nnx.LoRA:
    """An `nnx.LoRA` ``A [in, r]``, ``B [r, out]`` (PEFT's init), sharded as its projection's in and
    out axes."""
    return nnx.LoRA(
        in_features,
        spec.rank,
        out_features,
        param_dtype=jnp.dtype(spec.dtype),
        a_initializer=LORA_A_INIT,
        rngs=rngs,
        a_metadata={"out_sharding": (in_axis, None), "eager_sharding": False},
        b_metadata={"out_sharding": (None, out_axis), "eager_sharding": False},
    )


def lora_delta(
    adapter: nnx.LoRA | None, scale: float, x: jax.Array, y: jax.Array, dropout=None, slot: int = 0
) -> jax.Array:
    """``y + scale * (dropout(x) @ A) @ B`` (``x [..., in]``, ``y [..., out]``); ``y`` without an adapter.

    dropout: None, or ``(key, rate)``: PEFT's ``lora_dropout`` on the adapter's input (zeroes with
    probability ``rate``, scales the rest by ``1 / (1 - rate)``), its mask drawn from ``key`` folded
    with ``slot`` (each adapter of a layer its own, as PEFT's modules draw theirs).
    """
    if adapter is None:
        return y
    if dropout is not None:
        key, rate = dropout
        keep = jax.random.bernoulli(jax.random.fold_in(key, slot), 1.0 - rate, x.shape)
        x = jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)
    return y + (scale * adapter(x)).astype(y.dtype)


def effective_kernel(kernel: nnx.Param, adapter: nnx.LoRA | None, scale: float) -> jax.Array:
    """The kernel (any of the layouts above) with its adapter merged in: ``W + scale * A @ B``,
    reshaped to ``W``'s shape, in ``W``'s dtype (computed in the wider of the two)."""
    w = kernel[...]
    if adapter is None:
        return w
    a, b = adapter.lora_a[...], adapter.lora_b[...]
    wide = jnp.promote_types(w.dtype, a.dtype)
    delta = scale * (a.astype(wide) @ b.astype(wide))
    return (w.astype(wide) + delta.reshape(w.shape)).astype(w.dtype)


@struct.dataclass
class KVCache:
    """Preallocated key/value cache.

    keys: one ``[B, KV, hd, S]`` array per layer: slots last, so that a query's scores are a plain
      ``[G, hd] x [hd, S]`` product per row and head (on XLA:CPU the ``[S, hd]`` layout made a
      decode step's attention 1.3-1.8x slower; `bench/decode_layouts.py` measures both).
    values: one ``[B, KV, S, hd]`` array per layer (the layout of the probabilities' product).
    valid: ``[B, S]`` bool, slots that hold a real (non-pad) token.
    index: ``[]`` int32, the next slot to write; every row writes the same slot (left padding).
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    valid: jax.Array
    index: jax.Array

    if TYPE_CHECKING:  # flax.struct.dataclass adds replace() (dataclasses.replace), undeclared in its typing

        def replace(self, **changes: Any) -> KVCache: ...

    @property
    def max_length(self) -> int:
        return self.valid.shape[1]


def init_cache(config: ModelConfig, batch: int, max_length: int, dtype=jnp.float32) -> KVCache:
    """An empty cache for ``batch`` rows of at most ``max_length`` tokens (prompt + completion)."""
    key_shape = (batch, config.num_kv_heads, config.head_dim, max_length)
    value_shape = (batch, config.num_kv_heads, max_length, config.head_dim)
    return KVCache(
        keys=tuple(jnp.zeros(key_shape, dtype) for _ in range(config.num_layers)),
        values=tuple(jnp.zeros(value_shape, dtype) for _ in range(config.num_layers)),
        valid=jnp.zeros((batch, max_length), bool),
        index=jnp.zeros((), jnp.int32),
    )


@jax.custom_vjp
def linear(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``x [..., K] @ kernel [K, F] -> [..., F]``, with a backward pass that takes the weight
    gradient as ``x^T [K, R] @ dy [R, F]`` over the R = prod(...) rows.

    The gradient is the plain product's; only its program differs. Left to itself, XLA (on CPU)
    computes ``dkernel`` as ``(dy^T x)^T`` and fuses the transpose of ``dy``, the larger operand of
    an MLP, into the elementwise work that produces it, a strided write that cost more than the
    product. Here ``x^T`` is materialized (the barrier keeps XLA from folding it back into the
    product's dimensions), so the product reads both operands in their natural layouts.
    """
    return x @ kernel


def _linear_fwd(x, kernel):
    return x @ kernel, (x, kernel)


def _linear_bwd(residuals, dy):
    x, kernel = residuals
    rows_t = jax.lax.optimization_barrier(x.reshape(-1, x.shape[-1]).T)
    dkernel = rows_t @ dy.reshape(-1, dy.shape[-1]).astype(rows_t.dtype)
    dx = dy @ kernel.T.astype(dy.dtype)
    return dx.astype(x.dtype), dkernel.astype(kernel.dtype)


linear.defvjp(_linear_fwd, _linear_bwd)


def default_positions(attention_mask: jax.Array, past_tokens: jax.Array | int = 0) -> jax.Array:
    """Positions ``[B, T]``: ``past + cumsum(mask) - 1`` on real tokens, ``past`` on left pads."""
    mask = attention_mask.astype(jnp.int32)
    return jnp.asarray(past_tokens, jnp.int32)[..., None] * jnp.ones_like(mask) + jnp.where(
        mask > 0, jnp.cumsum(mask, axis=-1) - 1, 0
    )


def rope_tables(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """cos, sin ``[B, T, 1, hd/2]`` (float32) for integer ``positions [B, T]``."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    return jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, axis: int = -1) -> jax.Array:
    """Rotates ``x [B, T, N, hd]`` in the "rotate half" convention used by transformers; ``axis`` is
    the head-dimension axis (``cos``, ``sin`` broadcast against ``x`` with half of it there)."""
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=axis)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=axis)
    return out.astype(x.dtype)


def attention_mask_3d(key_valid: jax.Array, index: jax.Array, num_queries: int) -> jax.Array:
    """``[B, T, S]`` bool: query t (in slot ``index + t``) sees valid key slots ``s <= index + t``."""
    slots = jnp.arange(key_valid.shape[1])
    query_slots = index + jnp.arange(num_queries)
    causal = slots[None, :] <= query_slots[:, None]
    return key_valid[:, None, :] & causal[None]


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention, softmax in float32.

    q: [B, T, H, hd]; k, v: [B, KV, S, hd]; mask: [B, T, S] bool. Returns [B, T, H, hd].
    """
    b, t, h, hd = q.shape
    kv = k.shape[1]
    out = _grouped_attention(q.reshape(b, t, kv, h // kv, hd), k, v, mask)
    return out.reshape(b, t, h, hd)


def _attention_probs(q, k, mask):
    """Softmax weights ``[B, KV, G, T, S]`` (float32) of q ``[B, T, KV, G, hd]`` over keys ``[B, KV, S, hd]``."""
    scores = jnp.einsum("btkgd,bksd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = scores * (q.shape[-1] ** -0.5)
    scores = jnp.where(mask[:, None, None], scores, MASK_VALUE)
    return jax.nn.softmax(scores, axis=-1)


@jax.custom_vjp
def _grouped_attention(q, k, v, mask):
    """``softmax(q k^T / sqrt(hd)) v``: q ``[B, T, KV, G, hd]``, k, v ``[B, KV, S, hd]``, mask
    ``[B, T, S]`` -> ``[B, T, KV, G, hd]``.

    The gradient is the softmax's, written with the identity ``sum_s P_ts dP_ts = sum_d O_td dO_td``
    (FlashAttention's backward): the row sums the softmax's backward needs come from the ``[T, hd]``
    output instead of the ``[T, S]`` weights. Autodiff's reduction over the weights was the largest
    single operation of the embedded warm start's step on XLA:CPU (``python -m bench.bench_sft
    --profile``, docs/speed.md); this one reads a ``[T, hd]`` pair instead.
    """
    return _grouped_attention_fwd(q, k, v, mask)[0]


def _grouped_attention_fwd(q, k, v, mask):
    probs = _attention_probs(q, k, mask).astype(v.dtype)
    out = jnp.einsum("bkgts,bksd->btkgd", probs, v)
    return out, (q, k, v, mask, probs, out)


def _grouped_attention_bwd(residuals, d_out):
    q, k, v, mask, probs, out = residuals
    d_v = jnp.einsum("bkgts,btkgd->bksd", probs, d_out.astype(probs.dtype))
    d_probs = jnp.einsum("btkgd,bksd->bkgts", d_out, v, preferred_element_type=jnp.float32)
    row_sums = jnp.einsum("btkgd,btkgd->bkgt", d_out.astype(jnp.float32), out.astype(jnp.float32))
    d_scores = probs.astype(jnp.float32) * (d_probs - row_sums[..., None]) * (q.shape[-1] ** -0.5)
    # Masked scores are a constant: no gradient (a query with no valid key has uniform weights).
    d_scores = jnp.where(mask[:, None, None], d_scores, 0.0).astype(q.dtype)
    d_q = jnp.einsum("bkgts,bksd->btkgd", d_scores, k)
    d_k = jnp.einsum("bkgts,btkgd->bksd", d_scores, q)
    return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype), None


_grouped_attention.defvjp(_grouped_attention_fwd, _grouped_attention_bwd)


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, implementation: str) -> jax.Array:
    """Causal grouped-query attention by `jax.nn.dot_product_attention`, rows right-padded (`RolledRows`).

    q: [B, T, H, hd]; k, v: [B, T, KV, hd] (q's dtype); implementation: "xla" or "cudnn". Returns
    [B, T, H, hd]: query t attends to keys 0..t, softmax ``q k^T / sqrt(hd)`` in float32.
    """
    which = cast(Literal["xla", "cudnn"], implementation)
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=which)


class RMSNorm(nnx.Module):
    """``scale * x / sqrt(mean(x^2) + eps)``, normalised in float32 (as transformers does)."""

    def __init__(self, dim: int, eps: float, dtype):
        self.scale = _param(None, (dim,), (None,), dtype, init="ones")
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.scale[...], self.eps)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, axis: int = -1) -> jax.Array:
    """``scale * x / sqrt(mean(x^2) + eps)`` over ``axis``, normalised in float32; ``scale``
    broadcasts against ``x``."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=axis, keepdims=True) + eps)
    return scale * normed.astype(x.dtype)


class Attention(nnx.Module):
    """Self-attention with GQA, RoPE, optional q/k/v/o biases and optional per-head q/k RMSNorm."""

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs):
        d, h, kv, hd = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        self.q_kernel = _param(rngs, (d, h, hd), ("fsdp", "tensor", None), dtype)
        self.k_kernel = _param(rngs, (d, kv, hd), ("fsdp", "tensor", None), dtype)
        self.v_kernel = _param(rngs, (d, kv, hd), ("fsdp", "tensor", None), dtype)
        self.o_kernel = _param(rngs, (h, hd, d), ("tensor", None, "fsdp"), dtype)
        bias = config.qkv_bias
        self.q_bias = _param(None, (h, hd), ("tensor", None), dtype, "zeros") if bias else None
        self.k_bias = _param(None, (kv, hd), ("tensor", None), dtype, "zeros") if bias else None
        self.v_bias = _param(None, (kv, hd), ("tensor", None), dtype, "zeros") if bias else None
        self.o_bias = _param(None, (d,), (None,), dtype, "zeros") if config.o_bias else None
        eps = config.rms_norm_eps
        self.q_norm = RMSNorm(hd, eps, dtype) if config.qk_norm else None
        self.k_norm = RMSNorm(hd, eps, dtype) if config.qk_norm else None
        self.q_lora = self.k_lora = self.v_lora = self.o_lora = nnx.data(None)  # `add_adapters`
        self.lora_scale = 0.0

    def add_adapters(self, spec: LoRASpec, rngs: nnx.Rngs) -> None:
        """An `nnx.LoRA` on each of q, k, v, o that ``spec`` targets (see the module docstring)."""
        d, h, hd = self.q_kernel.shape
        kv = self.k_kernel.shape[1]
        shapes = {
            "q": (d, h * hd, "fsdp", "tensor"),
            "k": (d, kv * hd, "fsdp", "tensor"),
            "v": (d, kv * hd, "fsdp", "tensor"),
            "o": (h * hd, d, "tensor", "fsdp"),
        }
        for name, (fan_in, fan_out, in_axis, out_axis) in shapes.items():
            if name in spec.targets:
                setattr(self, f"{name}_lora", _adapter(spec, fan_in, fan_out, in_axis, out_axis, rngs))
        self.lora_scale = spec.scale

    def _project(self, x, kernel, bias, norm, adapter=None, dropout=None, slot=0):
        """``x [B, T, D] -> [B, T, N, hd]``; the kernel is used as a [D, N*hd] matrix (free reshape);
        the output is named ``PROJECTION_NAMES[slot]``."""
        d, n, hd = kernel.shape
        y = lora_delta(adapter, self.lora_scale, x, linear(x, kernel[...].reshape(d, n * hd)), dropout, slot)
        y = checkpoint_name(y, PROJECTION_NAMES[slot]).reshape(*x.shape[:-1], n, hd)
        if bias is not None:
            y = y + bias[...]
        return norm(y) if norm is not None else y

    def _output(self, out, dropout):
        """The output projection of the heads' outputs ``[B, T, H, hd]`` -> ``[B, T, D]`` (named "o_proj")."""
        h, hd, d = self.o_kernel.shape
        out = out.reshape(*out.shape[:2], h * hd)
        out = lora_delta(
            self.o_lora, self.lora_scale, out, linear(out, self.o_kernel[...].reshape(h * hd, d)), dropout, 3
        )
        out = checkpoint_name(out, PROJECTION_NAMES[3])
        return out + self.o_bias[...] if self.o_bias is not None else out

    def _flash(self, x, cos, sin, rows: RolledRows, dropout, window):
        """The flash path (`RolledRows`, no cache): queries at every position (the window, if any, is
        taken from the attention's output rolled back to the rows' own positions). Returns as
        ``__call__``: (out [B, T or n, D], (keys [B, KV, T, hd], values [B, KV, T, hd]))."""
        q = apply_rope(self._project(x, self.q_kernel, self.q_bias, self.q_norm, self.q_lora, dropout, 0), cos, sin)
        k = apply_rope(self._project(x, self.k_kernel, self.k_bias, self.k_norm, self.k_lora, dropout, 1), cos, sin)
        v = self._project(x, self.v_kernel, self.v_bias, None, self.v_lora, dropout, 2)
        out = flash_attention(q, k.astype(q.dtype), v.astype(q.dtype), rows.implementation)
        if window is not None:
            out = roll_rows(out, -rows.shift)[:, window[0] : window[0] + window[1]]
        return self._output(out, dropout), (k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3))

    def __call__(self, x, cos, sin, mask, kv_cache, index, dropout=None, window=None):
        """x: [B, T, D]; cos, sin: [B, T, 1, hd/2]; mask: [B, T, S], or `RolledRows` (the flash
        path: rows rolled to right padding, no cache);
        kv_cache: None or (keys [B, KV, hd, S], values [B, KV, S, hd]) (`KVCache`'s layouts) to
        write at slot ``index``; dropout: None or the adapters' ``(key, rate)`` (`lora_delta`);
        window: None or ``(a, n)`` (static): queries at positions ``a..a+n-1`` only (no cache).
        Returns (out [B, T or n, D], (keys, values)): the updated cache's, or without a cache this
        call's keys [B, KV, T, hd] and values [B, KV, T, hd]."""
        if isinstance(mask, RolledRows):
            return self._flash(x, cos, sin, mask, dropout, window)
        x_q, cos_q, sin_q = x, cos, sin
        if window is not None:
            first, count = window
            x_q, cos_q, sin_q = (a[:, first : first + count] for a in (x, cos, sin))
            mask = mask[:, first : first + count]
        q = self._project(x_q, self.q_kernel, self.q_bias, self.q_norm, self.q_lora, dropout, 0)
        q = apply_rope(q, cos_q, sin_q)
        k = apply_rope(self._project(x, self.k_kernel, self.k_bias, self.k_norm, self.k_lora, dropout, 1), cos, sin)
        v = self._project(x, self.v_kernel, self.v_bias, None, self.v_lora, dropout, 2)
        v = v.transpose(0, 2, 1, 3)
        if kv_cache is None:
            k = k.transpose(0, 2, 1, 3)
        else:
            k = jax.lax.dynamic_update_slice(
                kv_cache[0], k.transpose(0, 2, 3, 1).astype(kv_cache[0].dtype), (0, 0, 0, index)
            )
            v = jax.lax.dynamic_update_slice(kv_cache[1], v.astype(kv_cache[1].dtype), (0, 0, index, 0))
        # The cache's keys are [B, KV, hd, S]; a call with the cache (prefill, a chunk of tokens)
        # attends with them as [B, KV, S, hd], the training forward's layout, materialized (the
        # barrier) so that XLA does not fold the transpose into the product: folded, XLA:CPU turned
        # the product into one its bf16 x bf16 -> f32 dot kernel does not support.
        keys = k if kv_cache is None else jax.lax.optimization_barrier(k.swapaxes(-1, -2))
        out = dot_product_attention(q, keys.astype(q.dtype), v.astype(q.dtype), mask)
        return self._output(out, dropout), (k, v)


class MLP(nnx.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs):
        d, f = config.hidden_size, config.intermediate_size
        self.gate_kernel = _param(rngs, (d, f), ("fsdp", "tensor"), dtype)
        self.up_kernel = _param(rngs, (d, f), ("fsdp", "tensor"), dtype)
        self.down_kernel = _param(rngs, (f, d), ("tensor", "fsdp"), dtype)
        bias = config.mlp_bias
        self.gate_bias = _param(None, (f,), ("tensor",), dtype, "zeros") if bias else None
        self.up_bias = _param(None, (f,), ("tensor",), dtype, "zeros") if bias else None
        self.down_bias = _param(None, (d,), (None,), dtype, "zeros") if bias else None
        self.gate_lora = self.up_lora = self.down_lora = nnx.data(None)  # `add_adapters`
        self.lora_scale = 0.0

    def add_adapters(self, spec: LoRASpec, rngs: nnx.Rngs) -> None:
        """An `nnx.LoRA` on each of gate, up, down that ``spec`` targets."""
        d, f = self.gate_kernel.shape
        shapes = {"gate": (d, f, "fsdp", "tensor"), "up": (d, f, "fsdp", "tensor"), "down": (f, d, "tensor", "fsdp")}
        for name, (fan_in, fan_out, in_axis, out_axis) in shapes.items():
            if name in spec.targets:
                setattr(self, f"{name}_lora", _adapter(spec, fan_in, fan_out, in_axis, out_axis, rngs))
        self.lora_scale = spec.scale

    def _linear(self, x, kernel, bias, adapter, dropout=None, slot=0):
        y = lora_delta(adapter, self.lora_scale, x, linear(x, kernel[...]), dropout, slot)
        y = checkpoint_name(y, PROJECTION_NAMES[slot])
        return y + bias[...] if bias is not None else y

    def __call__(self, x: jax.Array, dropout=None) -> jax.Array:
        """x: [B, T, D] -> [B, T, D]; dropout: None or the adapters' ``(key, rate)`` (`lora_delta`)."""
        gate = self._linear(x, self.gate_kernel, self.gate_bias, self.gate_lora, dropout, 4)
        up = self._linear(x, self.up_kernel, self.up_bias, self.up_lora, dropout, 5)
        return self._linear(jax.nn.silu(gate) * up, self.down_kernel, self.down_bias, self.down_lora, dropout, 6)


class DecoderLayer(nnx.Module):
    """Pre-norm block: ``h += attn(norm(h)); h += mlp(norm(h))``."""

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.attn = Attention(config, dtype, rngs)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = MLP(config, dtype, rngs)

    def __call__(self, h, cos, sin, mask, kv_cache, index, dropout=None, window=None):
        """h [B, T, D] -> (h [B, T, D], keys and values); with ``window=(a, n)`` (static, no cache)
        the output is positions ``a..a+n-1`` only, [B, n, D] (`Attention`)."""
        attn_out, kv = self.attn(self.attn_norm(h), cos, sin, mask, kv_cache, index, dropout, window)
        if window is not None:
            if isinstance(mask, RolledRows):  # the window is of the rows' own positions
                h = roll_rows(h, -mask.shift)
            h = h[:, window[0] : window[0] + window[1]]
        h = h + attn_out
        return h + self.mlp(self.mlp_norm(h), dropout), kv


def _run_layer(
    layer: DecoderLayer, h, cos, sin, mask, kv_cache, index, dropout_key=None, dropout_rate=0.0, window=None
):
    dropout = None if dropout_key is None else (dropout_key, dropout_rate)
    return layer(h, cos, sin, mask, kv_cache, index, dropout, window)


def _with_window(run, window):
    """``run`` with its ``window`` bound: closed over (static), so that `nnx.remat` does not trace it."""

    def run_window(*args):
        return run(*args, window=window)

    return run_window


def _remat_scan(layers, h, cos, sin, mask, index, dropout, policy=None):
    """``h`` through ``layers`` rematerialised, as one `jax.lax.scan` over their stacked variables
    (the training forward, no cache).

    Each layer's forward is recomputed inside its own iteration of the backward loop, so only the
    layers' inputs ``[L, B, T, D]`` are kept. As a Python loop of `nnx.remat` layers, XLA (its CPU
    backend, measured) scheduled every layer's recomputation at once and kept it all alive: remat
    then saved nothing. XLA also compiles one layer instead of L copies. The stack is a copy of the
    layers' weights in their dtype (``[L, ...]`` each); the gradient flows back through it.

    Args:
      layers: the `DecoderLayer` list (one structure: the same projections and adapters).
      h: [B, T, D] the embeddings; cos, sin, mask, index: as `DecoderLayer` takes them.
      dropout: None or the adapters' ``(key, rate)``; layer i draws from ``fold_in(key, i)``, as
        the loop does.
      policy: the `jax.checkpoint` policy (`remat_policy`): None keeps the layer's input alone.

    Returns: h [B, T, D] after the last layer (before the final norm).
    """
    graphdef, first = nnx.split(layers[0])
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), first, *(nnx.split(layer)[1] for layer in layers[1:]))

    @functools.partial(jax.checkpoint, prevent_cse=False, policy=policy)  # in a scan CSE cannot merge iterations
    def body(h, xs):
        state, i = xs
        layer = nnx.merge(graphdef, state)
        if dropout is None:
            h, _ = _run_layer(layer, h, cos, sin, mask, None, index)
        else:
            h, _ = _run_layer(layer, h, cos, sin, mask, None, index, jax.random.fold_in(dropout[0], i), dropout[1])
        return h, None

    h, _ = jax.lax.scan(body, h, (stacked, jnp.arange(len(layers))))
    return h


class Decoder(nnx.Module):
    """Causal language model. See the module docstring for the call forms.

    Args:
      config: architecture (see `gd2po_jax.models.config`).
      dtype: parameter and activation dtype (float32 or bfloat16); norms, softmax, RoPE and logits
        are computed in float32.
      rngs: initialiser keys (random normal(0.02) weights, as transformers initialises).
      remat: what each layer keeps for the backward pass, a `REMAT_POLICIES` name ("none": all;
        "full": its input; "minimal": its input and projections' outputs; "dots": JAX's
        ``dots_with_no_batch_dims_saveable``) or a boolean (True: "full", False: "none"); any but
        "none" trades compute for memory, and without a cache the layers then run as one scan
        (`_remat_scan`; a 1-layer model uses `nnx.remat`).
      lm_head: build the output projection; False gives the body alone (embeddings, layers, final
        norm), as score models use it (`gd2po_jax.models.score_model`): then `logits` raises.
      lora: adapters on the projections it targets (see the module docstring), drawn from ``rngs``
        after every base parameter (the base is the same with or without them); None: none.
      attention: one of `ATTENTION_IMPLEMENTATIONS`, for forwards without a cache (see the module
        docstring); resolved at trace time for the backend and compute dtype (`attention_implementation`).
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype=jnp.float32,
        rngs: nnx.Rngs,
        remat: bool | str = False,
        lm_head: bool = True,
        lora: LoRASpec | None = None,
        attention: str = "auto",
    ):
        self.config = config
        self.dtype = jnp.dtype(dtype)
        policy = remat_policy_name(remat)
        if policy is None:
            raise ValueError(f"remat={remat!r}: one of {REMAT_POLICIES} or a boolean")
        if attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"attention={attention!r}: one of {ATTENTION_IMPLEMENTATIONS}")
        self.remat = policy
        self.attention = attention
        self.has_lm_head = lm_head
        self.embed = _param(rngs, (config.vocab_size, config.hidden_size), ("tensor", "fsdp"), dtype)
        self.layers = nnx.List([DecoderLayer(config, dtype, rngs) for _ in range(config.num_layers)])
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = (
            None
            if config.tie_word_embeddings or not lm_head
            else _param(rngs, (config.hidden_size, config.vocab_size), ("fsdp", "tensor"), dtype)
        )
        self.lora = lora
        if lora is not None:
            for layer in self.layers:
                layer.attn.add_adapters(lora, rngs)
                layer.mlp.add_adapters(lora, rngs)

    def hidden_states(
        self, input_ids, attention_mask=None, *, positions=None, cache=None, lora_dropout=None, window=None
    ):
        """Final-norm hidden states ``[B, T, D]`` and the updated cache (None without a cache).

        input_ids: [B, T] int; attention_mask: [B, T] (1 = token, 0 = left pad), default all ones;
        positions: [B, T] int, default `default_positions`; cache: `KVCache` whose slots
        ``[cache.index, cache.index + T)`` receive this call's keys and values; lora_dropout: None,
        or ``(key, rate)``: PEFT's ``lora_dropout`` on the adapters' inputs (`lora_delta`; the
        update's forward, never sampling), a mask per layer and adapter drawn from ``key``;
        window: None, or ``(a, n)`` (static ints, no cache): only positions ``a..a+n-1`` are
        returned, ``[B, n, D]``, and the last layer computes its queries, attention output and MLP at
        them alone: the same values as ``hidden[:, a:a+n]`` up to float sums (with LoRA dropout, the
        last layer's masks are drawn over the window's shape).
        """
        b, t = input_ids.shape
        if window is not None:
            window = (int(window[0]), int(window[1]))
            if cache is not None or not (0 <= window[0] and window[1] >= 1 and window[0] + window[1] <= t):
                raise ValueError(f"window={window}: needs no cache and 0 <= a, 1 <= n, a + n <= T = {t}")
        mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        h = jnp.take(self.embed[...], input_ids, axis=0)
        implementation = "plain" if cache is not None else self.attention_implementation(h.dtype)
        if cache is None:
            key_valid, index = mask, jnp.zeros((), jnp.int32)
        else:
            index = cache.index
            key_valid = jax.lax.dynamic_update_slice(cache.valid, mask, (0, index))
        if positions is None:
            past = 0 if cache is None else jnp.sum(cache.valid, axis=-1, dtype=jnp.int32)
            positions = default_positions(mask, past)
        cos, sin = rope_tables(positions, rope_inv_freq(self.config))
        shift = None
        if implementation == "plain":
            attn_mask: jax.Array | RolledRows = attention_mask_3d(key_valid, index, t)
        else:  # left pads to the right: the causal mask alone is exact (see the module docstring)
            shift = jnp.sum(jnp.cumsum(mask, axis=-1) == 0, axis=-1, dtype=jnp.int32)  # each row's leading pads
            attn_mask = RolledRows(shift, implementation)
            h, cos, sin = roll_rows(h, shift), roll_rows(cos, shift), roll_rows(sin, shift)
        # Remat only matters for backprop; with a KV cache (sampling) it is skipped, as nnx.remat
        # inside the decode while_loop raises TraceContextError. Without one, the layers are scanned.
        run = _run_layer
        if lora_dropout is not None and self.lora is not None and lora_dropout[1] > 0:
            rate = float(lora_dropout[1])  # static: in the layer's program, not an argument of remat

            def run(layer, h, cos, sin, mask, kv_cache, index, key, window=None):
                return _run_layer(layer, h, cos, sin, mask, kv_cache, index, key, rate, window)
        else:
            lora_dropout = None
        remat = self.remat != "none" and cache is None
        policy = remat_policy(self.remat) if remat else None
        wrap = functools.partial(nnx.remat, policy=policy) if remat else (lambda fn: fn)
        # The layers before the last one as a scan (remat), or all of them (no window); then the rest.
        scanned = len(self.layers) - (window is not None) if remat else 0
        if scanned > 1 or (scanned == 1 and window is not None):
            h = _remat_scan(
                self.layers[:scanned],
                h,
                cos,
                sin,
                attn_mask,
                index,
                None if lora_dropout is None else (lora_dropout[0], rate),
                policy,
            )
        else:
            scanned = 0
        rematted = wrap(run)
        keys, values = [], []
        for i, layer in enumerate(self.layers[scanned:], start=scanned):
            kv = None if cache is None else (cache.keys[i], cache.values[i])
            windowed = window is not None and i == len(self.layers) - 1
            layer_run = wrap(_with_window(run, window)) if windowed else rematted
            if lora_dropout is None:
                h, (k, v) = layer_run(layer, h, cos, sin, attn_mask, kv, index)
            else:
                h, (k, v) = layer_run(layer, h, cos, sin, attn_mask, kv, index, jax.random.fold_in(lora_dropout[0], i))
            keys.append(k)
            values.append(v)
        if shift is not None and window is None:  # (with a window the last layer rolled back)
            h = roll_rows(h, -shift)
        h = self.final_norm(h)
        if cache is None:
            return h, None
        return h, KVCache(tuple(keys), tuple(values), key_valid, index + t)

    def attention_implementation(self, dtype) -> str:
        """The attention of a forward without a cache in compute ``dtype`` on the default backend:
        "plain", "xla" or "cudnn" (`attention_implementation`)."""
        return attention_implementation(self.attention, jax.default_backend(), dtype, self.config.head_dim)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """float32 logits ``[B, T, V]`` from final hidden states ``[B, T, D]`` (tied or untied head)."""
        if not self.has_lm_head:
            raise ValueError("this Decoder was built with lm_head=False (a score model's body): it has no logits")
        if self.lm_head is None:
            return jnp.einsum("btd,vd->btv", hidden, self.embed[...], preferred_element_type=jnp.float32)
        return jnp.einsum("btd,dv->btv", hidden, self.lm_head[...], preferred_element_type=jnp.float32)

    def __call__(self, input_ids, attention_mask=None, *, positions=None, cache=None):
        """``logits [B, T, V]``, or ``(logits, new_cache)`` when a cache is passed."""
        hidden, new_cache = self.hidden_states(input_ids, attention_mask, positions=positions, cache=cache)
        logits = self.logits(hidden)
        return logits if cache is None else (logits, new_cache)
