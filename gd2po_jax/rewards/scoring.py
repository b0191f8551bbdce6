"""Scoring rollouts on the host: reward functions over decoded texts, chunked over threads.

Reward functions are plain Python over strings; `score_batch` runs them on N responses (in
``num_workers`` parallel chunks, each function of a `CombinedReward` on its own) and returns the
[N, K] float32 rewards with the [N, K] mask of failed values. Three outcomes per value:

  a finite number   the reward
  NaN               the function abstained (returned NaN or None): the reward is missing for that
                    rollout and moves no statistic of the advantages; `abstained_fraction` is the
                    share the trainer logs per reward
  a failure         the function raised, or gave no result before the step's deadline
                    (``config.rewards.timeout_s``): with ``config.rewards.on_error='raise'`` the
                    run stops naming the function and the rollout; with ``'min'`` the failed
                    function's rewards of that rollout are its ``min_values``, the value is marked
                    failed, `failed_fraction` is the share the trainer logs per reward
                    (``reward_failed/<name>``), and `check_failures` stops the run when more than
                    ``config.rewards.max_failed_fraction`` of a step's rollouts failed

A value that is neither (+-inf, a string such as "2.5", a bool) is a bug in the reward function
and always raises `RewardOutputError` naming the reward, the rollout and the value, whatever
``on_error`` says.

Timeouts: a reward call with a deadline runs in a daemon thread that the scorer waits on until the
deadline. Python cannot kill a thread, so a call that hangs is abandoned, not stopped: it keeps
its thread (and whatever it holds) until it returns or the process exits, and its late result is
dropped.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import Any

import numpy as np

from gd2po_jax.errors import UserError
from gd2po_jax.rewards.base import (
    CombinedReward,
    RewardFunction,
    RewardOutputError,
    check_reward_output,
    function_label,
)

logger = logging.getLogger(__name__)


class RewardError(UserError, RuntimeError):
    """A reward function raised on a rollout; the message names the rollout and the exception."""


class RewardTimeoutError(RewardError):
    """A reward function gave no result within ``config.rewards.timeout_s`` (with on_error='raise')."""


class RewardFailuresError(RewardError):
    """More of a step's rollouts failed than ``config.rewards.max_failed_fraction`` allows."""


class _TimedOut(Exception):
    """A reward call did not return before the deadline (its thread is abandoned)."""


@dataclasses.dataclass(frozen=True)
class Scores:
    """The rewards of N rollouts and which of them failed.

    rewards: [N, K] float32; NaN where a reward abstained, the function's minimum where it failed.
    failed: [N, K] bool, True where the reward function raised or timed out (on_error='min').
    first_error: what went wrong on the first failed rollout (function, rollout, error); None when
      nothing failed.
    """

    rewards: np.ndarray
    failed: np.ndarray
    first_error: str | None = None


def reward_minimums(reward_fn: RewardFunction) -> np.ndarray:
    """[K] minimum of each reward, from the function's ``min_values`` (required for on_error=min)."""
    minimums = getattr(reward_fn, "min_values", None)
    if minimums is None:
        raise ValueError(
            f"on_error='min' needs the reward function {function_label(reward_fn)} to declare min_values "
            "(an entry of config.rewards.functions: its min_value); use on_error='raise' or 'abstain'"
        )
    return np.asarray(minimums, np.float32)


def reward_functions(reward_fn: RewardFunction) -> tuple[RewardFunction, ...]:
    """The functions scored one by one: those of a `CombinedReward` (so that one failing function
    floors only its own columns), else ``reward_fn`` itself."""
    return reward_fn.functions if isinstance(reward_fn, CombinedReward) else (reward_fn,)


# ---------------------------------------------------------------- one call, with a deadline


def _call(reward_fn, prompts, responses, columns, deadline: float | None):
    """``reward_fn(prompts, responses, columns)``; with a deadline (a `time.monotonic` value) in a
    daemon thread, raising `_TimedOut` when it has not returned by then (the thread is abandoned)."""
    if deadline is None:
        return reward_fn(prompts, responses, columns)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _TimedOut()
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run():
        try:
            outcome["value"] = reward_fn(prompts, responses, columns)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = err
        finally:
            done.set()

    threading.Thread(target=run, name=f"reward-{type(reward_fn).__name__}", daemon=True).start()
    if not done.wait(remaining):
        raise _TimedOut()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@dataclasses.dataclass(frozen=True)
