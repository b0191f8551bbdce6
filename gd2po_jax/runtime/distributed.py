"""Several hosts: JAX's multi-controller runtime, one process per host (docs/multihost.md).

Every host runs the same command (``train.py`` or ``eval.py``, the same ``--workdir`` on shared
storage) with its own ``--config.distributed.process_id``; `initialize` joins the processes
(`jax.distributed.initialize`), after which ``jax.devices()`` lists every host's devices and the
run's mesh spans them all. The jitted programs are those of one process (XLA partitions them over
the global mesh); what changes is the host side, and in one process every helper here takes
today's code path unchanged:

  data      each process builds only the rows of a batch that its devices hold (`batch_rows`), and
            the global arrays are assembled from them (`jax.make_array_from_process_local_data`).
            Every process draws the same prompt order from the same seeded sampler, so the global
            batch is the one-process batch row for row, and so are the sampled rollouts (the
            sampler's random numbers do not depend on how the arrays are split).
  rewards   each process decodes and scores the rollouts its devices hold (`addressable_rows`);
            the scores are gathered (`gather_rows`), so every process holds the global [P, G, K]
            rewards and the step's host metrics are global.
  files     process 0 writes the workdir (its lock, config.json, metrics, reports, the exported
            policy); the others wait at a `barrier` before they read what it wrote. Orbax
            checkpoints are saved by every process (Orbax's primary host is process 0).
  export    each parameter is gathered in turn (`host_value`) and process 0 writes it.
  logs      process 0 logs INFO; the others only warnings and errors; each line names its process.
  failure   a process that raises publishes its error in the coordination service's key-value
            store (`stop_all_on_error`); a watchdog thread in every process polls it and stops
            that process with the error, within a second. A process that dies without a word
            (killed, out of memory) stops sending heartbeats: JAX's coordination service then
            terminates the others within ``config.distributed.heartbeat_timeout_s`` ("Terminating
            process because the JAX distributed service detected fatal errors ... another task
            died"), at once if process 0 (the coordinator) died. Rerunning the same command on every
            host resumes from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gd2po_jax.config import AUTO_COORDINATOR, ConfigError, DistributedConfig
from gd2po_jax.errors import UserError
from gd2po_jax.runtime.sharding import BATCH_AXES, named_sharding

logger = logging.getLogger(__name__)

_FAILED = "gd2po/failed/"  # + process index: that process's error (the coordination service's key-value store)
_STOPPED = "gd2po/stopped/"  # + process index: that process is exiting after a failure
_POLL_S = 0.5  # how often the watchdog reads the failures
_COORDINATOR_GRACE_S = 10.0  # how long process 0, whose exit ends the service, waits for the others to stop
_MESSAGE_LIMIT = 4000  # characters of an error passed to the other processes


class DistributedError(UserError, RuntimeError):
    """The processes of a run could not join, or one of them failed; the message says which."""


# ----------------------------------------------------------------------------------------------
# Start-up.
# ----------------------------------------------------------------------------------------------


def initialize(settings: DistributedConfig = DistributedConfig()) -> None:
    """Join the processes of a multi-host run as ``config.distributed`` asks; with an
    empty coordinator address (and no ``JAX_COORDINATOR_ADDRESS`` in the environment) there is one
    process and nothing happens. Call it before any other use of JAX.

    Then: CPU collectives go through gloo, this process logs (and prefixes every log line with) its
    index and the global device count, processes other than 0 log only warnings and errors, and a
    watchdog thread stops this process when another one fails (`stop_all_on_error`).

    Raises:
      ConfigError: the settings are invalid, or leave the number of processes or this process's id
        unknown (not given, not detected from the cluster).
      DistributedError: the processes did not all join within
        ``config.distributed.initialization_timeout_s``.
    """
    address = settings.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS", "")
    if not address:
        if settings.num_processes > 1 or settings.process_id > 0:
            raise ConfigError(
                f"config.distributed.coordinator_address: empty, but config.distributed.num_processes="
                f"{settings.num_processes} and process_id={settings.process_id}; give process 0's HOST:PORT "
                "(or 'auto' on a TPU pod or under SLURM)"
            )
        return
    if "JAX_CPU_COLLECTIVES_IMPLEMENTATION" not in os.environ:  # cross-process collectives on CPU
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    process_id = None if settings.process_id < 0 else settings.process_id
    given = address != AUTO_COORDINATOR and settings.num_processes and process_id is not None
    try:
        jax.distributed.initialize(
            coordinator_address=None if address == AUTO_COORDINATOR else address,  # None: detected
            num_processes=settings.num_processes or None,
            process_id=process_id,
            initialization_timeout=settings.initialization_timeout_s,
            heartbeat_timeout_seconds=settings.heartbeat_timeout_s,
            # All given: no cluster detection, which under SLURM or Open MPI would also show each
            # process a single GPU (JAX_LOCAL_DEVICE_IDS still chooses devices).
            cluster_detection_method="deactivate" if given else None,
        )
    except (ValueError, TypeError) as err:  # what neither the config nor the cluster says
        raise ConfigError(
            f"config.distributed: {err} (set config.distributed.coordinator_address, "
            "num_processes and process_id, or run where JAX detects them: a TPU pod, SLURM, "
            "Open MPI)"
        ) from None
    except jax.errors.JaxRuntimeError as err:
        raise DistributedError(
            f"process {process_id} could not join the run's processes at {address} within "
            f"config.distributed.initialization_timeout_s={settings.initialization_timeout_s} s: is every "
            f"process started, with the same coordinator address and num_processes? ({err})"
        ) from None
    index, count = jax.process_index(), jax.process_count()
    _label_log_lines(index, count)
    local = jax.local_device_count()
    logger.info(
        "process %d of %d on %s: %d local device%s, %d in all (%s); a process silent for %d s is taken for dead",
        index,
        count,
        socket.gethostname(),
        local,
        "" if local == 1 else "s",
        jax.device_count(),
        jax.default_backend(),
        settings.heartbeat_timeout_s,
    )
    if index:
        logging.getLogger().setLevel(logging.WARNING)  # process 0 logs for all
    _Watchdog.start(index, count)


def _label_log_lines(index: int, count: int) -> None:
    """Prefix every log line with ``[process index/count]``."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(f"%(levelname)s [process {index}/{count}] %(name)s: %(message)s"))


