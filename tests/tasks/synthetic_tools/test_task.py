"""gd2po_jax/tasks/synthetic_tools/task.py: the embedded default's data and its base model (tokenizer + tiny random
Qwen2 in Hugging Face format)."""

from __future__ import annotations

import numpy as np

from configs import tiny
from gd2po_jax.data.tokenization import eos_token_ids, load_tokenizer
from gd2po_jax.models import load_pretrained
from gd2po_jax.tasks.base import build_tiny_model
from gd2po_jax.tasks.synthetic_tools import task as embedded
from tests.fakes import as_run_config


def tiny_run_config(**synthetic):
    config = tiny.get_config()
    config.data.synthetic.update(synthetic)
    return as_run_config(config)


def test_synthetic_splits_have_the_configured_sizes_and_depend_only_on_the_seed():
    config = tiny_run_config()
    splits = embedded.synthetic_splits(config.data.synthetic)
    sizes = {name: len(split) for name, split in splits.items()}
    assert sizes == {"train": 64, "validation": 16, "test": 8}
    again = embedded.synthetic_splits(tiny_run_config().data.synthetic)
    for name in splits:
        assert splits[name].to_list() == again[name].to_list(), name
    other = embedded.synthetic_splits(tiny_run_config(seed=1).data.synthetic)
    assert other["train"]["ground_truth"] != splits["train"]["ground_truth"]
    # No request is in two splits.
    prompts = {name: {str(row) for row in split["prompt"]} for name, split in splits.items()}
    assert not (prompts["train"] & prompts["test"]) and not (prompts["train"] & prompts["validation"])


def test_base_model_is_a_loadable_hugging_face_directory_built_once(tmp_path):
    config = tiny_run_config()
    splits = embedded.synthetic_splits(config.data.synthetic)
    out = build_tiny_model(tmp_path / "base_model", embedded.tokenizer_corpus(splits), config.model.tiny,
                           config.data.synthetic.tokenizer_vocab_size)
    assert out == tmp_path / "base_model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base_model"]  # the staging directory is gone
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}

    tokenizer = load_tokenizer(out)
    assert len(tokenizer) <= config.data.synthetic.tokenizer_vocab_size
    text = tokenizer.apply_chat_template(list(splits["train"][0]["prompt"]), tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text  # the tokenizer covers the task's text
    assert eos_token_ids(tokenizer, out)

    model = load_pretrained(out)
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.hidden_size == 64 and model.config.num_layers == 2
    logits = np.asarray(model(np.asarray([ids[:16]])))
    assert logits.shape == (1, min(16, len(ids)), len(tokenizer)) and np.isfinite(logits).all()

    # Built once: a second call keeps the existing model, whatever it is asked for.
    written = (out / "model.safetensors").stat().st_mtime_ns
    other = tiny_run_config().model.tiny
    assert build_tiny_model(out, ["other words"], other, 100) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == written
