"""Orbax checkpoints of a run (``WORKDIR/checkpoints``) and the integrity checks of saved arrays.

A checkpoint records a checksum of every array in its metadata (`state_integrity`), so a damaged
one is found on restore (`CorruptCheckpointError`), and the trainer falls back to the previous
intact one (`Checkpoints.restore_intact`), moving the damaged ones to ``corrupt_checkpoints/``.
NaN or infinite parameters are never written: `Checkpoints.save` refuses them, and `check_finite`
is the same check for the other writers of parameters (the exported policy, the warm start, a
trained reward model), all raising `NonFiniteError`.

The paths, the lock and the other files of a workdir are `gd2po_jax.runtime.run_dir`'s.
"""

from __future__ import annotations

import logging
import os
import pathlib
import time
from typing import Any, cast

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from gd2po_jax.errors import UserError
from gd2po_jax.runtime import distributed, run_dir
from gd2po_jax.runtime.run_dir import RunDirError

logger = logging.getLogger(__name__)


class CorruptCheckpointError(RunDirError):
    """A checkpoint that cannot be restored, or whose arrays differ from what was saved; the
    message names its directory."""


class NonFiniteError(UserError, ValueError):
    """Arrays with NaN or infinite values where finite ones are needed (a checkpoint, or parameters
    about to be written: the policy, the warm start, a reward model); the message names them."""


CHECKSUMS_KEY = "checksums"  # in a checkpoint's metadata: array name -> `state_integrity` checksum


