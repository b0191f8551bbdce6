"""LoRA adapters of a `Decoder`: the base / adapter split, merging, init, and PEFT's format.

The adapters themselves are Flax's `nnx.LoRA` modules on the projections (`gd2po_jax.models.decoder`,
``Decoder(..., lora=LoRASpec)``); their variables are `nnx.LoRAParam`, so one split separates them::

    graphdef, adapters, base = split_lora(model)        # nnx.split(model, nnx.LoRAParam, nnx.Param)
    model = nnx.merge(graphdef, base, adapters)          # `gd2po_jax.models.logprobs.merge_model(..., frozen=base)`
    plain = merged_decoder(model)                        # a Decoder without adapters: W + (alpha/r) A @ B

``base`` has the state of the same `Decoder` without adapters, so ``nnx.merge(plain_graphdef(model),
base)`` is the base model itself (the KL reference: no copy of a weight).

PEFT's format (``save_peft_adapter`` / ``load_peft_adapter``): ``adapter_config.json`` (``r``,
``lora_alpha``, ``target_modules`` in Hugging Face names, ``base_model_name_or_path``) and
``adapter_model.safetensors`` with ``base_model.model.<module>.lora_A.weight [r, in]`` and
``.lora_B.weight [out, r]``: the transposes of our ``lora_a [in, r]`` and ``lora_b [r, out]``
(``peft/utils/save_and_load.py``'s ``get_peft_model_state_dict`` drops the adapter's name).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.models.decoder import LORA_A_INIT, LORA_TARGETS, Decoder, LoRASpec, effective_kernel
from gd2po_jax.models.safetensors_io import SafetensorsCheckpoint, write_file
from gd2po_jax.runtime.checkpoints import legacy_sums
from gd2po_jax.runtime.distributed import host_value, is_primary
from gd2po_jax.runtime.run_dir import writing
from gd2po_jax.runtime.sharding import place_host_array, variable_sharding

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

HF_MODULES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
"""Our target -> its module in a Hugging Face decoder layer (PEFT's ``target_modules`` are the last names)."""


def split_lora(model: Decoder) -> tuple[Any, nnx.State, nnx.State]:
    """(graphdef, adapters, base) of a LoRA `Decoder`: the `nnx.LoRAParam` variables and the rest."""
    return cast("tuple[Any, nnx.State, nnx.State]", nnx.split(model, nnx.LoRAParam, nnx.Param))  # two filters


def adapters_of(model: Decoder) -> list[tuple[int, str, nnx.LoRA]]:
    """(layer, target, adapter) of every adapter of ``model``, in layer then `LORA_TARGETS` order."""
    out = []
    for i, layer in enumerate(model.layers):
        for target in LORA_TARGETS:
            module = layer.attn if target in ("q", "k", "v", "o") else layer.mlp
            adapter = getattr(module, f"{target}_lora")
            if adapter is not None:
                out.append((i, target, adapter))
    return out


def _owner(model: Decoder, layer: int, target: str):
    return model.layers[layer].attn if target in ("q", "k", "v", "o") else model.layers[layer].mlp


def merged_decoder(model: Decoder) -> Decoder:
    """A `Decoder` without adapters whose kernels are ``W + (alpha / r) A @ B`` (in W's dtype);
    ``model`` itself is unchanged. A model without adapters is returned as it is."""
    if model.lora is None:
        return model
    plain = nnx.clone(model)
    for i, target, adapter in adapters_of(model):
        owner = _owner(plain, i, target)
        kernel = getattr(owner, f"{target}_kernel")
        kernel.set_value(effective_kernel(kernel, adapter, model.lora.scale))
        setattr(owner, f"{target}_lora", None)
    plain.lora = None
    return plain


def plain_graphdef(model: Decoder):
    """The graphdef of ``model`` without adapters: ``nnx.merge(plain_graphdef(m), split_lora(m)[2])``
    is the base model."""
    return nnx.split(nnx.eval_shape(merged_decoder, model), nnx.Param)[0]


def init_adapters(model: Decoder, seed: int, mesh: Mesh | None = None) -> None:
    """Sets every adapter of ``model`` (also an abstract one, `nnx.eval_shape`) as PEFT initialises
    one: ``A`` uniform in ``+-1/sqrt(in)`` (a key per adapter from ``seed``), ``B`` zeros, in its
    parameter dtype, on its annotated sharding when ``mesh`` is given. The same on every process."""
    key = jax.random.PRNGKey(seed)
    for n, (_, _, adapter) in enumerate(adapters_of(model)):
        for variable, init in ((adapter.lora_a, LORA_A_INIT), (adapter.lora_b, jax.nn.initializers.zeros)):
            value = np.asarray(init(jax.random.fold_in(key, n), tuple(variable.shape), jnp.float32))
            sharding = variable_sharding(variable, mesh) if mesh is not None else None
            variable.set_value(place_host_array(value, variable.dtype, sharding))


def base_checksum(base: nnx.State) -> int:
    """One number for the base weights: the sum mod 2**32 of the per-array `legacy_sums` (exact,
    independent of the sharding; the number LoRA checkpoints have always recorded), which a
    checkpoint records to refuse a different base on resume."""
    return sum(legacy_sums(base).values()) % 2**32


# ----------------------------------------------------------------------------------------------
# A run's adapters: from its config, and the base its checkpoints reference.
# ----------------------------------------------------------------------------------------------


def lora_spec(config: RunConfig) -> LoRASpec | None:
    """The policy's adapters from ``config.model.lora`` (in ``train.master_dtype``); None for rank 0."""
    lora = config.model.lora
    if not lora.enabled:
        return None
    return LoRASpec(
        rank=lora.rank, alpha=float(lora.alpha), targets=tuple(lora.targets), dtype=config.train.master_dtype
    )


def base_reference(policy_path: pathlib.Path, frozen) -> dict[str, Any]:
    """What a LoRA run's checkpoints record of the base they do not hold: its directory and the
    checksum of its weights as loaded (`gd2po_jax.models.lora.base_checksum`)."""
    return {"path": str(pathlib.Path(policy_path).absolute()), "checksum": base_checksum(frozen)}


def check_base(meta: dict[str, Any], reference: dict[str, Any] | None, step_dir: pathlib.Path) -> None:
    """A LoRA checkpoint's adapters resume only on the base they were trained on.

    Raises:
      ConfigError: the checkpoint records another base (checksum), or LoRA was turned on or off.
    """
    saved = meta.get(LORA_BASE_KEY)
    if (saved is None) != (reference is None):
        raise ConfigError(
            f"config.model.lora.rank: checkpoint {step_dir} was saved "
            f"{'without' if saved is None else 'with'} LoRA adapters; resume with the run's setting"
        )
    if saved is not None and reference is not None and saved["checksum"] != reference["checksum"]:
        raise ConfigError(
            f"checkpoint {step_dir} holds LoRA adapters of the base {saved['path']} (checksum "
            f"{saved['checksum']}); the base loaded now from {reference['path']} has checksum "
            f"{reference['checksum']}: adapters apply only to their own base"
        )


LORA_BASE_KEY = "lora_base"
"""In a LoRA run's checkpoint metadata: `base_reference` of the base its adapters apply to."""


# ----------------------------------------------------------------------------------------------
# PEFT's format.
# ----------------------------------------------------------------------------------------------


def peft_name(layer: int, target: str, factor: str) -> str:
    """``base_model.model.model.layers.{layer}.self_attn.q_proj.lora_A.weight`` (factor "A" or "B")."""
    return f"base_model.model.model.layers.{layer}.{HF_MODULES[target]}.lora_{factor}.weight"


def adapter_config(spec: LoRASpec, base_model_path: str, dropout: float = 0.0) -> dict[str, Any]:
    """The ``adapter_config.json`` of ``spec`` (PEFT's ``LoraConfig`` fields; the others default)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": dropout,
        "target_modules": sorted(HF_MODULES[t].split(".")[-1] for t in spec.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "base_model_name_or_path": str(base_model_path),
    }


def save_peft_adapter(
    model: Decoder, out_dir: str | pathlib.Path, base_model_path: str | pathlib.Path, *, dropout: float = 0.0
) -> list[str]:
    """Writes ``model``'s adapters as PEFT does (``adapter_config.json``, ``adapter_model.safetensors``
    in the adapters' dtype), loadable by ``peft.PeftModel.from_pretrained(base, out_dir)``.
    Several processes: all call it (each adapter is gathered in turn); process 0 writes."""
    if model.lora is None:
        raise ValueError("save_peft_adapter: the model has no adapters (model.lora.rank=0)")
    tensors = []
    for i, target, adapter in adapters_of(model):
        for factor, variable in (("A", adapter.lora_a), ("B", adapter.lora_b)):
            tensors.append(
                (
                    peft_name(i, target, factor),
                    tuple(reversed(variable.shape)),
                    np.dtype(variable.dtype),
                    lambda v=variable: np.asarray(host_value(v[...])).T,
                )
            )
    if not is_primary():
        for tensor in tensors:
            tensor[3]()  # the gathers process 0's writes need
        return []
    out_dir = pathlib.Path(out_dir)
    with writing(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        config = adapter_config(model.lora, str(base_model_path), dropout)
        (out_dir / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
        write_file(out_dir / ADAPTER_WEIGHTS, tensors)
    return [ADAPTER_CONFIG, ADAPTER_WEIGHTS]


def read_adapter_config(adapter_dir: str | pathlib.Path, dtype: str = "float32") -> tuple[LoRASpec, str]:
    """(the `LoRASpec`, ``base_model_name_or_path``) of a PEFT LoRA adapter directory.

    Raises:
      ValueError: naming the file, for what this package cannot load (not LoRA, DoRA, rsLoRA, a bias,
        ``fan_in_fan_out``, per-module ranks, or a module other than q/k/v/o/gate/up/down_proj).
    """
    file = pathlib.Path(adapter_dir) / ADAPTER_CONFIG
    if not file.is_file():
        raise FileNotFoundError(f"{adapter_dir}: no {ADAPTER_CONFIG} (not a PEFT adapter directory)")
    config = json.loads(file.read_text())
    plain: tuple[tuple[str, Any], ...]
    plain = (
        ("peft_type", "LORA"),
        ("use_dora", False),
        ("use_rslora", False),
        ("bias", "none"),
        ("fan_in_fan_out", False),
        ("rank_pattern", {}),
        ("alpha_pattern", {}),
        ("lora_bias", False),
        ("layers_to_transform", None),
        ("layers_pattern", None),
        ("layer_replication", None),
        ("exclude_modules", None),
        ("target_parameters", None),
        ("trainable_token_indices", None),
        ("use_qalora", False),
    )
    unsupported = [
        f"{key}={config.get(key)!r}"
        for key, ok in plain
        if config.get(key, ok) not in (ok, None) and config.get(key) != []
    ]
    by_name = {HF_MODULES[t].split(".")[-1]: t for t in LORA_TARGETS}
    modules = config.get("target_modules") or []
    modules = [modules] if isinstance(modules, str) else modules
    unknown = [m for m in modules if m not in by_name]
    if unsupported or unknown or not modules:
        raise ValueError(
            f"{file}: a LoRA adapter this package cannot load ({', '.join(unsupported)}"
            f"{'; target_modules ' + repr(unknown or modules) if unknown or not modules else ''}); "
            f"it loads plain LoRA on {sorted(by_name)}"
        )
    targets = tuple(t for t in LORA_TARGETS if HF_MODULES[t].split(".")[-1] in modules)
    spec = LoRASpec(rank=int(config["r"]), alpha=float(config["lora_alpha"]), targets=targets, dtype=dtype)
    return spec, str(config.get("base_model_name_or_path") or "")


def load_peft_adapter(
    model: Decoder,
    adapter_dir: str | pathlib.Path,
    mesh: Mesh | None = None,
    prefix: str = "base_model.model.",
    others: tuple[str, ...] = (),
) -> None:
    """Sets the adapters of ``model`` (built with `read_adapter_config`'s spec; may be abstract) from
    ``adapter_model.safetensors``, on their shardings when ``mesh`` is given.

    Args:
      prefix: what precedes ``model.layers`` in the tensor names (a score model's adapter: the same).
      others: the names of other tensors the caller reads from the file itself (a score head).

    Raises:
      KeyError / ValueError: a tensor is missing or has the wrong shape, or the file holds tensors
        this model has no place for (``modules_to_save`` other than ``others``), naming them and the file.
    """
    checkpoint = SafetensorsCheckpoint(adapter_dir)
    expected = set()
    for i, target, adapter in adapters_of(model):
        for factor, variable in (("A", adapter.lora_a), ("B", adapter.lora_b)):
            name = prefix + peft_name(i, target, factor).removeprefix("base_model.model.")
            expected.add(name)
            tensor = checkpoint.get(name, tuple(reversed(variable.shape)))
            sharding = variable_sharding(variable, mesh) if mesh is not None else None
            variable.set_value(place_host_array(np.asarray(tensor).T, variable.dtype, sharding))
    extra = sorted(checkpoint.names() - expected - set(others))
    if extra:
        raise ValueError(
            f"{adapter_dir}: {ADAPTER_WEIGHTS} holds tensors this model has no place for "
            f"(adapters it lacks, or modules_to_save): {extra[:4]}{' ...' if len(extra) > 4 else ''}"
        )
