"""``python train.py`` with dynamic sampling on (``rl.dynamic_sampling``, docs/dynamic_sampling.md): the
issue's "Done when" run (configs/tiny.py, GD2PO-Hard, kept, at most 4 rounds) fills every step's batch
or says it ran out of rounds, saves the dropped groups' rollouts marked, and a run killed with SIGKILL
twice and resumed equals the uninterrupted one: each step's rounds draw from the checkpointed sampler
position with keys of the step and round only, so a resumed step draws and samples the same.

The runs reuse tests/jobs/test_train.py's helpers (subprocesses on 2 simulated devices, one shared
compilation cache).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.fakes import write_config_file
from tests.jobs.test_train import (  # noqa: F401  (train_env: the session fixture of those runs)
    copy_warm_start,
    kill_twice_then_finish,
    policy_tensors,
    run_train,
    stable_metrics,
    train_env,
)
from tests.xla_env import xla_flags

REFILL = dict(rl__algorithm="gd2po_hard", rl__dynamic_sampling="kept", rl__dynamic_sampling_max_rounds=4,
              rl__dynamic_sampling_refill="rounds")
ENGINE_REFILL = REFILL | dict(rl__dynamic_sampling_refill="engine")


@pytest.fixture(scope="module")
def refill_reference(tmp_path_factory, train_env):  # noqa: F811
    """One uninterrupted tiny run with refill (the issue's command), saving every step's rollouts."""
    root = tmp_path_factory.mktemp("refill_reference")
    workdir = root / "run"
    assert not run_train(workdir, write_config_file(root, logging__rollouts_every=1, **REFILL), train_env)
    return workdir


def step_records(workdir):
    return [r for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines()) if "loss/grad_norm" in r]


@pytest.mark.slow
def test_every_step_fills_its_batch_or_reaches_the_round_limit(refill_reference):
    records = step_records(refill_reference)
    assert len(records) == 6
    for r in records:
        counted, rounds = r["dynamic_sampling/groups_counted"], r["dynamic_sampling/rounds"]
        assert counted == 8 or rounds == 4, r["step"]
        assert r["dynamic_sampling/filler_groups"] == 8 - counted
        assert r["dynamic_sampling/prompts_drawn"] == 8 * rounds  # prompts_per_call 0: whole rounds
        assert r["dynamic_sampling/generated_tokens"] == r["generated_tokens"]
        assert {"correctness", "format", "length"} <= {
            k.rsplit("/", 1)[1] for k in r if k.startswith("dynamic_sampling/no_signal_fraction/")
        }
    assert any(r["dynamic_sampling/rounds"] > 1 for r in records), "the tiny run should need refill"
    # The saved rollouts: the batch's groups marked, then the dropped ones.
    for r in records:
        lines = [json.loads(x) for x in (refill_reference / "rollouts" / f"step_{r['step']}.jsonl").open()]
        marks = [x["dynamic_sampling"] for x in lines]
        assert len(lines) == 4 * r["dynamic_sampling/prompts_drawn"]
        assert marks[: 32].count("counted") == 4 * r["dynamic_sampling/groups_counted"]
        assert set(marks[32:]) <= {"no_signal", "surplus"}
        assert marks.count("surplus") == 4 * r["dynamic_sampling/surplus_groups"]
        assert np.mean([x["keep"] for x in lines[:32] if x["dynamic_sampling"] == "counted"]) > 0


@pytest.mark.slow
def test_killed_and_resumed_refill_run_equals_the_uninterrupted_one(refill_reference, tmp_path, train_env):  # noqa: F811
    workdir = tmp_path / "run"
    copy_warm_start(refill_reference, workdir)
    seen_first = kill_twice_then_finish(workdir, write_config_file(tmp_path, logging__rollouts_every=1, **REFILL),
                                        train_env)
    assert stable_metrics(workdir) == stable_metrics(refill_reference), f"first kill saw {seen_first}"
    expected, got = policy_tensors(refill_reference), policy_tensors(workdir)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    for step in range(1, 7):  # the same prompts drawn, sampled and dropped
        assert (workdir / "rollouts" / f"step_{step}.jsonl").read_text() == \
            (refill_reference / "rollouts" / f"step_{step}.jsonl").read_text()


# ----------------------------------------------------------------------------------------------
# Refilled inside the rollout engine (one device: the engine samples; the default).
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_device_env(train_env):  # noqa: F811
    return {**train_env, "XLA_FLAGS": xla_flags(1)}


@pytest.fixture(scope="module")
def engine_refill_reference(tmp_path_factory, one_device_env):
    root = tmp_path_factory.mktemp("engine_refill_reference")
    workdir = root / "run"
    config = write_config_file(root, logging__rollouts_every=1, **ENGINE_REFILL)
    assert not run_train(workdir, config, one_device_env)
    return workdir


@pytest.mark.slow
def test_refilled_in_the_engine_every_step_draws_what_it_needs(engine_refill_reference):
    """One engine run per step draws a prompt per group that does not count: no surplus, never more
    than P x max_rounds prompts, the batch full unless that limit was reached."""
    records = step_records(engine_refill_reference)
    assert len(records) == 6
    for r in records:
        counted, drawn = r["dynamic_sampling/groups_counted"], r["dynamic_sampling/prompts_drawn"]
        assert r["dynamic_sampling/rounds"] == 1 and r["dynamic_sampling/surplus_groups"] == 0
        assert 8 <= drawn <= 32 and (counted == 8 or drawn == 32), r["step"]
        assert r["dynamic_sampling/filler_groups"] == 8 - counted
        lines = [json.loads(x) for x in (engine_refill_reference / "rollouts" / f"step_{r['step']}.jsonl").open()]
        assert len(lines) == 4 * drawn
        assert [x["dynamic_sampling"] for x in lines[32:]].count("no_signal") == 4 * (drawn - 8)
    assert any(8 < r["dynamic_sampling/prompts_drawn"] < 32 and r["dynamic_sampling/prompts_drawn"] % 8
               for r in records), "the tiny run should refill by single prompts"


@pytest.mark.slow
def test_killed_and_resumed_engine_refill_run_equals_the_uninterrupted_one(engine_refill_reference, tmp_path,
                                                                             one_device_env):
    """The refill's decisions wait for the groups' rewards at fixed points of the engine's loop, so a
    resumed step draws, samples and drops the same prompts, bit for bit."""
    workdir = tmp_path / "run"
    copy_warm_start(engine_refill_reference, workdir)
    config = write_config_file(tmp_path, logging__rollouts_every=1, **ENGINE_REFILL)
    seen_first = kill_twice_then_finish(workdir, config, one_device_env)
    assert stable_metrics(workdir) == stable_metrics(engine_refill_reference), f"first kill saw {seen_first}"
    expected, got = policy_tensors(engine_refill_reference), policy_tensors(workdir)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    for step in range(1, 7):
        assert (workdir / "rollouts" / f"step_{step}.jsonl").read_text() == \
            (engine_refill_reference / "rollouts" / f"step_{step}.jsonl").read_text()
