"""gd2po_jax/run_dir.py: the workdir layout, atomic writes, config.json, and Orbax checkpoints."""

from __future__ import annotations

import json
import os
import shutil

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


def files_in(directory) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def damage(checkpoint_dir, how: str) -> None:
    """Damage a checkpoint of `small_state`: truncate its largest array data file, or replace its
    arrays by others of the same shapes (what a flipped bit does to a value: the data reads, but
    is not what was saved; Orbax compresses small arrays, so flipping a bit on disk is not reliable)."""
    if how == "truncate":  # every data file of the arrays (OCDBT keeps small arrays in its b-tree nodes)
        for file in (checkpoint_dir / "state").glob("**/d/*"):
            file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
        return
    other = checkpoint_dir.parent.parent / "other"
    with Checkpoints(other) as checkpoints:
        checkpoints.save(1, small_state(7.25), {"step": 1})
    shutil.rmtree(checkpoint_dir / "state")
    shutil.copytree(other / "1" / "state", checkpoint_dir / "state")


@pytest.mark.parametrize("how", ["truncate", "other data"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, how, caplog):
    with Checkpoints(tmp_path / "checkpoints", keep=3) as checkpoints:
        for step in (1, 2):
            checkpoints.save(step, small_state(float(step) + 0.5), {"step": step})
    damage(tmp_path / "checkpoints" / "2", how)
    with Checkpoints(tmp_path / "checkpoints", keep=3) as checkpoints:
        with pytest.raises(run_dir.CorruptCheckpointError, match=f"checkpoint {tmp_path / 'checkpoints' / '2'} "):
            checkpoints.restore(2, small_state(0.0))
        step, state, meta = checkpoints.restore_intact(small_state(0.0))
        assert step == 1 and meta == {"step": 1}
        assert_trees_equal(state, small_state(1.5))
        assert checkpoints.steps() == [1]  # the damaged one is set aside, so step 2 can be saved again
        checkpoints.save(2, small_state(2.5), {"step": 2})
    assert f"checkpoint {tmp_path / 'checkpoints' / '2'}" in caplog.text
    [aside] = (tmp_path / "corrupt_checkpoints").iterdir()
    assert aside.name.startswith("2-")


def test_without_an_intact_checkpoint_each_damaged_one_is_named(tmp_path):
    with Checkpoints(tmp_path / "checkpoints") as checkpoints:
        for step in (1, 2):
            checkpoints.save(step, small_state(float(step)), {"step": step})
    for step in (1, 2):
        damage(tmp_path / "checkpoints" / str(step), "truncate")
    with Checkpoints(tmp_path / "checkpoints") as checkpoints:
        with pytest.raises(run_dir.CorruptCheckpointError, match=r"no intact checkpoint .*checkpoints/2 .*checkpoints/1 "):
            checkpoints.restore_intact(small_state(0.0))
        assert checkpoints.steps() == [1, 2]  # nothing moved
        assert Checkpoints(tmp_path / "none").restore_intact(small_state(0.0)) is None


def test_a_damaged_checkpoint_is_named_when_only_its_params_are_read(tmp_path):
    with Checkpoints(tmp_path / "checkpoints") as checkpoints:
        checkpoints.save(1, small_state(1.0), {"step": 1})
    damage(tmp_path / "checkpoints" / "1", "other data")
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), small_state(0.0).params)
    with Checkpoints(tmp_path / "checkpoints", create=False) as reader:
        with pytest.raises(run_dir.CorruptCheckpointError, match=r"is damaged: 2 arrays differ from what was "
                                                                  r"saved \(params/bias, params/embed\)"):
            reader.restore_params(1, target)


def test_non_finite_states_are_never_checkpointed(tmp_path):
    state = small_state(1.0)
    state = state.replace(params={**state.params, "bias": state.params["bias"].at[1].set(jnp.inf)})
    with Checkpoints(tmp_path / "checkpoints") as checkpoints:
        with pytest.raises(run_dir.NonFiniteError, match=r"step 3 .* in 1 arrays: params/bias; not saving"):
            checkpoints.save(3, state, {"step": 3})
        assert checkpoints.steps() == []
    with pytest.raises(run_dir.NonFiniteError, match="the policy has non-finite values .* params/bias"):
        run_dir.check_finite({"params": state.params}, "the policy")


