"""gd2po_jax/training/batches.py."""

import numpy as np

from gd2po_jax.training.batches import sft_batches


def test_sft_batches_are_epochs_of_permutations():
    order = sft_batches(num_examples=6, batch_size=4, num_steps=3, seed=0)
    assert order.shape == (3, 4)
    assert sorted(order.reshape(-1)[:6].tolist()) == list(range(6))
