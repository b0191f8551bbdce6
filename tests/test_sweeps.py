"""gd2po_jax/sweeps.py and sweep.py: the grid, run status, commands, devices, the runner (with
stand-in train.py / eval.py scripts), and one real 2 x 2 sweep that is killed and resumed."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from gd2po_jax import sweeps
from gd2po_jax.sweeps import (
    FAILED,
    FINISHED,
    INTERRUPTED,
    PENDING,
    STARTED,
    TRAINED,
    RunSpec,
    SweepError,
    config_arguments,
    expand_grid,
    method_name,
    parse_method,
    run_status,
    worker_devices,
)
from test_trainer import REPO, tiny_config, write_config_file

# ----------------------------------------------------------------------------------------------
# The grid.
# ----------------------------------------------------------------------------------------------


def test_grid_is_seed_major_and_tau_multiplies_snr_only():
    specs = expand_grid(["grpo", "gdpo", "gd2po_hard", "gd2po_snr"], ["0.2", "0.5", "0.8"], ["0", "1", "2", "3", "4"])
    assert len(specs) == (3 + 3) * 5
    assert [s.name for s in specs[:6]] == ["grpo/seed0", "gdpo/seed0", "gd2po_hard/seed0", "gd2po_snr-tau0.2/seed0",
                                           "gd2po_snr-tau0.5/seed0", "gd2po_snr-tau0.8/seed0"]
    assert specs[-1] == RunSpec("gd2po_snr", 4, 0.8)
    assert len({s.name for s in specs}) == len(specs)
    assert all(s.snr_tau is None for s in specs if s.algorithm != "gd2po_snr")


def test_run_names_overrides_and_workdirs(tmp_path):
    snr = RunSpec("gd2po_snr", 3, 0.5)
    assert snr.name == "gd2po_snr-tau0.5/seed3"
    assert snr.overrides() == ["--config.rl.algorithm=gd2po_snr", "--config.rl.snr_tau=0.5", "--config.train.seed=3"]
    assert RunSpec("gdpo", 0).overrides() == ["--config.rl.algorithm=gdpo", "--config.train.seed=0"]
    assert sweeps.run_dir(tmp_path, snr) == tmp_path / "runs" / "gd2po_snr-tau0.5" / "seed3"
    config = snr.apply(tiny_config())
    assert (config.rl.algorithm, config.rl.snr_tau, config.train.seed) == ("gd2po_snr", 0.5, 3)
    for algorithm, tau in [("gdpo", None), ("gd2po_snr", 0.25), ("gd2po_snr", 1.0), ("gd2po_snr", 0.0)]:
        assert parse_method(method_name(algorithm, tau)) == (algorithm, tau)
    assert method_name("gd2po_snr", 1.0) == "gd2po_snr-tau1"


@pytest.mark.parametrize("algorithms, taus, seeds, flag", [
    (["ppo"], [], ["0"], "--algorithms: 'ppo'"),
    ([], [], ["0"], "--algorithms"),
    (["gdpo", "gdpo"], [], ["0"], "--algorithms: .* duplicates"),
    (["gd2po_snr"], [], ["0"], "--snr_taus: gd2po_snr needs"),
    (["gd2po_snr"], ["1.5"], ["0"], "--snr_taus: 1.5 is outside"),
    (["gd2po_snr"], ["half"], ["0"], "--snr_taus: 'half'"),
    (["gdpo"], [], ["-1"], "--seeds"),
    (["gdpo"], [], [], "--seeds"),
])
def test_bad_grids_name_the_flag(algorithms, taus, seeds, flag):
    with pytest.raises(SweepError, match=flag):
        expand_grid(algorithms, taus, seeds)


def test_run_status_from_the_files_a_run_leaves(tmp_path):
    workdir = tmp_path / "run"
    assert run_status(workdir) == PENDING
    workdir.mkdir()
    (workdir / "log.txt").write_text("")
    assert run_status(workdir) == PENDING  # train.py never got to write its config
    (workdir / "config.json").write_text("{}")
    assert run_status(workdir) == STARTED
    (workdir / "results.json").write_text("{}")
    assert run_status(workdir) == TRAINED
    (workdir / "eval").mkdir()
    (workdir / "eval" / "test.json").write_text("{}")
    assert run_status(workdir) == FINISHED


# ----------------------------------------------------------------------------------------------
# Command lines.
# ----------------------------------------------------------------------------------------------


def test_config_arguments_forward_every_override_form():
    config = tiny_config()
    argv = ["--sweep_dir=/x", "--config", "configs/toolrl.py:qwen2.5-3b", "--config.train.num_steps=3",
            "--config.sampling.top_p", "0.9", "--config.sft.enabled", "--noconfig.rl.drop_zero_variance_groups",
            "--config.rl.clip_low", "-0.0", "--seeds=0,1"]
    config_arg, overrides = config_arguments(argv, config)
    assert config_arg == "configs/toolrl.py:qwen2.5-3b"
    assert overrides == ["--config.train.num_steps=3", "--config.sampling.top_p=0.9", "--config.sft.enabled",
                         "--noconfig.rl.drop_zero_variance_groups", "--config.rl.clip_low=-0.0"]
    assert sweeps.override_names(overrides) == ["train.num_steps", "sampling.top_p", "sft.enabled",
                                                "rl.drop_zero_variance_groups", "rl.clip_low"]
    assert config_arguments(["--sweep_dir=/x"], config) == ("configs/default.py", [])


def test_config_file_is_made_absolute_keeping_its_argument(tmp_path):
    assert sweeps.resolve_config_arg("configs/toolrl.py:qwen2.5-3b", REPO) == f"{REPO}/configs/toolrl.py:qwen2.5-3b"
    assert sweeps.resolve_config_arg("missing.py", tmp_path) == "missing.py"


def plan(tmp_path, config=None, overrides=(), **kwargs):
    kwargs = {"algorithms": ["gdpo", "gd2po_snr"], "snr_taus": ["0.5"], "seeds": ["0", "1"], "gpus": [], **kwargs}
    return sweeps.plan_sweep(tmp_path / "sweep", config=config or tiny_config(), config_arg="cfg.py",
                             overrides=list(overrides), **kwargs)


def test_plan_shares_the_warm_start_and_validates_every_run(tmp_path):
    sweep = plan(tmp_path, overrides=["--config.train.num_steps=3"])
    cache = tmp_path / "sweep" / "warm_starts"
    assert sweep.config.sft.cache_dir == str(cache)
    command = sweep.commands.train(sweep.specs[1], sweep.workdir(sweep.specs[1]))
    assert command[1:] == [str(REPO / "train.py"), "--config=cfg.py",
                           f"--workdir={tmp_path}/sweep/runs/gd2po_snr-tau0.5/seed0", "--config.train.num_steps=3",
                           f"--config.sft.cache_dir={cache}", "--config.rl.algorithm=gd2po_snr",
                           "--config.rl.snr_tau=0.5", "--config.train.seed=0"]
    assert sweeps.Commands("c").evaluate(pathlib.Path("/w"))[1:] == [str(REPO / "eval.py"), "--workdir=/w",
                                                                     "--split=test"]
    assert sweep.grid == {"algorithms": ["gdpo", "gd2po_snr"], "snr_taus": [0.5], "seeds": [0, 1]}
    assert sweep.devices == [None]
    own = tiny_config(sft__cache_dir="/shared/ws")
    assert plan(tmp_path, config=own).commands.overrides == ()  # the config's own cache is kept
    assert plan(tmp_path, config=tiny_config(sft__enabled=False)).commands.overrides == ()


@pytest.mark.parametrize("override, message", [
    ("--config.rl.algorithm=grpo", "--config.rl.algorithm: the sweep sets it for each run; use --algorithms"),
    ("--config.train.seed=3", "use --seeds"),
    ("--config.rl.snr_tau=0.1", "use --snr_taus"),
])
def test_plan_refuses_overrides_of_swept_fields(tmp_path, override, message):
    with pytest.raises(SweepError, match=message):
        plan(tmp_path, overrides=[override])


def test_plan_names_the_run_and_field_of_an_invalid_config(tmp_path):
    with pytest.raises(SweepError, match=r"run gdpo/seed0: config\.rl\.num_generations"):
        plan(tmp_path, config=tiny_config(rl__num_generations=1))
    with pytest.raises(SweepError, match=r"config\.data\.test is empty"):
        plan(tmp_path, config=tiny_config(task="files", data__train="x.parquet", model__path="/m"))


def test_plan_refuses_to_continue_runs_started_with_other_arguments(tmp_path):
    sweep = plan(tmp_path, overrides=["--config.train.num_steps=3"])
    workdir = sweep.workdir(sweep.specs[0])
    workdir.mkdir(parents=True)
    command = sweep.commands.train(sweep.specs[0], workdir)
    line = sweeps.command_line(["/other/python", *command[1:]], {"A": "1"}, cwd=pathlib.Path("/a dir"))
    assert line.startswith("cd '/a dir' && A=1 /other/python ")
    (workdir / "command.txt").write_text(line + "\n")
    plan(tmp_path, overrides=["--config.train.num_steps=3"])  # same arguments, other interpreter: fine
    with pytest.raises(SweepError, match=rf"{workdir}/command.txt: this run was started with other arguments"):
        plan(tmp_path, overrides=["--config.train.num_steps=4"])


# ----------------------------------------------------------------------------------------------
# Devices.
# ----------------------------------------------------------------------------------------------


def test_devices_one_gpu_per_worker():
    assert sweeps.parse_gpu_list("GPU 0: NVIDIA H100 (UUID: x)\nGPU 1: NVIDIA H100 (UUID: y)\n") == ["0", "1"]
    assert sweeps.visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 5"}) == ["2", "5"]
    assert sweeps.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert worker_devices(0, []) == [None]  # CPU: sequential by default
    assert worker_devices(3, []) == [None, None, None]
    assert worker_devices(0, ["2", "5"]) == ["2", "5"]
    assert worker_devices(1, ["2", "5"]) == ["2"]
    with pytest.raises(SweepError, match=r"--parallel=3: only 2 GPUs"):
        worker_devices(3, ["2", "5"])
    with pytest.raises(SweepError, match="--parallel"):
        worker_devices(-1, [])
    assert sweeps.device_env("5") == {"CUDA_VISIBLE_DEVICES": "5"} and sweeps.device_env(None) == {}


# ----------------------------------------------------------------------------------------------
# The runner, with stand-in scripts (no JAX in the runs: seconds, not minutes).
# ----------------------------------------------------------------------------------------------

FAKE_TRAIN = """
    import json, os, pathlib, sys, time
    args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    workdir = pathlib.Path(args["--workdir"])
    workdir.mkdir(parents=True, exist_ok=True)
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps({"workdir": str(workdir), "warm_start_only": "--warm_start_only" in sys.argv,
                              "device": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": time.time()}) + "\\n")
    if "--warm_start_only" in sys.argv:
        if os.environ.get("FAKE_FAIL_WARM"):
            sys.exit("no warm start today")
        time.sleep(0.3)
        pathlib.Path(args["--config.sft.cache_dir"]).mkdir(parents=True, exist_ok=True)
        sys.exit(0)
    cache = args.get("--config.sft.cache_dir")
    assert cache is None or pathlib.Path(cache).is_dir(), "the warm start was not built first"
    (workdir / "config.json").write_text(json.dumps(args))
    if args["--config.train.seed"] == os.environ.get("FAKE_FAIL_SEED"):
        sys.exit("boom: this run fails")
    time.sleep(float(os.environ.get("FAKE_SECONDS", "0.2")))
    (workdir / "results.json").write_text("{}")
"""
FAKE_EVAL = """
    import pathlib, sys
    args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    assert args["--split"] == "test"
    (pathlib.Path(args["--workdir"]) / "eval").mkdir(exist_ok=True)
    (pathlib.Path(args["--workdir"]) / "eval" / "test.json").write_text("{}")
"""


@pytest.fixture
def fake_repo(tmp_path) -> pathlib.Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text(textwrap.dedent(FAKE_TRAIN))
    (repo / "eval.py").write_text(textwrap.dedent(FAKE_EVAL))
    return repo


def fake_env(tmp_path, **extra) -> dict[str, str]:
    return {**os.environ, "FAKE_LOG": str(tmp_path / "calls.jsonl"), **extra}


def calls(tmp_path) -> list[dict]:
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_runner_builds_the_warm_start_first_reports_failures_and_resumes(tmp_path, fake_repo, capsys):
    sweep = plan(tmp_path, config=tiny_config(sft__cache_dir=str(tmp_path / "cache")), repo=fake_repo,
                 parallel=2, overrides=["--config.sft.cache_dir=" + str(tmp_path / "cache")])
    assert len(sweep.specs) == 4 and sweep.devices == [None, None]
    outcomes = sweeps.run_sweep(sweep, env=fake_env(tmp_path, FAKE_FAIL_SEED="1"), progress=False)
    first = calls(tmp_path)
    assert first[0]["warm_start_only"] and not any(c["warm_start_only"] for c in first[1:])
    assert len(first) == 5
    statuses = {name: o.status for name, o in outcomes.items()}
    assert statuses == {"gdpo/seed0": FINISHED, "gd2po_snr-tau0.5/seed0": FINISHED,
                        "gdpo/seed1": FAILED, "gd2po_snr-tau0.5/seed1": FAILED}
    failed = outcomes["gdpo/seed1"]
    assert failed.log == sweep.sweep_dir / "runs" / "gdpo" / "seed1" / "log.txt"
    assert "boom: this run fails" in failed.log.read_text()
    lines, status = sweeps.summary_lines(outcomes)
    assert status == 1 and lines[0] == "sweep: 2 failed, 2 finished"
    assert f"  failed gdpo/seed1 (exit code 1): {failed.log}" in lines
    record = json.loads((sweep.sweep_dir / "sweep.json").read_text())
    assert [(r["name"], r["status"]) for r in record["runs"]] == [
        ("gdpo/seed0", FINISHED), ("gd2po_snr-tau0.5/seed0", FINISHED), ("gdpo/seed1", FAILED),
        ("gd2po_snr-tau0.5/seed1", FAILED)]
    assert record["runs"][2]["log"] == str(failed.log) and record["runs"][2]["returncode"] == 1
    assert record["base_config"]["rl"]["num_generations"] == 4 and record["grid"]["seeds"] == [0, 1]
    workdir = sweep.workdir(sweep.specs[1])
    train_line, eval_line = (workdir / "command.txt").read_text().splitlines()
    assert train_line.endswith("--config.rl.algorithm=gd2po_snr --config.rl.snr_tau=0.5 --config.train.seed=0")
    assert eval_line.endswith(f"eval.py --workdir={workdir} --split=test")
    assert train_line.startswith(f"cd {pathlib.Path.cwd()} && {sys.executable} ")  # runnable as it is

    # Resume: finished runs are not touched, failed ones run again (the warm start exists, but the
    # stand-in cannot tell: sweep.py only skips the build when the real warm start is there).
    finished = {s.name: (sweep.workdir(s) / "results.json").stat().st_mtime_ns for s in sweep.specs[:2]}
    outcomes = sweeps.run_sweep(sweep, env=fake_env(tmp_path), progress=False)
    assert all(o.status == FINISHED for o in outcomes.values())
    assert finished == {s.name: (sweep.workdir(s) / "results.json").stat().st_mtime_ns for s in sweep.specs[:2]}
    retried = [c["workdir"] for c in calls(tmp_path)[len(first):] if not c["warm_start_only"]]
    assert sorted(retried) == sorted(str(sweep.workdir(s)) for s in sweep.specs[2:])
    assert sweeps.summary_lines(outcomes) == (["sweep: 4 finished"], 0)


def test_a_failed_warm_start_build_starts_no_run_and_is_reported(tmp_path, fake_repo):
    sweep = plan(tmp_path, repo=fake_repo)
    outcomes = sweeps.run_sweep(sweep, env=fake_env(tmp_path, FAKE_FAIL_WARM="1"), progress=False)
    assert len(calls(tmp_path)) == 1  # the build only
    build_log = sweep.sweep_dir / "warm_start_build" / "log.txt"
    assert "no warm start today" in build_log.read_text()
    lines, status = sweeps.summary_lines(outcomes)
    assert status == 1
    assert f"  failed warm start (exit code 1): {build_log}" in lines
    assert "  pending gdpo/seed0 (not run: the warm start failed)" in lines
    record = json.loads((sweep.sweep_dir / "sweep.json").read_text())
    assert record["warm_start"]["build_status"] == FAILED and record["warm_start"]["build_log"] == str(build_log)
    assert {r["status"] for r in record["runs"]} == {PENDING}


def test_runner_pins_each_parallel_run_to_its_own_gpu(tmp_path, fake_repo):
    sweep = plan(tmp_path, config=tiny_config(sft__enabled=False), repo=fake_repo, parallel=2, gpus=["3", "5"],
                 seeds=["0", "1", "2"], algorithms=["gdpo"])
    outcomes = sweeps.run_sweep(sweep, env=fake_env(tmp_path, FAKE_SECONDS="0.5"), progress=False)
    assert all(o.status == FINISHED for o in outcomes.values())
    runs = calls(tmp_path)
    assert sorted(c["device"] for c in runs) in (["3", "3", "5"], ["3", "5", "5"])
    starts = sorted(c["start"] for c in runs)
    assert starts[1] - starts[0] < 0.4  # two at once
    log = (sweep.workdir(sweep.specs[0]) / "log.txt").read_text()
    assert "CUDA_VISIBLE_DEVICES=" in log  # the log says which GPU


def test_an_interrupted_sweep_stops_its_runs_and_records_them(tmp_path, fake_repo):
    sweep = plan(tmp_path, config=tiny_config(sft__enabled=False), repo=fake_repo, algorithms=["gdpo"],
                 seeds=["0", "1", "2"])
    env = fake_env(tmp_path, FAKE_SECONDS="60")

    def interrupt_when_a_run_started():
        deadline = time.monotonic() + 30
        while not calls(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    # Python's own Ctrl-C handler, whatever a library imported earlier in the session installed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_when_a_run_started, daemon=True).start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            sweeps.run_sweep(sweep, env=env, progress=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 30  # the 60 s run was terminated
    record = json.loads((sweep.sweep_dir / "sweep.json").read_text())
    assert [r["status"] for r in record["runs"]] == [INTERRUPTED, PENDING, PENDING]
    assert len(calls(tmp_path)) == 1


# ----------------------------------------------------------------------------------------------
# A real sweep: 2 algorithms x 2 seeds of tiny runs, killed after its first run, then resumed.
# ----------------------------------------------------------------------------------------------

TINY_SWEEP = {
    "train__num_steps": 2, "train__prompts_per_step": 4, "rl__num_generations": 2, "sft__num_steps": 5,
    "sft__batch_size": 8, "sampling__max_new_tokens": 24, "eval__max_examples": 8, "eval__batch_size": 8,
    "eval__split": "none",  # no validation inside train.py: the sweep evaluates on test with eval.py
    "data__synthetic__num_train": 32, "data__synthetic__num_validation": 8, "checkpoint__every_steps": 1,
}


@pytest.mark.slow
def test_a_killed_sweep_resumes_without_redoing_finished_runs(tmp_path):
    config_file = write_config_file(tmp_path, **TINY_SWEEP)
    sweep_dir = tmp_path / "sweep"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device per run
    env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    command = [sys.executable, str(REPO / "sweep.py"), f"--config={config_file}", f"--sweep_dir={sweep_dir}",
               "--algorithms=gdpo,gd2po_hard", "--seeds=0,1", "--config.train.learning_rate=0.002"]
    runs = [sweep_dir / "runs" / m / f"seed{s}" for s in (0, 1) for m in ("gdpo", "gd2po_hard")]

    with (tmp_path / "sweep1.log").open("w") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + 600
        while not (run_status(runs[0]) == FINISHED and run_status(runs[1]) != PENDING):
            assert proc.poll() is None, (tmp_path / "sweep1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first run did not finish in 600 s"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its train.py, as a crash would
        proc.wait()
    assert run_status(runs[1]) == STARTED and run_status(runs[3]) == PENDING
    first_done = (runs[0] / "results.json").stat().st_mtime_ns, (runs[0] / "eval" / "test.json").stat().st_mtime_ns
    warm_starts = list((sweep_dir / "warm_starts").iterdir())
    assert len(warm_starts) == 1 and (warm_starts[0] / "model.safetensors").is_file()

    second = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert all(run_status(run) == FINISHED for run in runs)
    assert ((runs[0] / "results.json").stat().st_mtime_ns,
            (runs[0] / "eval" / "test.json").stat().st_mtime_ns) == first_done
    assert "sweep: 4 finished" in second.stdout
    assert list((sweep_dir / "warm_starts").iterdir()) == warm_starts  # trained once, shared
    assert not any((run / "warm_start").exists() for run in runs)
    assert not any((run / "warm_start_logs").exists() for run in runs)  # no run trained its own
    assert (sweep_dir / "warm_start_build" / "warm_start_logs" / "metrics.jsonl").is_file()
    for run, (algorithm, seed) in zip(runs, [("gdpo", 0), ("gd2po_hard", 0), ("gdpo", 1), ("gd2po_hard", 1)]):
        config = json.loads((run / "config.json").read_text())
        assert (config["rl"]["algorithm"], config["train"]["seed"]) == (algorithm, seed)
        assert config["sft"]["cache_dir"] == str(sweep_dir / "warm_starts")
        assert config["train"]["learning_rate"] == 0.002  # the user's override reached every run
        assert "--config.train.learning_rate=0.002" in (run / "command.txt").read_text()
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert [r["status"] for r in record["runs"]] == [FINISHED] * 4
    assert record["warm_start"]["path"] == str(warm_starts[0])
    assert (sweep_dir / "report" / "summary.md").is_file() and (sweep_dir / "report" / "learning_curves.png").is_file()
    assert "| gd2po_hard | 2 |" in (sweep_dir / "report" / "summary.md").read_text()
