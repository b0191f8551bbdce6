"""Hugging Face checkpoints <-> `Decoder`: `load_pretrained` and `save_pretrained`.

Each parameter is described by a `TensorMap` (Hugging Face name, attribute path in the NNX module,
layout conversion). Loading builds the module abstractly (`nnx.eval_shape`, no random init), then
fills each variable straight from a memory-mapped tensor: with a mesh, every device reads only its
own slice (`jax.make_array_from_callback`), so no second host copy of the model is made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import shutil
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from gd2po_jax.errors import UserError
from gd2po_jax.models.config import ModelConfig, config_to_hf_dict, load_hf_config
from gd2po_jax.models.decoder import Decoder, LoRASpec
from gd2po_jax.models.lora import init_adapters
from gd2po_jax.models.safetensors_io import SafetensorsCheckpoint, TensorSource, write_checkpoint
from gd2po_jax.runtime.distributed import host_value, is_primary
from gd2po_jax.runtime.hub import resolve_model_dir
from gd2po_jax.runtime.run_dir import writing
from gd2po_jax.runtime.sharding import place_host_array, variable_sharding

# Files copied by save_pretrained(copy_files_from=...): tokenizer, chat template, generation defaults.
AUXILIARY_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)

# Checkpoint tensors that are not parameters of the decoder and may be ignored.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class ModelDirError(UserError, ValueError):
    """A Hugging Face model directory that cannot be loaded (no or truncated safetensors, a tensor of
    the wrong shape, a config.json that is not JSON or not a supported model); one line naming the
    file (`model_dir_errors`)."""


@contextlib.contextmanager
def model_dir_errors(path) -> Iterator[None]:
    """Within: what reading the model directory ``path`` raises (a missing or truncated file, a
    malformed header or config.json, a tensor missing or of the wrong shape) becomes a one-line
    `ModelDirError` naming the file and what to do."""
    try:
        yield
    except ModelDirError:
        raise
    except (OSError, ValueError, KeyError) as err:
        text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        text = " ".join(str(text).split()) or type(err).__name__
        if str(path) not in text:
            text = f"{path}: {text}"
        raise ModelDirError(
            f"{text} (the model directory is incomplete, damaged or not a model this project loads: "
            "copy or save it again)"
        ) from None


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """One parameter: Hugging Face tensor name, attribute path in `Decoder`, layout kind.

    Kinds (HF layout -> ours): "copy"; "linear" [out, in] -> [in, out];
    "in_heads" [N*hd, D] -> [D, N, hd]; "out_heads" [D, H*hd] -> [H, hd, D]; "bias_heads" [N*hd] -> [N, hd].
    """

    hf_name: str
    path: tuple
    kind: str


def tensor_maps(config: ModelConfig, lm_head: bool = True) -> list[TensorMap]:
    """Every parameter of a `Decoder` built from ``config`` (and ``lm_head``), in checkpoint order."""
    maps = [TensorMap("model.embed_tokens.weight", ("embed",), "copy")]
    for i in range(config.num_layers):
        hf, ours = f"model.layers.{i}.", ("layers", i)
        attn = [("q", "in_heads"), ("k", "in_heads"), ("v", "in_heads"), ("o", "out_heads")]
        maps += [TensorMap(f"{hf}self_attn.{p}_proj.weight", ours + ("attn", f"{p}_kernel"), k) for p, k in attn]
        if config.qkv_bias:
            maps += [
                TensorMap(f"{hf}self_attn.{p}_proj.bias", ours + ("attn", f"{p}_bias"), "bias_heads") for p in "qkv"
            ]
        if config.o_bias:
            maps.append(TensorMap(f"{hf}self_attn.o_proj.bias", ours + ("attn", "o_bias"), "copy"))
        if config.qk_norm:
            maps += [
                TensorMap(f"{hf}self_attn.{p}_norm.weight", ours + ("attn", f"{p}_norm", "scale"), "copy") for p in "qk"
            ]
        for p in ("gate", "up", "down"):
            maps.append(TensorMap(f"{hf}mlp.{p}_proj.weight", ours + ("mlp", f"{p}_kernel"), "linear"))
            if config.mlp_bias:
                maps.append(TensorMap(f"{hf}mlp.{p}_proj.bias", ours + ("mlp", f"{p}_bias"), "copy"))
        maps.append(TensorMap(f"{hf}input_layernorm.weight", ours + ("attn_norm", "scale"), "copy"))
        maps.append(TensorMap(f"{hf}post_attention_layernorm.weight", ours + ("mlp_norm", "scale"), "copy"))
    maps.append(TensorMap("model.norm.weight", ("final_norm", "scale"), "copy"))
    if lm_head and not config.tie_word_embeddings:
        maps.append(TensorMap("lm_head.weight", ("lm_head",), "linear"))
    return maps


def hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the Hugging Face tensor that maps to one of our parameters of ``shape``."""
    if kind == "copy":
        return tuple(shape)
    if kind == "linear":
        return tuple(reversed(shape))
    if kind == "in_heads":
        return (shape[1] * shape[2], shape[0])
    if kind == "out_heads":
        return (shape[2], shape[0] * shape[1])
    if kind == "bias_heads":
        return (shape[0] * shape[1],)
    raise ValueError(f"unknown tensor kind {kind!r}")


