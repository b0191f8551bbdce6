"""A policy to evaluate or export: a training run's, or a model directory's.

Two sources of a policy:

  a training run   a workdir with ``config.json`` (written by train.py): the data, tokenizer and
                   mesh come from that config (`gd2po_jax.tasks.setup.build_setup`) and the
                   parameters are restored from ``DIR/checkpoints`` (latest, or a given step; only
                   the ``params`` of the saved `TrainState` are read), else ``DIR/policy``
                   (`policy_from_run`).
  a plain model    a Hugging Face checkpoint directory or Hub id (config.json, safetensors, a
                   tokenizer with a chat template), or a PEFT LoRA adapter directory on its base
                   (`policy_from_model_path`); no training run needed.

`abstract_params` and `lora_from_checkpoint` are what export.py restores a checkpoint with.
Errors are `EvalError`s naming the flag or file to fix (eval.py and export.py print them in one line).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.data.tokenization import eos_token_ids, load_tokenizer, pad_token_id
from gd2po_jax.errors import UserError
from gd2po_jax.models import Decoder, load_pretrained
from gd2po_jax.models.config import load_hf_config
from gd2po_jax.models.logprobs import merge_model
from gd2po_jax.models.lora import (
    ADAPTER_CONFIG,
    LORA_BASE_KEY,
    base_reference,
    check_base,
    load_peft_adapter,
    lora_spec,
    read_adapter_config,
    split_lora,
)
from gd2po_jax.runtime.checkpoints import Checkpoints
from gd2po_jax.runtime.hub import resolve_model_dir
from gd2po_jax.runtime.run_dir import RunDir
from gd2po_jax.runtime.sharding import make_mesh, variable_sharding
from gd2po_jax.tasks.setup import RunSetup


class EvalError(UserError, ValueError):
    """A request eval.py (or export.py) cannot serve; the message names the flag or file to fix."""


@dataclasses.dataclass
class Policy:
    """A model ready to generate, with what decoding needs; ``source`` says where it came from."""

    model: Any
    tokenizer: Any
    eos_ids: list[int]
    pad_id: int
    source: dict[str, Any]


def abstract_params(model_dir: pathlib.Path, dtype, mesh) -> tuple[Any, nnx.State]:
    """(graphdef, params) of the decoder described by ``model_dir/config.json``, with
    `jax.ShapeDtypeStruct` values placed on their annotated shardings (nothing is allocated)."""
    model = nnx.eval_shape(lambda: Decoder(load_hf_config(model_dir), dtype=dtype, rngs=nnx.Rngs(0)))
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Param):
            node.set_value(jax.ShapeDtypeStruct(node.shape, dtype, sharding=variable_sharding(node, mesh)))
    return nnx.split(model, nnx.Param)


def lora_from_checkpoint(config: RunConfig, mesh, checkpoints: Checkpoints, step: int) -> tuple[Any, Any, Any]:
    """(graphdef, adapters, base) of a LoRA run's checkpoint ``step``: the base from the directory
    its metadata references (checked against its checksum), the adapters from the checkpoint.

    Raises:
      EvalError: the checkpoint references no base, or one whose weights have changed.
    """
    meta = checkpoints.metadata(step).get(LORA_BASE_KEY)
    if meta is None:
        raise EvalError(
            f"checkpoint {checkpoints.step_dir(step)} holds no LoRA adapters (the run's config.json "
            "sets config.model.lora.rank > 0)"
        )
    master = jnp.dtype(config.train.master_dtype)
    model = load_pretrained(
        meta["path"], dtype=jnp.dtype(config.model.lora.base_dtype or master), mesh=mesh, lora=lora_spec(config)
    )
    graphdef, fresh, frozen = split_lora(model)
    try:
        check_base({LORA_BASE_KEY: meta}, base_reference(meta["path"], frozen), checkpoints.step_dir(step))
    except ConfigError as err:
        raise EvalError(str(err)) from None
    return graphdef, checkpoints.restore_params(step, fresh), frozen


def policy_from_run(config: RunConfig, setup: RunSetup, workdir: pathlib.Path, step: int | None) -> Policy:
    """The run's policy: checkpoint ``step`` (default the latest), else ``workdir/policy``.

    Raises:
      EvalError: ``step`` is not among the saved checkpoints, or the run has neither a checkpoint
        nor a policy directory.
    """
    files = RunDir(workdir)
    common = dict(tokenizer=setup.tokenizer, eos_ids=setup.eos_ids, pad_id=setup.pad_id)
    with Checkpoints(files.checkpoints, create=False) as checkpoints:
        steps = checkpoints.steps()
        if step is not None and step not in steps:
            raise EvalError(
                f"--checkpoint_step={step}: no such checkpoint in {files.checkpoints}; "
                f"available steps: {steps or 'none'}"
            )
        if steps:
            step = steps[-1] if step is None else step
            if config.model.lora.enabled:
                graphdef, params, frozen = lora_from_checkpoint(config, setup.mesh, checkpoints, step)
            else:
                graphdef, target = abstract_params(setup.model_path, jnp.dtype(config.train.master_dtype), setup.mesh)
                params, frozen = checkpoints.restore_params(step, target), None
            model = merge_model(graphdef, params, config.model.dtype, frozen)
            return Policy(model=model, source={"checkpoint": str(files.checkpoints), "step": step}, **common)
    policy_dir = files.policy
    if (policy_dir / "config.json").is_file():
        model = load_pretrained(policy_dir, dtype=jnp.dtype(config.model.dtype), mesh=setup.mesh)
        return Policy(model=model, source={"model_path": str(policy_dir)}, **common)
    raise EvalError(
        f"{workdir} has no checkpoint in {files.checkpoints} and no exported policy in "
        f"{policy_dir}: train first (python train.py --workdir={workdir}) or pass --model_path"
    )


def policy_from_model_path(model_path: str, dtype: str) -> Policy:
    """A Hugging Face checkpoint directory or Hub id (`gd2po_jax.runtime.hub.resolve_model_dir`), its
    parameters sharded over all devices (fsdp); or a PEFT LoRA adapter directory, on its base
    (`adapter_on_base`)."""
    try:
        path = resolve_model_dir(model_path, f"--model_path={model_path}")
    except FileNotFoundError as err:
        raise EvalError(str(err)) from None
    if not (path / "config.json").is_file() and not (path / ADAPTER_CONFIG).is_file():
        raise EvalError(
            f"--model_path={model_path}: no config.json there (a Hugging Face model directory) nor "
            f"{ADAPTER_CONFIG} (a PEFT LoRA adapter)"
        )
    mesh = make_mesh(data=1, fsdp=-1)
    if (path / ADAPTER_CONFIG).is_file():  # a PEFT LoRA adapter (a run's policy_adapter/) on its base
        model, base = adapter_on_base(path, dtype, mesh)
        tokenizer_dir = path if (path / "tokenizer_config.json").is_file() else base
        source = {"model_path": str(path), "base_model": str(base)}
    else:
        model = load_pretrained(path, dtype=jnp.dtype(dtype), mesh=mesh)
        tokenizer_dir, source = path, {"model_path": str(path)}
    tokenizer = load_tokenizer(tokenizer_dir)
    eos_ids = eos_token_ids(tokenizer, tokenizer_dir)
    pad_id = pad_token_id(tokenizer, eos_ids)
    return Policy(model=model, tokenizer=tokenizer, eos_ids=eos_ids, pad_id=pad_id, source=source)


def adapter_on_base(adapter_dir: pathlib.Path, dtype: str, mesh) -> tuple[Any, pathlib.Path]:
    """(the model, its base's directory) of a PEFT LoRA adapter directory: the base named by its
    ``base_model_name_or_path`` with the adapters loaded on it, in ``dtype``.

    Raises:
      EvalError: naming the adapter directory, when its config or base cannot be used.
    """
    try:
        spec, base = read_adapter_config(adapter_dir, dtype=dtype)
        base_dir = resolve_model_dir(base, f"{adapter_dir / ADAPTER_CONFIG}: base_model_name_or_path={base!r}")
        model = load_pretrained(base_dir, dtype=jnp.dtype(dtype), mesh=mesh, lora=spec)
        load_peft_adapter(model, adapter_dir, mesh)
    except (ValueError, FileNotFoundError, KeyError) as err:
        raise EvalError(f"--model_path={adapter_dir}: {err}") from None
    return model, base_dir
