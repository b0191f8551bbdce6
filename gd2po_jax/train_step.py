"""The jitted RL update: advantages + filtering + clipped loss + gradients + optimizer, one program.

Shapes: ``P`` prompts with ``G`` rollouts each (``B = P * G`` rows, prompt-major: rows
``p * G .. p * G + G - 1`` answer prompt ``p``), ``K`` rewards, ``Lp`` padded prompt length, ``M``
completion budget (``max_new_tokens``), ``S = Lp + M``.

One call of the step function does, inside a single XLA program::

    lengths    = sum(response_mask)                                     [P, G]
    adv        = compute_advantages(rewards, lengths, method, ...)      [P, G] -> [B]
    for epoch in range(ppo_epochs):                   (lax.scan)
        rows   = permutation(B)                       (shuffle, from the state's RNG)
        for minibatch in split(rows, num_minibatches):                  (lax.scan)
            den    = aggregation denominator of the minibatch (independent of the parameters)
            grads  = sum over micro-batches of grad(numerator_micro / den)   (lax.scan)
            params = optax update(grads)

Dividing every micro-batch numerator by the whole minibatch's denominator makes gradient
accumulation exact for every aggregation mode (`gd2po_jax.losses.aggregate_loss`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import Mesh

from gd2po_jax import losses
from gd2po_jax.advantages import advantage_diagnostics, compute_advantages
from gd2po_jax.sharding import batch_sharding


@struct.dataclass
class TrainState:
    """Everything an update changes (a pytree, donated to the step).

    params: `nnx.State` of the policy's parameters in the master dtype (float32 by default).
    opt_state: optax state. step: [] int32 updates done (optimizer steps, counted per rollout
    batch). rng: PRNG key for shuffling.
    """

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array


@struct.dataclass
class RolloutBatch:
    """One step's rollouts on device.

    input_ids: [B, S] int32, left-padded prompt then completion (padded after EOS).
    attention_mask: [B, S] bool, False on left padding.
    response_mask: [B, M] bool, completion tokens that count (EOS included).
    old_logp: [B, M] float32, log-probs of the sampling policy.
    ref_logp: [B, M] float32, reference-policy log-probs (zeros when no KL is used).
    rewards: [P, G, K] float32 raw rewards (NaN = missing).
    valid: [P] bool, False for padded prompts.
    """

    input_ids: jax.Array
    attention_mask: jax.Array
    response_mask: jax.Array
    old_logp: jax.Array
    ref_logp: jax.Array
    rewards: jax.Array
    valid: jax.Array


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Static hyperparameters of the update (hashable: part of the compiled program)."""

    method: str = "gd2po_snr"
    snr_tau: float = 0.8
    reward_weights: tuple[float, ...] | None = None
    batch_norm: str = "token"
    group_eps: float = 1e-6
    drop_zero_variance_groups: bool = False
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0
    loss_agg_mode: str = "token-mean"
    norm_length: float | None = None
    filtered_in_denominator: bool = True
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    log_entropy: bool = True
    ppo_epochs: int = 1
    num_minibatches: int = 1
    micro_batch_size: int = 0
    logit_chunk_size: int = 128
    compute_dtype: str = "float32"


def make_optimizer(
    learning_rate: float | optax.Schedule,
    *,
    weight_decay: float = 0.01,
    grad_clip: float = 1.0,
    b1: float = 0.9,
    b2: float = 0.999,
) -> optax.GradientTransformation:
    """AdamW with global-norm gradient clipping (the official GD2PO optimizer settings)."""
    parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip and grad_clip > 0 else []
    parts.append(optax.adamw(learning_rate, b1=b1, b2=b2, weight_decay=weight_decay))
    return optax.chain(*parts)


def unembedding(model) -> jax.Array:
    """[D, V] output projection of a `Decoder` (the transposed embedding when tied)."""
    return model.embed[...].T if model.lm_head is None else model.lm_head[...]


