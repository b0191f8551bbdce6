"""gd2po_jax.models: parity with transformers, checkpoint round trips, KV cache, errors."""

import dataclasses
import functools
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import AutoModelForCausalLM

from gd2po_jax.models import (
    Decoder,
    config_from_hf_dict,
    init_cache,
    load_hf_config,
    load_pretrained,
    save_pretrained,
)
from gd2po_jax.models.decoder import MASK_VALUE, attention_mask_3d, dot_product_attention, linear
from gd2po_jax.models.pretrained import ModelDirError, get_variable, ours_to_hf, tensor_maps
from gd2po_jax.models.safetensors_io import SafetensorsCheckpoint, read_header, write_file
from gd2po_jax.models.logprobs import completion_logprobs
from gd2po_jax.runtime.sharding import make_mesh
from tests.fakes import (
    VOCAB,
    build_hf_model,
    hf_forward_logits,
    hf_logits,
    logits_of,
    ragged_batch,
    tiny_checkpoint,
    tiny_model_config,
)
from tests.tolerances import ulps

CASES = [("qwen2", True), ("qwen2", False), ("qwen3", False), ("qwen3", True), ("llama3", False), ("llama3", True)]


def _max_diff_on_tokens(a, b, mask):
    return float(np.abs(a - b)[mask.astype(bool)].max())


@pytest.mark.parametrize("family,tie", CASES, ids=[f"{f}-{'tied' if t else 'untied'}" for f, t in CASES])
def test_logits_match_transformers_on_left_padded_batch(family, tie):
    path, hf = tiny_checkpoint(family, tie)
    ids, mask = ragged_batch()
    model = load_pretrained(path)
    assert (model.lm_head is None) == tie
    ours = logits_of(model, ids, mask)
    ref = hf_logits(hf, ids, mask)
    assert ours.shape == (4, 12, VOCAB) and ours.dtype == np.float32
    assert np.abs(ref).max() > 0.5  # the comparison is not trivially small numbers
    assert _max_diff_on_tokens(ours, ref, mask) < 1e-4


def test_config_fields_per_family():
    qwen2 = load_hf_config(tiny_checkpoint("qwen2", True)[0])
    qwen3 = load_hf_config(tiny_checkpoint("qwen3", False)[0])
    llama = load_hf_config(tiny_checkpoint("llama3", False)[0])
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.qk_norm, qwen2.tie_word_embeddings) == (True, False, False, True)
    assert (qwen3.qkv_bias, qwen3.qk_norm, qwen3.head_dim) == (False, True, 16)
    assert llama.rope.rope_type == "llama3" and llama.rope.param("factor") == 8.0


@pytest.mark.parametrize("family,tie", [("qwen2", True), ("llama3", False)])
def test_num_params_matches_transformers(family, tie):
    _, hf = tiny_checkpoint(family, tie)
    config = config_from_hf_dict(hf.config.to_dict())
    assert config.num_params() == sum(p.numel() for p in hf.parameters())


def test_legacy_rope_fields_are_read():
    hf = build_hf_model("llama3", False).config.to_dict()
    legacy = {k: v for k, v in hf.items() if k != "rope_parameters"}
    legacy["rope_theta"] = 500000.0
    legacy["rope_scaling"] = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    assert config_from_hf_dict(legacy).rope == config_from_hf_dict(hf).rope


def test_logits_of_a_slice_of_hidden_states_equal_the_full_forward():
    path, _ = tiny_checkpoint("qwen2", True)
    model = load_pretrained(path)
    ids, mask = ragged_batch()
    logits = logits_of(model, ids, mask)
    hidden, _ = model.hidden_states(jnp.asarray(ids), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(model.logits(hidden[:, 3:6])), logits[:, 3:6], atol=1e-5)


WINDOW_CASES = [(1, False), (2, False), (2, True), (3, True)]


@pytest.mark.parametrize("layers,remat", WINDOW_CASES,
                         ids=[f"{n}-layers{'-remat' if r else ''}" for n, r in WINDOW_CASES])
