"""Part 2 of the accelerator check: speed at real shapes. Memory bandwidth and the bf16 matmul
rate; sampling throughput against the bandwidth bound of a decode step; the GRPO update's MFU with
remat, both ways (`update_flops`); peak device memory next to docs/paper.md's estimate."""

from __future__ import annotations

import functools
import gc
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench import harness
from bench.accelerator.common import (
    MODELS,
    Context,
    check,
    device_peak_bytes,
    param_bytes,
    peak_flops,
    place_on_mesh,
    program_bytes,
    random_model,
    replicate_rest,
)
from gd2po_jax.models import ModelConfig
from gd2po_jax.models.sampling import SamplingParams, bucket_length, decode_fn, left_pad, prefill_fn
from gd2po_jax.rl.train_step import jit_train_step, make_train_step
from gd2po_jax.runtime.sharding import batch_sharding, make_mesh
from gd2po_jax.training.optimizer import init_optimizer_state, make_optimizer
from gd2po_jax.training.records import RolloutBatch, TrainState


def measure_bandwidth(nbytes: int, device, repeats: int) -> float:
    """Device memory bandwidth in bytes/s: ``x + 1`` over ``nbytes`` of bf16 (read + write)."""
    add_one = jax.jit(lambda x: x + 1, donate_argnums=0)
    with jax.default_device(device):
        x = add_one(jnp.zeros((nbytes // 2,), jnp.bfloat16))
        times = []
        for _ in range(max(repeats, 3)):
            x, seconds = harness.time_call(functools.partial(add_one, x))
            times.append(seconds)
    del x
    return 2 * nbytes / min(times)


def kv_cache_bytes(config: ModelConfig, rows: int, slots: int, itemsize: int) -> int:
    return config.num_layers * 2 * rows * config.num_kv_heads * slots * config.head_dim * itemsize


def sampling_case(ctx: Context, model_name: str, batch: int, bandwidth: float) -> dict:
    """Prefill and decode throughput of a bf16 model (`prefill_fn` / `decode_fn`, as `generate` runs
    them), no EOS so every row decodes ``new`` tokens; the decode step against its bandwidth bound."""
    profile, device, counter = ctx.profile, ctx.device, ctx.compiles
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

    before = counter.snapshot()
    first = run(keys[0])
    compiles, compile_s = counter.since(before)
    before = counter.snapshot()
    runs = [run(key) for key in keys[1:]]
    timed_compiles, _ = counter.since(before)
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


def update_flops(config: ModelConfig, rows: int, seq: int, completion: int, *, remat: str = "full",
                 attention: str = "plain") -> dict[str, float]:
    """FLOPs of one update, two ways:

    * ``model``: what the model needs, forward + backward = 3x the forward: the layers' weight
      products over all S positions, the LM head over the M completion positions, and attention's two
      products per layer with the causal mask counted once (S (S + 1) / 2 query-key pairs). The
      number MFU is quoted in (PaLM's and MaxText's convention).
    * ``hardware``: what the program computes: remat's recomputation (``remat``: "full" recomputes
      every layer's forward, "minimal" / "dots" its attention alone, "none" nothing), the LM head's
      forward again in its backward (the chunks recompute their logits), and attention's products
      over all S x S pairs (masked, computed in full) unless ``attention`` is "cudnn" (cuDNN's flash
      kernel skips the masked blocks: the causal half counted).

    Returns: {"model": float, "hardware": float}.
    """
    d, hd, f = config.hidden_size, config.head_dim, config.intermediate_size
    layer = d * hd * (2 * config.num_heads + 2 * config.num_kv_heads) + 3 * d * f
    weights = 2 * config.num_layers * layer * rows * seq  # one forward's weight products
    head = 2 * d * config.vocab_size * rows * completion
    full_attention = 4 * config.num_layers * rows * seq * seq * config.num_heads * hd
    causal_attention = full_attention * (seq + 1) / (2 * seq)
    computed_attention = causal_attention if attention == "cudnn" else full_attention
    weight_passes = 3 + (remat == "full")
    attention_passes = 3 + (remat != "none")
    return {"model": 3.0 * (weights + head + causal_attention),
            "hardware": weight_passes * weights + 4.0 * head + attention_passes * computed_attention}


def update_case(ctx: Context, matmul_rate: float) -> dict:
    """The GRPO update (bf16 compute, fp32 master weights and AdamW, remat, micro-batches) on a mesh
    over every device: MFU and memory."""
    profile, device, counter = ctx.profile, ctx.device, ctx.compiles
    config = MODELS[profile.update_model]
    mesh = make_mesh(data=1, fsdp=-1, tensor=1)
    model = place_on_mesh(random_model(config, jnp.float32, device, remat=True), mesh)
    attention, remat = model.attention_implementation(jnp.bfloat16), model.remat
    graphdef, params = nnx.split(model, nnx.Param)
    del model
    optimizer = make_optimizer(1e-6)
    state = replicate_rest(TrainState(params, init_optimizer_state(optimizer, params), jnp.zeros((), jnp.int32),
                                      jax.random.PRNGKey(0)), mesh)
    del params
    step_config = harness.step_config(algorithm="grpo", compute_dtype="bfloat16", micro_batch_size=profile.update_micro)
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
    before = counter.snapshot()
    (state, metrics), first_s = harness.time_call(functools.partial(step, state, batch))
    compiles, compile_s = counter.since(before)
    before, times = counter.snapshot(), []
    for _ in range(profile.repeats):
        (state, metrics), seconds = harness.time_call(functools.partial(step, state, batch))
        times.append(seconds)
    timed_compiles, _ = counter.since(before)
    finite = all(math.isfinite(float(v)) for v in jax.device_get(metrics).values())
    memory = {"program": program_bytes(step, state, batch)}  # from the compile cache: no new compile
    del state
    flops = update_flops(config, rows, seq, m, remat=remat, attention=attention)
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
        "attention": attention,
        "first_call_s": first_s, "compiles": compiles, "compile_s": compile_s, "timed_compiles": timed_compiles,
        "step_s_best": best, "step_s_median": median, "flops": flops["model"], "flops_hardware": flops["hardware"],
        "tokens_per_s": rows * seq / best,
        "mfu": None if peak is None else flops["model"] / best / (peak * devices),
        "mfu_hardware": None if peak is None else flops["hardware"] / best / (peak * devices),
        "peak_flops_per_device": peak,
        "of_measured_matmul_rate": flops["model"] / best / (matmul_rate * devices), "finite_metrics": finite,
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
