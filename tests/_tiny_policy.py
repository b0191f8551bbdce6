"""A tiny random Qwen2 policy in Hugging Face format whose tokenizer is trained on the real
tool-calling data in ../shared, so RLLA and API-Bank prompts tokenize to a few hundred tokens
(at most ~2,100 for the longest RLLA prompt). Built once per process."""

from __future__ import annotations

import functools
import pathlib
import tempfile

import jax.numpy as jnp
from flax import nnx

from gd2po_jax.data.loaders import load_api_bank, load_verl_parquet
from gd2po_jax.models import Decoder, ModelConfig, save_pretrained
from gd2po_jax.tasks.tokenizer import build_tokenizer

_ROOT = tempfile.TemporaryDirectory(prefix="gd2po_tiny_policy_")


def shared_corpus(shared_dir: pathlib.Path) -> list[str]:
    """Every message of the RLLA test split and of the API-Bank files, plus the RLLA ground truths."""
    rlla = load_verl_parquet(shared_dir / "data" / "rlla_4k" / "test.parquet").dataset
    api_bank = load_api_bank(shared_dir / "data" / "api_bank").dataset
    texts = [m["content"] for d in (rlla, api_bank) for p in d["prompt"] for m in p]
    return texts + list(rlla["ground_truth"])


@functools.lru_cache(maxsize=None)
def tiny_policy(shared_dir: pathlib.Path, vocab_size: int = 8192, seed: int = 0) -> pathlib.Path:
    """Directory of a tokenizer (ChatML template, EOS <|im_end|>) and a random 1-layer Qwen2."""
    out_dir = pathlib.Path(_ROOT.name) / f"qwen2-tiny-{vocab_size}-{seed}"
    tokenizer = build_tokenizer(shared_corpus(shared_dir), vocab_size)
    config = ModelConfig(
        model_type="qwen2", vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_layers=1,
        num_heads=2, num_kv_heads=1, head_dim=16, qkv_bias=True, tie_word_embeddings=True,
        max_position_embeddings=8192,
    )
    model = Decoder(config, dtype=jnp.float32, rngs=nnx.Rngs(seed))
    save_pretrained(model, out_dir, tokenizer=tokenizer)
    return out_dir
