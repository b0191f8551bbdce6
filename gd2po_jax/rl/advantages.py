"""Multi-reward advantages: GRPO, GDPO and GD2PO (Hard and SNR filtering).

The equations are those of docs/algorithm.md, restated from the official GD2PO code (built on
verl); TRL's variants are available as options. Each method is one function (`grpo`, `gdpo`,
`gd2po_hard`, `gd2po_snr`, and the paper's ablation `low_conflict_half`, `high_conflict_half`,
registered in `ADVANTAGE_METHODS`); `compute_advantages` computes what they share, applies the
masks and dispatches. Notation used throughout:

    P  prompts (queries) in the step batch        G  rollouts per prompt
    K  reward functions                            r[p, g, k]  reward k of rollout g of prompt p
    L[p, g]  valid response tokens of the rollout  w[k]  reward weights

1. Group normalization of one reward (all methods; GRPO paper, eq. 3)::

       A[p, g] = (x[p, g] - mean_g x[p, :]) / (std_g x[p, :] + eps_group)      std with ddof=1

2. GRPO normalizes the weighted sum of the rewards: ``A = groupnorm(sum_k w_k r_k)``.

3. GDPO (Liu et al., 2026) normalizes each reward first, sums, then whitens over the batch::

       A_k = groupnorm(r_k);   S = sum_k w_k A_k;   A_gdpo = batch_whiten(S, weights=L)

4. GD2PO (arXiv 2606.16771) tests the reward-wise advantages for sign conflicts, summed over the
   rollout's tokens ``T_k = w_k A_k L``::

       conflict = any_k(T_k > 1e-8) and any_k(T_k < -1e-8)
       snr      = sum_k T_k / (sum_k |T_k| + snr_eps)                    in [-1, 1], snr_eps = 1e-8
       keep     = not conflict                                           (Hard)
       keep     = not (conflict and |snr| < tau)                         (SNR, tau in [0, 1])
       kappa[p] = (kept rollouts of prompt p) / G                        (query reweighting; 1 without)
       A_gd2po  = keep * batch_whiten(kappa * S, weights = L * keep)

5. The SNR halves (the paper's appendix C.1, Table 6: "Low-Conflict Half" / "High-Conflict Half")
   validate SNR as a ranking, not as a threshold. Each rollout's conflict score is the quantity the
   SNR rule thresholds, ``c = |snr|`` for a rollout in conflict and ``c = 1`` for one without (a
   rollout the SNR rule keeps at every tau). Per prompt, the n eligible rollouts are ordered by c,
   highest first, ties by the lower rollout index first; ``low_conflict_half`` keeps the first
   ``n // 2`` of that order, ``high_conflict_half`` the last ``n // 2`` (an odd n leaves the middle
   rollout out of both, so the halves are always the same size; an even n makes them complementary,
   ties included). Then the GD2PO batch step as above (kappa = (n // 2) / G, 1/2 for a full group).
   The ranking is per prompt, not over the batch, so that both halves train on every prompt with the
   same number of rollouts and kappa is the same for all prompts: the two arms differ only in which
   rollouts of a group they learn from, not in which prompts (a batch-wide ranking could hand a
   prompt whose rollouts all cancel wholly to the high-conflict half). The key is |snr|, not snr:
   snr = -1 is a rollout that every reward agrees is bad, as reliable as +1. The official code has no
   halves, and the paper's text we have does not say how they are cut: docs/algorithm.md#snr-halves.

``batch_whiten`` is the token-weighted whitening of verl (``batch_norm="token"``)::

       N = sum wgt;  mu = sum wgt V / (N + 1e-8)
       var = sum wgt (V - mu)^2 / (N + 1e-8) * N / (N - 1);  out = (V - mu) / sqrt(var + 1e-8)

TRL's GDPO (``batch_norm="sequence"``) uses one unweighted value per rollout and ``std + 1e-4``.

Missing rewards may be given as NaN (a reward function that could not score a rollout). They are
left out of every statistic, as TRL does: a reward that is missing for a rollout contributes nothing
to its sum, and a rollout whose rewards are all missing gets advantage 0 and no weight. Padded
prompts of a partly filled batch are marked by ``valid=False`` and move no statistic either.

Your own aggregator: ``rl.algorithm`` may name a function of the methods' signature,
``fn(signals: RewardSignals, eligible: [P, G] bool, options: AdvantageOptions) -> (keep [P, G] bool,
advantages [P, G] float)``, as ``module:callable`` or ``path/to/file.py:callable``; `advantage_method`
imports it (once) and registers it, and `compute_advantages` calls it inside the same jitted step as
the built-ins. ``examples/aggregators/quantile_gdpo.py`` is one (docs/algorithm.md#your-own-aggregator).
The registry (`register_advantage_method`) is the one source of the built-in names;
``gd2po_jax.config.ALGORITHMS`` (the config cannot import this layer) is held equal to it by
tests/rl/test_advantages.py.

The only choice here that the official code does not make: conflict and SNR use the *weighted*
reward-wise advantages ``w_k A_k`` (identical with the official all-ones weights), so that a reward
with weight 0 cannot put a rollout in conflict.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from gd2po_jax.config import BATCH_NORMS, HALVES_RANKINGS, SNR_HALF_ALGORITHMS, ConfigError
from gd2po_jax.runtime.imports import ImportPathError, import_object, is_import_path

logger = logging.getLogger(__name__)

Method = Literal["grpo", "gdpo", "gd2po_hard", "gd2po_snr", "low_conflict_half", "high_conflict_half"]
BatchNorm = Literal["token", "sequence", "none"]
GroupScale = Literal["group", "batch", "none"]
HalvesRanking = Literal["prompt", "batch"]

GROUP_SCALES: tuple[str, ...] = ("group", "batch", "none")

#: std epsilon of the group normalization in verl / GD2PO (TRL uses 1e-4).
GROUP_EPS = 1e-6
#: variance epsilon of the token-weighted whitening (verl ``masked_whiten``).
TOKEN_WHITEN_EPS = 1e-8
#: std epsilon of TRL's sequence-level batch normalization.
SEQUENCE_NORM_EPS = 1e-4
#: epsilon of the sign test, and the default of the SNR denominator's (official GD2PO code; its
#: helpfulness-safety runs add 1e-6 to the denominator: ``rl.snr_eps``).
RATIO_EPS = 1e-8
#: epsilon added to the token count in verl's ``masked_mean``.
MASKED_MEAN_EPS = 1e-8


@struct.dataclass
class AdvantageOutput:
    """What `compute_advantages` returns (a pytree; every field is an array).

    Attributes:
      advantages: [P, G] float32, the per-rollout advantage (broadcast to tokens by the loss).
      keep: [P, G] bool, rollouts that survive filtering (all True for grpo/gdpo on a full batch).
      conflict: [P, G] bool, sign conflict among the weighted reward-wise advantages.
      snr: [P, G] float32, signal-to-noise ratio of the reward-wise advantages, in [-1, 1].
      query_weight: [P] float32, kappa: kept fraction per prompt (grpo/gdpo: 1 if any rollout of
        the prompt is kept, else 0; 0 if padded).
      reward_advantages: [P, G, K] float32, per-reward group-normalized advantages A_k (0 where
        the reward is missing).
      unfiltered_advantages: [P, G] float32, the advantages the same method gives with every
        rollout kept (GDPO's for the GD2PO methods); used for "|advantage| before filtering".
      reward_zero_std: [P, K] bool, groups whose values of reward k are all equal.
      reward_present: [P, G, K] bool, reward k exists for the rollout (not missing, prompt valid).
      reward_weights: [K] float32 w_k.
      summed: [P, G] float32 S = sum_k w_k A_k, the aggregate before the batch step (what GDPO and GD2PO
        normalize over the batch; its magnitude is ``advantages/pre_batch_abs_mean``).
    """

    advantages: jax.Array
    keep: jax.Array
    conflict: jax.Array
    snr: jax.Array
    query_weight: jax.Array
    reward_advantages: jax.Array
    unfiltered_advantages: jax.Array
    reward_zero_std: jax.Array
    reward_present: jax.Array
    reward_weights: jax.Array
    summed: jax.Array


# ----------------------------------------------------------------------------------------------
# Statistics over groups and over the batch (masked, two-pass, NaN-free).
# ----------------------------------------------------------------------------------------------


def _masked_group_moments(values: jax.Array, present: jax.Array):
    """Mean, Bessel std, count and constancy of ``values`` along the group axis (axis 1).

    Args:
      values: [P, G, ...] float32 (entries outside ``present`` are ignored, NaN included).
      present: [P, G, ...] bool.

    Returns:
      mean, std, count, constant: each [P, 1, ...]; ``constant`` is True when every present value
      of the group is equal (exactly), or when fewer than one value is present.
    """
    count = jnp.sum(present, axis=1, keepdims=True)
    filled = jnp.where(present, values, 0.0)
    mean = jnp.sum(filled, axis=1, keepdims=True) / jnp.maximum(count, 1)
    centred = jnp.where(present, values - mean, 0.0)
    var = jnp.sum(centred * centred, axis=1, keepdims=True) / jnp.maximum(count - 1, 1)
    highest = jnp.max(jnp.where(present, values, -jnp.inf), axis=1, keepdims=True)
    lowest = jnp.min(jnp.where(present, values, jnp.inf), axis=1, keepdims=True)
    constant = highest <= lowest
    return mean, jnp.sqrt(var), count, constant


def group_normalize(
    values: jax.Array,
    present: jax.Array,
    *,
    eps: float = GROUP_EPS,
    scale: GroupScale = "group",
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Group-relative normalization along axis 1 (the G rollouts of each prompt).

    ``(x - mean_g) / (std_g + eps)`` with the Bessel-corrected std (``scale="group"``);
    ``scale="batch"`` divides by the std of all present values of the batch instead (TRL's
    ``scale_rewards="batch"``); ``scale="none"`` only subtracts the group mean (Dr. GRPO, verl's
    ``norm_adv_by_std_in_grpo=False``). A group whose present values are all equal gives exactly 0.
    A group of size G = 1 uses mean 0 and std 1, as verl does.

    With ``[P, G, K]`` values (GDPO and GD2PO's reward-wise step), ``scale="batch"`` pools one std
    over every value of all K rewards, not one per reward, so the reward with the widest range sets
    the scale of all. TRL has no such variant: its GDPO always divides each reward by its group std,
    whatever ``scale_rewards`` says; it matches TRL for GRPO's summed reward only.

    Args:
      values: [P, G] or [P, G, K] float32.
      present: same shape, bool: values that exist (not missing, prompt not padded).
      eps: added to the std, outside the square root.
      scale: "group" | "batch" | "none".

    Returns:
      normalized: same shape as ``values``, 0 where not ``defined``.
      defined: same shape, bool: present and in a group with at least two present values.
      constant: [P, 1, ...] bool, groups whose present values are all equal.
    """
    group_size = values.shape[1]
    if group_size == 1:
        normalized = jnp.where(present, values / (1.0 + eps), 0.0)
        return normalized, present, jnp.ones_like(present[:, :1], dtype=bool)
    mean, std, count, constant = _masked_group_moments(values, present)
    if scale == "group":
        divisor = std + eps
    elif scale == "batch":
        batch_count = jnp.sum(present)
        batch_mean = jnp.sum(jnp.where(present, values, 0.0)) / jnp.maximum(batch_count, 1)
        batch_centred = jnp.where(present, values - batch_mean, 0.0)
        batch_var = jnp.sum(batch_centred * batch_centred) / jnp.maximum(batch_count - 1, 1)
        divisor = jnp.sqrt(batch_var) + eps
    elif scale == "none":
        divisor = jnp.ones_like(std)
    else:
        raise ValueError(f"group scale must be one of {GROUP_SCALES}, got {scale!r}")
    defined = present & (count >= 2)
    normalized = jnp.where(defined & ~constant, (values - mean) / divisor, 0.0)
    return normalized, defined, constant


def token_whiten(values: jax.Array, token_weights: jax.Array, *, eps: float = TOKEN_WHITEN_EPS) -> jax.Array:
    """verl's ``masked_whiten`` of per-rollout values broadcast to tokens, without the tokens.

    Every rollout carries its value on ``token_weights[p, g]`` tokens (its length, times its keep
    flag). Statistics are token-weighted with Bessel's correction over the token count.

    Args:
      values: [P, G] float32.
      token_weights: [P, G] float32 >= 0.

    Returns:
      [P, G] float32: whitened values where the weight is positive, else 0. All zeros when fewer
      than two tokens carry weight (the official code raises there).
    """
    total = jnp.sum(token_weights)
    mean = jnp.sum(token_weights * values) / (total + MASKED_MEAN_EPS)
    centred = values - mean
    var = jnp.sum(token_weights * centred * centred) / (total + MASKED_MEAN_EPS)
    var = var * total / jnp.maximum(total - 1.0, 1.0)
    whitened = centred * jax.lax.rsqrt(var + eps)
    return jnp.where((token_weights > 0) & (total > 1.0), whitened, 0.0)


def sequence_normalize(values: jax.Array, included: jax.Array, *, eps: float = SEQUENCE_NORM_EPS) -> jax.Array:
    """TRL's batch normalization: one value per rollout, ``(v - mean) / (std + eps)``, ddof=1.

    Args:
      values: [P, G] float32.
      included: [P, G] bool, rollouts that enter the statistics.

    Returns:
      [P, G] float32, 0 outside ``included`` and when fewer than two rollouts are included.
    """
    count = jnp.sum(included)
    mean = jnp.sum(jnp.where(included, values, 0.0)) / jnp.maximum(count, 1)
    centred = jnp.where(included, values - mean, 0.0)
    std = jnp.sqrt(jnp.sum(centred * centred) / jnp.maximum(count - 1, 1))
    return jnp.where(included & (count > 1), centred / (std + eps), 0.0)


def batch_normalize(
    values: jax.Array,
    included: jax.Array,
    lengths: jax.Array,
    *,
    mode: BatchNorm,
    eps: float | None = None,
) -> jax.Array:
    """Batch-level normalization of GDPO / GD2PO, selected by ``mode``.

    Args:
      values: [P, G] float32, the (reweighted) sum of reward-wise advantages.
      included: [P, G] bool, rollouts that are kept and real.
      lengths: [P, G] float32 valid response tokens (the weights of ``mode="token"``).
      mode: "token" (official verl whitening) | "sequence" (TRL) | "none".
      eps: the mode's epsilon; None takes the mode's official default.

    Returns:
      [P, G] float32, 0 outside ``included``.
    """
    if mode == "token":
        weights = jnp.where(included, lengths, 0.0)
        return token_whiten(values, weights, eps=TOKEN_WHITEN_EPS if eps is None else eps)
    if mode == "sequence":
        return sequence_normalize(values, included, eps=SEQUENCE_NORM_EPS if eps is None else eps)
    if mode == "none":
        return jnp.where(included, values, 0.0)
    raise ValueError(f"batch_norm must be one of {BATCH_NORMS}, got {mode!r}")


# ----------------------------------------------------------------------------------------------
# GD2PO conflict tests.
# ----------------------------------------------------------------------------------------------


def sign_conflict(token_advantages: jax.Array, eps: float = RATIO_EPS) -> jax.Array:
    """[P, G, K] -> [P, G] bool: some reward pushes up and another pushes down.

    Values within +-eps count as neither sign: (+, 0) is no conflict, (+, -, 0) is.
    """
    positive = jnp.any(token_advantages > eps, axis=-1)
    negative = jnp.any(token_advantages < -eps, axis=-1)
    return positive & negative


def signal_to_noise(token_advantages: jax.Array, eps: float = RATIO_EPS) -> jax.Array:
    """[P, G, K] -> [P, G]: ``sum_k T_k / (sum_k |T_k| + eps)``, in [-1, 1]."""
    signal = jnp.sum(token_advantages, axis=-1)
    noise = jnp.sum(jnp.abs(token_advantages), axis=-1)
    return signal / (noise + eps)


def zero_variance_groups(reward_zero_std: jax.Array) -> jax.Array:
    """[P, K] -> [P] bool: groups with no variance in any reward (DAPO's dynamic-sampling filter)."""
    return jnp.all(reward_zero_std, axis=-1)


def query_weight(keep: jax.Array) -> jax.Array:
    """[P, G] bool -> [P] float32 kappa: the kept fraction of each prompt's rollouts
    (docs/algorithm.md#query-reweighting)."""
    return jnp.sum(keep, axis=1).astype(jnp.float32) / keep.shape[1]


# ----------------------------------------------------------------------------------------------
# The methods: one function each, over the statistics that `compute_advantages` computes once.
# ----------------------------------------------------------------------------------------------


class RewardSignals(NamedTuple):
    """What every method reads, computed once from the rewards by `compute_advantages`.

    Attributes:
      rewards: [P, G, K] float32 r (NaN = missing).
      present: [P, G, K] bool, the reward exists and its prompt is valid.
      scorable: [P, G] bool, at least one reward of the rollout is present.
      weights: [K] float32 w.
      lengths: [P, G] float32 L, valid response tokens.
      summed: [P, G] float32 S = sum_k w_k A_k, the weighted sum of the group-normalized rewards.
      conflict: [P, G] bool, sign conflict among the T_k = w_k A_k L of a scorable rollout.
      snr: [P, G] float32 signal-to-noise ratio of the T_k (0 where not scorable).
    """

    rewards: jax.Array
    present: jax.Array
    scorable: jax.Array
    weights: jax.Array
    lengths: jax.Array
    summed: jax.Array
    conflict: jax.Array
    snr: jax.Array


class AdvantageOptions(NamedTuple):
    """The settings of `compute_advantages` that the methods read (see its arguments)."""

    snr_tau: float | jax.Array
    batch_norm: BatchNorm
    batch_eps: float | None
    group_eps: float
    group_scale: GroupScale
    query_reweighting: bool = True
    halves_ranking: HalvesRanking = "prompt"


AdvantageMethod = Callable[["RewardSignals", jax.Array, "AdvantageOptions"], tuple[jax.Array, jax.Array]]
"""``fn(signals, eligible, options) -> (keep [P, G] bool, advantages [P, G] float32)``: an advantage method."""

#: method name -> its function: the built-ins (`register_advantage_method`), then the aggregators that
#: ``rl.algorithm`` named by import path (`advantage_method`).
ADVANTAGE_METHODS: dict[str, AdvantageMethod] = {}


def register_advantage_method(name: str) -> Callable[[AdvantageMethod], AdvantageMethod]:
    """Decorator: register an advantage method under ``name`` (``rl.algorithm=<name>``)."""

    def register(fn: AdvantageMethod) -> AdvantageMethod:
        if name in ADVANTAGE_METHODS and ADVANTAGE_METHODS[name] is not fn:
            raise ValueError(f"advantage method {name!r} is already registered")
        ADVANTAGE_METHODS[name] = fn
        return fn

    return register


@register_advantage_method("grpo")
def grpo(s: RewardSignals, eligible: jax.Array, o: AdvantageOptions) -> tuple[jax.Array, jax.Array]:
    """GRPO: ``A = groupnorm(sum_k w_k r_k)``, no batch step (docs/algorithm.md#grpo).

    Every method takes the shared statistics ``s``, the [P, G] ``eligible`` rollouts (scorable, of
    a valid prompt, not dropped by the DAPO filter) and the options; it returns the [P, G] rollouts
    it keeps and their [P, G] advantages (0 elsewhere).
    """
    summed = jnp.sum(jnp.where(s.present, s.rewards, 0.0) * s.weights, axis=-1)  # [P, G]
    advantages, _, _ = group_normalize(summed, s.scorable, eps=o.group_eps, scale=o.group_scale)
    return eligible, jnp.where(eligible, advantages, 0.0)


@register_advantage_method("gdpo")
def gdpo(s: RewardSignals, eligible: jax.Array, o: AdvantageOptions) -> tuple[jax.Array, jax.Array]:
    """GDPO: ``A = batch_whiten(S, weights = L)`` over the eligible rollouts (docs/algorithm.md#gdpo)."""
    return eligible, batch_normalize(s.summed, eligible, s.lengths, mode=o.batch_norm, eps=o.batch_eps)


def _reweighted_batch_step(s: RewardSignals, keep: jax.Array, o: AdvantageOptions) -> jax.Array:
    """GD2PO's batch step: ``keep * batch_whiten(kappa S, weights = L keep)``, kappa the kept
    fraction of each prompt, or 1 without query reweighting (docs/algorithm.md#query-reweighting)."""
    reweighted = query_weight(keep)[:, None] * s.summed if o.query_reweighting else s.summed
    return batch_normalize(reweighted, keep, s.lengths, mode=o.batch_norm, eps=o.batch_eps)


@register_advantage_method("gd2po_hard")
def gd2po_hard(s: RewardSignals, eligible: jax.Array, o: AdvantageOptions) -> tuple[jax.Array, jax.Array]:
    """GD2PO-Hard: drop every rollout in sign conflict, ``keep = not conflict``
    (docs/algorithm.md#gd2po)."""
    keep = eligible & ~s.conflict
    return keep, _reweighted_batch_step(s, keep, o)


@register_advantage_method("gd2po_snr")
def gd2po_snr(s: RewardSignals, eligible: jax.Array, o: AdvantageOptions) -> tuple[jax.Array, jax.Array]:
    """GD2PO-SNR: drop a conflicting rollout only when its rewards mostly cancel,
    ``keep = not (conflict and |snr| < tau)``, tau clamped to [0, 1] (docs/algorithm.md#gd2po)."""
    tau = jnp.clip(jnp.asarray(o.snr_tau, jnp.float32), 0.0, 1.0)
    keep = eligible & ~(s.conflict & (jnp.abs(s.snr) < tau))
    return keep, _reweighted_batch_step(s, keep, o)


def conflict_score(conflict: jax.Array, snr: jax.Array) -> jax.Array:
    """[P, G] bool, [P, G] -> [P, G] c: ``|snr|`` of a rollout in conflict, 1 of one without (the
    quantity GD2PO-SNR compares with tau: it keeps a rollout iff c >= tau). Higher: less conflict."""
    return jnp.where(conflict, jnp.abs(snr), 1.0)


def snr_halves(score: jax.Array, eligible: jax.Array, ranking: HalvesRanking = "prompt") -> tuple[jax.Array, jax.Array]:
    """The low- and high-conflict halves of each prompt's eligible rollouts (docs/algorithm.md#snr-halves).

    Per prompt, the n eligible rollouts are ordered by ``score`` from highest to lowest, equal
    scores by rollout index (lower first). The low-conflict half is the first ``n // 2`` of that
    order, the high-conflict half the last ``n // 2``: equal in size, disjoint, and together every
    eligible rollout when n is even (the middle one is in neither when n is odd). With
    ``ranking="batch"`` the same over all the batch's eligible rollouts at once (ties by the
    rollout's place in the batch, prompt-major): a prompt may then fall wholly into one half.

    Args:
      score: [P, G] float32, higher = less conflict (`conflict_score`).
      eligible: [P, G] bool.
      ranking: "prompt" | "batch" (``rl.halves_ranking``).

    Returns:
      (low, high): [P, G] bool each.
    """
    if ranking == "batch":
        low, high = snr_halves(score.reshape(1, -1), eligible.reshape(1, -1))
        return low.reshape(score.shape), high.reshape(score.shape)
    if ranking != "prompt":
        raise ValueError(f"halves ranking must be one of {HALVES_RANKINGS}, got {ranking!r}")
    group = score.shape[1]
    ranked = jnp.where(eligible, score, -jnp.inf)  # ineligible rollouts come last
    index = jnp.arange(group)
    # ahead[p, g, h]: rollout h comes before rollout g in prompt p's order (an exact comparison: no
    # sort, so -0.0 and 0.0 are equal and the order is the documented one).
    ahead = (ranked[:, None, :] > ranked[:, :, None]) | (
        (ranked[:, None, :] == ranked[:, :, None]) & (index[None, :] < index[:, None])[None]
    )
    position = jnp.sum(ahead, axis=-1)  # [P, G]: 0 .. G-1, eligible rollouts at 0 .. n-1
    count = jnp.sum(eligible, axis=1, keepdims=True)
    half = count // 2
    return eligible & (position < half), eligible & (position >= count - half)


@register_advantage_method("low_conflict_half")
def low_conflict_half(s: RewardSignals, eligible: jax.Array, o: AdvantageOptions) -> tuple[jax.Array, jax.Array]:
    """The paper's "Low-Conflict Half" (appendix C.1, Table 6): keep the half of each prompt's
    rollouts with the highest conflict score c (`snr_halves`), then GD2PO's batch step."""
    keep, _ = snr_halves(conflict_score(s.conflict, s.snr), eligible, o.halves_ranking)
    return keep, _reweighted_batch_step(s, keep, o)


@register_advantage_method("high_conflict_half")
def high_conflict_half(s: RewardSignals, eligible: jax.Array, o: AdvantageOptions) -> tuple[jax.Array, jax.Array]:
    """The paper's "High-Conflict Half": keep the half of each prompt's rollouts with the lowest
    conflict score c (`snr_halves`), then GD2PO's batch step."""
    _, keep = snr_halves(conflict_score(s.conflict, s.snr), eligible, o.halves_ranking)
    return keep, _reweighted_batch_step(s, keep, o)


#: the built-in methods' names, from the registry (``gd2po_jax.config.ALGORITHMS`` is tested equal).
METHODS: tuple[str, ...] = tuple(ADVANTAGE_METHODS)
#: the paper's ablation of the SNR ranking (no official code: not in tests/reference/).
SNR_HALF_METHODS: tuple[str, ...] = SNR_HALF_ALGORITHMS
#: the methods that filter rollouts and reweight prompts by kappa.
FILTERING_METHODS: tuple[str, ...] = ("gd2po_hard", "gd2po_snr", *SNR_HALF_METHODS)


def advantage_method(name: str) -> AdvantageMethod:
    """The method ``rl.algorithm=name`` names: a registered one, or a function of your own named
    ``module:callable`` / ``path/to/file.py:callable``, imported once and registered under ``name``.

    Raises:
      ConfigError: not a registered name nor an import path, an import that fails, or a callable whose
        signature cannot take ``(signals, eligible, options)``, naming ``config.rl.algorithm``.
    """
    if name in ADVANTAGE_METHODS:
        return ADVANTAGE_METHODS[name]
    if not is_import_path(name):
        raise ConfigError(
            f"config.rl.algorithm: {name!r} is not one of {METHODS}, nor an aggregator of your own "
            "(module:callable or path/to/file.py:callable)"
        )
    label = f"config.rl.algorithm ({name!r})"
    try:
        fn, source = import_object(name, label)
    except ImportPathError as err:
        raise ConfigError(str(err)) from None
    try:
        inspect.signature(fn).bind(None, None, None)
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"{label}: {name.rpartition(':')[2]} in {source} cannot take (signals, eligible, options), the "
            f"signature of the built-in methods (gd2po_jax.rl.advantages.gdpo): {err}"
        ) from None
    return register_advantage_method(name)(fn)


