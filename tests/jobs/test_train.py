"""The whole job (`gd2po_jax.jobs.train.train_and_evaluate`, `python train.py`) on a tiny setting.

Every run here is the embedded synthetic tool-calling task shrunk to seconds per step: a 64-wide,
2-layer Qwen2 with a 600-token tokenizer, short requests with one candidate tool, 8 prompts x 4
rollouts of at most 48 tokens. Runs go through ``train.py`` in subprocesses (2 simulated CPU
devices, tests/xla_env.py) that share one persistent XLA compilation cache, so a resumed or
repeated run does not compile again.

One reference run (SFT warm start + RL + evaluations) is shared by the tests below; the kill/resume
and sharded runs reuse its warm start (``base_model/`` and ``warm_start/`` are copied into their
workdirs, which the trainer then reuses) and compare their RL phase with it.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from gd2po_jax.config import ConfigError
from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.metrics_logging import read_metrics
from tests.fakes import REPO, as_run_config, subprocess_env, tensorboard_scalars, tiny_config, write_config_file

VOLATILE = ("time/", "tokens_per_second")  # wall-clock metrics: differ between any two runs


@pytest.fixture(scope="session")
def train_env(tmp_path_factory) -> dict:
    """Environment of the train.py subprocesses: 2 CPU devices, a shared compilation cache."""
    cache = tmp_path_factory.mktemp("xla_cache")
    return subprocess_env(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                          JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


def train_command(workdir: pathlib.Path, config_file: pathlib.Path) -> list[str]:
    return [sys.executable, str(REPO / "train.py"), f"--config={config_file}", f"--workdir={workdir}"]


def run_train(workdir: pathlib.Path, config_file: pathlib.Path, env: dict, *, kill_when=None,
              timeout: float = 600) -> bool:
    """Run train.py; with ``kill_when``, SIGKILL it as soon as ``kill_when()`` is true.

    Returns True if the process was killed, False if it finished (it must then succeed).
    """
    log = workdir.with_name(workdir.name + ".log")
    with log.open("a") as out:
        proc = subprocess.Popen(train_command(workdir, config_file), cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if kill_when is not None and kill_when():
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"train.py ran longer than {timeout} s; log: {log}")
            time.sleep(0.002)
    if proc.returncode != 0:
        pytest.fail(f"train.py failed with exit code {proc.returncode}:\n{log.read_text()[-4000:]}")
    return False


def stable_metrics(workdir: pathlib.Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in read_metrics(workdir)]


def policy_tensors(workdir: pathlib.Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(workdir / "policy" / "model.safetensors")


def copy_warm_start(source: pathlib.Path, workdir: pathlib.Path) -> None:
    workdir.mkdir(parents=True)
    for name in ("base_model", "warm_start"):
        shutil.copytree(source / name, workdir / name)


FAKE_WANDB = REPO / "tests" / "fake_wandb"  # a `wandb` package that records its calls (FAKE_WANDB_CALLS)
ROLLOUTS_EVERY = 1  # the reference saves the rollouts of every step (which steps: tests/rl/test_rollout_log.py)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, train_env) -> pathlib.Path:
    """The workdir of one uninterrupted tiny run (warm start, RL, evaluations), which also saves
    rollouts and logs to W&B (the fake of tests/fake_wandb, its calls in ``../wandb_calls.jsonl``).
    How a run is logged is not what it computes: the runs compared with it log nothing."""
    root = tmp_path_factory.mktemp("reference")
    workdir = root / "run"
    config_file = write_config_file(root, logging__rollouts_every=ROLLOUTS_EVERY, logging__wandb__enabled=True,
                                    logging__wandb__mode="offline")
    env = dict(train_env, JAX_LOG_COMPILES="1", FAKE_WANDB_CALLS=str(root / "wandb_calls.jsonl"),
               PYTHONPATH=os.pathsep.join([str(FAKE_WANDB), train_env["PYTHONPATH"]]))
    run_train(workdir, config_file, env)
    return workdir


# ----------------------------------------------------------------------------------------------
# Config validation: before any compute.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"rl__snr_tau": 1.5}, "config.rl.snr_tau"),
        ({"rl__snr_tau": -0.1}, "config.rl.snr_tau"),
        ({"rl__num_generations": 1}, "config.rl.num_generations"),
        ({"rl__algorithm": "ppo"}, "config.rl.algorithm"),
        ({"rl__num_minibatches": 3}, "config.rl.num_minibatches"),  # 32 rollouts
        ({"rl__micro_batch_size": 3}, "config.rl.micro_batch_size"),
        ({"train__prompts_per_step": 3, "rl__num_generations": 2}, "config.train.prompts_per_step"),  # 6 % 8
        ({"eval__batch_size": 12}, "config.eval.batch_size"),
        ({"rl__loss_agg_mode": "sum"}, "config.rl.loss_agg_mode"),
        ({"sft__seed": -1}, "config.sft.seed"),
        ({"sft__cache_dir": None}, "config.sft.cache_dir"),
        ({"train__learning_rate": float("inf")}, "config.train.learning_rate"),
        ({"sft__learning_rate": -5e-3}, "config.sft.learning_rate"),
    ],
)
def test_invalid_config_fails_before_any_compute_naming_the_field(tmp_path, overrides, field):
    from gd2po_jax.jobs.train import train_and_evaluate

    assert jax.device_count() == 8, "tests/conftest.py simulates 8 devices; the data axis spans them"
    with pytest.raises(ConfigError, match="^" + re.escape(field) + ":"):
        train_and_evaluate(as_run_config(tiny_config(**overrides)), tmp_path / "run", progress=False)
    run = tmp_path / "run"
    assert not run.exists() or list(run.iterdir()) == []  # no config.json, no tokenizer, no model


# ----------------------------------------------------------------------------------------------
# One run end to end.
# ----------------------------------------------------------------------------------------------


def test_run_writes_every_artifact(reference):
    workdir = reference
    records = read_metrics(workdir)
    assert [r["step"] for r in records] == list(range(1, tiny_config().train.num_steps + 1))
    keys = {
        "reward/correctness", "reward/format", "reward/length", "advantages/conflict_ratio",
        "advantages/kept_fraction", "advantages/query_weight_mean", "loss/clip_fraction", "loss/kl",
        "loss/entropy", "response_length", "truncation_rate", "tokens_per_second", "time/rollout",
        "time/rewards", "time/update", "reward_abstained/correctness", "reward_abstained/format",
        "reward_abstained/length", "reward_failed/correctness", "reward_failed/format", "reward_failed/length",
        "update/skipped_updates",
    }
    for record in records:
        assert keys <= set(record), keys - set(record)
        assert all(v is None or np.isfinite(v) for v in record.values() if isinstance(v, float))
        assert 0.0 <= record["advantages/kept_fraction"] <= 1.0
        assert 0.0 <= record["truncation_rate"] <= 1.0
        assert -3.0 <= record["reward/correctness"] <= 3.0
        # The tool-calling rewards never abstain: every rollout has every reward.
        assert all(record[f"reward_abstained/{n}"] == 0.0 for n in ("correctness", "format", "length"))
        assert all(record[f"reward_failed/{n}"] == 0.0 for n in ("correctness", "format", "length"))
        assert record["update/skipped_updates"] == 0
    # RL had something to learn from: the rewards varied within groups and the policy moved.
    assert max(r["advantages/abs_advantage_mean"] for r in records) > 0.1
    assert max(r["loss/grad_norm"] for r in records) > 0

    config = json.loads((workdir / "config.json").read_text())
    assert config["rl"]["algorithm"] == "gd2po_snr" and config["train"]["num_steps"] == tiny_config().train.num_steps
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [4, 6]  # every 2 steps, the last 2 kept
    results = json.loads((workdir / "results.json").read_text())
    for name in ("before_rl", "after_rl"):
        summary = json.loads((workdir / "eval" / f"{name}.json").read_text())
        assert summary["num_examples"] == tiny_config().eval.max_examples
        assert {"correct_acc", "format_acc", "length"} <= set(summary)
        assert results[name]["correct_acc"] == summary["correct_acc"]
        generations = (workdir / "eval" / f"{name}.jsonl").read_text().splitlines()
        assert len(generations) == tiny_config().eval.max_examples
    events = list((workdir / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 1000

    # The RL update compiled once (none at step 2 or later): jax logs each compilation.
    log = workdir.with_name(workdir.name + ".log").read_text()
    update_compiles = [line for line in log.splitlines() if "Compiling jit(step)" in line and "float32[8,4,3]" in line]
    assert len(update_compiles) == 1, update_compiles


def test_rollouts_of_the_logged_steps_are_saved_with_the_update_s_view(reference):
    """rollouts/step_N.jsonl of every step: P x G records each, whose rewards, lengths and GD2PO keep
    mask average to the step's metrics."""
    steps = range(1, tiny_config().train.num_steps + 1)
    assert sorted(p.name for p in (reference / "rollouts").iterdir()) == sorted(f"step_{s}.jsonl" for s in steps)
    metrics = {r["step"]: r for r in read_metrics(reference)}
    num_rollouts = tiny_config().train.prompts_per_step * tiny_config().rl.num_generations
    filtered = conflicts = 0
    for step in steps:
        records = run_dir.read_jsonl(reference / "rollouts" / f"step_{step}.jsonl")
        assert len(records) == num_rollouts and [r["rollout"] for r in records] == list(range(num_rollouts))
        assert {r["step"] for r in records} == {step}
        assert all(r["completion"] and r["prompt"] and isinstance(r["row"], int) for r in records)
        assert np.mean([r["keep"] for r in records]) == pytest.approx(metrics[step]["advantages/kept_fraction"],
                                                                       abs=1e-6)
        assert np.mean([r["conflict"] for r in records]) == pytest.approx(
            metrics[step]["advantages/conflict_ratio"], abs=1e-6)
        assert np.mean([r["response_length"] for r in records]) == pytest.approx(metrics[step]["response_length"])
        assert np.mean([r["truncated"] for r in records]) == pytest.approx(metrics[step]["truncation_rate"])
        for name in ("correctness", "format", "length"):
            assert np.mean([r["rewards"][name] for r in records]) == pytest.approx(metrics[step][f"reward/{name}"],
                                                                                    rel=1e-5, abs=1e-6)
        filtered += sum(not r["keep"] for r in records)
        tau = tiny_config().rl.snr_tau  # GD2PO-SNR: a rollout is dropped exactly when it conflicts with |SNR| < tau
        assert not any(r["keep"] and r["conflict"] and abs(r["snr"]) < tau for r in records if r["snr"] is not None)
        conflicts += sum(r["conflict"] for r in records)
    # Whether any rollout conflicted, or fell under tau, depends on the samples (none did with the
    # per-row keys of 5859516); the dropped ones are those the metrics count, step by step.
    assert filtered == round(sum((1 - metrics[s]["advantages/kept_fraction"]) * num_rollouts for s in steps))
    assert conflicts == round(sum(metrics[s]["advantages/conflict_ratio"] * num_rollouts for s in steps))


