"""gd2po_jax.models.lora and the decoder's adapters: a fresh adapter is the base, merged = unmerged,
PEFT's format both ways, and gradients equal to transformers + peft autograd."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import AutoModelForCausalLM

from gd2po_jax.models import Decoder, load_pretrained
from gd2po_jax.models.decoder import LoRASpec
from gd2po_jax.models.lora import (
    adapters_of,
    load_peft_adapter,
    merged_decoder,
    plain_graphdef,
    read_adapter_config,
    save_peft_adapter,
    split_lora,
)
from gd2po_jax.models.sampling import generate
from tests.fakes import hf_forward_logits, hf_logits, logits_of, ragged_batch, tiny_checkpoint, tiny_model_config
from tests.tolerances import ulps

SPEC = LoRASpec(rank=4, alpha=8.0)


def perturbed(model: Decoder, seed: int = 1, scale: float = 0.1) -> Decoder:
    """``model`` with every adapter's B (and A) moved by random values: an adapter that changes the model."""
    rs = np.random.RandomState(seed)
    for _, _, adapter in adapters_of(model):
        for variable in (adapter.lora_a, adapter.lora_b):
            variable.set_value(variable[...] + scale * rs.standard_normal(variable.shape).astype(np.float32))
    return model


def test_a_fresh_adapter_reproduces_the_base_exactly():
    """PEFT's init (A random, B zero): the LoRA model's logits and samples are the base model's,
    bit for bit; the base state is that of the model without adapters (the same graph merges it)."""
    config = tiny_model_config()
    base = Decoder(config, rngs=nnx.Rngs(0))
    model = Decoder(config, rngs=nnx.Rngs(0), lora=SPEC)
    assert all(np.abs(np.asarray(a.lora_a[...])).max() > 0 for _, _, a in adapters_of(model))
    ids, mask = ragged_batch(lengths=(9, 4, 12, 1), width=12)
    ids = ids % config.vocab_size
    np.testing.assert_array_equal(logits_of(model, ids, mask), logits_of(base, ids, mask))
    prompts = [[5, 6, 7], [9, 3]]
    got = generate(model, prompts, max_new_tokens=6, rng=jax.random.key(3), num_samples=2)
    want = generate(base, prompts, max_new_tokens=6, rng=jax.random.key(3), num_samples=2)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    np.testing.assert_array_equal(np.asarray(got.logprobs), np.asarray(want.logprobs))
    graphdef, adapters, base_state = split_lora(model)
    assert {x.shape for x in jax.tree.leaves(adapters)} == {(32, 4), (4, 32), (4, 16), (64, 4), (4, 64)}
    reference = nnx.merge(plain_graphdef(model), base_state)  # the KL reference: the same arrays
    np.testing.assert_array_equal(logits_of(reference, ids, mask), logits_of(base, ids, mask))
    assert reference.embed[...] is base_state["embed"][...]


@pytest.mark.parametrize("targets, decode", [(SPEC.targets, "merged"), (("q", "v"), "per token"),
                                             (("o", "down"), None)])
def test_merged_decoder_and_sampler_compute_the_unmerged_model(targets, decode):
    """``W + (alpha/r) A @ B`` once (export, the sampler's decode weights) = the adapters applied per
    projection (the training forward); the sampler's decode with the adapters merged (its default)
    or applied per token (what docs/lora.md measures against merging) samples as the merged model."""
    config = tiny_model_config()
    model = perturbed(Decoder(config, rngs=nnx.Rngs(0), lora=LoRASpec(4, 8.0, targets=targets)))
    base = Decoder(config, rngs=nnx.Rngs(0))
    ids, mask = ragged_batch(width=12)
    ids = ids % config.vocab_size
    unmerged = logits_of(model, ids, mask)
    assert np.abs(unmerged - logits_of(base, ids, mask)).max() > 1e-2  # the adapters matter
    merged = merged_decoder(model)
    assert merged.lora is None and not adapters_of(merged) and adapters_of(model)
    np.testing.assert_allclose(logits_of(merged, ids, mask), unmerged, rtol=0, atol=ulps(unmerged, 64))
    if decode is None:
        return
    got = generate(model, [[5, 6, 7]], max_new_tokens=6, temperature=0.0, merge_adapters=decode == "merged")
    want = generate(merged, [[5, 6, 7]], max_new_tokens=6, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), rtol=0, atol=1e-5)


def test_peft_loads_the_adapter_and_computes_the_same_logits(tmp_path):
    """save_peft_adapter writes what ``peft.PeftModel.from_pretrained`` loads on the base; its logits
    are ours; load_peft_adapter reads it back to the same arrays."""
    from peft import PeftModel

    path, _ = tiny_checkpoint("qwen2", False)
    model = perturbed(load_pretrained(path, lora=SPEC, lora_seed=3))
    save_peft_adapter(model, tmp_path / "adapter", path)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["base_model_name_or_path"] == str(path)
    assert config["target_modules"] == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                               "down_proj"])
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), tmp_path / "adapter").eval()
    ids, mask = ragged_batch()
    want = hf_logits(peft_model, ids, mask)
    got = logits_of(model, ids, mask)
    real = mask.astype(bool)
    assert float(np.abs(got - want)[real].max()) < 1e-4
    assert float(np.abs(want - hf_logits(AutoModelForCausalLM.from_pretrained(path), ids, mask))[real].max()) > 1e-2

    spec, base_path = read_adapter_config(tmp_path / "adapter")
    assert spec == SPEC and base_path == str(path)
    again = load_pretrained(path, lora=spec)
    load_peft_adapter(again, tmp_path / "adapter")
    for (_, _, a), (_, _, b) in zip(adapters_of(again), adapters_of(model)):
        np.testing.assert_array_equal(np.asarray(a.lora_a[...]), np.asarray(b.lora_a[...]))
        np.testing.assert_array_equal(np.asarray(a.lora_b[...]), np.asarray(b.lora_b[...]))


