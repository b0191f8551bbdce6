"""Architecture description shared by the decoder, the checkpoint reader and the writer.

`ModelConfig` holds exactly the fields the decoder needs; it is built from (and turned back into)
a Hugging Face `config.json` for the three supported families:

* ``qwen2``  (Qwen2 / Qwen2.5): q/k/v projections carry a bias, o_proj does not.
* ``qwen3``  (Qwen3 dense): RMSNorm over each head of q and k, no biases.
* ``llama``  (Llama 3 / 3.1 / 3.2): optional ``attention_bias`` / ``mlp_bias`` and "llama3" RoPE scaling.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import numpy as np

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters (``rope_parameters`` in a transformers 5 config).

    ``scaling`` is a sorted tuple of (key, value) pairs for the scaled variants, e.g. for "llama3"
    ``factor``, ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``.
    """

    theta: float = 10000.0
    rope_type: str = "default"
    scaling: tuple[tuple[str, float | int], ...] = ()

    def param(self, name: str) -> float:
        """Value of one scaling parameter, with an error naming the missing key."""
        values = dict(self.scaling)
        if name not in values:
            raise ValueError(f"rope_parameters of type {self.rope_type!r} needs {name!r}; got {sorted(values)}")
        return float(values[name])


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and options of a decoder-only transformer.

    ``hf_json`` keeps the original ``config.json`` text (if any) so that `save_pretrained` writes
    back every field it does not model (token ids, generation hints, ...). It is a string so the
    config stays hashable (it is static data of the NNX module and of jitted functions).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = RopeConfig()
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    hf_json: str = ""

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads={self.num_heads} must be a multiple of num_key_value_heads={self.num_kv_heads}"
            )
        if self.rope.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope_type {self.rope.rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}")

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    def num_params(self) -> int:
        """Number of parameters of the decoder (embeddings counted once when tied)."""
        d, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
        attn = d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
        attn += hd * (self.num_heads + 2 * self.num_kv_heads) * self.qkv_bias + d * self.o_bias
        attn += 2 * hd * self.qk_norm
        mlp = 3 * d * f + (2 * f + d) * self.mlp_bias
        per_layer = attn + mlp + 2 * d
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed + d


def family_defaults(model_type: str) -> dict:
    """Bias/norm options fixed by each family's modeling code in transformers."""
    return {
        "qwen2": dict(qkv_bias=True, o_bias=False, qk_norm=False),
        "qwen3": dict(qk_norm=True),
        "llama": dict(qk_norm=False),
    }[model_type]


def _rope_from_hf(hf: dict, where: str) -> RopeConfig:
    """Reads ``rope_parameters`` (transformers 5) or legacy ``rope_theta`` + ``rope_scaling``."""
    params = dict(hf.get("rope_parameters") or {})
    legacy = dict(hf.get("rope_scaling") or {})
    if not params:
        params = legacy
        params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"{where}: rope_type {rope_type!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})")
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    skip = {"rope_type", "type", "rope_theta"}
    scaling = tuple(sorted((k, v) for k, v in params.items() if k not in skip and v is not None))
    return RopeConfig(theta=theta, rope_type=rope_type, scaling=scaling if rope_type != "default" else ())


def config_from_hf_dict(hf: dict, where: str = "config.json") -> ModelConfig:
    """`ModelConfig` from a parsed Hugging Face ``config.json``; ``where`` names the file in errors."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{where}: model_type {model_type!r} (architectures={hf.get('architectures')}) is not "
            f"supported; supported model types: {SUPPORTED_MODEL_TYPES}"
        )
    layer_types = hf.get("layer_types") or []
    if hf.get("use_sliding_window") or "sliding_attention" in layer_types:
        raise ValueError(f"{where}: sliding-window attention is not supported; set use_sliding_window=false")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{where}: hidden_act {act!r} is not supported (only 'silu', i.e. SwiGLU)")
    if hf.get("pretraining_tp", 1) not in (1, None):
        raise ValueError(f"{where}: pretraining_tp={hf['pretraining_tp']} is not supported (use 1)")
    num_heads = int(hf["num_attention_heads"])
    head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
    options = family_defaults(model_type)
    if model_type != "qwen2":
        bias = bool(hf.get("attention_bias", False))
        options.update(qkv_bias=bias, o_bias=bias)
    if model_type == "llama":
        options["mlp_bias"] = bool(hf.get("mlp_bias", False))
    return ModelConfig(
        model_type=model_type,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope=_rope_from_hf(hf, where),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
        hf_json=json.dumps(hf, sort_keys=True),
        **options,
    )


def load_hf_config(path: str | pathlib.Path) -> ModelConfig:
    """The `ModelConfig` of a Hugging Face model directory: reads ``<path>/config.json`` (or ``path``
    itself if it is the json file). Not a run's config.json (`gd2po_jax.runtime.run_dir.load_run_config`)."""
    path = pathlib.Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: a checkpoint directory needs a Hugging Face config.json")
    return config_from_hf_dict(json.loads(file.read_text()), where=str(file))


def config_to_hf_dict(config: ModelConfig, dtype_name: str) -> dict:
    """The ``config.json`` contents for `config`, starting from the original file when known."""
    hf = json.loads(config.hf_json) if config.hf_json else {}
    rope = {"rope_theta": config.rope.theta, "rope_type": config.rope.rope_type, **dict(config.rope.scaling)}
    hf.pop("rope_scaling", None)
    hf.pop("rope_theta", None)
    arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}
    hf.update(
        model_type=config.model_type,
        architectures=[arch[config.model_type]],
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters=rope,
        tie_word_embeddings=config.tie_word_embeddings,
        max_position_embeddings=config.max_position_embeddings,
        hidden_act="silu",
        dtype=dtype_name,
    )
    hf.pop("torch_dtype", None)
    if config.model_type != "qwen2":
        hf["attention_bias"] = config.qkv_bias
    if config.model_type == "llama":
        hf["mlp_bias"] = config.mlp_bias
    return hf


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """Inverse frequencies ``[head_dim // 2]`` (float32) of the rotary embedding, scaling applied.

    Mirrors transformers' ``_compute_default_rope_parameters`` / ``_compute_llama3_parameters``
    (float32 arithmetic) so positions rotate identically.
    """
    dim = config.head_dim
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = (np.float32(1.0) / np.power(np.float32(config.rope.theta), exponent)).astype(np.float32)
    rope = config.rope
    if rope.rope_type == "linear":
        return (inv_freq / np.float32(rope.param("factor"))).astype(np.float32)
    if rope.rope_type == "llama3":
        factor = rope.param("factor")
        low, high = rope.param("low_freq_factor"), rope.param("high_freq_factor")
        old_len = rope.param("original_max_position_embeddings")
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = np.float32(2 * math.pi) / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / np.float32(factor), inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    return inv_freq


def tiny_qwen2_config(shape, vocab_size: int, max_position_embeddings: int) -> ModelConfig:
    """A small Qwen2 (QKV bias, tied embeddings) of ``shape``: any object with ``hidden_size``,
    ``intermediate_size``, ``num_layers``, ``num_heads``, ``num_kv_heads`` and ``head_dim`` (the
    embedded tasks' ``config.model.tiny``, their reward models' ``data.safety.reward_training``)."""
    return ModelConfig(
        model_type="qwen2",
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_layers=shape.num_layers,
        num_heads=shape.num_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        qkv_bias=True,
        tie_word_embeddings=True,
        max_position_embeddings=max_position_embeddings,
    )
