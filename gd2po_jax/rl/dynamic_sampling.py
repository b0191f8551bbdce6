"""Dynamic sampling with refill, decided from several rewards (``rl.dynamic_sampling``; docs/dynamic_sampling.md).

DAPO drops the prompt groups whose rollouts all got the same reward and samples more prompts until
the batch is full again. Here "no signal" is decided per reward, not from a summed reward:

- ``signal``: a group counts when at least one reward of weight != 0 *varies* in it (`reward_varies`).
- ``kept``: a group counts when at least ``rl.dynamic_sampling_min_kept`` of its rollouts carry a
  signal (`rollout_signal`) and are kept by the method's filter (`gd2po_jax.rl.train_step.step_advantages`'
  ``keep``: GD2PO-Hard drops every rollout in sign conflict): a group whose rollouts all conflict, or
  all tie, is replaced.

The tolerance rule (not ``std != 0``, whose float noise counts equal values as varying): over the
values of reward k present in group p (not NaN, valid prompt),

    varies[p, k] = (count >= 2) and (max - min > SIGNAL_RTOL * max |x|),    SIGNAL_RTOL = 1e-5

so the tolerance is relative to that reward's own scale in the group (1e-5 of its largest magnitude:
about 80 float32 ulps; a group of zeros never varies). A rollout carries a signal when some reward that
varies in its group gives it a value farther than the same tolerance from the group's mean, and it has
response tokens (the update's lengths).

A step (`collect_counted`) samples rounds of ``collect_rollouts``: round r draws the prompts it needs
from the epoch sampler, in order, and samples them with `round_key` (round 0: the step's key); it stops when
``train.prompts_per_step`` groups count or after ``rl.dynamic_sampling_max_rounds`` rounds. The final
batch is the first P counted groups in draw order; counted groups beyond P (surplus) are dropped (not
carried: their rollouts are of this step's policy, and the next step draws on from the sampler, whose
position the checkpoint holds, so a resume is exact). When the rounds run out short, the rest of the
batch is filler: groups that did not count, marked ``valid=False`` (no statistic, no loss, as a partly
filled batch's padding), and the step's metrics and a warning say so. The final batch has the shape of
a plain step's, so it goes through the same jitted update.

Inside the engine (``rl.dynamic_sampling_refill = "engine"``, where `gd2po_jax.rl.rollout.refill_applies`):
one run of the rollout engine samples the step, and each group that does not count is replaced by
the sampler's next prompt while the engine decodes the others (`gd2po_jax.rl.rollout.Refill`), up to
P x ``rl.dynamic_sampling_max_rounds`` prompts in all. The prompts sampled are the shortest prefix of
the sampler's order in which P groups count, so there is no surplus, and the sampler moves on by
exactly those prompts. Every row is sampled with the step's key under its own row id.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from gd2po_jax.config.rl import DYNAMIC_SAMPLING_MODES
from gd2po_jax.data.prompts import PromptSet
from gd2po_jax.data.tokenization import decode_completions
from gd2po_jax.rl.micro_batches import verl_update_layout
from gd2po_jax.rl.rollout import Refill, Rollouts, RolloutSettings
from gd2po_jax.rl.train_step import StepConfig, host_advantages
from gd2po_jax.runtime.distributed import addressable_rows, host_value, replicated
from gd2po_jax.training.records import RolloutBatch

logger = logging.getLogger(__name__)

#: the relative tolerance of "varies" (module docstring).
SIGNAL_RTOL = 1e-5
#: the marks of saved rollouts (`gd2po_jax.rl.rollout_log`): in the update, filler of a short step,
#: drawn but not counted, counted beyond the batch.
COUNTED, FILLER, NO_SIGNAL, SURPLUS = "counted", "filler", "no_signal", "surplus"

_ROW_FIELDS = ("input_ids", "attention_mask", "response_mask", "old_logp", "ref_logp")

# ----------------------------------------------------------------------------------------------
# The counting rule (pure, numpy).
# ----------------------------------------------------------------------------------------------


def _present(rewards: np.ndarray, valid: np.ndarray) -> np.ndarray:
    return ~np.isnan(rewards) & np.asarray(valid, bool)[:, None, None]


def _group_stats(rewards: np.ndarray, present: np.ndarray):
    """(spread [P, K], scale [P, K], mean [P, K], count [P, K]) over each group's present values."""
    x = np.where(present, rewards, 0.0).astype(np.float64)
    count = present.sum(axis=1)
    hi = np.where(present, rewards, -np.inf).max(axis=1)
    lo = np.where(present, rewards, np.inf).min(axis=1)
    spread = np.where(count > 0, hi - lo, 0.0)
    scale = np.where(present, np.abs(x), 0.0).max(axis=1)
    mean = x.sum(axis=1) / np.maximum(count, 1)
    return spread, scale, mean, count


