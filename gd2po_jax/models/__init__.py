"""Decoder-only language models (Qwen2/Qwen2.5, Qwen3, Llama 3) and score models built on them, in Flax
NNX, with HF checkpoint I/O.

May import: errors, config, runtime.
"""

from gd2po_jax.models.config import ModelConfig, RopeConfig, config_from_hf_dict, load_hf_config
from gd2po_jax.models.decoder import Decoder, KVCache, default_positions, init_cache
from gd2po_jax.models.pretrained import load_pretrained, save_pretrained
from gd2po_jax.models.score_model import (
    SCORE_LAYOUTS,
    ScoreModel,
    ScoreNormalizer,
    load_score_model,
    save_score_model,
    score_fn,
)

__all__ = [
    "Decoder",
    "KVCache",
    "ModelConfig",
    "RopeConfig",
    "SCORE_LAYOUTS",
    "ScoreModel",
    "ScoreNormalizer",
    "config_from_hf_dict",
    "default_positions",
    "init_cache",
    "load_hf_config",
    "load_pretrained",
    "load_score_model",
    "save_pretrained",
    "save_score_model",
    "score_fn",
]
