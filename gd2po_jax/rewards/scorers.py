"""How evaluation scores greedy responses: per response, a dict of named values.

Three scorers, one per kind of reward a task can evaluate with (`gd2po_jax.tasks.Task.eval_scorer`):
`tool_calling_scorer` (a response against its ToolRL ground truth), `RewardFunctionScorer` (the run's
own reward functions, scored exactly as training scores rollouts) and `RewardModelScorer` (reward
models, per batch). The evaluation loop (`gd2po_jax.evaluation.generation.evaluate`) calls them; they
live here, beside the rewards they score with, so that tasks can choose one without importing the
evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import numpy as np

from gd2po_jax.rewards.base import RewardOutputError
from gd2po_jax.rewards.reward_model import RewardModelReward
from gd2po_jax.rewards.scoring import score_batch
from gd2po_jax.rewards.tool_calling import is_correct, score_tool_call

Scorer = Callable[[str, dict[str, Any]], dict[str, float]]
"""Scores one response against its data row (the row's columns, and `RESPONSE_IDS`)."""


class BatchScorer(Protocol):
    """Scores a generation batch at once (a reward model): ``score_rows(prompts, responses, rows)``
    with the rendered prompts, the responses and their rows (as `Scorer`'s) -> one dict per row."""

    def score_rows(
        self, prompts: list[str], responses: list[str], rows: list[dict[str, Any]]
    ) -> list[dict[str, float]]: ...


def tool_calling_scorer(max_think_words: int) -> Scorer:
    """Scores a response against a ToolRL ground truth (``row["ground_truth"]``):

    correct  `gd2po_jax.rewards.tool_calling.is_correct` as 0/1 (the calls exactly right, or a
             plain response where no call is wanted; format not required)
    format   the format reward (0/1); length: the length reward (Lmax = ``max_think_words``);
    correctness: the raw correctness reward in [-3, 3].
    """

    def score(response: str, row: dict[str, Any]) -> dict[str, float]:
        ground_truth = row["ground_truth"]
        s = score_tool_call(response, ground_truth, max_think_words)
        correct = is_correct(response, ground_truth, s.correctness)
        return {"correct": float(correct), "format": s.format, "length": s.length, "correctness": s.correctness}

    return score


_Scored = TypeVar("_Scored")


def _score_columns(rows: list[dict[str, Any]], score: Callable[[dict[str, list[Any]]], _Scored]) -> _Scored:
    """``score(columns)`` of the generation batch's ``rows`` (each response's data row) as columns; a
    `RewardOutputError` becomes a ValueError naming the data row of the rollout it names."""
    columns = {name: [row[name] for row in rows] for name in rows[0]} if rows else {}
    try:
        return score(columns)
    except RewardOutputError as err:
        row = rows[err.rollout].get("row", err.rollout) if err.rollout is not None else None
        raise ValueError(f"data row {row} (0-based): {err}") from err


REWARD_SUM = "reward_sum"
"""The report's name of a response's summed reward-model scores (and of their mean)."""


class RewardModelScorer:
    """Scores generation batches with a `RewardModelReward` (a `BatchScorer`):
    per response, each reward's score, their sum (`REWARD_SUM`) and ``reward_truncated/<name>`` (1.0
    where that model's conversation was cut to its max_length)."""

    def __init__(self, reward_fn: RewardModelReward):
        if not isinstance(reward_fn, RewardModelReward):
            raise TypeError(f"RewardModelScorer needs the reward_model reward, got {type(reward_fn).__name__}")
        self.reward_fn = reward_fn

    @property
    def names(self) -> tuple[str, ...]:
        return self.reward_fn.names

    def score_rows(
        self, prompts: list[str], responses: list[str], rows: list[dict[str, Any]]
    ) -> list[dict[str, float]]:
        """One dict of scores per response (``rows``: each response's data row, with its token ids).

        Raises:
          ValueError: a reward model cannot score a response (NaN, a prompt that does not fit),
            naming the data row.
        """
        scored = _score_columns(rows, lambda columns: self.reward_fn.score(prompts, responses, columns))
        out = []
        for values, cut in zip(scored.values, scored.truncated):
            scores = {name: float(v) for name, v in zip(self.names, values)}
            scores[REWARD_SUM] = float(np.sum(values))
            scores.update({f"reward_truncated/{name}": float(c) for name, c in zip(self.names, cut)})
            out.append(scores)
        return out


class RewardFunctionScorer:
    """Scores generation batches with a reward function (a `BatchScorer`):
    per response each reward's value (NaN where it abstained or failed, so the summary's mean is over
    the responses it scored) and ``reward_sum``, the sum of the weighted rewards it has (w_k of
    ``weights``; NaN ones left out).

    Args:
      reward_fn: the run's reward function (`gd2po_jax.tasks.setup.RunSetup.reward_fn`).
      weights: w_k per reward (`gd2po_jax.tasks.setup.RunSetup.reward_weights`); empty: all ones.
      on_error, num_workers, timeout_s: as training scores (``config.rewards``).
    """

    def __init__(
        self,
        reward_fn,
        weights: tuple[float, ...] = (),
        *,
        on_error: str = "raise",
        num_workers: int = 1,
        timeout_s: float = 0.0,
    ):
        self.reward_fn = reward_fn
        self.weights = np.asarray(weights or (1.0,) * len(reward_fn.names), np.float32)
        self.on_error, self.num_workers, self.timeout_s = on_error, num_workers, timeout_s

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.reward_fn.names)

    def score_rows(
        self, prompts: list[str], responses: list[str], rows: list[dict[str, Any]]
    ) -> list[dict[str, float]]:
        """One dict of scores per response (``rows``: each response's data row, with its token ids).

        Raises:
          ValueError: a reward function returned something that is not a reward, naming the data row.
        """
        scores = _score_columns(
            rows,
            lambda columns: score_batch(
                self.reward_fn,
                prompts,
                responses,
                columns,
                on_error=self.on_error,
                num_workers=self.num_workers,
                timeout_s=self.timeout_s,
            ),
        )
        values = np.where(scores.failed, np.nan, scores.rewards)  # [N, K]
        out = []
        for row_values in values:
            record = {name: float(v) for name, v in zip(self.names, row_values)}
            record[REWARD_SUM] = float(np.nansum(row_values * self.weights))
            out.append(record)
        return out
