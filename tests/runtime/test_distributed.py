"""Several processes (`gd2po_jax.runtime.distributed`), on one machine (a localhost coordinator on a free port,
gloo collectives): the helpers on 2 processes x 4 simulated CPU devices, and ``train.py`` on 2
processes x 1 device against 1 process x 2 devices (as many devices as a CI machine has cores:
simulated devices beyond those multiply a run's time).

The processes compute what one process computes: the same rollouts, and updates that differ only in
the order in which gloo sums across processes (float rounding, ~1e-7). A run of ``train.py`` on two
processes, killed and resumed, ends where the one-process run ends; the survivor of the kill stops
with a clear error within the heartbeat timeout; an error in one process stops the other at once.
Everything runs in subprocesses that share one persistent XLA compilation cache.
"""

from __future__ import annotations

import json
import pathlib
import signal
import socket
import subprocess
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gd2po_jax.config import ConfigError, DistributedConfig
from gd2po_jax.runtime import distributed
from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.metrics_logging import read_metrics
from gd2po_jax.runtime.sharding import make_mesh
from tests.fakes import REPO, subprocess_env, write_config_file
from tests.runtime import multihost_worker

HEARTBEAT_S = 20  # config.distributed.heartbeat_timeout_s of the runs here (10 s: both processes of a pair
# were once taken for dead before step 2 while the suite's other worker loaded the 2 cores)
VOLATILE = ("time/", "tokens_per_second")  # wall-clock metrics: differ between any two runs
# configs/tiny.py shrunk to what still takes every path: a 2-step warm start, an evaluation of 8
# examples before and after RL, 4 RL steps of 8 prompts x 4 rollouts with a checkpoint every 2, on
# the default mesh (data parallel over the 2 devices: each process holds 4 of the 8 prompts), each
# step's rollouts saved (process 0 writes those the other process sampled). Split parameters are
# exported by tests/runtime/multihost_worker.py (fsdp over processes costs gloo a round trip per layer
# and token: 1.6x the CPU time of this run).
MINI = dict(sft__num_steps=2, train__num_steps=4, checkpoint__every_steps=2, eval__max_examples=8,
            data__synthetic__num_validation=8, logging__rollouts_every=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def process_env(cache: pathlib.Path, num_devices: int) -> dict:
    """A subprocess's environment: ``num_devices`` CPU devices, the shared compilation cache."""
    return subprocess_env(JAX_NUM_CPU_DEVICES=str(num_devices), JAX_COMPILATION_CACHE_DIR=str(cache),
                          JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                          JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


def start(command: list[str], env: dict, log: pathlib.Path) -> subprocess.Popen:
    with log.open("a") as out:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def distributed_flags(port: int, process_id: int) -> list[str]:
    return [f"--config.distributed.coordinator_address=localhost:{port}", "--config.distributed.num_processes=2",
            f"--config.distributed.process_id={process_id}", f"--config.distributed.heartbeat_timeout_s={HEARTBEAT_S}"]


def train_command(workdir: pathlib.Path, config_file: pathlib.Path) -> list[str]:
    return [sys.executable, str(REPO / "train.py"), f"--config={config_file}", f"--workdir={workdir}"]


def start_pair(command: list[str], env: dict, log_prefix: pathlib.Path) -> list[subprocess.Popen]:
    """Processes 0 and 1 of ``command`` (each with its --config.distributed flags); logs
    ``<log_prefix>.p0.log`` and ``.p1.log``."""
    port = free_port()
    return [start(command + distributed_flags(port, i), env, log_prefix.with_name(f"{log_prefix.name}.p{i}.log"))
            for i in (0, 1)]


def wait(proc: subprocess.Popen, log: pathlib.Path, timeout: float = 600) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"a process ran longer than {timeout} s; log: {log}")


def succeed(procs: list[subprocess.Popen], logs: list[pathlib.Path]) -> None:
    for proc, log in zip(procs, logs):
        if wait(proc, log) != 0:
            pytest.fail(f"exit code {proc.returncode}:\n{log.read_text()[-4000:]}")


def logs_of(prefix: pathlib.Path) -> list[pathlib.Path]:
    return [prefix.with_name(f"{prefix.name}.p{i}.log") for i in (0, 1)]


# ----------------------------------------------------------------------------------------------
# Settings.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values, field", [
    ({"coordinator_address": "localhost"}, "config.distributed.coordinator_address"),  # no port
    ({"num_processes": -1}, "config.distributed.num_processes"),
    ({"num_processes": 2, "process_id": 2}, "config.distributed.process_id"),
    ({"process_id": -2}, "config.distributed.process_id"),
    ({"heartbeat_timeout_s": 0}, "config.distributed.heartbeat_timeout_s"),
])
def test_invalid_settings_name_the_field(values, field):
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        DistributedConfig.from_dict(values)


