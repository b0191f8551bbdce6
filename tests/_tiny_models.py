"""Tiny random transformers checkpoints for parity tests (built locally, nothing downloaded)."""

from __future__ import annotations

import functools
import pathlib
import tempfile

import jax
import numpy as np
import torch
from flax import nnx
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

VOCAB = 128
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
FAMILIES = {
    "qwen2": lambda tie: Qwen2Config(**COMMON, tie_word_embeddings=tie, rope_theta=1e6),
    "qwen3": lambda tie: Qwen3Config(**COMMON, tie_word_embeddings=tie, head_dim=16),
    # llama3 rope scaling with a short original context so all three frequency bands occur.
    "llama3": lambda tie: LlamaConfig(
        **COMMON,
        tie_word_embeddings=tie,
        rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
}
_ROOT = tempfile.TemporaryDirectory(prefix="gd2po_tiny_models_")


def build_hf_model(family: str, tie: bool, seed: int = 0):
    """A random ``*ForCausalLM`` in eval mode; every weight (biases and norms too) is perturbed so
    that a forgotten bias, norm or transpose shows in the logits."""
    torch.manual_seed(seed)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(FAMILIES[family](tie)).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn_like(param))
    return model


@functools.lru_cache(maxsize=None)
def tiny_checkpoint(family: str, tie: bool = False, seed: int = 0) -> tuple[pathlib.Path, torch.nn.Module]:
    """(directory, torch model) of a saved tiny checkpoint, built once per process."""
    model = build_hf_model(family, tie, seed)
    directory = pathlib.Path(_ROOT.name) / f"{family}-{'tied' if tie else 'untied'}-{seed}"
    model.save_pretrained(directory)
    return directory, model


def ragged_batch(seed: int = 0, lengths=(9, 4, 12, 1), width: int = 12):
    """Left-padded ``(ids, mask)`` int64 numpy arrays ``[B, width]`` with the given prompt lengths."""
    rs = np.random.RandomState(seed)
    ids = np.zeros((len(lengths), width), np.int64)
    mask = np.zeros((len(lengths), width), np.int64)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = rs.randint(0, VOCAB, n)
        mask[i, width - n :] = 1
    return ids, mask


def hf_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """transformers logits ``[B, T, V]`` with generate's positions (cumsum(mask) - 1)."""
    positions = np.clip(mask.cumsum(-1) - 1, 0, None)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            position_ids=torch.tensor(positions),
        )
    return out.logits.float().numpy()


@nnx.jit
def jax_logits(model, ids, mask):
    """Jitted ``model(ids, attention_mask=mask)``."""
    return model(ids, attention_mask=mask)


def logits_of(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.asarray(jax.device_get(jax_logits(model, ids, mask)))