def test_a_window_of_hidden_states_is_the_full_forwards_slice_for_less_work(layers, remat):
    """hidden_states(window=(a, n)): the last layer at positions a..a+n-1 alone gives those rows of the
    full forward and the same gradients, in a program of fewer operations."""
    config = tiny_model_config(model_type="qwen3", qkv_bias=False, qk_norm=True, num_layers=layers)
    ids, mask = ragged_batch(lengths=(9, 4, 12, 1), width=12)
    ids = jnp.asarray(ids % 64)
    first, count = 5, 6
    weights = jnp.asarray(np.random.RandomState(2).normal(size=(4, count, config.hidden_size)), jnp.float32)
    graphdef, params = nnx.split(Decoder(config, rngs=nnx.Rngs(3), remat=remat), nnx.Param)

    def loss(params, window):
        model = nnx.merge(graphdef, params)
        if window:
            hidden = model.hidden_states(ids, mask, window=(first, count))[0]
        else:
            hidden = model.hidden_states(ids, mask)[0][:, first : first + count]
        return jnp.sum(hidden * weights), hidden

    def run(window):
        fn = jax.jit(jax.value_and_grad(functools.partial(loss, window=window), has_aux=True))
        flops = jax.jit(functools.partial(loss, window=window)).lower(params).compile().cost_analysis()["flops"]
        return fn(params), flops

    ((want_loss, want_hidden), want), full_flops = run(False)
    ((got_loss, got_hidden), got), window_flops = run(True)
    assert got_hidden.shape == (4, count, config.hidden_size)
    np.testing.assert_allclose(np.asarray(got_hidden), np.asarray(want_hidden), rtol=1e-5, atol=ulps(want_hidden, 8))
    assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-5)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=ulps(b, 16))
    # The last layer's queries, attention output and MLP at 6 of 12 positions. (With remat XLA's
    # cost analysis counts a scan's body once, whatever its length: no comparison.)
    if not remat:
        assert window_flops < (1 - 0.3 / layers) * full_flops, (window_flops, full_flops)


def test_a_window_is_refused_with_a_cache_or_outside_the_sequence():
    model = Decoder(tiny_model_config(), rngs=nnx.Rngs(0))
    ids, mask = ragged_batch(lengths=(3, 2), width=4)
    for window in [(0, 0), (-1, 2), (2, 3)]:
        with pytest.raises(ValueError, match="window"):
            model.hidden_states(jnp.asarray(ids), jnp.asarray(mask), window=window)
    with pytest.raises(ValueError, match="no cache"):
        model.hidden_states(jnp.asarray(ids), jnp.asarray(mask), cache=init_cache(model.config, 2, 8), window=(0, 2))


def _softmax_attention(q, k, v, mask):
    """The attention of `dot_product_attention` written out, for autodiff: q [B, T, H, hd], k, v [B, KV, S, hd]."""
    b, t, h, hd = q.shape
    kv = k.shape[1]
    scores = jnp.einsum("btkgd,bksd->bkgts", q.reshape(b, t, kv, h // kv, hd), k,
                        preferred_element_type=jnp.float32) * hd**-0.5
    probs = jax.nn.softmax(jnp.where(mask[:, None, None], scores, MASK_VALUE), axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bksd->btkgd", probs, v).reshape(b, t, h, hd)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_attentions_backward_is_the_softmaxs_autodiff(dtype):
    """`dot_product_attention`'s own backward (row sums from the output) gives autodiff's gradients:
    grouped queries (2 per key head), left padding, and query rows that see no key (uniform weights,
    no gradient through the masked scores)."""
    rs = np.random.RandomState(0)
    b, t, h, kv, hd = 3, 7, 4, 2, 8
    q, k, v, cotangent = (jnp.asarray(rs.normal(size=shape), dtype) for shape in
                          [(b, t, h, hd), (b, kv, t, hd), (b, kv, t, hd), (b, t, h, hd)])
    key_valid = jnp.asarray(np.arange(t)[None, :] >= np.array([[0], [3], [6]]))
    mask = attention_mask_3d(key_valid, jnp.zeros((), jnp.int32), t)
    assert not bool(mask[1, 0].any())  # row 1's first query sees no key

    def value_and_vjp(fn):
        value, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, mask), q, k, v)
        return (value, *vjp(cotangent))

    got = jax.jit(lambda: value_and_vjp(dot_product_attention))()
    want = jax.jit(lambda: value_and_vjp(_softmax_attention))()
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        bound = ulps(w, 64) if dtype == "float32" else ulps(w, 4, jnp.bfloat16)
        np.testing.assert_allclose(g, w, rtol=0, atol=bound)
    assert float(np.abs(np.asarray(want[1], np.float32)).max()) > 0


