"""Where per-step metrics go: ``WORKDIR/metrics.jsonl`` (one JSON object per step) and TensorBoard
event files in ``WORKDIR/tensorboard``.

metrics.jsonl is the record: on resume it is cut back to the restored step (so a resumed run's file
equals an uninterrupted run's; a half-written last line, from a kill or a full disk, is dropped with
a warning), and TensorBoard's event files are then rebuilt from it, so TensorBoard shows exactly
what metrics.jsonl has (a killed process can leave its event file cut in the middle of a record, and
points it wrote after the last flush lost). Non-finite values are written as JSON's non-standard
``NaN``, ``Infinity`` and ``-Infinity``, which Python's `json` (`run_dir.read_jsonl`) reads back as
floats.
"""

from __future__ import annotations

import json
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np
from tensorboardX import SummaryWriter

from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.run_dir import RunDir


def _plain(value: Any) -> Any:
    """A plain Python value (numpy and jax scalars unwrapped); NaN and infinities stay floats."""
    return value.item() if hasattr(value, "item") else value


def jsonl_line(record: dict[str, Any]) -> str:
    """One line of metrics.jsonl: sorted keys, non-finite floats as ``NaN`` / ``Infinity``."""
    return json.dumps(record, sort_keys=True, allow_nan=True) + "\n"


def _scalars(record: dict[str, Any]):
    """(name, value) of the record's numbers, for TensorBoard (not the step, not booleans)."""
    for name, value in record.items():
        if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
            yield name, value


def tensorboard_name(name: str) -> str:
    """``name`` as TensorBoard takes it: ``~`` (``advantages/conflict/<a>~<b>``) becomes ``_``, as
    tensorboardX would do itself after a log line at every step."""
    return name.replace("~", "_")


def rebuild_tensorboard(directory: pathlib.Path, records: list[dict[str, Any]]) -> SummaryWriter:
    """Delete ``directory``'s event files and write ``records`` (metrics.jsonl's) anew; returns the
    open writer, to append to. Idempotent: a kill during the rebuild is repaired by the next one."""
    shutil.rmtree(directory, ignore_errors=True)
    writer = SummaryWriter(str(directory))
    for record in records:
        for name, value in _scalars(record):
            writer.add_scalar(tensorboard_name(name), value, int(record["step"]))
    writer.flush()
    return writer


class MetricsWriter:
    """Appends step metrics to JSONL and TensorBoard.

    Args:
      workdir: the run directory (or ``WORKDIR/warm_start_logs`` for the warm start's loss).
      resume_step: the step restored from a checkpoint (None for a fresh run): JSONL lines of later
        steps (written before an interruption) are dropped, and TensorBoard is rebuilt from what
        remains (`rebuild_tensorboard`).
      tensorboard: write TensorBoard event files too.
    """

    def __init__(self, workdir: str | pathlib.Path, resume_step: int | None = None, tensorboard: bool = True):
        files = RunDir(workdir)
        self.path = files.metrics
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if self.path.exists() and resume_step is not None:
            records = run_dir.read_jsonl(self.path, drop_torn_last_line=True)
            kept = [r for r in records if r.get("step", 0) <= resume_step]
        run_dir.write_text(self.path, "".join(jsonl_line(r) for r in kept))
        self._file = run_dir.open_append(self.path)  # never through a link
        # Also on a fresh start: a run killed before its first checkpoint left events behind.
        self._tb = rebuild_tensorboard(files.tensorboard, kept) if tensorboard else None

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Write one step's metrics (scalars); returns them as plain Python values."""
        record = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        with run_dir.writing(self.path):  # a full disk: WriteFailedError (a torn line is dropped on resume)
            self._file.write(jsonl_line(record))
            self._file.flush()
        if self._tb is not None:
            with run_dir.writing(self._tb.logdir):
                for name, value in _scalars(record):
                    self._tb.add_scalar(tensorboard_name(name), value, int(step))
        return record

    def write_text(self, step: int, tag: str, text: str) -> None:
        """A text summary ``tag`` (e.g. ``completions``) at ``step`` in TensorBoard (nothing without it)."""
        if self._tb is not None:
            with run_dir.writing(self._tb.logdir):
                self._tb.add_text(tag, f"```\n{text}\n```", int(step))

    def close(self) -> None:
        """Flush and close metrics.jsonl and TensorBoard's event file."""
        try:
            with run_dir.writing(self.path):
                self._file.close()
        finally:
            if self._tb is not None:
                with run_dir.writing(self._tb.logdir):
                    self._tb.close()


def reward_sum_metrics(rewards: Any, valid: Any, weights: tuple[float, ...] = ()) -> dict[str, float]:
    """``reward_sum/mean`` and ``reward_sum/std`` of a step: each valid rollout's weighted sum of its
    rewards, ``sum_k w_k r_k`` (an abstained reward, NaN, adds 0; ``weights`` empty: all 1), its mean
    and (population) std over the valid rollouts.

    Args:
      rewards: [P, G, K] float, NaN where a reward abstained. valid: [P] bool. weights: K floats or ().
    """
    values = np.asarray(rewards, np.float64)
    w = np.asarray(weights, np.float64) if len(weights) else np.ones(values.shape[-1])
    totals = np.nansum(values * w, axis=-1)[np.asarray(valid, bool)].reshape(-1)
    if not totals.size:
        return {"reward_sum/mean": float("nan"), "reward_sum/std": float("nan")}
    return {"reward_sum/mean": float(totals.mean()), "reward_sum/std": float(totals.std())}


def completions_table(
    step: int, names: Sequence[str], rewards: Any, completions: Sequence[str], *, width: int = 100
) -> str:
    """A few rollouts of step ``step`` as text (TRL's ``log_completions``): one line per rollout with
    each reward (``-`` where it abstained) and the completion, its newlines shown as ``\\n``, cut to
    ``width`` characters.

    Args:
      names: the K reward columns. rewards: [N, K] float (NaN: abstained). completions: N texts.
    """
    values = np.asarray(rewards, np.float64).reshape(-1, len(names))
    if len(values) != len(completions):
        raise ValueError(f"{len(values)} rows of rewards for {len(completions)} completions")
    header = "  ".join(f"{name[:12]:>12}" for name in names)
    lines = [f"step {step}: {len(completions)} rollouts of its first prompt", f"{header}  completion"]
    for row, text in zip(values, completions):
        cells = "  ".join(f"{'-' if np.isnan(v) else format(v, '.3f'):>12}" for v in row)
        shown = text.replace("\n", "\\n")
        lines.append(f"{cells}  {shown[:width]}{'...' if len(shown) > width else ''}")
    return "\n".join(lines)


def read_metrics(workdir: str | pathlib.Path) -> list[dict[str, Any]]:
    """The records of ``WORKDIR/metrics.jsonl`` in order (non-finite values as float NaN / inf)."""
    return run_dir.read_jsonl(RunDir(workdir).metrics)