def is_primary() -> bool:
    """Whether this is process 0, the one that writes the workdir and logs (always, in one process)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process has reached the barrier ``name`` (nothing in one process). A process
    that fails instead stops the others (`stop_all_on_error`)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def primary_decides(value: bool) -> bool:
    """Process 0's ``value`` on every process: a decision read from shared storage (does a file
    exist?) that must be the same everywhere."""
    if jax.process_count() == 1:
        return bool(value)
    return bool(multihost_utils.broadcast_one_to_all(np.int32(bool(value))))


def any_process(value: bool) -> bool:
    """Whether ``value`` is true on any process."""
    if jax.process_count() == 1:
        return bool(value)
    return bool(np.any(multihost_utils.process_allgather(np.int32(bool(value)))))


# ----------------------------------------------------------------------------------------------
# Data: rows of a batch.
# ----------------------------------------------------------------------------------------------


def row_sharding(mesh: Mesh, num_rows: int) -> NamedSharding:
    """The sharding of a ``[num_rows, ...]`` batch array: rows over the batch axes, as far as they
    divide (`gd2po_jax.runtime.sharding.batch_sharding`), the other dimensions whole."""
    return named_sharding(mesh, (BATCH_AXES,), (num_rows,))


def process_rows(sharding: NamedSharding, num_rows: int) -> np.ndarray:
    """[n] int: the rows of a ``[num_rows, ...]`` array under ``sharding`` that this process's devices
    hold, ascending (the order `jax.make_array_from_process_local_data` takes them in)."""
    indices = cast(
        "dict[Any, tuple[slice, ...]]",  # a NamedSharding's: a tuple of slices for every device
        sharding.addressable_devices_indices_map((num_rows,)),
    )
    blocks = {(index[0].start or 0, num_rows if index[0].stop is None else index[0].stop) for index in indices.values()}
    return np.concatenate([np.arange(start, stop) for start, stop in sorted(blocks)])


def batch_rows(build: Callable[[np.ndarray], Any], num_rows: int, mesh: Mesh | None) -> Any:
    """The device arrays of a batch of ``num_rows`` rows, split over ``mesh``'s batch axes, of which
    each process builds only the rows its devices hold.

    Args:
      build: ``rows [n] int`` (indices into the global batch, ascending) -> a pytree of numpy arrays
        of n rows each: those rows of the batch.
      mesh: the run's mesh; None (an unsharded model) builds every row.

    Returns:
      The pytree of ``[num_rows, ...]`` arrays: global ones across processes; in one process
      ``jnp.asarray`` of every row, as the code did before processes existed.
    """
    if mesh is None or jax.process_count() == 1:
        return jax.tree.map(jnp.asarray, build(np.arange(num_rows)))
    sharding = row_sharding(mesh, num_rows)
    local = build(process_rows(sharding, num_rows))
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x), (num_rows,) + np.shape(x)[1:]), local
    )


def addressable_rows(x: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    """(rows [n] int ascending, values [n, ...]): the rows of ``x`` (split along its first axis only)
    that this process's devices hold, on the host; in one process every row (`jax.device_get`)."""
    if x.is_fully_addressable:
        return np.arange(x.shape[0]), np.asarray(jax.device_get(x))
    blocks: dict[int, tuple[np.ndarray, jax.Array]] = {}
    for shard in x.addressable_shards:
        first, rest = shard.index[0], shard.index[1:]
        if any(s.start not in (None, 0) or s.stop not in (None, n) for s, n in zip(rest, x.shape[1:])):
            raise ValueError(
                f"addressable_rows: an array of shape {x.shape} split along more than its rows ({x.sharding})"
            )
        start = first.start or 0
        stop = x.shape[0] if first.stop is None else first.stop
        blocks.setdefault(start, (np.arange(start, stop), shard.data))
    ordered = [blocks[start] for start in sorted(blocks)]
    return (
        np.concatenate([rows for rows, _ in ordered]),
        np.concatenate([np.asarray(jax.device_get(data)) for _, data in ordered]),
    )


