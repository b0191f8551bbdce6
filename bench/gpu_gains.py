"""Issue 59's gains on one device, in one call: what each change to the update buys, as JSON.

Parts, in order (the JSON file is rewritten after each, so a call stopped at its limit keeps the
parts that finished; a part that would start past the budget is skipped, with that as its reason):

1. ``copy``: device memory bandwidth (``x + 1`` over bf16 bytes, read + write).
2. ``matmul``: the bf16 matmul rate (``size``^3 products, float32 accumulation).
3. ``attention``: one layer's attention forward + backward at the update's micro-batch shape, the
   plain path (`gd2po_jax.models.decoder.dot_product_attention`, float32 scores under a mask) against
   the flash path (`flash_attention` on right-padded rows: cuDNN where it runs, else JAX's XLA
   implementation, as ``model.attention=auto`` resolves it), their times and the largest gradient
   difference relative to the plain path's largest gradient.
4. ``updates``: the GRPO update (bf16 compute, fp32 master weights and AdamW, micro-batches) with
   each change added in turn: U0 today (plain attention, remat "full", the LM head's backward by
   autodiff in float32), U1 + cuDNN attention (``model.attention=auto``), U2 + the remat policy
   (``--u2_remat``, default "minimal"), U3 + the LM head's backward in the compute dtype
   (`gd2po_jax.models.logprobs.head_logprobs`). Each: compile seconds, best and median step
   seconds, tokens/s, MFU both ways (`bench.accelerator.speed.update_flops`: model FLOPs with
   causal attention counted once; hardware FLOPs with remat's recomputation), XLA's program bytes
   and the device's peak memory so far. Each update is compiled ahead of time: where the remat
   policy's program is larger than the device's memory (XLA:CPU's analysis puts "minimal" at
   79 GiB at this shape), U2 and U3 run with remat "full" instead and say so (``instead_of``).
   ``f32_score_shapes_in_hlo`` counts the float32 ``[..., S, S]`` shapes in the compiled program's
   text: the score tensors the plain path keeps, none where cuDNN attends.

    python -m bench.gpu_gains --time_budget_s=330 --json=$OUT/gpu_gains.json    # one device call
    python -m bench.gpu_gains --cpu-smoke --json=/tmp/gains.json                 # every part, tiny shapes

``--cpu-smoke`` runs every part end to end on miniature shapes (the accelerator check's "mini"
model) in well under 3 minutes on a 2-core CPU; its numbers only show that the parts run.
On a CPU the flash path is JAX's XLA implementation (cuDNN needs a GPU), which materializes the same
float32 scores as the plain path.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import json
import math
import pathlib
import re
import sys
import time
import traceback
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench import harness
from bench.accelerator.common import MODELS, peak_flops, place_on_mesh, random_model, replicate_rest
from bench.accelerator.speed import measure_bandwidth, update_flops
from gd2po_jax.models import logprobs
from gd2po_jax.models.decoder import attention_mask_3d, dot_product_attention, flash_attention, select_attention
from gd2po_jax.rl.train_step import jit_train_step, make_train_step
from gd2po_jax.runtime.sharding import batch_sharding, make_mesh
from gd2po_jax.training.optimizer import init_optimizer_state, make_optimizer
from gd2po_jax.training.records import RolloutBatch, TrainState


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The shapes of a run: the device's (Qwen2.5-1.5B, 64 x (512 + 512), micro-batches of 16, the
    accelerator check's update) or the CPU smoke's."""

    model: str
    prompts: int
    group: int
    prompt_len: int
    new_tokens: int
    micro_batch: int
    copy_bytes: int
    matmul_size: int
    repeats: int
    update_min_s: float  # the least budget left to start an update (its compile and a few steps)

    @property
    def rows(self) -> int:
        return self.prompts * self.group

    @property
    def seq(self) -> int:
        return self.prompt_len + self.new_tokens


DEVICE = Shapes("qwen2.5-1.5b", 16, 4, 512, 512, 16, 4 * 2**30, 8192, 3, 45.0)
CPU_SMOKE = Shapes("mini", 4, 2, 16, 8, 4, 8 * 2**20, 256, 2, 0.0)

