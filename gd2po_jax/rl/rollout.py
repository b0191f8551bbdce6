"""From prompts to a `RolloutBatch`: sample on device, decode, score on the host.

The sampled tokens, masks and log-probs never leave the device; only the token ids are copied to
the host to be decoded into text for the reward functions, and the [P, G, K] rewards come back. In
one process, a group's rewards are computed while the sampler decodes the other groups
(`GroupScoring`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gd2po_jax.config import RunConfig, SamplingConfig
from gd2po_jax.config.train import ENGINE_LAYER_SCAN
from gd2po_jax.data.prompts import PromptSet
from gd2po_jax.data.tokenization import decode_completions
from gd2po_jax.models.logprobs import logprob_temperature
from gd2po_jax.models.sampling import GenerateOutput, GroupOutput, completion_mask, engine_applies, generate
from gd2po_jax.rewards.base import (
    RESPONSE_IDS,
    ROLLOUT_INDEX,
    RewardFunction,
    reward_step_extras,
    reward_step_metrics,
    scores_on_devices,
)
from gd2po_jax.rewards.scoring import Scores, StreamScorer, abstained_fraction, failed_fraction, score_batch
from gd2po_jax.rl.micro_batches import verl_update_layout
from gd2po_jax.runtime.distributed import addressable_rows, gather_rows, gather_texts, host_value, replicated
from gd2po_jax.runtime.sharding import mesh_of
from gd2po_jax.training.records import RolloutBatch


@dataclasses.dataclass
class Rollouts:
    """One step's rollouts: the device batch for the update, plus host-side texts for logging.

    The host arrays are the whole step's on every process of a multi-host run; ``responses`` only
    those of the rollouts this process decoded (its devices' rows; all of them in one process).
    """

    batch: RolloutBatch
    responses: list[str]
    rewards: np.ndarray  # [P, G, K], NaN where a reward abstained
    abstained: np.ndarray  # [K] share of the valid rollouts each reward abstained on
    failed: np.ndarray  # [K] share of the valid rollouts each reward failed on (on_error='min')
    first_failure: str | None  # what went wrong on the first failed rollout; None when none failed
    truncated: np.ndarray  # [P * G] bool, no EOS within max_new_tokens
    generated_tokens: int
    sampling_seconds: float  # generation, until the tokens are on the host (with the groups scored meanwhile)
    reward_seconds: float  # decoding and scoring after that (`GroupScoring`: what did not overlap the decode)
    reward_metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # the reward functions' own
    # What reward functions reported per rollout (TRL's log_extra): column -> {rollout index: value};
    # this process's rollouts only.
    reward_extras: dict[str, dict[int, Any]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """How a step's rollouts are sampled and scored; `of_run` reads them from a run.

    num_generations: G, rollouts per prompt (``rl.num_generations``).
    sampling: max_new_tokens, temperature, top_p, top_k (``config.sampling``).
    eos_token_ids, pad_token_id: of the policy's tokenizer.
    prompt_length: padded prompt length Lp (fixed for a run: one compiled program).
    prompts_per_call: sample this many prompts (x G rollouts) per sampler call, to bound the KV
      cache of large steps; 0 (or at least P) samples the whole step at once.
    logprob_temperature: T of the old log-probs, ``log_softmax(logits / T)``: the update's
      (`gd2po_jax.models.logprobs.logprob_temperature`).
    on_error, num_workers, timeout_s: how rewards are scored (`gd2po_jax.rewards.scoring.score_batch`).
    score_groups: score each group as the sampler completes it (`GroupScoring`, where it applies:
      `scores_groups`); False: the whole step after the decode.
    micro_batch_max_tokens, micro_batch_ranks, num_minibatches: > 0: the batch carries verl's
      minibatch order and micro-batches of the update (``rl.micro_batch_max_tokens``,
      `gd2po_jax.rl.micro_batches.verl_update_layout`), laid out from the rows' lengths; 0: none.
    """

    num_generations: int
    sampling: SamplingConfig
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    prompt_length: int
    prompts_per_call: int = 0
    logprob_temperature: float = 1.0
    on_error: str = "raise"
    num_workers: int = 1
    timeout_s: float = 0.0
    score_groups: bool = True
    micro_batch_max_tokens: int = 0
    micro_batch_ranks: int = 1
    num_minibatches: int = 1

    @classmethod
    def of_run(cls, config: RunConfig, *, eos_token_ids, pad_token_id: int, prompt_length: int) -> RolloutSettings:
        """The settings of a run: its config and its tokenizer's ids (`gd2po_jax.tasks.setup.RunSetup`)."""
        return cls(
            num_generations=config.rl.num_generations,
            sampling=config.sampling,
            eos_token_ids=tuple(eos_token_ids),
            pad_token_id=pad_token_id,
            prompt_length=prompt_length,
            prompts_per_call=config.sampling.prompts_per_call,
            logprob_temperature=logprob_temperature(config),
            on_error=config.rewards.on_error,
            num_workers=config.rewards.num_workers,
            timeout_s=config.rewards.timeout_s,
            score_groups=config.rewards.score_groups,
            micro_batch_max_tokens=config.rl.micro_batch_max_tokens,
            micro_batch_ranks=config.rl.micro_batch_ranks,
            num_minibatches=config.rl.num_minibatches,
        )


@dataclasses.dataclass
class Refill:
    """Dynamic sampling inside the rollout engine (`collect_rollouts`' ``refill``): each group that
    does not count is replaced by the data's next prompt, admitted while the engine decodes the rest.

    Before each decode chunk the engine asks for prompts; the groups it has handed over by then are
    decided (their rewards waited for: they were scored while the previous chunk ran) and one prompt
    is drawn for each that does not count, until ``max_prompts`` are drawn in all. The prompts sampled
    are therefore the shortest prefix of the data's order in which P groups count (or ``max_prompts``),
    whatever the timing of the rewards, and each row's completion is that of its row id
    (`gd2po_jax.models.engine`): a step whose first P groups all count samples exactly what it
    samples without refill.

    max_prompts: at most this many prompts sampled in all (the first P included).
    draw: n -> the data's next n prompts (a `PromptSet`).
    counts: (rewards [G, K], response lengths [G], finished [G] bool) -> whether the group counts.

    Filled in by the call: ``prompts``, the A prompts sampled (the first P, then those drawn, in
    order); ``counted`` [A], whether each group counts.
    """

    max_prompts: int
    draw: Callable[[int], PromptSet]
    counts: Callable[[np.ndarray, np.ndarray, np.ndarray], bool]
    prompts: PromptSet | None = None
    counted: list[bool] = dataclasses.field(default_factory=list)


def refill_applies(reward_fn: RewardFunction, settings: RolloutSettings, num_prompts: int, mesh=None) -> bool:
    """Whether `collect_rollouts` can refill inside the engine for a policy on ``mesh``: the engine
    samples (``sampling.engine``; one process, one device: `engine_applies`), groups are scored as
    they complete (`scores_groups`), and the step is one sampler call (``sampling.prompts_per_call``
    0 or >= P)."""
    one_call = not settings.prompts_per_call or settings.prompts_per_call >= num_prompts
    return bool(settings.sampling.engine) and one_call and scores_groups(reward_fn, settings) and engine_applies(mesh)


def collect_rollouts(
    model,
    prompt_set: PromptSet,
    tokenizer,
    reward_fn: RewardFunction,
    settings: RolloutSettings,
    *,
    rng: jax.Array,
    valid: np.ndarray | None = None,
    refill: Refill | None = None,
) -> Rollouts:
    """Sample ``settings.num_generations`` completions of every prompt, decode and score them.

    Args:
      model: the policy `Decoder` to sample from.
      prompt_set: P prompts.
      tokenizer: decodes the completions for the reward functions.
      reward_fn: the run's reward function ([P * G, K] scores).
      settings: `RolloutSettings`.
      rng: the step's sampling key.
      valid: [P] bool, False for filler prompts of a partly filled batch.
      refill: dynamic sampling inside the engine (`Refill`; where `refill_applies`). The Rollouts'
        host arrays are then of the A prompts sampled (``refill.prompts``), its device batch of
        ``refill.max_prompts`` groups (the rows of prompts never drawn: empty, ``valid`` False).
    """
    num_prompts = len(prompt_set)
    start = time.perf_counter()
    sampling, num_generations = settings.sampling, settings.num_generations
    chunk = min(settings.prompts_per_call, num_prompts) or num_prompts
    if num_prompts % chunk:
        raise ValueError(f"config.sampling.prompts_per_call={chunk} must divide the {num_prompts} prompts of a step")
    more_prompts = None
    if refill is not None:
        if not refill_applies(reward_fn, settings, num_prompts, mesh_of(model)):
            raise ValueError(
                "refilling inside the engine needs sampling.engine, one process and device, groups scored as "
                "they complete (rewards.score_groups, host rewards) and one sampler call per step"
            )
        if valid is not None:
            raise ValueError("collect_rollouts: a refilled step's prompts are all valid (no valid argument)")
        prompt_set = prompt_set.select(range(len(prompt_set)))  # a copy: the refill extends it
        refill.prompts, refill.counted = prompt_set, []
    # One process with host rewards: each group is scored as soon as its G rows are done, while the
    # engine decodes the rest (`GroupScoring`). Several processes, or reward models (device programs
    # over every process's rows): the whole step at once, after the decode.
    streaming = (
        GroupScoring(prompt_set, tokenizer, reward_fn, settings, max_prompts=refill.max_prompts if refill else 0)
        if scores_groups(reward_fn, settings)
        else None
    )
    if refill is not None and streaming is not None:
        more_prompts = streaming.refiller(refill, num_prompts)
    parts = [
        generate(
            model,
            prompt_set.token_ids[i : i + chunk],
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            eos_token_ids=list(settings.eos_token_ids),
            pad_token_id=settings.pad_token_id,
            rng=rng if chunk == num_prompts else jax.random.fold_in(rng, i // chunk),
            num_samples=num_generations,
            prompt_length=settings.prompt_length,
            logprob_temperature=settings.logprob_temperature,
            slots=sampling.engine_slots,
            chunk=sampling.engine_chunk,
            scan_layers=ENGINE_LAYER_SCAN[sampling.engine_layers],
            static=not sampling.engine,
            on_group=None if streaming is None else streaming.handler(first_prompt=i),
            more_prompts=more_prompts,
            max_prompts=refill.max_prompts if refill is not None else 0,
        )
        for i in range(0, num_prompts, chunk)
    ]
    out: GenerateOutput = parts[0] if len(parts) == 1 else jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)
    # Several processes: each decodes and scores the rollouts its devices hold, then the scores are
    # gathered (`gd2po_jax.runtime.distributed`); one process holds every row.
    rows, tokens = addressable_rows(out.tokens)
    lengths, finished, prompt_lengths = host_value((out.lengths, out.finished, jnp.sum(out.prompt_mask, axis=1)))
    capacity = len(lengths) // num_generations  # P, or a refilled run's max_prompts
    num_prompts = len(prompt_set)  # a refilled run's A prompts sampled
    used = num_prompts * num_generations
    rows, tokens, lengths, finished, prompt_lengths = (
        x[:used] for x in (rows, tokens, lengths, finished, prompt_lengths)
    )
    sampled = time.perf_counter()
    if streaming is not None:
        scores, responses = streaming.result(num_prompts)
    else:
        if scores_on_devices(reward_fn) and jax.process_count() > 1:
            # Reward models run one program over every process's devices, fed the same rows by every
            # process: each process scores all the rollouts.
            rows, tokens = np.arange(len(lengths)), host_value(out.tokens)
        prompts, responses, columns = score_inputs(prompt_set, tokenizer, num_generations, rows, tokens, lengths[rows])
        scores = score_batch(
            reward_fn,
            prompts,
            responses,
            columns,
            on_error=settings.on_error,
            num_workers=settings.num_workers,
            timeout_s=settings.timeout_s,
            first_rollout=int(rows[0]),
        )
    reward_metrics = reward_step_metrics(reward_fn)
    reward_extras = reward_step_extras(reward_fn)
    all_rewards, all_failed = gather_rows(rows, (scores.rewards, scores.failed), len(lengths))
    first_failure = next((e for e in gather_texts(scores.first_error) if e is not None), None)
    rewards = all_rewards.reshape(num_prompts, num_generations, -1)
    scored = time.perf_counter()
    valid = np.ones(num_prompts, bool) if valid is None else np.asarray(valid, bool)
    batch_rewards, batch_valid = rewards, valid
    if capacity > num_prompts:  # the rows of prompts never drawn: no reward, not valid
        batch_rewards = np.concatenate(
            [rewards, np.full((capacity - num_prompts, *rewards.shape[1:]), np.nan, np.float32)]
        )
        batch_valid = np.concatenate([valid, np.zeros(capacity - num_prompts, bool)])
    mesh = mesh_of(model)
    layout = {}
    if settings.micro_batch_max_tokens:  # verl's minibatches and micro-batches, from the rows' tokens
        plan = verl_update_layout(
            np.asarray(prompt_lengths) + np.asarray(lengths),
            num_minibatches=settings.num_minibatches,
            max_tokens=settings.micro_batch_max_tokens,
            ranks=settings.micro_batch_ranks,
        )
        layout = {"row_order": replicated(plan.row_order, mesh), "segment_ids": replicated(plan.segment_ids, mesh)}
    batch = rollout_batch(out, replicated(batch_rewards, mesh), replicated(batch_valid, mesh), **layout)
    return Rollouts(
        batch=batch,
        responses=responses,
        rewards=rewards,
        abstained=abstained_fraction(rewards, valid),
        failed=failed_fraction(all_failed.reshape(rewards.shape), valid),
        first_failure=first_failure,
        truncated=~np.asarray(finished),
        generated_tokens=int(np.sum(lengths)),
        sampling_seconds=sampled - start,
        reward_seconds=scored - sampled,
        reward_metrics=reward_metrics,
        reward_extras=reward_extras,
    )


def score_inputs(
    prompt_set: PromptSet, tokenizer, num_generations: int, rows: np.ndarray, tokens, lengths
) -> tuple[list[str], list[str], dict[str, list[Any]]]:
    """What the reward functions get for rollouts ``rows [R]`` (row r: prompt r // G) whose tokens
    ``[R, M]`` end at ``lengths [R]``: the prompts' texts, the decoded responses, and the columns (the
    prompts' own, the response ids, the rollout index)."""
    tokens = np.asarray(tokens)
    responses = decode_completions(tokenizer, tokens, lengths)
    prompts = [prompt_set.texts[r // num_generations] for r in rows]
    columns = {name: [values[r // num_generations] for r in rows] for name, values in prompt_set.columns.items()}
    columns[RESPONSE_IDS] = [row[:n].tolist() for row, n in zip(tokens, lengths)]
    columns[ROLLOUT_INDEX] = [int(r) for r in rows]
    return prompts, responses, columns


def scores_groups(reward_fn: RewardFunction, settings: RolloutSettings) -> bool:
    """Whether `collect_rollouts` scores each group as it completes: asked for (``score_groups``), one
    process, host rewards (reward models score the whole step: their programs run over the devices)."""
    return settings.score_groups and jax.process_count() == 1 and not scores_on_devices(reward_fn)


class GroupScoring:
    """A step's rollouts scored a group at a time: `add` (the sampler's ``on_group``) decodes a
    prompt's G completions and starts their reward calls on the worker threads
    (`gd2po_jax.rewards.scoring.StreamScorer`), so the rewards of a group overlap the decode of the
    rest; `result` waits for the last calls. The same scores as scoring the batch whole (reward
    functions score each rollout on its own); the deadline ``timeout_s`` counts from the first group.
    """

    def __init__(
        self,
        prompt_set: PromptSet,
        tokenizer,
        reward_fn: RewardFunction,
        settings: RolloutSettings,
        max_prompts: int = 0,
    ):
        """``max_prompts``: room for that many prompts, ``prompt_set`` growing meanwhile (`refiller`)."""
        self.prompt_set, self.tokenizer, self.reward_fn, self.settings = prompt_set, tokenizer, reward_fn, settings
        self.num_generations = settings.num_generations
        self.responses: list[str | None] = [None] * (max(max_prompts, len(prompt_set)) * self.num_generations)
        self.scorer: StreamScorer | None = None
        self.groups: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # prompt -> (lengths [G], finished [G])

    def handler(self, first_prompt: int = 0) -> Callable[[int, GroupOutput], None]:
        """The sampler's ``on_group`` for a call whose prompt 0 is the step's ``first_prompt``."""
        return lambda prompt, group: self.add(first_prompt + prompt, group)

    def add(self, prompt: int, group: GroupOutput) -> None:
        """Score prompt ``prompt``'s G rollouts (its `GroupOutput`)."""
        if self.scorer is None:
            settings = self.settings
            self.scorer = StreamScorer(
                self.reward_fn,
                len(self.responses),
                on_error=settings.on_error,
                num_workers=settings.num_workers,
                timeout_s=settings.timeout_s,
            )
        tokens, lengths, finished = jax.device_get((group.tokens, group.lengths, group.finished))
        self.groups[prompt] = (np.asarray(lengths), np.asarray(finished))
        first = prompt * self.num_generations
        rows = np.arange(first, first + self.num_generations)
        prompts, responses, columns = score_inputs(
            self.prompt_set, self.tokenizer, self.num_generations, rows, tokens, lengths
        )
        self.responses[first : first + self.num_generations] = responses
        self.scorer.add(first, prompts, responses, columns)

    def refiller(self, refill: Refill, num_prompts: int) -> Callable[[bool], list[list[int]]]:
        """The sampler's ``more_prompts`` for ``refill`` (`Refill`), whose first ``num_prompts`` are
        ``self.prompt_set``'s: decides every group handed over so far, then draws one prompt for each
        that does not count (up to ``refill.max_prompts`` in all) into ``self.prompt_set``."""
        g = self.num_generations
        decided: dict[int, bool] = {}

        def more_prompts(wait: bool) -> list[list[int]]:
            for prompt, (lengths, finished) in list(self.groups.items()):
                if prompt not in decided:
                    assert self.scorer is not None  # set by the group's add
                    rewards = self.scorer.rewards_of(prompt * g, (prompt + 1) * g)
                    decided[prompt] = bool(refill.counts(rewards, lengths, finished))
            refill.counted = [decided[p] for p in range(len(self.prompt_set)) if p in decided]
            failing = sum(not c for c in decided.values())
            wanted = min(num_prompts + failing, refill.max_prompts)
            if wanted <= len(self.prompt_set):
                return []
            drawn = refill.draw(wanted - len(self.prompt_set))
            self.prompt_set.extend(drawn)
            return [list(ids) for ids in drawn.token_ids]

        return more_prompts

    def result(self, num_prompts: int | None = None) -> tuple[Scores, list[str]]:
        """The `Scores` of every rollout and the responses, in row order (of the first ``num_prompts``
        prompts: a refilled run's)."""
        count = len(self.responses) if num_prompts is None else num_prompts * self.num_generations
        if self.scorer is None or any(r is None for r in self.responses[:count]):
            raise RuntimeError("the sampler did not hand over every group of the step")
        return self.scorer.result(count), [r for r in self.responses[:count] if r is not None]


def rollout_batch(
    out: GenerateOutput,
    rewards: jax.Array,
    valid: jax.Array,
    ref_logp: jax.Array | None = None,
    *,
    row_order: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
) -> RolloutBatch:
    """A `RolloutBatch` from sampler output (device arrays stay on device).

    Args:
      out: `generate` output for B = P x G rows.
      rewards: [P, G, K] rewards; valid: [P] bool.
      ref_logp: [B, M] reference log-probs (default zeros: no KL term).
      row_order, segment_ids: [B] int32 verl's minibatch order and micro-batches
        (`gd2po_jax.rl.micro_batches.UpdateLayout`), or None.
    """
    return RolloutBatch(
        input_ids=jnp.concatenate([out.prompt_tokens, out.tokens], axis=1).astype(jnp.int32),
        attention_mask=jnp.concatenate([out.prompt_mask.astype(bool), jnp.ones(out.tokens.shape, bool)], axis=1),
        response_mask=completion_mask(out.lengths, out.tokens.shape[1]),
        old_logp=out.logprobs,
        ref_logp=jnp.zeros_like(out.logprobs) if ref_logp is None else ref_logp,
        rewards=rewards.astype(jnp.float32),
        valid=valid,
        row_order=row_order,
        segment_ids=segment_ids,
    )
