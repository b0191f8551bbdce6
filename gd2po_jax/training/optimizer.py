"""The optimizer of every update (RL step and supervised warm start): AdamW after gradient clipping."""

from __future__ import annotations

from typing import Any

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec


def make_optimizer(
    learning_rate: float | optax.Schedule,
    *,
    weight_decay: float = 0.01,
    grad_clip: float = 1.0,
    b1: float = 0.9,
    b2: float = 0.999,
) -> optax.GradientTransformation:
    """AdamW with global-norm gradient clipping (the official GD2PO optimizer settings).

    Args:
      learning_rate: a constant or an optax schedule (``config.train.learning_rate`` / warm-up).
      weight_decay: AdamW's decoupled weight decay (``config.train.weight_decay``).
      grad_clip: maximum global gradient norm (``config.train.grad_clip``); 0 or less disables it.
      b1, b2: Adam's moment decay rates.
    """
    parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip and grad_clip > 0 else []
    parts.append(optax.adamw(learning_rate, b1=b1, b2=b2, weight_decay=weight_decay))
    return optax.chain(*parts)


def optimizer_state_shardings(optimizer: optax.GradientTransformation, params: Any) -> Any:
    """The shardings of ``optimizer.init(params)``'s leaves: each parameter-shaped leaf (AdamW's
    moments) on its parameter's sharding, the others (step counters) replicated over the
    parameters' mesh (or on their one device).

    Args:
      optimizer: the transformation (`make_optimizer`).
      params: the parameters: arrays, or `jax.ShapeDtypeStruct` with shardings.
    """
    shardings = jax.tree.map(lambda p: p.sharding, params)
    first = jax.tree.leaves(shardings)[0]
    others = NamedSharding(first.mesh, PartitionSpec()) if isinstance(first, NamedSharding) else first
    return optax.tree_utils.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        jax.eval_shape(optimizer.init, params),
        shardings,
        transform_non_params=lambda _: others,
    )


def init_optimizer_state(optimizer: optax.GradientTransformation, params: Any) -> Any:
    """``optimizer.init(params)`` as one jitted program, on `optimizer_state_shardings`: fsdp splits
    the optimizer state as it splits the parameters.

    ``jax.jit(optimizer.init)`` alone put the whole state on one device (its zeros depend on no
    input, so no sharding reaches them), and placing that on the mesh replicated AdamW's 8 B/param on
    every device.
    """
    return jax.jit(optimizer.init, out_shardings=optimizer_state_shardings(optimizer, params))(params)
