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


def chunked_token_logprobs(
    hidden: jax.Array,
    unembedding: jax.Array,
    targets: jax.Array,
    *,
    chunk_size: int = 128,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array | None]:
    """Per-token log-probs (and entropy) from final hidden states, a chunk of positions at a time.

    Only ``[B, chunk_size, V]`` logits exist at once, in the forward and (through
    ``jax.checkpoint``) in the backward pass: with a large vocabulary this is what keeps the
    training step's memory bounded.

    Args:
      hidden: [B, T, H] final (normed) hidden states.
      unembedding: [H, V] output projection (the transposed embedding when tied).
      targets: [B, T] int token ids.
      chunk_size: positions per chunk; T is padded up to a multiple of it.
      with_entropy: also return the entropy.
      temperature: the logits are divided by it (static; 1: left as they are), as verl does:
        log-probs and entropy are those of ``softmax(logits / temperature)``.

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

    @jax.checkpoint
    def one_chunk(args):
        hidden_chunk, target_chunk = args
        logits = jnp.einsum("bth,hv->btv", hidden_chunk, unembedding, preferred_element_type=jnp.float32)
        if temperature != 1.0:
            logits = logits / temperature
        logp = token_logprobs(logits, target_chunk)
        entropy = token_entropy(logits) if with_entropy else jnp.zeros_like(logp)
        return logp, entropy

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
