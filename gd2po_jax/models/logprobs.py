"""Log-probs of tokens under a policy: from logits, from hidden states a chunk at a time, of a model.

The one path a log-prob takes through the code base::

    Decoder.hidden_states -> completion_logprobs (chunked_token_logprobs) -> train_step / sft

and, for the frozen reference policy of the KL term, `reference_logprobs_fn`. A log-prob is that
of the policy at a temperature T: ``log softmax(logits / T)[target]``. T = 1 (the raw logits) by
default; verl uses the rollout temperature for the old, new and reference log-probs, which
``rl.tempered_logprobs`` selects (`gd2po_jax.models.logprobs.logprob_temperature`). The sampler's
old log-probs must use the same T as the update (`gd2po_jax.models.sampling.generate`).

Shapes: ``B`` sequences, ``S`` tokens of a sequence (prompt + completion), ``T`` scored positions,
``M`` completion tokens, ``H`` hidden size, ``V`` vocabulary.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from gd2po_jax.config import RunConfig


def at_least_f32(x: jax.Array) -> jax.Array:
    """Promote to float32 (bf16/f16 -> f32) while keeping float64 inputs in float64."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


# ----------------------------------------------------------------------------------------------
# From logits.
# ----------------------------------------------------------------------------------------------


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Log-prob of each target token: ``logits[target] - logsumexp(logits)``.

    The log-softmax is never materialized: one reduction (logsumexp) and one gather.

    Args:
      logits: [B, T, V] any float dtype (computed in float32).
      targets: [B, T] int token ids.

    Returns:
      [B, T] float32.
    """
    logits = at_least_f32(logits)
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)
    target_logits = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return target_logits - log_normalizer


def token_entropy(logits: jax.Array) -> jax.Array:
    """Entropy of the next-token distribution: ``logsumexp(z) - sum softmax(z) z``.

    Args:
      logits: [B, T, V].

    Returns:
      [B, T] float32.
    """
    logits = at_least_f32(logits)
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)
    probs = jnp.exp(logits - log_normalizer[..., None])
    return log_normalizer - jnp.sum(probs * logits, axis=-1)


# ----------------------------------------------------------------------------------------------
# From hidden states, a chunk of positions at a time.
# ----------------------------------------------------------------------------------------------


LOGITS_GRADS = ("auto", "compute", "float32")
"""How `chunked_token_logprobs` takes the LM head's backward: "compute", `head_logprobs`'s (the
logits' gradient cast to the compute dtype before the head's two products); "float32", autodiff's
through ``jax.checkpoint`` (the float32 gradient against the compute-dtype operands); "auto":
"compute" when the hidden states are narrower than float32, else "float32" (in float32 the two
are the same products)."""


def _head_forward(hidden, unembedding, targets, temperature: float, with_entropy: bool):
    """logits (float32, divided by the temperature), their logsumexp, logp and entropy ``[B, T]``."""
    logits = jnp.einsum("bth,hv->btv", hidden, unembedding, preferred_element_type=jnp.float32)
    if temperature != 1.0:
        logits = logits / temperature
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)
    logp = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0] - log_normalizer
    if with_entropy:
        probs = jnp.exp(logits - log_normalizer[..., None])
        entropy = log_normalizer - jnp.sum(probs * logits, axis=-1)
    else:
        entropy = jnp.zeros_like(logp)
    return logits, log_normalizer, logp, entropy


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def head_logprobs(hidden, unembedding, targets, temperature: float = 1.0, with_entropy: bool = False):
    """``log softmax(hidden @ unembedding / temperature)[targets]`` and the entropy, with a backward in
    the compute dtype.

    hidden: [B, T, H] (the compute dtype); unembedding: [H, V]; targets: [B, T] int; temperature,
    with_entropy: static (the entropy is zeros without it). Returns logp, entropy [B, T] float32.

    The forward is `token_logprobs` / `token_entropy` on float32 logits. The backward recomputes the
    logits (one product), forms their gradient in float32 from the saved logsumexp (``onehot - p``
    for logp, ``-p (z - E_p z)`` for the entropy), casts it to ``hidden``'s dtype and takes the two
    products ``dz @ unembedding^T`` and ``hidden^T @ dz`` in that dtype (float32 accumulation):
    autodiff's would take them with the float32 gradient against bfloat16 operands (float32 or TF32
    products on a GPU). Only ``[B, T]`` float32 values are saved besides the inputs.
    """
    return _head_forward(hidden, unembedding, targets, temperature, with_entropy)[2:]


def _head_fwd(hidden, unembedding, targets, temperature, with_entropy):
    _, log_normalizer, logp, entropy = _head_forward(hidden, unembedding, targets, temperature, with_entropy)
    return (logp, entropy), (hidden, unembedding, targets, log_normalizer, entropy)


def _head_bwd(temperature, with_entropy, residuals, cotangents):
    hidden, unembedding, targets, log_normalizer, entropy = residuals
    d_logp, d_entropy = cotangents
    logits = jnp.einsum("bth,hv->btv", hidden, unembedding, preferred_element_type=jnp.float32)
    if temperature != 1.0:
        logits = logits / temperature
    probs = jnp.exp(logits - log_normalizer[..., None])
    onehot = jax.nn.one_hot(targets, logits.shape[-1], dtype=jnp.float32)
    d_logits = d_logp[..., None] * (onehot - probs)
    if with_entropy:  # dH/dz = -p (z - E_p z), E_p z = logsumexp - H
        d_logits = d_logits - d_entropy[..., None] * probs * (logits - (log_normalizer - entropy)[..., None])
    if temperature != 1.0:
        d_logits = d_logits / temperature
    d_logits = d_logits.astype(hidden.dtype)
    d_hidden = jnp.einsum("btv,hv->bth", d_logits, unembedding.astype(hidden.dtype), preferred_element_type=jnp.float32)
    d_unembedding = jnp.einsum("bth,btv->hv", hidden, d_logits, preferred_element_type=jnp.float32)
    return d_hidden.astype(hidden.dtype), d_unembedding.astype(unembedding.dtype), None


head_logprobs.defvjp(_head_fwd, _head_bwd)


def chunked_token_logprobs(
    hidden: jax.Array,
    unembedding: jax.Array,
    targets: jax.Array,
    *,
    chunk_size: int = 128,
    with_entropy: bool = False,
    temperature: float = 1.0,
    logits_grad: str = "auto",
) -> tuple[jax.Array, jax.Array | None]:
    """Per-token log-probs (and entropy) from final hidden states, a chunk of positions at a time.

    Only ``[B, chunk_size, V]`` logits exist at once, in the forward and (through
    ``jax.checkpoint``, or `head_logprobs`'s recompute) in the backward pass: with a large
    vocabulary this is what keeps the training step's memory bounded.

    Args:
      hidden: [B, T, H] final (normed) hidden states.
      unembedding: [H, V] output projection (the transposed embedding when tied).
      targets: [B, T] int token ids.
      chunk_size: positions per chunk; T is padded up to a multiple of it.
      with_entropy: also return the entropy.
      temperature: the logits are divided by it (static; 1: left as they are), as verl does:
        log-probs and entropy are those of ``softmax(logits / temperature)``.
      logits_grad: the head's backward, one of `LOGITS_GRADS` (the same values; "auto" is right).

    Returns:
      logp [B, T] float32 and entropy [B, T] float32 (None unless ``with_entropy``).
    """
    batch, length, _ = hidden.shape
    chunk = max(1, min(chunk_size, length))
    num_chunks = -(-length // chunk)
    pad = num_chunks * chunk - length
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    hidden_chunks = hidden.reshape(batch, num_chunks, chunk, -1).swapaxes(0, 1)
    target_chunks = targets.reshape(batch, num_chunks, chunk).swapaxes(0, 1)

    if logits_grad not in LOGITS_GRADS:
        raise ValueError(f"logits_grad={logits_grad!r}: one of {LOGITS_GRADS}")
    narrow = jnp.finfo(hidden.dtype).bits < 32

    def head_chunk(args):
        return head_logprobs(args[0], unembedding, args[1], float(temperature), bool(with_entropy))

    @jax.checkpoint
    def autodiff_chunk(args):
        hidden_chunk, target_chunk = args
        logits = jnp.einsum("bth,hv->btv", hidden_chunk, unembedding, preferred_element_type=jnp.float32)
        if temperature != 1.0:
            logits = logits / temperature
        logp = token_logprobs(logits, target_chunk)
        entropy = token_entropy(logits) if with_entropy else jnp.zeros_like(logp)
        return logp, entropy

    one_chunk = head_chunk if logits_grad == "compute" or (logits_grad == "auto" and narrow) else autodiff_chunk
    logp, entropy = jax.lax.map(one_chunk, (hidden_chunks, target_chunks))
    logp = logp.swapaxes(0, 1).reshape(batch, -1)[:, :length]
    entropy = entropy.swapaxes(0, 1).reshape(batch, -1)[:, :length]
    return logp, (entropy if with_entropy else None)


# ----------------------------------------------------------------------------------------------
# Of a model.
# ----------------------------------------------------------------------------------------------


def unembedding(model) -> jax.Array:
    """[H, V] output projection of a `Decoder` (the transposed embedding when tied)."""
    return model.embed[...].T if model.lm_head is None else model.lm_head[...]


def completion_logprobs(
    model,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    num_completion: int,
    *,
    chunk_size: int = 128,
    with_entropy: bool = False,
    temperature: float = 1.0,
    lora_dropout=None,
) -> tuple[jax.Array, jax.Array | None]:
    """Log-probs (and entropy) of the last ``M`` tokens of each row given everything before.

    Args:
      model: a `Decoder`.
      input_ids: [B, S] int32; attention_mask: [B, S].
      num_completion: M (< S: the first token has no prediction).
      chunk_size: positions per chunk of the vocabulary projection (`chunked_token_logprobs`).
      with_entropy: also return the per-token entropy.
      temperature: T of the policy ``softmax(logits / T)`` (static; see the module docstring).
      lora_dropout: None, or ``(key, rate)`` of a LoRA model's adapter dropout
        (`gd2po_jax.models.decoder.Decoder.hidden_states`).

    Returns:
      logp [B, M] float32 and entropy [B, M] float32 (None unless ``with_entropy``).
    """
    start = input_ids.shape[1] - num_completion
    # The hidden states that predict the completion: positions start-1 .. S-2 (the last layer at them alone).
    window = (start - 1, num_completion)
    if lora_dropout is None:
        hidden, _ = model.hidden_states(input_ids, attention_mask, window=window)
    else:
        hidden, _ = model.hidden_states(input_ids, attention_mask, lora_dropout=lora_dropout, window=window)
    return chunked_token_logprobs(
        hidden,
        unembedding(model),
        input_ids[:, start:],
        chunk_size=chunk_size,
        with_entropy=with_entropy,
        temperature=temperature,
    )


def merge_model(graphdef, params, dtype, frozen=None):
    """The model of ``graphdef`` with ``params`` (master weights) cast to the compute ``dtype``.

    The cast is differentiable: gradients flow back to the master weights in their own dtype.
    frozen: with LoRA, the base weights (``params`` are then the adapters; `gd2po_jax.models.lora.split_lora`),
    cast the same way and merged with them.
    """
    dtype = jnp.dtype(dtype)
    recast = lambda x: jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype  # noqa: E731
    cast = lambda tree: jax.tree.map(lambda x: x.astype(dtype) if recast(x) else x, tree)  # noqa: E731
    if frozen is None:
        return nnx.merge(graphdef, cast(params))
    return nnx.merge(graphdef, cast(params), cast(frozen))


def reference_logprobs_fn(graphdef, compute_dtype, *, chunk_size: int = 128, temperature: float = 1.0) -> Callable:
    """The jitted log-probs of a frozen reference policy (the KL term's ``ref_logp``), at the
    ``temperature`` of the update's log-probs.

    Returns:
      ``fn(params, input_ids [B, S], attention_mask [B, S], num_completion M) -> logp [B, M]``
      float32, with ``params`` the reference's master weights (cast to ``compute_dtype``) and
      ``num_completion`` static.
    """

    def reference_logprobs(params, input_ids, attention_mask, num_completion: int) -> jax.Array:
        model = merge_model(graphdef, params, compute_dtype)
        return completion_logprobs(
            model, input_ids, attention_mask, num_completion, chunk_size=chunk_size, temperature=temperature
        )[0]

    return jax.jit(reference_logprobs, static_argnums=(3,))


def logprob_temperature(config: RunConfig) -> float:
    """T of the policy whose log-probs enter the loss (old, new and reference), from a run config:
    ``sampling.temperature`` with ``rl.tempered_logprobs`` (verl), else 1 (the raw logits)."""
    return float(config.sampling.temperature) if config.rl.tempered_logprobs else 1.0