def gather_rows(rows: np.ndarray, values: Any, num_rows: int) -> Any:
    """Every process's rows put together: ``values`` (a pytree of ``[n, ...]`` numpy arrays, the rows
    ``rows`` of a ``[num_rows, ...]`` whole) -> the whole, on every process. Rows that several
    processes hold (replicated devices) come from one of them. In one process: ``values``.

    Raises:
      ValueError: the processes' rows leave some of the ``num_rows`` out.
    """
    if jax.process_count() == 1:
        return values
    every_rows = multihost_utils.process_allgather(np.asarray(rows, np.int32)).reshape(-1)
    missing = np.setdiff1d(np.arange(num_rows), every_rows)
    if missing.size:
        raise ValueError(f"gather_rows: no process holds rows {missing[:8].tolist()} of {num_rows}")

    def gather(value):
        value = np.asarray(value)
        every = multihost_utils.process_allgather(value).reshape((-1,) + value.shape[1:])
        whole = np.empty((num_rows,) + value.shape[1:], value.dtype)
        whole[every_rows] = every.astype(value.dtype, copy=False)
        return whole

    return jax.tree.map(gather, values)


def host_value(tree: Any) -> Any:
    """The numpy values of the arrays in ``tree``, whole: an array split over several processes is
    gathered from all of them (every process must call this, in the same order), one array at a
    time. In one process: `jax.device_get`."""
    if jax.process_count() == 1:
        return jax.device_get(tree)

    def whole(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))

    return jax.tree.map(whole, tree)


def replicated(value: np.ndarray, mesh: Mesh | None) -> jax.Array:
    """``value`` (the same on every process) as a device array: ``jnp.asarray`` in one process (or
    without a mesh), a copy on every device of ``mesh`` across processes."""
    if mesh is None or jax.process_count() == 1:
        return jnp.asarray(value)
    value = np.asarray(value)
    return jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec()), value, value.shape)


def gather_texts(text: str | None, limit: int = 4096) -> list[str | None]:
    """Every process's ``text`` (None: none), in process order; each cut to ``limit`` bytes."""
    if jax.process_count() == 1:
        return [text]
    data = np.zeros(limit + 1, np.uint8)
    if text is not None:
        encoded = text.encode()[:limit]
        data[0] = 1
        data[1 : 1 + len(encoded)] = np.frombuffer(encoded, np.uint8)
    every = multihost_utils.process_allgather(data)
    return [bytes(row[1:]).rstrip(b"\0").decode(errors="replace") if row[0] else None for row in every]