def test_cached_prefill_then_decode_matches_full_forward():
    path, _ = tiny_checkpoint("qwen3", False)
    model = load_pretrained(path)
    ids, mask = ragged_batch()
    full = logits_of(model, ids, mask)

    @nnx.jit
    def step(model, ids, mask, cache):
        return model(ids, attention_mask=mask, cache=cache)

    cache = init_cache(model.config, ids.shape[0], 16)
    logits, cache = step(model, ids[:, :8], mask[:, :8], cache)
    pieces = [np.asarray(logits)]
    for t in range(8, 12):
        logits, cache = step(model, ids[:, t : t + 1], mask[:, t : t + 1], cache)
        pieces.append(np.asarray(logits))
    assert int(cache.index) == 12
    assert _max_diff_on_tokens(np.concatenate(pieces, axis=1), full, mask) < 1e-5


@pytest.mark.parametrize("family,tie", [("qwen2", True), ("qwen3", False), ("llama3", False)])
def test_round_trip_transformers_loads_saved_model(family, tie, tmp_path):
    path, hf = tiny_checkpoint(family, tie)
    model = load_pretrained(path)
    files = save_pretrained(model, tmp_path / "out", copy_files_from=path)
    assert "model.safetensors" in files and "generation_config.json" in files
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(reloaded) is type(hf)
    assert reloaded.config.tie_word_embeddings == tie
    ids, mask = ragged_batch(seed=1)
    np.testing.assert_array_equal(hf_logits(reloaded, ids, mask), hf_logits(hf, ids, mask))


def test_bfloat16_load_and_save(tmp_path):
    path, hf = tiny_checkpoint("qwen2", False)
    model = load_pretrained(path, dtype=jnp.bfloat16)
    assert model.layers[0].attn.q_kernel[...].dtype == jnp.bfloat16
    ids, mask = ragged_batch()
    ours = logits_of(model, ids, mask)
    assert ours.dtype == np.float32
    assert _max_diff_on_tokens(ours, hf_logits(hf, ids, mask), mask) < 0.1
    save_pretrained(model, tmp_path / "bf16")
    header, _ = read_header(tmp_path / "bf16" / "model.safetensors")
    assert {entry["dtype"] for entry in header.values()} == {"BF16"}
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    expected = hf.model.layers[1].mlp.down_proj.weight.to(torch.bfloat16)
    assert torch.equal(reloaded.model.layers[1].mlp.down_proj.weight, expected)


def test_sharded_checkpoint_with_index_loads_and_saves(tmp_path):
    _, hf = tiny_checkpoint("llama3", False)
    hf.save_pretrained(tmp_path / "src", max_shard_size="40KB")
    assert (tmp_path / "src" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "src").glob("*.safetensors"))) > 1
    model = load_pretrained(tmp_path / "src")
    files = save_pretrained(model, tmp_path / "dst", max_shard_bytes=40_000)
    assert "model.safetensors.index.json" in files and len(files) > 3
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "dst").eval()
    ids, mask = ragged_batch()
    np.testing.assert_array_equal(hf_logits(reloaded, ids, mask), hf_logits(hf, ids, mask))


