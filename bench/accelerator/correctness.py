"""Part 1 of the accelerator check: correctness on the device. Logits of a random model on the
device (fp32 at the highest and the default matmul precision, bf16) against the CPU's fp32 ones; the
greedy sampler against the forward pass's argmax; one sharded RL update against the CPU's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench import harness
from bench.accelerator.common import (
    MODELS,
    Context,
    check,
    forward_fn,
    host_cast,
    model_from_state,
    place_on_mesh,
    random_model,
    rel_l2,
    replicate_rest,
)
from gd2po_jax.models import Decoder, ModelConfig
from gd2po_jax.models.logprobs import completion_logprobs
from gd2po_jax.models.sampling import bucket_length, generate, left_pad
from gd2po_jax.rl.train_step import jit_train_step, make_train_step
from gd2po_jax.runtime.sharding import batch_sharding, make_mesh
from gd2po_jax.training.optimizer import init_optimizer_state, make_optimizer
from gd2po_jax.training.records import RolloutBatch, TrainState

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