def test_wandb_gets_the_config_and_every_metrics_record(reference):
    calls = run_dir.read_jsonl(reference.parent / "wandb_calls.jsonl")
    init, *logs, finish = calls
    assert init["call"] == "init" and finish == {"call": "finish", "exit_code": 0}
    assert init["id"] == (reference / "wandb_run_id.txt").read_text().strip() and init["resume"] == "allow"
    assert (init["dir"], init["name"], init["mode"]) == (str(reference), "run", "offline")
    assert init["config"] == json.loads((reference / "config.json").read_text())
    assert [(c["call"], c["step"], c["data"]) for c in logs] == [
        ("log", r["step"], {k: v for k, v in r.items() if k != "step"}) for r in read_metrics(reference)]


def test_exported_policy_loads_in_jax_and_transformers(reference):
    import torch
    from transformers import AutoModelForCausalLM

    from gd2po_jax.models import load_pretrained

    ours = load_pretrained(reference / "policy")
    theirs = AutoModelForCausalLM.from_pretrained(reference / "policy").eval()
    ids = np.array([[5, 17, 42, 99, 3, 250, 7, 8]], np.int64)
    with torch.no_grad():
        expected = theirs(input_ids=torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours(ids)), expected, atol=2e-4, rtol=1e-4)
    # It is the trained policy, not the warm start.
    from safetensors.numpy import load_file

    before = load_file(reference / "warm_start" / "model.safetensors")
    after = policy_tensors(reference)
    assert max(np.abs(after[k] - before[k]).max() for k in after) > 1e-4


