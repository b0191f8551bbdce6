"""Policy loss: the clipped surrogate, KL, entropy, and exact aggregation.

The objective is PPO's clipped surrogate as verl computes it for GRPO / GDPO / GD2PO
(docs/algorithm.md#policy-loss)::

    rho = exp(clip(logp - old_logp, -20, 20))
    l   = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))
    l   = min(l, -A c)          where A < 0             (dual clip, Ye et al. 2020; c = 3)

Shapes: ``B`` sequences, ``T`` response tokens. The log-probs come from `gd2po_jax.models.logprobs`.

Aggregation returns ``(numerator, denominator)`` instead of a mean, so gradient accumulation over
micro-batches sums both and divides once: the result equals one big batch exactly. verl's dynamic
micro-batches weight the loss otherwise (a token mean per micro-batch, weighted by its rows):
`verl_row_weights` turns that into per-row weights of the same sums (docs/algorithm.md#micro-batch-weighting).

Filtered rollouts (GD2PO's ``keep == False``) arrive here with advantage 0: their token losses are
0, but whether they stay in the denominator is decided by the mask the caller passes. The official
code keeps them (their response mask is unchanged); the trainer exposes that as an option.
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
from flax import struct

from gd2po_jax.config import KL_ESTIMATORS, LOSS_AGG_MODES
from gd2po_jax.models.logprobs import at_least_f32

LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

#: log-ratio clamp of verl before exponentiation.
LOG_RATIO_CLAMP = 20.0
#: k3 estimator clamp of verl ("low_var_kl").
K3_CLAMP = 10.0


# ----------------------------------------------------------------------------------------------
# Per-token objective terms.
# ----------------------------------------------------------------------------------------------


def clipped_surrogate(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-token clipped policy-gradient loss (to minimize).

    Args:
      logp: [B, T] log-probs under the policy being optimized.
      old_logp: [B, T] log-probs under the policy that sampled (no gradient flows to them).
      advantages: [B, T] per-token advantages, or [B] per-sequence (broadcast over T).
      clip_low, clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high].
      dual_clip: the constant c of dual clipping (> 1), applied where A < 0; None disables it.

    Returns:
      loss [B, T] float32, and per-token indicators/values: ``ratio``, ``log_ratio``,
      ``clipped`` (the clipped branch is active), ``dual_clipped`` (the dual-clip bound is active).
    """
    if advantages.ndim == logp.ndim - 1:
        advantages = advantages[..., None]
    advantages = jnp.broadcast_to(at_least_f32(advantages), logp.shape)
    old_logp = jax.lax.stop_gradient(at_least_f32(old_logp))
    log_ratio = jnp.clip(at_least_f32(logp) - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    unclipped_loss = -advantages * ratio
    clipped_loss = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = jnp.maximum(unclipped_loss, clipped_loss)
    clipped = clipped_loss > unclipped_loss
    dual_clipped = jnp.zeros_like(clipped)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (verl's clip_ratio_c), got {dual_clip}")
        bound = -advantages * dual_clip
        negative = advantages < 0
        dual_clipped = negative & (loss > bound)
        loss = jnp.where(negative, jnp.minimum(loss, bound), loss)
    stats = {"ratio": ratio, "log_ratio": log_ratio, "clipped": clipped, "dual_clipped": dual_clipped}
    return loss, stats


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, estimator: str = "k3") -> jax.Array:
    """Per-token KL estimate between the policy and a reference policy (Schulman's k1 / k3).

    ``k1 = logp - ref_logp``; ``k3 = exp(ref - logp) - (ref - logp) - 1`` (verl's "low_var_kl",
    with its clamps of the log-ratio to [-20, 20] and of the estimate to [-10, 10]).

    Args:
      logp: [B, T]; ref_logp: [B, T] (no gradient flows to it).
      estimator: "k1" | "k3".

    Returns:
      [B, T] float32.
    """
    logp = at_least_f32(logp)
    ref_logp = jax.lax.stop_gradient(at_least_f32(ref_logp))
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k3":
        log_ratio = jnp.clip(ref_logp - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return jnp.clip(jnp.exp(log_ratio) - log_ratio - 1.0, -K3_CLAMP, K3_CLAMP)
    raise ValueError(f"KL estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def approx_kl_old_new(log_ratio: jax.Array) -> jax.Array:
    """Schulman's k3 estimate of KL(old || new) per token, from ``log_ratio = logp - old_logp``.

    The tokens were sampled from the old policy, so with ``r = new / old = exp(log_ratio)`` the
    unbiased, non-negative estimator is ``r - 1 - log r``. (verl logs k1 of the same direction,
    ``mean(old_logp - logp)``, as ``actor/ppo_kl``.)

    Args:
      log_ratio: [B, T], already clamped to [-20, 20] (`clipped_surrogate`'s ``log_ratio``).

    Returns:
      [B, T], >= 0.
    """
    return jnp.exp(log_ratio) - 1.0 - log_ratio


# ----------------------------------------------------------------------------------------------
# Aggregation into (numerator, denominator).
# ----------------------------------------------------------------------------------------------


def aggregate_loss(
    per_token: jax.Array,
    mask: jax.Array,
    mode: LossAggMode = "token-mean",
    *,
    norm_length: float | None = None,
    row_weights: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Aggregate a per-token quantity into ``(numerator, denominator)``; the loss is their ratio.

    - ``token-mean``: sum over valid tokens / number of valid tokens.
    - ``seq-mean-token-mean``: mean over sequences of each sequence's token mean.
    - ``seq-mean-token-sum``: mean over sequences of each sequence's token sum.
    - ``seq-mean-token-sum-norm``: mean over sequences of the token sum divided by a constant
      length (Dr. GRPO); ``norm_length`` defaults to T, the padded response length. verl divides
      the token sums of a micro-batch by T only, not by its number of sequences, then averages
      the micro-batches: its loss is that of this mode times the sequences per micro-batch (a
      constant factor of the gradient, which clipping and Adam's epsilon see). Here the value does
      not depend on how the minibatch is split.

    Sequences without any valid token are not counted. Summing numerators and denominators over
    micro-batches and dividing once gives the full-batch value exactly (for ``token-mean`` and
    the sequence modes alike).

    With ``row_weights`` w (verl's micro-batch weighting, `verl_row_weights`; token-mean only) the
    token sums are weighted per sequence: numerator ``sum_b w_b sum_t l[b, t]``, denominator
    ``sum_b w_b (valid tokens of b)``.

    Args:
      per_token: [B, T] float.
      mask: [B, T] bool or {0, 1}.
      mode: one of `LOSS_AGG_MODES`.
      norm_length: the constant of ``seq-mean-token-sum-norm``.
      row_weights: [B] float, or None.

    Returns:
      numerator, denominator: float32 scalars.
    """
    per_token = at_least_f32(per_token)
    mask = mask.astype(per_token.dtype)
    masked = per_token * mask
    tokens_per_seq = jnp.sum(mask, axis=-1)
    has_tokens = (tokens_per_seq > 0).astype(per_token.dtype)
    if row_weights is not None:
        if mode != "token-mean":
            raise ValueError(f"row weights (verl's micro-batch weighting) need token-mean aggregation, got {mode!r}")
        return jnp.sum(row_weights * jnp.sum(masked, axis=-1)), jnp.sum(row_weights * tokens_per_seq)
    if mode == "token-mean":
        return jnp.sum(masked), jnp.sum(mask)
    if mode == "seq-mean-token-mean":
        seq_means = jnp.sum(masked, axis=-1) / jnp.maximum(tokens_per_seq, 1.0)
        return jnp.sum(seq_means * has_tokens), jnp.sum(has_tokens)
    if mode == "seq-mean-token-sum":
        return jnp.sum(masked), jnp.sum(has_tokens)
    if mode == "seq-mean-token-sum-norm":
        length = float(per_token.shape[-1] if norm_length is None else norm_length)
        return jnp.sum(masked), jnp.sum(has_tokens) * length
    raise ValueError(f"loss aggregation mode must be one of {LOSS_AGG_MODES}, got {mode!r}")


def verl_row_weights(mask: jax.Array, segment_ids: jax.Array, minibatch_rows: int) -> jax.Array:
    """Per-row weights that give verl's dynamic micro-batch weighting as one weighted sum.

    verl (``DataParallelPPOActor.update_policy`` with ``use_dynamic_bsz``) computes the token mean of
    each of its micro-batches s over the s's own tokens and scales it by s's share of the minibatch's
    rows::

        loss = sum_s (num_s / max(tokens_s, 1)) * rows_s / minibatch_rows

    with num_s the sum of the token losses of s. Token and row counts do not depend on the
    parameters, so the coefficient of each segment is known before any forward pass, and the loss
    is ``sum_b w_b sum_t l[b, t]`` with ``w_b = rows_s / (minibatch_rows * max(tokens_s, 1))`` for b in
    s: any split of the minibatch into fixed-size micro-batches accumulates it exactly. (verl divides
    by ``tokens_s + 1e-8``; the same in float32 for tokens_s >= 1, and a segment without tokens adds
    0 either way.)

    Args:
      mask: [R, T] the loss mask of a minibatch's R rows.
      segment_ids: [R] int, each row's micro-batch, in 0 .. R - 1 (`gd2po_jax.rl.micro_batches`).
      minibatch_rows: R, the rows of the minibatch (static).

    Returns:
      [R] float32.
    """
    tokens = jnp.sum(mask.astype(jnp.float32), axis=-1)
    segment_tokens = jax.ops.segment_sum(tokens, segment_ids, num_segments=minibatch_rows)
    segment_rows = jax.ops.segment_sum(jnp.ones_like(tokens), segment_ids, num_segments=minibatch_rows)
    coefficients = segment_rows / (minibatch_rows * jnp.maximum(segment_tokens, 1.0))
    return coefficients[segment_ids]


def safe_ratio(numerator: jax.Array, denominator: jax.Array) -> jax.Array:
    """``numerator / denominator``, 0 when the denominator is 0 (an all-masked batch)."""
    return jnp.where(denominator > 0, numerator / jnp.where(denominator > 0, denominator, 1.0), 0.0)


# ----------------------------------------------------------------------------------------------
# The full policy loss.
# ----------------------------------------------------------------------------------------------


@struct.dataclass
class PolicyLoss:
    """Sums of one (micro-)batch; add two with `accumulate`, read with `loss` and `metrics`.

    Attributes:
      numerator, denominator: of the total loss (policy gradient + KL - entropy bonus).
      token_count: valid tokens.
      sums: per-token sums over valid tokens: ``pg_loss``, ``clipped``, ``dual_clipped``,
        ``ratio``, ``approx_kl`` (k3 estimate of KL(old || new), `approx_kl_old_new`), ``kl`` (to the
        reference; 0 when unused), ``entropy`` (0 when not computed).
      ratio_min, ratio_max: extreme importance ratios over valid tokens.
    """

    numerator: jax.Array
    denominator: jax.Array
    token_count: jax.Array
    sums: dict[str, jax.Array]
    ratio_min: jax.Array
    ratio_max: jax.Array

    def loss(self) -> jax.Array:
        """The aggregated loss: numerator / denominator (0 on an empty batch)."""
        return safe_ratio(self.numerator, self.denominator)

    def metrics(self) -> dict[str, jax.Array]:
        """Token-mean metrics plus the ratio extremes, as float32 scalars."""
        out = {name: safe_ratio(value, self.token_count) for name, value in self.sums.items()}
        out["clip_fraction"] = out.pop("clipped")
        out["dual_clip_fraction"] = out.pop("dual_clipped")
        out["ratio_mean"] = out.pop("ratio")
        has_tokens = self.token_count > 0
        out["ratio_min"] = jnp.where(has_tokens, self.ratio_min, 1.0)
        out["ratio_max"] = jnp.where(has_tokens, self.ratio_max, 1.0)
        out["loss"] = self.loss()
        out["tokens"] = self.token_count
        return out


SUM_NAMES: tuple[str, ...] = ("pg_loss", "clipped", "dual_clipped", "ratio", "approx_kl", "kl", "entropy")


def empty_policy_loss() -> PolicyLoss:
    """The neutral element of `accumulate` (zero sums, ratio extremes at +-inf)."""
    zero = jnp.zeros((), jnp.float32)
    return PolicyLoss(
        numerator=zero,
        denominator=zero,
        token_count=zero,
        sums={name: zero for name in SUM_NAMES},
        ratio_min=jnp.asarray(jnp.inf, jnp.float32),
        ratio_max=jnp.asarray(-jnp.inf, jnp.float32),
    )


def accumulate(first: PolicyLoss, second: PolicyLoss) -> PolicyLoss:
    """Combine the sums of two micro-batches (exact gradient accumulation)."""
    return PolicyLoss(
        numerator=first.numerator + second.numerator,
        denominator=first.denominator + second.denominator,
        token_count=first.token_count + second.token_count,
        sums={name: first.sums[name] + second.sums[name] for name in first.sums},
        ratio_min=jnp.minimum(first.ratio_min, second.ratio_min),
        ratio_max=jnp.maximum(first.ratio_max, second.ratio_max),
    )


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    agg_mode: LossAggMode = "token-mean",
    norm_length: float | None = None,
    ref_logp: jax.Array | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy: jax.Array | None = None,
    entropy_coef: float = 0.0,
    is_weights: jax.Array | None = None,
    row_weights: jax.Array | None = None,
) -> PolicyLoss:
    """The GRPO/GDPO/GD2PO policy loss of one (micro-)batch as sums.

    ``loss = agg(pg) + kl_coef * agg(kl(logp, ref)) - entropy_coef * agg(entropy)``, all three
    aggregated with the same mode, hence one shared denominator.

    Args:
      logp: [B, T] policy log-probs of the response tokens (differentiable).
      old_logp: [B, T] log-probs of the sampling policy.
      advantages: [B] or [B, T].
      mask: [B, T] response tokens that count in the loss.
      clip_low, clip_high, dual_clip: see `clipped_surrogate`.
      agg_mode, norm_length: see `aggregate_loss`.
      ref_logp: [B, T] reference-policy log-probs, required when ``kl_coef`` is not 0.
      kl_coef, kl_estimator: KL-to-reference term.
      entropy: [B, T] per-token entropy (e.g. from `gd2po_jax.models.logprobs.completion_logprobs`), required when
        ``entropy_coef`` is not 0; when given it is also reported.
      entropy_coef: entropy bonus.
      is_weights: [B, T] truncated importance weights ``min(exp(old_logp - sampler_logp), cap)``
        that multiply the clipped policy-gradient loss per token (verl's ``tis_imp_ratio_cap``:
        ``compute_policy_loss_vanilla`` in verl/trainer/ppo/core_algos.py); no gradient flows to them.
      row_weights: [B] verl's micro-batch weights of the rows (`verl_row_weights`; token-mean only),
        applied to all three terms.

    Returns:
      A `PolicyLoss`. Its ``approx_kl`` metric is `approx_kl_old_new`.
    """
    pg, stats = clipped_surrogate(
        logp, old_logp, advantages, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    if is_weights is not None:
        pg = pg * jax.lax.stop_gradient(at_least_f32(is_weights))
    aggregate = functools.partial(aggregate_loss, mode=agg_mode, norm_length=norm_length, row_weights=row_weights)
    numerator, denominator = aggregate(pg, mask)
    maskf = mask.astype(pg.dtype)
    zeros = jnp.zeros_like(pg)

    kl = zeros
    if ref_logp is not None:
        kl = kl_penalty(logp, ref_logp, kl_estimator)
    if kl_coef:
        if ref_logp is None:
            raise ValueError("kl_coef is set but no ref_logp was given (enable the reference policy)")
        kl_numerator, _ = aggregate(kl, mask)
        numerator = numerator + kl_coef * kl_numerator
    if entropy is None:
        if entropy_coef:
            raise ValueError("entropy_coef is set but no per-token entropy was given")
        entropy = zeros
    elif entropy_coef:
        entropy_numerator, _ = aggregate(entropy, mask)
        numerator = numerator - entropy_coef * entropy_numerator

    approx_kl = approx_kl_old_new(stats["log_ratio"])
    per_token = {
        "pg_loss": pg,
        "clipped": stats["clipped"].astype(pg.dtype),
        "dual_clipped": stats["dual_clipped"].astype(pg.dtype),
        "ratio": stats["ratio"],
        "approx_kl": approx_kl,
        "kl": kl,
        "entropy": at_least_f32(entropy),
    }
    sums = {name: jax.lax.stop_gradient(jnp.sum(per_token[name] * maskf)) for name in SUM_NAMES}
    ratio = jax.lax.stop_gradient(stats["ratio"])
    valid = maskf > 0
    return PolicyLoss(
        numerator=numerator,
        denominator=denominator,
        token_count=jnp.sum(maskf),
        sums=sums,
        ratio_min=jnp.min(jnp.where(valid, ratio, jnp.inf)),
        ratio_max=jnp.max(jnp.where(valid, ratio, -jnp.inf)),
    )