def reward_varies(rewards: np.ndarray, valid: np.ndarray, weights: Sequence[float] | None = None) -> np.ndarray:
    """[P, K] bool: reward k varies in group p (the module docstring's rule): at least two values present
    and ``max - min > SIGNAL_RTOL * max |x|``; False for an invalid prompt and for a reward of weight 0.

    Args:
      rewards: [P, G, K] float, NaN where a reward abstained. valid: [P] bool.
      weights: K reward weights (None: all ones).
    """
    rewards = np.asarray(rewards, np.float32)
    present = _present(rewards, valid)
    spread, scale, _, count = _group_stats(rewards, present)
    varies = (count >= 2) & (spread > SIGNAL_RTOL * scale)
    if weights is not None:
        varies &= np.asarray(weights, np.float32)[None, :] != 0
    return varies


def rollout_signal(rewards: np.ndarray, valid: np.ndarray, lengths: np.ndarray, varies: np.ndarray) -> np.ndarray:
    """[P, G] bool: the rollout has response tokens and some reward that varies in its group
    (``varies`` [P, K], `reward_varies`) gives it a value farther than the tolerance from the group's
    mean. lengths: [P, G] the update's response tokens."""
    rewards = np.asarray(rewards, np.float32)
    present = _present(rewards, valid)
    _, scale, mean, _ = _group_stats(rewards, present)
    away = np.abs(np.where(present, rewards, 0.0) - mean[:, None, :]) > SIGNAL_RTOL * scale[:, None, :]
    return np.any(present & varies[:, None, :] & away, axis=-1) & (np.asarray(lengths) > 0)


def counted_groups(
    mode: str, rewards: np.ndarray, lengths: np.ndarray, valid: np.ndarray, config: StepConfig, min_kept: int = 2
) -> tuple[np.ndarray, np.ndarray]:
    """(counted [P] bool, varies [P, K] bool) of one round's groups under ``mode``.

    Args:
      mode: "off" (every valid group counts) | "signal" | "kept" (`gd2po_jax.config.rl.DYNAMIC_SAMPLING_MODES`).
      rewards: [P, G, K] (NaN: abstained). lengths: [P, G] the update's response tokens (0 for a
        truncated completion with ``rl.mask_truncated_completions``). valid: [P] bool.
      config: the update's `StepConfig` (the method and its filter; the reward weights).
      min_kept: ``rl.dynamic_sampling_min_kept``.
    """
    if mode not in DYNAMIC_SAMPLING_MODES:
        raise ValueError(f"dynamic sampling mode must be one of {DYNAMIC_SAMPLING_MODES}, got {mode!r}")
    valid = np.asarray(valid, bool)
    varies = reward_varies(rewards, valid, config.reward_weights)
    if mode == "off":
        return valid.copy(), varies
    if mode == "signal":
        return valid & varies.any(axis=1), varies
    lengths = np.asarray(lengths).reshape(np.shape(rewards)[:2])
    keep = np.asarray(host_advantages(rewards, lengths, valid, config).keep, bool)
    signal = rollout_signal(rewards, valid, lengths, varies)
    return valid & (np.sum(keep & signal, axis=1) >= min_kept), varies


# ----------------------------------------------------------------------------------------------
# The rounds of a step.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Round:
    """One round of a step: its prompts, rollouts, and on the host the update's lengths [P_r, G]
    and prompt lengths [P_r * G], what counted [P_r] and which rewards varied [P_r, K]."""

    prompts: PromptSet
    rollouts: Rollouts
    lengths: np.ndarray
    prompt_lengths: np.ndarray
    counted: np.ndarray
    varies: np.ndarray


