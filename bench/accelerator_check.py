"""One-shot accelerator check (issue 17): what the design card promises on GPU / TPU, in one command.

Four parts, each a function returning a dict for the JSON report; one failing part records its
error and the others still run, and the exit status is 1 if any check failed.

1. ``correctness``: logits of a random Qwen2.5-0.5B-shaped model on the device (fp32 at the highest
   matmul precision, fp32 at the default one, bf16) against the same computation on
   ``jax.devices("cpu")[0]`` in fp32; greedy sampler tokens equal to the forward pass's argmax
   (teacher-forced on the sampler's own prefix); one sharded RL update on the device (all devices,
   ``mesh.fsdp=-1``) against the unsharded update on the CPU.
2. ``speed``: memory bandwidth (a large on-device ``x + 1``) and a bf16 matmul rate; sampling
   throughput of 0.5B / 1.5B-shaped bf16 models at 512 prompt + 512 new tokens against the
   bandwidth bound of a decode step ((weights + KV cache bytes) / bandwidth); the GRPO update's MFU
   at the 1.5B shape with remat; peak device memory next to docs/paper.md's estimate.
3. ``compilation``: five steps of the trainer's loop (`collect_rollouts` + the jitted update) on
   configs/default.py's run; steps 3-5 must compile nothing; compile counts and seconds.
4. ``end_to_end``: ``python train.py`` with its defaults (fresh temp workdir), wall time and the
   before/after table.

On a device machine, from the repository root (docs/accelerator/README.md: the install lines and what
each check means)::

    pip install -r requirements.txt && pip install "jax[cuda12]==0.10.2"
    timeout 600 python -m bench.accelerator_check --out=docs/accelerator/report-$(date +%F)-h200.json

On this workplace's lent H200 (jax 0.11.2 preinstalled, no network) the commands are
``bash bench/accelerator/device_check.sh --parts=correctness,compilation,end_to_end`` and
``... --parts=speed`` (two calls: the four parts took about 570 s there on 2026-12-04), with the
wheels of bench/accelerator/fetch_wheels.sh carried.

On a machine without an accelerator every part is skipped with its reason. ``--cpu-smoke`` runs a
miniature of every part on CPU (8 simulated devices; part 4 is ``train.py --config=configs/tiny.py``
shrunk further), in one to two minutes on 2 cores: tests/bench/test_accelerator_check.py runs it so
that the script cannot rot.

    python -m bench.accelerator_check --cpu-smoke --out=/tmp/report.json
    python -m bench.accelerator_check --parts=correctness,compilation
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import gc
import importlib
import importlib.metadata
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

# Before jax starts: the CPU smoke simulates 8 devices (as tests/conftest.py does) so that the
# sharded update runs on a real mesh; on a GPU, memory is allocated on demand rather than 75% up
# front, so that part 4's train.py subprocess gets the memory this process does not use.
if "--cpu-smoke" in sys.argv or "--cpu_smoke" in sys.argv:
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        flag = "--xla_force_host_platform_device_count=8"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from bench import harness  # noqa: E402
from gd2po_jax.config import RunConfig  # noqa: E402
from gd2po_jax.models import Decoder, ModelConfig  # noqa: E402
from gd2po_jax.models.sampling import SamplingParams, bucket_length, decode_fn, generate, left_pad, prefill_fn  # noqa: E402
from gd2po_jax.rl.logprobs import completion_logprobs, merge_model  # noqa: E402
from gd2po_jax.rl.optimizer import init_optimizer_state, make_optimizer  # noqa: E402
from gd2po_jax.rl.records import RolloutBatch, TrainState  # noqa: E402
from gd2po_jax.rl.setup import build_setup  # noqa: E402
from gd2po_jax.rl.train_step import StepConfig, jit_train_step, make_train_step  # noqa: E402
from gd2po_jax.rl.trainer import init_state  # noqa: E402
from gd2po_jax.runtime.sharding import batch_sharding, make_mesh, variable_sharding  # noqa: E402
from gd2po_jax.tasks.base import results_table  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]  # train.py's directory (part 4) and the git checkout

PARTS = ("correctness", "speed", "compilation", "end_to_end")

flags.DEFINE_bool("cpu_smoke", False, "Run a miniature of every part on CPU (seconds; for the tests).")
flags.DEFINE_alias("cpu-smoke", "cpu_smoke")
flags.DEFINE_list("parts", list(PARTS), f"Parts to run, a comma list of {', '.join(PARTS)}.")
flags.DEFINE_string("out", "", "Also write the JSON report to this path.")
flags.DEFINE_float("time_budget_s", 450.0, "Wall-clock budget: measurements that would start after it are "
                   "skipped (and recorded as such); part 4 gets what is left.")
flags.DEFINE_list("sampling_cases", ["qwen2.5-0.5b:64", "qwen2.5-0.5b:256", "qwen2.5-1.5b:256"],
                  "Sampling throughput cases MODEL:BATCH (device run; --cpu-smoke uses its own).")
flags.DEFINE_integer("step_layers", 4, "Layers of the 0.5B-wide model of the update parity check (the CPU "
                     "reference compiles and runs it; the full 24 layers are checked by the forward parity).")
FLAGS = flags.FLAGS

# ----------------------------------------------------------------------------------------------
# Shapes, tolerances, device facts.
# ----------------------------------------------------------------------------------------------

MODELS = {
    "qwen2.5-0.5b": harness.qwen2_config(**harness.QWEN2_SHAPES["qwen2.5-0.5b"]),
    "qwen2.5-1.5b": harness.qwen2_config(**harness.QWEN2_SHAPES["qwen2.5-1.5b"]),
    # The smoke's miniature of the two.
    "mini": harness.qwen2_config(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512, head_dim=16),
}

# Relative L2 error of the device's logits against the CPU's fp32 logits. fp32 at "highest" is the
# same arithmetic in another order; "default" lets a GPU use TF32; bf16 through 24 layers is ~0.02
# on the CPU itself (measured at the 0.5B shape), so 0.05 leaves room for a different accumulation.
TOLERANCES = {"float32/highest": 1e-4, "float32/default": 2e-2, "bfloat16": 5e-2}
# A greedy token may differ from the forward's argmax only where the two are tied to within this
# fraction of the logits' std (the cached decode and the full forward sum in different orders).
TIE_TOLERANCE = {"float32": 1e-3, "bfloat16": 1e-1}
LOGPROB_TOLERANCE = {"float32": 1e-3, "bfloat16": 1e-1}  # sampler log-prob vs the forward's, absolute
STEP_METRIC_RTOL, STEP_METRIC_ATOL = 1e-3, 1e-5  # the update's metrics, device vs CPU
STEP_LR = 1e-3
STEP_MISMATCH_FRACTION = 1e-4  # of parameters whose update differs by > 1% of lr (Adam's sign flips)

# Dense bf16 FLOP/s by device_kind substring (vendor datasheets, without sparsity); first match wins.
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("GH200", 989e12), ("H800", 989e12),
    ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12), ("B200", 2250e12),
    ("TPU v4", 275e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12), ("TPU v5p", 459e12),
    ("TPU v6 lite", 918e12), ("TPU v6e", 918e12),
)

# The README's validation table of the embedded default (its CPU run), read when part 4 reports:
# metric key -> the row's label at the start of a table row.
README_ROWS = {"correct_acc": "Correct Acc", "format_acc": "Format Acc", "truncation_rate": "Truncation rate"}


def readme_default_table(readme: pathlib.Path) -> dict[str, dict[str, float]]:
    """{metric: {"before_rl", "after_rl"}} from the README's table rows ``| label | before | after |``
    (bold marks dropped), so that part 4 sets the device's run beside the README's current numbers.

    Raises:
      ValueError: naming the README and the row that is missing or not two numbers.
    """
    rows = {}
    for line in readme.read_text().splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if len(cells) == 3:
            rows.setdefault(cells[0], cells[1:])
    table = {}
    for key, label in README_ROWS.items():
        try:
            before, after = (float(c) for c in rows[label])
        except (KeyError, ValueError):
            raise ValueError(f"{readme}: no table row '| {label} | <before> | <after> |' with two numbers "
                             f"(found {rows.get(label)!r})") from None
        table[key] = {"before_rl": before, "after_rl": after}
    return table


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


def device_profile() -> Profile:
    cases = []
    for case in FLAGS.sampling_cases:
        model, _, batch = case.partition(":")
        if model not in MODELS or not batch.isdigit():
            raise app.UsageError(f"--sampling_cases: {case!r} is not MODEL:BATCH with MODEL in {sorted(MODELS)}")
        cases.append((model, int(batch)))
    step = dataclasses.replace(MODELS["qwen2.5-0.5b"], num_layers=FLAGS.step_layers)
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
# Measuring: compiles, time, memory.
# ----------------------------------------------------------------------------------------------

COMPILES: harness.CompileCounter | None = None  # set by main()


@dataclasses.dataclass
class Context:
    profile: Profile
    device: Any  # where the checks run (jax.devices()[0])
    cpu: Any  # the reference (jax.devices("cpu")[0])
    deadline: float  # time.perf_counter() value after which measurements are skipped

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


# ----------------------------------------------------------------------------------------------
# Part 1: correctness on the device.
# ----------------------------------------------------------------------------------------------


def part_correctness(ctx: Context) -> dict:
    profile, device, cpu = ctx.profile, ctx.device, ctx.cpu
    config = MODELS[profile.parity_model]
    # Created on the device (random init on a CPU is slow at this size), kept as host numpy.
    host_state = jax.device_get(nnx.split(random_model(config, jnp.float32, device))[1])
    graphdef = nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))[0]
    forward = forward_fn(graphdef)
    prompts = harness.random_prompts(config.vocab_size, profile.parity_prompts, profile.parity_prompt_len, seed=1,
                                     ragged=True)
    ids, mask = left_pad(prompts, bucket_length(profile.parity_prompt_len), 0)

    def logits_on(where, dtype, precision):
        state = host_cast(host_state, dtype, where)
        with jax.default_matmul_precision(precision):
            return np.asarray(forward(state, jax.device_put(ids, where), jax.device_put(mask, where).astype(bool)))

    reference = logits_on(cpu, jnp.float32, "highest")
    real = mask.astype(bool)  # left pads' logits are meaningless
    checks, errors = [], {}
    for label, dtype, precision in (("float32/highest", jnp.float32, "highest"),
                                    ("float32/default", jnp.float32, None),
                                    ("bfloat16", jnp.bfloat16, None)):
        errors[label] = rel_l2(logits_on(device, dtype, precision)[real], reference[real])
        checks.append(check(f"logits {label} vs CPU fp32 (rel L2)", errors[label], TOLERANCES[label],
                            errors[label] <= TOLERANCES[label]))
    logit_std = float(np.std(reference[real]))

    greedy = {}
    for dtype in (jnp.float32, jnp.bfloat16):
        name = jnp.dtype(dtype).name
        with jax.default_matmul_precision("highest" if dtype == jnp.float32 else None):
            greedy[name] = greedy_check(model_from_state(config, host_state, dtype, device), prompts,
                                        profile.parity_new, logit_std, name)
        g = greedy[name]
        checks.append(check(f"greedy {name}: tokens = forward argmax (mismatches beyond a tie)",
                            g["unexplained_mismatches"], 0, g["unexplained_mismatches"] == 0,
                            f"{g['matches']}/{g['tokens']} equal; ties within {g['tie_tolerance']:.2g}"))
        checks.append(check(f"greedy {name}: sampler log-prob = forward log-prob (max abs)", g["logprob_max_abs"],
                            LOGPROB_TOLERANCE[name], g["logprob_max_abs"] <= LOGPROB_TOLERANCE[name]))

    step = update_parity(ctx)
    checks += step.pop("checks")
    return {"model": profile.parity_model, "logits_rel_l2": errors, "logit_std": logit_std, "greedy": greedy,
            "update": step, "checks": checks}


def greedy_check(model: Decoder, prompts, new_tokens: int, logit_std: float, dtype_name: str) -> dict:
    """Greedy `generate` against the argmax of one forward pass over prompt + the sampler's tokens."""
    out = generate(model, prompts, max_new_tokens=new_tokens, temperature=0.0)
    tokens = np.asarray(out.tokens)  # [N, M]
    ids = jnp.concatenate([out.prompt_tokens, out.tokens], axis=1)
    mask = jnp.concatenate([out.prompt_mask.astype(bool), jnp.ones(out.tokens.shape, bool)], axis=1)
    graphdef, state = nnx.split(model)
    lp = out.prompt_tokens.shape[1]
    logits = np.asarray(forward_fn(graphdef)(state, ids, mask))[:, lp - 1: lp - 1 + new_tokens]  # t predicts token t
    logits = logits.astype(np.float64)
    chosen = np.take_along_axis(logits, tokens[..., None], -1)[..., 0]
    margin = logits.max(-1) - chosen  # 0 where the sampler took the forward's argmax
    tie = TIE_TOLERANCE[dtype_name] * logit_std
    logp = chosen - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1)) - logits.max(-1)
    return {"tokens": int(tokens.size), "matches": int(np.sum(logits.argmax(-1) == tokens)),
            "unexplained_mismatches": int(np.sum(margin > tie)), "tie_tolerance": tie,
            "max_margin": float(margin.max()),
            "logprob_max_abs": float(np.max(np.abs(np.asarray(out.logprobs, np.float64) - logp)))}