def test_one_process_needs_no_coordinator(monkeypatch):
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    distributed.initialize()  # nothing to join: JAX stays a single process
    distributed.initialize(DistributedConfig(num_processes=1, process_id=0))
    assert not jax.distributed.is_initialized() and jax.process_count() == 1
    for settings in (DistributedConfig(num_processes=2), DistributedConfig(process_id=1)):
        with pytest.raises(ConfigError, match=r"^config\.distributed\.coordinator_address: empty, but "
                                              r"config\.distributed\.num_processes="):
            distributed.initialize(settings)


def test_one_process_takes_the_code_path_of_before():
    """In one process every helper is the plain JAX call the code made before processes existed."""
    mesh = make_mesh(data=1, fsdp=-1)
    ids = np.arange(24, dtype=np.int32).reshape(8, 3)
    built = []
    (out,) = distributed.batch_rows(lambda rows: built.append(rows) or (ids[rows],), 8, mesh)
    np.testing.assert_array_equal(built[0], np.arange(8))
    assert out.committed is False and np.array_equal(out, ids)  # jnp.asarray: uncommitted, as before
    rows, values = distributed.addressable_rows(jnp.asarray(ids))
    np.testing.assert_array_equal(rows, np.arange(8))
    np.testing.assert_array_equal(values, ids)
    assert distributed.gather_rows(rows, values, 8) is values
    assert distributed.replicated(np.ones(2), mesh).committed is False
    whole = distributed.host_value(out)  # jax.device_get
    assert isinstance(whole, np.ndarray) and np.array_equal(whole, ids)
    assert distributed.gather_texts("x") == ["x"] and distributed.primary_decides(True)
    assert distributed.is_primary() and not distributed.any_process(False)
    # The rows each process would build: under the batch sharding, the process's devices' rows.
    np.testing.assert_array_equal(distributed.process_rows(distributed.row_sharding(mesh, 16), 16), np.arange(16))


# ----------------------------------------------------------------------------------------------
# The row helpers across two processes.
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> types.SimpleNamespace:
    """The two processes of tests/runtime/multihost_worker.py, run to their end (process 0 fails on purpose)."""
    out = tmp_path_factory.mktemp("helpers")
    logs, port = [out / f"worker{i}.log" for i in (0, 1)], free_port()
    began = time.monotonic()
    workers = [start([sys.executable, "-m", "tests.runtime.multihost_worker", f"--port={port}", f"--process_id={i}",
                      f"--out={out}"], process_env(out / "xla_cache", 4), log) for i, log in zip((0, 1), logs)]
    codes = [wait(proc, log, timeout=300) for proc, log in zip(workers, logs)]
    return types.SimpleNamespace(out=out, codes=codes, seconds=time.monotonic() - began,
                                 logs=[log.read_text() for log in logs])


