"""gd2po_jax/runtime/run_dir.py: the workdir layout, atomic writes, config.json, the lock and resume checks."""

from __future__ import annotations

import json
import os

import pytest

from configs.default import get_config as default_config
from gd2po_jax.config import ConfigError
from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.run_dir import RunDir, RunDirError
from gd2po_jax.tasks.synthetic_tools import task as synthetic_tools
from tests.fakes import as_run_config

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
    assert os.listdir(tmp_path) == ["config.json"]  # write_text signs nothing (write_config does)


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
    run_dir.write_config(tmp_path, as_run_config(config))
    again = run_dir.load_run_config(tmp_path)
    assert again == as_run_config(config)
    assert again.rl.snr_tau == 0.8 and again.rewards.names == ("correctness", "format", "length")
    assert (tmp_path / "config.json").read_text() == config.to_json_best_effort(indent=2, sort_keys=True)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "config.sig"]  # config.sig: runtime/trust.py


def test_an_older_config_json_reads_with_the_values_its_run_used(tmp_path):
    old = json.loads(as_run_config(default_config()).to_json())
    del old["sft"]["seed"], old["sft"]["cache_dir"], old["sampling"]["prompts_per_call"]
    del old["data"]["synthetic"]["habit_fraction"], old["data"]["synthetic"]["habit_rate"]
    old["sft"]["num_steps"] = 300
    (tmp_path / "config.json").write_text(json.dumps(old))
    config = run_dir.load_run_config(tmp_path)
    assert (config.sft.seed, config.sft.cache_dir, config.sampling.prompts_per_call) == (0, "", 0)
    assert config.sft.num_steps == 300  # recorded values are kept
    task = synthetic_tools.world_config(config.data.synthetic)
    assert (task.habit_fraction, task.habit_rate) == (0.0, 1.0)  # no habit before habits existed


def test_a_config_json_that_is_not_a_run_config_is_named(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(RunDirError, match="config.json: not a config"):
        run_dir.load_run_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"rl": {"algorithm": "gdpo"}}))
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'config.json'}: config\.\w+ is missing"):
        run_dir.load_run_config(tmp_path)


def test_a_run_config_loads_from_its_workdir_or_from_a_copy_of_its_file(tmp_path):
    config = as_run_config(default_config())
    (tmp_path / "run").mkdir()
    run_dir.write_config(tmp_path / "run", config)
    (tmp_path / "copy.json").write_text((tmp_path / "run" / "config.json").read_text())
    assert run_dir.load_run_config(tmp_path / "run") == run_dir.load_run_config(tmp_path / "copy.json") == config
    # Whatever is missing is named: a workdir's config.json, or the file itself.
    with pytest.raises(RunDirError, match=f"{tmp_path / 'none' / 'config.json'}: cannot read it"):
        run_dir.load_run_config(tmp_path / "none")
    with pytest.raises(RunDirError, match=f"{tmp_path / 'none.json'}: cannot read it"):
        run_dir.load_run_config(tmp_path / "none.json")


def test_config_changes_name_the_fields_that_differ():
    before = {"rl": {"snr_tau": 0.8, "algorithm": "gdpo"}, "train": {"seed": 0}}
    assert run_dir.config_changes(before, before) == ""
    after = {"rl": {"snr_tau": 0.5, "algorithm": "gdpo"}, "train": {"seed": 0, "steps": 3}}
    assert run_dir.config_changes(before, after) == "rl.snr_tau (was 0.8, now 0.5), train.steps (was None, now 3)"
    many = {"x": {str(i): i for i in range(8)}}
    assert run_dir.config_changes({}, many, limit=2).endswith("x.1 (was None, now 1) and 6 more")


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


# ----------------------------------------------------------------------------------------------
# Symbolic links and permissions (issue 63, finding 2).
# ----------------------------------------------------------------------------------------------


def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path):
    precious = tmp_path / "precious"
    precious.write_text("mine")
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / ".lock").symlink_to(precious)
    with pytest.raises(run_dir.LinkInWorkdirError, match=r"\.lock is a symbolic link \(to .*precious\)"):
        run_dir.lock_workdir(workdir, "export.py")
    assert precious.read_text() == "mine"


@pytest.mark.parametrize("entry", ["tensorboard", "metrics.jsonl", "checkpoints", "eval"])
def test_a_workdir_whose_entries_lead_out_of_it_is_refused_by_every_writer(tmp_path, entry):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / entry).symlink_to(elsewhere)
    with pytest.raises(run_dir.LinkInWorkdirError, match=rf"{entry} is a symbolic link .*remove the link"):
        run_dir.lock_workdir(workdir, "train.py")
    assert not (workdir / ".lock").exists() and list(elsewhere.iterdir()) == []
    (workdir / entry).unlink()
    run_dir.lock_workdir(workdir, "train.py").release()  # without the link: fine
    # The workdir itself may be a link (runs -> /scratch/runs).
    (tmp_path / "link").symlink_to(workdir)
    run_dir.lock_workdir(tmp_path / "link", "train.py").release()