# ----------------------------------------------------------------------------------------------
# Kill and resume.
# ----------------------------------------------------------------------------------------------


def kill_twice_then_finish(workdir, config_file, train_env) -> list[str]:
    """Run train.py in ``workdir`` killed with SIGKILL twice, then to the end; returns the checkpoint
    entries seen at the first kill."""
    checkpoints = workdir / "checkpoints"

    def entries() -> list[str]:
        return sorted(p.name for p in checkpoints.iterdir()) if checkpoints.is_dir() else []

    # 1. Killed the moment the first checkpoint starts to appear on disk: inside the save.
    assert run_train(workdir, config_file, train_env, kill_when=lambda: bool(entries()))
    seen_first = entries()
    # 2. Resumed, and killed after a step that follows a complete checkpoint (its metrics line
    #    is already in metrics.jsonl; its update is not in any checkpoint).
    def past_a_checkpoint() -> bool:
        done = [int(n) for n in entries() if n.isdigit()]
        lines = (workdir / "metrics.jsonl").read_text().count("\n") if (workdir / "metrics.jsonl").exists() else 0
        return bool(done) and lines > max(done) and max(done) >= 2

    assert run_train(workdir, config_file, train_env, kill_when=past_a_checkpoint)
    # 3. Resumed to the end.
    assert not run_train(workdir, config_file, train_env)
    return seen_first


