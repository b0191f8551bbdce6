"""gd2po_jax/runtime/preemption.py and the run's writes on a full disk: a preemption signal
checkpoints the step in flight and exits 128 + signal; a failed write (ENOSPC) stops the run with one
line, the previous checkpoint intact; the rerun resumes and ends as an uninterrupted run."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.runtime import preemption
from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.metrics_logging import MetricsWriter, read_metrics
from gd2po_jax.runtime.preemption import Preempted, PreemptionWatch
from gd2po_jax.runtime.run_dir import WriteFailedError
from tests.fakes import REPO, tiny_run_config, write_config_file
from tests.jobs.test_train import copy_warm_start, stable_metrics, train_command, train_env  # noqa: F401

# configs/tiny.py shrunk: a 2-step warm start, no evaluation, 10 RL steps, a checkpoint every 5.
RUN = dict(sft__num_steps=2, eval__split="none", train__num_steps=10, checkpoint__every_steps=5, train__log_every=1)


# ----------------------------------------------------------------------------------------------
# The watch and the config.
# ----------------------------------------------------------------------------------------------


def test_config_fields_are_checked_and_older_runs_read_with_the_defaults():
    config = tiny_run_config()
    assert config.train.preemption_signals == ("SIGTERM", "SIGUSR1") and config.train.preemption_grace_s == 25.0
    values = json.loads(config.to_json())
    for name in ("preemption_signals", "preemption_grace_s"):
        del values["train"][name]  # a config.json written before these fields existed
    assert RunConfig.from_dict(values).train == config.train
    with pytest.raises(ConfigError, match=r"^config\.train\.preemption_signals: "):
        tiny_run_config(train__preemption_signals=("SIGKILL",))
    with pytest.raises(ConfigError, match=r"^config\.train\.preemption_grace_s: "):
        tiny_run_config(train__preemption_grace_s=-1.0)
    assert {"train.preemption_signals", "train.preemption_grace_s"} <= set(run_dir.RESUMABLE_FIELDS)
    assert preemption.signal_numbers(["SIGTERM", "SIGUSR1"]) == (signal.SIGTERM, signal.SIGUSR1)
    assert preemption.exit_code(signal.SIGTERM) == 143


def test_in_the_loop_a_signal_is_recorded_then_the_step_stops_a_second_exits_at_once():
    exits = []
    before = signal.getsignal(signal.SIGUSR1)
    with PreemptionWatch(("SIGTERM", "SIGUSR1"), grace_s=0, hard_exit=exits.append) as watch:
        watch.defer(True)
        assert not watch.stop_after_step()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert watch.requested and watch.stop_after_step()
        stop = watch.stopped(3, "WORKDIR/checkpoints/3")
        assert stop.exit_code == 128 + signal.SIGUSR1 and stop.step == 3
        assert str(stop).startswith("preempted by SIGUSR1: saved step 3 in WORKDIR/checkpoints/3 ")
        os.kill(os.getpid(), signal.SIGTERM)  # the second signal: at once, with the first one's code
        assert exits == [128 + signal.SIGUSR1]
    assert signal.getsignal(signal.SIGUSR1) is before  # restored


def test_outside_the_loop_a_signal_stops_at_once_and_the_grace_time_bounds_the_rest():
    exits = []
    with PreemptionWatch(("SIGTERM",), grace_s=0.2, hard_exit=exits.append) as watch:
        with pytest.raises(Preempted, match="preempted by SIGTERM: stopped where it was") as caught:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler raises here
        assert caught.value.exit_code == 143 and caught.value.step is None
        with pytest.raises(Preempted):
            watch.defer(True)  # a signal that arrived before the loop: raised on entering it
        time.sleep(0.5)
        assert exits == [143]  # not finished within grace_s: the process ends


def test_ctrl_c_is_a_preemption_signal_without_a_grace_timer_and_a_second_exits_130():
    """SIGINT is handled whatever the signals configured: the first in the loop is recorded (no
    KeyboardInterrupt, no grace timer: a slow step still finishes and is saved), a second ends at once
    with 130; outside the loop it stops at once as a `Preempted` (one line from train.py, 130)."""
    exits = []
    before = signal.getsignal(signal.SIGINT)
    with PreemptionWatch(("SIGTERM",), grace_s=0.1, hard_exit=exits.append) as watch:
        watch.defer(True)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.3)  # past grace_s: Ctrl-C starts no timer
        assert exits == [] and watch.stop_after_step()
        assert watch.stopped(2, "c/2").exit_code == 130
        os.kill(os.getpid(), signal.SIGINT)
        assert exits == [130]
    assert signal.getsignal(signal.SIGINT) is before  # restored
    with PreemptionWatch((), hard_exit=exits.append):
        with pytest.raises(Preempted, match=r"preempted by SIGINT: stopped where it was.*\(exit code 130\)"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    with PreemptionWatch((), interrupt=False) as watch:
        assert signal.SIGINT not in watch.signals


def test_another_process_signalled_stops_this_one_at_the_same_step():
    with PreemptionWatch(("SIGTERM",), any_process=lambda flag: True, hard_exit=lambda code: None) as watch:
        watch.defer(True)
        assert watch.stop_after_step() and watch.stopped(4, "c/4").exit_code == 143


# ----------------------------------------------------------------------------------------------
# A full disk at each write site: one line naming the file and the free space; nothing lost.
# ----------------------------------------------------------------------------------------------


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def assert_one_line(err: WriteFailedError, path) -> None:
    message = str(err)
    assert "\n" not in message and message.startswith(f"{path}: cannot write it (No space left on device; ")
    assert re.search(r" \d+(\.\d)? (TiB|GiB|MiB|KiB|bytes) free of ", message) and "rerun the same command to resume" in message


def test_a_full_disk_in_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    import orbax.checkpoint as ocp

    from gd2po_jax.runtime.checkpoints import Checkpoints
    from tests.runtime.test_checkpoints import assert_trees_equal, small_state

    with Checkpoints(tmp_path / "checkpoints", keep=1) as checkpoints:
        checkpoints.save(1, small_state(1.0), {"step": 1})
        with monkeypatch.context() as patch:
            patch.setattr(ocp.CheckpointManager, "save", no_space)
            with pytest.raises(WriteFailedError) as caught:
                checkpoints.save(2, small_state(2.0), {"step": 2})
        assert_one_line(caught.value, tmp_path / "checkpoints" / "2")
        assert checkpoints.steps() == [1]
    with Checkpoints(tmp_path / "checkpoints", keep=1) as checkpoints:  # the rerun
        state, meta = checkpoints.restore(None, small_state(0.0))
        assert_trees_equal(state, small_state(1.0)) and meta["step"] == 1
        checkpoints.save(2, small_state(2.0), {"step": 2})
        assert checkpoints.steps() == [2]


def test_a_full_disk_in_metrics_and_tensorboard(tmp_path, monkeypatch):
    writer = MetricsWriter(tmp_path)
    writer.write(1, {"loss": 1.0})

    class Full:
        def write(self, text):
            no_space()

        flush = close = write

    real, writer._file = writer._file, Full()
    with pytest.raises(WriteFailedError) as caught:
        writer.write(2, {"loss": 2.0})
    assert_one_line(caught.value, tmp_path / "metrics.jsonl")
    writer._file = real
    monkeypatch.setattr(writer._tb, "add_scalar", no_space)
    with pytest.raises(WriteFailedError) as caught:
        writer.write(2, {"loss": 2.0})
    assert_one_line(caught.value, tmp_path / "tensorboard")
    monkeypatch.undo()
    writer.close()
    writer = MetricsWriter(tmp_path, resume_step=1)  # the rerun resumes from a checkpoint of step 1
    writer.write(2, {"loss": 2.0})
    writer.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


@pytest.mark.parametrize("name", ["config.json", "results.json"])
def test_a_full_disk_in_a_workdir_file_keeps_the_old_one(tmp_path, monkeypatch, name):
    path = tmp_path / name
    run_dir.write_json(path, {"old": 1})
    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(WriteFailedError) as caught:
        run_dir.write_json(path, {"new": 2})
    assert_one_line(caught.value, path)
    assert json.loads(path.read_text()) == {"old": 1} and sorted(os.listdir(tmp_path)) == [name]


def test_a_full_disk_in_the_policy_export(tmp_path, monkeypatch):
    from flax import nnx

    from gd2po_jax.models import Decoder, pretrained, save_pretrained
    from tests.fakes import tiny_model_config

    monkeypatch.setattr(pretrained, "write_checkpoint", no_space)
    with pytest.raises(WriteFailedError) as caught:
        save_pretrained(Decoder(tiny_model_config(), rngs=nnx.Rngs(0)), tmp_path / "policy.tmp-x")
    assert_one_line(caught.value, tmp_path / "policy.tmp-x")


# ----------------------------------------------------------------------------------------------
# train.py end to end.
# ----------------------------------------------------------------------------------------------


def start_train(workdir: pathlib.Path, config_file: pathlib.Path, env: dict) -> subprocess.Popen:
    log = workdir.with_name(workdir.name + ".log")
    with log.open("a") as out:
        return subprocess.Popen(train_command(workdir, config_file), cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen, workdir: pathlib.Path, timeout: float = 600) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"train.py ran longer than {timeout} s; log: {workdir.with_name(workdir.name + '.log')}")


def run_to_the_end(workdir: pathlib.Path, config_file: pathlib.Path, env: dict) -> str:
    code = finish(start_train(workdir, config_file, env), workdir)
    log = workdir.with_name(workdir.name + ".log").read_text()
    assert code == 0, log[-4000:]
    return log


def checkpoint_steps(workdir: pathlib.Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, train_env) -> pathlib.Path:  # noqa: F811
    root = tmp_path_factory.mktemp("uninterrupted")
    run_to_the_end(root / "run", write_config_file(root, **RUN), train_env)
    return root / "run"


@pytest.mark.slow
def test_sigterm_checkpoints_the_step_in_flight_and_the_rerun_resumes_there(uninterrupted, tmp_path, train_env):  # noqa: F811
    workdir = tmp_path / "run"
    copy_warm_start(uninterrupted, workdir)
    config_file = write_config_file(tmp_path, **RUN)
    proc = start_train(workdir, config_file, train_env)
    metrics = workdir / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline and not (
            metrics.is_file() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    code = finish(proc, workdir, timeout=60)
    log = workdir.with_name(workdir.name + ".log").read_text()
    assert code == 143 and time.monotonic() - signalled < 60, log[-3000:]
    last = read_metrics(workdir)[-1]["step"]
    assert 2 <= last < 10 and checkpoint_steps(workdir)[-1] == last  # the step in flight, checkpointed
    assert log.rstrip().splitlines()[-1].startswith(f"train.py: preempted by SIGTERM: saved step {last} in ")
    assert not (workdir / ".lock").exists()

    log = run_to_the_end(workdir, config_file, train_env)
    assert f"resumed from step {last}" in log
    assert stable_metrics(workdir) == stable_metrics(uninterrupted)
    assert checkpoint_steps(workdir) == checkpoint_steps(uninterrupted)


@pytest.mark.slow
def test_ctrl_c_checkpoints_the_step_in_flight_and_exits_130_with_one_line(uninterrupted, tmp_path, train_env):  # noqa: F811
    """Ctrl-C (SIGINT) as SIGTERM: the step in flight finishes and is saved, one line, exit code 130, no
    KeyboardInterrupt traceback; the rerun resumes from it."""
    workdir = tmp_path / "run"
    copy_warm_start(uninterrupted, workdir)
    config_file = write_config_file(tmp_path, **RUN)
    proc = start_train(workdir, config_file, train_env)
    metrics = workdir / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline and not (
            metrics.is_file() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    code = finish(proc, workdir, timeout=60)
    log = workdir.with_name(workdir.name + ".log").read_text()
    assert code == 130, log[-3000:]
    assert "Traceback" not in log and "KeyboardInterrupt" not in log
    last = read_metrics(workdir)[-1]["step"]
    assert 2 <= last < 10 and checkpoint_steps(workdir)[-1] == last
    assert log.rstrip().splitlines()[-1].startswith(f"train.py: preempted by SIGINT: saved step {last} in ")
    assert "SIGINT received: finishing the step in flight" in log
    log = run_to_the_end(workdir, config_file, train_env)
    assert f"resumed from step {last}" in log


FAULTS = {
    # site: (what the config file patches, the failing file's name in the one line, the checkpoint left)
    "checkpoint": ("ocp.CheckpointManager.save", "checkpoints/10", 5),
    "metrics": ("MetricsWriter.write", "metrics.jsonl", 5),
    "export": ("pretrained.write_checkpoint", "policy.tmp-", 10),
}


def faulty_config_file(directory: pathlib.Path, site: str) -> pathlib.Path:
    """A config file of `RUN` (the same config as `write_config_file`'s) that makes ``site``'s
    write fail with ENOSPC: the checkpoint of step 10, the metrics of step 7, the export."""
    path = directory / "faulty.py"
    path.write_text(
        "import errno, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "import orbax.checkpoint as ocp\n"
        "from gd2po_jax.models import pretrained\n"
        "from gd2po_jax.runtime.metrics_logging import MetricsWriter\n"
        "from tests.fakes import tiny_config\n\n"
        "def full(*args, **kwargs):\n"
        "    raise OSError(errno.ENOSPC, 'No space left on device')\n\n"
        "_save, _write = ocp.CheckpointManager.save, MetricsWriter.write\n"
        "def save(self, step, *args, **kwargs):\n"
        "    return full() if step == 10 else _save(self, step, *args, **kwargs)\n"
        "def write(self, step, metrics):\n"
        "    if step == 7:\n"
        "        self._file.write('{\"step\": 7, \"torn')  # half a line, as a full disk leaves it\n"
        "        self._file.flush()\n"
        "        full()\n"
        "    return _write(self, step, metrics)\n"
        f"site = {site!r}\n"
        "if site == 'checkpoint':\n"
        "    ocp.CheckpointManager.save = save\n"
        "elif site == 'metrics':\n"
        "    from gd2po_jax.runtime import run_dir as workdir\n"
        "    def write_guarded(self, step, metrics):\n"
        "        with workdir.writing(self.path):\n"
        "            return write(self, step, metrics)\n"
        "    MetricsWriter.write = write_guarded\n"
        "else:\n"
        "    pretrained.write_checkpoint = full\n\n"
        "def get_config():\n"
        f"    return tiny_config(**{RUN!r})\n")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("site", sorted(FAULTS))
def test_a_full_disk_stops_the_run_with_one_line_and_the_rerun_resumes(uninterrupted, tmp_path, train_env, site):  # noqa: F811
    _, name, kept = FAULTS[site]
    workdir = tmp_path / "run"
    copy_warm_start(uninterrupted, workdir)
    code = finish(start_train(workdir, faulty_config_file(tmp_path, site), train_env), workdir)
    log = workdir.with_name(workdir.name + ".log").read_text()
    assert code == 2, log[-3000:]
    line = log.rstrip().splitlines()[-1]
    assert line.startswith(f"train.py: {workdir}/{name}") and "No space left on device; " in line, line
    assert " GiB free of " in line and checkpoint_steps(workdir)[-1] == kept, line
    assert not (workdir / ".lock").exists() and not (workdir / "policy").exists()

    log = run_to_the_end(workdir, write_config_file(tmp_path, **RUN), train_env)
    assert f"resumed from step {kept}" in log
    assert stable_metrics(workdir) == stable_metrics(uninterrupted)
    assert not list(workdir.glob("*.tmp-*"))
    from tests.jobs.test_train import policy_tensors

    expected, got = policy_tensors(uninterrupted), policy_tensors(workdir)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


# ----------------------------------------------------------------------------------------------
# Two processes (tests/runtime/test_distributed.py's setup: gloo on localhost, 1 CPU device each).
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_to_one_of_two_processes_stops_both_at_the_same_step(tmp_path):
    from tests.runtime.test_distributed import logs_of, process_env, start_pair, succeed, wait
    from tests.runtime.test_distributed import train_command as pair_command

    workdir, cache = tmp_path / "two", tmp_path / "xla_cache"
    config_file = write_config_file(tmp_path, **RUN)
    pair = start_pair(pair_command(workdir, config_file), process_env(cache, 1), tmp_path / "first")
    metrics = workdir / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while pair[0].poll() is None and time.monotonic() < deadline and not (
            metrics.is_file() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.01)
    pair[1].send_signal(signal.SIGTERM)  # process 1 only: process 0 learns it at the end of the step
    codes = [wait(proc, log, timeout=60) for proc, log in zip(pair, logs_of(tmp_path / "first"))]
    logs = [log.read_text() for log in logs_of(tmp_path / "first")]
    assert codes == [143, 143], [log[-2000:] for log in logs]
    last = read_metrics(workdir)[-1]["step"]
    assert 2 <= last < 10 and checkpoint_steps(workdir)[-1] == last
    for log in logs:  # both saved the same step
        assert f"train.py: preempted by SIGTERM: saved step {last} in " in log, log[-2000:]
    assert not (workdir / ".lock").exists()

    rerun = start_pair(pair_command(workdir, config_file), process_env(cache, 1), tmp_path / "rerun")
    succeed(rerun, logs_of(tmp_path / "rerun"))
    assert f"resumed from step {last}" in logs_of(tmp_path / "rerun")[0].read_text()
    assert [r["step"] for r in read_metrics(workdir)] == list(range(1, 11))
    assert checkpoint_steps(workdir) == [5, 10] and (workdir / "policy").is_dir()
