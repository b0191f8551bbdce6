"""Orbax checkpoints of a run (``WORKDIR/checkpoints``) and the integrity checks of saved arrays.

A checkpoint records a hash of every array in its metadata (`state_integrity`: position-sensitive,
over the array's bytes, its dtype and shape), and a hash of the whole metadata (`META_CHECKSUM_KEY`:
the data position, the step, the arrays' hashes, LoRA's base ...), so a damaged one is found on
restore (`CorruptCheckpointError`); the trainer also validates what the metadata says (its
``check_meta``: the data position's types and bounds) and falls back to the previous intact one
(`Checkpoints.restore_intact`), moving the damaged ones to ``corrupt_checkpoints/``. Checkpoints
written before the hashes existed (an integer sum per array, no metadata hash) are still read and
checked the old way (`legacy_sums`).
NaN or infinite parameters are never written: `Checkpoints.save` refuses them, and `check_finite`
is the same check for the other writers of parameters (the exported policy, the warm start, a
trained reward model), all raising `NonFiniteError`.

The paths, the lock and the other files of a workdir are `gd2po_jax.runtime.run_dir`'s.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import time
from collections.abc import Callable
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


CHECKSUMS_KEY = "checksums"  # in a checkpoint's metadata: array name -> `state_integrity` hash
META_CHECKSUM_KEY = "meta_checksum"  # in a checkpoint's metadata: `meta_checksum` of the rest of it
HASH_PREFIX = "b2:"  # an array hash (`state_integrity`); an int is the legacy sum (`legacy_sums`)


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


def _plain(x: jax.Array) -> jax.Array:
    return jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x


def _bits(x: jax.Array) -> jax.Array:
    """The bit patterns of ``x``'s elements as uint32 (narrower types zero-extended; 8-byte ones cut
    to their low word: the legacy sum's view, `legacy_sums`)."""
    x = _plain(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[x.dtype.itemsize]
    return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _words(x: jax.Array) -> jax.Array:
    """Every bit of ``x`` as uint32 words: ``x.shape`` for types of 4 bytes or fewer (zero-extended),
    ``x.shape + (2,)`` for 8-byte types."""
    x = _plain(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    if x.dtype.itemsize == 8:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)  # [..., 2]
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
    return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _fmix32(h: jax.Array) -> jax.Array:
    """MurmurHash3's finalizer: a bijection of uint32 in which every input bit flips each output bit
    with probability about 1/2."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


_SEEDS = (0x243F6A88, 0x85A308D3)  # two independent 32-bit lanes: a 64-bit array hash


def _lanes(x: jax.Array) -> list[jax.Array]:
    """The array hash's two uint32 lanes: for each seed, the sum mod 2**32 of
    ``fmix32(fmix32(index ^ seed) ^ word)`` over the words of ``x`` (each word mixed with its
    position, so an element moved, or two changed in opposite directions, changes the sum). Exact
    integer arithmetic: the same on any sharding."""
    words = _words(x)
    index = jnp.arange(words.size, dtype=jnp.uint32).reshape(words.shape)
    return [jnp.sum(_fmix32(_fmix32(index ^ jnp.uint32(seed)) ^ words), dtype=jnp.uint32) for seed in _SEEDS]


@jax.jit
def _integrity(leaves: list[jax.Array]) -> tuple[list[list[jax.Array]], list[jax.Array], list[jax.Array]]:
    lanes = [_lanes(x) for x in leaves]
    sums = [jnp.sum(_bits(x), dtype=jnp.uint32) for x in leaves]
    finite = [jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.bool_(True) for x in leaves]
    return lanes, sums, finite


def _array_hash(x: Any, lanes: list[Any]) -> str:
    """``b2:<hex>``: BLAKE2b of the array's dtype, shape and its two device-computed lanes."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{jnp.dtype(_plain(jnp.asarray(x)).dtype).name}|{tuple(x.shape)}|".encode())
    digest.update(b"".join(int(lane).to_bytes(4, "little") for lane in lanes))
    return HASH_PREFIX + digest.hexdigest()


def _integrity_of(tree: Any) -> tuple[list[str], list[str], list[int], list[bool]]:
    """(names, hashes, legacy sums, finite) of ``tree``'s arrays, computed on the devices."""
    named = jax.tree_util.tree_flatten_with_path(tree)[0]
    if not named:
        return [], [], [], []
    leaves = [jnp.asarray(x) for _, x in named]
    lanes, sums, finite = jax.device_get(_integrity(leaves))
    names = [leaf_name(path) for path, _ in named]
    hashes = [_array_hash(x, lane) for x, lane in zip(leaves, lanes)]
    return names, hashes, [int(c) for c in sums], [bool(ok) for ok in finite]


def state_integrity(tree: Any) -> tuple[dict[str, str], list[str]]:
    """(hash of each array by `leaf_name`, the names of the arrays with a NaN or infinity).

    The hash (``b2:<32 hex digits>``) is BLAKE2b of the array's dtype, shape and a 64-bit digest of
    its bytes computed on the devices (`_lanes`: each 32-bit word mixed with its position, summed
    mod 2**32 in two lanes): exact integer arithmetic, so it does not depend on how the array is
    sharded; a flipped bit, a reordered array or two elements changed in opposite directions change
    it. Only two numbers per array come back to the host.
    """
    names, hashes, _, finite = _integrity_of(tree)
    return dict(zip(names, hashes)), [name for name, ok in zip(names, finite) if not ok]


def legacy_sums(tree: Any) -> dict[str, int]:
    """The checksums of checkpoints written before `state_integrity`'s hashes: the sum of each
    array's bit patterns (as uint32) modulo 2**32, by `leaf_name`. Read to verify such checkpoints."""
    names, _, sums, _ = _integrity_of(tree)
    return dict(zip(names, sums))


def meta_checksum(meta: dict[str, Any]) -> str:
    """BLAKE2b of a checkpoint's metadata (but `META_CHECKSUM_KEY`), as canonical JSON."""
    text = json.dumps({k: v for k, v in meta.items() if k != META_CHECKSUM_KEY}, sort_keys=True, allow_nan=True)
    return HASH_PREFIX + hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


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


class _HeldLogs(logging.Filter):
    """Holds the records of Orbax's loggers (``absl``, ``orbax``) while a checkpoint is written: its
    threads log every failed write with a traceback (hundreds of lines on a full disk) before the save
    raises. `release` emits them (a save that succeeded, or failed otherwise); `drop` forgets them
    (a failed write: `run_dir.write_failed`'s one line says it)."""

    LOGGERS = ("absl", "orbax")

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def __enter__(self) -> _HeldLogs:
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self)
        return self

    def __exit__(self, *exc) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False

    def release(self) -> None:
        records, self.records = self.records, []
        for record in records:
            logging.getLogger(record.name).handle(record)

    def drop(self) -> None:
        self.records = []


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

    Integrity: `save` refuses a state with non-finite values and records a hash of every array
    and of the metadata (`state_integrity`, `meta_checksum`); `restore`, `restore_params` and
    `metadata` check them (checkpoints written before checksums existed are checked for non-finite
    values only; those with legacy sums by their sums) and raise
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
        metadata[META_CHECKSUM_KEY] = meta_checksum(metadata)
        assert self._manager is not None
        with _HeldLogs() as logs:  # Orbax's threads' tracebacks of a full disk: our one line instead
            try:
                self._manager.save(
                    step,
                    args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(metadata)),
                    force=True,
                )
                self._manager.wait_until_finished()
            except Exception as err:  # noqa: BLE001 -- Orbax wraps the OSError of a full disk in its own errors
                if not _is_write_error(err):
                    logs.release()
                    raise
                logs.drop()
                # Nothing half-written is taken for a checkpoint: Orbax renames a step's directory into
                # place when it is complete, and deletes older ones only after that.
                raise run_dir.write_failed(self.step_dir(step), _innermost(err)) from None
            logs.release()

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

    def _checked_meta(self, step: int, meta: Any) -> dict[str, Any]:
        """The metadata of checkpoint ``step``, checked against its `meta_checksum` (a checkpoint with
        array hashes must have one; a legacy one, with integer sums, has none), without it.

        Raises:
          CorruptCheckpointError: not a JSON object, no checksum where one is due, or one that differs.
        """
        where = f"checkpoint {self.step_dir(step)}"
        if not isinstance(meta, dict):
            raise CorruptCheckpointError(f"{where}: its metadata is not a JSON object")
        meta = dict(meta)
        recorded = meta.pop(META_CHECKSUM_KEY, None)
        sums = meta.get(CHECKSUMS_KEY)
        if not isinstance(sums, (dict, type(None))):
            raise CorruptCheckpointError(f"{where}: its metadata's {CHECKSUMS_KEY!r} is not a JSON object")
        legacy = recorded is None and all(isinstance(v, int) for v in (sums or {}).values())
        if not legacy and recorded != meta_checksum(meta):
            raise CorruptCheckpointError(
                f"{where} is damaged: its metadata (data position, step ...) differs from what was saved"
            )
        if "step" in meta and (
            not isinstance(meta["step"], int) or isinstance(meta["step"], bool) or meta["step"] != step
        ):
            raise CorruptCheckpointError(f"{where}: its metadata says step {meta['step']!r}")
        return meta

    def _verify(self, step: int, tree: Any, expected: dict[str, Any] | None) -> None:
        """Compare ``tree``'s arrays with the hashes saved with them (those ``tree`` has; integer
        values: a legacy checkpoint's sums, `legacy_sums`)."""
        expected = expected or {}
        hashes, bad = state_integrity(tree)
        checksums: dict[str, Any] = dict(hashes)
        if any(isinstance(value, int) for value in expected.values()):
            checksums.update(legacy_sums(tree))
        differ = sorted(name for name, value in expected.items() if checksums.get(name, value) != value)
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

    def restore(
        self, step: int | None, abstract_state: Any, check_meta: Callable[[dict[str, Any]], Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """(state, metadata) of checkpoint ``step`` (default: the latest), placed on the shardings of
        ``abstract_state`` (a pytree of arrays or `jax.ShapeDtypeStruct`s), its metadata checked
        against its checksum and its arrays against their hashes.

        Args:
          check_meta: the caller's validation of the metadata (types, bounds: the data position);
            a ValueError, TypeError or KeyError it raises makes the checkpoint damaged.

        Raises:
          FileNotFoundError: there is no checkpoint ``step``.
          CorruptCheckpointError: it cannot be read, its metadata or an array differs from what was
            saved, or ``check_meta`` refuses its metadata.
        """
        step = self._check_step(step)
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        restored = self._restore(
            step, ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore())
        )
        meta = self._checked_meta(step, restored.meta)
        if check_meta is not None:
            try:
                check_meta(meta)
            except (ValueError, TypeError, KeyError) as err:
                raise CorruptCheckpointError(
                    f"checkpoint {self.step_dir(step)}: its metadata is invalid ({err})"
                ) from None
        self._verify(step, restored.state, meta.pop(CHECKSUMS_KEY, None))
        return restored.state, meta

    def restore_intact(
        self, abstract_state: Any, check_meta: Callable[[dict[str, Any]], Any] | None = None
    ) -> tuple[int, Any, dict[str, Any]] | None:
        """(step, state, metadata) of the newest checkpoint that restores intact (`restore`, with
        ``check_meta``); None when there is no checkpoint. Each damaged newer one is named in a
        warning and, once an older one restored, moved to ``corrupt_checkpoints/`` next to this
        directory, so that the run can save that step again.

        Raises:
          CorruptCheckpointError: every checkpoint is damaged (naming each; nothing is moved).
        """
        damaged = []
        for step in reversed(self.steps()):
            error: CorruptCheckpointError | None
            try:
                state, meta = self.restore(step, abstract_state, check_meta)
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
        return {k: v for k, v in self._checked_meta(step, restored.meta).items() if k != CHECKSUMS_KEY}

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
        checksums = self._checked_meta(step, restored.meta).get(CHECKSUMS_KEY) or {}
        self._verify(
            step,
            {"params": restored.state["params"]},
            {name: value for name, value in checksums.items() if name.startswith("params/")},
        )
        return restored.state["params"]

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