@pytest.mark.slow
def test_killed_and_resumed_run_equals_the_uninterrupted_one(reference, tmp_path, train_env):
    workdir = tmp_path / "run"
    copy_warm_start(reference, workdir)
    seen_first = kill_twice_then_finish(workdir, write_config_file(tmp_path), train_env)

    # Bit-identical: both runs are on this machine with the same XLA build, so the same programs
    # run on the same inputs. (Across CPU types XLA:CPU code differs; this test never compares that.)
    assert stable_metrics(workdir) == stable_metrics(reference), f"first kill saw {seen_first}"
    expected, got = policy_tensors(reference), policy_tensors(workdir)
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    for name in ("before_rl", "after_rl"):
        assert json.loads((workdir / "eval" / f"{name}.json").read_text()) == \
            json.loads((reference / "eval" / f"{name}.json").read_text())
    assert_tensorboard_shows_the_metrics(workdir)


# ----------------------------------------------------------------------------------------------
# LoRA (model.lora): adapters trained on the reference's warm start, exported both ways.
# ----------------------------------------------------------------------------------------------

LORA_CHANGES = dict(model__lora__rank=8, model__lora__alpha=16, train__num_steps=4, checkpoint__every_steps=1,
                    rl__kl_coef=0.01,  # the KL reference: the base without adapters
                    eval__split="none")


@pytest.fixture(scope="module")
def lora_reference(reference, tmp_path_factory, train_env) -> pathlib.Path:
    """The workdir of one uninterrupted tiny LoRA run (rank 8, alpha 16) on the reference's warm start."""
    root = tmp_path_factory.mktemp("lora")
    workdir = root / "run"
    copy_warm_start(reference, workdir)
    run_train(workdir, write_config_file(root, **LORA_CHANGES), train_env)
    return workdir