@dataclasses.dataclass
class RefilledRollouts(Rollouts):
    """The final batch of a dynamically sampled step (a `Rollouts` of P groups, the update's), and what
    the step sampled to get it.

    ``generated_tokens``, ``sampling_seconds``, ``reward_seconds``, ``abstained`` and ``failed`` are
    those of every rollout the step sampled (all rounds), the rest that of the final batch.

    prompts: the final batch's P prompts. marks: P `COUNTED` | `FILLER`.
    dropped: (prompts, rewards [D, G, K], lengths [D, G], truncated [D * G], responses (D * G texts, or
      None where this process did not decode them all), marks D `NO_SIGNAL` | `SURPLUS`) of the
      groups drawn but not in the batch; None when none.
    sampling_metrics: the ``dynamic_sampling/*`` metrics (`collect_counted`).
    """

    prompts: PromptSet | None = None
    marks: tuple[str, ...] = ()
    dropped: tuple | None = None
    sampling_metrics: dict[str, float] = dataclasses.field(default_factory=dict)


#: the salt of the refill rounds' keys (`round_key`).
ROUND_STREAM = 0x0D5A


def round_key(step_key: jax.Array, round_index: int) -> jax.Array:
    """Round r's sampling key: round 0 the step's own key (what a step without dynamic sampling samples
    with, so a step whose first round fills the batch is that step exactly), round r >= 1
    ``fold_in(fold_in(step_key, ROUND_STREAM), r)``: distinct from each other and from the per-call keys
    ``fold_in(step_key, i)`` that `collect_rollouts` derives for ``sampling.prompts_per_call``."""
    if round_index == 0:
        return step_key
    return jax.random.fold_in(jax.random.fold_in(step_key, ROUND_STREAM), round_index)


def round_sizes(needed: int, num_prompts: int, prompts_per_call: int) -> int:
    """Prompts round r draws when ``needed`` groups are missing: all P when the sampler samples the step
    at once (``prompts_per_call`` 0 or >= P), else the fewest whole calls that hold ``needed``
    (a call's compiled shape stays that of a plain step)."""
    if not prompts_per_call or prompts_per_call >= num_prompts:
        return num_prompts
    return min(num_prompts, math.ceil(needed / prompts_per_call) * prompts_per_call)


def collect_counted(
    first: PromptSet,
    draw: Callable[[int], PromptSet],
    collect: Callable[[PromptSet, jax.Array], Rollouts],
    *,
    rng: jax.Array,
    step_config: StepConfig,
    mode: str,
    min_kept: int,
    max_rounds: int,
    prompts_per_call: int = 0,
    mask_truncated: bool = False,
    mesh=None,
    settings: RolloutSettings | None = None,
    tokenizer=None,
    reward_names: Sequence[str] = (),
    collect_refilled: Callable[[PromptSet, jax.Array, Refill], Rollouts] | None = None,
) -> RefilledRollouts:
    """Sample rounds until ``len(first)`` = P groups count (`counted_groups`) or ``max_rounds`` ran, and
    assemble the final batch (`assemble`).

    Args:
      first: round 0's P prompts (the step's usual draw). draw: n -> the sampler's next n prompts.
      collect: (prompts, rng) -> their `Rollouts` (`gd2po_jax.rl.rollout.collect_rollouts`, failures
        checked); round r's rng is `round_key` ``(rng, r)``.
      rng: the step's sampling key.
      step_config, mode, min_kept: the counting rule (`counted_groups`). max_rounds: >= 1.
      prompts_per_call: ``sampling.prompts_per_call`` (`round_sizes`).
      mask_truncated: ``rl.mask_truncated_completions`` (a truncated rollout has no update tokens).
      mesh, settings, tokenizer: the final batch's placement, update layout and (several processes)
        the decoding of its completions.
      reward_names: the K names of the ``no_signal_fraction`` metrics.
      collect_refilled: (prompts, rng, refill) -> their `Rollouts` refilled inside the engine
        (`gd2po_jax.rl.rollout.collect_rollouts` with ``refill``, failures checked): one engine run
        replaces the rounds, up to P x ``max_rounds`` prompts (module docstring); None: rounds.
    """
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
    num_prompts = len(first)
    if collect_refilled is not None:
        counts = functools.partial(
            _group_counts, mode=mode, step_config=step_config, min_kept=min_kept, mask_truncated=mask_truncated
        )
        refill = Refill(max_prompts=num_prompts * max_rounds, draw=draw, counts=counts)
        rollouts = collect_refilled(first, rng, refill)
        round_ = _round_of(refill.prompts or first, rollouts, mode, step_config, min_kept, mask_truncated)
        if len(refill.counted) != len(round_.prompts):
            raise RuntimeError(
                f"the engine decided {len(refill.counted)} of the {len(round_.prompts)} groups it sampled"
            )
        round_.counted = np.asarray(refill.counted, bool)  # what drove the refill (a group's own decision)
        return assemble(
            [round_], num_prompts, mesh=mesh, settings=settings, tokenizer=tokenizer, reward_names=reward_names
        )
    rounds: list[Round] = []
    picks: list[tuple[int, int]] = []
    prompts = first
    for r in range(max_rounds):
        if r:
            prompts = draw(round_sizes(num_prompts - len(picks), num_prompts, prompts_per_call))
        rollouts = collect(prompts, round_key(rng, r))
        rounds.append(_round_of(prompts, rollouts, mode, step_config, min_kept, mask_truncated))
        picks.extend((r, int(p)) for p in np.flatnonzero(rounds[-1].counted))
        if len(picks) >= num_prompts:
            break
    return assemble(rounds, num_prompts, mesh=mesh, settings=settings, tokenizer=tokenizer, reward_names=reward_names)