def step_batch(config: ModelConfig, graphdef, host_state, prompts: int, group: int, prompt_len: int,
               new_tokens: int, cpu) -> RolloutBatch:
    """A host `RolloutBatch` of B = P x G rows: left-padded prompts, responses of random lengths,
    old log-probs of the CPU model plus noise (so that some ratios are clipped), rewards [P, G, 3]."""
    rs = np.random.RandomState(2)
    rows = prompts * group
    prompt_ids, prompt_mask = left_pad(harness.random_prompts(config.vocab_size, rows, prompt_len, seed=3, ragged=True),
                                       prompt_len, 0)
    ids = np.concatenate([prompt_ids, rs.randint(2, config.vocab_size, (rows, new_tokens))], 1).astype(np.int32)
    mask = np.concatenate([prompt_mask, np.ones((rows, new_tokens), np.int32)], 1).astype(bool)
    lengths = rs.randint(1, new_tokens + 1, rows)
    with jax.default_device(cpu), jax.default_matmul_precision("highest"):
        logp = nnx.jit(lambda m, i, a: completion_logprobs(m, i, a, new_tokens)[0])(
            nnx.merge(graphdef, jax.device_put(host_state, cpu)), ids, mask)
    old_logp = np.asarray(logp) + rs.normal(0, 0.1, (rows, new_tokens)).astype(np.float32)
    return RolloutBatch(
        input_ids=ids, attention_mask=mask, response_mask=np.arange(new_tokens)[None] < lengths[:, None],
        old_logp=old_logp, ref_logp=np.zeros_like(old_logp),
        rewards=rs.uniform(-1, 1, (prompts, group, 3)).astype(np.float32), valid=np.ones((prompts,), bool),
    )


