"""gd2po_jax/run_dir.py: the workdir layout, atomic writes, config.json, and Orbax checkpoints."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from configs.default import get_config as default_config
from gd2po_jax import run_dir
from gd2po_jax.config import ConfigError, as_run_config
from gd2po_jax.run_dir import Checkpoints, RunDir, RunDirError
from gd2po_jax.train_step import TrainState

# ----------------------------------------------------------------------------------------------
# Files.
# ----------------------------------------------------------------------------------------------


def test_layout_names_every_file_of_a_workdir(tmp_path):
    files = RunDir(str(tmp_path))
    assert files.config == tmp_path / "config.json" and files.results == tmp_path / "results.json"
    assert files.eval_report("test") == tmp_path / "eval" / "test.json"
    assert files.eval_generations("after_rl") == tmp_path / "eval" / "after_rl.jsonl"
    assert [p.name for p in (files.base_model, files.warm_start, files.warm_start_logs, files.checkpoints,
                             files.metrics, files.tensorboard, files.policy)] == [
        "base_model", "warm_start", "warm_start_logs", "checkpoints", "metrics.jsonl", "tensorboard", "policy"]


def test_atomic_write_replaces_the_file_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "results.json"
    run_dir.write_json(path, {"b": 1, "a": [1.5, None]})
    run_dir.write_json(path, {"b": 2})
    assert run_dir.read_json(path) == {"b": 2}
    assert path.read_text() == '{\n  "b": 2\n}'
    assert os.listdir(tmp_path) == ["results.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    run_dir.write_text(path, "old")

    def killed(src, dst):
        raise KeyboardInterrupt("killed before the rename")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        run_dir.write_text(path, "new")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["config.json"]


def test_unreadable_files_are_named(tmp_path):
    with pytest.raises(RunDirError, match=f"{tmp_path / 'missing.json'}: cannot read it"):
        run_dir.read_json(tmp_path / "missing.json")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n\n{"step": 2\n')
    with pytest.raises(RunDirError, match=r"metrics\.jsonl, line 3: not JSON"):
        run_dir.read_jsonl(tmp_path / "metrics.jsonl")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n\n{"step": 2}\n')
    assert run_dir.read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1}, {"step": 2}]


# ----------------------------------------------------------------------------------------------
# config.json
# ----------------------------------------------------------------------------------------------


def test_config_round_trips_through_config_json(tmp_path):
    config = default_config()
    run_dir.write_config(tmp_path, config)
    again = run_dir.read_config(tmp_path)
    assert again == as_run_config(config)
    assert again.rl.snr_tau == 0.8 and again.rewards.names == ("correctness", "format", "length")
    assert (tmp_path / "config.json").read_text() == config.to_json_best_effort(indent=2, sort_keys=True)
    assert os.listdir(tmp_path) == ["config.json"]


def test_an_older_config_json_reads_with_the_values_its_run_used(tmp_path):
    old = json.loads(run_dir.config_json(default_config()))
    del old["sft"]["seed"], old["sft"]["cache_dir"], old["sampling"]["prompts_per_call"]
    del old["data"]["synthetic"]["habit_fraction"], old["data"]["synthetic"]["habit_rate"]
    old["sft"]["num_steps"] = 300
    (tmp_path / "config.json").write_text(json.dumps(old))
    config = run_dir.read_config(tmp_path)
    assert (config.sft.seed, config.sft.cache_dir, config.sampling.prompts_per_call) == (0, "", 0)
    assert config.sft.num_steps == 300  # recorded values are kept
    task = config.data.synthetic.task_config()
    assert (task.habit_fraction, task.habit_rate) == (0.0, 1.0)  # no habit before habits existed


def test_a_config_json_that_is_not_a_run_config_is_named(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(RunDirError, match="config.json: not a config"):
        run_dir.read_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"rl": {"algorithm": "gdpo"}}))
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'config.json'}: config\.\w+ is missing"):
        run_dir.read_config(tmp_path)


def test_config_changes_name_the_fields_that_differ():
    before = {"rl": {"snr_tau": 0.8, "algorithm": "gdpo"}, "train": {"seed": 0}}
    assert run_dir.config_changes(before, before) == ""
    after = {"rl": {"snr_tau": 0.5, "algorithm": "gdpo"}, "train": {"seed": 0, "steps": 3}}
    assert run_dir.config_changes(before, after) == "rl.snr_tau (was 0.8, now 0.5), train.steps (was None, now 3)"
    many = {"x": {str(i): i for i in range(8)}}
    assert run_dir.config_changes({}, many, limit=2).endswith("x.1 (was None, now 1) and 6 more")


# ----------------------------------------------------------------------------------------------
# Checkpoints.
# ----------------------------------------------------------------------------------------------


def small_state(scale: float) -> TrainState:
    params = {"embed": jnp.arange(12.0).reshape(4, 3) * scale, "bias": jnp.full((3,), scale)}
    return TrainState(params, optax.adam(1e-3).init(params), jnp.asarray(int(scale), jnp.int32),
                      jax.random.PRNGKey(int(scale)))


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_save_and_restore_round_trip_with_metadata_and_pruning(tmp_path):
    with Checkpoints(tmp_path / "checkpoints", keep=2) as checkpoints:
        assert checkpoints.steps() == [] and checkpoints.latest_step() is None
        for step in (1, 2, 3):
            metadata = {"step": step, "data": {"epoch": step, "order": [2, 0, 1]}}
            checkpoints.save(step, small_state(float(step)), metadata)
        assert checkpoints.steps() == [2, 3] and checkpoints.latest_step() == 3  # keep=2: step 1 pruned
    # A new manager (a resumed process) sees the same checkpoints.
    with Checkpoints(tmp_path / "checkpoints", keep=2) as checkpoints:
        state, meta = checkpoints.restore(None, small_state(0.0))
        assert_trees_equal(state, small_state(3.0))
        assert meta == {"step": 3, "data": {"epoch": 3, "order": [2, 0, 1]}}
        state, meta = checkpoints.restore(2, small_state(0.0))
        assert_trees_equal(state, small_state(2.0)) and meta["step"] == 2
        with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 1 .*available: \[2, 3\]"):
            checkpoints.restore(1, small_state(0.0))


def test_params_only_restore_onto_a_sharded_target(tmp_path):
    with Checkpoints(tmp_path / "checkpoints") as checkpoints:
        checkpoints.save(5, small_state(5.0), {"step": 5})
    devices = jax.devices()[:4] if len(jax.devices()) >= 4 else jax.devices()[:1]
    mesh = Mesh(np.array(devices), ("fsdp",))
    target = {"embed": jax.ShapeDtypeStruct((4, 3), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("fsdp"))),
              "bias": jax.ShapeDtypeStruct((3,), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))}
    reader = Checkpoints(tmp_path / "checkpoints", create=False)
    params = reader.restore_params(None, target)
    reader.close()
    assert sorted(params) == ["bias", "embed"]  # no optimizer state, step or key
    assert_trees_equal(params, small_state(5.0).params)
    assert params["embed"].sharding == target["embed"].sharding  # rows split over the mesh
    assert params["embed"].addressable_shards[0].data.shape == (4 // len(devices), 3)


def test_a_read_only_manager_of_a_missing_directory_has_no_steps_and_creates_nothing(tmp_path):
    checkpoints = Checkpoints(tmp_path / "checkpoints", create=False)
    assert checkpoints.steps() == [] and checkpoints.latest_step() is None
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        checkpoints.restore_params(None, {})
    checkpoints.close()
    assert not (tmp_path / "checkpoints").exists()
