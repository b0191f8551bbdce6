"""Trainer throughput: one RL step split into sampling / rewards / update, tokens/s and peak memory.

Two measurements:

* ``--mode=default`` (the default): the training config (configs/default.py, or ``--config=...`` with
  ml-collections overrides as for train.py) on its embedded task, from the base model (no warm start,
  so completions tend to run to ``max_new_tokens``: a worst case for sampling). ``--warmup`` steps
  are timed separately (compilation), then ``--steps`` steps are averaged.
* ``--mode=frame``: the project's speed frame: a random 29M-parameter Qwen2 (hidden 512, 8 layers,
  8/2 heads, intermediate 1408, vocab 12288, tied; bench/bench_sampling.py's default), float32,
  32 rollouts of 64 prompt + 64 completion tokens, the head-to-head harness's GRPO update
  (bench/anchor_workloads.py, workload T). Training tokens/s = 32 x 128 / update time; compare it
  with the anchors only in the same run (../shared/bench/anchors).

    python -m bench.bench_train                               # default config, 2 warm-up + 3 steps
    python -m bench.bench_train --config.train.prompts_per_step=8 --steps=5
    python -m bench.bench_train --mode=frame
    python -m bench.bench_train --config=configs/tiny.py --warmup=1 --steps=1   # a seconds-long check
"""

from __future__ import annotations

import pathlib
import resource
import statistics
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx

from bench import harness
from bench.anchor_workloads import update_workload
from gd2po_jax import cli
from gd2po_jax.config import RunConfig
from gd2po_jax.models import load_pretrained
from gd2po_jax.models.logprobs import merge_model
from gd2po_jax.training.optimizer import init_optimizer_state, make_optimizer
from gd2po_jax.training.records import TrainState
from gd2po_jax.tasks.setup import build_setup
from gd2po_jax.rl.train_step import jit_train_step, make_train_step, run_step_config

cli.define_config_flag("config", "configs/default.py", "Training config file (configs/*.py[:ARG]).")
flags.DEFINE_enum("mode", "default", ["default", "frame"], "What to measure (see the module docstring).")
flags.DEFINE_integer("warmup", 2, "Untimed steps first (compilation; step 2 must not compile again).")
flags.DEFINE_integer("steps", 3, "Timed steps.")
flags.DEFINE_string("workdir", "", "Where the embedded base model is built (default: a temp dir).")
FLAGS = flags.FLAGS


def peak_memory() -> str:
    host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    text = f"peak host RSS {host:,.0f} MiB"
    device = harness.device_peak_bytes()
    if device is not None:
        text += f" | peak device memory {device / 2**20:,.0f} MiB"
    return text