def leaf_name(path) -> str:
    """``params/layers/0/attn/q_kernel``: a pytree path (`jax.tree_util.tree_flatten_with_path`)
    as a plain name, the same for a dataclass field and a dict key of that name."""
    parts = []
    for key in path:
        for attr in ("name", "key", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def _bits(x: jax.Array) -> jax.Array:
    """The bit patterns of ``x``'s elements as uint32 (narrower types zero-extended)."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[x.dtype.itemsize]
    return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


@jax.jit
def _integrity(leaves: list[jax.Array]) -> tuple[list[jax.Array], list[jax.Array]]:
    checksums = [jnp.sum(_bits(x), dtype=jnp.uint32) for x in leaves]
    finite = [jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.bool_(True) for x in leaves]
    return checksums, finite


def state_integrity(tree: Any) -> tuple[dict[str, int], list[str]]:
    """(checksum of each array by `leaf_name`, the names of the arrays with a NaN or infinity).

    The checksum is the sum of the array's bit patterns modulo 2**32: exact integer arithmetic,
    so it does not depend on how the array is sharded, and any single flipped bit changes it.
    Computed on the devices; only one number per array comes back.
    """
    named = jax.tree_util.tree_flatten_with_path(tree)[0]
    if not named:
        return {}, []
    checksums, finite = jax.device_get(_integrity([jnp.asarray(x) for _, x in named]))
    names = [leaf_name(path) for path, _ in named]
    return ({name: int(c) for name, c in zip(names, checksums)}, [name for name, ok in zip(names, finite) if not ok])


def check_finite(tree: Any, what: str) -> None:
    """Raise `NonFiniteError` naming ``what`` and its arrays with a NaN or infinity."""
    bad = state_integrity(tree)[1]
    if bad:
        raise NonFiniteError(
            f"{what} has non-finite values (NaN or infinity) in {len(bad)} arrays: "
            f"{', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}"
        )


def _innermost(err: BaseException) -> BaseException:
    while (err.__cause__ or err.__context__) is not None:
        err = cast(BaseException, err.__cause__ or err.__context__)
    return err


def _is_write_error(err: BaseException | None) -> bool:
    """Whether a failed save was a failed write (an OSError anywhere in its chain, or a TensorStore
    error that quotes one: "No space left on device")."""
    while err is not None:
        if isinstance(err, OSError) or "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def _root_cause(err: BaseException, limit: int = 300) -> str:
    """``Type: message`` of the innermost exception ``err`` was raised from (Orbax wraps the
    TensorStore error that names the damaged file in layers of context), on one line."""
    while (err.__cause__ or err.__context__) is not None:
        err = cast(BaseException, err.__cause__ or err.__context__)
    message = " ".join(f"{type(err).__name__}: {err}".split())
    return message if len(message) <= limit else message[:limit] + " ..."


class Checkpoints:
    """Orbax checkpoints of ``(TrainState pytree, JSON metadata)`` in ``WORKDIR/checkpoints``.

    A checkpoint is written to a temporary directory and renamed when complete, so a run killed at
    any moment (also during a save) resumes from the last complete one. The trainer saves and
    restores the whole state; evaluation reads only its ``params`` (`restore_params`).

    Integrity: `save` refuses a state with non-finite values and records a checksum of every array
    in the metadata (`state_integrity`); `restore` and `restore_params` check them (checkpoints
    written before checksums existed are checked for non-finite values only) and raise
    `CorruptCheckpointError` naming the checkpoint for anything that cannot be read. The trainer
    resumes from the newest intact one (`restore_intact`).

    Args:
      directory: e.g. ``RunDir(workdir).checkpoints``.
      keep: how many of the latest checkpoints to keep (None: all).
      create: create ``directory`` if it does not exist; False to only read (then a missing
        directory has no steps).
    """

    def __init__(self, directory: str | pathlib.Path, keep: int | None = 2, *, create: bool = True):
        self.directory = pathlib.Path(directory).absolute()
        self._manager: ocp.CheckpointManager | None = None
        self._options = dict(
            max_to_keep=keep, create=create, enable_async_checkpointing=False, cleanup_tmp_directories=create
        )  # a writer holds the workdir's lock
        if create or self.directory.is_dir():
            self._open()

    def _open(self) -> None:
        self._manager = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(**self._options))

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def steps(self) -> list[int]:
        """The steps of the complete checkpoints, ascending."""
        return sorted(self._manager.all_steps()) if self._manager is not None else []

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def step_dir(self, step: int) -> pathlib.Path:
        return self.directory / str(step)

    def save(self, step: int, state: Any, metadata: dict[str, Any]) -> None:
        """Write checkpoint ``step`` (blocking until it is complete on disk), with the checksums of
        ``state``'s arrays in its metadata; older ones beyond ``keep`` are deleted.

        Raises:
          NonFiniteError: ``state`` has a NaN or infinity (nothing is written: resuming would only
            carry it on).
          WriteFailedError: the write failed (a full disk), naming the checkpoint and the free
            space; the previous checkpoints are intact.
        """
        checksums, bad = state_integrity(state)
        if bad:
            raise NonFiniteError(
                f"the state of step {step} has non-finite values (NaN or infinity) in "
                f"{len(bad)} arrays: {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}; "
                f"not saving checkpoint {self.step_dir(step)}"
            )
        metadata = {**metadata, CHECKSUMS_KEY: checksums}
        assert self._manager is not None
        try:
            self._manager.save(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(metadata)),
                force=True,
            )
            self._manager.wait_until_finished()
        except Exception as err:  # noqa: BLE001 -- Orbax wraps the OSError of a full disk in its own errors
            if not _is_write_error(err):
                raise
            # Nothing half-written is taken for a checkpoint: Orbax renames a step's directory into
            # place when it is complete, and deletes older ones only after that.
            raise run_dir.write_failed(self.step_dir(step), _innermost(err)) from err

    def _check_step(self, step: int | None) -> int:
        steps = self.steps()
        if step is None and not steps:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if step is not None and step not in steps:
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; available: {steps}")
        return steps[-1] if step is None else step

    def _restore(self, step: int, args) -> Any:
        """``manager.restore``, any failure as a `CorruptCheckpointError` naming the checkpoint
        (Orbax reports a damaged file as an OCDBT range error, a JSON error, a missing item ...).
        The manager is reopened after a failure: a failed restore can leave it unusable."""
        assert self._manager is not None  # _check_step found the step: the manager is open
        try:
            return self._manager.restore(step, args=args)
        except Exception as err:  # noqa: BLE001 -- whatever Orbax raises, the checkpoint is unusable
            try:
                self._manager.close()
            except Exception:  # noqa: BLE001
                pass
            self._open()
            raise CorruptCheckpointError(
                f"checkpoint {self.step_dir(step)} cannot be read ({_root_cause(err)})"
            ) from err

    def _verify(self, step: int, tree: Any, expected: dict[str, int] | None) -> None:
        """Compare ``tree``'s arrays with the checksums saved with them (those ``tree`` has)."""
        checksums, bad = state_integrity(tree)
        differ = sorted(name for name, value in (expected or {}).items() if checksums.get(name, value) != value)
        if differ:
            raise CorruptCheckpointError(
                f"checkpoint {self.step_dir(step)} is damaged: {len(differ)} arrays differ "
                f"from what was saved ({', '.join(differ[:5])}{' ...' if len(differ) > 5 else ''})"
            )
        if bad:
            raise CorruptCheckpointError(
                f"checkpoint {self.step_dir(step)} has non-finite values in "
                f"{', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}"
            )

    def restore(self, step: int | None, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """(state, metadata) of checkpoint ``step`` (default: the latest), placed on the shardings of
        ``abstract_state`` (a pytree of arrays or `jax.ShapeDtypeStruct`s), its arrays checked
        against their checksums.

        Raises:
          FileNotFoundError: there is no checkpoint ``step``.
          CorruptCheckpointError: it cannot be read, or an array differs from what was saved.
        """
        step = self._check_step(step)
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        restored = self._restore(
            step, ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore())
        )
        meta = dict(restored.meta) if isinstance(restored.meta, dict) else None
        if meta is None:
            raise CorruptCheckpointError(f"checkpoint {self.step_dir(step)}: its metadata is not a JSON object")
        self._verify(step, restored.state, meta.pop(CHECKSUMS_KEY, None))
        return restored.state, meta

    def restore_intact(self, abstract_state: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """(step, state, metadata) of the newest checkpoint that restores intact (`restore`);
        None when there is no checkpoint. Each damaged newer one is named in a warning and, once an
        older one restored, moved to ``corrupt_checkpoints/`` next to this directory, so that the
        run can save that step again.

        Raises:
          CorruptCheckpointError: every checkpoint is damaged (naming each; nothing is moved).
        """
        damaged = []
        for step in reversed(self.steps()):
            error: CorruptCheckpointError | None
            try:
                state, meta = self.restore(step, abstract_state)
            except CorruptCheckpointError as err:
                error = err
            else:
                error = None
            # Several processes read their own parts of a checkpoint: damaged for one, for all.
            if distributed.any_process(error is not None):
                error = error or CorruptCheckpointError(
                    f"checkpoint {self.step_dir(step)} is damaged (another process could not read its part)"
                )
                logger.warning("%s; falling back to the previous checkpoint", error)
                damaged.append((step, error))
                continue
            for bad, _ in damaged:
                self._set_aside(bad)
            return step, state, meta
        if damaged:
            raise CorruptCheckpointError(
                f"no intact checkpoint in {self.directory}: "
                + "; ".join(str(err) for _, err in damaged)
                + f". Delete {self.directory} to start the run over."
            )
        return None

    def _set_aside(self, step: int) -> None:
        """Move checkpoint ``step`` to ``corrupt_checkpoints/<step>-<time>`` and forget it."""
        if distributed.is_primary():  # several processes: process 0 moves it
            aside = self.directory.parent / "corrupt_checkpoints"
            aside.mkdir(parents=True, exist_ok=True)
            target = aside / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            os.rename(self.step_dir(step), target)
            logger.warning("moved the damaged checkpoint %s to %s", self.step_dir(step), target)
        distributed.barrier(f"checkpoint {step} set aside")
        assert self._manager is not None  # the step was restored: the manager is open
        self._manager.reload()

    def metadata(self, step: int | None) -> dict[str, Any]:
        """The JSON metadata saved with checkpoint ``step`` (default: the latest), without its
        checksums; no array is read.

        Raises:
          CorruptCheckpointError: naming the checkpoint, when its metadata cannot be read.
        """
        step = self._check_step(step)
        restored = self._restore(step, ocp.args.Composite(meta=ocp.args.JsonRestore()))
        if not isinstance(restored.meta, dict):
            raise CorruptCheckpointError(f"checkpoint {self.step_dir(step)}: its metadata is not a JSON object")
        return {k: v for k, v in restored.meta.items() if k != CHECKSUMS_KEY}

    def restore_params(self, step: int | None, target: Any) -> Any:
        """Only the ``params`` field of the state saved at ``step`` (default: the latest), restored
        onto ``target``'s shapes, dtypes and shardings (`jax.ShapeDtypeStruct` leaves allocate
        nothing else), checked against their checksums; the optimizer state is not read.

        Raises:
          CorruptCheckpointError: naming the checkpoint, when it cannot be read or is damaged.
        """
        step = self._check_step(step)
        item = {"params": target}
        restored = self._restore(
            step,
            ocp.args.Composite(
                state=ocp.args.PyTreeRestore(
                    item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True
                ),
                meta=ocp.args.JsonRestore(),
            ),
        )
        meta = restored.meta if isinstance(restored.meta, dict) else {}
        checksums = meta.get(CHECKSUMS_KEY) or {}
        self._verify(
            step,
            {"params": restored.state["params"]},
            {name: value for name, value in checksums.items() if name.startswith("params/")},
        )
        return restored.state["params"]

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