def hf_to_ours(tensor: np.ndarray, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """Our layout of a Hugging Face tensor; a view (no copy) for every kind."""
    if kind == "copy":
        return tensor
    if kind == "bias_heads":
        return tensor.reshape(shape)
    return tensor.T.reshape(shape)


def ours_to_hf(array: np.ndarray, kind: str) -> np.ndarray:
    """Inverse of `hf_to_ours`."""
    if kind == "copy":
        return array
    if kind == "linear":
        return array.T
    if kind == "in_heads":
        return array.reshape(array.shape[0], -1).T
    if kind == "out_heads":
        return array.reshape(-1, array.shape[-1]).T
    if kind == "bias_heads":
        return array.reshape(-1)
    raise ValueError(f"unknown tensor kind {kind!r}")


def get_variable(model: nnx.Module, path: tuple) -> nnx.Variable:
    """The variable at attribute/index ``path`` of ``model``."""
    node: Any = model
    for key in path:
        node = node[key] if isinstance(key, int) else getattr(node, key)
    return node


def load_pretrained(
    path,
    dtype=jnp.float32,
    mesh: Mesh | None = None,
    *,
    remat: bool | str = False,
    lora: LoRASpec | None = None,
    lora_seed: int = 0,
    attention: str = "auto",
) -> Decoder:
    """A `Decoder` with the weights of the Hugging Face checkpoint directory ``path``.

    Args:
      path: directory with ``config.json`` and ``model.safetensors`` (or sharded files + index), or a
        Hugging Face Hub id (`gd2po_jax.runtime.hub.resolve_model_dir`).
      dtype: parameter dtype (e.g. ``jnp.float32`` or ``jnp.bfloat16``), converted while loading.
      mesh: if given, each parameter is created directly on its annotated sharding
        (see `gd2po_jax.runtime.sharding`); otherwise on the default device.
      remat: what layers keep for the backward pass, a remat policy or a boolean (`Decoder`).
      lora: adapters (in ``lora.dtype``), fresh as PEFT initialises them from ``lora_seed``
        (`gd2po_jax.models.lora.init_adapters`: the model computes as the checkpoint's).
      attention: the training forward's attention (``model.attention``; `Decoder`).

    Raises:
      ModelDirError: the directory cannot be loaded (one line naming the file: `model_dir_errors`).
    """
    path = resolve_model_dir(path)
    with model_dir_errors(pathlib.Path(path) / "config.json" if pathlib.Path(path).is_dir() else path):
        config = load_hf_config(path)
    with model_dir_errors(path):
        checkpoint = SafetensorsCheckpoint(path)
    model = nnx.eval_shape(
        lambda: Decoder(config, dtype=dtype, rngs=nnx.Rngs(0), remat=remat, lora=lora, attention=attention)
    )
    if lora is not None:
        init_adapters(model, lora_seed, mesh)
    maps = tensor_maps(config)
    fill_from_checkpoint(model, maps, checkpoint, dtype, mesh)
    expected = {tm.hf_name for tm in maps}
    if config.tie_word_embeddings:
        expected.add("lm_head.weight")
    with model_dir_errors(path):
        check_no_unexpected_tensors(checkpoint, expected, f"config.json (model_type={config.model_type!r})")
    return model


def fill_from_checkpoint(model: nnx.Module, maps, checkpoint: SafetensorsCheckpoint, dtype, mesh: Mesh | None):
    """Sets every variable of the abstract ``model`` (`nnx.eval_shape`) named by ``maps`` from
    ``checkpoint``, converted to ``dtype``; with a mesh, directly on its annotated sharding.

    Raises:
      ModelDirError: a tensor is missing or has the wrong shape (naming tensor and file).
      RuntimeError: a parameter of the model is not named by any map.
    """
    for tm in maps:
        variable = get_variable(model, tm.path)
        shape = tuple(variable.shape)
        with model_dir_errors(checkpoint.directory):
            tensor = checkpoint.get(tm.hf_name, hf_shape(tm.kind, shape))
        sharding = variable_sharding(variable, mesh) if mesh is not None else None
        variable.set_value(place_host_array(hf_to_ours(tensor, tm.kind, shape), dtype, sharding))
    leftover = [x for x in jax.tree.leaves(nnx.state(model)) if isinstance(x, jax.ShapeDtypeStruct)]
    if leftover:
        raise RuntimeError(
            f"{len(leftover)} parameters of the {type(model).__name__} have no checkpoint tensor mapped to them"
        )


def check_no_unexpected_tensors(checkpoint: SafetensorsCheckpoint, expected: set[str], described_by: str) -> None:
    """Raises ValueError naming the directory, files and tensors of ``checkpoint`` that are neither
    ``expected`` nor ignorable (``rotary_emb.inv_freq``); ``described_by`` names what defines the
    expected set (e.g. ``"config.json (model_type='qwen2')"``)."""
    unexpected = sorted(n for n in checkpoint.names() - expected if not n.endswith(_IGNORED_SUFFIXES))
    if unexpected:
        files = sorted({checkpoint.file_of(n).name for n in unexpected})
        raise ValueError(
            f"{checkpoint.directory}: {files} hold tensors that {described_by} "
            f"does not describe: {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
        )


def save_pretrained(
    model: Decoder,
    out_dir,
    *,
    dtype=None,
    max_shard_bytes: int = 5 * 2**30,
    tokenizer=None,
    copy_files_from=None,
) -> list[str]:
    """Writes ``config.json`` and safetensors weights that transformers (and vLLM) load.

    Args:
      model: the decoder (parameters may be sharded; each is gathered to the host in turn).
      out_dir: output directory (created).
      dtype: stored dtype; default the model's parameter dtype.
      max_shard_bytes: above this, weights are split into shards with an index file.
      tokenizer: if given, ``tokenizer.save_pretrained(out_dir)`` is called.
      copy_files_from: a checkpoint directory whose tokenizer / generation-config files are copied.
    Returns the names of the files written.

    Several processes (a multi-host run) all call it: each parameter is gathered from every process
    in turn (never the whole model at once), and only process 0 writes; the others return [].
    """
    if not is_primary():
        for tm in tensor_maps(model.config):
            host_value(get_variable(model, tm.path)[...])  # the gathers process 0's writes need
        return []
    out_dir = pathlib.Path(out_dir)
    with writing(out_dir):  # a full disk: WriteFailedError naming the directory and the free space
        out_dir.mkdir(parents=True, exist_ok=True)
        dtype = np.dtype(dtype or model.dtype)
        dtype_name = {"bfloat16": "bfloat16", "float32": "float32", "float16": "float16"}[dtype.name]
        hf_config = config_to_hf_dict(model.config, dtype_name)
        (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True))
        written = ["config.json"] + write_auxiliary_files(out_dir, tokenizer, copy_files_from)
        tensors = tensor_sources(model, tensor_maps(model.config), dtype)
        return written + write_checkpoint(out_dir, tensors, max_shard_bytes)


def write_auxiliary_files(out_dir: pathlib.Path, tokenizer=None, copy_files_from=None) -> list[str]:
    """Copies the `AUXILIARY_FILES` found in ``copy_files_from`` and saves ``tokenizer`` into
    ``out_dir``; returns the names of the copied files."""
    written = []
    if copy_files_from is not None:
        for name in AUXILIARY_FILES:
            src = pathlib.Path(copy_files_from) / name
            if src.is_file():
                shutil.copyfile(src, out_dir / name)
                written.append(name)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return written


def tensor_sources(model: nnx.Module, maps, dtype) -> list[TensorSource]:
    """What `write_checkpoint` writes for the variables of ``model`` named by ``maps``: each in the
    Hugging Face layout and ``dtype``, gathered to the host only when its turn to be written comes."""
    dtype = np.dtype(dtype)

    def producer(variable, kind):
        return lambda: ours_to_hf(np.asarray(host_value(variable[...])), kind).astype(dtype)

    tensors = []
    for tm in maps:
        variable = get_variable(model, tm.path)
        shape = hf_shape(tm.kind, tuple(variable.shape))
        tensors.append((tm.hf_name, shape, dtype, producer(variable, tm.kind)))
    return tensors