# ----------------------------------------------------------------------------------------------
# Failure: one process's error stops them all.
# ----------------------------------------------------------------------------------------------


def _client():
    """The coordination service's client of this process (None in one process). JAX keeps it in
    `jax._src.distributed`, where Orbax's multi-host code reads it too."""
    from jax._src import distributed as jax_distributed

    return jax_distributed.global_state.client


class _Watchdog:
    """A daemon thread that stops this process when another one has published a failure
    (`stop_all_on_error`). Started by `initialize`; one per process."""

    current: _Watchdog | None = None

    def __init__(self, index: int, count: int):
        self.index, self.count = index, count
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gd2po-watchdog", daemon=True)

    @classmethod
    def start(cls, index: int, count: int) -> None:
        cls.current = cls(index, count)
        cls.current._thread.start()

    def _run(self) -> None:
        while not self._done.wait(_POLL_S):
            try:
                failures = published_failures()
            except Exception:  # noqa: BLE001 - the service is gone: JAX reports that itself
                return
            others = {index: message for index, message in failures.items() if index != self.index}
            if others and not self._done.is_set():
                first = min(others)
                _halt(f"stopping: process {first} of {self.count} failed: {others[first]}")

    def stop(self) -> None:
        self._done.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def published_failures() -> dict[int, str]:
    """process index -> the error it published (`stop_all_on_error`); empty in one process."""
    client = _client()
    if client is None:
        return {}
    return {int(key.rsplit("/", 1)[1]): value for key, value in client.key_value_dir_get(_FAILED)}


def _halt(message: str | None, code: int = 1) -> None:
    """Log ``message`` and end this process at once (whatever its threads are doing: the main one
    may be waiting in a collective that will never complete). Process 0 hosts the coordination
    service, so it waits (up to a few seconds) for the others to stop first."""
    if message:
        logger.error(message)
    client, index, count = _client(), jax.process_index(), jax.process_count()
    try:
        client.key_value_set(f"{_STOPPED}{index}", "1", allow_overwrite=True)
        if index == 0:
            deadline = time.monotonic() + _COORDINATOR_GRACE_S
            while time.monotonic() < deadline and len(client.key_value_dir_get(_STOPPED)) < count:
                time.sleep(0.1)
            time.sleep(_POLL_S)
    except Exception:  # noqa: BLE001 - the service is gone
        pass
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


@contextlib.contextmanager
def stop_all_on_error() -> Iterator[None]:
    """Around a program's work: when it raises in one process of a multi-process run, the error is
    printed, published to the others (whose watchdogs stop them with it, naming this process) and
    this process ends (exit code 1) instead of waiting in JAX's shutdown for processes that can no
    longer finish. In one process, or before `initialize` joined the processes, it does nothing.
    A clean ``SystemExit`` (code 0) passes through; on success the watchdog stops."""
    try:
        yield
    except BaseException as err:
        if _Watchdog.current is None or (isinstance(err, SystemExit) and err.code in (None, 0)):
            raise
        _Watchdog.current.stop()
        if isinstance(err, SystemExit):
            message = str(err.code)
            print(message, file=sys.stderr)
        else:
            message = f"{type(err).__name__}: {err}"
            traceback.print_exc()
        index, count = jax.process_index(), jax.process_count()
        try:
            _client().key_value_set(f"{_FAILED}{index}", f"{message[:_MESSAGE_LIMIT]} (on {socket.gethostname()})")
        except Exception:  # noqa: BLE001 - published already, or the service is gone
            pass
        _halt(f"process {index} of {count} failed (the error above); the others stop too")
    else:
        if _Watchdog.current is not None:  # started by `initialize` in the block
            _Watchdog.current.stop()
            _Watchdog.current = None


__all__ = [
    "DistributedError",
    "addressable_rows",
    "any_process",
    "barrier",
    "batch_rows",
    "gather_rows",
    "gather_texts",
    "host_value",
    "initialize",
    "is_primary",
    "primary_decides",
    "process_rows",
    "published_failures",
    "replicated",
    "row_sharding",
    "stop_all_on_error",
]
