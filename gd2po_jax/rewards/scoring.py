"""Scoring rollouts on the host: reward functions over decoded texts, side by side.

Reward functions are plain Python over strings; `score_batch` runs them on N responses and returns
the [N, K] float32 rewards with the [N, K] mask of failed values. Three outcomes per value:

  a finite number   the reward
  NaN               the function abstained (returned NaN or None): the reward is missing for that
                    rollout and moves no statistic of the advantages; `abstained_fraction` is the
                    share the trainer logs per reward
  a failure         the function raised, or gave no result in time (the step's deadline
                    ``config.rewards.timeout_s``, or its entry's own ``timeout_s`` per call): with
                    ``on_error='raise'`` the run stops naming the function and the rollout; with
                    ``'min'`` the failed function's rewards of that rollout are its ``min_values``, with
                    ``'abstain'`` NaN; the value is marked failed, `failed_fraction` is the share the
                    trainer logs per reward (``reward_failed/<name>``), and `check_failures` stops the
                    run when more than ``config.rewards.max_failed_fraction`` of a step's rollouts failed

A value that is neither (+-inf, a string such as "2.5", a bool from the batch interface) is a bug in
the reward function and always raises `RewardOutputError` naming the reward, the rollout and the
value, whatever ``on_error`` says. So does anything a reward raises that is not an ``Exception``
(``SystemExit`` from ``sys.exit()``, ``KeyboardInterrupt``, ...): one line naming the function.

Side by side: each function's rollouts are cut into chunks (``num_workers`` chunks for one function;
the workers dealt out among several), and every chunk of every function is one call; at most
``num_workers`` calls are in flight at once. Plain functions run on a pool of daemon threads that lives
as long as the process; ``async def`` functions run as tasks of one event loop (its own thread),
gathered across chunks and functions. Functions that score with device programs
(``scores_on_devices``: reward models) run one call at a time, in order, so that every process of a
multi-host run issues their programs in the same order. A chunk whose call raises is scored again row
by row, to find (and floor or abstain) the rollouts it fails on.

Timeouts: Python cannot stop a thread, so a call that hangs is abandoned, not stopped: it keeps its
thread until it returns (an async call is cancelled: that stops it at its next ``await``), its late
result is dropped, and the pool starts a thread in its place. A function with an abandoned call still
running is not called again until that call returns: its rollouts fail at once (``on_error``), so a
reward that hangs on every call holds at most its chunks' threads, never one more per step
(`abandoned_calls`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
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
    """A reward function gave no result in time (with on_error='raise')."""


class RewardFailuresError(RewardError):
    """More of a step's rollouts failed than ``config.rewards.max_failed_fraction`` allows."""


class RewardMinimumError(RewardError):
    """on_error='min' for a reward function that declares no minimum to score a failed rollout with."""


@dataclasses.dataclass(frozen=True)
class Scores:
    """The rewards of N rollouts and which of them failed.

    rewards: [N, K] float32; NaN where a reward abstained, the function's minimum where it failed
      (on_error='min'), NaN where it failed with on_error='abstain'.
    failed: [N, K] bool, True where the reward function raised or timed out.
    first_error: what went wrong on the first failed rollout (function, rollout, error); None when
      nothing failed.
    """

    rewards: np.ndarray
    failed: np.ndarray
    first_error: str | None = None


def reward_minimums(reward_fn: RewardFunction) -> np.ndarray:
    """[K] minimum of each reward, from the function's ``min_values`` (required for on_error=min).

    Raises:
      RewardMinimumError: the function declares none (one line: what to set instead).
    """
    minimums = getattr(reward_fn, "min_values", None)
    if minimums is None:
        raise RewardMinimumError(
            f"on_error='min' needs a minimum of reward function {function_label(reward_fn)} to score its "
            "failed rollouts with: give its entry of config.rewards.functions a min_value (e.g. "
            "{'fn': ..., 'on_error': 'min', 'min_value': 0.0}), or use on_error='abstain' (failed rollouts "
            "left unscored) or 'raise'"
        )
    return np.asarray(minimums, np.float32)


def reward_functions(reward_fn: RewardFunction) -> tuple[RewardFunction, ...]:
    """The functions scored one by one: those of a `CombinedReward` (so that one failing function
    floors only its own columns), else ``reward_fn`` itself."""
    return reward_fn.functions if isinstance(reward_fn, CombinedReward) else (reward_fn,)