def update_parity(ctx: Context) -> dict:
    """One update on a mesh over every device (``fsdp=-1``: parameters and optimizer state sharded,
    rows split) against the unsharded update on the CPU, from the same parameters and batch."""
    profile, cpu = ctx.profile, ctx.cpu
    config = profile.step_model
    model = random_model(config, jnp.float32, ctx.device)
    graphdef, params = nnx.split(model, nnx.Param)
    host_params = jax.device_get(params)
    batch = step_batch(config, graphdef, host_params, profile.step_prompts, profile.step_group,
                       profile.parity_prompt_len, profile.parity_new, cpu)
    step_config = harness.step_config(reward_names=("a", "b", "c"))
    optimizer = make_optimizer(STEP_LR)

    def one_update(params, batch, mesh):
        state = TrainState(params, init_optimizer_state(optimizer, params), jnp.zeros((), jnp.int32),
                           jax.random.PRNGKey(0))
        if mesh is None:
            step = jit_train_step(make_train_step(graphdef, optimizer, step_config))
        else:
            state = replicate_rest(state, mesh)
            step = jit_train_step(make_train_step(graphdef, optimizer, step_config, mesh),
                                  jax.tree.map(lambda x: x.sharding, state))
        with jax.default_matmul_precision("highest"):
            state, metrics = step(state, batch)
        return jax.device_get(state.params), jax.device_get(metrics)

    with jax.default_device(cpu):
        cpu_params, cpu_metrics = one_update(jax.device_put(host_params, cpu), jax.device_put(batch, cpu), None)
    devices = jax.devices()
    mesh = make_mesh(data=1, fsdp=-1, tensor=1, devices=devices)
    _, mesh_params = nnx.split(place_on_mesh(model, mesh), nnx.Param)
    mesh_batch = jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, x.shape)), batch)
    dev_params, dev_metrics = one_update(mesh_params, mesh_batch, mesh)

    worst_metric, worst_excess = None, -np.inf
    for name, value in cpu_metrics.items():
        value = float(value)
        excess = abs(float(dev_metrics[name]) - value) - (STEP_METRIC_ATOL + STEP_METRIC_RTOL * abs(value))
        if excess > worst_excess:
            worst_metric, worst_excess = name, excess
    def flat(tree):
        return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])

    start, dev_new, cpu_new = flat(host_params), flat(dev_params), flat(cpu_params)
    mismatch = float(np.mean(np.abs(dev_new - cpu_new) > 0.01 * STEP_LR))
    update_error = rel_l2(dev_new - start, cpu_new - start)
    return {
        "model_layers": config.num_layers, "rows": profile.step_prompts * profile.step_group,
        "mesh": dict(mesh.shape), "update_rel_l2": update_error, "param_mismatch_fraction": mismatch,
        "metrics_device": {k: float(v) for k, v in dev_metrics.items()},
        "metrics_cpu": {k: float(v) for k, v in cpu_metrics.items()},
        "checks": [
            check(f"update: metrics within rtol {STEP_METRIC_RTOL:g} + atol {STEP_METRIC_ATOL:g} (excess of the "
                  f"worst, {worst_metric})", worst_excess, 0.0, worst_excess <= 0),
            check("update: share of parameters whose update differs by > 1% of lr", mismatch,
                  STEP_MISMATCH_FRACTION, mismatch <= STEP_MISMATCH_FRACTION),
        ],
    }