def _round_of(
    prompts: PromptSet, rollouts: Rollouts, mode: str, step_config: StepConfig, min_kept: int, mask_truncated: bool
) -> Round:
    """The `Round` of ``prompts`` (A of them) and their rollouts, whose device batch may hold more
    rows than the A x G (a refilled engine run's room: the rows past them are never used)."""
    used = len(prompts) * rollouts.rewards.shape[1]
    lengths, prompt_lengths = host_value(
        (jnp.sum(rollouts.batch.response_mask, axis=-1), jnp.sum(rollouts.batch.attention_mask, axis=-1))
    )
    # attention_mask is the prompt's mask then ones over the M completion slots
    prompt_lengths = np.asarray(prompt_lengths)[:used] - rollouts.batch.response_mask.shape[1]
    lengths = np.asarray(lengths)[:used].reshape(len(prompts), -1)
    counted, varies = counted_groups(
        mode,
        rollouts.rewards,
        _update_lengths(lengths, rollouts.truncated, mask_truncated),
        np.ones(len(prompts), bool),
        step_config,
        min_kept,
    )
    return Round(prompts, rollouts, lengths, prompt_lengths, counted, varies)


def _update_lengths(lengths: np.ndarray, truncated: np.ndarray, mask_truncated: bool) -> np.ndarray:
    """[P, G] the update's response tokens: ``lengths``, 0 for a truncated rollout when masked."""
    return np.where(np.reshape(truncated, lengths.shape), 0, lengths) if mask_truncated else lengths


def _group_counts(
    rewards, lengths, finished, *, mode: str, step_config: StepConfig, min_kept: int, mask_truncated: bool
) -> bool:
    """Whether one group counts (`counted_groups` of it alone): rewards [G, K], lengths [G] its
    response tokens, finished [G] (EOS emitted). The rule is a group's own (its rewards, its
    normalization, the filter's keep of its rollouts), so it decides as the whole batch would."""
    update = _update_lengths(np.asarray(lengths)[None], ~np.asarray(finished, bool)[None], mask_truncated)
    counted, _ = counted_groups(mode, np.asarray(rewards)[None], update, np.ones(1, bool), step_config, min_kept)
    return bool(counted[0])


def sampling_metrics(rounds: Sequence[Round], num_prompts: int, reward_names: Sequence[str]) -> dict[str, float]:
    """The ``dynamic_sampling/*`` metrics of a step's rounds: rounds, prompts_drawn, groups_counted
    (in the batch, at most P), filler_groups, surplus_groups, generated_tokens (every round's),
    no_signal_fraction/<reward> (the drawn groups in which the reward does not vary) and
    sampled_reward/<reward> (its mean over every rollout drawn: the selection biases ``reward/<name>``)."""
    counted = sum(int(r.counted.sum()) for r in rounds)
    drawn = sum(len(r.prompts) for r in rounds)
    varies = np.concatenate([r.varies for r in rounds])
    rewards = np.concatenate([r.rollouts.rewards for r in rounds])
    metrics = {
        "dynamic_sampling/rounds": float(len(rounds)),
        "dynamic_sampling/prompts_drawn": float(drawn),
        "dynamic_sampling/groups_counted": float(min(counted, num_prompts)),
        "dynamic_sampling/filler_groups": float(max(0, num_prompts - counted)),
        "dynamic_sampling/surplus_groups": float(max(0, counted - num_prompts)),
        "dynamic_sampling/generated_tokens": float(sum(r.rollouts.generated_tokens for r in rounds)),
    }
    names = list(reward_names) or [str(k) for k in range(varies.shape[1])]
    for k, name in enumerate(names):
        metrics[f"dynamic_sampling/no_signal_fraction/{name}"] = float(np.mean(~varies[:, k]))
        values = rewards[..., k]
        finite = ~np.isnan(values)
        metrics[f"dynamic_sampling/sampled_reward/{name}"] = float(values[finite].mean()) if finite.any() else 0.0
    return metrics