def failure_modes(reward_fn: RewardFunction, on_error: str) -> tuple[str, ...]:
    """[K] what a failure of each reward column does: its function's own ``on_error`` (an entry of
    config.rewards.functions may set one), else ``on_error``."""
    return tuple(getattr(fn, "on_error", None) or on_error for fn in reward_functions(reward_fn) for _ in fn.names)


def _advice(reward_fn, first: str = "Fix the reward") -> str:
    """What to do so that a failure of ``reward_fn`` does not stop the run (with on_error='raise'), in
    words that work when followed: on_error='min' only where the function has a minimum, else with the
    min_value it needs; reward models, whose on_error is always 'raise', get none."""
    if getattr(reward_fn, "scores_on_devices", False):
        return f"{first}; a reward model's rewards.on_error is always 'raise'"
    where = (
        f"config.rewards.functions[{reward_fn.entry.index}]'s on_error"
        if hasattr(reward_fn, "entry")
        else "config.rewards.on_error"
    )
    if getattr(reward_fn, "min_values", None) is not None:
        return (
            f"{first}, or set {where} to 'min' (score such rollouts as its minimum) or 'abstain' (leave them unscored)"
        )
    return (
        f"{first}, or set {where} to 'abstain' (leave such rollouts unscored), or to 'min' with a min_value "
        "(the score of a failed rollout)"
    )


# ---------------------------------------------------------------- where calls run


class _Workers:
    """Daemon threads running calls from a queue, kept for the life of the process and reused by every
    step. A thread stuck in an abandoned call is replaced (`abandon`); when that call returns at last,
    its thread leaves if the pool has enough without it: the pool keeps ``size`` threads free to work,
    plus one per abandoned call still running."""

    def __init__(self, size: int):
        self.size, self.alive, self.stuck = size, 0, 0
        self.jobs: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        for _ in range(size):
            self._start_thread()

    def _start_thread(self) -> None:
        with self.lock:
            self.alive += 1
        threading.Thread(target=self._work, name="gd2po-reward", daemon=True).start()

    def _work(self) -> None:
        while True:
            call = self.jobs.get()
            if call is None:
                with self.lock:
                    self.alive -= 1
                return
            call.run()
            with self.lock:
                if call.abandoned:
                    self.stuck -= 1
                if self.alive - self.stuck > self.size:
                    self.alive -= 1
                    return

    def resize(self, size: int) -> None:
        """Keep ``size`` threads free to work (more are started, or told to leave when idle)."""
        with self.lock:
            change, self.size = size - self.size, size
        for _ in range(change):
            self._start_thread()
        for _ in range(-change):
            self.jobs.put(None)

    def submit(self, call: _Call) -> None:
        self.jobs.put(call)

    def abandon(self, call: _Call) -> None:
        """``call`` (running on a thread of this pool) is abandoned: one more thread takes its place."""
        with self.lock:
            self.stuck += 1
        self._start_thread()


class _EventLoop:
    """One asyncio event loop on its own daemon thread: the ``async def`` reward functions' calls run on
    it as tasks, gathered across chunks and functions."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="gd2po-reward-loop", daemon=True).start()

    def submit(self, call: _Call) -> None:
        self.loop.call_soon_threadsafe(self._start_task, call)

    def _start_task(self, call: _Call) -> None:
        if call.abandoned:  # timed out before the loop got to it
            call.finish()
            return
        call.task = self.loop.create_task(call.arun())
        call.task.add_done_callback(lambda _: call.finish())

    def abandon(self, call: _Call) -> None:
        """Cancel ``call``'s task (it stops at its next ``await``)."""
        self.loop.call_soon_threadsafe(lambda: call.task.cancel() if call.task is not None else None)

    def responsive(self, wait_s: float = 1.0) -> bool:
        """Whether the loop runs callbacks (a coroutine that blocks without awaiting stops it)."""
        ran = threading.Event()
        self.loop.call_soon_threadsafe(ran.set)
        return ran.wait(wait_s)