# ----------------------------------------------------------------------------------------------
# Part 2: speed at real shapes.
# ----------------------------------------------------------------------------------------------


def measure_bandwidth(nbytes: int, device, repeats: int) -> float:
    """Device memory bandwidth in bytes/s: ``x + 1`` over ``nbytes`` of bf16 (read + write)."""
    add_one = jax.jit(lambda x: x + 1, donate_argnums=0)
    with jax.default_device(device):
        x = add_one(jnp.zeros((nbytes // 2,), jnp.bfloat16))
        times = []
        for _ in range(max(repeats, 3)):
            x, seconds = harness.time_call(lambda: add_one(x))  # noqa: B023
            times.append(seconds)
    del x
    return 2 * nbytes / min(times)


def kv_cache_bytes(config: ModelConfig, rows: int, slots: int, itemsize: int) -> int:
    return config.num_layers * 2 * rows * config.num_kv_heads * slots * config.head_dim * itemsize


def sampling_case(ctx: Context, model_name: str, batch: int, bandwidth: float) -> dict:
    """Prefill and decode throughput of a bf16 model (`prefill_fn` / `decode_fn`, as `generate` runs
    them), no EOS so every row decodes ``new`` tokens; the decode step against its bandwidth bound."""
    profile, device = ctx.profile, ctx.device
    config = MODELS[model_name]
    model = random_model(config, jnp.bfloat16, device)
    graphdef, state = nnx.split(model)
    params = SamplingParams(max_new_tokens=profile.sampling_new, temperature=1.0)
    ids, mask = left_pad(harness.random_prompts(config.vocab_size, batch, profile.sampling_prompt_len, seed=4),
                         bucket_length(profile.sampling_prompt_len), 0)
    ids, mask = jax.device_put(ids, device), jax.device_put(mask, device)
    keys = [jax.random.key(i) for i in range(profile.repeats + 1)]

    def run(key):
        dstate, prefill_s = harness.time_call(lambda: prefill_fn(graphdef, state, ids, mask, key, params, 1, None))
        _, decode_s = harness.time_call(lambda: decode_fn(graphdef, state, dstate, params, None))
        return prefill_s, decode_s

    before = COMPILES.snapshot()
    first = run(keys[0])
    compiles, compile_s = COMPILES.since(before)
    before = COMPILES.snapshot()
    runs = [run(key) for key in keys[1:]]
    timed_compiles, _ = COMPILES.since(before)
    prefill_s, decode_s = min(r[0] for r in runs), min(r[1] for r in runs)
    slots = ids.shape[1] + profile.sampling_new
    steps = profile.sampling_new - 1  # the prefill samples token 0
    weights = param_bytes(model)
    kv = kv_cache_bytes(config, batch, slots, jnp.dtype(model.dtype).itemsize)
    bound_s = (weights + kv) / bandwidth  # every decode step reads all weights and the whole cache
    step_s = decode_s / steps
    dstate = prefill_fn(graphdef, state, ids, mask, keys[0], params, 1, None)
    memory = {"prefill_program": program_bytes(prefill_fn, graphdef, state, ids, mask, keys[0], params, 1, None),
              "decode_program": program_bytes(decode_fn, graphdef, state, dstate, params, None)}
    del dstate
    peak, why = device_peak_bytes(device)
    estimate = weights + kv + batch * config.num_heads * ids.shape[1] * slots * 4  # + one layer's prefill scores
    result = {
        "model": model_name, "dtype": "bfloat16", "batch": batch, "prompt_len": int(ids.shape[1]),
        "new_tokens": profile.sampling_new, "params": config.num_params(),
        "first_call_s": sum(first), "compiles": compiles, "compile_s": compile_s, "timed_compiles": timed_compiles,
        "prefill_s": prefill_s, "decode_s": decode_s,
        "prefill_tokens_per_s": batch * ids.shape[1] / prefill_s,
        "decode_tokens_per_s": batch * steps / decode_s,
        "decode_step_ms": 1e3 * step_s, "bound_step_ms": 1e3 * bound_s, "of_bound": bound_s / step_s,
        "bytes_per_step": {"weights": weights, "kv_cache": kv},
        "memory_bytes": memory | {"device_peak_so_far": peak, "estimate": estimate},
    }
    return result | ({"memory_unavailable": why} if why else {})


def update_flops(config: ModelConfig, rows: int, seq: int, completion: int) -> float:
    """Model FLOPs of one update (forward + backward = 3x forward; remat's recomputation not counted):
    the layers' matmuls over all S positions, the LM head over the M completion positions, and
    attention's two S x S products per layer (masked, computed in full)."""
    d, hd, f = config.hidden_size, config.head_dim, config.intermediate_size
    layer = d * hd * (2 * config.num_heads + 2 * config.num_kv_heads) + 3 * d * f
    matmuls = 2 * config.num_layers * layer * rows * seq + 2 * d * config.vocab_size * rows * completion
    attention = 4 * config.num_layers * rows * seq * seq * config.num_heads * hd
    return 3.0 * (matmuls + attention)


def update_case(ctx: Context, matmul_rate: float) -> dict:
    """The GRPO update (bf16 compute, fp32 master weights and AdamW, remat, micro-batches) on a mesh
    over every device: MFU and memory."""
    profile, device = ctx.profile, ctx.device
    config = MODELS[profile.update_model]
    mesh = make_mesh(data=1, fsdp=-1, tensor=1)
    model = place_on_mesh(random_model(config, jnp.float32, device, remat=True), mesh)
    graphdef, params = nnx.split(model, nnx.Param)
    del model
    optimizer = make_optimizer(1e-6)
    state = replicate_rest(TrainState(params, init_optimizer_state(optimizer, params), jnp.zeros((), jnp.int32),
                                      jax.random.PRNGKey(0)), mesh)
    del params
    step_config = harness.step_config(method="grpo", compute_dtype="bfloat16", micro_batch_size=profile.update_micro)
    step = jit_train_step(make_train_step(graphdef, optimizer, step_config, mesh),
                          jax.tree.map(lambda x: x.sharding, state))
    p, g, lp, m = profile.update_prompts, profile.update_group, profile.update_prompt_len, profile.update_new
    rows, seq = p * g, lp + m
    rs = np.random.RandomState(5)
    host = RolloutBatch(
        input_ids=rs.randint(2, config.vocab_size, (rows, seq)).astype(np.int32),
        attention_mask=np.ones((rows, seq), bool), response_mask=np.ones((rows, m), bool),
        old_logp=(-math.log(config.vocab_size) + rs.normal(0, 0.05, (rows, m))).astype(np.float32),
        ref_logp=np.zeros((rows, m), np.float32), rewards=rs.uniform(size=(p, g, 1)).astype(np.float32),
        valid=np.ones((p,), bool))
    batch = jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, x.shape)), host)
    before = COMPILES.snapshot()
    (state, metrics), first_s = harness.time_call(lambda: step(state, batch))
    compiles, compile_s = COMPILES.since(before)
    before, times = COMPILES.snapshot(), []
    for _ in range(profile.repeats):
        (state, metrics), seconds = harness.time_call(lambda: step(state, batch))  # noqa: B023
        times.append(seconds)
    timed_compiles, _ = COMPILES.since(before)
    finite = all(math.isfinite(float(v)) for v in jax.device_get(metrics).values())
    memory = {"program": program_bytes(step, state, batch)}  # from the compile cache: no new compile
    del state
    flops = update_flops(config, rows, seq, m)
    best, median = harness.best_and_median(times)
    peak = peak_flops(device.device_kind)
    devices = len(mesh.devices.flat)
    n = config.num_params()
    # docs/paper.md's estimate per device: 18 B/param, + 4 for the fp32 gradient accumulator of the
    # micro-batches and + 2 for the remat scan's stacked bf16 layers (24 in all here), over the fsdp
    # devices; plus with remat the saved layer inputs (L x S x D x 2 B) and the recomputed layer's
    # attention tensors (3 x H x S^2 x 4 B) per sequence of a micro-batch split over the devices.
    bytes_per_param = 18 + (4 if profile.update_micro < rows else 0) + (2 if config.num_layers > 1 else 0)
    per_sequence = config.num_layers * seq * config.hidden_size * 2 + 3 * config.num_heads * seq * seq * 4
    estimate = bytes_per_param * n / devices + per_sequence * max(profile.update_micro // devices, 1)
    device_peak, why = device_peak_bytes(device)
    result = {
        "model": profile.update_model, "params": n, "rows": rows, "seq": seq, "completion": m,
        "micro_batch": profile.update_micro, "remat": True, "compute_dtype": "bfloat16", "mesh": dict(mesh.shape),
        "first_call_s": first_s, "compiles": compiles, "compile_s": compile_s, "timed_compiles": timed_compiles,
        "step_s_best": best, "step_s_median": median, "flops": flops,
        "tokens_per_s": rows * seq / best,
        "mfu": None if peak is None else flops / best / (peak * devices), "peak_flops_per_device": peak,
        "of_measured_matmul_rate": flops / best / (matmul_rate * devices), "finite_metrics": finite,
        "memory_bytes": memory | {"device_peak_so_far": device_peak, "estimate": estimate},
    }
    if peak is None:
        result["mfu_unavailable"] = f"no peak FLOP/s known for device kind {device.device_kind!r}"
    return result | ({"memory_unavailable": why} if why else {})


def part_speed(ctx: Context) -> dict:
    profile, device = ctx.profile, ctx.device
    bandwidth = measure_bandwidth(profile.bandwidth_bytes, device, profile.repeats)
    matmul_rate = harness.matmul_peak_gflops(profile.matmul_size, max(profile.repeats, 3), jnp.bfloat16, device) * 1e9
    cases, skipped, checks = [], [], []
    for model_name, batch in profile.sampling:
        if ctx.remaining() < 30:
            skipped.append(f"sampling {model_name} x {batch}: time budget spent")
            continue
        case = sampling_case(ctx, model_name, batch, bandwidth)
        gc.collect()
        cases.append(case)
        checks.append(check(f"sampling {model_name} x {batch}: no compile in the timed calls",
                            case["timed_compiles"], 0, case["timed_compiles"] == 0))
    update = None
    if ctx.remaining() < 60:
        skipped.append(f"update {profile.update_model}: time budget spent")
    else:
        update = update_case(ctx, matmul_rate)
        checks.append(check(f"update {profile.update_model}: no compile in the timed calls",
                            update["timed_compiles"], 0, update["timed_compiles"] == 0))
        checks.append(check(f"update {profile.update_model}: finite metrics", update["finite_metrics"], True,
                            update["finite_metrics"]))
    return {"device_kind": device.device_kind, "bandwidth_bytes_per_s": bandwidth,
            "memory_estimate": "docs/paper.md's method at these shapes (it tabulates none for them): sampling = "
                               "bf16 weights + KV cache + one layer's prefill scores; update = 24 B/param + saved "
                               "layer inputs + the recomputed layer's attention tensors per micro-batch sequence",
            "matmul_bf16_flops_per_s": matmul_rate, "sampling": cases, "update": update, "skipped": skipped,
            "checks": checks}


# ----------------------------------------------------------------------------------------------
# Part 3: compilation over five steps of the trainer's loop.
# ----------------------------------------------------------------------------------------------


def part_compilation(ctx: Context, steps: int = 5) -> dict:
    config = RunConfig.from_config_dict(importlib.import_module(ctx.profile.run_config).get_config())
    with tempfile.TemporaryDirectory(prefix="accelerator_check_") as workdir:
        before = COMPILES.snapshot()
        setup, setup_s = harness.time_call(lambda: build_setup(config, pathlib.Path(workdir)))
        graphdef, optimizer, state, _ = init_state(config, setup, setup.model_path)
        setup_compiles = COMPILES.since(before)
        step = jit_train_step(make_train_step(graphdef, optimizer, StepConfig.from_config(config), setup.mesh),
                              jax.tree.map(lambda x: x.sharding, state))
        rows = []
        for i in range(steps):
            before, start = COMPILES.snapshot(), time.perf_counter()
            rollouts = harness.step_rollouts(config, setup, merge_model(graphdef, state.params, config.model.dtype), i)
            state, metrics = step(state, rollouts.batch)
            jax.device_get(metrics)
            count, seconds = COMPILES.since(before)
            rows.append({"step": i + 1, "compiles": count, "compile_s": seconds, "wall_s": time.perf_counter() - start,
                         "sampling_s": rollouts.sampling_seconds})
    after_two = sum(r["compiles"] for r in rows[2:])
    steady = statistics.median(r["wall_s"] for r in rows[2:])
    return {
        "config": ctx.profile.run_config, "mesh": dict(setup.mesh.shape), "setup_s": setup_s,
        "setup_compiles": setup_compiles[0], "steps": rows,
        "compiles_steps_1_2": sum(r["compiles"] for r in rows[:2]), "compiles_after_step_2": after_two,
        "compile_s_steps_1_2": sum(r["compile_s"] for r in rows[:2]),
        "first_step_s": rows[0]["wall_s"], "steady_step_s": steady,
        "checks": [check(f"compiles in steps 3-{steps}", after_two, 0, after_two == 0)],
    }


# ----------------------------------------------------------------------------------------------
# Part 4: the embedded default end to end.
# ----------------------------------------------------------------------------------------------


def part_end_to_end(ctx: Context) -> dict:
    profile = ctx.profile
    timeout = ctx.remaining() - 5
    if timeout < profile.min_part4_s:
        return {"status": "skipped", "reason": f"time budget spent ({max(timeout, 0):.0f} s left); run "
                "--parts=end_to_end alone"}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    with tempfile.TemporaryDirectory(prefix="accelerator_check_train_") as workdir:
        command = [sys.executable, "train.py", f"--workdir={workdir}", *profile.train_args]
        start = time.perf_counter()
        try:
            proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            tail = (err.stdout or b"")[-2000:]
            raise RuntimeError(f"{' '.join(command[1:])} did not finish in {timeout:.0f} s; output tail:\n"
                               f"{tail.decode(errors='replace') if isinstance(tail, bytes) else tail}") from None
        wall = time.perf_counter() - start
        results_path = pathlib.Path(workdir) / "results.json"
        results = json.loads(results_path.read_text()) if results_path.is_file() else None
    result = {"command": " ".join(["python", *command[1:]]).replace(workdir, "TMP"), "returncode": proc.returncode,
              "wall_s": wall}
    checks = [check("train.py exit status", proc.returncode, 0, proc.returncode == 0)]
    if proc.returncode != 0:
        result["output_tail"] = (proc.stdout + proc.stderr)[-3000:]
    checks.append(check("results.json written", results is not None, True, results is not None))
    if results is not None:
        before, after = results.get("before_rl") or {}, results.get("after_rl") or {}
        keys = ("correct_acc", "correctness", "format_acc", "length", "truncation_rate")
        result["table"] = results_table(results)
        result["before_rl"] = {k: before.get(k) for k in keys}
        result["after_rl"] = {k: after.get(k) for k in keys}
        finite = all(isinstance(v, (int, float)) and math.isfinite(v)
                     for v in [*result["before_rl"].values(), *result["after_rl"].values()])
        checks.append(check("before/after metrics finite", finite, True, finite))
        if profile.name == "device":
            result["readme_cpu"] = readme_default_table(REPO / "README.md")
    return result | {"checks": checks}


# ----------------------------------------------------------------------------------------------
# The report.
# ----------------------------------------------------------------------------------------------

PART_FUNCTIONS: dict[str, Callable[[Context], dict]] = {
    "correctness": part_correctness, "speed": part_speed, "compilation": part_compilation,
    "end_to_end": part_end_to_end,
}


def run_part(fn: Callable[[Context], dict], ctx: Context) -> dict:
    """``fn(ctx)`` with its status ("passed" | "failed" | "error" | "skipped"), seconds and compiles;
    an exception becomes status "error" with its traceback, and the next part still runs."""
    before, start = (COMPILES.snapshot() if COMPILES else (0, 0.0)), time.perf_counter()
    try:
        result = dict(fn(ctx))
    except Exception as err:  # noqa: BLE001 - one failing part must not stop the others
        result = {"status": "error", "error": f"{type(err).__name__}: {err}",
                  "traceback": traceback.format_exc()[-4000:]}
    if "status" not in result:
        result["status"] = "passed" if all(c["passed"] for c in result.get("checks", [])) else "failed"
    result["seconds"] = time.perf_counter() - start
    if COMPILES is not None:
        result["compiles"], result["compile_s"] = COMPILES.since(before)
    gc.collect()
    return result


def run_parts(functions: dict[str, Callable[[Context], dict]], ctx: Context | None,
              on_part: Callable[[dict], None] | None = None) -> dict:
    """{part name: result} of each function in turn (every part is skipped, with the reason, when
    ``ctx`` is None: no accelerator; a part that would start after the time budget is skipped, saying
    so). ``on_part(results so far)`` runs after each part (main writes the report so far: a run killed
    by an outer time limit keeps the parts it finished)."""
    if ctx is None:
        reason = (f"no accelerator: jax's default backend is {jax.default_backend()!r}. The numbers wait for a "
                  "device machine; --cpu-smoke runs a miniature of every part on CPU")
        return {name: {"status": "skipped", "reason": reason} for name in functions}
    results = {}
    for name, fn in functions.items():
        if ctx.remaining() <= 0:
            results[name] = {"status": "skipped", "reason": f"time budget spent before it started; run "
                             f"--parts={name} alone"}
        else:
            print(f"[accelerator_check] {name} ...", file=sys.stderr, flush=True)
            results[name] = run_part(fn, ctx)
            print(f"[accelerator_check] {name}: {results[name]['status']} in {results[name]['seconds']:.1f} s",
                  file=sys.stderr, flush=True)
        if on_part is not None:
            on_part(results)
    return results


def exit_code(report: dict) -> int:
    """1 if any part failed or raised, else 0 (skipped parts are not failures)."""
    return int(any(part["status"] in ("failed", "error") for part in report["parts"].values()))


def environment() -> dict:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    device = jax.devices()[0]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "python": sys.version.split()[0], "jax": jax.__version__, "jaxlib": importlib.metadata.version("jaxlib"),
        "backend": jax.default_backend(), "device_kind": device.device_kind, "device_count": jax.device_count(),
        "peak_bf16_flops": peak_flops(device.device_kind),
    }