def adapter_tensors(workdir: pathlib.Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(workdir / "policy_adapter" / "adapter_model.safetensors")


@pytest.mark.slow
def test_a_lora_run_exports_an_adapter_that_peft_loads_on_its_base(lora_reference):
    """policy_adapter/ on its base in transformers + peft computes the merged policy/ (< 1e-4 in
    float32); training moved it away from the base; the checkpoints hold only the adapters."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = json.loads((lora_reference / "policy_adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (8, 16)
    assert pathlib.Path(config["base_model_name_or_path"]) == (lora_reference / "warm_start").absolute()
    ids = torch.tensor([[5, 17, 42, 99, 3, 250, 7, 8]])
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"]).eval()
        base_logits = base(input_ids=ids).logits.numpy()
        adapted = PeftModel.from_pretrained(base, lora_reference / "policy_adapter").eval()
        peft_logits = adapted(input_ids=ids).logits.numpy()
        merged = AutoModelForCausalLM.from_pretrained(lora_reference / "policy").eval()
        merged_logits = merged(input_ids=ids).logits.numpy()
    assert np.abs(peft_logits - merged_logits).max() < 1e-4
    assert np.abs(peft_logits - base_logits).max() > 1e-2  # trained
    # The KL to the reference (the base): nothing at step 1 (the policy is the base), then it grows.
    kl = [r["loss/kl"] for r in read_metrics(lora_reference)]
    assert abs(kl[0]) < 1e-6 and kl[-1] > 1e-6, kl
    # The checkpoints hold the adapters and their optimizer state, and reference the base.
    from gd2po_jax.models.lora import LORA_BASE_KEY
    from gd2po_jax.runtime.checkpoints import Checkpoints

    with Checkpoints(lora_reference / "checkpoints", create=False) as checkpoints:
        meta = checkpoints.metadata(None)
        names = json.loads((checkpoints.step_dir(4) / "meta" / "metadata").read_text())["checksums"]
    assert meta[LORA_BASE_KEY]["path"] == config["base_model_name_or_path"]
    params = [n for n in names if n.startswith("params/")]
    assert params and all("_lora/lora_" in n for n in params)
    assert not any("embed" in n for n in names)


@pytest.mark.slow
def test_a_lora_runs_checkpoint_exports_and_its_adapter_evaluates_as_the_merged_policy(lora_reference, tmp_path):
    """export.py merges the last checkpoint's adapters into the base it references: policy/, bit for
    bit; eval.py --model_path=RUN/policy_adapter loads the adapter on its base, which computes policy/."""
    from gd2po_jax.cli.export import export_checkpoint
    from gd2po_jax.evaluation.policy import policy_from_model_path
    from gd2po_jax.models import load_pretrained

    exported = export_checkpoint(lora_reference, tmp_path / "out")
    assert exported.step == 4
    from safetensors.numpy import load_file

    expected, got = policy_tensors(lora_reference), load_file(tmp_path / "out" / "model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    policy = policy_from_model_path(str(lora_reference / "policy_adapter"), "float32")
    assert policy.source["base_model"] == str((lora_reference / "warm_start").absolute())
    assert policy.model.lora is not None and policy.tokenizer is not None
    ids = np.array([[5, 17, 42, 99, 3, 250, 7, 8]], np.int32)
    merged = load_pretrained(lora_reference / "policy")
    np.testing.assert_allclose(np.asarray(policy.model(ids)), np.asarray(merged(ids)), rtol=0, atol=1e-4)


@pytest.mark.slow
def test_killed_and_resumed_lora_run_equals_the_uninterrupted_one(lora_reference, tmp_path, train_env):
    """kill -9 inside a checkpoint's save, then after a step past one: the resumed LoRA run's metrics,
    adapter and merged policy are bit-identical to the uninterrupted run's."""
    workdir = tmp_path / "run"
    copy_warm_start(lora_reference, workdir)
    kill_twice_then_finish(workdir, write_config_file(tmp_path, **LORA_CHANGES), train_env)
    assert stable_metrics(workdir) == stable_metrics(lora_reference)
    for tensors in (adapter_tensors, policy_tensors):
        expected, got = tensors(lora_reference), tensors(workdir)
        assert expected.keys() == got.keys()
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_a_lora_checkpoint_resumes_only_on_its_base(tmp_path):
    """check_base: another base's checksum, or LoRA switched on or off, is refused naming both."""
    from gd2po_jax.models.lora import LORA_BASE_KEY, check_base

    saved = {LORA_BASE_KEY: {"path": "/runs/a/warm_start", "checksum": 17}}
    check_base(saved, {"path": "/elsewhere", "checksum": 17}, tmp_path)  # a moved base is the same base
    with pytest.raises(ConfigError, match="/runs/a/warm_start.*checksum 17.*/runs/b.*checksum 18"):
        check_base(saved, {"path": "/runs/b", "checksum": 18}, tmp_path)
    with pytest.raises(ConfigError, match="config.model.lora.rank.*with LoRA"):
        check_base(saved, None, tmp_path)
    with pytest.raises(ConfigError, match="config.model.lora.rank.*without LoRA"):
        check_base({}, {"path": "/runs/b", "checksum": 18}, tmp_path)
    check_base({}, None, tmp_path)  # full fine-tuning


def assert_tensorboard_shows_the_metrics(workdir: pathlib.Path) -> None:
    """TensorBoard has each step of metrics.jsonl once, with its values (float32 there)."""
    records = read_metrics(workdir)
    scalars = tensorboard_scalars(workdir / "tensorboard")
    for name in ("reward/correctness", "advantages/kept_fraction", "loss/grad_norm"):
        assert scalars[name] == [(r["step"], float(np.float32(r[name]))) for r in records], name


# ----------------------------------------------------------------------------------------------
# Run integrity: one process per workdir, one config per run, a damaged checkpoint.
# ----------------------------------------------------------------------------------------------


def test_a_second_process_on_a_busy_workdir_stops_at_once(tmp_path):
    from gd2po_jax.jobs.train import train_and_evaluate

    with run_dir.lock_workdir(tmp_path / "run", "train.py"):
        with pytest.raises(run_dir.WorkdirBusyError, match=rf"{tmp_path / 'run'} is in use by train.py \(pid "):
            train_and_evaluate(as_run_config(tiny_config()), tmp_path / "run", progress=False)
        assert os.listdir(tmp_path / "run") == [".lock"]  # nothing else written


def test_a_rerun_with_other_settings_is_refused_naming_them(reference):
    from gd2po_jax.jobs.train import train_and_evaluate

    before = (reference / "config.json").read_text()
    with pytest.raises(ConfigError, match=r"^config\.rl\.algorithm \(was 'gd2po_snr', now 'grpo'\), "
                                          r"config\.train\.seed \(was 0, now 1\): the run in "):
        train_and_evaluate(as_run_config(tiny_config(rl__algorithm="grpo", train__seed=1)), reference, progress=False)
    with pytest.raises(ConfigError, match=r"^config\.train\.num_steps: 4 is below step 6"):
        train_and_evaluate(as_run_config(tiny_config(train__num_steps=4)), reference, progress=False)
    assert (reference / "config.json").read_text() == before
    assert not (reference / ".lock").exists()


@pytest.mark.slow
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(reference, tmp_path, train_env):
    """The latest checkpoint of a finished run cut short: the rerun warns, resumes from the one
    before, and ends as the reference did. Resuming does not read the warm start (damaged too)."""
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    for file in (workdir / "checkpoints" / "6" / "state").glob("**/d/*"):
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    warm_start = workdir / "warm_start" / "model.safetensors"
    warm_start.write_bytes(warm_start.read_bytes()[:1000])
    run_train(workdir, write_config_file(tmp_path), train_env)

    log = workdir.with_name(workdir.name + ".log").read_text()
    assert f"checkpoint {workdir / 'checkpoints' / '6'} cannot be read" in log and "resumed from step 4" in log
    assert [p.name.split("-")[0] for p in (workdir / "corrupt_checkpoints").iterdir()] == ["6"]
    assert stable_metrics(workdir) == stable_metrics(reference)
    expected, got = policy_tensors(reference), policy_tensors(workdir)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert_tensorboard_shows_the_metrics(workdir)


@pytest.mark.slow
def test_length_buckets_train_as_the_padded_update(reference, tmp_path, train_env):
    """rl.length_bucket through the trainer: the reference's first step (same warm start, same
    rollouts) on micro-batches of 8 that cut their left padding gives the same metrics within float
    tolerance, on fewer padded slots. (Buckets of 32: a few prompt windows, each a branch of the
    update to compile; 8's were many more.)"""
    workdir = tmp_path / "run"
    copy_warm_start(reference, workdir)
    config_file = write_config_file(tmp_path, rl__length_bucket=32, rl__micro_batch_size=8, train__num_steps=1,
                                    eval__split="none", checkpoint__every_steps=100)
    run_train(workdir, config_file, train_env)
    (got,), expected = stable_metrics(workdir), stable_metrics(reference)[0]
    assert got.keys() == expected.keys()
    for name in ("generated_tokens", "reward/correctness", "reward/format", "truncation_rate", "response_length"):
        assert got[name] == expected[name], name
    for name in ("loss/loss", "loss/pg_loss", "loss/entropy", "loss/grad_norm", "loss/ratio_mean"):
        assert got[name] == pytest.approx(expected[name], rel=1e-4, abs=1e-6), name
    assert got["update/prompt_padding"] < expected["update/prompt_padding"]
    assert got["update/padding"] < expected["update/padding"]


# ----------------------------------------------------------------------------------------------
# Sharding.
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fsdp_mesh_run_matches_the_data_parallel_run(reference, tmp_path, train_env):
    """The reference spans the subprocesses' 2 devices with data=2; the same run on data=1 x fsdp=2
    (parameters and optimizer state split 2 ways) gives the same metrics and parameters within float
    tolerance."""
    # Two steps: a float difference of ~1e-6 can flip a near-tied sampled token from step 2 on,
    # after which the two runs legitimately sample different rollouts.
    steps = 2
    workdir = tmp_path / "run"
    copy_warm_start(reference, workdir)
    config_file = write_config_file(tmp_path, mesh__data=1, mesh__fsdp=2, train__num_steps=steps,
                                    eval__split="none", checkpoint__every_steps=100)
    run_train(workdir, config_file, train_env)
    got, expected = stable_metrics(workdir), stable_metrics(reference)[:steps]
    assert len(got) == steps
    for mine, theirs in zip(got, expected):
        assert mine.keys() == theirs.keys()
        for name, value in theirs.items():
            if isinstance(value, (int, float)) and value is not None:
                # Step 1 agrees to ~1e-6; Adam then amplifies reassociation differences of gradient
                # entries near its epsilon, so later steps agree to ~1e-3 relative.
                assert mine[name] == pytest.approx(value, rel=1e-2, abs=1e-3), (mine["step"], name)
        # Step 1 samples from the same parameters: the same tokens, so the discrete outcomes agree
        # exactly. Later, a parameter difference of ~1e-6 can flip a token whose two best choices are
        # that close, so they agree within the float tolerance above.
        if mine["step"] == 1:
            for name in ("generated_tokens", "reward/correctness", "reward/format", "truncation_rate"):
                assert mine[name] == theirs[name], (mine["step"], name)


def test_a_resume_whose_training_data_changed_is_refused_naming_the_file(tmp_path, monkeypatch, caplog):
    """Issue 63 finding 11: a resumed run whose data file changed continued without a word."""
    import jax.numpy as jnp

    from configs import toolrl
    from gd2po_jax.jobs.train import check_data_files, data_files
    from gd2po_jax.runtime.checkpoints import Checkpoints
    from tests.fakes import as_run_config

    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"prompt": "row {i}", "ground_truth": "[]"}}\n' for i in range(32)))
    config = toolrl.get_config("qwen2.5-1.5b")
    config.data.train = str(data)
    config = as_run_config(config)
    recorded = data_files(config)
    assert list(recorded) == ["data.train"] and recorded["data.train"]["size"] == data.stat().st_size
    with Checkpoints(tmp_path / "checkpoints") as checkpoints:
        checkpoints.save(1, {"x": jnp.ones(2)}, {"step": 1, "data_files": recorded})
        check_data_files(config, checkpoints)  # unchanged: resumes
        data.write_text(data.read_text())  # rewritten (a new mtime), same bytes: resumes
        check_data_files(config, checkpoints)
        data.write_text(data.read_text().replace("row 7", "row 8"))  # same size, other rows
        with pytest.raises(ConfigError, match=rf"^config\.data\.train={data}: the training data changed since "
                                              rf"checkpoint .*checkpoints/1 was saved \(its content differs\); .*"
                                              r"GD2PO_ALLOW_CHANGED_DATA=1 to resume anyway$"):
            check_data_files(config, checkpoints)
        data.write_text(data.read_text() + '{"prompt": "one more", "ground_truth": "[]"}\n')
        with pytest.raises(ConfigError, match=r"\(\d+ -> \d+ bytes\)"):
            check_data_files(config, checkpoints)
        monkeypatch.setenv("GD2PO_ALLOW_CHANGED_DATA", "1")  # the documented override
        check_data_files(config, checkpoints)
    assert "GD2PO_ALLOW_CHANGED_DATA is set: resuming" in caplog.text


def test_a_reward_that_always_abstains_is_warned_about_once(caplog):
    """Issue 63 finding 11: a reward that abstained on every rollout was logged as 0.0 with no warning."""
    from gd2po_jax.jobs.train import warn_always_abstaining

    warned: set[str] = set()
    assert warn_always_abstaining(("judge", "length"), [1.0, 0.25], 3, warned) == ["judge"]
    assert "step 3: reward 'judge' abstained on every rollout" in caplog.text and "'length'" not in caplog.text
    assert warn_always_abstaining(("judge", "length"), [1.0, 1.0], 4, warned) == ["length"]  # judge: once
    assert warn_always_abstaining(("judge", "length"), [1.0, 1.0], 5, warned) == [] and warned == {"judge", "length"}