_LOCK = threading.Lock()  # guards the module's state below, and each call's finished / abandoned flags
_WORKERS: _Workers | None = None
_LOOP: _EventLoop | None = None
_ABANDONED: list[_Call] = []  # calls abandoned at their deadline that had not returned when last looked at


def _workers(size: int) -> _Workers:
    """The process's worker pool, with at least ``size`` threads free to work (it grows to the largest
    ``num_workers`` asked for, never past it)."""
    global _WORKERS
    with _LOCK:
        if _WORKERS is None:
            _WORKERS = _Workers(size)
            return _WORKERS
    if _WORKERS.size < size:
        _WORKERS.resize(size)
    return _WORKERS


def _event_loop() -> _EventLoop:
    """The reward functions' event loop; a new one when the last is blocked (a coroutine that never
    awaits): the calls that waited on the blocked loop are dropped, the one blocking it stays abandoned."""
    global _LOOP
    with _LOCK:
        loop = _LOOP
        waiting_on_it = any(c.is_async and not c.finished for c in _ABANDONED)
    if loop is not None and waiting_on_it and not loop.responsive():
        with _LOCK:
            for call in _ABANDONED:
                if call.is_async and call.started is None:
                    call.finished = True  # never ran and never will: its function is not hung
        loop = None
    if loop is None:
        loop = _EventLoop()
        with _LOCK:
            _LOOP = loop
    return loop


def abandoned_calls() -> int:
    """Reward calls abandoned at their deadline that have not returned yet (each holds a thread, or a
    task of the event loop)."""
    with _LOCK:
        _ABANDONED[:] = [c for c in _ABANDONED if not c.finished]
        return len(_ABANDONED)


def _hung(fn) -> _Call | None:
    """An abandoned call of ``fn`` that is still running, if any."""
    with _LOCK:
        _ABANDONED[:] = [c for c in _ABANDONED if not c.finished]
        return next((c for c in _ABANDONED if c.fn is fn), None)


# ---------------------------------------------------------------- one call


class _Call:
    """One call of a reward function on rollouts ``first .. first + n - 1`` of the step (a chunk, or one
    row of a chunk that raised), run on the worker threads or the event loop.

    After it finishes: ``value`` (what the function returned) or ``error`` (what it raised, any
    BaseException). ``timed_out``: it gave no result by its deadline and was abandoned, or never started.
    """

    def __init__(self, fn, index: int, prompts, responses, columns, first: int, *, row: bool, timeout_s: float):
        self.fn, self.index, self.first, self.row = fn, index, first, row
        self.prompts, self.responses, self.columns = prompts, responses, columns
        self.timeout_s = timeout_s  # the function's own limit per call (0: none)
        self.is_async = bool(getattr(fn, "is_async", False)) and hasattr(fn, "acall")
        self.exclusive = bool(getattr(fn, "scores_on_devices", False))
        self.dispatched: float | None = None  # when handed to a thread or the loop (its own limit counts from then)
        self.started: float | None = None  # when it began to run
        self.value: Any = None
        self.error: BaseException | None = None
        self.finished = self.abandoned = self.timed_out = False
        self.task: asyncio.Task | None = None
        self.hung: _Call | None = None  # not made: this earlier call of its function still runs
        self.done: queue.SimpleQueue[_Call] | None = None

    @property
    def n(self) -> int:
        return len(self.responses)

    def run(self) -> None:
        """The call, on a worker thread (its end is `finish`)."""
        self.started = time.monotonic()
        try:
            self.value = self.fn(self.prompts, self.responses, self.columns)
        except BaseException as err:  # noqa: BLE001 - the scorer decides (SystemExit included)
            self.error = err
        finally:
            self.finish()

    async def arun(self) -> None:
        """The call, as a task of the event loop (its end is `finish`, from the task's done callback)."""
        self.started = time.monotonic()
        try:
            self.value = await self.fn.acall(self.prompts, self.responses, self.columns)
        except BaseException as err:  # noqa: BLE001 - CancelledError too: only after abandoning it
            self.error = err

    def finish(self) -> None:
        with _LOCK:
            self.finished = True
        if self.done is not None:
            self.done.put(self)

    def deadline(self, step_deadline: float | None) -> float | None:
        """When this call (dispatched) times out: the step's deadline, or its own limit if sooner."""
        own = self.dispatched + self.timeout_s if self.timeout_s and self.dispatched is not None else None
        ends = [d for d in (step_deadline, own) if d is not None]
        return min(ends) if ends else None