def _checked_method_output(name: str, output, shape: tuple[int, int]) -> tuple[jax.Array, jax.Array]:
    """(keep, advantages) of an aggregator of your own, checked at trace time.

    Raises:
      ConfigError: not a pair of [P, G] arrays, naming ``config.rl.algorithm``.
    """
    try:
        keep, advantages = output
        keep, advantages = jnp.asarray(keep), jnp.asarray(advantages)
    except (TypeError, ValueError):
        keep = advantages = None
    if keep is None or advantages is None or keep.shape != shape or advantages.shape != shape:
        raise ConfigError(
            f"config.rl.algorithm ({name!r}): returned {output!r:.120}; an aggregator returns (keep, advantages), "
            f"two [P, G] = {shape} arrays (bool, float)"
        )
    return keep.astype(bool), advantages.astype(jnp.float32)


# ----------------------------------------------------------------------------------------------
# The public entry point.
# ----------------------------------------------------------------------------------------------


def compute_advantages(
    rewards: jax.Array,
    lengths: jax.Array,
    method: Method | str = "gd2po_snr",
    *,
    snr_tau: float | jax.Array = 0.8,
    reward_weights: jax.Array | None = None,
    batch_norm: BatchNorm = "token",
    group_eps: float = GROUP_EPS,
    batch_eps: float | None = None,
    group_scale: GroupScale = "group",
    valid: jax.Array | None = None,
    drop_zero_variance_groups: bool = False,
    snr_eps: float = RATIO_EPS,
    query_reweighting: bool = True,
    halves_ranking: HalvesRanking = "prompt",
) -> AdvantageOutput:
    """Per-rollout advantages of GRPO, GDPO, GD2PO-Hard, GD2PO-SNR or an SNR half.

    Computes the statistics every method shares (the group-normalized rewards A_k, their weighted
    sum S, conflicts and SNR), applies the masks (padded prompts, missing rewards, the DAPO filter)
    once, and dispatches to the method's function in `ADVANTAGE_METHODS`.

    Pure and jittable with ``method``, ``batch_norm``, ``group_scale`` and
    ``drop_zero_variance_groups`` static; vectorized over prompts and groups.

    Args:
      rewards: [P, G, K] float (any float dtype; computed in float32). NaN marks a missing reward.
      lengths: [P, G] int, valid response tokens of each rollout.
      method: "grpo" | "gdpo" | "gd2po_hard" | "gd2po_snr" | "low_conflict_half" |
        "high_conflict_half".
      snr_tau: SNR threshold of "gd2po_snr", clamped to [0, 1] (0 = GDPO, 1 = Hard). May be traced.
      reward_weights: [K] float weights w_k (default all ones, as in the official code).
      batch_norm: "token" (official, token-weighted whitening) | "sequence" (TRL) | "none". Not
        used by "grpo", which has no batch-level step.
      group_eps: epsilon added to the group std (1e-6 official, 1e-4 in TRL).
      batch_eps: epsilon of the batch step (None: 1e-8 on the variance for "token", 1e-4 on the
        std for "sequence").
      group_scale: "group" | "batch" | "none" divisor of the group normalization (TRL's
        ``scale_rewards``; "none" is verl's ``norm_adv_by_std_in_grpo=False``).
      valid: [P] bool, False for padded prompts of a partly filled batch (they move no statistic
        and get zero advantages, keep=False and query_weight=0). Default: all True.
      drop_zero_variance_groups: also drop groups whose rewards are all constant
        (docs/algorithm.md#dapo-filter).
      snr_eps: added to the SNR denominator (1e-8; the official helpfulness-safety runs: 1e-6).
      query_reweighting: the filtering methods scale each prompt's summed advantage by kappa
        before the batch step (official); False: by 1 (filtering alone). ``query_weight`` is then 1
        for a prompt with a kept rollout and 0 for one without, as for GRPO and GDPO.
      halves_ranking: "prompt" | "batch", over what the SNR halves rank (`snr_halves`).

    Returns:
      An `AdvantageOutput`.
    """
    if method not in METHODS and not is_import_path(method):
        raise ValueError(f"method must be one of {METHODS} or an import path module:callable, got {method!r}")
    if batch_norm not in BATCH_NORMS:
        raise ValueError(f"batch_norm must be one of {BATCH_NORMS}, got {batch_norm!r}")
    if rewards.ndim != 3:
        raise ValueError(f"rewards must be [P, G, K], got shape {rewards.shape}")
    num_prompts, group_size, num_rewards = rewards.shape
    if lengths.shape != (num_prompts, group_size):
        raise ValueError(f"lengths must be [P, G] = {(num_prompts, group_size)}, got {lengths.shape}")

    rewards = jnp.asarray(rewards, jnp.float32)
    lengths = jnp.asarray(lengths, jnp.float32)
    if reward_weights is None:
        weights = jnp.ones((num_rewards,), jnp.float32)
    else:
        weights = jnp.asarray(reward_weights, jnp.float32)
        if weights.shape != (num_rewards,):
            raise ValueError(f"reward_weights must have K = {num_rewards} entries, got {weights.shape}")
    valid = jnp.ones((num_prompts,), bool) if valid is None else jnp.asarray(valid, bool)

    # Padded prompts and missing rewards move no statistic (docs/algorithm.md#missing-rewards-and-padded-prompts).
    present = ~jnp.isnan(rewards) & valid[:, None, None]  # [P, G, K]
    scorable = jnp.any(present, axis=-1)  # [P, G]
    reward_adv, _, reward_constant = group_normalize(rewards, present, eps=group_eps, scale=group_scale)
    reward_zero_std = reward_constant[:, 0, :] & valid[:, None]  # [P, K]
    weighted_adv = reward_adv * weights  # w_k A_k: [P, G, K], 0 where undefined
    token_adv = weighted_adv * lengths[..., None]  # T_k
    signals = RewardSignals(
        rewards=rewards,
        present=present,
        scorable=scorable,
        weights=weights,
        lengths=lengths,
        summed=jnp.sum(weighted_adv, axis=-1),
        conflict=sign_conflict(token_adv) & scorable,
        snr=jnp.where(scorable, signal_to_noise(token_adv, eps=snr_eps), 0.0),
    )
    eligible = scorable
    if drop_zero_variance_groups:
        eligible = eligible & ~zero_variance_groups(reward_zero_std)[:, None]

    options = AdvantageOptions(
        snr_tau=snr_tau,
        batch_norm=batch_norm,
        batch_eps=batch_eps,
        group_eps=group_eps,
        group_scale=group_scale,
        query_reweighting=query_reweighting,
        halves_ranking=halves_ranking,
    )
    if method in METHODS:
        keep, advantages = ADVANTAGE_METHODS[method](signals, eligible, options)
    else:  # an aggregator of your own
        output = advantage_method(method)(signals, eligible, options)
        keep, advantages = _checked_method_output(method, output, (num_prompts, group_size))
    # kappa as applied; 1 or 0 (a prompt with or without a kept rollout) where no kappa is applied.
    kappa = (
        query_weight(keep)
        if method in FILTERING_METHODS and query_reweighting
        else jnp.where(jnp.any(keep, axis=1), 1.0, 0.0)
    )
    # GDPO's advantages as "before filtering" for every method but GRPO and GDPO (and yours).
    unfiltered = gdpo(signals, eligible, options)[1] if method not in ("grpo", "gdpo") else advantages

    return AdvantageOutput(
        advantages=advantages,
        keep=keep,
        conflict=signals.conflict,
        snr=signals.snr,
        query_weight=kappa,
        reward_advantages=reward_adv,
        unfiltered_advantages=unfiltered,
        reward_zero_std=reward_zero_std,
        reward_present=present,
        reward_weights=weights,
        summed=signals.summed,
    )


