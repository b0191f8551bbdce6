"""Where per-step metrics go: ``WORKDIR/metrics.jsonl`` (one JSON object per step) and TensorBoard
event files in ``WORKDIR/tensorboard``. On resume the JSONL is cut back to the restored step, so a
resumed run's file equals an uninterrupted run's."""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

from tensorboardX import SummaryWriter

from gd2po_jax import run_dir
from gd2po_jax.run_dir import RunDir


def _plain(value: Any) -> Any:
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends step metrics to JSONL and TensorBoard.

    Args:
      workdir: the run directory (or ``WORKDIR/warm_start_logs`` for the warm start's loss).
      resume_step: the step restored from a checkpoint (None for a fresh run): JSONL lines of later
        steps (written before an interruption) are dropped and TensorBoard purges them.
      tensorboard: write TensorBoard event files too.
    """

    def __init__(self, workdir: str | pathlib.Path, resume_step: int | None = None, tensorboard: bool = True):
        files = RunDir(workdir)
        self.path = files.metrics
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if self.path.exists() and resume_step is not None:
            kept = [r for r in run_dir.read_jsonl(self.path) if r.get("step", 0) <= resume_step]
        run_dir.write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        self._file = self.path.open("a")
        self._tb = None
        if tensorboard:
            # Also on a fresh start: a run killed before its first checkpoint left events behind.
            purge = (resume_step or 0) + 1
            self._tb = SummaryWriter(str(files.tensorboard), purge_step=purge)

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Write one step's metrics (scalars); returns them as plain Python values."""
        record = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        if self._tb is not None:
            for name, value in record.items():
                if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(name, value, int(step))
        return record

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(workdir: str | pathlib.Path) -> list[dict[str, Any]]:
    """The records of ``WORKDIR/metrics.jsonl`` in order."""
    return run_dir.read_jsonl(RunDir(workdir).metrics)