def _copy_checkpoint(tmp_path, family="qwen2", tie=True):
    src, _ = tiny_checkpoint(family, tie)
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def test_unknown_architecture_names_file_and_model_type(tmp_path):
    ckpt = _copy_checkpoint(tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    config["model_type"] = "gpt2"
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json.*'gpt2'.*qwen2"):
        load_pretrained(ckpt)


def test_missing_tensor_names_tensor_shape_and_files(tmp_path):
    ckpt = _copy_checkpoint(tmp_path)
    reader = SafetensorsCheckpoint(ckpt)
    kept = [n for n in sorted(reader.names()) if n != "model.layers.1.self_attn.k_proj.weight"]
    tensors = []
    for name in kept:
        array = np.array(reader._entries[name] and reader.get(name, reader._entries[name][1]["shape"]))
        tensors.append((name, array.shape, array.dtype, lambda a=array: a))
    write_file(ckpt / "model.safetensors", tensors)
    with pytest.raises(ModelDirError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight.*\(16, 32\).*model\.safetensors"):
        load_pretrained(ckpt)


def test_wrong_shape_names_file_tensor_and_expected_shape(tmp_path):
    ckpt = _copy_checkpoint(tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    config["intermediate_size"] = 48
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"model\.safetensors.*mlp\.gate_proj\.weight.*\(64, 32\).*\(48, 32\)"):
        load_pretrained(ckpt)


@pytest.mark.parametrize("keep", ["most", "part of the header"])
def test_a_truncated_safetensors_file_is_named(tmp_path, keep):
    ckpt = _copy_checkpoint(tmp_path)
    file = ckpt / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) - 1000] if keep == "most" else data[:100])
    with pytest.raises(ValueError, match=rf"{file}.* truncated"):
        load_pretrained(ckpt)


def test_unexpected_tensors_are_reported(tmp_path):
    ckpt = _copy_checkpoint(tmp_path, "qwen3", False)
    config = json.loads((ckpt / "config.json").read_text())
    config["model_type"] = "llama"  # llama has no q_norm / k_norm
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"q_norm"):
        load_pretrained(ckpt)


def test_sliding_window_is_rejected(tmp_path):
    ckpt = _copy_checkpoint(tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    config["use_sliding_window"] = True
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="sliding-window"):
        load_pretrained(ckpt)


@pytest.mark.slow
def test_remat_gives_identical_loss_and_gradients():
    config = tiny_model_config(model_type="qwen3", qkv_bias=False, qk_norm=True)
    ids, mask = ragged_batch(lengths=(6, 3), width=6)
    ids = ids % 64

    def grads(remat):
        model = Decoder(config, rngs=nnx.Rngs(3), remat=remat)

        @nnx.jit
        def loss_and_grad(model):
            loss = lambda m: -jnp.mean(completion_logprobs(m, ids, mask, ids.shape[1] - 2)[0])  # noqa: E731
            return nnx.value_and_grad(loss)(model)

        return loss_and_grad(model)

    (loss_a, grad_a), (loss_b, grad_b) = grads(False), grads(True)
    assert float(loss_a) == pytest.approx(float(loss_b), abs=ulps(loss_b, 4))
    for a, b in zip(jax.tree.leaves(grad_a), jax.tree.leaves(grad_b)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=ulps(b, 8))
    assert float(jnp.abs(grad_a.layers[0].attn.q_kernel[...]).max()) > 0


def _grad_program_temp_bytes(config, remat: bool, batch: int, length: int) -> int:
    """XLA's temporary bytes of the compiled gradient of a sum over the final hidden states (no
    array is allocated: the model and inputs are abstract)."""
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0), remat=remat)), nnx.Param)

    def loss(params, ids, mask):
        hidden, _ = nnx.merge(graphdef, params).hidden_states(ids, mask)
        return jnp.sum(hidden**2)

    spec = lambda dtype: jax.ShapeDtypeStruct((batch, length), dtype)  # noqa: E731
    compiled = jax.jit(jax.grad(loss)).lower(params, spec(jnp.int32), spec(jnp.bool_)).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_remat_keeps_each_layers_recomputation_to_its_own_backward_iteration():
    """With remat the layers run as one scan, so a layer's attention tensors live only while its own
    backward runs: each extra layer adds its saved input [B, T, D], not its [B, H, T, T] scores. (As a
    Python loop of `nnx.remat` layers, XLA:CPU kept every layer's recomputation alive: about five
    score tensors per layer, with remat or without.)"""
    config = tiny_model_config(hidden_size=64, intermediate_size=128, num_heads=8, num_kv_heads=2, head_dim=8)
    batch, length = 2, 256
    scores = batch * config.num_heads * length * length * 4  # one float32 score tensor of a layer

    def per_layer(remat):
        two, six = (_grad_program_temp_bytes(dataclasses.replace(config, num_layers=n), remat, batch, length)
                    for n in (2, 6))
        return (six - two) / 4

    plain, remat = per_layer(False), per_layer(True)
    assert plain > 2 * scores, (plain, scores)  # the loop without remat keeps several per layer
    assert remat < 0.25 * scores, (remat, scores)  # the scan keeps the layer's input (32 KiB here)


