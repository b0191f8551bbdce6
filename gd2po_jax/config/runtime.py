"""How a run is laid out on the machines: ``config.mesh`` (`MeshConfig`, the device mesh) and
``config.distributed`` (`DistributedConfig`, the processes of a multi-host run).

May import: gd2po_jax.config.base.
"""

from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

from gd2po_jax.config.base import _int_at_least, _is_int, _require, _Section, _text

AUTO_COORDINATOR = "auto"
"""``distributed.coordinator_address`` meaning: detected by `jax.distributed.initialize` (Cloud TPU
pods, SLURM, Open MPI, Kubernetes JobSets)."""


@dataclasses.dataclass(frozen=True)
class MeshConfig(_Section):
    """``config.mesh``: the device mesh (`gd2po_jax.runtime.sharding.make_mesh`). One size may be -1:
    all remaining devices. The batch is split over data x fsdp."""

    _path: ClassVar[str] = "mesh"

    data: int
    """Data-parallel devices (each holds all parameters)."""
    fsdp: int
    """Devices the parameters and optimizer state are split over (and the batch too)."""
    tensor: int
    """Tensor-parallel devices."""

    def __post_init__(self):
        for name in ("data", "fsdp", "tensor"):
            value = getattr(self, name)
            _require(
                _is_int(value) and (value >= 1 or value == -1),
                f"mesh.{name}",
                f"must be a device count >= 1, or -1 (all remaining devices), got {value!r}",
            )


@dataclasses.dataclass(frozen=True)
class DistributedConfig(_Section):
    """``config.distributed``: one process per host on JAX's multi-controller runtime
    (`gd2po_jax.runtime.distributed`; docs/multihost.md). Every process runs the same command with the same
    ``--workdir`` (shared storage). How a run is launched, not what it computes: a rerun may change
    any of these (`gd2po_jax.runtime.run_dir.RESUMABLE_FIELDS`)."""

    _path: ClassVar[str] = "distributed"

    coordinator_address: str = ""
    """``HOST:PORT`` of process 0's coordinator; ``"auto"``: detected from the cluster (TPU pod, SLURM, Open
    MPI, Kubernetes); empty: one process, unless the environment has ``JAX_COORDINATOR_ADDRESS`` (JAX's own
    variable), which then stands for it."""
    num_processes: int = 0
    """How many processes (hosts) take part; 0: detected from the cluster."""
    process_id: int = -1
    """This process's index in [0, num_processes); -1: detected from the cluster."""
    initialization_timeout_s: int = 300
    """How long a process waits for the others to join."""
    heartbeat_timeout_s: int = 100
    """A process not heard from for this long is dead, and the others stop (JAX's coordination service)."""

    def __post_init__(self):
        _text(
            self.coordinator_address,
            "distributed.coordinator_address",
            f"HOST:PORT, {AUTO_COORDINATOR!r} or empty (one process)",
        )
        address = self.coordinator_address
        _require(
            not address or address == AUTO_COORDINATOR or re.fullmatch(r"\S+:\d+", address) is not None,
            "distributed.coordinator_address",
            f"{address!r} is not HOST:PORT (process 0's host and a free port), {AUTO_COORDINATOR!r} or empty",
        )
        _int_at_least(self.num_processes, "distributed.num_processes", minimum=0)
        _int_at_least(self.process_id, "distributed.process_id", minimum=-1)
        _require(
            self.num_processes == 0 or self.process_id < self.num_processes,
            "distributed.process_id",
            f"{self.process_id} is not below distributed.num_processes={self.num_processes}",
        )
        _int_at_least(self.initialization_timeout_s, "distributed.initialization_timeout_s")
        _int_at_least(self.heartbeat_timeout_s, "distributed.heartbeat_timeout_s")
