"""The jitted RL update: advantages + filtering + clipped loss + gradients + optimizer, one program.

Shapes: ``P`` prompts with ``G`` rollouts each (``B = P * G`` rows, prompt-major: rows
``p * G .. p * G + G - 1`` answer prompt ``p``), ``K`` rewards, ``Lp`` padded prompt length, ``M``
completion budget (``max_new_tokens``), ``S = Lp + M``.

One call of the step function does, inside a single XLA program::

    lengths    = sum(response_mask)                                     [P, G]
    adv        = compute_advantages(rewards, lengths, method, ...)      [P, G] -> [B]
    old_logp   = forward(params, rows) in micro-batches, no gradient    [B, M]   (old_logprobs="recompute")
    for epoch in range(ppo_epochs):                   (lax.scan)
        rows   = permutation(B)                       (shuffle, from the state's RNG; or row_order)
        for minibatch in split(rows, num_minibatches):                  (lax.scan)
            den    = aggregation denominator of the minibatch (independent of the parameters)
            (with prompt windows: rows sorted by prompt length; each micro-batch's left padding
             cut to its window, a lax.switch branch)
            (rows without a gradient, A = 0 and no KL or entropy term, sorted last; a
             micro-batch of such rows only is skipped, a lax.cond)
            grads  = sum over micro-batches of grad(numerator_micro / den)   (lax.scan)
            params = optax update(grads)      only if |grads| is finite, else skipped

Dividing every micro-batch numerator by the whole minibatch's denominator makes gradient
accumulation exact for every aggregation mode (`gd2po_jax.rl.losses.aggregate_loss`). verl's
micro-batch weighting (``micro_batch_max_tokens``) becomes per-row weights of the numerator, from
the batch's ``segment_ids`` (`gd2po_jax.rl.losses.verl_row_weights`), with den = 1: the same exact
accumulation over micro-batches of any size.

An update whose gradient norm is not finite (an inf or NaN anywhere, e.g. a bf16 overflow) is
skipped, as verl skips it: parameters and optimizer state stay as they were, and the metric
``update/skipped_updates`` counts it. The trainer stops a run whose steps keep skipping
(`count_skipped_steps`, ``train.max_consecutive_skipped_steps``).

The batch is a `gd2po_jax.rl.rollout.RolloutBatch`; advantages come from `gd2po_jax.rl.advantages`,
log-probs from `gd2po_jax.models.logprobs`, the loss from `gd2po_jax.rl.losses` and the optimizer from
`gd2po_jax.training.optimizer`. The step's metrics carry their final names (``reward/<name>`` ...).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from gd2po_jax.config import RLConfig, RunConfig, check_batch_layout
from gd2po_jax.errors import UserError
from gd2po_jax.models.logprobs import at_least_f32, completion_logprobs, logprob_temperature, merge_model
from gd2po_jax.rl import losses
from gd2po_jax.rl.advantages import (
    AdvantageOutput,
    BatchNorm,
    GroupScale,
    HalvesRanking,
    Method,
    advantage_diagnostics,
    compute_advantages,
)
from gd2po_jax.runtime.sharding import batch_sharding
from gd2po_jax.training.records import RolloutBatch, TrainState


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Static hyperparameters of the update (frozen and hashable: part of the compiled program).

    The run config's ``rl`` section as it is, plus what the update derives from the rest of the run
    config or sets itself. Symbols are those of docs/algorithm.md (#notation); build it from a run
    config with `StepConfig.from_config`, or from keywords with `StepConfig.of` (tests, benches), and
    change it with `with_changes` (both take `RLConfig` field names and those below alike).

    Attributes:
      rl: `gd2po_jax.config.RLConfig`, the run config's ``rl``: the advantage method
        (``algorithm``, its options), the policy loss (clipping, ``loss_agg_mode``, KL and entropy
        terms), the update's layout (``ppo_epochs``, ``num_minibatches``, ``micro_batch_size``,
        ``shuffle_minibatches``, ``micro_batch_max_tokens``), ``old_logprobs`` and
        ``rollout_is_cap``, ``skip_zero_advantage_rows``; its docstring says what each does. Its
        numbers are held as their fields' types (config files give ints for floats).
      reward_names: the K reward names, in the order of the reward tensor's last axis
        (``rewards.names``); metrics are named ``reward/<name>``. Empty: the rewards' indices.
      reward_weights: w_k, K weights of the rewards (``rewards.weights``); None or empty: all ones.
      logit_chunk_size: positions per chunk of the vocabulary projection
        (``train.logit_chunk_size``; see `gd2po_jax.models.logprobs.chunked_token_logprobs`).
      compute_dtype: dtype of the forward pass, "float32" | "bfloat16" (``model.dtype``); the
        master weights keep theirs.
      logprob_temperature: the log-probs of the loss are those of ``softmax(logits / T)`` (1: the
        raw logits; verl: the rollout temperature). Read with `logprob_temperature` from
        ``rl.tempered_logprobs`` and ``sampling.temperature``; the batch's old_logp must have been
        sampled at the same T (`gd2po_jax.models.sampling.generate`'s ``logprob_temperature``). With
        ``rl.old_logprobs="recompute"`` the old log-probs are recomputed inside the step by the
        update's own forward pass (function, micro-batch size, prompt windows, dtype and this T).
      lora_dropout: > 0: PEFT's ``lora_dropout`` on the adapters' inputs in the update's forward
        passes (those with a gradient; not the old log-probs' recompute, nor sampling), a mask per
        micro-batch, layer and adapter from the state's RNG (``model.lora.dropout`` when
        ``model.lora.enabled``).

    Not in the run config (what the trainer sets from the data, and switches for tests and benches):
      prompt_windows: prompt lengths below the padded one (``Lp``) at which a micro-batch may run
        (static; see `prompt_window_lengths`). With any, each minibatch's rows are sorted by
        prompt length before they split into micro-batches, and each micro-batch runs on its
        shortest window that holds its longest prompt: its left padding beyond the window is cut
        (exact: those slots are masked out). One compiled branch per window (`jax.lax.switch`);
        empty: every micro-batch at ``Lp``. Set by the trainer from ``rl.length_bucket``.
      norm_length: the constant length of "seq-mean-token-sum-norm" (None: the padded length M).
      log_entropy: compute the policy's entropy for the metrics even when ``rl.entropy_coef`` is 0.
      skip_nonfinite_updates: skip an optimizer update whose gradient norm is not finite (False
        applies every update, as before the guard existed).
    """

    rl: RLConfig
    logit_chunk_size: int
    compute_dtype: str
    logprob_temperature: float
    reward_names: tuple[str, ...] = ()
    reward_weights: tuple[float, ...] | None = None
    lora_dropout: float = 0.0
    prompt_windows: tuple[int, ...] = ()
    norm_length: float | None = None
    log_entropy: bool = True
    skip_nonfinite_updates: bool = True

    def __post_init__(self):
        # Each value as its field's type (config files give ints for floats, lists for tuples), the
        # rl section's too, then the run config's spelling of "off" of rewards.weights: empty.
        hints = _type_hints(type(self))
        for field in dataclasses.fields(self):
            if field.name != "rl":
                object.__setattr__(self, field.name, _as_type(hints[field.name], getattr(self, field.name)))
        object.__setattr__(self, "rl", _typed_section(self.rl))
        if not self.reward_weights:
            object.__setattr__(self, "reward_weights", None)
        if not self.logprob_temperature > 0:
            raise ValueError(f"logprob_temperature must be > 0, got {self.logprob_temperature}")

    @property
    def dual_clip_bound(self) -> float | None:
        """c of dual clipping (> 1), bounding the loss at -A c where A < 0; None when ``rl.dual_clip``
        is <= 0 (the run config's spelling of off)."""
        return self.rl.dual_clip if self.rl.dual_clip > 0 else None

    @property
    def skips_rows(self) -> bool:
        """``rl.skip_zero_advantage_rows`` in effect: rows with A = 0 have no gradient unless a KL or
        entropy term gives them one."""
        return self.rl.skip_zero_advantage_rows and not self.rl.kl_coef and not self.rl.entropy_coef

    @classmethod
    def from_config(cls, config: RunConfig, **changes: Any) -> StepConfig:
        """The step's hyperparameters from a run config, with ``changes`` (`with_changes`) on top."""
        step = cls(
            rl=config.rl,
            reward_names=config.rewards.names,
            reward_weights=config.rewards.weights,
            logit_chunk_size=config.train.logit_chunk_size,
            compute_dtype=config.model.dtype,
            logprob_temperature=logprob_temperature(config),
            lora_dropout=config.model.lora.dropout if config.model.lora.enabled else 0.0,
        )
        return step.with_changes(**changes) if changes else step

    @classmethod
    def of(cls, **values: Any) -> StepConfig:
        """A step config from keywords: every `RLConfig` field without a default, and this class's own
        fields."""
        rl_values, own = _split_rl_fields(values)
        return cls(rl=RLConfig(**rl_values), **own)

    def with_changes(self, **changes: Any) -> StepConfig:
        """A copy with ``changes`` (field -> value): `RLConfig` field names change ``rl`` (validated
        as the run config validates it), the others this class's own fields.

        Raises:
          gd2po_jax.config.ConfigError: an invalid ``rl`` (a ValueError, naming the ``rl.`` field).
          TypeError: a name that is no field of either.
        """
        rl_changes, own = _split_rl_fields(changes)
        rl = dataclasses.replace(self.rl, **rl_changes) if rl_changes else self.rl
        return dataclasses.replace(self, rl=rl, **own)


