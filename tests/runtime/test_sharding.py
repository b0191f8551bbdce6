"""gd2po_jax.runtime.sharding: meshes, annotation-driven parameter placement, sharded load and sampling."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from gd2po_jax.models import load_pretrained
from gd2po_jax.models.sampling import generate
from gd2po_jax.runtime.sharding import batch_sharding, fit_spec, make_mesh, mesh_of, variable_sharding
from tests.fakes import logits_of, ragged_batch, tiny_checkpoint


def test_make_mesh_spans_all_devices_by_default():
    assert jax.device_count() == 8
    mesh = make_mesh()
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert dict(mesh.shape) == {"data": 1, "fsdp": 8, "tensor": 1}
    assert dict(make_mesh(data=2, fsdp=-1, tensor=2).shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert dict(make_mesh(fsdp=2, tensor=4).shape) == {"data": 1, "fsdp": 2, "tensor": 4}


def test_make_mesh_rejects_sizes_that_do_not_match_the_devices():
    with pytest.raises(ValueError, match="= 3 devices, but 8 are available"):
        make_mesh(data=1, fsdp=3, tensor=1)
    with pytest.raises(ValueError, match="not divisible by 3"):
        make_mesh(data=3, fsdp=-1)
    with pytest.raises(ValueError, match="at most one"):
        make_mesh(data=-1, fsdp=-1)


def test_fit_spec_drops_axes_that_do_not_divide():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    assert fit_spec(("fsdp", "tensor", None), (32, 4, 8), mesh) == P("fsdp", "tensor", None)
    assert fit_spec(("fsdp", "tensor"), (32, 3), mesh) == P("fsdp", None)
    assert fit_spec((("data", "fsdp"),), (6, 5), mesh) == P("data", None)
    assert fit_spec((("data", "fsdp"),), (8,), mesh) == P(("data", "fsdp"))
    assert fit_spec(("nonexistent",), (8,), mesh) == P(None)


def test_model_loaded_on_2x4_mesh_is_sharded_and_matches_single_device():
    path, _ = tiny_checkpoint("qwen2", True)
    mesh = make_mesh(fsdp=2, tensor=4)
    sharded = load_pretrained(path, mesh=mesh)
    single = load_pretrained(path)
    q = sharded.layers[0].attn.q_kernel[...]  # [D=32, H=4, hd=8]
    assert q.sharding.spec == P("fsdp", "tensor", None)
    assert q.addressable_shards[0].data.shape == (16, 1, 8)
    k = sharded.layers[0].attn.k_kernel[...]  # 2 kv heads do not split 4 ways: replicated there
    assert k.sharding.spec == P("fsdp", None, None)
    assert sharded.embed[...].sharding.spec == P("tensor", "fsdp")
    assert mesh_of(sharded) is mesh and mesh_of(single) is None

    ids, mask = ragged_batch()
    np.testing.assert_allclose(logits_of(sharded, ids, mask), logits_of(single, ids, mask), atol=1e-5)
    prompts = [[3, 4, 5], [6], [7, 8, 9, 10], [11, 12]]
    a = generate(sharded, prompts, max_new_tokens=6, temperature=0.0, num_samples=2)
    b = generate(single, prompts, max_new_tokens=6, temperature=0.0, num_samples=2)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-5)
    assert a.tokens.sharding.is_equivalent_to(batch_sharding(mesh, (8, 6)), 2)
    assert a.tokens.addressable_shards[0].data.shape == (4, 6)  # 8 rows over fsdp=2


def test_every_parameter_is_loaded_on_its_annotated_sharding():
    path, _ = tiny_checkpoint("llama3", False)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    model = load_pretrained(path, mesh=mesh)
    variables = jax.tree.leaves(nnx.state(model), is_leaf=lambda x: isinstance(x, nnx.Variable))
    assert len(variables) > 10
    for variable in variables:
        assert variable[...].sharding == variable_sharding(variable, mesh)
    assert model.lm_head[...].sharding.spec == P("fsdp", "tensor")
    assert model.layers[1].mlp.down_kernel[...].sharding.spec == P("tensor", "fsdp")


def test_batch_sharding_splits_rows_over_data_and_fsdp():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    ids = jax.device_put(np.zeros((8, 5), np.int32), batch_sharding(mesh, (8, 5)))
    assert ids.sharding.spec == P(("data", "fsdp"), None)
    assert ids.addressable_shards[0].data.shape == (2, 5)
    assert batch_sharding(mesh, (3,)).spec == P(None)  # 3 rows do not split 4 ways: replicated
    assert batch_sharding(mesh, (4, 7)).spec == P(("data", "fsdp"), None)