# ----------------------------------------------------------------------------------------------
# Diagnostics logged by the trainer.
# ----------------------------------------------------------------------------------------------


def _masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of ``values`` over ``mask`` (0 when the mask is empty)."""
    mask = mask.astype(jnp.float32)
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _lower_median(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Median of the masked entries of a flat array, the lower middle for even counts (as
    ``torch.median``); 0 when the mask is empty."""
    count = jnp.sum(mask)
    ordered = jnp.sort(jnp.where(mask, values, jnp.inf))
    index = jnp.maximum(count - 1, 0) // 2
    return jnp.where(count > 0, ordered[index], 0.0)


def advantage_diagnostics(
    out: AdvantageOutput, valid: jax.Array | None = None, reward_names: Sequence[str] | None = None
) -> dict[str, jax.Array]:
    """Scalar diagnostics of one step's advantages (jittable; every value a float32 scalar).

    Ratios are over the real rollouts (of ``valid`` prompts); ``query_weight_*`` over valid
    prompts (std with ddof=0, as the official logging). ``snr_*_in_conflict`` summarize the SNR
    of conflicting rollouts (0 when there are none). ``dropped_*`` count conflicting rollouts that
    were filtered out. ``zero_std_fraction/<name>`` is the fraction of groups in which reward k is
    constant (a reward that gives no signal there).

    Args:
      out: the output of `compute_advantages`.
      valid: [P] bool, the same mask given to `compute_advantages` (default all True).
      reward_names: K names for the ``zero_std_fraction/<name>`` keys (default: the indices k).

    Returns:
      dict name -> scalar array.
    """
    num_prompts, group_size = out.advantages.shape
    if valid is None:
        valid = jnp.ones((num_prompts,), bool)
    real = jnp.broadcast_to(valid[:, None], (num_prompts, group_size))
    conflict = out.conflict & real
    dropped = conflict & ~out.keep
    flat_snr, flat_conflict = out.snr.reshape(-1), conflict.reshape(-1)
    weight_mean = _masked_mean(out.query_weight, valid)
    weight_var = _masked_mean((out.query_weight - weight_mean) ** 2, valid)
    metrics = {
        "conflict_ratio": _masked_mean(conflict, real),
        "kept_fraction": _masked_mean(out.keep, real),
        "dropped_ratio": _masked_mean(dropped, real),
        "dropped_in_conflict_ratio": _masked_mean(dropped, conflict),
        "query_weight_mean": weight_mean,
        "query_weight_std": jnp.sqrt(weight_var),
        "query_weight_min": jnp.min(jnp.where(valid, out.query_weight, jnp.inf), initial=jnp.inf),
        "query_weight_max": jnp.max(jnp.where(valid, out.query_weight, -jnp.inf), initial=-jnp.inf),
        "snr_mean_in_conflict": _masked_mean(flat_snr, flat_conflict),
        "snr_abs_mean_in_conflict": _masked_mean(jnp.abs(flat_snr), flat_conflict),
        "snr_p50_in_conflict": _lower_median(flat_snr, flat_conflict),
        "abs_advantage_mean": _masked_mean(jnp.abs(out.advantages), real),
        "abs_advantage_mean_unfiltered": _masked_mean(jnp.abs(out.unfiltered_advantages), real),
    }
    zero_std = jnp.sum(out.reward_zero_std & valid[:, None], axis=0) / jnp.maximum(jnp.sum(valid), 1)
    num_rewards = out.reward_zero_std.shape[-1]
    names = tuple(reward_names) if reward_names is not None else tuple(str(k) for k in range(num_rewards))
    if len(names) != num_rewards:
        raise ValueError(f"reward_names: {len(names)} names {names} for the {num_rewards} rewards")
    for k, name in enumerate(names):
        metrics[f"zero_std_fraction/{name}"] = zero_std[k]
    metrics.update(reward_diagnostics(out, real, names))
    any_valid = jnp.any(valid)
    for name in ("query_weight_min", "query_weight_max"):
        metrics[name] = jnp.where(any_valid, metrics[name], 0.0)
    return {name: jnp.asarray(value, jnp.float32) for name, value in metrics.items()}


