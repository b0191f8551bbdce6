"""The RL update's memory at a model shape, from XLA's analysis of the compiled program: will it fit?

The update (`gd2po_jax.rl.train_step`, GRPO on the sampler's log-probs, fp32 master weights and AdamW,
micro-batches) is compiled for abstract inputs of the shape, on a mesh over every device (``fsdp``:
parameters, optimizer state and rows split as the trainer splits them), and nothing is allocated or
run: a 1.5B shape compiles in seconds on a CPU that could not hold it. Printed: the program's
arguments, outputs, temporaries and donated (aliased) bytes per device, its total (arguments +
outputs + temporaries - aliased: what it needs at its peak) and that total per parameter (all
devices together), and the compile time, for each ``model.remat`` policy asked (default: all four,
none | full | minimal | dots): a line each on stderr, and one JSON object on stdout (``--json FILE``:
also there) so that a user picks the policy that fits their card.

    python -m bench.update_memory                                   # Qwen2.5-1.5B, 64 x (512 + 512)
    python -m bench.update_memory --layers 2 && python -m bench.update_memory --layers 4   # per layer
    python -m bench.update_memory --remat=none --layers 4           # the layers without remat

The numbers are those of the backend it runs on: on a CPU, XLA:CPU's buffer assignment, which keeps
more alive than a GPU's scheduler may (docs/accelerator/README.md compares them). They count what
the program holds, not the allocator's fragmentation or the sampler's memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from bench import harness
from gd2po_jax.config import REMAT_POLICIES
from gd2po_jax.models.decoder import Decoder
from gd2po_jax.rl.train_step import jit_train_step, make_train_step
from gd2po_jax.runtime.sharding import batch_sharding, make_mesh, variable_sharding
from gd2po_jax.training.optimizer import make_optimizer, optimizer_state_shardings
from gd2po_jax.training.records import RolloutBatch, TrainState

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Layout:
    """The update's batch: ``prompts`` x ``group`` rows of ``prompt_len`` + ``new_tokens`` tokens, in
    micro-batches of ``micro_batch`` rows (0: all at once)."""

    prompts: int
    group: int
    prompt_len: int
    new_tokens: int
    micro_batch: int

    @property
    def rows(self) -> int:
        return self.prompts * self.group


def abstract_batch(layout: Layout, mesh) -> RolloutBatch:
    """A `RolloutBatch` of `jax.ShapeDtypeStruct` leaves (one reward), rows split as the trainer splits them."""
    rows, seq, m = layout.rows, layout.prompt_len + layout.new_tokens, layout.new_tokens

    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(mesh, shape))

    return RolloutBatch(
        input_ids=spec((rows, seq), jnp.int32), attention_mask=spec((rows, seq), jnp.bool_),
        response_mask=spec((rows, m), jnp.bool_), old_logp=spec((rows, m), jnp.float32),
        ref_logp=spec((rows, m), jnp.float32), rewards=spec((layout.prompts, layout.group, 1), jnp.float32),
        valid=spec((layout.prompts,), jnp.bool_))


def abstract_state(config, optimizer, mesh, *, remat: bool | str, attention: str = "auto"):
    """(graphdef, `TrainState` of `jax.ShapeDtypeStruct` leaves): the fp32 parameters on their
    annotated shardings (as `load_pretrained` places them), AdamW's state as the trainer places it
    (`optimizer_state_shardings`), the step and RNG key replicated."""
    model = nnx.eval_shape(
        lambda: Decoder(config, dtype=jnp.float32, rngs=nnx.Rngs(0), remat=remat, attention=attention))
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Param):
            value = node.get_value()
            node.set_value(jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=variable_sharding(node, mesh)))
    graphdef, params = nnx.split(model, nnx.Param)
    opt_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                             jax.eval_shape(optimizer.init, params), optimizer_state_shardings(optimizer, params))
    replicated = NamedSharding(mesh, PartitionSpec())
    step = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated)
    return graphdef, TrainState(params, opt_state, step, key)


def update_memory(config, layout: Layout, *, remat: bool | str, compute_dtype: str = "bfloat16",
                  attention: str = "auto") -> dict:
    """XLA's memory analysis of the compiled update (bytes per device) and its compile seconds, with
    the ``remat`` policy (`gd2po_jax.models.decoder.Decoder`) and ``attention`` (as resolved on this
    backend).

    Returns: {"arguments", "outputs", "temporaries", "aliased", "total", "compile_s", "params", "devices"}.
    """
    mesh = make_mesh(data=1, fsdp=-1, tensor=1)
    optimizer = make_optimizer(1e-6)
    graphdef, state = abstract_state(config, optimizer, mesh, remat=remat, attention=attention)
    step_config = harness.step_config(algorithm="grpo", compute_dtype=compute_dtype,
                                      micro_batch_size=layout.micro_batch)
    step = jit_train_step(make_train_step(graphdef, optimizer, step_config, mesh),
                          jax.tree.map(lambda x: x.sharding, state))
    start = time.perf_counter()
    analysis = step.lower(state, abstract_batch(layout, mesh)).compile().memory_analysis()
    seconds = time.perf_counter() - start
    found = {"arguments": analysis.argument_size_in_bytes, "outputs": analysis.output_size_in_bytes,
             "temporaries": analysis.temp_size_in_bytes, "aliased": analysis.alias_size_in_bytes}
    total = found["arguments"] + found["outputs"] + found["temporaries"] - found["aliased"]
    return found | {"total": total, "compile_s": seconds, "params": config.num_params(),
                    "devices": len(mesh.devices.flat)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_shape_arguments(parser, presets=tuple(harness.QWEN2_SHAPES), default="qwen2.5-1.5b")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=4, help="rollouts per prompt")
    parser.add_argument("--prompt_len", type=int, default=512)
    parser.add_argument("--new_tokens", type=int, default=512)
    parser.add_argument("--micro_batch", type=int, default=16, help="rows per micro-batch; 0: all rows at once")
    parser.add_argument("--remat", default=",".join(REMAT_POLICIES),
                        help=f"model.remat policies to compile, comma-separated, from {REMAT_POLICIES}")
    parser.add_argument("--no_remat", action="store_true", help="the same as --remat=none")
    parser.add_argument("--attention", default="auto", help="model.attention (as resolved on this backend)")
    parser.add_argument("--compute_dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--json", default="", help="also write the JSON report to this file")
    args = parser.parse_args()
    config = harness.qwen2_config(**harness.preset_shape(args))
    layout = Layout(args.prompts, args.group, args.prompt_len, args.new_tokens, args.micro_batch)
    if args.micro_batch and layout.rows % args.micro_batch:
        parser.error(f"--micro_batch: {args.micro_batch} does not divide the {layout.rows} rows")
    policies = ["none"] if args.no_remat else [p.strip() for p in args.remat.split(",") if p.strip()]
    unknown = sorted(set(policies) - set(REMAT_POLICIES))
    if unknown or not policies:
        parser.error(f"--remat: {unknown or policies} are not policies of {REMAT_POLICIES}")
    micro = f"micro-batches of {args.micro_batch}" if args.micro_batch else "no micro-batches"
    report = {"preset": args.preset, "params": config.num_params(), "num_layers": config.num_layers,
              "rows": layout.rows, "seq": args.prompt_len + args.new_tokens, "micro_batch": args.micro_batch,
              "compute_dtype": args.compute_dtype, "attention": args.attention, "platform": jax.devices()[0].platform,
              "units": "bytes per device", "policies": {}}
    for policy in policies:
        found = update_memory(config, layout, remat=policy, compute_dtype=args.compute_dtype,
                              attention=args.attention)
        per_param = found["total"] * found["devices"] / found["params"]
        report["devices"] = found["devices"]
        report["policies"][policy] = {k: found[k] for k in ("arguments", "outputs", "temporaries", "aliased", "total",
                                                            "compile_s")} | {"bytes_per_param": per_param}
        print(f"{args.preset}, {config.num_layers} layers ({found['params'] / 1e9:.3f} B params), {layout.rows} rows "
              f"x {args.prompt_len + args.new_tokens} tokens, {micro}, remat {policy}, {args.compute_dtype} compute, "
              f"{found['devices']} device(s), {jax.devices()[0].platform}:", file=sys.stderr)
        print(f"  compiled in {found['compile_s']:.1f} s: arguments {found['arguments'] / GIB:.2f} GiB, outputs "
              f"{found['outputs'] / GIB:.2f}, temporaries {found['temporaries'] / GIB:.2f}, aliased "
              f"{found['aliased'] / GIB:.2f} -> program {found['total'] / GIB:.2f} GiB per device "
              f"({per_param:.1f} B/param)", file=sys.stderr, flush=True)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
