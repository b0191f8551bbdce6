"""``config.model``: the policy (`PolicyModelConfig`), its LoRA adapters (`LoRAConfig`) and the shape
of the embedded tiny model (`TinyModelConfig`).

May import: gd2po_jax.config.base.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from gd2po_jax.config.base import DTYPES, _int_at_least, _number, _one_of, _require, _Section, _text

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
"""The projections a LoRA adapter may be put on (``model.lora.targets``): attention's q, k, v, o and the MLP's
gate, up, down (Hugging Face's q_proj ... down_proj)."""

ATTENTION_IMPLEMENTATIONS = ("auto", "plain", "xla", "cudnn")
"""``model.attention``: how the training forward attends (`gd2po_jax.models.decoder.attention_implementation`).
plain: the decoder's own einsum attention (float32 scores, a hand-written backward); xla, cudnn:
`jax.nn.dot_product_attention` with that implementation (cudnn: cuDNN's flash attention, GPU only);
auto: cudnn on a GPU in bfloat16 (plain when cuDNN fails there), plain elsewhere."""

REMAT_POLICIES = ("none", "full", "minimal", "dots")
"""``model.remat``: what a decoder layer keeps for its backward pass (`gd2po_jax.models.decoder.remat_policy`).
none: everything (no rematerialisation); full: its input alone (every matmul recomputed); minimal:
its input and the seven weight projections' outputs (named; the backward recomputes norms, RoPE,
attention and the MLP's activation, no weight product); dots: what
``jax.checkpoint_policies.dots_with_no_batch_dims_saveable`` keeps."""


def remat_policy_name(value) -> str | None:
    """The `REMAT_POLICIES` name of a ``model.remat`` value: the name itself, or the boolean of
    config versions before the policies (True, "true": full; False, "false": none); None if neither."""
    if isinstance(value, bool):
        return "full" if value else "none"
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in ("true", "false"):
            return "full" if lowered == "true" else "none"
        return value if value in REMAT_POLICIES else None
    return None


@dataclasses.dataclass(frozen=True)
class TinyModelConfig(_Section):
    """``config.model.tiny``: the shape of the random Qwen2 that the embedded default builds in
    ``WORKDIR/base_model`` when ``model.path`` is empty (synthetic_tools task only)."""

    _path: ClassVar[str] = "model.tiny"

    vocab_size: int
    """Recorded only (it enters the warm-start key): the model's vocabulary is that of the tokenizer
    trained on the task, of ``data.synthetic.tokenizer_vocab_size`` tokens."""
    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of the MLP."""
    num_layers: int
    """Decoder layers."""
    num_heads: int
    """Attention (query) heads."""
    num_kv_heads: int
    """Key / value heads (num_heads: multi-head attention; fewer: grouped queries)."""
    head_dim: int
    """Width of one head."""
    seed: int
    """Seed of the random initialization."""

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        ):
            _int_at_least(getattr(self, name), self._dotted(name))
        _int_at_least(self.seed, self._dotted("seed"), minimum=0)
        _require(
            self.num_heads % self.num_kv_heads == 0,
            self._dotted("num_kv_heads"),
            f"{self.num_kv_heads} does not divide model.tiny.num_heads={self.num_heads}",
        )


@dataclasses.dataclass(frozen=True)
class LoRAConfig(_Section):
    """``config.model.lora``: train low-rank adapters instead of the whole policy (docs/lora.md)."""

    _path: ClassVar[str] = "model.lora"

    rank: int = 0
    """r of every adapter; 0: no adapters, full fine-tuning."""
    alpha: float = 16.0
    """The adapters' output is scaled by alpha / rank (PEFT's ``lora_alpha``)."""
    dropout: float = 0.0
    """PEFT's ``lora_dropout``: the probability of zeroing an input of an adapter in the update's forward
    passes with a gradient (not in sampling, nor in the old log-probs' recompute); also in the exported
    adapter_config.json."""
    targets: tuple[str, ...] = LORA_TARGETS
    """The projections with an adapter, from `LORA_TARGETS` (default: attention and MLP)."""
    base_dtype: str = ""
    """The dtype the frozen base weights are held in (float32 | bfloat16); "": ``train.master_dtype``. The
    adapters and their optimizer state are in ``train.master_dtype``."""

    def __post_init__(self):
        _int_at_least(self.rank, "model.lora.rank", minimum=0)
        _number(self.alpha, "model.lora.alpha")
        _require(self.alpha > 0, "model.lora.alpha", f"must be > 0, got {self.alpha}")
        _number(self.dropout, "model.lora.dropout")
        _require(0 <= self.dropout < 1, "model.lora.dropout", f"must be in [0, 1), got {self.dropout}")
        _require(
            isinstance(self.targets, tuple)
            and len(self.targets) > 0
            and all(t in LORA_TARGETS for t in self.targets)
            and len(set(self.targets)) == len(self.targets),
            "model.lora.targets",
            f"must be distinct names from {LORA_TARGETS}, got {self.targets!r}",
        )
        _one_of(self.base_dtype, "model.lora.base_dtype", ("",) + DTYPES)

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclasses.dataclass(frozen=True)
class PolicyModelConfig(_Section):
    """``config.model``: the policy to train and the dtypes it runs in."""

    _path: ClassVar[str] = "model"

    path: str
    """A Hugging Face checkpoint directory, or a Hub id ``org/name[@revision]`` (fetched into the Hugging
    Face cache: `gd2po_jax.runtime.hub`). Empty: the embedded tiny random Qwen2 (`TinyModelConfig`, built in
    ``WORKDIR/base_model`` with a tokenizer trained on the synthetic task); the files task needs a path."""
    tokenizer_path: str
    """The tokenizer's directory or Hub id; empty: ``path``."""
    dtype: str
    """Compute dtype of sampling and of the forward pass (float32 | bfloat16). The master weights and
    optimizer state are in ``train.master_dtype``."""
    remat: str
    """Gradient checkpointing of the decoder layers, a policy of `REMAT_POLICIES`: none | full | minimal |
    dots (less activation memory for more compute, in that order: full < dots <= minimal < none; any
    but none runs the layers as one scan, one layer compiled). ``python -m bench.update_memory
    --policies`` gives each one's memory at a model's shape. The boolean of older configs still reads:
    true = full, false = none."""
    tiny: TinyModelConfig
    """The embedded model's shape."""
    lora: LoRAConfig = LoRAConfig()
    """Low-rank adapters (rank 0, the default: full fine-tuning)."""
    attention: str = "auto"
    """How the update's forward passes attend, one of `ATTENTION_IMPLEMENTATIONS`: auto | plain | xla |
    cudnn. auto: cuDNN's flash attention on a GPU in bfloat16 (the plain path, said once in the log,
    where cuDNN fails), plain elsewhere; sampling always uses the plain path (docs/speed.md)."""

    def __post_init__(self):
        _text(self.path, "model.path", "a directory path (empty: the embedded tiny model)")
        _text(self.tokenizer_path, "model.tokenizer_path", "a directory path (empty: model.path)")
        _one_of(self.dtype, "model.dtype", DTYPES)
        policy = remat_policy_name(self.remat)
        _require(policy is not None, "model.remat", f"{self.remat!r} is not one of {REMAT_POLICIES} (or true / false)")
        object.__setattr__(self, "remat", policy)  # a boolean of an older config, as its policy
        _one_of(self.attention, "model.attention", ATTENTION_IMPLEMENTATIONS)
