"""Orbax checkpoints of the training state plus the host-side position (data order, step).

A checkpoint is written to a temporary directory and renamed when complete, so a run killed at any
moment (also during a save) resumes from the last complete one.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    """Saves and restores ``(TrainState pytree, JSON metadata)`` under ``directory``.

    Args:
      directory: e.g. ``WORKDIR/checkpoints``.
      keep: how many of the latest checkpoints to keep.
    """

    def __init__(self, directory: str | pathlib.Path, keep: int = 2):
        self.directory = pathlib.Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state: Any, metadata: dict) -> None:
        """Write checkpoint ``step`` (blocking until it is complete on disk)."""
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(metadata)),
            force=True,
        )
        self._manager.wait_until_finished()

    def restore(self, step: int | None, abstract_state: Any) -> tuple[Any, dict]:
        """(state, metadata) of checkpoint ``step`` (default: the latest), placed on the shardings of
        ``abstract_state`` (a pytree of arrays or `jax.ShapeDtypeStruct`s)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if step not in self._manager.all_steps():
            raise FileNotFoundError(
                f"no checkpoint for step {step} in {self.directory}; available: {sorted(self._manager.all_steps())}"
            )
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()),
        )
        return restored.state, dict(restored.meta)

    def close(self) -> None:
        self._manager.close()