def test_an_adapter_this_package_cannot_load_is_named(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "lm_head"], "use_dora": True,
         "layers_to_transform": [0], "exclude_modules": None, "modules_to_save": None}))
    with pytest.raises(ValueError, match=r"adapter_config.json.*use_dora=True.*layers_to_transform=\[0\].*lm_head"):
        read_adapter_config(tmp_path)


def test_an_adapter_with_tensors_the_model_has_no_place_for_is_refused(tmp_path):
    """modules_to_save (here the output head) would be silently dropped: refused, naming them."""
    from safetensors.numpy import load_file, save_file

    path, _ = tiny_checkpoint("qwen2", False)
    model = load_pretrained(path, lora=SPEC)
    save_peft_adapter(model, tmp_path, path)
    tensors = load_file(tmp_path / "adapter_model.safetensors")
    save_file(tensors | {"base_model.model.lm_head.weight": np.zeros((128, 32), np.float32)},
              tmp_path / "adapter_model.safetensors")
    with pytest.raises(ValueError, match=r"no place for .*'base_model.model.lm_head.weight'"):
        load_peft_adapter(load_pretrained(path, lora=SPEC), tmp_path)


def _peft_grads(model, ids, mask, weights) -> dict[str, np.ndarray]:
    """Gradients of ``sum(weights * log p(next token))`` for the trainable (adapter) tensors, by name."""
    model.zero_grad()
    logits = hf_forward_logits(model, ids, mask)[:, :-1]
    logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[:, 1:])[..., None])[..., 0]
    (logp * torch.tensor(weights)).sum().backward()
    return {name.replace(".default", ""): p.grad.numpy().copy() for name, p in model.named_parameters()
            if p.requires_grad}


def test_lora_gradients_match_transformers_and_peft(tmp_path):
    """The adapters' gradients (through `linear`, nnx.LoRA, the scale) are PEFT's autograd ones for
    every adapter tensor; the base gets none (it is not differentiated)."""
    from peft import PeftModel

    path, _ = tiny_checkpoint("qwen2", False)
    model = perturbed(load_pretrained(path, lora=SPEC, lora_seed=5), seed=2)
    save_peft_adapter(model, tmp_path / "adapter", path)
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), tmp_path / "adapter",
                                           is_trainable=True)
    peft_model.train()  # dropout is 0: the same function
    ids, mask = ragged_batch()
    weights = (mask[:, :-1] * mask[:, 1:]).astype(np.float32)
    weights *= np.random.RandomState(1).uniform(0.5, 1.5, size=weights.shape).astype(np.float32)
    graphdef, adapters, base = split_lora(model)

    @jax.jit
    def grads(adapters, base):
        def objective(adapters):
            logits = nnx.merge(graphdef, adapters, base)(ids, attention_mask=mask)
            logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
            return jnp.sum(jnp.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0] * weights)

        return jax.grad(objective)(adapters)

    ours = nnx.merge(graphdef, grads(adapters, base), base)
    want = _peft_grads(peft_model, ids, mask, weights)
    assert len(want) == 2 * len(adapters_of(ours)) == 2 * 7 * 2
    from gd2po_jax.models.lora import peft_name

    for i, target, adapter in adapters_of(ours):
        for factor, variable in (("A", adapter.lora_a), ("B", adapter.lora_b)):
            name = peft_name(i, target, factor)
            got, expected = np.asarray(variable[...]).T, want[name]
            np.testing.assert_allclose(got, expected, rtol=0, atol=ulps(expected, 64), err_msg=name)
            assert np.abs(expected).max() > 0, name


def test_adapter_dropout_drops_only_the_adapters_inputs():
    """lora_dropout=(key, rate): a fresh adapter (B = 0) still gives the base bit for bit (dropout is on
    the adapter's branch only); a trained one gives other hidden states, the same for the same key,
    with and without remat; rate 0 is no dropout."""
    config = tiny_model_config()
    ids, mask = ragged_batch(width=12)
    ids = ids % config.vocab_size
    fresh = Decoder(config, rngs=nnx.Rngs(0), lora=SPEC)
    hidden = jax.jit(lambda m, key, rate: m.hidden_states(ids, mask, lora_dropout=(key, rate))[0],
                     static_argnums=2)
    plain_fn = jax.jit(lambda m: m.hidden_states(ids, mask)[0])
    plain = lambda m: np.asarray(plain_fn(m))  # noqa: E731
    key = jax.random.key(4)
    np.testing.assert_array_equal(np.asarray(hidden(fresh, key, 0.5)), plain(fresh))
    model = perturbed(Decoder(config, rngs=nnx.Rngs(0), lora=SPEC))
    dropped = np.asarray(hidden(model, key, 0.5))
    assert np.abs(dropped - plain(model)).max() > 1e-3
    np.testing.assert_array_equal(np.asarray(hidden(model, key, 0.5)), dropped)
    assert np.abs(np.asarray(hidden(model, jax.random.key(5), 0.5)) - dropped).max() > 1e-3
    np.testing.assert_array_equal(np.asarray(hidden(model, key, 0.0)), plain(model))
    remat = perturbed(Decoder(config, rngs=nnx.Rngs(0), lora=SPEC, remat=True))
    np.testing.assert_allclose(np.asarray(hidden(remat, key, 0.5)), dropped, rtol=0, atol=ulps(dropped, 8))
