"""Device mesh and parameter/batch placement.

The mesh has three axes, always in this order:

* ``data``   pure data parallelism (parameters replicated),
* ``fsdp``   data parallelism with parameters sharded (ZeRO-3 style),
* ``tensor`` tensor (model) parallelism over heads / the MLP width / the vocabulary.

Parameters of `gd2po_jax.models.Decoder` carry ``out_sharding`` annotations naming "fsdp" and
"tensor"; `variable_sharding` turns one into a `NamedSharding` for a given mesh, and
`gd2po_jax.models.load_pretrained` creates each parameter directly on it. A dimension whose size
does not divide by its mesh axes is replicated instead (`fit_spec`), so any mesh works with any model
(e.g. 2 key/value heads on a tensor axis of 4). Batches are split over ``("data", "fsdp")``
(`batch_sharding`): the sampler and the update constrain their rows to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence | None = None) -> Mesh:
    """A ``("data", "fsdp", "tensor")`` mesh over ``devices`` (default: all devices).

    One of the sizes may be -1, meaning "all remaining devices" (by default fsdp spans them).
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1; got data={data}, fsdp={fsdp}, tensor={tensor}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if known <= 0 or len(devices) % known:
            raise ValueError(
                f"cannot fill the -1 axis: {len(devices)} devices are not divisible by {known} "
                f"(data={data}, fsdp={fsdp}, tensor={tensor})"
            )
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} = {math.prod(sizes)} "
            f"devices, but {len(devices)} are available; make the product match or pass devices="
        )
    grid = np.asarray(devices, dtype=object).reshape(sizes)
    return Mesh(grid, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)


def _axis_size(mesh: Mesh, axes) -> int:
    if axes is None:
        return 1
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(mesh.shape[a] for a in axes)


def fit_spec(spec: Sequence, shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """``spec`` with every entry whose mesh size does not divide its dimension dropped.

    A tuple entry (several mesh axes on one dimension) keeps its longest prefix that divides.
    Axis names absent from ``mesh`` are dropped too.
    """
    spec = tuple(spec) + (None,) * (len(shape) - len(tuple(spec)))
    fitted = []
    for axes, dim in zip(spec, shape):
        names = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
        names = tuple(a for a in names if a in mesh.shape)
        while names and dim % _axis_size(mesh, names):
            names = names[:-1]
        fitted.append(None if not names else (names[0] if len(names) == 1 else names))
    return PartitionSpec(*fitted)


def named_sharding(mesh: Mesh, spec: Sequence, shape: Sequence[int]) -> NamedSharding:
    """`NamedSharding` of an array of ``shape`` under ``spec``, fitted to the mesh (`fit_spec`)."""
    return NamedSharding(mesh, fit_spec(spec, shape, mesh))


def variable_sharding(variable: nnx.Variable, mesh: Mesh) -> NamedSharding:
    """Sharding of one NNX variable from its ``out_sharding`` annotation (replicated if none)."""
    spec = variable.get_metadata().get("out_sharding") or ()
    return named_sharding(mesh, spec, variable.shape)


def place_host_array(view: np.ndarray, dtype, sharding: NamedSharding | None) -> jax.Array:
    """Device array from a host array (or memory-mapped view), converted to ``dtype`` slice by slice:
    with a sharding each device reads only its own slice (the same ``view`` on every process)."""
    dtype = np.dtype(dtype)
    if sharding is None:
        return jax.device_put(np.asarray(view).astype(dtype))
    return jax.make_array_from_callback(view.shape, sharding, lambda idx: np.asarray(view[idx]).astype(dtype))


def batch_sharding(mesh: Mesh, shape: Sequence[int]) -> NamedSharding:
    """Sharding of a ``[B, ...]`` array: B split over ("data", "fsdp") as far as B divides."""
    return named_sharding(mesh, (BATCH_AXES,), shape)


def mesh_of(model: nnx.Module) -> Mesh | None:
    """The mesh the model's parameters live on, or None if they are not `NamedSharding`-placed."""
    for leaf in jax.tree.leaves(nnx.state(model)):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding):
            return cast(Mesh, sharding.mesh)  # a placed array's: a concrete Mesh
    return None
