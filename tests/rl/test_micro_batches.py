"""verl's minibatches and token-budget micro-batches, laid out on the host (`gd2po_jax.rl.micro_batches`).

The partitions are checked against outputs of verl's own ``seqlen_balancing.py`` (the GD2PO
repository's copy; tests/reference/README.md), ties included: which rows share a micro-batch
changes the loss's weights."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gd2po_jax.rl.micro_batches import (
    balanced_partitions,
    micro_batch_count,
    token_budget_micro_batches,
    verl_update_layout,
)
from tests.fakes import REFERENCE

VECTORS = json.loads((REFERENCE / "verl_seqlen_balancing_vectors.json").read_text())


@pytest.mark.parametrize("case", VECTORS["get_seqlen_balanced_partitions"],
                         ids=lambda c: f"{len(c['lengths'])}x{c['k']}")
def test_balanced_partitions_are_verls(case):
    got = balanced_partitions(case["lengths"], case["k"], equal_size=case["equal_size"])
    assert got == case["partitions"]


@pytest.mark.parametrize("case", VECTORS["rearrange_micro_batches"],
                         ids=lambda c: f"{len(c['lengths'])}@{c['max_token_len']}")
def test_token_budget_micro_batches_are_verls_in_verls_order(case):
    lengths = case["lengths"]
    count = micro_batch_count(lengths, case["max_token_len"])
    assert count == len(case["micro_batches"])
    assert token_budget_micro_batches(lengths, count) == case["micro_batches"]


def test_micro_batch_count_is_the_token_ceiling_at_most_one_per_row():
    assert micro_batch_count([10, 10, 10], 15) == 2  # ceil(30 / 15)
    assert micro_batch_count([10, 10, 10], 16) == 2
    assert micro_batch_count([10, 10, 10], 30) == 1
    assert micro_batch_count([100, 100], 1) == 2  # never more micro-batches than rows


def test_layout_by_hand_two_ranks_two_minibatches():
    # 8 rows, 2 ranks, 2 minibatches: each rank holds 4 rows, 2 per minibatch.
    lengths = [100, 10, 90, 20, 80, 30, 70, 40]
    layout = verl_update_layout(lengths, num_minibatches=2, max_tokens=100, ranks=2)
    # balance_batch: two parts of 4 rows with equal totals (220 each), each ascending.
    dealt = balanced_partitions(lengths, 2, equal_size=True)
    assert sorted(sum(lengths[i] for i in part) for part in dealt) == [220, 220]
    # Minibatch m takes the m-th pair of rows of each rank, rank 0 first.
    expected_order = dealt[0][:2] + dealt[1][:2] + dealt[0][2:] + dealt[1][2:]
    assert layout.row_order.tolist() == expected_order
    assert sorted(layout.row_order.tolist()) == list(range(8))
    for m, micro in enumerate(layout.micro_batches):
        shares = [dealt[0][2 * m:2 * m + 2], dealt[1][2 * m:2 * m + 2]]
        # As many micro-batches on each rank: the larger of the ranks' ceil(tokens / 100).
        count = max(micro_batch_count([lengths[i] for i in share], 100) for share in shares)
        assert len(micro) == 2 * count
        assert sorted(i for rows in micro[:count] for i in rows) == sorted(shares[0])  # rank 0's first
        assert sorted(i for rows in micro[count:] for i in rows) == sorted(shares[1])
        for s, rows in enumerate(micro):
            assert all(layout.segment_ids[i] == s for i in rows)


def test_layout_without_balancing_deals_contiguous_chunks():
    layout = verl_update_layout([5] * 8, num_minibatches=2, max_tokens=10, ranks=2, balance=False)
    assert layout.row_order.tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    # Each rank's 2 rows of 5 tokens fit one micro-batch of 10: segments 0 (rank 0) and 1 (rank 1).
    assert layout.micro_batches == (((0, 1), (4, 5)), ((2, 3), (6, 7)))
    assert layout.segment_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_one_rank_one_minibatch_keeps_the_row_order():
    lengths = np.random.RandomState(0).randint(5, 50, 12)
    layout = verl_update_layout(lengths, num_minibatches=1, max_tokens=100, ranks=1)
    assert layout.row_order.tolist() == list(range(12))
    (micro,) = layout.micro_batches
    assert len(micro) == -(-int(lengths.sum()) // 100)
    assert sorted(i for rows in micro for i in rows) == list(range(12))


def test_layout_errors_name_the_field():
    with pytest.raises(ValueError, match=r"^rl\.micro_batch_ranks: the 12 rollouts .* 8 ranks x 1 minibatches"):
        verl_update_layout([10] * 12, num_minibatches=1, max_tokens=100, ranks=8)
    with pytest.raises(ValueError, match="cannot split 3 rows into 4 parts"):
        balanced_partitions([1, 2, 3], 4, equal_size=False)