class _Policy:
    """How a step is scored: ``on_error`` (raise | min | abstain), the deadline (None: none) and
    ``timeout_s`` (messages)."""

    on_error: str
    deadline: float | None
    timeout_s: float

    def of(self, reward_fn) -> _Policy:
        """This policy with ``reward_fn``'s own ``on_error`` (an entry of config.rewards.functions may set one)."""
        own = getattr(reward_fn, "on_error", None)
        return dataclasses.replace(self, on_error=own) if own else self

    def failed_values(self, reward_fn) -> np.ndarray:
        """[K] what a failed rollout scores: the function's minimums (min), or NaN (abstain)."""
        if self.on_error == "abstain":
            return np.full(len(reward_fn.names), np.nan, np.float32)
        return reward_minimums(reward_fn)

    def timed_out(self, reward_fn, first: int, last: int) -> str:
        """The failure message of rollouts ``first..last`` that got no result in time (raises it
        with on_error='raise')."""
        rollouts = f"rollout {first}" if first == last else f"rollouts {first}-{last}"
        message = (
            f"reward function {function_label(reward_fn)} gave no result for {rollouts} within "
            f"config.rewards.timeout_s={self.timeout_s:g} s of the step's scoring (the call is "
            "abandoned: its thread cannot be stopped)"
        )
        if self.on_error == "raise":
            raise RewardTimeoutError(
                f"{message}. Fix or speed up the reward, raise "
                "config.rewards.timeout_s, or set config.rewards.on_error='min' "
                "to score such rollouts as the minimum"
            )
        return message


# ---------------------------------------------------------------- one function, one chunk


def _score_one(reward_fn, prompt, response, columns, index, rollout, policy) -> tuple[np.ndarray, str | None]:
    """([K] rewards, failure message or None) of response ``index`` of the chunk (rollout
    ``rollout`` of the step)."""
    one = {name: values[index : index + 1] for name, values in columns.items()}
    try:
        raw = _call(reward_fn, [prompt], [response], one, policy.deadline)
    except _TimedOut:
        return policy.failed_values(reward_fn), policy.timed_out(reward_fn, rollout, rollout)
    except RewardOutputError as err:  # raised by a CombinedReward's own check: a bug, not a crash
        raise err.shifted(rollout) from None
    except Exception as err:  # noqa: BLE001
        if policy.on_error == "raise":
            raise RewardError(
                f"reward function {function_label(reward_fn)} failed on rollout {rollout} "
                f"(response {response[:200]!r}): {type(err).__name__}: {err}. Fix the reward or "
                "set config.rewards.on_error='min' to score such rollouts as the minimum"
            ) from err
        return policy.failed_values(reward_fn), (
            f"reward function {function_label(reward_fn)} failed on rollout {rollout}: {type(err).__name__}: {err}"
        )
    try:
        return check_reward_output(reward_fn, raw, 1)[0], None
    except RewardOutputError as err:
        raise err.shifted(rollout) from None


def _score_chunk(reward_fn, prompts, responses, columns, start, policy) -> tuple[np.ndarray, list[str | None]]:
    """([n, K] rewards, n failure messages or None) of the chunk starting at rollout ``start``:
    scored together; when the function raises, row by row to find (or floor) the rollouts it fails
    on; when it times out, the whole chunk failed (row by row would wait again)."""
    n = len(responses)
    try:
        raw = _call(reward_fn, prompts, responses, columns, policy.deadline)
    except _TimedOut:
        message = policy.timed_out(reward_fn, start, start + n - 1)
        return np.tile(policy.failed_values(reward_fn), (n, 1)), [message] * n
    except RewardOutputError as err:
        raise err.shifted(start) from None
    except Exception:  # noqa: BLE001 - re-raised by _score_one with the rollout that failed
        rows = [
            _score_one(reward_fn, prompt, response, columns, i, start + i, policy)
            for i, (prompt, response) in enumerate(zip(prompts, responses))
        ]
        return np.stack([values for values, _ in rows]), [error for _, error in rows]
    try:
        return check_reward_output(reward_fn, raw, n), [None] * n
    except RewardOutputError as err:
        raise err.shifted(start) from None


def _score_function(reward_fn, chunks: list[tuple[Any, Any, Any, int]], policy) -> tuple[np.ndarray, list[str | None]]:
    """([N, K_f] rewards, N failure messages or None) of one reward function over all chunks."""
    if len(chunks) == 1:
        parts = [_score_chunk(reward_fn, *chunks[0], policy)]
    else:
        with concurrent.futures.ThreadPoolExecutor(len(chunks)) as pool:
            # mypy infers the lambda's c as Any here, and then counts *c as taking every parameter
            parts = list(pool.map(lambda c: _score_chunk(reward_fn, *c, policy), chunks))  # type: ignore[call-arg]
    return np.concatenate([values for values, _ in parts]), [e for _, errors in parts for e in errors]


