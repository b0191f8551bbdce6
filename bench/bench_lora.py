"""LoRA against full fine-tuning on one model: the optimizer state's bytes, the update's memory, and
the sampler's decode with the adapters merged once per call or applied per token (docs/lora.md).

Default: the speed frame's random 29M-parameter Qwen2 (`harness.QWEN2_SHAPES["qwen2-29m"]`), fp32,
rank 8 on every projection; an update of 8 prompts x 4 rollouts x (64 prompt + 64 completion) tokens
in micro-batches of 8; decode of 32 rows x 64 new tokens.

    python -m bench.bench_lora
    python -m bench.bench_lora --rank 16 --preset qwen2.5-0.5b

A seconds-long check that the script runs:

    python -m bench.bench_lora --hidden=32 --layers=1 --heads=2 --kv_heads=1 --intermediate=64 --vocab=128 \\
        --head_dim=16 --prompts=2 --group=2 --prompt_len=8 --new_tokens=4 --micro_batch=2 --repeats=1

Memory is XLA's own account of the compiled update (`Compiled.memory_analysis`: its arguments,
outputs and temporaries, aliased donated buffers counted once): the peak the program needs, on any
backend, without running it. The decode times are the best and median of --repeats calls of each
decode program alone (prefill excluded, one warm-up call each), the three programs called in turns.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench import harness
from gd2po_jax.models import Decoder
from gd2po_jax.models.decoder import LoRASpec
from gd2po_jax.models.lora import split_lora
from gd2po_jax.models.sampling import SamplingParams, decode_fn, left_pad, prefill_fn
from gd2po_jax.training.optimizer import make_optimizer
from gd2po_jax.training.records import RolloutBatch, TrainState
from gd2po_jax.rl.train_step import jit_train_step, make_train_step


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_shape_arguments(parser)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=16.0)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt_len", type=int, default=64)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--micro_batch", type=int, default=8)
    parser.add_argument("--decode_rows", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    return parser.parse_args(argv)


def nbytes(tree) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def random_batch(vocab: int, prompts: int, group: int, prompt_len: int, new_tokens: int) -> RolloutBatch:
    rows, length = prompts * group, prompt_len + new_tokens
    rs = np.random.RandomState(0)
    return RolloutBatch(
        input_ids=jnp.asarray(rs.randint(2, vocab, (rows, length)), jnp.int32),
        attention_mask=jnp.ones((rows, length), bool), response_mask=jnp.ones((rows, new_tokens), bool),
        old_logp=jnp.full((rows, new_tokens), -3.0, jnp.float32), ref_logp=jnp.zeros((rows, new_tokens)),
        rewards=jnp.asarray(rs.uniform(-1, 1, (prompts, group, 2)), jnp.float32), valid=jnp.ones((prompts,), bool))


def update_memory(graphdef, params, frozen, batch, micro_batch: int) -> dict[str, int]:
    """Optimizer-state bytes and XLA's memory account of one jitted update of ``params`` (with the
    base ``frozen`` as the step's third argument, or None)."""
    optimizer = make_optimizer(1e-5)
    opt_state = optimizer.init(params)
    state = TrainState(params, opt_state, jnp.zeros((), jnp.int32), jax.random.PRNGKey(0))
    step = jit_train_step(make_train_step(graphdef, optimizer, harness.step_config(micro_batch_size=micro_batch)))
    args = (state, batch) if frozen is None else (state, batch, frozen)
    memory = step.lower(*args).compile().memory_analysis()
    peak = (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
            + memory.temp_size_in_bytes)
    return {"trained_param_bytes": nbytes(params), "frozen_param_bytes": nbytes(frozen),
            "optimizer_bytes": nbytes(opt_state), "update_temp_bytes": int(memory.temp_size_in_bytes),
            "update_peak_bytes": int(peak)}


def decode_call(model, prompts, new_tokens: int, merge: bool):
    """A function running the decode program alone (from one prefill's state, copied: decode donates it)."""
    params = SamplingParams(max_new_tokens=new_tokens, merge_adapters=merge)
    graphdef, state = nnx.split(model)
    ids, mask = left_pad(prompts, max(len(p) for p in prompts), 0)
    first = prefill_fn(graphdef, state, ids, mask, jax.random.key(0), params, 1, None)

    def call():
        start = jax.block_until_ready(jax.tree.map(jnp.copy, first))
        return harness.time_call(lambda: decode_fn(graphdef, state, start, params, None))[1]

    call()  # compiles
    return call


def main(argv=None) -> dict:
    args = parse_args(argv)
    shape = harness.preset_shape(args)
    config = harness.qwen2_config(**shape)
    spec = LoRASpec(rank=args.rank, alpha=args.alpha)
    full = harness.random_model(config)
    lora_model = nnx.jit(lambda: Decoder(config, rngs=nnx.Rngs(0), lora=spec))()
    graphdef, adapters, base = split_lora(lora_model)
    # Trained adapters (B not zero): the decode then computes what a trained policy does.
    adapters = jax.tree.map(lambda x: x + 0.01, adapters)
    lora_model = nnx.merge(graphdef, adapters, base)
    batch = random_batch(config.vocab_size, args.prompts, args.group, args.prompt_len, args.new_tokens)
    full_graphdef, full_params = nnx.split(full, nnx.Param)
    results = {"model": shape, "rank": args.rank, "device": harness.device_description(),
               "full": update_memory(full_graphdef, full_params, None, batch, args.micro_batch),
               "lora": update_memory(graphdef, adapters, base, batch, args.micro_batch)}
    prompts = harness.random_prompts(config.vocab_size, args.decode_rows, args.prompt_len)
    calls = {name: decode_call(model, prompts, args.new_tokens, merge)
             for name, model, merge in (("decode_base", full, True), ("decode_lora_merged", lora_model, True),
                                        ("decode_lora_unmerged", lora_model, False))}
    times = {name: [] for name in calls}
    for _ in range(args.repeats):  # in turns, so that the machine's drift falls on all alike
        for name, call in calls.items():
            times[name].append(call())
    for name, seconds in times.items():
        best, median = harness.best_and_median(seconds)
        results[name] = {"best_s": best, "median_s": median,
                         "tokens_per_s": args.decode_rows * args.new_tokens / best}
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
