"""verl's dynamic micro-batches, laid out on the host: which rows form each minibatch and each
token-budget micro-batch of a step (``rl.micro_batch_max_tokens``; docs/algorithm.md#micro-batch-weighting).

The official GD2PO runs (verl, ``actor.use_dynamic_bsz=True``) weight the loss by micro-batch: each
micro-batch's loss is the token mean over its own tokens, multiplied by its share of the minibatch's
rows. Which rows share a micro-batch therefore changes the gradient, and reproducing it means
reproducing verl's partition. verl lays a step of B rows out in three moves:

1. ``RayPPOTrainer._balance_batch`` (verl/trainer/ppo/ray_trainer.py, ``trainer.balance_batch``, on by
   default) deals the rows to the W data-parallel ranks: a Karmarkar-Karp partition of the rows'
   token counts into W parts of B / W rows each, every part in ascending row order; rank r gets part
   r (the dispatch hands out contiguous chunks).
2. ``DataParallelPPOActor.update_policy`` (verl/workers/actor/dp_actor.py) splits each rank's rows,
   in order, into minibatches of B / (W x minibatches) rows (``data.split``, no shuffling): the
   global minibatch m is the m-th such chunk of every rank.
3. ``prepare_dynamic_batch`` -> ``rearrange_micro_batches`` (verl/utils/seqlen_balancing.py) cuts
   each rank's minibatch into ``ceil(tokens / budget)`` micro-batches (at most one per row; the
   count is the maximum over the ranks, an all-reduce), a Karmarkar-Karp partition of the rows'
   token counts (parts of any size), ordered by the sum of squared lengths, largest first.

A row's token count is its attention mask's sum: prompt tokens plus response tokens (EOS
included). The budget is per rank (``ppo_max_token_len_per_gpu``). The layout is plain NumPy, from
the lengths the host already holds (`gd2po_jax.rl.rollout.collect_rollouts`); the update receives
it as two [B] int32 arrays of the batch (`gd2po_jax.training.records.RolloutBatch`): the rows in
minibatch order and each row's micro-batch within its minibatch.

`balanced_partitions` reproduces verl's ``get_seqlen_balanced_partitions`` part for part, ties
included (tests/reference/verl_seqlen_balancing_vectors.json holds outputs of verl's function).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

import numpy as np

# ----------------------------------------------------------------------------------------------
# Karmarkar-Karp (the largest differencing method) with verl's order of ties.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Part:
    """One part of a partial partition: its total and its (row, length) items, in insertion order."""

    total: int = 0
    items: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    def key(self) -> tuple:
        """Parts compare by total, then by item count, then by their items (verl's order)."""
        return self.total, len(self.items), self.items


class _Partition:
    """k parts, kept in descending order of `_Part.key`. In the heap, the partition with the larger
    spread (largest total minus smallest) comes out first; equal spreads: the one whose largest part
    is larger."""

    def __init__(self, items: Sequence[tuple[int, int]], k: int):
        self.parts = [_Part() for _ in range(k)]
        for part, (row, length) in zip(self.parts, items):
            part.total += length
            part.items.append((row, length))
        self._sort()

    def _sort(self) -> None:
        self.parts.sort(key=_Part.key, reverse=True)

    def spread(self) -> int:
        return self.parts[0].total - self.parts[-1].total

    def absorb(self, other: _Partition) -> None:
        """Join ``other`` into this partition: its smallest part to our largest, and so on."""
        for part, joined in zip(self.parts, reversed(other.parts)):
            part.total += joined.total
            part.items.extend(joined.items)
        self._sort()

    def __lt__(self, other: _Partition) -> bool:
        if self.spread() != other.spread():
            return self.spread() > other.spread()
        return self.parts[0].key() > other.parts[0].key()


def balanced_partitions(lengths: Sequence[int], k: int, *, equal_size: bool) -> list[list[int]]:
    """The rows ``0 .. len(lengths) - 1`` in ``k`` parts of nearly equal total length, as verl's
    ``get_seqlen_balanced_partitions`` (Karmarkar-Karp) gives them: the same parts in the same order,
    each part's rows ascending.

    Args:
      lengths: the rows' token counts.
      k: parts (at most the number of rows).
      equal_size: every part holds ``len(lengths) / k`` rows (which must be a whole number).

    Raises:
      ValueError: ``k`` is out of range, the sizes cannot be equal, or a part came out empty.
    """
    lengths = [int(n) for n in lengths]
    if not 1 <= k <= len(lengths):
        raise ValueError(f"cannot split {len(lengths)} rows into {k} parts")
    if equal_size and len(lengths) % k:
        raise ValueError(f"{len(lengths)} rows do not split into {k} parts of equal size")
    ascending = sorted((length, row) for row, length in enumerate(lengths))
    group = k if equal_size else 1
    heap: list[_Partition] = []
    for start in range(0, len(ascending), group):
        chunk = ascending[start : start + group]
        heapq.heappush(heap, _Partition([(row, length) for length, row in chunk], k))
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        first.absorb(second)
        heapq.heappush(heap, first)
    parts = [sorted(row for row, _ in part.items) for part in heap[0].parts]
    if any(not part for part in parts):
        raise ValueError(f"a part of the {k}-way split of {len(lengths)} rows came out empty")
    return parts


# ----------------------------------------------------------------------------------------------
# A step's layout.
# ----------------------------------------------------------------------------------------------


def token_budget_micro_batches(lengths: Sequence[int], count: int) -> list[list[int]]:
    """verl's ``rearrange_micro_batches`` of one rank's minibatch into ``count`` micro-batches: the
    `balanced_partitions` of the rows (parts of any size), ordered by the sum of their squared
    lengths, largest first (ties: the part with the larger first row first). Row indices are local
    (0 .. len(lengths) - 1)."""
    parts = balanced_partitions(lengths, count, equal_size=False)
    return sorted(parts, key=lambda part: (sum(int(lengths[i]) ** 2 for i in part), min(part)), reverse=True)


def micro_batch_count(lengths: Sequence[int] | np.ndarray, max_tokens: int) -> int:
    """How many micro-batches verl cuts a rank's minibatch into: ``ceil(tokens / max_tokens)``, at
    most one per row."""
    return min(len(lengths), -(-int(np.sum(lengths)) // max_tokens))


@dataclasses.dataclass(frozen=True)
class UpdateLayout:
    """Where each row of a step goes in verl's update (host arrays).

    row_order: [B] int32, the rows in minibatch order: minibatch m is ``row_order[m * B / n : (m + 1) * B / n]``
      (n minibatches).
    segment_ids: [B] int32, row -> its micro-batch within its minibatch (0 .. count - 1, numbered in
      verl's order: rank by rank, each rank's micro-batches in the order verl runs them).
    micro_batches: per minibatch, its micro-batches as lists of rows (of the step), in that order.
    """

    row_order: np.ndarray
    segment_ids: np.ndarray
    micro_batches: tuple[tuple[tuple[int, ...], ...], ...]


def verl_update_layout(
    lengths: Sequence[int] | np.ndarray, *, num_minibatches: int, max_tokens: int, ranks: int = 1, balance: bool = True
) -> UpdateLayout:
    """The minibatches and token-budget micro-batches of a step as verl forms them (module docstring).

    Args:
      lengths: [B] each row's tokens, prompt plus response (EOS included), in the step's row order
        (prompt-major).
      num_minibatches: minibatches per epoch (``rl.num_minibatches``).
      max_tokens: the token budget of one rank's micro-batch (``rl.micro_batch_max_tokens``, verl's
        ``ppo_max_token_len_per_gpu``).
      ranks: verl's data-parallel ranks W (``rl.micro_batch_ranks``).
      balance: deal the rows to the ranks by token count first (verl's ``trainer.balance_batch``);
        False: rank r holds the r-th contiguous chunk of the rows.

    Raises:
      ValueError: naming ``rl.micro_batch_ranks`` when B does not split into ``ranks`` x
        ``num_minibatches`` equal parts.
    """
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    rows = len(lengths)
    if rows % (ranks * num_minibatches):
        raise ValueError(
            f"rl.micro_batch_ranks: the {rows} rollouts of a step do not split into {ranks} ranks x "
            f"{num_minibatches} minibatches (rl.num_minibatches) of equal size"
        )
    if balance and ranks > 1:
        dealt = balanced_partitions(lengths.tolist(), ranks, equal_size=True)
    else:
        dealt = [list(range(r * rows // ranks, (r + 1) * rows // ranks)) for r in range(ranks)]
    per_rank = rows // (ranks * num_minibatches)
    row_order, segment_ids = [], np.zeros(rows, np.int32)
    minibatches = []
    for m in range(num_minibatches):
        shares = [part[m * per_rank : (m + 1) * per_rank] for part in dealt]
        count = max(micro_batch_count(lengths[share], max_tokens) for share in shares)
        micro: list[tuple[int, ...]] = []
        for share in shares:
            row_order.extend(share)
            for local in token_budget_micro_batches(lengths[share].tolist(), count):
                segment_ids[[share[i] for i in local]] = len(micro)
                micro.append(tuple(share[i] for i in local))
        minibatches.append(tuple(micro))
    return UpdateLayout(
        row_order=np.asarray(row_order, np.int32), segment_ids=segment_ids, micro_batches=tuple(minibatches)
    )