def bench_default(config, workdir: pathlib.Path) -> None:
    config = RunConfig.from_config_dict(config)
    setup = build_setup(config, workdir)
    model = load_pretrained(setup.model_path, dtype=jnp.float32, mesh=setup.mesh)
    graphdef, params = nnx.split(model, nnx.Param)
    optimizer = make_optimizer(config.train.learning_rate, weight_decay=config.train.weight_decay,
                               grad_clip=config.train.grad_clip)
    state = setup.place(TrainState(params, init_optimizer_state(optimizer, params), jnp.zeros((), jnp.int32),
                                   jax.random.PRNGKey(0)))
    step_config = run_step_config(config, setup.train.min_tokens, setup.prompt_length,
                                  reward_names=setup.reward_names, reward_weights=setup.reward_weights)
    step = jit_train_step(make_train_step(graphdef, optimizer, step_config, setup.mesh),
                          jax.tree.map(lambda x: x.sharding, state))
    rows = []
    for i in range(FLAGS.warmup + FLAGS.steps):
        rollouts = harness.step_rollouts(config, setup, merge_model(graphdef, state.params, config.model.dtype), i)
        (state, metrics), update = harness.time_call(lambda: step(state, rollouts.batch))  # noqa: B023
        batch = rollouts.batch
        trained = int(np.sum(np.asarray(batch.attention_mask)[:, : -batch.response_mask.shape[1]])) + int(
            np.sum(np.asarray(batch.response_mask)))
        rows.append(dict(rollout=rollouts.sampling_seconds, rewards=rollouts.reward_seconds, update=update,
                         generated=rollouts.generated_tokens, trained=trained, padded=int(batch.input_ids.size),
                         prompt_padding=float(metrics["update/prompt_padding"]),
                         padding=float(metrics["update/padding"])))
        label = "warm-up" if i < FLAGS.warmup else "step"
        print(f"{label} {i + 1}: sampling {rows[-1]['rollout']:.2f} s, rewards {rows[-1]['rewards']:.3f} s, "
              f"update {update:.2f} s", flush=True)
    timed = rows[FLAGS.warmup:]
    mean = {k: statistics.mean(r[k] for r in timed) for k in timed[0]}
    total = mean["rollout"] + mean["rewards"] + mean["update"]
    print(f"\ndevice: {harness.device_description()}, mesh {dict(setup.mesh.shape)}")
    print(f"batch: {config.train.prompts_per_step} prompts x {config.rl.num_generations} rollouts, prompt "
          f"length {setup.prompt_length}, max_new_tokens {config.sampling.max_new_tokens}, micro-batches of "
          f"{config.rl.micro_batch_size or 'all'} rollouts, prompt windows {step_config.prompt_windows or 'none'}")
    print(f"update slots that are padding: prompt {mean['prompt_padding']:.1%}, prompt + after the response "
          f"{mean['padding']:.1%}")
    print(f"compile (first step - mean step): sampling {rows[0]['rollout'] - mean['rollout']:.1f} s, "
          f"update {rows[0]['update'] - mean['update']:.1f} s")
    print(f"step {total:.2f} s = sampling {mean['rollout']:.2f} s ({mean['rollout'] / total:.0%}) + rewards "
          f"{mean['rewards']:.3f} s ({mean['rewards'] / total:.0%}) + update {mean['update']:.2f} s "
          f"({mean['update'] / total:.0%})")
    print(f"generated tokens/s (sampling) {mean['generated'] / mean['rollout']:,.0f} | "
          f"generated tokens/s (whole step) {mean['generated'] / total:,.0f}")
    print(f"trained tokens/s (update; real prompt + completion tokens) {mean['trained'] / mean['update']:,.0f} | "
          f"padded {mean['padded'] / mean['update']:,.0f}")
    print(peak_memory())


def bench_frame() -> None:
    config = harness.qwen2_config(**harness.QWEN2_SHAPES["qwen2-29m"])
    model = harness.random_model(config, jnp.float32)
    batch, prompt_len, new_tokens = 32, 64, 64
    result = update_workload(model, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
                             repeats=max(FLAGS.steps, 1))
    print(f"device: {harness.device_description()}")
    print(f"model: qwen2 {config.num_params() / 1e6:.1f}M params, float32; batch {batch} rollouts x "
          f"{prompt_len + new_tokens} tokens ({prompt_len} prompt + {new_tokens} completion), the anchors' GRPO "
          "update (bench/anchor_workloads.py, workload T)")
    print(f"update: best {result['best_s']:.2f} s = {result['tokens'] / result['best_s']:,.0f} training tokens/s | "
          f"median {result['median_s']:.2f} s = {result['tokens_per_s']:,.0f} training tokens/s | compilations after "
          f"warm-up {result['compiles_after_warmup']}")
    print(peak_memory())


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.mode == "frame":
        bench_frame()
        return
    if FLAGS.workdir:
        bench_default(FLAGS.config, pathlib.Path(FLAGS.workdir))
    else:
        with tempfile.TemporaryDirectory(prefix="bench_train_") as workdir:
            bench_default(FLAGS.config, pathlib.Path(workdir))


if __name__ == "__main__":
    app.run(main)