def _gather(parts, rows):
    return jnp.take(jnp.concatenate(parts, axis=0), rows, axis=0)


@functools.lru_cache(maxsize=16)
def _gather_fn(sharding):
    """The jitted gather, its output on ``sharding`` (a mesh's; None: where XLA puts it, as a
    single-device array is)."""
    return jax.jit(_gather) if sharding is None else jax.jit(_gather, out_shardings=sharding)


def gather_rows(batches: Sequence[RolloutBatch], rows: np.ndarray, like: RolloutBatch) -> dict[str, jax.Array]:
    """The per-row arrays (`_ROW_FIELDS`) of the rows ``rows`` [B] of the rounds' batches laid end to
    end, on the device, placed as ``like``'s (a round of the step's full size)."""
    indices = jnp.asarray(rows, jnp.int32)
    out = {}
    for name in _ROW_FIELDS:
        sharding = getattr(like, name).sharding
        gather = _gather_fn(sharding if isinstance(sharding, NamedSharding) else None)
        out[name] = gather(tuple(getattr(b, name) for b in batches), indices)
    return out


def _prompts_of(rounds: Sequence[Round], groups: Sequence[tuple[int, int]]) -> PromptSet:
    """The prompts of ``groups`` ((round, prompt) pairs), in that order."""
    return PromptSet(
        texts=[rounds[r].prompts.texts[p] for r, p in groups],
        token_ids=[rounds[r].prompts.token_ids[p] for r, p in groups],
        columns={name: [rounds[r].prompts.columns[name][p] for r, p in groups] for name in rounds[0].prompts.columns},
    )


def _weighted(values: Sequence[np.ndarray], weights: Sequence[int]) -> np.ndarray:
    total = max(sum(weights), 1)
    return np.sum([np.asarray(v, np.float64) * w for v, w in zip(values, weights)], axis=0) / total