def _sign(values: jax.Array, eps: float = RATIO_EPS) -> jax.Array:
    """-1, 0 or 1: values within +-eps count as neither sign (as `sign_conflict`)."""
    return jnp.where(values > eps, 1.0, jnp.where(values < -eps, -1.0, 0.0))


def reward_diagnostics(out: AdvantageOutput, real: jax.Array, names: Sequence[str]) -> dict[str, jax.Array]:
    """What each reward and each pair of rewards does to the step's advantages (jittable scalars):

    ``reward_advantage_mean/<name>``, ``reward_advantage_std/<name>``  mean and std (ddof=0) of A_k over
        the rollouts where reward k is present
    ``opposes_sum/<name>``  the share of those where w_k A_k and S = sum_k w_k A_k have opposite signs (the
        reward pulls against the aggregate)
    ``conflict/<a>~<b>``  per pair a < b (in column order), the share of the rollouts where both are
        present whose w_a A_a and w_b A_b have opposite signs (the pairwise view of ``conflict_ratio``)
    ``pre_batch_abs_mean``  mean |S| over the scorable rollouts: the aggregate's magnitude before the
        batch step (the GDPO guidance's ">10x between batches" check, `MagnitudeWatch`)
    ``post_batch_abs_mean``  mean |advantage| over the kept rollouts, after it

    Signs within +-1e-8 count as neither (as the conflict test). Args: ``real`` [P, G] bool, the rollouts
    of valid prompts; ``names`` the K reward names.
    """
    present = out.reward_present & real[..., None]  # [P, G, K]
    count = jnp.maximum(jnp.sum(present, axis=(0, 1)), 1)  # [K]
    mean = jnp.sum(jnp.where(present, out.reward_advantages, 0.0), axis=(0, 1)) / count
    var = jnp.sum(jnp.where(present, (out.reward_advantages - mean) ** 2, 0.0), axis=(0, 1)) / count
    sign = _sign(out.reward_advantages * out.reward_weights)  # [P, G, K]
    opposes = present & (sign * _sign(out.summed)[..., None] < 0)
    opposes_share = jnp.sum(opposes, axis=(0, 1)) / count
    metrics = {}
    for k, name in enumerate(names):
        metrics[f"reward_advantage_mean/{name}"] = mean[k]
        metrics[f"reward_advantage_std/{name}"] = jnp.sqrt(var[k])
        metrics[f"opposes_sum/{name}"] = opposes_share[k]
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            both = present[..., a] & present[..., b]
            metrics[f"conflict/{names[a]}~{names[b]}"] = _masked_mean(sign[..., a] * sign[..., b] < 0, both)
    metrics["pre_batch_abs_mean"] = _masked_mean(jnp.abs(out.summed), jnp.any(present, axis=-1))
    metrics["post_batch_abs_mean"] = _masked_mean(jnp.abs(out.advantages), out.keep & real)
    return metrics