@pytest.mark.slow
def test_each_process_builds_and_reads_its_rows_and_gathers_the_others(worker):
    """Over a mesh of 8 devices on 2 processes (fsdp=8), each process holds rows 8i..8i+7 of a
    16-row batch: it builds those, reads those, and gathers everyone's in row order."""
    data = multihost_worker.rows_data()
    tmp_path = worker.out
    for i in (0, 1):
        seen = json.loads((tmp_path / f"helpers.p{i}.json").read_text())
        mine = list(range(8 * i, 8 * i + 8))
        assert seen["devices"] == [2, 4, 8]
        assert seen["built"] == [mine]  # only its rows
        assert seen["whole"] == data.tolist() and seen["even"] == (data % 2 == 0).tolist()
        assert seen["rows"] == mine and seen["own"] == (2 * data[mine]).tolist()
        assert seen["gathered"] == (2 * data).tolist() and seen["gathered_even"] == (data % 2 == 0).tolist()
        assert seen["few_rows"] == [0, 1, 2, 3] and seen["few"] == data[:4].tolist()  # 4 rows on 8 devices: all
        assert seen["replicated"] == ["0.5", "nan"]
        assert seen["texts"] == [None, "é" * 7 + "\ufffd"]  # in process order, cut to 15 bytes
        assert seen["primary_decides"] is True and seen["any_process"] == [True, False]
        assert seen["is_primary"] is (i == 0)


@pytest.mark.slow
def test_a_reward_model_split_over_processes_scores_as_on_one(worker):
    """Both processes fed the same 16 conversations to a reward model whose parameters were split
    over the devices of both: each got every score, as one process with 8 devices does."""
    from gd2po_jax.runtime.sharding import make_mesh

    expected = multihost_worker.reward_model_scores(make_mesh(data=1, fsdp=8))
    for i in (0, 1):
        seen = json.loads((worker.out / f"helpers.p{i}.json").read_text())
        np.testing.assert_allclose(seen["reward_model_scores"], expected, rtol=1e-5, atol=1e-5, err_msg=f"process {i}")


@pytest.mark.slow
def test_an_export_gathers_parameters_split_over_processes(worker):
    """Each process held half of every split parameter; process 0 wrote them whole."""
    from safetensors.numpy import load_file

    expected, got = (load_file(worker.out / "exported" / name / "model.safetensors") for name in ("unsplit", "split"))
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


@pytest.mark.slow
def test_an_error_in_one_process_stops_the_others_at_once(worker):
    """Process 0 failed (SystemExit with a message) while process 1 waited for it at a barrier:
    process 1's watchdog stopped it with process 0's error, long before any JAX timeout."""
    p0, p1 = worker.logs
    assert worker.codes == [1, 1], (p0[-2000:], p1[-2000:])
    assert "multihost_worker: process 0 fails on purpose" in p0
    assert "process 0 of 2 failed (the error above); the others stop too" in p0
    assert "stopping: process 0 of 2 failed: multihost_worker: process 0 fails on purpose (on " in p1
    assert worker.seconds < 120, worker.seconds  # no heartbeat, barrier or shutdown timeout was waited for


# ----------------------------------------------------------------------------------------------
# train.py on two processes: killed, resumed, equal to one process.
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> types.SimpleNamespace:
    """One process x 2 devices (``one``) and, at the same time, two processes x 1 device (``two``)
    of the same config; process 1 of the two is killed (SIGKILL) after step 3, past the checkpoint of
    step 2; then both processes are started again and finish the run."""
    root = tmp_path_factory.mktemp("multihost")
    config_file = write_config_file(root, **MINI)
    cache = root / "xla_cache"
    one, two = root / "one", root / "two"
    reference = start(train_command(one, config_file), process_env(cache, 2), root / "one.log")
    pair = start_pair(train_command(two, config_file), process_env(cache, 1), root / "two")

    def past_step_3() -> bool:
        metrics = two / "metrics.jsonl"
        return (two / "checkpoints" / "2").is_dir() and metrics.is_file() and metrics.read_text().count("\n") >= 3

    deadline = time.monotonic() + 600
    while not past_step_3() and pair[0].poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    reached_step_3 = past_step_3()  # else the pair stopped (or hung) before the kill: the tests say so
    pair[1].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    pair[1].wait()
    survivor_code = wait(pair[0], root / "two.p0.log")
    survivor_seconds = time.monotonic() - killed_at
    first_logs = [log.read_text() for log in logs_of(root / "two")]
    succeed([reference], [root / "one.log"])
    rerun = start_pair(train_command(two, config_file), process_env(cache, 1), root / "rerun")
    succeed(rerun, logs_of(root / "rerun"))
    return types.SimpleNamespace(one=one, two=two, first_logs=first_logs, survivor_code=survivor_code,
                                 survivor_seconds=survivor_seconds, reached_step_3=reached_step_3,
                                 rerun_logs=[log.read_text() for log in logs_of(root / "rerun")])