def assemble(
    rounds: Sequence[Round],
    num_prompts: int,
    *,
    mesh=None,
    settings: RolloutSettings | None = None,
    tokenizer=None,
    reward_names: Sequence[str] = (),
) -> RefilledRollouts:
    """The final batch of P groups from the rounds: the first P counted groups in draw order, then (a
    short step) filler groups, the first uncounted ones, with ``valid=False``; the other groups are
    ``dropped`` (marked `NO_SIGNAL` or `SURPLUS`). Rows keep their round's tokens and log-probs; the
    update layout (``settings.micro_batch_max_tokens``) is laid out anew for the batch."""
    counted = [(r, int(p)) for r, rnd in enumerate(rounds) for p in np.flatnonzero(rnd.counted)]
    uncounted = [(r, int(p)) for r, rnd in enumerate(rounds) for p in np.flatnonzero(~rnd.counted)]
    chosen = counted[:num_prompts]
    filler = uncounted[: num_prompts - len(chosen)]
    if len(chosen) + len(filler) != num_prompts:  # only if a round drew fewer than P prompts: round 0 draws P
        raise ValueError(f"{len(chosen) + len(filler)} groups for a batch of {num_prompts} prompts")
    groups = chosen + filler
    marks = (COUNTED,) * len(chosen) + (FILLER,) * len(filler)
    in_batch = set(groups)
    dropped = [(g, SURPLUS) for g in counted[num_prompts:]] + [(g, NO_SIGNAL) for g in uncounted if g not in in_batch]
    group = rounds[0].rollouts.rewards.shape[1]
    offsets = np.cumsum([0] + [len(r.prompts) * group for r in rounds])

    def rows_of(selection):
        return np.asarray([offsets[r] + p * group + g for r, p in selection for g in range(group)], np.int64)

    rows = rows_of(groups)
    first = rounds[0].rollouts
    row_arrays = gather_rows([r.rollouts.batch for r in rounds], rows, first.batch)
    rewards = np.stack([rounds[r].rollouts.rewards[p] for r, p in groups])  # [P, G, K]
    valid = np.asarray([m == COUNTED for m in marks])
    layout = {}
    if settings is not None and settings.micro_batch_max_tokens:
        lengths = np.concatenate([rounds[r].lengths[p] for r, p in groups])
        prompt_lengths = np.concatenate([rounds[r].prompt_lengths[p * group : (p + 1) * group] for r, p in groups])
        plan = verl_update_layout(
            prompt_lengths + lengths,
            num_minibatches=settings.num_minibatches,
            max_tokens=settings.micro_batch_max_tokens,
            ranks=settings.micro_batch_ranks,
        )
        layout = {"row_order": replicated(plan.row_order, mesh), "segment_ids": replicated(plan.segment_ids, mesh)}
    batch = first.batch.replace(
        **row_arrays, rewards=replicated(rewards, mesh).astype(jnp.float32), valid=replicated(valid, mesh), **layout
    )
    whole = all(len(r.rollouts.responses) == len(r.prompts) * group for r in rounds)
    all_responses = [text for r in rounds for text in r.rollouts.responses] if whole else None
    if all_responses is not None:
        responses = [all_responses[i] for i in rows]
    else:  # several processes: decode this process's rows of the batch, as collect_rollouts does
        mine, tokens = addressable_rows(batch.input_ids[:, -batch.old_logp.shape[1] :])
        lengths_all = np.concatenate([r.lengths.reshape(-1) for r in rounds])[rows]
        responses = decode_completions(tokenizer, tokens, lengths_all[mine])
    truncated = np.concatenate([r.rollouts.truncated for r in rounds])
    extras: dict[str, dict[int, object]] = {}
    position = {int(source): i for i, source in enumerate(rows)}
    for r, rnd in enumerate(rounds):
        for column, values in rnd.rollouts.reward_extras.items():
            for index, value in values.items():
                if (i := position.get(int(offsets[r] + index))) is not None:
                    extras.setdefault(column, {})[i] = value
    sizes = [len(r.prompts) * group for r in rounds]
    metrics: dict[str, float] = {}
    for rnd in rounds:  # the reward functions' own: time/* summed, the others averaged over rounds
        for name, value in rnd.rollouts.reward_metrics.items():
            metrics[name] = metrics.get(name, 0.0) + value / (1 if name.startswith("time/") else len(rounds))
    dropped_part = None
    if dropped:
        sel = [g for g, _ in dropped]
        dropped_rows = rows_of(sel)
        dropped_part = (
            _prompts_of(rounds, sel),
            np.stack([rounds[r].rollouts.rewards[p] for r, p in sel]),
            np.stack([rounds[r].lengths[p] for r, p in sel]),
            truncated[dropped_rows],
            None if all_responses is None else [all_responses[i] for i in dropped_rows],
            tuple(mark for _, mark in dropped),
        )
    return RefilledRollouts(
        batch=batch,
        responses=list(responses),
        rewards=rewards,
        abstained=_weighted([r.rollouts.abstained for r in rounds], sizes),
        failed=_weighted([r.rollouts.failed for r in rounds], sizes),
        first_failure=next((r.rollouts.first_failure for r in rounds if r.rollouts.first_failure), None),
        truncated=truncated[rows],
        generated_tokens=sum(r.rollouts.generated_tokens for r in rounds),
        sampling_seconds=sum(r.rollouts.sampling_seconds for r in rounds),
        reward_seconds=sum(r.rollouts.reward_seconds for r in rounds),
        reward_metrics=metrics,
        reward_extras=extras,
        prompts=_prompts_of(rounds, groups),
        marks=marks,
        dropped=dropped_part,
        sampling_metrics=sampling_metrics(rounds, num_prompts, reward_names),
    )


def warn_short_step(metrics: dict[str, float], step: int, max_rounds: int) -> bool:
    """Warn when step ``step`` (1-based) ran out of rounds before its batch was full (``metrics``:
    `sampling_metrics`'); returns whether it did."""
    filler = int(metrics.get("dynamic_sampling/filler_groups", 0))
    if filler:
        logger.warning(
            "step %d: rl.dynamic_sampling found %d of %d groups that count in %d round(s), %d prompts drawn "
            "(rl.dynamic_sampling_max_rounds=%d); the update uses those, the other %d groups are filler "
            "(no statistic, no loss)%s",
            step,
            int(metrics["dynamic_sampling/groups_counted"]),
            int(metrics["dynamic_sampling/groups_counted"]) + filler,
            int(metrics["dynamic_sampling/rounds"]),
            int(metrics.get("dynamic_sampling/prompts_drawn", 0)),
            max_rounds,
            filler,
            ": no group counted, so the update has no advantage at all"
            if not metrics["dynamic_sampling/groups_counted"]
            else "",
        )
    return bool(filler)