def completion_logprobs(
    model, input_ids: jax.Array, attention_mask: jax.Array, num_completion: int, *,
    chunk_size: int = 128, with_entropy: bool = False,
) -> tuple[jax.Array, jax.Array | None]:
    """Log-probs (and entropy) of the last ``M`` tokens of each row given everything before.

    Args:
      model: a `Decoder`.
      input_ids: [B, S] int32; attention_mask: [B, S].
      num_completion: M.

    Returns:
      logp [B, M] float32 and entropy [B, M] float32 (None unless ``with_entropy``).
    """
    hidden, _ = model.hidden_states(input_ids, attention_mask)
    start = input_ids.shape[1] - num_completion
    return losses.chunked_token_logprobs(
        hidden[:, start - 1 : -1], unembedding(model), input_ids[:, start:],
        chunk_size=chunk_size, with_entropy=with_entropy,
    )


def merge_model(graphdef, params, dtype):
    """The model of ``graphdef`` with ``params`` (master weights) cast to the compute ``dtype``.

    The cast is differentiable: gradients flow back to the master weights in their own dtype.
    """
    dtype = jnp.dtype(dtype)
    recast = lambda x: jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype  # noqa: E731
    cast = jax.tree.map(lambda x: x.astype(dtype) if recast(x) else x, params)
    return nnx.merge(graphdef, cast)


def _constrain_rows(tree, mesh: Mesh | None):
    if mesh is None:
        return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.shape)), tree)


def check_batch_layout(config: StepConfig, batch_rows: int) -> tuple[int, int]:
    """(minibatch rows, micro-batch rows) for ``batch_rows`` = B; raises naming the config field."""
    if batch_rows % config.num_minibatches:
        raise ValueError(
            f"rl.num_minibatches={config.num_minibatches} must divide the rollouts per step "
            f"(prompts_per_step x num_generations = {batch_rows})"
        )
    minibatch = batch_rows // config.num_minibatches
    micro = config.micro_batch_size or minibatch
    if minibatch % micro:
        raise ValueError(
            f"rl.micro_batch_size={micro} must divide the minibatch size {minibatch} "
            f"(= {batch_rows} rollouts / rl.num_minibatches={config.num_minibatches})"
        )
    return minibatch, micro