UPDATES = (
    ("U0", "today: plain attention, remat full, the LM head's backward in float32", "plain", "full", "float32"),
    ("U1", "+ cuDNN attention (model.attention=auto)", "auto", "full", "float32"),
    ("U2", "+ the remat policy", "auto", None, "float32"),
    ("U3", "+ the LM head's backward in the compute dtype", "auto", None, "auto"),
)
"""(name, what, model.attention, model.remat (None: --u2_remat), logits_grad) of each update."""


def copy_part(shapes: Shapes, device) -> dict:
    return {"bytes": shapes.copy_bytes,
            "bytes_per_s": measure_bandwidth(shapes.copy_bytes, device, shapes.repeats)}


def matmul_part(shapes: Shapes, device) -> dict:
    rate = harness.matmul_peak_gflops(shapes.matmul_size, max(shapes.repeats, 3), jnp.bfloat16, device) * 1e9
    return {"size": shapes.matmul_size, "bf16_flops_per_s": rate}


def attention_part(shapes: Shapes, device) -> dict:
    """One layer's attention forward + backward at the update's micro-batch: plain vs flash."""
    config = MODELS[shapes.model]
    b, s, h, kv, hd = shapes.micro_batch, shapes.seq, config.num_heads, config.num_kv_heads, config.head_dim
    implementation = select_attention("auto", device.platform, jnp.bfloat16, hd)
    if implementation == "plain":  # not a GPU: the flash path is JAX's XLA implementation here
        implementation = "xla"
    rs = np.random.RandomState(0)
    q, k, v, d_out = (jax.device_put(jnp.asarray(rs.normal(size=shape), jnp.bfloat16), device)
                      for shape in ((b, s, h, hd), (b, s, kv, hd), (b, s, kv, hd), (b, s, h, hd)))
    mask = attention_mask_3d(jnp.ones((b, s), bool), jnp.zeros((), jnp.int32), s)

    def plain(q, k, v):  # the decoder's layouts: keys and values [B, KV, S, hd]
        return dot_product_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask)

    flash = functools.partial(flash_attention, implementation=implementation)
    result: dict = {"shape": {"batch": b, "seq": s, "heads": h, "kv_heads": kv, "head_dim": hd},
                    "flash_implementation": implementation}
    grads = {}
    for name, fn in (("plain", plain), ("flash", flash)):
        step = jax.jit(lambda q, k, v, fn=fn: jax.vjp(fn, q, k, v)[1](d_out))
        try:
            (out, seconds) = harness.time_call(functools.partial(step, q, k, v))  # compile + first call
            times = [harness.time_call(functools.partial(step, q, k, v))[1] for _ in range(shapes.repeats)]
        except Exception as error:  # noqa: BLE001  (cuDNN may fail to compile: recorded, the rest goes on)
            result[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
            continue
        best, median = harness.best_and_median(times)
        flops = 3 * 4 * b * s * s * h * hd * (1.0 if name == "plain" else (s + 1) / (2 * s))
        result[name] = {"first_call_s": seconds, "best_s": best, "median_s": median,
                        "computed_tflops_per_s": flops / best / 1e12}
        grads[name] = out
    if len(grads) == 2:
        scale = max(float(jnp.max(jnp.abs(g.astype(jnp.float32)))) for g in grads["plain"])
        diff = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
                   for a, b in zip(grads["plain"], grads["flash"]))
        result["max_grad_diff_relative"] = diff / max(scale, 1e-30)
        result["speedup"] = result["plain"]["best_s"] / result["flash"]["best_s"]
    return result


def update_batch(shapes: Shapes, vocab_size: int, mesh) -> RolloutBatch:
    """Random rollouts of the update's shape (all tokens real), rows split over the mesh."""
    rows, m = shapes.rows, shapes.new_tokens
    rs = np.random.RandomState(5)
    host = RolloutBatch(
        input_ids=rs.randint(2, vocab_size, (rows, shapes.seq)).astype(np.int32),
        attention_mask=np.ones((rows, shapes.seq), bool), response_mask=np.ones((rows, m), bool),
        old_logp=(-math.log(vocab_size) + rs.normal(0, 0.05, (rows, m))).astype(np.float32),
        ref_logp=np.zeros((rows, m), np.float32), rewards=rs.uniform(size=(shapes.prompts, shapes.group, 1))
        .astype(np.float32), valid=np.ones((shapes.prompts,), bool))
    return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, x.shape)), host)