def test_appending_never_follows_a_link(tmp_path):
    precious = tmp_path / "precious"
    precious.write_text("mine")
    (tmp_path / "metrics.jsonl").symlink_to(precious)
    with pytest.raises(OSError):
        run_dir.open_append(tmp_path / "metrics.jsonl")
    run_dir.write_text(tmp_path / "metrics.jsonl", "new\n")  # replaces the link, not its target
    assert precious.read_text() == "mine" and not (tmp_path / "metrics.jsonl").is_symlink()


def test_one_permission_policy_for_everything_a_run_writes(tmp_path):
    """config.json, results.json, metrics.jsonl were 0600 (mkstemp's) while checkpoints were 0644."""
    import jax.numpy as jnp

    from gd2po_jax.runtime.checkpoints import Checkpoints
    from gd2po_jax.runtime.metrics_logging import MetricsWriter

    old = os.umask(0o022)
    try:
        run_dir.write_json(tmp_path / "results.json", {})
        lock = run_dir.lock_workdir(tmp_path, "train.py")
        writer = MetricsWriter(tmp_path, tensorboard=False)
        writer.write(1, {"loss": 1.0})
        writer.close()
        with Checkpoints(tmp_path / "checkpoints") as checkpoints:
            checkpoints.save(1, {"x": jnp.ones(3)}, {"step": 1})
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp_path / "results.json", tmp_path / ".lock",
                                                                    tmp_path / "metrics.jsonl")}
        checkpoint_files = [p for p in (tmp_path / "checkpoints").rglob("*") if p.is_file()]
        lock.release()
    finally:
        os.umask(old)
    assert set(modes.values()) == {"0o644"}, modes
    assert checkpoint_files and {oct(p.stat().st_mode & 0o777) for p in checkpoint_files} == {"0o644"}
    assert run_dir.file_mode() == 0o666 & ~old


# ----------------------------------------------------------------------------------------------
# User errors in one line (issue 63, finding 7): a read-only workdir, errors in a resolved config.json.
# ----------------------------------------------------------------------------------------------


def test_a_read_only_workdir_is_one_line_for_the_trainer(tmp_path, monkeypatch):
    import errno
    import pathlib

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(pathlib.Path, "mkdir", read_only)
    with pytest.raises(RunDirError, match=rf"^{tmp_path / 'new'}: cannot create the workdir \(Read-only file "
                                          r"system\); choose a --workdir on writable storage$"):
        run_dir.make_workdir(tmp_path / "new")
    monkeypatch.undo()
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: read_only() if str(path).endswith(".lock")
                        else real_open(path, *a, **k))
    with pytest.raises(RunDirError, match=r"\.lock: cannot create the workdir's lock \(Read-only file system\); "
                                          r"a run needs a workdir it can write") as refused:
        run_dir.lock_workdir(tmp_path, "train.py")
    assert "\n" not in str(refused.value)


def test_an_error_in_a_resolved_config_json_is_one_line_without_the_traceback(tmp_path):
    import subprocess
    import sys

    from gd2po_jax.cli import config_file_error
    from tests.fakes import REPO, subprocess_env, tiny_run_config

    run_dir.write_config(tmp_path, tiny_run_config())
    values = json.loads((tmp_path / "config.json").read_text())
    values["rl"]["snr_taux"] = 1.0
    (tmp_path / "bad.json").write_text(json.dumps(values))
    done = subprocess.run([sys.executable, "train.py", f"--config=configs/resolved.py:{tmp_path / 'bad.json'}",
                           f"--workdir={tmp_path / 'run'}"], cwd=REPO, env=subprocess_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"train.py: --config=configs/resolved.py:{tmp_path / 'bad.json'}: {tmp_path / 'bad.json'}: "
                           "config.rl.snr_taux: unknown field")
    assert "Traceback" not in line and "File " not in line
    assert config_file_error("flag --config=x.py: a bad value") is None  # other flag errors as before


def test_a_config_json_without_its_secrets_is_not_rerun_with_the_placeholder(tmp_path):
    """configs/resolved.py (how sweep.py launches its runs) would hand a reward function '<redacted>'."""
    from configs import resolved
    from tests.fakes import tiny_run_config

    entry = {"fn": "my_rewards:judge", "options": {"api_key": "sk-SECRET"}}
    run_dir.write_config(tmp_path, tiny_run_config(rewards__functions=(entry,)))
    with pytest.raises(ConfigError, match=r"config\.json: rewards\.functions\[0\]\.options\.api_key looked like a "
                                          r"secret .*from the environment"):
        resolved.get_config(str(tmp_path / "config.json"))
    run_dir.write_config(tmp_path, tiny_run_config())  # without secrets: as before
    assert resolved.get_config(str(tmp_path / "config.json")).rewards.names == ("correctness", "format", "length")