_WAKE: Any = object()
"""Put in a scheduler's queue of finished calls to end its wait (`_Scheduler.wake`)."""


class _Scheduler:
    """Runs calls at most ``limit`` at a time, yielding each when it has finished or timed out."""

    def __init__(self, limit: int, step_deadline: float | None):
        self.limit, self.step_deadline = max(1, limit), step_deadline
        self.waiting: collections.deque[_Call] = collections.deque()
        self.running: list[_Call] = []
        self.done: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self.skipped: list[_Call] = []  # calls not made: an abandoned call of their function still runs

    def add(self, call: _Call) -> None:
        self.waiting.append(call)

    def _start(self, call: _Call) -> None:
        call.done, call.dispatched = self.done, time.monotonic()
        self.running.append(call)
        if call.is_async:
            _event_loop().submit(call)
        else:
            _workers(self.limit).submit(call)

    def _start_what_fits(self) -> None:
        for call in list(self.waiting):
            if len(self.running) >= self.limit:
                return
            if call.exclusive and any(c.exclusive for c in self.running):
                continue
            self.waiting.remove(call)
            hung = _hung(call.fn)
            if hung is not None:
                call.hung = hung
                self.skipped.append(call)
            else:
                self._start(call)

    def _abandon(self, call: _Call) -> bool:
        """Give up on a running call at its deadline; False when it has just finished."""
        with _LOCK:
            if call.finished:
                return False
            call.abandoned = call.timed_out = True
            _ABANDONED.append(call)
        if call.is_async:
            _event_loop().abandon(call)
        else:
            _workers(self.limit).abandon(call)
        return True

    @property
    def idle(self) -> bool:
        """No call waits, runs or is to be reported."""
        return not (self.waiting or self.running or self.skipped)

    def wake(self) -> None:
        """Ends a `next_calls` that is waiting for a call to finish (another thread added calls)."""
        self.done.put(_WAKE)

    def __iter__(self) -> Iterator[_Call]:
        """Every call, as each finishes or times out (waits for them)."""
        while not self.idle:
            yield from self.next_calls()

    def next_calls(self) -> Iterator[_Call]:
        """Starts what fits, then the calls that have finished or timed out, waiting for one (or
        for `wake`) when none has."""
        self._start_what_fits()
        while self.skipped:
            yield self.skipped.pop(0)
        now = time.monotonic()
        for call in list(self.running):
            end = call.deadline(self.step_deadline)
            if end is not None and now >= end and self._abandon(call):
                self.running.remove(call)
                yield call
        if self.step_deadline is not None and now >= self.step_deadline:
            while self.waiting:  # never started: failed by the step's deadline
                call = self.waiting.popleft()
                call.timed_out = True
                yield call
        if not self.running:
            return
        ends = [e for e in (c.deadline(self.step_deadline) for c in self.running) if e is not None]
        try:
            call = self.done.get(timeout=max(0.0, min(ends) - now) + 1e-3 if ends else None)
        except queue.Empty:
            return
        if call is not _WAKE and call in self.running and not call.abandoned:
            self.running.remove(call)
            yield call