@pytest.mark.slow
def test_a_killed_process_stops_the_other_within_the_heartbeat_timeout(runs):
    log = runs.first_logs[0]
    assert runs.reached_step_3, "the pair stopped before it was killed:\n" + log[-3000:]
    assert runs.survivor_code != 0, log[-3000:]
    # JAX's coordination service finds process 1 silent after heartbeat_timeout_s and ends process 0,
    # saying so; a collective that fails first is reported by our watchdog instead.
    assert ("another task died" in log and "stopped sending heartbeats" in log) or "the others stop too" in log, \
        log[-3000:]
    assert runs.survivor_seconds < HEARTBEAT_S + 30, runs.survivor_seconds


@pytest.mark.slow
def test_two_processes_killed_and_resumed_end_as_one_process(runs):
    assert runs.reached_step_3, "the pair stopped before it was killed:\n" + runs.first_logs[0][-3000:]
    assert "resumed from step 2" in runs.rerun_logs[0]
    one, two = read_metrics(runs.one), read_metrics(runs.two)
    assert [r["step"] for r in two] == [1, 2, 3, 4]  # each step once: only process 0 writes
    for mine, theirs in zip(two, one):
        # time/first_step: each process logs its own first step's time (the resumed one too)
        assert {k for k in mine if not k.startswith(VOLATILE)} == {k for k in theirs if not k.startswith(VOLATILE)}
        for name, value in theirs.items():
            if not name.startswith(VOLATILE):
                # gloo sums across processes in another order than one process does: float rounding
                # (~1e-7 at step 1), which Adam amplifies for gradient entries near its epsilon.
                assert mine[name] == pytest.approx(value, rel=1e-3, abs=1e-5), (mine["step"], name)
        if mine["step"] == 1:  # the same parameters sample the same tokens: discrete outcomes agree
            for name in ("generated_tokens", "reward/correctness", "reward/format", "truncation_rate"):
                assert mine[name] == theirs[name], name
    for name in ("eval/before_rl.json", "eval/after_rl.json", "results.json", "eval/before_rl.jsonl"):
        assert (runs.two / name).read_text() == (runs.one / name).read_text(), name
    config_one, config_two = (json.loads((w / "config.json").read_text()) for w in (runs.one, runs.two))
    assert config_two.pop("distributed")["num_processes"] == 2 and config_one.pop("distributed")
    assert config_two == config_one
    from safetensors.numpy import load_file

    for part in ("warm_start", "policy"):
        names = sorted(p.name for p in (runs.one / part).iterdir())
        assert sorted(p.name for p in (runs.two / part).iterdir()) == names, part
        for name in names:
            if name != "model.safetensors":
                assert (runs.two / part / name).read_bytes() == (runs.one / part / name).read_bytes(), (part, name)
        expected, got = (load_file(w / part / "model.safetensors") for w in (runs.one, runs.two))
        assert got.keys() == expected.keys()
        for name in expected:
            assert got[name].shape == expected[name].shape and got[name].dtype == expected[name].dtype
            np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=5e-5, err_msg=f"{part}: {name}")