def score_batch(
    reward_fn: RewardFunction,
    prompts: list[str],
    responses: list[str],
    columns: dict[str, list[Any]],
    *,
    on_error: str = "raise",
    num_workers: int = 1,
    timeout_s: float = 0.0,
    first_rollout: int = 0,
) -> Scores:
    """The `Scores` of N responses: [N, K] rewards (NaN where a reward abstained) and the [N, K]
    failed values, scored in ``num_workers`` parallel chunks, each function of a `CombinedReward`
    on its own (a failing function floors only its columns).

    Args:
      timeout_s: the scoring of the whole batch (every function, every chunk) must end this many
        seconds after it starts; calls still running then fail (``on_error``). 0: no limit.
      first_rollout: the step's number of the first response, for messages (a process of a
        multi-host run scores the step's rollouts from there on).

    Raises:
      RewardError: a reward function raised on a rollout (with ``on_error='raise'``).
      RewardTimeoutError: a reward function gave no result in time (with ``on_error='raise'``).
      RewardOutputError: a reward function returned a value that is neither a finite number nor
        an abstention, or the wrong shape.
    """
    functions = reward_functions(reward_fn)
    policy = _Policy(on_error, time.monotonic() + timeout_s if timeout_s else None, timeout_s)
    for fn in functions:
        if policy.of(fn).on_error == "min":
            reward_minimums(fn)  # fail early, not on the first bad rollout
    n = len(responses)
    bounds = np.linspace(0, n, min(num_workers, n) + 1).astype(int)
    chunks = [
        (prompts[a:b], responses[a:b], {k: v[a:b] for k, v in columns.items()}, first_rollout + int(a))
        for a, b in zip(bounds[:-1], bounds[1:])
    ]
    rewards, failed, first_errors = [], [], []
    for fn in functions:
        values, errors = _score_function(fn, chunks, policy.of(fn))
        rewards.append(values)
        failed.append(np.repeat(np.array([e is not None for e in errors], bool)[:, None], values.shape[1], axis=1))
        bad = [e for e in errors if e is not None]
        if bad:
            outcome = "left unscored" if policy.of(fn).on_error == "abstain" else "scored as the minimum"
            logger.warning(
                "reward function %s failed on %d of %d rollouts (%s); first: %s",
                function_label(fn),
                len(bad),
                n,
                outcome,
                bad[0],
            )
            first_errors.append((errors.index(bad[0]), bad[0]))
    return Scores(
        rewards=np.concatenate(rewards, axis=1).astype(np.float32),
        failed=np.concatenate(failed, axis=1),
        first_error=min(first_errors)[1] if first_errors else None,
    )


# ---------------------------------------------------------------- per-step shares and the failure limit


def _valid_share(mask: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
    """[K] share of the valid rollouts where ``mask`` [P, G, K] is True (0 when none is valid)."""
    mask = np.asarray(mask)
    valid = np.ones(mask.shape[0], bool) if valid is None else np.asarray(valid, bool)
    rollouts = mask[valid].reshape(-1, mask.shape[-1])  # [valid P * G, K]
    if not len(rollouts):
        return np.zeros(mask.shape[-1], np.float32)
    return rollouts.mean(axis=0).astype(np.float32)


def abstained_fraction(rewards: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """[K] share of the rollouts on which each reward abstained (is NaN).

    Args:
      rewards: [P, G, K] rewards of one step.
      valid: [P] bool, False for the filler prompts of a partly filled batch (not counted);
        default all True.
    """
    return _valid_share(np.isnan(np.asarray(rewards)), valid)


def failed_fraction(failed: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """[K] share of the rollouts on which each reward failed (scored as the minimum).

    Args:
      failed: [P, G, K] bool, `Scores.failed` of one step reshaped.
      valid: [P] bool, False for the filler prompts of a partly filled batch (not counted);
        default all True.
    """
    return _valid_share(np.asarray(failed, bool), valid)


def check_failures(
    shares: np.ndarray, names: tuple[str, ...], max_failed_fraction: float, *, step: int, first_error: str | None
) -> None:
    """Stop the run when a reward failed on more than ``max_failed_fraction`` of a step's rollouts.

    Args:
      shares: [K] `failed_fraction` of the step.
      names: the K reward names.
      step: the step (1-based, as in metrics.jsonl) the rollouts were scored for.
      first_error: `Scores.first_error` of the step.

    Raises:
      RewardFailuresError: naming the step, each reward over the limit with its share, the limit
        and the first error.
    """
    over = [f"{name!r} ({share:.0%})" for name, share in zip(names, np.asarray(shares)) if share > max_failed_fraction]
    if over:
        raise RewardFailuresError(
            f"step {step}: reward{'s' if len(over) > 1 else ''} {', '.join(over)} failed on more than "
            f"config.rewards.max_failed_fraction={max_failed_fraction:g} of the rollouts (scored as the "
            f"minimum, on_error='min'); first error: {first_error}. Fix the reward (or its backend), or "
            "raise config.rewards.max_failed_fraction"
        )


def repeat_columns(columns: dict[str, list[Any]], times: int) -> dict[str, list[Any]]:
    """Each value repeated ``times`` in place (prompt-major rollout order)."""
    return {name: [v for v in values for _ in range(times)] for name, values in columns.items()}
