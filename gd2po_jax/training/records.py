"""The records that cross the RL stages: a step's rollouts and the state an update changes.

`RolloutBatch` is what sampling (`gd2po_jax.rl.rollout`) hands to the update
(`gd2po_jax.rl.train_step`); `TrainState` is what the update (and the SFT and reward-model steps)
change and what checkpoints hold. Both are pytrees (``flax.struct``), so they pass through ``jit``
and Orbax as they are. This module imports only JAX, optax and flax.struct: the modules on either side
of a stage boundary import it, never each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import optax
from flax import struct


@struct.dataclass
class RolloutBatch:
    """One step's rollouts on device: what the update (`gd2po_jax.rl.train_step`) consumes.

    B = P x G rows, prompt-major (rows ``p * G .. p * G + G - 1`` answer prompt ``p``); ``S = Lp +
    M``, the padded prompt length plus the completion budget (``max_new_tokens``).

    input_ids: [B, S] int32, left-padded prompt then completion (padded after EOS).
    attention_mask: [B, S] bool, False on left padding.
    response_mask: [B, M] bool, completion tokens that count (EOS included).
    old_logp: [B, M] float32, log-probs of the sampling policy (at the update's log-prob
      temperature, `gd2po_jax.models.logprobs.logprob_temperature`).
    ref_logp: [B, M] float32, reference-policy log-probs (zeros when no KL is used).
    rewards: [P, G, K] float32 raw rewards (NaN = missing).
    valid: [P] bool, False for padded prompts.
    row_order: [B] int32, the rows in the order the update splits them into minibatches when it does
      not shuffle (``rl.shuffle_minibatches=False``): verl's order with ``rl.micro_batch_max_tokens``
      (`gd2po_jax.rl.micro_batches`). None: 0 .. B - 1.
    segment_ids: [B] int32, each row's verl micro-batch within its minibatch, which the loss is
      weighted by with ``rl.micro_batch_max_tokens`` (`gd2po_jax.rl.micro_batches`). None: unused.
    """

    input_ids: jax.Array
    attention_mask: jax.Array
    response_mask: jax.Array
    old_logp: jax.Array
    ref_logp: jax.Array
    rewards: jax.Array
    valid: jax.Array
    row_order: jax.Array | None = None
    segment_ids: jax.Array | None = None

    if TYPE_CHECKING:  # flax.struct.dataclass adds replace() (dataclasses.replace), undeclared in its typing

        def replace(self, **changes: Any) -> RolloutBatch: ...


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

    if TYPE_CHECKING:  # flax.struct.dataclass adds replace() (dataclasses.replace), undeclared in its typing

        def replace(self, **changes: Any) -> TrainState: ...

    def apply_gradients(self, optimizer: optax.GradientTransformation, grads: Any) -> TrainState:
        """The state after one optimizer update with ``grads`` (a pytree like ``params``): new
        parameters and optimizer state, ``step + 1``, the same RNG key."""
        updates, opt_state = optimizer.update(grads, self.opt_state, self.params)
        return self.replace(params=optax.apply_updates(self.params, updates), opt_state=opt_state, step=self.step + 1)