@pytest.mark.slow
def test_two_processes_save_the_rollouts_one_process_saves(runs):
    """Process 0 wrote every step's rollouts, the other process's completions among them (decoded
    from the gathered tokens); step 1 (the same parameters sample the same tokens) equals the one-process
    run's record for record, its advantages within float rounding."""
    for workdir in (runs.one, runs.two):
        assert sorted(p.name for p in (workdir / "rollouts").iterdir()) == [f"step_{s}.jsonl" for s in (1, 2, 3, 4)]
    one, two = (run_dir.read_jsonl(w / "rollouts" / "step_1.jsonl") for w in (runs.one, runs.two))
    assert len(two) == 32 and all(r["completion"] for r in two)
    for mine, theirs in zip(two, one):
        for name in ("rollout", "prompt_index", "row", "prompt", "completion", "rewards", "response_length",
                     "truncated", "keep", "conflict"):
            assert mine[name] == theirs[name], (mine["rollout"], name)
        for name in ("advantage", "snr", "query_weight"):
            assert mine[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-6), (mine["rollout"], name)


@pytest.mark.slow
def test_process_0_logs_and_writes_for_all(runs):
    p0, p1 = runs.rerun_logs
    assert "process 0 of 2 on " in p0 and "1 local device, 2 in all (cpu)" in p0
    assert "process 1 of 2 on " in p1
    info = [line for line in p1.splitlines() if line.startswith("INFO")]
    assert len(info) == 1 and "process 1 of 2" in info[0], info  # then warnings and errors only
    assert "RL (gd2po_snr)" in p0 and "RL (gd2po_snr)" not in p1  # the progress bar
    assert (runs.two / "warm_start_logs" / "metrics.jsonl").is_file()
    assert not (runs.two / ".lock").exists() and not list(runs.two.glob("*.tmp-*"))


# ----------------------------------------------------------------------------------------------
# A LoRA run on two processes.
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_lora_run_on_two_processes_equals_one_process(tmp_path):
    """model.lora on fsdp over two processes (each holds half of the base and of the adapters): the
    metrics, the exported adapter (gathered by process 0) and the merged policy are those of one
    process with 2 devices, within float rounding; process 0 alone writes policy_adapter/."""
    from safetensors.numpy import load_file

    # No warm start (RL on the base model), 2 steps, no evaluation: the LoRA paths alone.
    config_file = write_config_file(tmp_path, **dict(MINI, model__lora__rank=4, model__lora__alpha=8,
                                                     mesh__data=1, mesh__fsdp=2, eval__split="none",
                                                     logging__rollouts_every=0, sft__enabled=False,
                                                     train__num_steps=2))
    cache = tmp_path / "xla_cache"
    one, two = tmp_path / "one", tmp_path / "two"
    reference = start(train_command(one, config_file), process_env(cache, 2), tmp_path / "one.log")
    pair = start_pair(train_command(two, config_file), process_env(cache, 1), tmp_path / "two")
    succeed([reference], [tmp_path / "one.log"])
    succeed(pair, logs_of(tmp_path / "two"))
    first, second = read_metrics(one), read_metrics(two)
    assert [r["step"] for r in second] == [1, 2]
    for mine, theirs in zip(second, first):
        for name, value in theirs.items():
            if not name.startswith(VOLATILE):
                assert mine[name] == pytest.approx(value, rel=1e-3, abs=1e-5), (mine["step"], name)
    for part, file in (("policy_adapter", "adapter_model.safetensors"), ("policy", "model.safetensors")):
        expected, got = (load_file(w / part / file) for w in (one, two))
        assert got.keys() == expected.keys() and expected
        for name in expected:
            np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=5e-5, err_msg=f"{part}: {name}")
    config_one, config_two = (json.loads((w / "policy_adapter" / "adapter_config.json").read_text())
                              for w in (one, two))
    assert config_one.pop("base_model_name_or_path") == str((one / "base_model").absolute())
    assert config_two.pop("base_model_name_or_path") == str((two / "base_model").absolute())
    assert config_one == config_two
