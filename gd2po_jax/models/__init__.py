"""Decoder-only language models (Qwen2/Qwen2.5, Qwen3, Llama 3) in Flax NNX with HF checkpoint I/O."""

from gd2po_jax.models.config import ModelConfig, RopeConfig, config_from_hf_dict, load_config
from gd2po_jax.models.decoder import Decoder, KVCache, default_positions, init_cache
from gd2po_jax.models.pretrained import load_pretrained, save_pretrained

__all__ = [
    "Decoder",
    "KVCache",
    "ModelConfig",
    "RopeConfig",
    "config_from_hf_dict",
    "default_positions",
    "init_cache",
    "load_config",
    "load_pretrained",
    "save_pretrained",
]
