"""gd2po_jax/evaluation/policy.py: a policy from a model directory (a PEFT adapter on its base). A
training run's policies (checkpoints, the exported policy) are tested with eval.py's, in
tests/evaluation/test_command.py, on its one training run."""

import numpy as np
import pytest

from gd2po_jax.data.tokenization import load_tokenizer
from gd2po_jax.evaluation.policy import EvalError, policy_from_model_path
from gd2po_jax.models import load_pretrained
from tests.fakes import tiny_policy


def test_a_peft_adapter_directory_is_evaluated_on_its_base(tmp_path):
    """--model_path=ADAPTER_DIR (a run's policy_adapter/): the base its adapter_config.json names, with
    the adapters loaded (the same logits), the base's tokenizer; an adapter of a missing base is named."""
    import json as json_module

    from gd2po_jax.models.decoder import LoRASpec
    from gd2po_jax.models.lora import adapters_of, save_peft_adapter

    base = tiny_policy()
    model = load_pretrained(base, lora=LoRASpec(4, 8.0))
    for _, _, adapter in adapters_of(model):
        adapter.lora_b.set_value(adapter.lora_b[...] + 0.1)
    save_peft_adapter(model, tmp_path / "adapter", base)
    policy = policy_from_model_path(str(tmp_path / "adapter"), "float32")
    assert policy.source == {"model_path": str(tmp_path / "adapter"), "base_model": str(base)}
    assert policy.tokenizer.vocab_size == load_tokenizer(base).vocab_size
    ids = np.array([[3, 9, 27, 81]], np.int32)
    np.testing.assert_allclose(np.asarray(policy.model(ids)), np.asarray(model(ids)), rtol=0, atol=1e-5)
    config = json_module.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (tmp_path / "adapter" / "adapter_config.json").write_text(json_module.dumps(config))
    with pytest.raises(EvalError, match=r"--model_path=.*adapter.*base_model_name_or_path"):
        policy_from_model_path(str(tmp_path / "adapter"), "float32")