# ----------------------------------------------------------------------------------------------
# Across steps, on the host.
# ----------------------------------------------------------------------------------------------


class MagnitudeWatch:
    """The GDPO guidance's stability check ("validate that the advantage distribution prevents >10x
    magnitude fluctuations between batches"): each step's ``advantages/pre_batch_abs_mean`` against the
    step before; the first change by more than ``factor`` (up or down) is warned about once, in the
    console and as ``advantages/pre_batch_jump`` (the ratio) in that step's metrics. A step whose
    magnitude is 0 (no group with a spread: nothing to compare) neither warns nor is compared with.

    Group normalization makes S scale-free, so with the default ``group_scale="group"`` a reward whose
    scale jumps moves it little; without the group std (``group_scale="none"``) it jumps with the rewards.
    """

    METRIC = "advantages/pre_batch_abs_mean"
    JUMP = "advantages/pre_batch_jump"

    def __init__(self, factor: float = 10.0):
        self.factor = factor
        self.previous: tuple[int, float] | None = None
        self.warned = False

    def check(self, step: int, metrics: Mapping[str, float]) -> dict[str, float]:
        """{JUMP: ratio} at the first step whose magnitude is more than ``factor`` times (or less than
        1/``factor`` of) the step before's, warning naming both steps; else {}.

        Args:
          step: the RL step, 1-based (as in metrics.jsonl). metrics: the step's.
        """
        value = float(metrics.get(self.METRIC, float("nan")))
        if not value > 0 or value == float("inf"):
            return {}
        previous, self.previous = self.previous, (step, value)
        if previous is None or self.warned:
            return {}
        last_step, last = previous
        ratio = max(value / last, last / value)
        if ratio <= self.factor:
            return {}
        self.warned = True
        logger.warning(
            "%s changed %.1fx from step %d (%.4g) to step %d (%.4g): more than the %gx between batches that the "
            "GDPO guidance asks to prevent; look at the rewards' scales and the group normalization (warned once)",
            self.METRIC,
            ratio,
            last_step,
            last,
            step,
            value,
            self.factor,
        )
        return {self.JUMP: ratio}