# ---------------------------------------------------------------- what a failed call means


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

    def _outcome(self, message: str, reward_fn, error: type[RewardError] = RewardError) -> str:
        """``message`` as the failure of its rollouts; raised (with what to do) with on_error='raise'."""
        if self.on_error == "raise":
            raise error(f"{message}. {_advice(reward_fn)}")
        return message

    def timed_out(self, call: _Call) -> str:
        """The failure message of a call that got no result in time."""
        fn, rollouts = call.fn, _rollouts(call.first, call.first + call.n - 1)
        if (
            call.dispatched is not None
            and call.timeout_s
            and call.dispatched + call.timeout_s <= (self.deadline or np.inf)
        ):
            limit = f"its timeout_s={call.timeout_s:g} s per call (its entry of config.rewards.functions)"
        else:
            limit = f"config.rewards.timeout_s={self.timeout_s:g} s of the step's scoring"
        message = (
            f"reward function {function_label(fn)} gave no result for {rollouts} within {limit} (the call "
            f"is {'abandoned: its thread cannot be stopped' if call.started is not None else 'not made'})"
        )
        if self.on_error == "raise":
            raise RewardTimeoutError(f"{message}. {_advice(fn, 'Fix or speed up the reward, raise the timeout')}")
        return message

    def still_running(self, call: _Call, hung: _Call) -> str:
        """The failure message of a call not made because an abandoned call of its function still runs."""
        message = (
            f"reward function {function_label(call.fn)} was not called for "
            f"{_rollouts(call.first, call.first + call.n - 1)}: its call on an earlier batch "
            f"({_rollouts(hung.first, hung.first + hung.n - 1)}) gave no result in time and is still running"
        )
        return self._outcome(message, call.fn, RewardTimeoutError)

    def raised(self, call: _Call, response: str) -> str:
        """The failure message of a one-row call that raised ``call.error`` (an Exception)."""
        error = call.error
        if self.on_error == "raise":
            raise RewardError(
                f"reward function {function_label(call.fn)} failed on rollout {call.first} (response "
                f"{response[:200]!r}): {type(error).__name__}: {error}. {_advice(call.fn)}"
            ) from error
        return (
            f"reward function {function_label(call.fn)} failed on rollout {call.first}: {type(error).__name__}: {error}"
        )


def _rollouts(first: int, last: int) -> str:
    return f"rollout {first}" if first == last else f"rollouts {first}-{last}"


def _stopped(call: _Call) -> RewardError:
    """The one-line error of a reward that raised something that is not an Exception (SystemExit,
    KeyboardInterrupt, ...): the run stops, whatever on_error says, naming the function."""
    error = call.error
    shown = f"{type(error).__name__}({', '.join(map(repr, getattr(error, 'args', ())))})"
    return RewardError(
        f"reward function {function_label(call.fn)} raised {shown} on "
        f"{_rollouts(call.first, call.first + call.n - 1)}: a reward function returns its rewards or raises an "
        "Exception (handled by on_error); sys.exit() or a BaseException inside one stops the run here"
    )


def _own_timeout(reward_fn) -> float:
    """The function's own limit per call, in seconds (its entry's ``timeout_s``; 0: none)."""
    return float(getattr(reward_fn, "timeout_s", None) or 0.0)


# ---------------------------------------------------------------- the step's calls


def _chunk_counts(num_functions: int, num_workers: int, n: int) -> list[int]:
    """Chunks per function: ``num_workers`` for one function (as many as rollouts at most); with
    several, the workers dealt out among them (at least one chunk each)."""
    base, extra = divmod(max(1, num_workers), num_functions)
    return [max(1, min(n, base + (f < extra))) for f in range(num_functions)]


def _chunk_calls(functions, prompts, responses, columns, first_rollout: int, num_workers: int) -> list[_Call]:
    """Every function's chunk calls, the first chunk of each function first (so that all start together)."""
    n = len(responses)
    per_function = []
    for index, (fn, count) in enumerate(zip(functions, _chunk_counts(len(functions), num_workers, n))):
        bounds = np.linspace(0, n, count + 1).astype(int)
        per_function.append(
            [
                _Call(
                    fn,
                    index,
                    prompts[a:b],
                    responses[a:b],
                    {k: v[a:b] for k, v in columns.items()},
                    first_rollout + int(a),
                    row=False,
                    timeout_s=_own_timeout(fn),
                )
                for a, b in zip(bounds[:-1], bounds[1:])
            ]
        )
    return [calls[j] for j in range(max(map(len, per_function))) for calls in per_function if j < len(calls)]


def _row_calls(call: _Call) -> list[_Call]:
    """``call``'s rollouts one by one (a chunk that raised: which rollouts does it fail on?)."""
    return [
        _Call(
            call.fn,
            call.index,
            call.prompts[i : i + 1],
            call.responses[i : i + 1],
            {name: values[i : i + 1] for name, values in call.columns.items()},
            call.first + i,
            row=True,
            timeout_s=call.timeout_s,
        )
        for i in range(call.n)
    ]


