"""Score (reward) models: the decoder's body plus a scalar head, read from and written to Hugging
Face checkpoints in the three layouts users have.

    rm = load_score_model(path, dtype="float32")      # bf16 by default; mesh= to shard it
    scores = rm(input_ids, attention_mask)            # [B] float32, higher = better
    scores = score_fn(rm, input_ids, attention_mask)  # the same, jitted (one program per shape)

A row's score is the head applied to the final hidden state of its **last token whose attention
mask is 1**, so right- and left-padded batches score alike (a row without any such token scores
NaN, which callers treat as an error). Then, in this order, two explicit options:

1. normalization (safe-rlhf's ``do_normalize``): with the checkpoint's running statistics,
   ``affine`` ``(x - mean) / (sqrt(var) + 1e-8)`` for a ``reward`` model, ``scale``
   ``x / (sqrt(var) + 1e-8)`` for a ``cost`` model, ``identity`` for a ``critic``;
2. ``negate``: the sign flip that turns "higher = more harmful" (a safe-rlhf cost model) into
   "higher = better", as every reward of this project reads.

Layouts (detected from ``config.json`` and the tensor names; the body is ``model.*`` in all three):

* ``sequence_classification``: transformers' ``*ForSequenceClassification`` with ``num_labels=1``
  (TRL's reward models): head ``score.weight [1, D]``, no bias. The score is transformers'
  ``logits[:, 0]``; transformers picks the last token that is not ``pad_token_id``, which is the
  last mask-1 token whenever pads carry ``pad_token_id`` and real tokens do not.
* ``amo``: align-anything's ``Accustomed*RewardModel`` (the GD2PO paper's
  ``Qwen2.5-7B-SafeRLHF-RM`` / ``-CM``): head ``score_head.weight [1, D]``, no bias, no
  ``lm_head``; higher = better, never negated, no normalizer.
* ``beaver``: safe-rlhf's ``*ModelForScore`` (``PKU-Alignment/beaver-7b-v1.0-reward`` / ``-cost``):
  head ``score_head.weight [score_dim, D]`` (+ ``score_head.bias`` when ``bias``), buffers
  ``normalizer.mean`` / ``normalizer.var`` / ``normalizer.count``, config fields ``score_dim``,
  ``bias``, ``score_type`` (reward | cost | critic), ``do_normalize``, ``normalizer_type``.
  Defaults: ``negate`` is ``score_type == "cost"``; normalization follows ``do_normalize``.
  safe-rlhf's published models are PyTorch ``.bin`` shards: convert each once with
  ``safetensors.torch.save_file(torch.load(shard), shard.with_suffix(".safetensors"))``; without a
  ``model.safetensors.index.json`` every ``*.safetensors`` file of the directory is read.

A score model trains like the policy (``nnx.value_and_grad`` over its ``nnx.Param`` s, e.g. a
Bradley–Terry loss on `ScoreModel.raw_scores`); normalization statistics and the sign are static
settings, not parameters.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from gd2po_jax.models.config import ModelConfig, config_to_hf_dict, load_hf_config
from gd2po_jax.models.decoder import Decoder, LoRASpec, _param
from gd2po_jax.models.lora import load_peft_adapter, merged_decoder, read_adapter_config
from gd2po_jax.models.pretrained import (
    TensorMap,
    check_no_unexpected_tensors,
    fill_from_checkpoint,
    hf_to_ours,
    tensor_maps,
    tensor_sources,
    write_auxiliary_files,
)
from gd2po_jax.models.safetensors_io import SafetensorsCheckpoint, write_checkpoint
from gd2po_jax.runtime.hub import resolve_model_dir
from gd2po_jax.runtime.sharding import place_host_array, variable_sharding

SCORE_LAYOUTS = ("sequence_classification", "amo", "beaver")

# safe-rlhf: score_type -> normalize function (ScoreModelMixin.init_score_head).
NORMALIZE_FUNCTIONS = {"reward": "affine", "cost": "scale", "critic": "identity"}
_SCORE_TYPES = {function: score_type for score_type, function in NORMALIZE_FUNCTIONS.items()}
NORMALIZER_EPS = 1e-8  # safe-rlhf's Normalizer.normalize epsilon, added to the standard deviation
NORMALIZER_BUFFERS = ("normalizer.mean", "normalizer.var", "normalizer.count")

# config.json fields that belong to one layout; the others' are dropped when saving.
_LAYOUT_FIELDS = {
    "sequence_classification": ("id2label", "label2id", "num_labels", "problem_type"),
    "amo": (),
    "beaver": ("score_dim", "bias", "score_type", "do_normalize", "normalizer_type", "momentum", "mean", "var"),
}
_FAMILY = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama"}
_ARCHITECTURE = {
    "sequence_classification": "{}ForSequenceClassification",
    "amo": "Accustomed{}RewardModel",
    "beaver": "{}ModelForScore",
}
_HEAD_PREFIX = {"sequence_classification": "score", "amo": "score_head", "beaver": "score_head"}
_TENSORS = {
    "sequence_classification": "model.* + score.weight",
    "amo": "model.* + score_head.weight, no bias",
    "beaver": "model.* + score_head.weight/bias + normalizer.*",
}


@dataclasses.dataclass(frozen=True)
class ScoreNormalizer:
    """safe-rlhf's normalization of a score with fixed running statistics.

    Attributes:
      function: ``"affine"`` ``(x - mean) / (sqrt(var) + 1e-8)``, ``"scale"`` ``x / (sqrt(var) + 1e-8)``,
        ``"translate"`` ``x - mean`` or ``"identity"`` (safe-rlhf's reward / cost / - / critic).
      mean, var: the statistics (buffers ``normalizer.mean`` / ``normalizer.var``).
      count: how many scores the statistics saw (buffer ``normalizer.count``; kept for saving).
      enabled: apply it (safe-rlhf's ``do_normalize``); a disabled normalizer only carries the
        statistics through a load/save round trip.
    """

    function: str = "affine"
    mean: float = 0.0
    var: float = 1.0
    count: int = 0
    enabled: bool = True

    def __post_init__(self):
        if self.function not in ("affine", "scale", "translate", "identity"):
            raise ValueError(
                f"ScoreNormalizer.function={self.function!r}; expected 'affine', 'scale', 'translate' or 'identity'"
            )
        if not self.var >= 0:
            raise ValueError(f"ScoreNormalizer.var={self.var} must be >= 0 (a variance)")

    def __call__(self, scores: jax.Array) -> jax.Array:
        """``scores [B]`` float32, normalized (unchanged when disabled)."""
        if not self.enabled or self.function == "identity":
            return scores
        std = jnp.sqrt(jnp.float32(self.var)) + jnp.float32(NORMALIZER_EPS)
        if self.function == "affine":
            return (scores - jnp.float32(self.mean)) / std
        if self.function == "scale":
            return scores / std
        return scores - jnp.float32(self.mean)


def last_token_index(attention_mask: jax.Array) -> jax.Array:
    """``[B]`` int32: the index of each row's last position whose mask is set (0 for an empty row).

    attention_mask: ``[B, T]`` bool or int.
    """
    mask = attention_mask.astype(bool)
    t = mask.shape[-1]
    return (t - 1 - jnp.argmax(mask[:, ::-1], axis=-1)).astype(jnp.int32)


class ScoreModel(nnx.Module):
    """A decoder body with a scalar head: ``[B, T]`` tokens -> ``[B]`` float32 scores.

    Args:
      config: architecture of the body (`ModelConfig`).
      dtype: parameter and activation dtype; the head's output is float32.
      rngs: initialiser keys (normal(0.02) weights, zero bias, as transformers initialises).
      head_bias: give the head a bias (safe-rlhf's ``bias``; the other layouts have none).
      negate: flip the sign of the (normalized) score, for models where higher = worse.
      normalizer: safe-rlhf's normalization, applied when ``normalizer.enabled``.
      remat: rematerialise the body's layers in the backward pass (training).
      lora: adapters on the body (`gd2po_jax.models.decoder.LoRASpec`), as a PEFT adapter is loaded
        (`load_score_model`'s ``adapter``, which then merges them).

    Parameters: ``decoder`` (a `Decoder` built with ``lm_head=False``), ``head_kernel [D, 1]``
    (sharded like the body's ``D`` axis), ``head_bias [1]`` or None.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype=jnp.float32,
        rngs: nnx.Rngs,
        head_bias: bool = False,
        negate: bool = False,
        normalizer: ScoreNormalizer | None = None,
        remat: bool = False,
        lora: LoRASpec | None = None,
    ):
        self.config = config
        self.dtype = jnp.dtype(dtype)
        self.negate = bool(negate)
        self.normalizer = normalizer
        self.decoder = Decoder(config, dtype=dtype, rngs=rngs, remat=remat, lm_head=False, lora=lora)
        self.head_kernel = _param(rngs, (config.hidden_size, 1), ("fsdp", None), dtype)
        self.head_bias = _param(None, (1,), (None,), dtype, "zeros") if head_bias else None

    def raw_scores(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """The head's output ``[B]`` float32 at each row's last mask-1 token, before normalization
        and negation (what a Bradley–Terry loss trains); NaN for a row whose mask is all 0.

        input_ids: ``[B, T]`` int; attention_mask: ``[B, T]`` bool (1 = token; any padding side).
        """
        mask = attention_mask.astype(bool)
        hidden, _ = self.decoder.hidden_states(input_ids, mask)  # [B, T, D]
        last = last_token_index(mask)
        end_hidden = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]  # [B, D]
        scores = jnp.einsum("bd,dk->bk", end_hidden, self.head_kernel[...], preferred_element_type=jnp.float32)
        scores = scores[:, 0]
        if self.head_bias is not None:
            scores = scores + self.head_bias[0].astype(jnp.float32)
        return jnp.where(jnp.any(mask, axis=-1), scores, jnp.nan)

    def transform(self, raw_scores: jax.Array) -> jax.Array:
        """``[B]`` raw scores -> final scores: normalized (if enabled), then negated (if set)."""
        scores = raw_scores if self.normalizer is None else self.normalizer(raw_scores)
        return -scores if self.negate else scores

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """``[B]`` float32 scores (higher = better once ``negate`` is set right) of ``input_ids
        [B, T]`` under ``attention_mask [B, T]``."""
        return self.transform(self.raw_scores(input_ids, attention_mask))


@nnx.jit
def score_fn(model: ScoreModel, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """Jitted ``model(input_ids, attention_mask)``: one compiled program per model structure and
    ``[B, T]`` shape, so callers bucket their lengths (and batch sizes) to bound compilations."""
    return model(input_ids, attention_mask)


def score_tensor_maps(config: ModelConfig, layout: str, head_bias: bool) -> list[TensorMap]:
    """Every parameter of a `ScoreModel` and its tensor name in ``layout``, in checkpoint order."""
    if layout not in SCORE_LAYOUTS:
        raise ValueError(f"score model layout {layout!r} is not one of {SCORE_LAYOUTS}")
    maps = [TensorMap(tm.hf_name, ("decoder",) + tm.path, tm.kind) for tm in tensor_maps(config, lm_head=False)]
    head = _HEAD_PREFIX[layout]
    maps.append(TensorMap(f"{head}.weight", ("head_kernel",), "linear"))
    if head_bias:
        maps.append(TensorMap(f"{head}.bias", ("head_bias",), "copy"))
    return maps


# ----------------------------------------------------------------------------------------------
# Loading.
# ----------------------------------------------------------------------------------------------


def _detect_layout(path: pathlib.Path, hf: dict, names: set[str]) -> str:
    """The layout of a checkpoint from its config.json ``hf`` and tensor ``names``."""
    if "score.weight" in names and "score_head.weight" in names:
        raise ValueError(f"{path}: holds both 'score.weight' and 'score_head.weight'; which head scores is ambiguous")
    if "score.weight" in names:
        return "sequence_classification"
    if "score_head.weight" in names:
        beaver = any(field in hf for field in _LAYOUT_FIELDS["beaver"]) or "normalizer.mean" in names
        return "beaver" if beaver else "amo"
    others = sorted(n for n in names if not n.startswith("model."))
    if "lm_head.weight" in names:
        raise ValueError(
            f"{path} is a causal language model (it has 'lm_head.weight' and no score head; "
            f"architectures={hf.get('architectures')}), not a score model: a score model has a head "
            "'score.weight' (transformers *ForSequenceClassification) or 'score_head.weight' "
            "(align-anything / safe-rlhf)"
        )
    raise ValueError(
        f"{path}: unknown score-head layout (architectures={hf.get('architectures')}): no 'score.weight' "
        "(transformers *ForSequenceClassification) and no 'score_head.weight' (align-anything / safe-rlhf); "
        f"tensors outside model.*: {others[:8]}"
    )


def _check_scalar_head(path: pathlib.Path, hf: dict, checkpoint: SafetensorsCheckpoint, layout: str) -> None:
    """Checks that the head has exactly one output row, with a message in the layout's terms."""
    name = f"{_HEAD_PREFIX[layout]}.weight"
    rows = checkpoint.shape(name)[0]
    if layout == "sequence_classification" and rows != 1:
        raise ValueError(
            f"{path}: 'score.weight' has {rows} rows, i.e. num_labels={rows} "
            f"(architectures={hf.get('architectures')}); a score model needs num_labels=1 (one scalar per sequence)"
        )
    score_dim = int(hf.get("score_dim", 1)) if layout == "beaver" else 1
    if layout != "sequence_classification" and (rows != 1 or score_dim != 1):
        raise ValueError(
            f"{path}: score_dim={score_dim} in config.json and {rows} rows in {name!r}; only scalar score "
            "models (score_dim=1) are supported"
        )


def _beaver_normalizer(path: pathlib.Path, hf: dict, checkpoint: SafetensorsCheckpoint, normalize) -> ScoreNormalizer:
    """The normalizer of a safe-rlhf checkpoint: its function from ``score_type``, statistics from
    the ``normalizer.*`` buffers (else config.json's ``mean`` / ``var``, else 0 / 1), enabled by
    ``normalize`` or, when that is None, by ``do_normalize``."""
    score_type = hf.get("score_type", "reward")
    if score_type not in NORMALIZE_FUNCTIONS:
        raise ValueError(
            f"{path}/config.json: score_type={score_type!r}; expected one of {sorted(NORMALIZE_FUNCTIONS)}"
        )
    names = checkpoint.names()

    def statistic(field: str, default: float) -> float:
        if f"normalizer.{field}" in names:
            return float(np.asarray(checkpoint.get(f"normalizer.{field}", (1,)), np.float64)[0])
        value = hf.get(field)
        return float(np.ravel(value)[0]) if value is not None else default

    return ScoreNormalizer(
        function=NORMALIZE_FUNCTIONS[score_type],
        mean=statistic("mean", 0.0),
        var=statistic("var", 1.0),
        count=int(statistic("count", 0)),
        enabled=bool(hf.get("do_normalize", False)) if normalize is None else bool(normalize),
    )


def load_score_model(
    path,
    dtype="bfloat16",
    mesh: Mesh | None = None,
    *,
    negate: bool | None = None,
    normalize: bool | None = None,
    remat: bool = False,
    adapter: str | pathlib.Path | None = None,
) -> ScoreModel:
    """A `ScoreModel` with the weights of the Hugging Face score-model directory ``path``.

    Args:
      path: a local directory with ``config.json`` and safetensors weights (single file, or shards
        with ``model.safetensors.index.json``) in one of the layouts of the module docstring.
      dtype: parameter dtype (``"bfloat16"`` default, ``"float32"``, or a jnp dtype).
      mesh: if given, every parameter is created directly on its annotated sharding (as
        `gd2po_jax.models.load_pretrained` does for the policy).
      negate: flip the score's sign; None: only for a safe-rlhf ``score_type="cost"`` model.
      normalize: apply safe-rlhf's normalization; None: as ``do_normalize`` says (beaver layout),
        off for the others. True on a layout without statistics is an error.
      remat: rematerialise layers in the backward pass (when the model is trained).
      adapter: a PEFT LoRA adapter directory trained on ``path`` (`gd2po_jax.models.lora`): its
        adapters are merged into the body's weights, and its score head (PEFT saves the head of a
        ``SEQ_CLS`` adapter, ``base_model.model.score.weight``) replaces ``path``'s.

    Raises:
      FileNotFoundError: ``path``, its config.json or its weights do not exist.
      ValueError: naming ``path``: an unknown head layout, a causal LM, ``num_labels`` /
        ``score_dim`` other than 1, tensors the layout does not describe, a missing or
        mis-shaped tensor, ``normalize=True`` without statistics.
    """
    path = resolve_model_dir(path, "score model directory")
    config = load_hf_config(path)
    hf = json.loads((path / "config.json").read_text())
    checkpoint = SafetensorsCheckpoint(path)
    names = checkpoint.names()
    layout = _detect_layout(path, hf, names)
    _check_scalar_head(path, hf, checkpoint, layout)
    if layout == "beaver":
        head_bias = bool(hf.get("bias", False))
        normalizer = _beaver_normalizer(path, hf, checkpoint, normalize)
        negate = hf.get("score_type", "reward") == "cost" if negate is None else negate
    else:
        head_bias = False
        if normalize:
            raise ValueError(
                f"{path}: normalize=True, but this {layout} checkpoint has no normalizer statistics "
                "(only safe-rlhf 'beaver' checkpoints carry normalizer.mean / normalizer.var)"
            )
        normalizer, negate = None, bool(negate)
    dtype = jnp.dtype(dtype)
    lora = None
    if adapter:
        adapter = resolve_model_dir(adapter, "score model adapter directory")
        lora = read_adapter_config(adapter, dtype=dtype.name)[0]
    model = nnx.eval_shape(
        lambda: ScoreModel(
            config,
            dtype=dtype,
            rngs=nnx.Rngs(0),
            head_bias=head_bias,
            negate=negate,
            normalizer=normalizer,
            remat=remat,
            lora=lora,
        )
    )
    if lora is not None:  # read from the adapter: then adapter is its resolved directory
        load_peft_adapter(
            model.decoder,
            cast(pathlib.Path, adapter),
            mesh,
            others=(f"base_model.model.{_HEAD_PREFIX[layout]}.weight",),
        )
    maps = score_tensor_maps(config, layout, head_bias)
    fill_from_checkpoint(model, maps, checkpoint, dtype, mesh)
    expected = {tm.hf_name for tm in maps} | (set(NORMALIZER_BUFFERS) if layout == "beaver" else set())
    check_no_unexpected_tensors(checkpoint, expected, f"the {layout} score-model layout ({_TENSORS[layout]})")
    if lora is not None:
        _load_adapter_head(model, cast(pathlib.Path, adapter), layout, dtype, mesh)
        model.decoder = merged_decoder(model.decoder)
    return model


def _load_adapter_head(model: ScoreModel, adapter: pathlib.Path, layout: str, dtype, mesh: Mesh | None) -> None:
    """The score head a PEFT adapter trained (``modules_to_save``: ``base_model.model.<head>.weight``
    [1, D]), in place of the base's; the base's when the adapter has none."""
    adapter_tensors = SafetensorsCheckpoint(adapter)
    name = f"base_model.model.{_HEAD_PREFIX[layout]}.weight"
    if name in adapter_tensors.names():
        tensor = adapter_tensors.get(name, (1, model.config.hidden_size))
        sharding = variable_sharding(model.head_kernel, mesh) if mesh is not None else None
        model.head_kernel.set_value(
            place_host_array(hf_to_ours(tensor, "linear", (model.config.hidden_size, 1)), dtype, sharding)
        )


# ----------------------------------------------------------------------------------------------
# Saving.
# ----------------------------------------------------------------------------------------------


def _layout_config(model: ScoreModel, layout: str, dtype_name: str, tokenizer) -> dict:
    """config.json of ``model`` saved in ``layout``: the body's fields (and any the source
    config.json had), the layout's architecture and head fields, no other layout's fields."""
    hf = config_to_hf_dict(model.config, dtype_name)
    for fields in _LAYOUT_FIELDS.values():
        for field in fields:
            hf.pop(field, None)
    hf["architectures"] = [_ARCHITECTURE[layout].format(_FAMILY[model.config.model_type])]
    if layout == "sequence_classification":
        hf.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
        if hf.get("pad_token_id") is None and getattr(tokenizer, "pad_token_id", None) is not None:
            hf["pad_token_id"] = tokenizer.pad_token_id  # transformers needs it to score batches
    elif layout == "beaver":
        normalizer = model.normalizer or ScoreNormalizer(enabled=False)
        source = json.loads(model.config.hf_json) if model.config.hf_json else {}
        if model.normalizer is not None:
            score_type = _SCORE_TYPES[model.normalizer.function]
        else:
            score_type = "cost" if model.negate else "reward"
        hf.update(
            score_dim=1,
            bias=model.head_bias is not None,
            score_type=score_type,
            do_normalize=normalizer.enabled,
            normalizer_type=source.get("normalizer_type"),
            mean=[normalizer.mean],
            var=[normalizer.var],
        )
        if "momentum" in source:
            hf["momentum"] = source["momentum"]
    return hf


def _check_saveable(model: ScoreModel, layout: str) -> None:
    """Rejects what ``layout`` cannot express, so a reload would score differently."""
    if layout not in SCORE_LAYOUTS:
        raise ValueError(f"save_score_model: layout={layout!r}; expected one of {SCORE_LAYOUTS}")
    if layout != "beaver":
        kept = [
            what
            for what, present in (
                ("a head bias", model.head_bias is not None),
                ("negate=True", model.negate),
                ("a normalizer", model.normalizer is not None and model.normalizer.enabled),
            )
            if present
        ]
        if kept:
            raise ValueError(
                f"save_score_model: the {layout} layout cannot store {', '.join(kept)}; a reload would "
                "score differently. Save with layout='beaver' (safe-rlhf) instead"
            )
        return
    if model.normalizer is not None and model.normalizer.function not in _SCORE_TYPES:
        raise ValueError(
            f"save_score_model: a normalizer with function={model.normalizer.function!r} has no safe-rlhf "
            f"score_type (reward: affine, cost: scale, critic: identity)"
        )
    score_type = _SCORE_TYPES[model.normalizer.function] if model.normalizer else None
    if score_type is not None and model.negate != (score_type == "cost"):
        raise ValueError(
            f"save_score_model: negate={model.negate} with a {cast(ScoreNormalizer, model.normalizer).function!r} "
            f"normalizer: the "
            f"beaver layout stores the sign as score_type={score_type!r}, which a reload reads as "
            f"negate={score_type == 'cost'}"
        )


def save_score_model(
    model: ScoreModel,
    out_dir,
    *,
    layout: str = "sequence_classification",
    dtype=None,
    max_shard_bytes: int = 5 * 2**30,
    tokenizer=None,
    copy_files_from=None,
) -> list[str]:
    """Writes ``config.json`` and safetensors weights of ``model`` in ``layout``, which
    `load_score_model` reads back to the same scores (and transformers'
    ``AutoModelForSequenceClassification`` loads, for the ``sequence_classification`` layout).

    Args:
      model: the score model (parameters may be sharded; each is gathered to the host in turn).
      out_dir: output directory (created).
      layout: ``"sequence_classification"``, ``"amo"`` or ``"beaver"`` (see the module docstring);
        only ``"beaver"`` stores a head bias, the sign (as ``score_type``) and a normalizer.
      dtype: stored dtype of the parameters; default the model's (normalizer buffers: float32/int64).
      max_shard_bytes: above this, weights are split into shards with an index file.
      tokenizer: if given, ``tokenizer.save_pretrained(out_dir)`` is called (and its
        ``pad_token_id`` recorded when the config has none, for transformers).
      copy_files_from: a directory whose tokenizer / chat-template files are copied.
    Returns the names of the files written.
    """
    _check_saveable(model, layout)
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = np.dtype(dtype or model.dtype)
    if dtype.name not in ("bfloat16", "float32", "float16"):
        raise ValueError(f"save_score_model: dtype={dtype.name}; expected bfloat16, float32 or float16")
    hf = _layout_config(model, layout, dtype.name, tokenizer)
    (out_dir / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True))
    written = ["config.json"] + write_auxiliary_files(out_dir, tokenizer, copy_files_from)
    tensors = tensor_sources(model, score_tensor_maps(model.config, layout, model.head_bias is not None), dtype)
    if layout == "beaver":
        normalizer = model.normalizer or ScoreNormalizer(enabled=False)
        for name, value, buffer_dtype in (
            ("normalizer.mean", normalizer.mean, np.float32),
            ("normalizer.var", normalizer.var, np.float32),
            ("normalizer.count", normalizer.count, np.int64),
        ):
            # mypy cannot type a lambda whose defaults bind the loop's values (of several types)
            tensors.append((name, (1,), np.dtype(buffer_dtype), lambda v=value, d=buffer_dtype: np.array([v], d)))  # type: ignore[misc]
    return written + write_checkpoint(out_dir, tensors, max_shard_bytes)