@contextlib.contextmanager
def logits_grad(mode: str):
    """`completion_logprobs` with the LM head's backward ``mode`` (`logprobs.LOGITS_GRADS`) while
    the update is traced."""
    with mock.patch.object(logprobs, "chunked_token_logprobs",
                           functools.partial(logprobs.chunked_token_logprobs, logits_grad=mode)):
        yield


def device_bytes_limit(device) -> int | None:
    """The bytes a program may use on ``device`` (its allocator's limit), None where it says none."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    return None if not stats else stats.get("bytes_limit")


def update_part(shapes: Shapes, device, attention: str, remat: str, head_grad: str, matmul_rate: float | None,
                deadline: float) -> dict:
    """One update configuration: compiled ahead of time; if XLA's program is larger than the device's
    memory, only that ({"fits": False, ...}); else a first call and timed steps (as many of ``repeats``
    as the budget allows)."""
    config = MODELS[shapes.model]
    mesh = make_mesh(data=1, fsdp=-1, tensor=1)
    model = place_on_mesh(random_model(config, jnp.float32, device, remat=True), mesh)
    model.remat, model.attention = remat, attention
    resolved = model.attention_implementation(jnp.bfloat16)
    graphdef, params = nnx.split(model, nnx.Param)
    del model
    optimizer = make_optimizer(1e-6)
    state = replicate_rest(TrainState(params, init_optimizer_state(optimizer, params), jnp.zeros((), jnp.int32),
                                      jax.random.PRNGKey(0)), mesh)
    del params
    step_config = harness.step_config(algorithm="grpo", compute_dtype="bfloat16", micro_batch_size=shapes.micro_batch)
    step = jit_train_step(make_train_step(graphdef, optimizer, step_config, mesh),
                          jax.tree.map(lambda x: x.sharding, state))
    batch = update_batch(shapes, config.vocab_size, mesh)
    with logits_grad(head_grad):
        start = time.perf_counter()
        compiled = step.lower(state, batch).compile()
        compile_s = time.perf_counter() - start
    hlo = compiled.as_text() or ""
    scores = len(re.findall(rf"\bf32\[(?:\d+,)*{shapes.seq},{shapes.seq}\]", hlo))
    analysis = compiled.memory_analysis()
    memory = None if analysis is None else int(
        analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
        - analysis.alias_size_in_bytes)
    limit = device_bytes_limit(device)
    if memory is not None and limit is not None and memory > limit:
        return {"fits": False, "attention": resolved, "remat": remat, "logits_grad": head_grad,
                "compile_s": compile_s, "program_bytes": memory, "device_bytes_limit": limit}
    (state, metrics), first_s = harness.time_call(functools.partial(compiled, state, batch))
    times = []
    for _ in range(shapes.repeats):
        if times and time.perf_counter() + max(times) > deadline:
            break
        (state, metrics), seconds = harness.time_call(functools.partial(compiled, state, batch))
        times.append(seconds)
    best, median = harness.best_and_median(times)
    flops = update_flops(config, shapes.rows, shapes.seq, shapes.new_tokens, remat=remat, attention=resolved)
    peak = peak_flops(device.device_kind)
    devices = len(mesh.devices.flat)
    del state
    return {
        "fits": True, "attention": resolved, "remat": remat, "logits_grad": head_grad, "compile_s": compile_s,
        "first_call_s": first_s, "step_s_best": best, "step_s_median": median,
        "steps_timed": len(times), "tokens_per_s": shapes.rows * shapes.seq / best,
        "flops_model": flops["model"], "flops_hardware": flops["hardware"],
        "mfu_model": None if peak is None else flops["model"] / best / (peak * devices),
        "mfu_hardware": None if peak is None else flops["hardware"] / best / (peak * devices),
        "of_measured_matmul_rate": None if not matmul_rate else flops["model"] / best / (matmul_rate * devices),
        "finite_metrics": all(math.isfinite(float(x)) for x in jax.device_get(metrics).values()),
        "program_bytes": memory, "device_bytes_limit": limit,
        "device_peak_bytes_so_far": harness.device_peak_bytes(device), "f32_score_shapes_in_hlo": scores,
    }


PARTS = ("copy", "matmul", "attention") + tuple(u[0] for u in UPDATES)


def run(shapes: Shapes, budget_s: float, json_path: pathlib.Path | None, u2_remat: str = "minimal",
        parts: tuple[str, ...] = PARTS) -> dict:
    """The ``parts`` (of `PARTS`) within ``budget_s`` seconds, the report written to ``json_path`` after each."""
    start = time.perf_counter()
    deadline = start + budget_s
    device = jax.devices()[0]
    report: dict = {"device": device.device_kind, "platform": device.platform, "jax": jax.__version__,
                    "model": shapes.model, "rows": shapes.rows, "seq": shapes.seq, "completion": shapes.new_tokens,
                    "micro_batch": shapes.micro_batch, "budget_s": budget_s, "parts": {}, "skipped": [],
                    "complete": False}

    def write():
        report["elapsed_s"] = time.perf_counter() - start
        if json_path is not None:
            json_path.write_text(json.dumps(report, indent=1) + "\n")

    def part(name: str, fn, min_s: float = 0.0):
        if name not in parts:
            return None
        if time.perf_counter() + min_s > deadline:
            report["skipped"].append(f"{name}: the time budget is spent")
            write()
            return None
        part_start = time.perf_counter()
        try:
            result = fn()
        except Exception as error:  # noqa: BLE001  recorded, the next part still runs
            result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]}
        result["part_s"] = time.perf_counter() - part_start
        report["parts"][name] = result
        write()
        print(f"gpu_gains: {name} done in {result['part_s']:.1f} s", file=sys.stderr, flush=True)
        gc.collect()
        return result

    part("copy", lambda: copy_part(shapes, device))
    matmul = part("matmul", lambda: matmul_part(shapes, device)) or {}
    part("attention", lambda: attention_part(shapes, device))
    policy = u2_remat
    for name, what, attention, remat, head in UPDATES:
        remat = remat or policy

        def update(attention=attention, remat=remat, head=head):
            result = update_part(shapes, device, attention, remat, head, matmul.get("bf16_flops_per_s"), deadline)
            if not result["fits"] and remat != "full":  # the policy's program does not fit: full remat's
                result = update_part(shapes, device, attention, "full", head, matmul.get("bf16_flops_per_s"),
                                     deadline) | {"instead_of": {remat: {k: result[k] for k in (
                                         "program_bytes", "device_bytes_limit", "compile_s")}}}
            return result

        result = part(name, update, shapes.update_min_s)
        if result is not None:
            result["what"] = what
            if "instead_of" in result:
                policy = "full"  # U3 adds its change to what U2 ran
    report["complete"] = not report["skipped"] and not any("error" in r for r in report["parts"].values())
    write()
    return report


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time_budget_s", type=float, default=330.0, help="skip the parts that would start later")
    parser.add_argument("--cpu-smoke", dest="cpu_smoke", action="store_true", help="every part on tiny shapes")
    parser.add_argument("--u2_remat", default="minimal", choices=("full", "minimal", "dots", "none"),
                        help="U2's (and U3's) model.remat")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {PARTS}")
    parser.add_argument("--json", default="", help="the report's file (rewritten after each part)")
    args = parser.parse_args(argv)
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    if not parts or set(parts) - set(PARTS):
        parser.error(f"--parts: {args.parts!r}: comma-separated names from {PARTS}")
    shapes = CPU_SMOKE if args.cpu_smoke else DEVICE
    report = run(shapes, args.time_budget_s, pathlib.Path(args.json) if args.json else None, args.u2_remat, parts)
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
