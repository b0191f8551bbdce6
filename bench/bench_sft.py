"""The warm start's SFT step at several batch shapes: how its time depends on the sequence length.

Each shape is compiled first, then the shapes are timed in turns (``--rounds`` rounds of ``--steps``
steps each), so that a machine that slows down or speeds up meanwhile affects them alike; the median
round is printed per shape, in ms per step and us per token slot. The model is the config's embedded
tiny Qwen2 (``model.tiny``, random weights, ``--vocab_size`` tokens: the embedded tokenizer has
1,823), the step is `gd2po_jax.sft.step.make_sft_step` with the warm start's optimizer, and the
tokens are random: only the shapes matter.

    python -m bench.bench_sft                                  # the embedded default's shapes
    python -m bench.bench_sft --shapes=182x93,176x96 --batch_size=16 --rounds=6
    python -m bench.bench_sft --shapes=24x16 --rounds=1 --steps=1  # a seconds-long check
    python -m bench.bench_sft --shapes=176x96 --profile=/tmp/prof  # + where one step's time goes

``--profile DIR`` traces one more step of each shape after the timed rounds (jax.profiler, into
DIR/<shape>) and prints its XLA operations' time by kind and by source, as ``bench.anchor_workloads
--profile`` does (bench/profiling.py: the kind, output shape and JAX operation of each instruction,
from the optimized HLO dumped into DIR/hlo).

``--shapes`` are PROMPTxCOMPLETION token counts: 182x93 is the embedded default's longest prompt and
target (every batch at one length, ``sft.length_bucket=0``); 160x96, 176x96 and 192x96 are the windows
of ``sft.length_bucket=16`` (docs/speed.md).
"""

from __future__ import annotations

import pathlib
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx

from bench import harness, profiling
from gd2po_jax import cli
from gd2po_jax.config import RunConfig
from gd2po_jax.models.config import tiny_qwen2_config
from gd2po_jax.sft.step import make_sft_step
from gd2po_jax.training.optimizer import make_optimizer
from gd2po_jax.training.records import TrainState

cli.define_config_flag("config", "configs/default.py", "Config whose model.tiny, sft and train sections are used.")
flags.DEFINE_string("shapes", "182x93,192x96,176x96,160x96,184x96", "PROMPTxCOMPLETION lengths, comma-separated.")
flags.DEFINE_integer("batch_size", 0, "Examples per step; 0: the config's sft.batch_size.")
flags.DEFINE_integer("vocab_size", 1823, "Vocabulary of the random model.")
flags.DEFINE_integer("rounds", 6, "Rounds over the shapes.")
flags.DEFINE_integer("steps", 10, "Steps per shape and round.")
flags.DEFINE_string("profile", "", "Trace one more step of each shape into this directory and print where its "
                    "time goes.")
FLAGS = flags.FLAGS


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"182x93,176x96"`` -> [(182, 93), (176, 96)].

    Raises:
      app.UsageError: naming ``--shapes`` and the part that is not PROMPTxCOMPLETION positive ints.
    """
    shapes = []
    for part in text.split(","):
        prompt, _, completion = part.strip().partition("x")
        if not (prompt.isdigit() and completion.isdigit() and int(prompt) > 0 and int(completion) > 0):
            raise app.UsageError(f"--shapes: {part!r} is not PROMPTxCOMPLETION (two positive token counts)")
        shapes.append((int(prompt), int(completion)))
    return shapes


def named(fn, name: str):
    """``fn`` under ``name``, which XLA gives its compiled program (jit_NAME): each shape's step is
    its own program, so that ``--profile`` reads each shape's operations from its own dumped HLO."""

    def renamed(*args):
        return fn(*args)

    renamed.__name__ = renamed.__qualname__ = name
    return renamed


def main(argv):
    del argv
    config = RunConfig.from_config_dict(FLAGS.config)
    shapes = parse_shapes(FLAGS.shapes)
    if FLAGS.profile:
        profiling.dump_optimized_hlo(pathlib.Path(FLAGS.profile) / profiling.HLO_DUMP)
    batch = FLAGS.batch_size or config.sft.batch_size
    model = harness.random_model(tiny_qwen2_config(config.model.tiny, FLAGS.vocab_size, max_position_embeddings=4096))
    graphdef, params = nnx.split(model, nnx.Param)
    optimizer = make_optimizer(config.sft.learning_rate, weight_decay=config.train.weight_decay,
                               grad_clip=config.train.grad_clip)
    sft_step = make_sft_step(graphdef, optimizer, chunk_size=config.train.logit_chunk_size)
    rng = np.random.default_rng(0)
    runs = []
    for prompt, completion in shapes:
        step = jax.jit(named(sft_step, f"sft_step_{prompt}x{completion}"), donate_argnums=(0,))
        own = jax.tree.map(jnp.copy, params)  # each shape trains its own copy (the step donates it)
        run = {"state": TrainState(own, optimizer.init(own), jnp.zeros((), jnp.int32), jax.random.PRNGKey(0)),
               "batch": (jnp.asarray(rng.integers(0, FLAGS.vocab_size, (batch, prompt + completion)), jnp.int32),
                         jnp.ones((batch, prompt + completion), bool), jnp.ones((batch, completion), bool)),
               "times": []}

        def steps(run=run, step=step, count=1):
            for _ in range(count):
                run["state"], metrics = step(run["state"], *run["batch"])
            return metrics

        _, seconds = harness.time_call(steps)  # the first call of a shape compiles it
        print(f"compiled {prompt}x{completion}: {seconds:.1f} s", flush=True)
        runs.append((run, steps))
    for _ in range(FLAGS.rounds):
        for run, steps in runs:
            run["times"].append(harness.time_call(lambda: steps(count=FLAGS.steps))[1] / FLAGS.steps)
    print(f"SFT step, {batch} examples, median of {FLAGS.rounds} rounds of {FLAGS.steps} steps:")
    for (prompt, completion), (run, _) in zip(shapes, runs):
        seconds = statistics.median(run["times"])
        slots = batch * (prompt + completion)
        print(f"{prompt}x{completion} (S={prompt + completion}): {seconds * 1e3:.1f} ms/step "
              f"({min(run['times']) * 1e3:.1f}-{max(run['times']) * 1e3:.1f}), {seconds * 1e6 / slots:.2f} us/token")
    if FLAGS.profile:
        root = pathlib.Path(FLAGS.profile)
        for (prompt, completion), (_, steps) in zip(shapes, runs):
            shape = f"{prompt}x{completion}"
            report = profiling.profile_call(steps, root / shape, hlo_dir=root / profiling.HLO_DUMP)
            print("\n".join(profiling.profile_lines(shape, report)))


if __name__ == "__main__":
    app.run(main)