def test_checksums_do_not_depend_on_the_sharding():
    devices = jax.devices()[:4] if len(jax.devices()) >= 4 else jax.devices()[:1]
    mesh = Mesh(np.array(devices), ("fsdp",))
    x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 3)), jnp.float32)
    sharded = jax.device_put(x, NamedSharding(mesh, PartitionSpec("fsdp")))
    assert run_dir.state_integrity({"x": sharded}) == run_dir.state_integrity({"x": x})
    flipped = x.at[5, 2].set(jax.lax.bitcast_convert_type(
        jax.lax.bitcast_convert_type(x[5, 2], jnp.uint32) ^ jnp.uint32(1 << 31), jnp.float32))
    assert run_dir.state_integrity({"x": flipped})[0] != run_dir.state_integrity({"x": x})[0]


# ----------------------------------------------------------------------------------------------
# One process per workdir; a rerun continues only the run its config.json describes.
# ----------------------------------------------------------------------------------------------


def test_a_second_process_on_a_workdir_stops_naming_the_holder(tmp_path):
    lock = run_dir.lock_workdir(tmp_path, "train.py")
    holder = json.loads((tmp_path / ".lock").read_text())
    assert holder["pid"] == os.getpid() and holder["program"] == "train.py"
    with pytest.raises(run_dir.WorkdirBusyError, match=rf"{tmp_path} is in use by train.py \(pid {os.getpid()} on "):
        run_dir.lock_workdir(tmp_path, "eval.py")  # flock: another open file description conflicts
    lock.release()
    assert not (tmp_path / ".lock").exists()
    # A holder killed with -9 leaves its file, but the kernel dropped its lock.
    (tmp_path / ".lock").write_text('{"pid": 1, "host": "elsewhere"}')
    with run_dir.lock_workdir(tmp_path, "eval.py"):
        assert json.loads((tmp_path / ".lock").read_text())["program"] == "eval.py"
    assert os.listdir(tmp_path) == []


def test_staging_of_killed_processes_is_removed(tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    mine = run_dir.staging_name(tmp_path / "warm_start")
    theirs = mine.with_name(mine.name.replace(f"-{os.getpid()}-", f"-{int(dead.stdout)}-"))
    for directory in (mine, theirs):
        (directory / "sub").mkdir(parents=True)
    (tmp_path / ".config.json.abc123.tmp").write_text("half")
    assert run_dir.remove_stale_staging(tmp_path) == [theirs]  # a live process's staging is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, ".config.json.abc123.tmp"])
    run_dir.remove_stale_staging(tmp_path, all_stale=True)  # under the workdir's lock: all of it
    assert os.listdir(tmp_path) == []


def started_run(workdir, **changes):
    """A workdir whose run got past its warm start, made with the default config and ``changes``."""
    config = as_run_config(default_config())
    run_dir.write_config(workdir, config.replace(changes))
    (workdir / "metrics.jsonl").write_text('{"step": 1}\n')
    return config


def test_a_rerun_with_other_settings_is_refused_naming_each_field_and_both_values(tmp_path):
    config = started_run(tmp_path)
    changed = config.replace({"rl.algorithm": "grpo", "train.learning_rate": 1e-4, "train.num_steps": 500})
    with pytest.raises(ConfigError, match=r"^config\.rl\.algorithm \(was 'gd2po_snr', now 'grpo'\), "
                                          r"config\.train\.learning_rate \(was 0\.0003, now 0\.0001\): the run in "):
        run_dir.check_resume_config(tmp_path, changed)
    # What a resumed run may change (num_steps: extend it; the rest: how it runs, not what it computes).
    run_dir.check_resume_config(tmp_path, config.replace(
        {"train.num_steps": 500, "checkpoint.every_steps": 7, "rewards.num_workers": 3, "mesh.fsdp": 1}))
    # Before any progress (a fresh or a warm-start-only workdir) the config may change freely.
    (tmp_path / "metrics.jsonl").unlink()
    run_dir.check_resume_config(tmp_path, changed)


def test_a_directory_is_replaced_whole(tmp_path):
    target = tmp_path / "policy"
    for version in ("old", "new"):
        staging = run_dir.staging_name(target)
        staging.mkdir()
        (staging / "config.json").write_text(version)
        run_dir.replace_dir(staging, target)
    assert (target / "config.json").read_text() == "new" and os.listdir(tmp_path) == ["policy"]
