"""Scoring rollouts on the host: reward functions over decoded texts, chunked over threads.

Reward functions are plain Python over strings; `score_rollouts` runs them on N responses (in
``num_workers`` parallel chunks) and returns the [N, K] float32 rewards. Three outcomes per value:

  a finite number   the reward
  NaN               the function abstained (returned NaN or None): the reward is missing for that
                    rollout and moves no statistic of the advantages; `abstained_fraction` is the
                    share the trainer logs per reward
  an exception      a crash: with ``config.rewards.on_error='raise'`` it names the rollout; with
                    ``'min'`` the rollout gets every reward's minimum (``min_values``)

A value that is neither (+-inf, a string, a bool) is a bug in the reward function and always
raises `RewardOutputError` naming the reward, the rollout and the value, whatever ``on_error`` says.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any

import numpy as np

from gd2po_jax.rewards.base import RewardFunction, RewardOutputError, check_reward_output

logger = logging.getLogger(__name__)


class RewardError(RuntimeError):
    """A reward function raised on a rollout; the message names the rollout and the exception."""


def reward_minimums(reward_fn: RewardFunction) -> np.ndarray:
    """[K] minimum of each reward, from the function's ``min_values`` (required for on_error=min)."""
    minimums = getattr(reward_fn, "min_values", None)
    if minimums is None:
        raise ValueError(
            f"config.rewards.on_error='min' needs the reward function {type(reward_fn).__name__} "
            "to declare min_values; use on_error='raise'"
        )
    return np.asarray(minimums, np.float32)


def _score_one(reward_fn, prompt, response, columns, index, rollout, on_error) -> np.ndarray:
    """[K] rewards of response ``index`` of the chunk (rollout ``rollout`` of the step)."""
    one = {name: values[index : index + 1] for name, values in columns.items()}
    try:
        raw = reward_fn([prompt], [response], one)
    except RewardOutputError as err:  # raised by a CombinedReward's own check: a bug, not a crash
        raise err.shifted(rollout) from None
    except Exception as err:  # noqa: BLE001
        if on_error != "min":
            raise RewardError(
                f"reward function {type(reward_fn).__name__} failed on rollout {rollout} "
                f"(response {response[:200]!r}): {type(err).__name__}: {err}. Fix the reward or "
                "set config.rewards.on_error='min' to score such rollouts as the minimum"
            ) from err
        logger.warning("reward failed on rollout %d (scored as the minimum): %s", rollout, err)
        return reward_minimums(reward_fn)
    try:
        return check_reward_output(reward_fn, raw, 1)[0]
    except RewardOutputError as err:
        raise err.shifted(rollout) from None


def _score_chunk(reward_fn, prompts, responses, columns, start, on_error) -> np.ndarray:
    """[n, K] rewards of the chunk starting at rollout ``start``: scored together; when the
    function raises, row by row to find (or floor) the rollouts it fails on."""
    try:
        raw = reward_fn(prompts, responses, columns)
    except RewardOutputError as err:
        raise err.shifted(start) from None
    except Exception:  # noqa: BLE001 - re-raised by _score_one with the rollout that failed
        return np.stack([
            _score_one(reward_fn, prompt, response, columns, i, start + i, on_error)
            for i, (prompt, response) in enumerate(zip(prompts, responses))
        ])
    try:
        return check_reward_output(reward_fn, raw, len(responses))
    except RewardOutputError as err:
        raise err.shifted(start) from None


def score_rollouts(
    reward_fn: RewardFunction,
    prompts: list[str],
    responses: list[str],
    columns: dict[str, list[Any]],
    *,
    on_error: str = "raise",
    num_workers: int = 1,
) -> np.ndarray:
    """[N, K] float32 rewards of N responses (NaN where a reward abstained), scored in
    ``num_workers`` parallel chunks.

    Raises:
      RewardError: a reward function raised on a rollout (with ``on_error='raise'``).
      RewardOutputError: a reward function returned a value that is neither a finite number nor
        an abstention, or the wrong shape.
    """
    if on_error == "min":
        reward_minimums(reward_fn)  # fail early, not on the first bad rollout
    n = len(responses)
    bounds = np.linspace(0, n, min(num_workers, n) + 1).astype(int)
    chunks = [
        (prompts[a:b], responses[a:b], {k: v[a:b] for k, v in columns.items()}, int(a))
        for a, b in zip(bounds[:-1], bounds[1:])
    ]
    if len(chunks) == 1:
        parts = [_score_chunk(reward_fn, *chunks[0], on_error)]
    else:
        with concurrent.futures.ThreadPoolExecutor(len(chunks)) as pool:
            parts = list(pool.map(lambda c: _score_chunk(reward_fn, *c, on_error), chunks))
    return np.concatenate(parts).astype(np.float32)


def abstained_fraction(rewards: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """[K] share of the rollouts on which each reward abstained (is NaN).

    Args:
      rewards: [P, G, K] rewards of one step.
      valid: [P] bool, False for the filler prompts of a partly filled batch (not counted);
        default all True.
    """
    rewards = np.asarray(rewards)
    valid = np.ones(rewards.shape[0], bool) if valid is None else np.asarray(valid, bool)
    rollouts = rewards[valid].reshape(-1, rewards.shape[-1])  # [valid P * G, K]
    if not len(rollouts):
        return np.zeros(rewards.shape[-1], np.float32)
    return np.isnan(rollouts).mean(axis=0).astype(np.float32)


def repeat_columns(columns: dict[str, list[Any]], times: int) -> dict[str, list[Any]]:
    """Each value repeated ``times`` in place (prompt-major rollout order)."""
    return {name: [v for v in values for _ in range(times)] for name, values in columns.items()}
