"""What the accelerator check's parts share (bench/accelerator_check.py): the shapes of a run
(`Profile`: the device's or the CPU smoke's), the `Context` a part runs in, device facts, the check
records and the random models and their placement."""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from bench import harness
from gd2po_jax.models import Decoder, ModelConfig
from gd2po_jax.runtime.sharding import variable_sharding

REPO = pathlib.Path(__file__).resolve().parents[2]  # train.py's directory (part 4) and the git checkout

# ----------------------------------------------------------------------------------------------
# Shapes and device facts.
# ----------------------------------------------------------------------------------------------

MODELS = {
    "qwen2.5-0.5b": harness.qwen2_config(**harness.QWEN2_SHAPES["qwen2.5-0.5b"]),
    "qwen2.5-1.5b": harness.qwen2_config(**harness.QWEN2_SHAPES["qwen2.5-1.5b"]),
    # The smoke's miniature of the two.
    "mini": harness.qwen2_config(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512, head_dim=16),
}


# Dense bf16 FLOP/s by device_kind substring (vendor datasheets, without sparsity); first match wins.
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("GH200", 989e12), ("H800", 989e12),
    ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12), ("B200", 2250e12),
    ("TPU v4", 275e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12), ("TPU v5p", 459e12),
    ("TPU v6 lite", 918e12), ("TPU v6e", 918e12),
)


@dataclasses.dataclass(frozen=True)
class Profile:
    """The shapes of one run: ``device`` (the real ones) or ``cpu-smoke`` (miniatures)."""

    name: str
    parity_model: str
    parity_prompts: int  # rows of the logits / greedy checks
    parity_prompt_len: int
    parity_new: int
    step_model: ModelConfig
    step_prompts: int  # P of the update parity check (B = P x G rows)
    step_group: int
    sampling: tuple[tuple[str, int], ...]  # (model, batch)
    sampling_prompt_len: int
    sampling_new: int
    update_model: str
    update_prompts: int
    update_group: int
    update_prompt_len: int
    update_new: int
    update_micro: int
    bandwidth_bytes: int
    matmul_size: int
    repeats: int
    run_config: str  # module of part 3's config
    train_args: tuple[str, ...]  # part 4's train.py arguments (besides --workdir)
    min_part4_s: float  # part 4 is skipped with less time than this left


def device_profile(sampling_cases: Sequence[str], step_layers: int) -> Profile:
    """The device run's shapes: ``sampling_cases`` (``MODEL:BATCH`` strings, --sampling_cases) and an
    update parity model of ``step_layers`` layers (--step_layers).

    Raises:
      app.UsageError: naming a case that is not MODEL:BATCH with MODEL in `MODELS`.
    """
    cases = []
    for case in sampling_cases:
        model, _, batch = case.partition(":")
        if model not in MODELS or not batch.isdigit():
            raise app.UsageError(f"--sampling_cases: {case!r} is not MODEL:BATCH with MODEL in {sorted(MODELS)}")
        cases.append((model, int(batch)))
    step = dataclasses.replace(MODELS["qwen2.5-0.5b"], num_layers=step_layers)
    return Profile(
        name="device", parity_model="qwen2.5-0.5b", parity_prompts=4, parity_prompt_len=64, parity_new=32,
        step_model=step, step_prompts=2, step_group=4, sampling=tuple(cases), sampling_prompt_len=512,
        sampling_new=512, update_model="qwen2.5-1.5b", update_prompts=16, update_group=4, update_prompt_len=512,
        update_new=512, update_micro=16, bandwidth_bytes=4 * 2**30, matmul_size=8192, repeats=3,
        run_config="configs.default", train_args=(), min_part4_s=60.0,
    )


def smoke_profile() -> Profile:
    return Profile(
        name="cpu-smoke", parity_model="mini", parity_prompts=4, parity_prompt_len=16, parity_new=8,
        step_model=MODELS["mini"], step_prompts=2, step_group=4, sampling=(("mini", 8),),
        sampling_prompt_len=16, sampling_new=8, update_model="mini", update_prompts=4, update_group=2,
        update_prompt_len=16, update_new=8, update_micro=8, bandwidth_bytes=32 * 2**20, matmul_size=256,
        repeats=2, run_config="configs.tiny",
        train_args=("--config=configs/tiny.py", "--config.sft.enabled=false", "--config.train.num_steps=2",
                    "--config.eval.max_examples=8", "--config.eval.batch_size=8",
                    "--config.checkpoint.every_steps=2"),
        min_part4_s=10.0,
    )


