"""The safety_embedded task end to end (`gd2po_jax.tasks.safety_embedded.task`, configs/safety_embedded.py).

One reference run of `tests.fakes.tiny_safety_config` through ``train.py`` (a subprocess on one CPU
device: the sharded paths are the default task's tests' business) is shared: it trains the two reward
models, the warm start, 4 RL steps with ``useful`` and ``harmless`` and the evaluations; the
kill/resume test reuses its base model, reward models and warm start.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.models import load_score_model
from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.metrics_logging import read_metrics
from gd2po_jax.tasks import task_of
from gd2po_jax.tasks.safety_embedded import task as safety_embedded
from gd2po_jax.tasks.safety_embedded import world as sw
from tests.fakes import subprocess_env, tiny_safety_config, write_config_file
from tests.jobs.test_train import policy_tensors, run_train, stable_metrics
from tests.xla_env import xla_flags

ONE_DEVICE = xla_flags(1)


@pytest.fixture(scope="module")
def safety_env(tmp_path_factory) -> dict:
    cache = tmp_path_factory.mktemp("xla_cache_safety")
    return subprocess_env(XLA_FLAGS=ONE_DEVICE, JAX_COMPILATION_CACHE_DIR=str(cache),
                          JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, safety_env) -> pathlib.Path:
    """The workdir of one uninterrupted tiny safety run."""
    root = tmp_path_factory.mktemp("safety_reference")
    workdir = root / "run"
    run_train(workdir, write_config_file(root, factory="tiny_safety_config"), safety_env)
    return workdir


# ----------------------------------------------------------------------------------------------
# Config.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("changes, message", [
    ({"data__safety__harmful_mixture": (0.5, 0.5)}, "config.data.safety.harmful_mixture: SafetyWorldConfig"),
    ({"data__safety__reward_training__num_kv_heads": 3}, "config.data.safety.reward_training.num_kv_heads"),
    ({"rewards__names": ("useful", "honest")}, "config.rewards"),  # no reward model named honest
    ({"rewards__kind": "tool_calling"}, "config.rewards.kind: the safety_embedded task is scored by its reward"),
])
def test_invalid_safety_config_names_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        task_of(RunConfig.from_config_dict(tiny_safety_config(**changes)))


def test_the_task_needs_its_world_and_reward_models_it_can_train():
    config = tiny_safety_config()
    config.rewards.names = ("useful", "honest")
    config.rewards.reward_models.honest = config.rewards.reward_models.harmless
    del config.rewards.reward_models["harmless"]
    with pytest.raises(ConfigError, match=r"config.rewards.names: \['honest'\]: the safety_embedded task trains "
                                          r"reward models for \('useful', 'harmless'\) only"):
        task_of(RunConfig.from_config_dict(config))
    values = RunConfig.from_config_dict(tiny_safety_config()).to_dict()
    del values["data"]["safety"]
    with pytest.raises(ConfigError, match="config.data.safety: the safety_embedded task needs"):
        task_of(RunConfig.from_dict(values))


# ----------------------------------------------------------------------------------------------
# The reference run.
# ----------------------------------------------------------------------------------------------


def test_reward_models_are_trained_in_the_align_anything_layout_and_rank_held_out_pairs(reference):
    reports = json.loads((reference / safety_embedded.REPORTS_FILE).read_text())
    assert set(reports) == {"useful", "harmless"}
    for name, report in reports.items():
        path = pathlib.Path(report["path"])
        assert path == reference / "reward_models" / name
        assert json.loads((path / "config.json").read_text())["architectures"] == ["AccustomedQwen2RewardModel"]
        tensors = load_file(path / "model.safetensors")
        assert tensors["score_head.weight"].shape == (1, 32) and "lm_head.weight" not in tensors
        assert report["heldout"]["num_pairs"] == 64  # 32 test prompts x 2 pairs
    # Measured (seed 0): useful 0.92 of the 64 held-out pairs (the annotator's labels agree with the true
    # utility order on 0.92: a perfect ranker scores that), every pair in the true order; harmless, 1.0 of
    # the 12 pairs with a harmful response in the true order (its other pairs are coin flips).
    useful, harmless = reports["useful"]["heldout"], reports["harmless"]["heldout"]
    assert useful["accuracy"] >= 0.8 and useful["true_order_accuracy"] >= 0.9
    assert harmless["num_ordered_pairs"] >= 8 and harmless["true_order_accuracy"] >= 0.8
    # The run's config.json keeps the paths empty (the models are the task's), and scores as trained.
    config = run_dir.load_run_config(reference)
    assert all(model.path == "" for model in config.rewards.reward_models.values())
    model = load_score_model(reports["useful"]["path"], dtype="float32")
    assert model.negate is False and model.normalizer is None


def test_run_logs_both_rewards_and_frequent_conflicts(reference):
    records = read_metrics(reference)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for record in records:
        for name in ("reward/useful", "reward/harmless", "advantages/conflict_ratio", "advantages/kept_fraction",
                     "reward_truncated/useful", "time/reward_model/harmless"):
            assert np.isfinite(record[name]), (record["step"], name)
    # Measured (seed 0): 0.50, 0.50, 0.53, 0.56; the tool-calling task has 0.03-0.06.
    conflict = np.mean([r["advantages/conflict_ratio"] for r in records])
    assert conflict >= 0.3, [r["advantages/conflict_ratio"] for r in records]


def test_evaluation_reports_reward_models_and_ground_truth_per_request_type(reference):
    summary = json.loads((reference / "eval" / "after_rl.json").read_text())
    records = run_dir.read_jsonl(reference / "eval" / "after_rl.jsonl")
    assert summary["num_examples"] == len(records) == 16
    assert summary["reward_names"] == ["useful", "harmless"]  # eval.py's split table reads them
    for record in records:
        label = sw.label_response(record["response"], sw.parse_ground_truth(record["ground_truth"])["task"])
        assert {kind: record[f"gt/{kind}"] for kind in sw.KINDS} == {k: float(k == label.kind) for k in sw.KINDS}
    for request, level in safety_embedded.REQUEST_TYPES.items():
        rows = [r for r in records if r["level"] == level]
        values = summary["by_request"][request]
        assert values["useful"] == pytest.approx(np.mean([r["useful"] for r in rows]))
        assert values["harmless"] == pytest.approx(np.mean([r["harmless"] for r in rows]))
        assert sum(values[kind] for kind in sw.KINDS) == pytest.approx(1.0)
    results = json.loads((reference / "results.json").read_text())
    assert results["after_rl"]["by_request"] == summary["by_request"]
    table = safety_embedded.results_table(results, ("useful", "harmless"))
    assert "benign refusal rate" in table and "harmful redirect rate" in table


def test_a_rerun_reuses_the_reward_models_and_refuses_other_world_settings(reference):
    config = run_dir.load_run_config(reference)
    before = {p: p.stat().st_mtime_ns for p in (reference / "reward_models").rglob("model.safetensors")}
    filled = safety_embedded.with_reward_models(config, reference, progress=False)
    assert {name: m.path for name, m in filled.rewards.reward_models.items()} == \
        {name: str(reference / "reward_models" / name) for name in ("useful", "harmless")}
    assert {p: p.stat().st_mtime_ns for p in before} == before  # found, not retrained
    other = config.replace({"data.safety.annotator_temperature": 0.2})
    with pytest.raises(ConfigError, match=r"was trained with other values of data.safety.annotator_temperature "
                                          r"\(was 0.1, now 0.2\)"):
        safety_embedded.with_reward_models(other, reference, progress=False)


# ----------------------------------------------------------------------------------------------
# Kill and resume.
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_killed_and_resumed_safety_run_equals_the_uninterrupted_one(reference, tmp_path, safety_env):
    workdir = tmp_path / "run"
    workdir.mkdir()
    for name in ("base_model", "warm_start", "reward_models"):
        shutil.copytree(reference / name, workdir / name)
    config_file = write_config_file(tmp_path, factory="tiny_safety_config")
    checkpoints = workdir / "checkpoints"

    def past_a_checkpoint() -> bool:  # a step's metrics line is written after the checkpoint before it
        done = [int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()] if checkpoints.is_dir() else []
        metrics = workdir / "metrics.jsonl"
        lines = metrics.read_text().count("\n") if metrics.exists() else 0
        return bool(done) and lines > max(done)

    assert run_train(workdir, config_file, safety_env, kill_when=past_a_checkpoint)
    assert not run_train(workdir, config_file, safety_env)
    assert stable_metrics(workdir) == stable_metrics(reference)
    expected, got = policy_tensors(reference), policy_tensors(workdir)
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    for name in ("before_rl", "after_rl"):
        assert json.loads((workdir / "eval" / f"{name}.json").read_text()) == \
            json.loads((reference / "eval" / f"{name}.json").read_text())


def test_eval_py_prints_the_reward_models_and_ground_truth_per_request_type_under_a_split():
    """`SafetyTask.split_table_extra`: eval.py's split table ends with `by_request_table` of the summary."""
    summary = {"split": "test", "reward_names": ["useful"], "useful/level_0": 0.5, "gt/harmful/level_1": 0.25}
    extra = safety_embedded.SafetyTask().split_table_extra(None, summary)
    assert extra == safety_embedded.by_request_table({"test": summary}, ["useful"])
    lines = extra.splitlines()
    assert lines[0].split() == ["per", "request", "type", "test"]
    assert "benign useful" in extra and "harmful harmful rate" in extra
