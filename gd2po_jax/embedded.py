"""The embedded default's assets: the synthetic task's data, a tokenizer trained on it, and a tiny
random Qwen2 checkpoint in Hugging Face format, so the default run takes the code paths of a real
one (config.json + safetensors + tokenizer files + chat template)."""

from __future__ import annotations

import pathlib
import shutil
from collections.abc import Iterable

import datasets
import jax.numpy as jnp
from flax import nnx

from gd2po_jax.config import SyntheticDataConfig, TinyModelConfig
from gd2po_jax.models import Decoder, ModelConfig, save_pretrained
from gd2po_jax.run_dir import publish_dir, staging_name
from gd2po_jax.tasks import synthetic_tools
from gd2po_jax.tasks.tokenizer import build_tokenizer


def synthetic_splits(data_config: SyntheticDataConfig) -> datasets.DatasetDict:
    """Train / validation / test splits of the synthetic tool-calling task (``config.data.synthetic``)."""
    return synthetic_tools.make_splits(data_config.task_config())


def build_base_model(out_dir: pathlib.Path, splits: datasets.DatasetDict, tiny: TinyModelConfig,
                     vocab_size: int, corpus: Iterable[str] | None = None) -> pathlib.Path:
    """Write a tokenizer trained on ``splits`` and a random tiny Qwen2 to ``out_dir`` (once).

    Args:
      out_dir: target directory; if it already holds config.json the existing model is kept.
      splits: the task data (the tokenizer is trained on the train split and the tool texts).
      tiny: ``config.model.tiny`` (hidden_size, num_layers, ... and seed).
      vocab_size: tokenizer vocabulary budget.
      corpus: the tokenizer's training texts, for another task's data (the safety_embedded task);
        None: ``splits`` and the tool-calling world's texts.

    Returns:
      ``out_dir``.
    """
    out_dir = pathlib.Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    staging = staging_name(out_dir)  # unique to this process: concurrent builders never share it
    if corpus is None:
        corpus = [*synthetic_tools.iter_corpus(splits["train"]), *synthetic_tools.tool_corpus()]
    tokenizer = build_tokenizer(corpus, vocab_size)
    model_config = ModelConfig(
        model_type="qwen2",
        vocab_size=len(tokenizer),
        hidden_size=tiny.hidden_size,
        intermediate_size=tiny.intermediate_size,
        num_layers=tiny.num_layers,
        num_heads=tiny.num_heads,
        num_kv_heads=tiny.num_kv_heads,
        head_dim=tiny.head_dim,
        qkv_bias=True,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    )
    model = Decoder(model_config, dtype=jnp.float32, rngs=nnx.Rngs(tiny.seed))
    try:
        save_pretrained(model, staging, tokenizer=tokenizer)
        if not publish_dir(staging, out_dir):  # another process built the same model meanwhile
            return out_dir
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir
