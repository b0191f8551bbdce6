"""gd2po_jax/runtime/imports.py: import paths of the config, and the trust a workdir's config.json
needs before it may name code (`importing_only`, `run_dir.trusting_code_of`, eval.py's flags)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.imports import UntrustedCodeError, import_object, importing_only
from tests.fakes import REPO, subprocess_env, tiny_run_config

PAYLOAD = """
import pathlib
pathlib.Path({marker!r}).write_text("the payload ran")

def f(completions, **kwargs):
    return [0.0] * len(completions)
"""


def crafted_workdir(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, str]:
    """(a workdir whose config.json names a payload file as a reward function, the marker file the
    payload's import writes, the import path)."""
    marker = tmp_path / "marker"
    payload = tmp_path / "some" / tmp_path.name / "evil.py"  # a module name of its own
    payload.parent.mkdir(parents=True)
    payload.write_text(PAYLOAD.format(marker=str(marker)))
    path = f"{payload}:f"
    workdir = tmp_path / "run"
    workdir.mkdir()
    run_dir.write_config(workdir, tiny_run_config(rewards__functions=(path,)))
    (workdir / "config.sig").unlink()  # made elsewhere: not signed with this user's key (runtime/trust.py)
    return workdir, marker, path


def test_within_importing_only_other_paths_are_refused_before_anything_runs(tmp_path):
    workdir, marker, path = crafted_workdir(tmp_path)
    with importing_only((), "W/config.json", "pass --trust_workdir_code"):
        with pytest.raises(UntrustedCodeError, match=r"^label: W/config.json names code .*evil\.py:f; not importing"):
            import_object(path, "label")
    assert not marker.exists()
    with importing_only([path], "W/config.json", "pass --trust_workdir_code"):
        fn, source = import_object(path, "label")  # given again: trusted
    assert marker.exists() and fn(["a", "b"]) == [0.0, 0.0] and source.endswith("evil.py")


def test_a_workdirs_config_names_code_that_runs_only_when_trusted(tmp_path):
    workdir, marker, path = crafted_workdir(tmp_path)
    assert run_dir.named_code(json.loads(run_dir.RunDir(workdir).config.read_text())) == [
        ("config.rewards.functions[0]", path)]
    with pytest.raises(UntrustedCodeError) as refused:
        with run_dir.trusting_code_of(workdir):
            pass
    message = str(refused.value)
    assert "\n" not in message and f"config.rewards.functions[0] ({path})" in message
    assert "--trust_workdir_code" in message and "--reward_functions" in message
    with run_dir.trusting_code_of(workdir, rewards=False):  # export.py: rewards are not its business
        with pytest.raises(UntrustedCodeError):
            import_object(path, "an import that slipped through")
    assert not marker.exists()
    with run_dir.trusting_code_of(workdir, given=[path]):  # given again on the command line
        import_object(path, "label")
    assert marker.exists()


def test_eval_py_refuses_a_crafted_workdir_in_one_line_and_runs_nothing(tmp_path):
    """Finding 1 of issue 63: eval.py --workdir=W imported the reward functions of W/config.json."""
    workdir, marker, path = crafted_workdir(tmp_path)
    done = subprocess.run([sys.executable, "eval.py", f"--workdir={workdir}"], cwd=REPO, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"eval.py: {workdir / 'config.json'} names code") and path in line
    assert not marker.exists()


def test_eval_py_habits_reads_generations_without_asking_about_reward_functions(tmp_path):
    """--habits imports no reward function: it is not refused for them, and imports none."""
    workdir, marker, _ = crafted_workdir(tmp_path)
    done = subprocess.run([sys.executable, "eval.py", f"--workdir={workdir}", "--habits"], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("eval.py: --habits: ") and "before_rl.jsonl not found" in line  # not the refusal
    assert not marker.exists()
