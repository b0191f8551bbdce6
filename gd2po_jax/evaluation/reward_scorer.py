"""Evaluation scored by the run's reward functions: each reward's value per response and their sum.

What a run whose rewards are its own functions (``config.rewards.functions``), or a mix of them with a
family, is evaluated with (`gd2po_jax.tasks.Task.eval_scorer`): greedy responses scored exactly as
training scores rollouts (`gd2po_jax.rewards.scoring.score_batch`, with the run's failure policy), so
that before/after numbers are in the units the rewards were trained on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gd2po_jax.evaluation.safe_alignment import REWARD_SUM
from gd2po_jax.rewards.base import RewardOutputError
from gd2po_jax.rewards.scoring import score_batch


class RewardFunctionScorer:
    """Scores generation batches with a reward function (a `gd2po_jax.evaluation.generation.BatchScorer`):
    per response each reward's value (NaN where it abstained or failed, so the summary's mean is over
    the responses it scored) and ``reward_sum``, the sum of the weighted rewards it has (w_k of
    ``weights``; NaN ones left out).

    Args:
      reward_fn: the run's reward function (`gd2po_jax.rl.setup.RunSetup.reward_fn`).
      weights: w_k per reward (`gd2po_jax.rl.setup.RunSetup.reward_weights`); empty: all ones.
      on_error, num_workers, timeout_s: as training scores (``config.rewards``).
    """

    def __init__(self, reward_fn, weights: tuple[float, ...] = (), *, on_error: str = "raise", num_workers: int = 1,
                 timeout_s: float = 0.0):
        self.reward_fn = reward_fn
        self.weights = np.asarray(weights or (1.0,) * len(reward_fn.names), np.float32)
        self.on_error, self.num_workers, self.timeout_s = on_error, num_workers, timeout_s

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.reward_fn.names)

    def score_rows(self, prompts: list[str], responses: list[str],
                   rows: list[dict[str, Any]]) -> list[dict[str, float]]:
        """One dict of scores per response (``rows``: each response's data row, with its token ids).

        Raises:
          ValueError: a reward function returned something that is not a reward, naming the data row.
        """
        columns = {name: [row[name] for row in rows] for name in rows[0]} if rows else {}
        try:
            scores = score_batch(self.reward_fn, prompts, responses, columns, on_error=self.on_error,
                                 num_workers=self.num_workers, timeout_s=self.timeout_s)
        except RewardOutputError as err:
            row = rows[err.rollout].get("row", err.rollout) if err.rollout is not None else None
            raise ValueError(f"data row {row} (0-based): {err}") from err
        values = np.where(scores.failed, np.nan, scores.rewards)  # [N, K]
        out = []
        for row_values in values:
            record = {name: float(v) for name, v in zip(self.names, row_values)}
            record[REWARD_SUM] = float(np.nansum(row_values * self.weights))
            out.append(record)
        return out