def _split_rl_fields(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(`RLConfig` fields, the others) of ``values`` (field -> value)."""
    rl_names = {field.name for field in dataclasses.fields(RLConfig)}
    rl_values = {name: value for name, value in values.items() if name in rl_names}
    own = {name: value for name, value in values.items() if name not in rl_names}
    return rl_values, own


def prompt_window_lengths(length_bucket: int, shortest_prompt: int, prompt_length: int) -> tuple[int, ...]:
    """`StepConfig.prompt_windows` for a run: the multiples of ``length_bucket`` from the first
    that holds ``shortest_prompt`` up to, not including, the padded ``prompt_length`` (Lp).

    E.g. (16, 108, 192) -> (112, 128, 144, 160, 176). ``length_bucket`` 0: none.

    Raises:
      ValueError: naming ``rl.length_bucket``, when that makes more than `MAX_PROMPT_WINDOWS`
        windows (each is a compiled branch of the update).
    """
    if length_bucket <= 0:
        return ()
    first = -(-max(shortest_prompt, 1) // length_bucket) * length_bucket
    windows = tuple(range(first, prompt_length, length_bucket))
    if len(windows) > MAX_PROMPT_WINDOWS:
        raise ValueError(
            f"rl.length_bucket: {length_bucket} tokens make {len(windows)} prompt lengths between the shortest "
            f"training prompt ({shortest_prompt} tokens) and the padded length ({prompt_length}), each a compiled "
            f"branch of the update; at most {MAX_PROMPT_WINDOWS}: use a larger bucket (or 0: off)"
        )
    return windows


#: The most prompt windows (compiled branches of the update) `prompt_window_lengths` makes.
MAX_PROMPT_WINDOWS = 16


def run_step_config(
    config: RunConfig,
    shortest_prompt: int,
    prompt_length: int,
    *,
    reward_names: tuple[str, ...] | None = None,
    reward_weights: tuple[float, ...] | None = None,
) -> StepConfig:
    """The `StepConfig` of a run: `StepConfig.from_config`, with the prompt windows of
    ``rl.length_bucket`` for its training prompts (``shortest_prompt`` tokens at least, padded to
    ``prompt_length``; `prompt_window_lengths`) and the run's reward columns and weights
    (`gd2po_jax.tasks.setup.RunSetup.reward_names`, ``reward_weights``: the family's and
    ``rewards.functions``'; None: ``rewards.names`` and ``rewards.weights``).

    Raises:
      ValueError: naming ``rl.length_bucket`` (`prompt_window_lengths`), or ``rl.micro_batch_max_tokens``
        when it is below a padded rollout's tokens (verl refuses that budget too).
    """
    windows = prompt_window_lengths(config.rl.length_bucket, shortest_prompt, prompt_length)
    budget, padded = config.rl.micro_batch_max_tokens, prompt_length + config.sampling.max_new_tokens
    if budget and budget < padded:
        raise ValueError(  # verl asserts the same (rearrange_micro_batches)
            f"rl.micro_batch_max_tokens: {budget} tokens cannot hold one padded rollout of {padded} tokens "
            f"(prompts padded to {prompt_length} + sampling.max_new_tokens={config.sampling.max_new_tokens})"
        )
    changes: dict[str, Any] = {"prompt_windows": windows}
    if reward_names is not None:
        changes["reward_names"] = tuple(reward_names)
    if reward_weights is not None:
        changes["reward_weights"] = tuple(reward_weights)
    return StepConfig.from_config(config, **changes)


@functools.cache
def _type_hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _typed_section(section):
    """The frozen dataclass ``section`` with each value as its field's type (`_as_type`); itself when
    every value has it already."""
    hints = _type_hints(type(section))
    values = {
        field.name: _as_type(hints[field.name], getattr(section, field.name)) for field in dataclasses.fields(section)
    }
    if all(type(value) is type(getattr(section, name)) for name, value in values.items()):
        return section
    return dataclasses.replace(section, **values)


def _as_type(hint, value):
    """``value`` converted to the annotated type ``hint``: a scalar type, ``tuple[X, ...]`` or
    ``X | None``."""
    if value is None:
        return None
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType):
        (hint,) = [arg for arg in args if arg is not type(None)]
        return _as_type(hint, value)
    if typing.get_origin(hint) is tuple:
        return tuple(_as_type(args[0], item) for item in value)
    return hint(value)


def step_advantages(rewards: jax.Array, lengths: jax.Array, valid: jax.Array, config: StepConfig) -> AdvantageOutput:
    """The advantages of a step's rollouts as the update computes them: `compute_advantages` with
    ``config``'s method and options (also called on the host by `gd2po_jax.rl.rollout_log`).

    Args:
      rewards: [P, G, K] float (NaN: missing). lengths: [P, G] response tokens. valid: [P] bool.
    """
    rl = config.rl
    return compute_advantages(
        rewards,
        lengths,
        typing.cast(Method, rl.algorithm),
        snr_tau=rl.snr_tau,
        reward_weights=None if config.reward_weights is None else jnp.asarray(config.reward_weights),
        batch_norm=typing.cast(BatchNorm, rl.batch_norm),
        group_eps=rl.group_eps,
        group_scale=typing.cast(GroupScale, rl.scale_rewards),
        valid=valid,
        drop_zero_variance_groups=rl.drop_zero_variance_groups,
        snr_eps=rl.snr_eps,
        query_reweighting=rl.query_reweighting,
        halves_ranking=typing.cast(HalvesRanking, rl.halves_ranking),
    )


_jitted_step_advantages = jax.jit(step_advantages, static_argnames=("config",))


def host_advantages(rewards, lengths, valid, config: StepConfig) -> AdvantageOutput:
    """`step_advantages` of host arrays, as numpy arrays: what the update computes for these rollouts
    (dynamic sampling's counting and the saved rollouts, `gd2po_jax.rl.dynamic_sampling`,
    `gd2po_jax.rl.rollout_log`).

    Args:
      rewards: [P, G, K] float (NaN: missing). lengths: [P, G] or [P*G] int. valid: [P] bool.
      config: the update's `StepConfig`.
    """
    rewards = np.asarray(rewards, np.float32)
    num_prompts, group, _ = rewards.shape
    lengths = np.asarray(lengths, np.int32).reshape(num_prompts, group)
    return jax.device_get(_jitted_step_advantages(rewards, lengths, np.asarray(valid, bool), config))


def _constrain_rows(tree, mesh: Mesh | None):
    if mesh is None:
        return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.shape)), tree)


@dataclasses.dataclass(frozen=True)
class UpdateLayout:
    """How one step's B rows split (static: from the batch's shapes and the `StepConfig`).

    Attributes:
      rows: B = P x G. minibatch_rows: rows per optimizer step. micro_rows: rows per micro-batch.
      prompt_length: Lp, the batch's padded prompt length.
      windows: the prompt lengths micro-batches run at, ascending, the last ``prompt_length``
        (`StepConfig.prompt_windows` below it).
      skip_rows: micro-batches of rows without a gradient are skipped (`StepConfig.skips_rows`).
      verl_weighting: the loss is weighted per verl micro-batch (``rl.micro_batch_max_tokens``).
    """

    rows: int
    minibatch_rows: int
    micro_rows: int
    prompt_length: int
    windows: tuple[int, ...]
    skip_rows: bool
    verl_weighting: bool

    @classmethod
    def of(cls, batch: RolloutBatch, config: StepConfig) -> UpdateLayout:
        """Raises: ValueError naming the ``rl.`` field whose minibatch or micro-batch size does not
        divide the batch (`check_batch_layout`)."""
        num_prompts, group, _ = batch.rewards.shape
        rows = num_prompts * group
        minibatch_rows, micro_rows = check_batch_layout(rows, config.rl.num_minibatches, config.rl.micro_batch_size)
        prompt_length = batch.input_ids.shape[1] - batch.old_logp.shape[1]
        windows = tuple(sorted({w for w in config.prompt_windows if 0 < w < prompt_length})) + (prompt_length,)
        return cls(
            rows=rows,
            minibatch_rows=minibatch_rows,
            micro_rows=micro_rows,
            prompt_length=prompt_length,
            windows=windows,
            skip_rows=config.skips_rows,
            verl_weighting=config.rl.micro_batch_max_tokens > 0,
        )

    @property
    def num_minibatches(self) -> int:
        return self.rows // self.minibatch_rows

    @property
    def micro_batches(self) -> int:
        """Micro-batches per minibatch."""
        return self.minibatch_rows // self.micro_rows

    @property
    def windowed(self) -> bool:
        """Micro-batches may run on a prompt window shorter than ``prompt_length``."""
        return len(self.windows) > 1

    def sorts_micro_batches(self, rows: int) -> bool:
        """``rows`` (more than a micro-batch) are sorted before they split into micro-batches: by prompt
        length for the windows, rows without a gradient last for the skipping."""
        return rows > self.micro_rows and (self.windowed or self.skip_rows)


def make_train_step(graphdef, optimizer: optax.GradientTransformation, config: StepConfig, mesh: Mesh | None = None):
    """The update function ``step(state, batch, frozen=None) -> (state, metrics)`` (not yet jitted):
    `train_step` with these arguments.

    With LoRA, ``state.params`` are the adapters and ``frozen`` the base weights
    (`gd2po_jax.models.lora.split_lora`): the model is both merged, gradients and the optimizer
    state are the adapters' alone, and the base is an argument of the program (not a constant),
    never changed. Without, ``frozen`` is None and the step is the full fine-tuning one.

    Args:
      graphdef: the policy's `nnx.GraphDef` (static structure; parameters come from the state).
      optimizer: the optax transformation whose state is ``state.opt_state``.
      config: `StepConfig`.
      mesh: when given, micro-batches are constrained to stay split over the batch axes.

    Returns:
      A pure function; wrap it with `jit_train_step`.
    """

    def step(state: TrainState, batch: RolloutBatch, frozen=None):
        return train_step(state, batch, frozen, graphdef=graphdef, optimizer=optimizer, config=config, mesh=mesh)

    return step


def train_step(
    state: TrainState,
    batch: RolloutBatch,
    frozen,
    *,
    graphdef,
    optimizer: optax.GradientTransformation,
    config: StepConfig,
    mesh: Mesh | None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One update (the module docstring's program): advantages, the rows of the update, the old
    log-probs recomputed (``rl.old_logprobs="recompute"``), ``rl.ppo_epochs`` scans of `update_epoch`,
    the metrics. The arguments are `make_train_step`'s."""
    layout = UpdateLayout.of(batch, config)
    lengths = jnp.sum(batch.response_mask, axis=-1).reshape(batch.rewards.shape[:2])
    adv = step_advantages(batch.rewards, lengths, batch.valid, config)
    grad_fn = jax.value_and_grad(functools.partial(micro_loss, graphdef=graphdef, config=config), has_aux=True)
    micro_grad_fn = on_prompt_windows(grad_fn, layout.windows, layout.prompt_length)
    rows, row_valid = update_rows(batch, adv, lengths, config, layout)
    rollout_metrics: dict[str, Any] = {}
    if config.rl.old_logprobs == "recompute":
        rows, rollout_metrics = with_recomputed_old_logprobs(
            rows, batch, row_valid, state.params, frozen, graphdef=graphdef, config=config, layout=layout, mesh=mesh
        )
    in_order = jnp.arange(layout.rows, dtype=jnp.int32) if batch.row_order is None else batch.row_order
    rng, shuffle_key = jax.random.split(state.rng)
    epoch_keys = jax.random.split(shuffle_key, config.rl.ppo_epochs)
    dropout_keys = lora_dropout_keys(shuffle_key, config, layout, frozen)
    minibatch_fn = functools.partial(
        update_minibatch,
        rows=rows,
        micro_grad_fn=micro_grad_fn,
        optimizer=optimizer,
        config=config,
        layout=layout,
        mesh=mesh,
        frozen=frozen,
    )
    epoch_fn = functools.partial(
        update_epoch, minibatch_fn=minibatch_fn, in_order=in_order, shuffle=config.rl.shuffle_minibatches, layout=layout
    )
    (params, opt_state, loss_sums), (grad_norms, skipped, padding, skipped_rows) = jax.lax.scan(
        epoch_fn, (state.params, state.opt_state, losses.empty_policy_loss()), (epoch_keys, dropout_keys)
    )
    metrics = _step_metrics(config, batch, adv, loss_sums, grad_norms, lengths)
    metrics.update(rollout_metrics)
    metrics.update(_update_metrics(skipped, padding, skipped_rows, layout.rows * config.rl.ppo_epochs))
    new_state = TrainState(params=params, opt_state=opt_state, step=state.step + 1, rng=rng)
    return new_state, metrics


def policy_logprobs(params, rows: dict, with_entropy: bool, frozen, dropout_key=None, *, graphdef, config: StepConfig):
    """(logp, entropy) [R, M] of the rows' response tokens under the policy ``params``: the one
    forward pass of the update, also the old log-probs' with ``old_logprobs="recompute"``; with
    ``dropout_key``, the adapters' dropout (``lora_dropout``) drawn from it."""
    model = merge_model(graphdef, params, jnp.dtype(config.compute_dtype), frozen)
    dropout = None if dropout_key is None else {"lora_dropout": (dropout_key, config.lora_dropout)}
    return completion_logprobs(
        model,
        rows["input_ids"],
        rows["attention_mask"],
        rows["old_logp"].shape[1],
        chunk_size=config.logit_chunk_size,
        with_entropy=with_entropy,
        temperature=config.logprob_temperature,
        **(dropout or {}),
    )


def micro_loss(params, rows: dict, denominator, frozen, dropout_key=None, *, graphdef, config: StepConfig):
    """(numerator / denominator, `losses.PolicyLoss`) of a micro-batch's ``rows``: the function
    whose gradient the update accumulates (``denominator``: the whole minibatch's)."""
    need_entropy = config.log_entropy or bool(config.rl.entropy_coef)
    logp, entropy = policy_logprobs(params, rows, need_entropy, frozen, dropout_key, graphdef=graphdef, config=config)
    rl = config.rl
    out = losses.policy_loss(
        logp,
        rows["old_logp"],
        rows["advantages"],
        rows["loss_mask"],
        clip_low=rl.clip_low,
        clip_high=rl.clip_high,
        dual_clip=config.dual_clip_bound,
        agg_mode=typing.cast(losses.LossAggMode, rl.loss_agg_mode),
        norm_length=config.norm_length,
        ref_logp=rows["ref_logp"] if rl.kl_coef else None,
        kl_coef=rl.kl_coef,
        kl_estimator=rl.kl_estimator,
        entropy=entropy,
        entropy_coef=rl.entropy_coef,
        is_weights=rows.get("is_weights"),
        row_weights=rows.get("row_weights"),
    )
    return out.numerator / jnp.maximum(denominator, 1e-8), out


def update_rows(
    batch: RolloutBatch, adv: AdvantageOutput, lengths: jax.Array, config: StepConfig, layout: UpdateLayout
) -> tuple[dict, jax.Array]:
    """(rows, row_valid [B] bool): the [B, ...] arrays the minibatches are cut from: the batch's
    tokens and log-probs, the advantages, the loss mask (response tokens of real prompts; without
    ``rl.filtered_in_denominator`` of kept rows only), prompt and response lengths, and ``active``
    (`rows_with_gradient`) when rows are skipped, ``segment_ids`` with verl's weighting.

    Raises:
      ValueError: verl's weighting on a batch without ``segment_ids``.
    """
    prompt_lengths = jnp.sum(batch.attention_mask[:, : layout.prompt_length], axis=-1, dtype=jnp.int32)
    row_valid = jnp.repeat(batch.valid, batch.rewards.shape[1])
    loss_mask = batch.response_mask & row_valid[:, None]
    if not config.rl.filtered_in_denominator:
        loss_mask = loss_mask & adv.keep.reshape(-1)[:, None]
    rows = {
        "input_ids": batch.input_ids,
        "attention_mask": batch.attention_mask,
        "old_logp": batch.old_logp,
        "ref_logp": batch.ref_logp,
        "advantages": adv.advantages.reshape(-1),
        "loss_mask": loss_mask,
        "prompt_lengths": prompt_lengths,
        "response_lengths": lengths.reshape(-1),
    }
    if layout.skip_rows:
        rows["active"] = rows_with_gradient(rows["advantages"], loss_mask)
    if layout.verl_weighting:
        if batch.segment_ids is None:
            raise ValueError(
                "rl.micro_batch_max_tokens: the batch has no segment_ids (verl's micro-batches); "
                "build it with gd2po_jax.rl.rollout.rollout_batch(..., segment_ids=...)"
            )
        rows["segment_ids"] = batch.segment_ids.astype(jnp.int32)
    return rows, row_valid


def with_recomputed_old_logprobs(
    rows: dict,
    batch: RolloutBatch,
    row_valid: jax.Array,
    params,
    frozen,
    *,
    graphdef,
    config: StepConfig,
    layout: UpdateLayout,
    mesh: Mesh | None,
) -> tuple[dict, dict[str, jax.Array]]:
    """(rows, rollout metrics): the rows with their old log-probs recomputed under ``params``
    (`recompute_old_logprobs`) and, with ``rl.rollout_is_cap``, the truncated importance weights
    (``is_weights``); the metrics compare the sampler's log-probs with them (`_rollout_metrics`)."""
    forward = functools.partial(old_logprobs_forward, graphdef=graphdef, config=config)
    recomputed = recompute_old_logprobs(
        params, rows, on_prompt_windows(forward, layout.windows, layout.prompt_length), layout, frozen, mesh
    )
    rows = dict(rows, old_logp=recomputed)
    recomputed_tokens = batch.response_mask & row_valid[:, None]
    if layout.skip_rows:  # over the rows with a gradient, the others' were not recomputed
        recomputed_tokens = recomputed_tokens & rows["active"][:, None]
    rollout_metrics = _rollout_metrics(batch.old_logp, recomputed, recomputed_tokens, config.rl.rollout_is_cap)
    if config.rl.rollout_is_cap > 0:
        rows["is_weights"] = truncated_is_weights(batch.old_logp, recomputed, config.rl.rollout_is_cap)
    return rows, rollout_metrics


def old_logprobs_forward(params, micro_batch: dict, frozen, *, graphdef, config: StepConfig) -> jax.Array:
    """[R, M] the micro-batch's log-probs under ``params``, without entropy or dropout."""
    return policy_logprobs(params, micro_batch, False, frozen, graphdef=graphdef, config=config)[0]


def recompute_old_logprobs(
    params, rows: dict, run_on_window, layout: UpdateLayout, frozen, mesh: Mesh | None
) -> jax.Array:
    """[B, M] the rows' log-probs under ``params``, before any update: micro-batches of the update's
    size (sorted by prompt length when there are windows, as the update sorts), each on its prompt
    window (``run_on_window``: `on_prompt_windows` of `old_logprobs_forward`); no gradient. With
    skipped rows (``rows["active"]``), those are sorted last and a micro-batch of only such rows
    keeps the batch's (sampler's) log-probs: the loss never reads them."""
    total = rows["input_ids"].shape[0]
    keys = ("input_ids", "attention_mask", "old_logp", "prompt_lengths") + (("active",) if layout.skip_rows else ())
    order = jnp.arange(total)
    if layout.sorts_micro_batches(total):
        order = jnp.argsort(
            micro_batch_sort_key(rows["prompt_lengths"], rows.get("active"), layout.windowed), stable=True
        )
    micro = {
        k: rows[k][order].reshape((total // layout.micro_rows, layout.micro_rows) + rows[k].shape[1:]) for k in keys
    }
    compute = functools.partial(
        _recomputed_logprobs, run_on_window=run_on_window, params=params, frozen=frozen, mesh=mesh
    )
    _, logp = jax.lax.scan(
        functools.partial(_recompute_micro_batch, compute=compute, skip_rows=layout.skip_rows), None, micro
    )
    return jax.lax.stop_gradient(logp.reshape(total, -1)[jnp.argsort(order)])


def _recompute_micro_batch(carry, micro_batch: dict, *, compute, skip_rows: bool):
    """Scan body of `recompute_old_logprobs`: ``compute`` of a micro-batch, or (``skip_rows``) the
    sampler's log-probs of one holding no row with a gradient."""
    if skip_rows:
        return carry, jax.lax.cond(jnp.any(micro_batch["active"]), compute, _sampler_logprobs, micro_batch)
    return carry, compute(micro_batch)


def _recomputed_logprobs(micro_batch: dict, *, run_on_window, params, frozen, mesh: Mesh | None) -> jax.Array:
    logp, _window = run_on_window(params, _constrain_rows(micro_batch, mesh), frozen)
    return logp.astype(micro_batch["old_logp"].dtype)


def _sampler_logprobs(micro_batch: dict) -> jax.Array:
    return micro_batch["old_logp"]


def lora_dropout_keys(shuffle_key: jax.Array, config: StepConfig, layout: UpdateLayout, frozen) -> jax.Array | None:
    """[epochs, minibatches, micro-batches] keys of the adapters' dropout masks (``lora_dropout`` > 0
    with LoRA), from the shuffle key (the state's RNG: a resumed run draws the same masks); else None."""
    if not (config.lora_dropout > 0 and frozen is not None):
        return None
    counts = (config.rl.ppo_epochs, layout.num_minibatches, layout.micro_batches)
    return jax.random.split(jax.random.fold_in(shuffle_key, 1), counts)


def update_epoch(carry, xs, *, minibatch_fn, in_order: jax.Array, shuffle: bool, layout: UpdateLayout):
    """Scan body over the epochs: the rows (shuffled by the epoch's key, or ``in_order``) split into
    minibatches, a scan of ``minibatch_fn`` (`update_minibatch`) over them. ``xs``: (epoch key,
    None or the epoch's [minibatches, micro-batches] dropout keys)."""
    epoch_key, epoch_dropout = xs
    order = jax.random.permutation(epoch_key, layout.rows) if shuffle else in_order
    order = order.reshape(layout.num_minibatches, layout.minibatch_rows)
    return jax.lax.scan(minibatch_fn, carry, (order, epoch_dropout))


def update_minibatch(
    carry,
    xs,
    *,
    rows: dict,
    micro_grad_fn,
    optimizer: optax.GradientTransformation,
    config: StepConfig,
    layout: UpdateLayout,
    mesh: Mesh | None,
    frozen,
):
    """Scan body over an epoch's minibatches: the gradient of the minibatch (rows ``xs[0]``),
    accumulated over its micro-batches (a scan of `accumulate_micro_batch`), and one optimizer
    update (`apply_update`). ``carry``: (params, optimizer state, loss sums); ``xs``: (row indices,
    None or a dropout key per micro-batch)."""
    params, opt_state, loss_sums = carry
    indices, minibatch_dropout = xs
    minibatch, denominator = minibatch_of(rows, indices, config, layout, mesh)
    micro = jax.tree.map(lambda x: x.reshape((layout.micro_batches, layout.micro_rows) + x.shape[1:]), minibatch)
    accumulate = functools.partial(
        accumulate_micro_batch,
        micro_grad_fn=micro_grad_fn,
        params=params,
        denominator=denominator,
        frozen=frozen,
        mesh=mesh,
        skip_rows=layout.skip_rows,
    )
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    (grads, sums), (padding, skipped_rows) = jax.lax.scan(
        accumulate, (zero_grads, losses.empty_policy_loss()), (micro, minibatch_dropout)
    )
    params, opt_state, grad_norm, applied = apply_update(
        optimizer, grads, params, opt_state, config.skip_nonfinite_updates
    )
    loss_sums = losses.accumulate(loss_sums, sums)
    return (params, opt_state, loss_sums), (grad_norm, ~applied, jax.tree.map(jnp.sum, padding), jnp.sum(skipped_rows))


def minibatch_of(
    rows: dict, indices: jax.Array, config: StepConfig, layout: UpdateLayout, mesh: Mesh | None
) -> tuple[dict, jax.Array]:
    """(the minibatch's rows, the denominator of its loss): the ``indices`` rows, sorted for the
    micro-batches (`micro_batch_sort_key`), with verl's row weights (``row_weights``, denominator 1)
    or the aggregation's denominator (independent of the parameters); with skipped rows, the loss
    mask of the rows with a gradient (the metrics are over those; their numerator is the same)."""
    if layout.sorts_micro_batches(layout.minibatch_rows):
        # Micro-batches of similar prompt lengths, so that each runs on a short window; rows
        # without a gradient last, so that they fill micro-batches that are skipped.
        active = rows["active"][indices] if layout.skip_rows else None
        key = micro_batch_sort_key(rows["prompt_lengths"][indices], active, layout.windowed)
        indices = indices[jnp.argsort(key, stable=True)]
    minibatch = _constrain_rows(jax.tree.map(lambda x: x[indices], rows), mesh)
    if layout.verl_weighting:
        # verl's micro-batch weighting: per-row weights from the minibatch's segments, one
        # denominator (the weights hold each segment's token count).
        minibatch["row_weights"] = losses.verl_row_weights(
            minibatch["loss_mask"], minibatch.pop("segment_ids"), layout.minibatch_rows
        )
        denominator = jnp.float32(1.0)
    else:
        _, denominator = losses.aggregate_loss(
            jnp.zeros(minibatch["loss_mask"].shape),
            minibatch["loss_mask"],
            typing.cast(losses.LossAggMode, config.rl.loss_agg_mode),
            norm_length=config.norm_length,
        )
    if layout.skip_rows:
        minibatch["loss_mask"] = minibatch["loss_mask"] & minibatch["active"][:, None]
    return minibatch, denominator


def accumulate_micro_batch(
    acc, micro_xs, *, micro_grad_fn, params, denominator, frozen, mesh: Mesh | None, skip_rows: bool
):
    """Scan body over a minibatch's micro-batches: (gradient, loss sums) plus the micro-batch's
    (`micro_batch_gradient`, or with ``skip_rows`` `no_gradient` for one holding no row with a
    gradient, a `jax.lax.cond`). ``micro_xs``: (micro-batch, None or its dropout key); out: (padding
    slots, rows skipped)."""
    grads, sums = acc
    micro_batch, dropout_key = micro_xs
    gradient = functools.partial(
        micro_batch_gradient,
        micro_grad_fn=micro_grad_fn,
        params=params,
        denominator=denominator,
        frozen=frozen,
        mesh=mesh,
    )
    if skip_rows:
        micro_grads, out, padding, skipped = jax.lax.cond(
            jnp.any(micro_batch["active"]),
            gradient,
            functools.partial(no_gradient, params=params),
            micro_batch,
            dropout_key,
        )
    else:
        micro_grads, out, padding, skipped = gradient(micro_batch, dropout_key)
    return (jax.tree.map(jnp.add, grads, micro_grads), losses.accumulate(sums, out)), (padding, skipped)


def micro_batch_gradient(
    micro_batch: dict, dropout_key, *, micro_grad_fn, params, denominator, frozen, mesh: Mesh | None
):
    """(grads, loss sums, padding slots, rows skipped: 0) of one micro-batch, on its prompt window."""
    ((_, out), micro_grads), window = micro_grad_fn(
        params, _constrain_rows(micro_batch, mesh), denominator, frozen, dropout_key
    )
    return micro_grads, out, _padding_slots(micro_batch, window), jnp.int32(0)


def no_gradient(micro_batch: dict, dropout_key, *, params):
    """`micro_batch_gradient`'s outputs for a micro-batch not computed: zeros, its rows skipped."""
    del dropout_key
    zeros = jnp.zeros((), jnp.int32)
    return (
        jax.tree.map(jnp.zeros_like, params),
        losses.empty_policy_loss(),
        (zeros, zeros, zeros),
        jnp.int32(micro_batch["active"].shape[0]),
    )


def apply_update(optimizer: optax.GradientTransformation, grads, params, opt_state, skip_nonfinite: bool):
    """(params, opt_state, gradient norm, applied): the optimizer's update of ``grads``, applied only
    if their norm is finite (``skip_nonfinite``; else always)."""
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    grad_norm = optax.tree.norm(grads)
    applied = jnp.isfinite(grad_norm) if skip_nonfinite else jnp.bool_(True)
    params, opt_state = updated_if(applied, (new_params, new_opt_state), (params, opt_state))
    return params, opt_state, grad_norm, applied


def _update_metrics(skipped: jax.Array, padding, skipped_rows: jax.Array, passes: int) -> dict[str, jax.Array]:
    """``update/skipped_updates``, ``update/prompt_padding``, ``update/padding`` and
    ``update/skipped_rows`` from the epochs' scan outputs (``passes``: rows x epochs)."""
    metrics = {"update/skipped_updates": jnp.sum(skipped.astype(jnp.int32))}
    slots, prompt_pads, completion_pads = (jnp.sum(x).astype(jnp.float32) for x in padding)
    # of the slots computed (0 when every micro-batch was skipped)
    metrics["update/prompt_padding"] = losses.safe_ratio(prompt_pads, slots)
    metrics["update/padding"] = losses.safe_ratio(prompt_pads + completion_pads, slots)
    # rows whose forward and backward were skipped, of those the epochs pass over
    metrics["update/skipped_rows"] = jnp.sum(skipped_rows) / passes
    return metrics


def on_prompt_windows(fn, windows: tuple[int, ...], prompt_length: int):
    """``run(params, micro_batch, *args) -> (fn(params, micro_batch, *args), window)``: ``fn`` on the
    micro-batch cut to the shortest of ``windows`` (ascending, the last ``prompt_length``) that holds
    its longest prompt (the left padding before the window removed), one `jax.lax.switch` branch per
    window. With one window, ``fn`` on the whole micro-batch."""
    if len(windows) == 1:
        return lambda params, micro_batch, *args: (fn(params, micro_batch, *args), jnp.int32(prompt_length))

    def on_window(window):
        def run(params, micro_batch, *args):
            cut = prompt_length - window
            trimmed = dict(
                micro_batch,
                input_ids=micro_batch["input_ids"][:, cut:],
                attention_mask=micro_batch["attention_mask"][:, cut:],
            )
            return fn(params, trimmed, *args)

        return run

    branches = [on_window(w) for w in windows]
    window_array = jnp.asarray(windows, jnp.int32)

    def run(params, micro_batch, *args):
        longest = jnp.max(micro_batch["prompt_lengths"])
        branch = jnp.minimum(jnp.searchsorted(window_array, longest), len(windows) - 1)
        return jax.lax.switch(branch, branches, params, micro_batch, *args), window_array[branch]

    return run


def micro_batch_sort_key(prompt_lengths: jax.Array, active: jax.Array | None, windowed: bool) -> jax.Array:
    """[R] int32 key of a stable sort of R rows before they split into micro-batches: by prompt length
    (``windowed``: so that each micro-batch runs on a short prompt window), and rows without a
    gradient (``active`` False; None: every row has one) after all others, so that they fill
    micro-batches that are skipped. A constant key leaves the order as it is."""
    key = prompt_lengths if windowed else jnp.zeros_like(prompt_lengths)
    if active is not None:
        key = key + jnp.where(active, 0, jnp.int32(1 << 24))
    return key


def rows_with_gradient(advantages: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """[B] bool: rows whose policy-gradient loss can have a gradient, a non-zero advantage and a
    token in the loss. The others' clipped surrogate is ``-0 * rho`` on every token (finite: rho is
    clipped before its exponential), so they add exact zeros to the gradient."""
    return (advantages != 0) & jnp.any(loss_mask, axis=-1)


def truncated_is_weights(sampler_logp: jax.Array, recomputed_logp: jax.Array, cap: float) -> jax.Array:
    """[B, M] verl's truncated importance weights ``min(exp(recomputed - sampler), cap)`` per token
    (``actor.tis_imp_ratio_cap``; ``compute_policy_loss_vanilla`` in verl/trainer/ppo/core_algos.py,
    volcengine/verl PR #2953): they multiply the clipped policy-gradient loss, correcting the
    tokens' probabilities under the sampler towards those under the trained policy."""
    return jnp.minimum(jnp.exp(at_least_f32(recomputed_logp) - at_least_f32(sampler_logp)), cap)


def _rollout_metrics(
    sampler_logp: jax.Array, recomputed_logp: jax.Array, tokens: jax.Array, is_cap: float
) -> dict[str, jax.Array]:
    """``rollout/logprob_diff_mean`` and ``_max``: |sampler - recomputed| log-prob over ``tokens`` (the
    response tokens of real rows, [B, M] bool); with ``is_cap`` > 0 also ``rollout/is_weight_mean``
    and ``rollout/is_capped_fraction`` (tokens whose weight the cap cut)."""
    count = jnp.maximum(jnp.sum(tokens), 1).astype(jnp.float32)
    diff = jnp.where(tokens, jnp.abs(at_least_f32(sampler_logp) - at_least_f32(recomputed_logp)), 0.0)
    metrics = {"rollout/logprob_diff_mean": jnp.sum(diff) / count, "rollout/logprob_diff_max": jnp.max(diff)}
    if is_cap > 0:
        ratio = jnp.exp(at_least_f32(recomputed_logp) - at_least_f32(sampler_logp))
        metrics["rollout/is_weight_mean"] = jnp.sum(jnp.where(tokens, jnp.minimum(ratio, is_cap), 0.0)) / count
        metrics["rollout/is_capped_fraction"] = jnp.sum(tokens & (ratio > is_cap)) / count
    return metrics


def _padding_slots(micro_batch: dict, window: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(token slots, prompt-padding slots, completion slots after the response) of a micro-batch run
    on a prompt ``window``: the update's metrics ``update/prompt_padding`` and ``update/padding``
    are their sums' ratios."""
    rows, completion = micro_batch["old_logp"].shape
    slots = rows * (window + completion)
    prompt_pads = jnp.sum(window - micro_batch["prompt_lengths"])
    completion_pads = rows * completion - jnp.sum(micro_batch["response_lengths"])
    return slots, prompt_pads, completion_pads


def updated_if(condition: jax.Array, updated, current):
    """``updated`` if the scalar bool ``condition`` holds, else ``current``, leaf by leaf (two trees
    of the same structure: the parameters and optimizer state after and before an update). A
    select, so an applied update is bitwise the update itself."""
    return jax.tree.map(lambda new, old: jnp.where(condition, new, old), updated, current)


class SkippedStepsError(UserError, RuntimeError):
    """The optimizer update was skipped for a non-finite gradient in too many consecutive RL steps."""


def count_skipped_steps(consecutive: int, skipped_updates: float, step: int, limit: int) -> int:
    """The number of consecutive RL steps, up to ``step``, in which an optimizer update was skipped
    for a non-finite gradient (``skipped_updates``: the step's ``update/skipped_updates``).

    Args:
      consecutive: the count after the previous step.
      limit: ``train.max_consecutive_skipped_steps``.

    Raises:
      SkippedStepsError: when the count reaches ``limit``: the gradients keep overflowing (or a reward,
        advantage or log-prob is inf / NaN), and the run would go on without learning.
    """
    consecutive = consecutive + 1 if skipped_updates else 0
    if consecutive >= limit:
        raise SkippedStepsError(
            f"train.max_consecutive_skipped_steps={limit}: the gradient was not finite (inf or NaN) in "
            f"{consecutive} consecutive RL steps, up to step {step}, and their updates were skipped "
            "(metric update/skipped_updates), so the policy stopped learning. Look for an overflow "
            "(model.dtype='bfloat16', a large train.learning_rate) or a non-finite reward or log-prob; the "
            "skipped updates left the parameters finite, and a rerun resumes from the last checkpoint."
        )
    return consecutive


def _step_metrics(
    config: StepConfig, batch: RolloutBatch, adv, loss_sums: losses.PolicyLoss, grad_norms, lengths
) -> dict[str, jax.Array]:
    """Scalar metrics of one update, under their final names (means over every minibatch of every
    epoch): ``advantages/*``, ``loss/*``, ``reward/<name>`` and ``response_length``. ``loss/grad_norm``
    is the mean norm before clipping, inf or NaN when an update was skipped."""
    names = _reward_names(config, batch.rewards.shape[-1])
    diagnostics = advantage_diagnostics(adv, batch.valid, reward_names=names)
    metrics = {f"advantages/{k}": v for k, v in diagnostics.items()}
    metrics.update({f"loss/{k}": v for k, v in loss_sums.metrics().items()})
    metrics["loss/grad_norm"] = jnp.mean(grad_norms)
    real = jnp.broadcast_to(batch.valid[:, None], lengths.shape)
    rewards = batch.rewards
    present = ~jnp.isnan(rewards) & real[..., None]
    reward_means = jnp.sum(jnp.where(present, rewards, 0.0), axis=(0, 1)) / jnp.maximum(
        jnp.sum(present, axis=(0, 1)), 1
    )
    for k, name in enumerate(names):
        metrics[f"reward/{name}"] = reward_means[k]
    metrics["response_length"] = jnp.sum(jnp.where(real, lengths, 0)) / jnp.maximum(jnp.sum(real), 1)
    return metrics


def _reward_names(config: StepConfig, num_rewards: int) -> tuple[str, ...]:
    """The K names of the metrics' rewards: ``config.reward_names``, or the indices when empty."""
    if not config.reward_names:
        return tuple(str(k) for k in range(num_rewards))
    if len(config.reward_names) != num_rewards:
        raise ValueError(
            f"rewards.names: {len(config.reward_names)} names {config.reward_names} for the {num_rewards} "
            "rewards of the batch"
        )
    return config.reward_names


def jit_train_step(step_fn, state_shardings=None):
    """``jax.jit`` of the step with the state donated (and kept on its shardings)."""
    if state_shardings is None:
        return jax.jit(step_fn, donate_argnums=(0,))
    return jax.jit(step_fn, donate_argnums=(0,), out_shardings=(state_shardings, None))
