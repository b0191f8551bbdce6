"""Part 3 of the accelerator check: compilation over five steps of the trainer's loop
(`collect_rollouts` + the jitted update) on a config's run; steps 3-5 must compile nothing."""

from __future__ import annotations

import importlib
import pathlib
import statistics
import tempfile
import time

import jax

from bench import harness
from bench.accelerator.common import Context, check
from gd2po_jax.config import RunConfig
from gd2po_jax.jobs.train import init_state
from gd2po_jax.models.logprobs import merge_model
from gd2po_jax.rl.train_step import StepConfig, jit_train_step, make_train_step
from gd2po_jax.tasks.setup import build_setup


def part_compilation(ctx: Context, steps: int = 5) -> dict:
    config = RunConfig.from_config_dict(importlib.import_module(ctx.profile.run_config).get_config())
    with tempfile.TemporaryDirectory(prefix="accelerator_check_") as workdir:
        before = ctx.compiles.snapshot()
        setup, setup_s = harness.time_call(lambda: build_setup(config, pathlib.Path(workdir)))
        graphdef, optimizer, state, _ = init_state(config, setup, setup.model_path)
        setup_compiles = ctx.compiles.since(before)
        step = jit_train_step(make_train_step(graphdef, optimizer, StepConfig.from_config(config), setup.mesh),
                              jax.tree.map(lambda x: x.sharding, state))
        rows = []
        for i in range(steps):
            before, start = ctx.compiles.snapshot(), time.perf_counter()
            rollouts = harness.step_rollouts(config, setup, merge_model(graphdef, state.params, config.model.dtype), i)
            state, metrics = step(state, rollouts.batch)
            jax.device_get(metrics)
            count, seconds = ctx.compiles.since(before)
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