def jsonable(value):
    """``value`` with numpy scalars as Python numbers and non-finite floats as None (strict JSON)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    return value


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f}"


def summary_table(report: dict) -> str:
    """The short human table printed after the JSON."""
    env = report["environment"]
    lines = [f"accelerator check ({report['mode']}): {env['device_kind']} x{env['device_count']}, jax {env['jax']}, "
             f"commit {env['commit']}",
             f"{'part':<13}{'status':<9}{'seconds':>8}{'compiles':>10}  failed checks / reason"]
    for name, part in report["parts"].items():
        failed = [c["name"] for c in part.get("checks", []) if not c["passed"]]
        note = part.get("reason") or part.get("error") or "; ".join(failed)
        lines.append(f"{name:<13}{part['status']:<9}{part.get('seconds', 0):>8.1f}{part.get('compiles', 0):>10}  "
                     f"{note[:100]}")
    correctness = report["parts"].get("correctness", {})
    if "logits_rel_l2" in correctness:
        errors = ", ".join(f"{k} {v:.1e}" for k, v in correctness["logits_rel_l2"].items())
        greedy = ", ".join(f"{k} {g['matches']}/{g['tokens']}" for k, g in correctness["greedy"].items())
        lines.append(f"correctness: logits rel L2 {errors}; greedy = argmax {greedy}; update rel L2 "
                     f"{correctness['update']['update_rel_l2']:.1e}")
    speed = report["parts"].get("speed", {})
    if "bandwidth_bytes_per_s" in speed:
        lines.append(f"speed: bandwidth {speed['bandwidth_bytes_per_s'] / 1e9:,.0f} GB/s, bf16 matmul "
                     f"{speed['matmul_bf16_flops_per_s'] / 1e12:,.1f} TFLOP/s")
        lines.append(f"  {'sampling':<14}{'batch':>6}{'prefill tok/s':>15}{'decode tok/s':>14}{'step ms':>9}"
                     f"{'bound ms':>9}{'of bound':>9}{'prog MiB':>10}{'est MiB':>9}")
        for c in speed["sampling"]:
            program = max(v or 0 for k, v in c["memory_bytes"].items() if k.endswith("_program"))
            lines.append(f"  {c['model']:<14}{c['batch']:>6}{c['prefill_tokens_per_s']:>15,.0f}"
                         f"{c['decode_tokens_per_s']:>14,.0f}{c['decode_step_ms']:>9.2f}{c['bound_step_ms']:>9.2f}"
                         f"{c['of_bound']:>9.0%}{_mib(program):>10}{_mib(c['memory_bytes']['estimate']):>9}")
        u = speed.get("update")
        if u:
            mfu = "-" if u["mfu"] is None else f"{u['mfu']:.1%}"
            lines.append(f"  update {u['model']} ({u['rows']} x {u['seq']} tokens, remat, bf16): "
                         f"{u['step_s_best']:.2f} s, "
                         f"{u['tokens_per_s']:,.0f} tokens/s, MFU {mfu} ({u['of_measured_matmul_rate']:.1%} of the "
                         f"measured matmul rate), program {_mib(u['memory_bytes']['program'])} MiB, device peak "
                         f"{_mib(u['memory_bytes']['device_peak_so_far'])} MiB, estimate "
                         f"{_mib(u['memory_bytes']['estimate'])} MiB")
    compilation = report["parts"].get("compilation", {})
    if "compiles_after_step_2" in compilation:
        lines.append(f"compilation: {compilation['compiles_steps_1_2']} compiles in steps 1-2 "
                     f"({compilation['compile_s_steps_1_2']:.1f} s), {compilation['compiles_after_step_2']} after; "
                     f"first step {compilation['first_step_s']:.1f} s, then {compilation['steady_step_s']:.2f} s")
    e2e = report["parts"].get("end_to_end", {})
    if "wall_s" in e2e:
        lines.append(f"end to end: {e2e['command']} in {e2e['wall_s']:.0f} s")
        lines.extend("  " + line for line in e2e.get("table", "").splitlines())
    return "\n".join(lines)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    unknown = sorted(set(FLAGS.parts) - set(PARTS))
    if unknown:
        raise app.UsageError(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    global COMPILES
    COMPILES = harness.CompileCounter()
    smoke = FLAGS.cpu_smoke
    profile = smoke_profile() if smoke else device_profile()
    accelerator = jax.default_backend() != "cpu"
    ctx = Context(profile, jax.devices()[0], jax.devices("cpu")[0], time.perf_counter() + FLAGS.time_budget_s) \
        if smoke or accelerator else None
    functions = {name: PART_FUNCTIONS[name] for name in PARTS if name in FLAGS.parts}
    report = {"script": "bench/accelerator_check.py", "mode": profile.name, "environment": environment(),
              "time_budget_s": FLAGS.time_budget_s}

    def write(text: str) -> None:
        if FLAGS.out:  # written whole, then renamed: a kill never leaves half a file
            path = pathlib.Path(FLAGS.out)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_name(path.name + ".tmp").write_text(text + "\n")
            path.with_name(path.name + ".tmp").replace(path)

    def write_so_far(results: dict) -> None:  # marked incomplete until the last part has run
        write(json.dumps(jsonable(report | {"parts": results, "complete": False}), indent=1))

    report["parts"] = run_parts(functions, ctx, on_part=write_so_far)
    report["passed"] = exit_code(report) == 0
    report["complete"] = True
    report = jsonable(report)
    text = json.dumps(report, indent=1, sort_keys=False)
    write(text)
    print(text)
    print()
    print(summary_table(report))
    sys.exit(exit_code(report))


if __name__ == "__main__":
    app.run(main)
