"""Row batches of supervised training (the SFT warm start, reward-model training): epochs of seeded
permutations, so a run's batches depend only on its seed and sizes."""

from __future__ import annotations

import numpy as np


def sft_batches(num_examples: int, batch_size: int, num_steps: int, seed: int):
    """Row indices of ``num_steps`` batches: epochs of seeded permutations, concatenated."""
    needed = num_steps * batch_size
    orders: list[np.ndarray] = []
    epoch = 0
    while sum(len(o) for o in orders) < needed:
        orders.append(np.random.default_rng([seed, 10_000 + epoch]).permutation(num_examples))
        epoch += 1
    flat = np.concatenate(orders)[:needed] if orders else np.zeros((0,), np.int64)
    return flat.reshape(num_steps, batch_size)