def test_remat_on_a_mesh_has_the_unsharded_loss_and_gradients():
    """The scanned layers stack parameters sharded over fsdp and tensor: the sharded program computes
    what one device does."""
    directory, _ = tiny_checkpoint("qwen2", tie=True)
    ids, mask = ragged_batch(lengths=(6, 3, 5, 2), width=6)

    def loss_and_grads(model):
        graphdef, params = nnx.split(model, nnx.Param)
        loss = lambda p: -jnp.mean(completion_logprobs(nnx.merge(graphdef, p), ids, mask, 3)[0])  # noqa: E731
        return jax.jit(jax.value_and_grad(loss))(params)

    want_loss, want = loss_and_grads(load_pretrained(directory))
    got_loss, got = loss_and_grads(load_pretrained(directory, mesh=make_mesh(data=2, fsdp=2, tensor=2), remat=True))
    assert float(got_loss) == pytest.approx(float(want_loss), abs=ulps(want_loss, 8))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=ulps(b, 16))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("x_shape", [(7, 5), (2, 3, 5)], ids=["2d", "3d"])
def test_linear_has_the_plain_products_value_and_gradients(x_shape, dtype):
    rs = np.random.RandomState(0)
    x = jnp.asarray(rs.normal(size=x_shape), dtype)
    kernel = jnp.asarray(rs.normal(size=(5, 4)), dtype)
    cotangent = jnp.asarray(rs.normal(size=x_shape[:-1] + (4,)), dtype)

    def value_and_vjp(fn):
        value, vjp = jax.vjp(fn, x, kernel)
        return (value, *vjp(cotangent))

    got = jax.jit(lambda: value_and_vjp(linear))()
    want = jax.jit(lambda: value_and_vjp(lambda a, b: a @ b))()
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        # bf16: one rounding of the same sums, summed in another order.
        np.testing.assert_allclose(g, w, rtol=0, atol=8 * float(jnp.finfo(dtype).eps) * np.abs(w).max())


def _hf_grads(model, ids, mask, weights):
    """Gradients (by tensor name) of ``sum(weights * log p(next token))`` in transformers."""
    model.zero_grad()
    logp = torch.log_softmax(hf_forward_logits(model, ids, mask)[:, :-1], -1).gather(-1, torch.tensor(ids[:, 1:])[..., None])[..., 0]
    (logp * torch.tensor(weights)).sum().backward()
    return {name: param.grad.numpy().copy() for name, param in model.named_parameters()}


@pytest.mark.parametrize("family,tie", [("qwen2", True), ("qwen3", False), ("llama3", False)])
def test_gradients_match_transformers(family, tie):
    """The backward pass (incl. `linear`'s) gives transformers' gradients for every tensor."""
    path, hf_model = tiny_checkpoint(family, tie)
    ids, mask = ragged_batch()
    # Only the log-probs of real tokens after a real token (left-padded rows).
    weights = (mask[:, :-1] * mask[:, 1:]).astype(np.float32)
    weights *= np.random.RandomState(1).uniform(0.5, 1.5, size=weights.shape).astype(np.float32)
    model = load_pretrained(path)

    @nnx.jit
    def grads(model):
        def objective(m):
            logp = jax.nn.log_softmax(m(ids, attention_mask=mask)[:, :-1], axis=-1)
            return jnp.sum(jnp.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0] * weights)

        return nnx.grad(objective)(model)

    ours = grads(model)
    want = _hf_grads(hf_model, ids, mask, weights)
    for tm in tensor_maps(model.config):
        got = ours_to_hf(np.asarray(get_variable(ours, tm.path)[...]), tm.kind)
        expected = want[tm.hf_name]
        assert got.shape == expected.shape, tm.hf_name
        # float32 sums over 4 rows x 11 positions, in different orders: a bound relative to the
        # tensor's largest gradient.
        np.testing.assert_allclose(got, expected, rtol=0, atol=ulps(expected, 64), err_msg=tm.hf_name)
    assert float(np.abs(want["model.layers.0.mlp.gate_proj.weight"]).max()) > 0
