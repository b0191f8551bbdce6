"""Stopping a run for a preemption notice: SIGTERM, SIGUSR1 (SLURM's ``--signal``), a TPU pod's
maintenance event, a spot VM's shutdown (docs/preemption.md).

The trainer wraps its work in a `PreemptionWatch` (``train.preemption_signals``,
``train.preemption_grace_s``), which installs a handler for those signals and restores the previous
ones when it ends. What the first signal does depends on where the run is:

* in the RL loop (`PreemptionWatch.defer`): it is only recorded. The step in flight
  finishes, the processes agree on it (`PreemptionWatch.stop_after_step`: any process told to stop
  stops them all at the same step), that step is checkpointed (even between
  ``checkpoint.every_steps``), the metrics are flushed and `Preempted` is raised; train.py prints
  one line and exits with `exit_code` (128 + the signal's number: 143 for SIGTERM, 138 for SIGUSR1).
* anywhere else (the warm start, the evaluations before and after RL, the export): `Preempted` is
  raised at once. Nothing there is published half-written (every such write is a staging file or
  directory renamed into place; the exception's clean-up or the rerun removes the staging), and the
  rerun redoes that phase from its start.

Ctrl-C (SIGINT) is handled the same way whatever ``train.preemption_signals`` says
(``interrupt=True``): the first finishes the step in flight, checkpoints it and exits with one line
and code 130 (128 + 2) instead of a ``KeyboardInterrupt`` traceback that loses the steps since the last
checkpoint; a second Ctrl-C stops at once (130). The grace timer does not apply to it (the person who
pressed it can press it again).

Either way, the grace timer starts with the first signal: if the run has not exited
``grace_s`` seconds later (a step plus a checkpoint longer than the notice), the process ends at once
with the same exit code, leaving the previous checkpoint (a checkpoint is renamed into place only
when complete). A second signal ends the process at once too.

The exit code is the one a process killed by the signal reports to a shell (128 + signal number),
so a job script or a scheduler that treats "terminated by SIGTERM" as a preemption (a requeue, a
retry) sees the same code as without the handler; a run that ends normally exits 0, a failure 1.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

logger = logging.getLogger(__name__)


class Preempted(BaseException):
    """The run stopped for a preemption signal. ``step`` is the step checkpointed on the way out
    (None when it stopped outside the RL loop); ``exit_code`` the process's exit code. A
    BaseException, as KeyboardInterrupt: raised from the handler at any point outside the RL loop,
    it must not be taken for the failure of what it interrupted (``except Exception`` blocks, such as
    the one that reports an unreadable checkpoint, let it pass)."""

    def __init__(self, message: str, signum: int, step: int | None = None):
        super().__init__(message)
        self.signum, self.step = signum, step

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)


def exit_code(signum: int) -> int:
    """128 + ``signum``: what a shell reports for a process the signal killed (143 for SIGTERM)."""
    return 128 + int(signum)


def signal_numbers(names) -> tuple[int, ...]:
    """The signal numbers of ``names`` (``"SIGTERM"``, ``"SIGUSR1"`` ...).

    Raises:
      ValueError: naming an unknown signal, or SIGKILL / SIGSTOP (which cannot be handled).
    """
    numbers = []
    for name in names:
        number = getattr(signal.Signals, str(name), None) if str(name).startswith("SIG") else None
        if number is None or number in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"{name!r} is not a signal a process can handle (e.g. 'SIGTERM', 'SIGUSR1')")
        numbers.append(int(number))
    return tuple(numbers)


def _hard_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)


class PreemptionWatch:
    """Handlers for ``signals`` while in use as a context manager (the previous ones are restored
    on exit). Outside the main thread it installs nothing (Python delivers signals there only).

    Args:
      signals: signal names (`signal_numbers`).
      grace_s: seconds from the first signal to the process's end at the latest (0: no limit).
      any_process: the agreement of several processes on a flag (default
        `gd2po_jax.runtime.distributed.any_process`: a tiny all-gather, nothing in one process).
      hard_exit: how the process ends at once (tests replace it).
      interrupt: also handle SIGINT (Ctrl-C) as a preemption signal, with no grace timer.
    """

    def __init__(
        self,
        signals=("SIGTERM", "SIGUSR1"),
        grace_s: float = 0.0,
        *,
        any_process: Callable[[bool], bool] | None = None,
        hard_exit: Callable[[int], None] = _hard_exit,
        interrupt: bool = True,
    ):
        numbers = signal_numbers(signals)
        if interrupt and int(signal.SIGINT) not in numbers:
            numbers += (int(signal.SIGINT),)
        self.signals = numbers
        self.grace_s = float(grace_s)
        self._any_process = any_process
        self._hard_exit = hard_exit
        self._previous: dict[int, Any] = {}  # what signal.signal returned: the handlers to put back
        self._deferring = False
        self._timer: threading.Timer | None = None
        self.signum: int | None = None  # the first signal received
        self.received_at: float | None = None

    # -- installing -------------------------------------------------------------------------------

    def __enter__(self) -> PreemptionWatch:
        if threading.current_thread() is threading.main_thread():
            for number in self.signals:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()
        if self._timer is not None:
            self._timer.cancel()

    # -- the handler ------------------------------------------------------------------------------

    @property
    def requested(self) -> bool:
        """Whether a preemption signal arrived in this process."""
        return self.signum is not None

    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "no signal"

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:  # the second signal: at once
            print(
                f"{signal.Signals(signum).name} again: stopping at once (exit code {exit_code(self.signum)}); "
                "the rerun resumes from the latest complete checkpoint",
                file=sys.stderr,
            )
            self._hard_exit(exit_code(self.signum))
            return
        self.signum, self.received_at = signum, time.monotonic()
        timed = self.grace_s > 0 and signum != signal.SIGINT  # Ctrl-C: its second press stops at once
        if timed:
            self._timer = threading.Timer(self.grace_s, self._expire)
            self._timer.daemon = True
            self._timer.start()
        if not self._deferring:
            raise Preempted(
                self._message(
                    "stopped where it was (the warm start, an evaluation or the export: "
                    "not checkpointable mid-way); the rerun redoes it"
                ),
                signum,
            )
        again = " (Ctrl-C again: stop at once, losing the step)" if signum == signal.SIGINT else ""
        print(
            f"{self.name()} received: finishing the step in flight, then saving a checkpoint of it "
            + (f"(at most {self.grace_s:g} s)" if timed else "")
            + again,
            file=sys.stderr,
        )

    def _expire(self) -> None:
        assert self.signum is not None  # the timer starts once a signal arrived
        print(
            f"{self.name()}: the step in flight and its checkpoint did not finish within "
            f"train.preemption_grace_s={self.grace_s:g} s; stopping at once (exit code {exit_code(self.signum)}). "
            "The rerun resumes from the latest complete checkpoint",
            file=sys.stderr,
        )
        self._hard_exit(exit_code(self.signum))

    def _message(self, what: str) -> str:
        assert self.signum is not None  # a signal arrived
        return f"preempted by {self.name()}: {what} (exit code {exit_code(self.signum)})"

    # -- the RL loop ------------------------------------------------------------------------------

    def defer(self, on: bool) -> None:
        """While on (the RL loop), a signal is only recorded: the loop asks `stop_after_step` at
        each step's end. Turning it on raises a signal that arrived before (`check`)."""
        if on:
            self.check()
        self._deferring = bool(on)

    def check(self) -> None:
        """Raise `Preempted` if a signal arrived (a safe point outside the RL loop)."""
        if self.signum is not None:
            raise Preempted(self._message("stopped at a safe point; the rerun resumes"), self.signum)

    def stop_after_step(self) -> bool:
        """Whether to stop after this step: a signal arrived in any process (every process calls
        this once per step, and all get the same answer). On one process a plain flag."""
        agree = self._any_process
        if agree is None:
            from gd2po_jax.runtime import distributed

            agree = distributed.any_process
        stop = bool(agree(self.signum is not None))
        if stop and self.signum is None:  # told by another process
            self.signum = int(self.signals[0]) if self.signals else int(signal.SIGTERM)
            self.received_at = time.monotonic()
            if self.grace_s > 0 and self._timer is None:
                self._timer = threading.Timer(self.grace_s, self._expire)
                self._timer.daemon = True
                self._timer.start()
        return stop

    def stopped(self, step: int, checkpoint) -> Preempted:
        """The `Preempted` to raise once ``step`` is checkpointed in ``checkpoint``."""
        assert self.signum is not None  # a signal arrived (stop_after_step said so)
        waited = time.monotonic() - self.received_at if self.received_at is not None else 0.0
        return Preempted(
            f"preempted by {self.name()}: saved step {step} in {checkpoint} {waited:.1f} s after the "
            f"signal; rerun the same command to resume (exit code {exit_code(self.signum)})",
            self.signum,
            step,
        )
