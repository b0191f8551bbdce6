"""gd2po_jax.training.optimizer: the optimizer state is split over the mesh as its parameters are."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from gd2po_jax.models import load_pretrained
from gd2po_jax.training.optimizer import init_optimizer_state, make_optimizer
from gd2po_jax.runtime.sharding import make_mesh
from tests.fakes import tiny_checkpoint


def sharded_params(mesh):
    """The tiny checkpoint's parameters placed on ``mesh`` as the trainer loads them."""
    return nnx.split(load_pretrained(tiny_checkpoint("qwen2", tie=True)[0], mesh=mesh), nnx.Param)[1]


def test_adams_moments_are_on_their_parameters_shardings_and_counters_replicated():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    params = sharded_params(mesh)
    optimizer = make_optimizer(1e-3)
    state = init_optimizer_state(optimizer, params)
    adam = state[1][0]
    moments = [*jax.tree.leaves(adam.mu), *jax.tree.leaves(adam.nu)]
    expected = [p.sharding for p in jax.tree.leaves(params)] * 2
    assert [m.sharding for m in moments] == expected
    assert any(s.spec != PartitionSpec() for s in expected)  # some parameters really are split
    assert adam.count.sharding == NamedSharding(mesh, PartitionSpec())
    eager = optimizer.init(params)  # the same values
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(eager), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # What it replaces: the jitted init alone leaves every moment on one device.
    jitted_alone = jax.jit(optimizer.init)(params)[1][0]
    assert len(jax.tree.leaves(jitted_alone.mu)[0].sharding.device_set) == 1


def test_parameters_on_one_device_keep_their_state_there():
    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros((3,))}
    state = init_optimizer_state(make_optimizer(1e-3), params)
    assert {len(x.sharding.device_set) for x in jax.tree.leaves(state)} == {1}