def _settle(call: _Call, policy: _Policy, rows: list[Any], scheduler: _Scheduler, first_rollout: int) -> None:
    """Write what ``call`` gave into ``rows`` (the function's N outcomes: [K] values, or a failure
    message), or queue its rows one by one when a chunk raised.

    Raises:
      RewardError, RewardTimeoutError: a failure with on_error='raise'; a BaseException that is not an
        Exception, whatever on_error says.
      RewardOutputError: a value that is not a reward, naming the rollout of the step.
    """
    offset = call.first - first_rollout
    if call.hung is not None:
        message = policy.still_running(call, call.hung)
    elif call.timed_out:
        message = policy.timed_out(call)
    elif call.error is None:
        try:
            values = check_reward_output(call.fn, call.value, call.n)
        except RewardOutputError as err:
            raise err.shifted(call.first) from None
        rows[offset : offset + call.n] = list(values)
        return
    elif isinstance(call.error, RewardOutputError):  # raised by the function's own check (TRL form, combined)
        raise call.error.shifted(call.first) from None
    elif not isinstance(call.error, Exception):
        raise _stopped(call) from None
    elif not call.row and call.n > 1:
        for row_call in _row_calls(call):
            scheduler.add(row_call)
        return
    else:
        message = policy.raised(call, call.responses[0])
    rows[offset : offset + call.n] = [message] * call.n


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
    failed values; every function of a `CombinedReward` on its own (a failing function fails only its
    columns), all side by side, at most ``num_workers`` calls at once (the module docstring).

    Args:
      timeout_s: the scoring of the whole batch (every function, every chunk) must end this many
        seconds after it starts; calls still running then fail (``on_error``). 0: no limit. A function
        with its own ``timeout_s`` (an entry of config.rewards.functions) fails a call that runs longer.
      first_rollout: the step's number of the first response, for messages (a process of a
        multi-host run scores the step's rollouts from there on).

    Raises:
      RewardError: a reward function raised on a rollout (with ``on_error='raise'``), or raised a
        BaseException that is not an Exception (SystemExit ...).
      RewardTimeoutError: a reward function gave no result in time (with ``on_error='raise'``).
      RewardMinimumError: on_error='min' for a function without ``min_values``.
      RewardOutputError: a reward function returned a value that is neither a finite number nor
        an abstention, or the wrong shape.
    """
    scorer = StreamScorer(
        reward_fn,
        len(responses),
        on_error=on_error,
        num_workers=num_workers,
        timeout_s=timeout_s,
        first_rollout=first_rollout,
        background=False,
    )
    scorer.add(0, prompts, responses, columns)
    return scorer.result()


class StreamScorer:
    """`score_batch` fed a part at a time: the N responses arrive in parts (a prompt's group as the
    rollout engine completes it) and the caller goes on (decoding the rest) while a thread of the
    scorer's own makes their calls (at most ``num_workers`` at once, the next one as soon as one
    ends); `result` waits for what is still to come and returns the `Scores` of all N, the same as
    `score_batch` on the whole batch gives for functions that score each rollout on its own (as they
    must: calls already see chunks of a batch). The deadline ``timeout_s`` counts from the
    construction; the failures are logged once, by `result`.

        scorer = StreamScorer(reward_fn, n, on_error="min")
        scorer.add(first, prompts, responses, columns)  # rollouts first .. first + len(responses) - 1
        scores = scorer.result()

    Raises what `score_batch` raises: from `result`, or from an `add` after the scoring has failed.
    ``background=False`` makes the calls in `result`, in the caller's thread (`score_batch`).
    """

    def __init__(
        self,
        reward_fn: RewardFunction,
        n: int,
        *,
        on_error: str = "raise",
        num_workers: int = 1,
        timeout_s: float = 0.0,
        first_rollout: int = 0,
        background: bool = True,
    ):
        self.functions = reward_functions(reward_fn)
        step = _Policy(on_error, time.monotonic() + timeout_s if timeout_s else None, timeout_s)
        self.policies = [step.of(fn) for fn in self.functions]
        for fn, policy in zip(self.functions, self.policies):
            if policy.on_error == "min":
                reward_minimums(fn)  # fail early, not on the first bad rollout
        self.n, self.num_workers, self.first_rollout = n, num_workers, first_rollout
        self.outcomes: list[list[Any]] = [[None] * n for _ in self.functions]
        self.added = np.zeros(n, bool)
        self.scheduler = _Scheduler(num_workers, step.deadline)
        self._parts: queue.SimpleQueue[list[_Call] | None] = queue.SimpleQueue()  # None: no more parts
        self._driver = threading.Thread(target=self._drive, name="reward-scoring", daemon=True) if background else None
        self._error: BaseException | None = None
        self._progress = threading.Condition()  # notified when calls settle (`rewards_of` waits on it)

    def add(self, first: int, prompts: list[str], responses: list[str], columns: dict[str, list[Any]]) -> None:
        """Start scoring responses ``first .. first + len(responses) - 1`` of the N (columns: per response)."""
        stop = first + len(responses)
        if first < 0 or stop > self.n or self.added[first:stop].any():
            raise ValueError(f"responses {first}..{stop - 1} are outside the {self.n} or were added before")
        if self._error is not None:
            raise self._error
        self.added[first:stop] = True
        self._parts.put(
            _chunk_calls(self.functions, prompts, responses, columns, self.first_rollout + first, self.num_workers)
        )
        if self._driver is not None:
            if self._driver.ident is None:
                self._driver.start()
            self.scheduler.wake()

    def rewards_of(self, first: int, stop: int) -> np.ndarray:
        """The [stop - first, K] rewards of responses ``first .. stop - 1`` (added before), as `result`
        will give them (a failure: NaN or the minimum, per ``on_error``), once their calls have all
        settled: waits for them while the scorer's thread goes on with the others. Raises what
        `result` would."""
        if not self.added[first:stop].all():
            raise ValueError(f"responses {first}..{stop - 1} of the {self.n} were not all added")
        if self._driver is None:
            raise ValueError("rewards_of needs the scorer's own thread (background=True)")
        with self._progress:
            while self._error is None and any(row is None for rows in self.outcomes for row in rows[first:stop]):
                self._progress.wait()
        if self._error is not None:
            raise self._error
        return np.concatenate(
            [
                self._values(fn, policy, rows[first:stop])[0]
                for fn, policy, rows in zip(self.functions, self.policies, self.outcomes)
            ],
            axis=1,
        )

    @staticmethod
    def _values(fn, policy: _Policy, rows: list[Any]) -> tuple[np.ndarray, list[str | None]]:
        """The [n, K] values of one function's settled outcomes (a failure's per ``on_error``) and
        the failure messages (None where it scored)."""
        errors = [row if isinstance(row, str) else None for row in rows]
        values = np.empty((len(rows), len(fn.names)), np.float32)  # K known now: a first call fixes components
        for i, (row, error) in enumerate(zip(rows, errors)):
            values[i] = row if error is None else policy.failed_values(fn)
        return values, errors

    def result(self, count: int | None = None) -> Scores:
        """The `Scores` of all N responses (``count``: of the first ``count``, the ones added, when the
        caller added no more: a refilled engine run's), once every call has finished or failed."""
        if self._error is not None:
            raise self._error
        count = self.n if count is None else count
        if not self.added[:count].all() or self.added[count:].any():
            missing = int(np.argmin(self.added[:count])) if not self.added[:count].all() else count
            raise ValueError(f"response {missing} of the {count} was never added, or one after them was")
        self._parts.put(None)
        if self._driver is None or self._driver.ident is None:
            self._drive()
        else:
            self.scheduler.wake()
            self._driver.join()
        if self._error is not None:
            raise self._error
        rewards, failed, first_errors = [], [], []
        for fn, policy, all_rows in zip(self.functions, self.policies, self.outcomes):
            rows = all_rows[:count]
            values, errors = self._values(fn, policy, rows)
            rewards.append(values)
            failed.append(np.repeat(np.array([e is not None for e in errors], bool)[:, None], values.shape[1], axis=1))
            bad = [e for e in errors if e is not None]
            if bad:
                outcome = "left unscored" if policy.on_error == "abstain" else "scored as the minimum"
                logger.warning(
                    "reward function %s failed on %d of %d rollouts (%s); first: %s",
                    function_label(fn),
                    len(bad),
                    count,
                    outcome,
                    bad[0],
                )
                first_errors.append((errors.index(bad[0]), bad[0]))
        return Scores(
            rewards=np.concatenate(rewards, axis=1).astype(np.float32),
            failed=np.concatenate(failed, axis=1),
            first_error=min(first_errors)[1] if first_errors else None,
        )

    def _take_parts(self, block: bool) -> bool:
        """Hands the parts added so far to the scheduler (waiting for one when ``block``); False once
        `result` has said that no more will come."""
        more = True
        while True:
            try:
                part = self._parts.get(block=block)
            except queue.Empty:
                return more
            block = False
            if part is None:
                more = False
            else:
                for call in part:
                    self.scheduler.add(call)

    def _drive(self) -> None:
        """Makes the calls of every part and settles them, until `result` says the parts are all in."""
        try:
            more = True
            while True:
                more = self._take_parts(block=False) and more
                if self.scheduler.idle:
                    if not more:
                        return
                    more = self._take_parts(block=True)
                    continue
                for call in self.scheduler.next_calls():
                    _settle(
                        call, self.policies[call.index], self.outcomes[call.index], self.scheduler, self.first_rollout
                    )
                with self._progress:
                    self._progress.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the caller by add, result and rewards_of
            self._error = err
            with self._progress:
                self._progress.notify_all()


def call_reward(
    reward_fn: RewardFunction,
    prompts: Sequence[str],
    responses: Sequence[str],
    columns: dict[str, Any],
    *,
    timeout_s: float = 0.0,
) -> Any:
    """What one call ``reward_fn(prompts, responses, columns)`` returns, made as `score_batch` makes its
    calls (a worker thread or the event loop) under the same deadlines: ``timeout_s`` (0: none) and the
    function's own ``timeout_s`` (the trial call before compute, `gd2po_jax.rewards.user_functions.trial_call`).

    Raises:
      RewardTimeoutError: no result in time (the call is abandoned), naming the function and the limit.
      RewardError: it raised a BaseException that is not an Exception (SystemExit ...).
      Exception: what the function raised.
    """
    scheduler = _Scheduler(1, time.monotonic() + timeout_s if timeout_s else None)
    call = _Call(reward_fn, 0, list(prompts), list(responses), columns, 0, row=False, timeout_s=_own_timeout(reward_fn))
    scheduler.add(call)
    for call in scheduler:
        policy = _Policy("raise", scheduler.step_deadline, timeout_s)
        if call.hung is not None:
            policy.still_running(call, call.hung)
        if call.timed_out:
            policy.timed_out(call)
        if call.error is not None and not isinstance(call.error, Exception):
            raise _stopped(call) from None
        if call.error is not None:
            raise call.error
    return call.value


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
    shares: np.ndarray,
    names: tuple[str, ...],
    max_failed_fraction: float,
    *,
    step: int,
    first_error: str | None,
    modes: Sequence[str] | None = None,
) -> None:
    """Stop the run when a reward failed on more than ``max_failed_fraction`` of a step's rollouts.

    Args:
      shares: [K] `failed_fraction` of the step.
      names: the K reward names.
      step: the step (1-based, as in metrics.jsonl) the rollouts were scored for.
      first_error: `Scores.first_error` of the step.
      modes: [K] each reward's on_error (`failure_modes`), named in the message; None: 'min'.

    Raises:
      RewardFailuresError: naming the step, each reward over the limit with its share, the limit,
        what its failed rollouts got and the first error.
    """
    modes = tuple(modes) if modes is not None else ("min",) * len(names)
    over = [k for k, share in enumerate(np.asarray(shares)) if share > max_failed_fraction]
    if over:
        shown = ", ".join(f"{names[k]!r} ({float(shares[k]):.0%})" for k in over)
        handled = sorted({modes[k] for k in over})
        outcome = " / ".join(
            "scored as the minimum, on_error='min'" if mode == "min" else f"left unscored, on_error={mode!r}"
            for mode in handled
        )
        raise RewardFailuresError(
            f"step {step}: reward{'s' if len(over) > 1 else ''} {shown} failed on more than "
            f"config.rewards.max_failed_fraction={max_failed_fraction:g} of the rollouts ({outcome}); first "
            f"error: {first_error}. Fix the reward (or its backend), or raise config.rewards.max_failed_fraction"
        )


def repeat_columns(columns: dict[str, list[Any]], times: int) -> dict[str, list[Any]]:
    """Each value repeated ``times`` in place (prompt-major rollout order)."""
    return {name: [v for v in values for _ in range(times)] for name, values in columns.items()}