def peak_flops(device_kind: str) -> float | None:
    for key, flops in PEAK_BF16_FLOPS:
        if key.lower() in device_kind.lower():
            return flops
    return None


# ----------------------------------------------------------------------------------------------
# The context of a part, measuring, check records.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Context:
    """What a part runs with: the run's shapes, the devices, the time budget's deadline and the
    compile counter (None: compilations are not counted, as in the tests of the report)."""

    profile: Profile
    device: Any  # where the checks run (jax.devices()[0])
    cpu: Any  # the reference (jax.devices("cpu")[0])
    deadline: float  # time.perf_counter() value after which measurements are skipped
    compiles: harness.CompileCounter | None = None  # the process's compilations (main's counter)

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()


def program_bytes(jitted, *args) -> int | None:
    """Device bytes of a jitted function's program for ``args`` (arguments + outputs + temporaries,
    less donated aliases) from XLA's memory analysis; the program is already in the compile cache."""
    analysis = jitted.lower(*args).compile().memory_analysis()
    if analysis is None:
        return None
    return int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
               - analysis.alias_size_in_bytes)


def device_peak_bytes(device) -> tuple[int | None, str | None]:
    """(peak bytes in use so far, None) from ``device.memory_stats()``, or (None, why not)."""
    peak = harness.device_peak_bytes(device)
    if peak is None:
        return None, f"{device.platform} device reports no memory_stats()['peak_bytes_in_use']"
    return peak, None


def check(name: str, value, limit, passed: bool, note: str = "") -> dict:
    out = {"name": name, "value": value, "limit": limit, "passed": bool(passed)}
    return out | ({"note": note} if note else {})


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))



# ----------------------------------------------------------------------------------------------
# Models and batches.
# ----------------------------------------------------------------------------------------------


@functools.cache
def _init_fn(config: ModelConfig, dtype_name: str, remat: bool):
    """The jitted initializer of a model (one compiled program per shape, shared between parts). Its
    key is an "rbg" key: XLA's bit generator compiles in a fraction of threefry's time on a CPU."""
    rngs = lambda: nnx.Rngs(params=jax.random.key(0, impl="rbg"))  # noqa: E731
    return nnx.jit(lambda: Decoder(config, dtype=jnp.dtype(dtype_name), rngs=rngs(), remat=remat))


def random_model(config: ModelConfig, dtype, device, *, remat: bool = False) -> Decoder:
    """A random `Decoder` created on ``device`` (normal(0.02) weights, norms 1, biases 0)."""
    with jax.default_device(device):
        return _init_fn(config, jnp.dtype(dtype).name, remat)()


def model_from_state(config: ModelConfig, state, dtype, device) -> Decoder:
    """A `Decoder` of ``dtype`` (parameters and KV cache) holding ``state`` cast and copied to ``device``."""
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Decoder(config, dtype=dtype, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, host_cast(state, dtype, device))


def host_cast(tree, dtype, device):
    """``tree``'s arrays cast on the host (numpy; no XLA program per shape) and copied to ``device``."""
    return jax.tree.map(lambda x: jax.device_put(np.asarray(x).astype(dtype), device), tree)


def place_on_mesh(model: Decoder, mesh) -> Decoder:
    """``model`` with every parameter on its annotated sharding of ``mesh`` (as `load_pretrained` does)."""
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Param):
            node.set_value(jax.device_put(node[...], variable_sharding(node, mesh)))
    return model


def replicate_rest(tree, mesh):
    """Leaves not yet on ``mesh`` (step, RNG key, optimizer counters) replicated on it, as the trainer
    does, so that the state keeps its shardings across updates."""
    replicated = NamedSharding(mesh, PartitionSpec())
    on_mesh = lambda x: isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh  # noqa: E731
    return jax.tree.map(lambda x: x if on_mesh(x) else jax.device_put(x, replicated), tree)


def param_bytes(model: Decoder) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def forward_fn(graphdef):
    """jit of ``(state, ids [B, S], mask [B, S]) -> logits [B, S, V]`` float32."""
    return jax.jit(lambda state, ids, mask: nnx.merge(graphdef, state)(ids, mask))
