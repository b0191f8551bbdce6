"""The optimizer of every update (RL step and supervised warm start): AdamW after gradient clipping."""

from __future__ import annotations

import optax


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
