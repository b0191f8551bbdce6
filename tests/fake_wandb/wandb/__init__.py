"""A stand-in for the ``wandb`` package that records what the trainer asks of it, for the tests of
`gd2po_jax.runtime.wandb_logging` and the trainer (tests/runtime/test_wandb_logging.py,
tests/jobs/test_train.py). Nothing leaves the process.

Every call (``init``, ``Run.log``, ``Run.mark_preempting``, ``Run.finish``) is appended to the
module's ``calls`` as ``{"call": name, ...its arguments}``, and, when the environment variable
``FAKE_WANDB_CALLS`` names a file, to that file as one JSON line (for a ``train.py`` subprocess,
which imports this directory's ``wandb`` when it is on PYTHONPATH). Tests in one process load a fresh
copy of this file per test and put it in ``sys.modules["wandb"]``.
"""

from __future__ import annotations

import json
import os

calls: list[dict] = []


def _record(call: str, **arguments) -> None:
    entry = {"call": call, **arguments}
    calls.append(entry)
    path = os.environ.get("FAKE_WANDB_CALLS")
    if path:
        with open(path, "a") as file:
            file.write(json.dumps(entry, default=str) + "\n")


class Run:
    """What ``wandb.init`` returns: the methods the trainer uses."""

    def __init__(self, id: str):
        self.id = id

    def log(self, data: dict, step: int | None = None) -> None:
        _record("log", data=dict(data), step=step)

    def mark_preempting(self) -> None:
        _record("mark_preempting")

    def finish(self, exit_code: int | None = None) -> None:
        _record("finish", exit_code=exit_code)


def init(**kwargs) -> Run:
    _record("init", **kwargs)
    return Run(kwargs.get("id"))