def make_train_step(graphdef, optimizer: optax.GradientTransformation, config: StepConfig,
                    mesh: Mesh | None = None):
    """The update function ``step(state, batch) -> (state, metrics)`` (not yet jitted).

    Args:
      graphdef: the policy's `nnx.GraphDef` (static structure; parameters come from the state).
      optimizer: the optax transformation whose state is ``state.opt_state``.
      config: `StepConfig`.
      mesh: when given, micro-batches are constrained to stay split over the batch axes.

    Returns:
      A pure function; wrap it with `jit_train_step`.
    """
    compute_dtype = jnp.dtype(config.compute_dtype)

    def micro_loss(params, rows: dict, denominator):
        model = merge_model(graphdef, params, compute_dtype)
        need_entropy = config.log_entropy or bool(config.entropy_coef)
        logp, entropy = completion_logprobs(
            model, rows["input_ids"], rows["attention_mask"], rows["old_logp"].shape[1],
            chunk_size=config.logit_chunk_size, with_entropy=need_entropy,
        )
        out = losses.policy_loss(
            logp, rows["old_logp"], rows["advantages"], rows["loss_mask"],
            clip_low=config.clip_low, clip_high=config.clip_high, dual_clip=config.dual_clip,
            agg_mode=config.loss_agg_mode, norm_length=config.norm_length,
            ref_logp=rows["ref_logp"] if config.kl_coef else None, kl_coef=config.kl_coef,
            kl_estimator=config.kl_estimator, entropy=entropy, entropy_coef=config.entropy_coef,
        )
        return out.numerator / jnp.maximum(denominator, 1e-8), out

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def step(state: TrainState, batch: RolloutBatch):
        num_prompts, group, _ = batch.rewards.shape
        rows_total = num_prompts * group
        minibatch_rows, micro_rows = check_batch_layout(config, rows_total)
        lengths = jnp.sum(batch.response_mask, axis=-1).reshape(num_prompts, group)
        adv = compute_advantages(
            batch.rewards, lengths, config.method, snr_tau=config.snr_tau,
            reward_weights=None if config.reward_weights is None else jnp.asarray(config.reward_weights),
            batch_norm=config.batch_norm, group_eps=config.group_eps, valid=batch.valid,
            drop_zero_variance_groups=config.drop_zero_variance_groups,
        )
        row_valid = jnp.repeat(batch.valid, group)
        loss_mask = batch.response_mask & row_valid[:, None]
        if not config.filtered_in_denominator:
            loss_mask = loss_mask & adv.keep.reshape(-1)[:, None]
        rows = {
            "input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
            "old_logp": batch.old_logp, "ref_logp": batch.ref_logp,
            "advantages": adv.advantages.reshape(-1), "loss_mask": loss_mask,
        }

        def update_minibatch(carry, indices):
            params, opt_state, loss_sums = carry
            minibatch = _constrain_rows(jax.tree.map(lambda x: x[indices], rows), mesh)
            _, denominator = losses.aggregate_loss(
                jnp.zeros(minibatch["loss_mask"].shape), minibatch["loss_mask"], config.loss_agg_mode,
                norm_length=config.norm_length,
            )
            micro = jax.tree.map(
                lambda x: x.reshape((minibatch_rows // micro_rows, micro_rows) + x.shape[1:]), minibatch
            )

            def accumulate_micro(acc, micro_batch):
                grads, sums = acc
                (_, out), micro_grads = grad_fn(params, _constrain_rows(micro_batch, mesh), denominator)
                return (jax.tree.map(jnp.add, grads, micro_grads), losses.accumulate(sums, out)), None

            zero_grads = jax.tree.map(jnp.zeros_like, params)
            (grads, sums), _ = jax.lax.scan(accumulate_micro, (zero_grads, losses.empty_policy_loss()), micro)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            grad_norm = optax.global_norm(grads)
            loss_sums = losses.accumulate(loss_sums, sums)
            return (params, opt_state, loss_sums), grad_norm

        def update_epoch(carry, epoch_key):
            params, opt_state, loss_sums = carry
            order = jax.random.permutation(epoch_key, rows_total)
            order = order.reshape(config.num_minibatches, minibatch_rows)
            return jax.lax.scan(update_minibatch, (params, opt_state, loss_sums), order)

        rng, shuffle_key = jax.random.split(state.rng)
        epoch_keys = jax.random.split(shuffle_key, config.ppo_epochs)
        init_sums = losses.empty_policy_loss()
        (params, opt_state, loss_sums), grad_norms = jax.lax.scan(
            update_epoch, (state.params, state.opt_state, init_sums), epoch_keys
        )
        metrics = _step_metrics(batch, adv, loss_sums, grad_norms, lengths)
        new_state = TrainState(params=params, opt_state=opt_state, step=state.step + 1, rng=rng)
        return new_state, metrics

    return step


def _step_metrics(batch: RolloutBatch, adv, loss_sums: losses.PolicyLoss, grad_norms, lengths):
    """Scalar metrics of one update (means over every minibatch of every epoch)."""
    metrics = {f"advantages/{k}": v for k, v in advantage_diagnostics(adv, batch.valid).items()}
    metrics.update({f"loss/{k}": v for k, v in loss_sums.metrics().items()})
    metrics["loss/grad_norm"] = jnp.mean(grad_norms)
    real = jnp.broadcast_to(batch.valid[:, None], lengths.shape)
    rewards = batch.rewards
    present = ~jnp.isnan(rewards) & real[..., None]
    reward_means = jnp.sum(jnp.where(present, rewards, 0.0), axis=(0, 1)) / jnp.maximum(
        jnp.sum(present, axis=(0, 1)), 1
    )
    for k in range(rewards.shape[-1]):
        metrics[f"reward_index/{k}"] = reward_means[k]
    metrics["response_length"] = jnp.sum(jnp.where(real, lengths, 0)) / jnp.maximum(jnp.sum(real), 1)
    return metrics


def jit_train_step(step_fn, state_shardings=None):
    """``jax.jit`` of the step with the state donated (and kept on its shardings)."""
    if state_shardings is None:
        return jax.jit(step_fn, donate_argnums=(0,))
    return jax.jit(step_fn, donate_argnums=(0,), out_shardings=(state_shardings, None))
