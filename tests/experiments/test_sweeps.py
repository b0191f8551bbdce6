"""gd2po_jax/experiments/sweeps.py and sweep.py: the grid, run status, resolved run configs, commands, devices,
the runner (with stand-in train.py / eval.py scripts), and one real 2 x 2 sweep that is killed and
resumed."""

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

from gd2po_jax.experiments import study, sweeps
from gd2po_jax.experiments.sweeps import (
    FAILED,
    FINISHED,
    INTERRUPTED,
    PENDING,
    STARTED,
    TRAINED,
    RunSpec,
    SweepError,
    expand_grid,
    method_name,
    parse_method,
    run_status,
    worker_devices,
)
from gd2po_jax.runtime.metrics_logging import read_metrics
from tests.fakes import REPO, as_run_config, subprocess_env, tiny_config
from tests.xla_env import xla_flags

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


def test_grid_of_the_snr_halves_needs_no_threshold():
    """The paper's Table 6 check: GDPO and the two SNR halves, no --snr_taus."""
    specs = expand_grid(["gdpo", "low_conflict_half", "high_conflict_half"], [], ["0", "1"])
    assert [s.name for s in specs] == ["gdpo/seed0", "low_conflict_half/seed0", "high_conflict_half/seed0",
                                       "gdpo/seed1", "low_conflict_half/seed1", "high_conflict_half/seed1"]
    assert all(s.snr_tau is None for s in specs)
    for spec in specs:
        assert parse_method(spec.method) == (spec.algorithm, None)
    config = RunSpec("high_conflict_half", 2).apply(as_run_config(tiny_config()))
    assert (config.rl.algorithm, config.train.seed) == ("high_conflict_half", 2)
    assert as_run_config(config).rl.algorithm == "high_conflict_half"  # the run config validates it


def test_run_names_configs_and_workdirs(tmp_path):
    snr = RunSpec("gd2po_snr", 3, 0.5)
    assert snr.name == "gd2po_snr-tau0.5/seed3"
    assert sweeps.run_workdir(tmp_path, snr) == tmp_path / "runs" / "gd2po_snr-tau0.5" / "seed3"
    config = snr.apply(as_run_config(tiny_config()))
    assert (config.rl.algorithm, config.rl.snr_tau, config.train.seed) == ("gd2po_snr", 0.5, 3)
    config = RunSpec("gdpo", 1).apply(as_run_config(tiny_config(rl__snr_tau=0.3)))
    assert (config.rl.algorithm, config.rl.snr_tau, config.train.seed) == ("gdpo", 0.3, 1)  # tau untouched
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
    (workdir / "eval" / "test.json").write_text('{"split": "te')  # cut short: not evaluated
    assert run_status(workdir) == TRAINED
    (workdir / "eval" / "test.json").write_text("{}")
    assert run_status(workdir) == FINISHED


# ----------------------------------------------------------------------------------------------
# Command lines.
# ----------------------------------------------------------------------------------------------


def plan(tmp_path, config=None, overrides=None, **kwargs):
    kwargs = {"algorithms": ["gdpo", "gd2po_snr"], "snr_taus": ["0.5"], "seeds": ["0", "1"], "gpus": [], **kwargs}
    return sweeps.plan_sweep(tmp_path / "sweep", config=as_run_config(config or tiny_config()), config_file="cfg.py",
                             overrides=overrides or {}, **kwargs)


def test_plan_shares_the_warm_start_and_resolves_each_run_config(tmp_path):
    sweep = plan(tmp_path, config=tiny_config(train__num_steps=3), overrides={"train.num_steps": 3})
    cache = tmp_path / "sweep" / "warm_starts"
    assert sweep.config.sft.cache_dir == str(cache)
    spec = sweep.specs[1]
    config = sweep.run_config(spec)
    assert (config.rl.algorithm, config.rl.snr_tau, config.train.seed) == ("gd2po_snr", 0.5, 0)
    assert config.train.num_steps == 3 and config.sft.cache_dir == str(cache)
    workdir = tmp_path / "sweep" / "runs" / "gd2po_snr-tau0.5" / "seed0"
    assert sweep.commands.train(workdir)[1:] == [
        str(REPO / "train.py"), f"--config={REPO / 'configs' / 'resolved.py'}:{workdir / 'config.json'}",
        f"--workdir={workdir}"]
    assert sweeps.Commands().evaluate(pathlib.Path("/w"))[1:] == [str(REPO / "eval.py"), "--workdir=/w",
                                                                  "--split=test", "--trust_workdir_code"]
    assert sweep.grid == {"algorithms": ["gdpo", "gd2po_snr"], "snr_taus": [0.5], "seeds": [0, 1]}
    assert sweep.devices == [None]
    assert not (tmp_path / "sweep").exists()  # planning writes nothing
    own = tiny_config(sft__cache_dir="/shared/ws")
    assert plan(tmp_path, config=own).run_config(spec).sft.cache_dir == "/shared/ws"  # the config's own is kept
    assert plan(tmp_path, config=tiny_config(sft__enabled=False)).config.sft.cache_dir == ""


def test_configs_resolved_py_loads_a_run_config(tmp_path):
    import importlib.util

    from gd2po_jax.runtime import run_dir

    run_dir.write_config(tmp_path, tiny_config(rl__algorithm="gdpo", train__seed=4))
    spec = importlib.util.spec_from_file_location("resolved", REPO / "configs" / "resolved.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(str(tmp_path / "config.json"))
    assert (config.rl.algorithm, config.train.seed, config.model.tiny.hidden_size) == ("gdpo", 4, 64)


@pytest.mark.parametrize("override, message", [
    ("rl.algorithm", "--config.rl.algorithm: the sweep sets it for each run; use --algorithms"),
    ("train.seed", "use --seeds"),
    ("rl.snr_tau", "use --snr_taus"),
])
def test_plan_refuses_overrides_of_swept_fields(tmp_path, override, message):
    with pytest.raises(SweepError, match=message):
        plan(tmp_path, overrides={override: 1})


def test_sweep_command_takes_the_overrides_ml_collections_parsed(tmp_path):
    # The space-separated form is an override like any other: the sweep sees it and refuses it.
    done = subprocess.run([sys.executable, str(REPO / "sweep.py"), f"--sweep_dir={tmp_path}", "--config.train.seed",
                           "3"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "sweep.py: --config.train.seed: the sweep sets it for each run; use --seeds")


def test_an_invalid_config_is_one_line_naming_the_field(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "sweep.py"), f"--sweep_dir={tmp_path}",
                           "--config.rl.num_generations=1"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=subprocess_env())
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("sweep.py: config.rl.num_generations: must be an integer")


def test_plan_names_the_field_a_sweep_needs(tmp_path):
    with pytest.raises(SweepError, match=r"config\.data\.test gives no test rows: the sweep evaluates every run"):
        plan(tmp_path, config=tiny_config(task="files", data__train="x.parquet", model__path="/m"))
    with pytest.raises(SweepError, match=r"config\.data\.synthetic\.num_test gives no test rows"):
        plan(tmp_path, config=tiny_config(data__synthetic__num_test=0))
    with pytest.raises(SweepError, match=r"config\.task: 'web' is not a registered task"):
        plan(tmp_path, config=tiny_config(task="web"))


def test_plan_refuses_to_continue_runs_started_with_another_config(tmp_path):
    from gd2po_jax.runtime import run_dir

    sweep = plan(tmp_path, config=tiny_config(train__num_steps=3))
    workdir = sweep.workdir(sweep.specs[0])
    workdir.mkdir(parents=True)
    run_dir.write_config(workdir, sweep.run_config(sweep.specs[0]))
    plan(tmp_path, config=tiny_config(train__num_steps=3))  # the same config: fine
    with pytest.raises(SweepError, match=rf"{workdir}/config.json: this run was started with other values of "
                                         r"train\.num_steps \(was 3, now 4\)\. Use a new --sweep_dir"):
        plan(tmp_path, config=tiny_config(train__num_steps=4))
    # A config.json written before sampling.prompts_per_call existed is the same run.
    old = json.loads((workdir / "config.json").read_text())
    del old["sampling"]["prompts_per_call"]
    (workdir / "config.json").write_text(json.dumps(old))
    plan(tmp_path, config=tiny_config(train__num_steps=3))


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
    assert args["--config"].split(":", 1)[0].endswith("configs/resolved.py")
    config = json.loads(pathlib.Path(args["--config"].split(":", 1)[1]).read_text())
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps({"workdir": str(workdir), "warm_start_only": "--warm_start_only" in sys.argv,
                              "device": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": time.time()}) + "\\n")
    if "--warm_start_only" in sys.argv:
        if os.environ.get("FAKE_FAIL_WARM"):
            sys.exit("no warm start today")
        time.sleep(0.3)
        pathlib.Path(config["sft"]["cache_dir"]).mkdir(parents=True, exist_ok=True)
        sys.exit(0)
    cache = config["sft"]["cache_dir"] if config["sft"]["enabled"] and not os.environ.get("FAKE_NO_TARGETS") else None
    assert cache is None or pathlib.Path(cache).is_dir(), "the warm start was not built first"
    if str(config["train"]["seed"]) == os.environ.get("FAKE_FAIL_SEED"):
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
                 parallel=2, overrides={"sft.cache_dir": str(tmp_path / "cache")})
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
    assert record["config_file"] == "cfg.py" and record["overrides"] == {"sft.cache_dir": str(tmp_path / "cache")}
    workdir = sweep.workdir(sweep.specs[1])
    config = json.loads((workdir / "config.json").read_text())  # what train.py was launched from
    assert (config["rl"]["algorithm"], config["rl"]["snr_tau"], config["train"]["seed"]) == ("gd2po_snr", 0.5, 0)
    assert json.loads((sweep.sweep_dir / "warm_start_build" / "config.json").read_text()) == record["base_config"]
    train_line, eval_line = (workdir / "command.txt").read_text().splitlines()
    assert train_line.endswith(f"configs/resolved.py:{workdir}/config.json --workdir={workdir}")
    assert eval_line.endswith(f"eval.py --workdir={workdir} --split=test --trust_workdir_code")
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


def own_task_config(tmp_path, *, targets: bool):
    """configs/files.py on a JSONL of the user's own columns (``answer``; a ``target`` only if ``targets``)
    and the example's two TRL-form functions: sft.enabled and sft.only_with_targets as the file sets them."""
    from configs import files

    rows = [{"prompt": f"Say {n}.", "answer": str(n), **({"target": str(n)} if targets else {})} for n in range(6)]
    data = tmp_path / ("with_targets.jsonl" if targets else "prompts.jsonl")
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = files.get_config()
    config.model.path, config.data.train, config.data.test = "tiny_model", str(data), str(data)
    rewards = REPO / "examples" / "own_task" / "rewards.py"
    config.rewards.functions = (f"{rewards}:brevity", f"{rewards}:digits")
    return config


def test_a_sweep_of_data_without_targets_builds_no_warm_start_as_train_py(tmp_path, fake_repo, capsys):
    """configs/files.py (sft.only_with_targets) on data without a target column: train.py runs such a run
    without a warm start, so the sweep builds none and every run goes ahead (it used to fail them all)."""
    sweep = plan(tmp_path, config=own_task_config(tmp_path, targets=False), repo=fake_repo)
    assert sweep.config.sft.enabled and not sweep.warm_start
    outcomes = sweeps.run_sweep(sweep, env=fake_env(tmp_path, FAKE_NO_TARGETS="1"), progress=False)
    assert {o.status for o in outcomes.values()} == {FINISHED}
    assert not any(c["warm_start_only"] for c in calls(tmp_path)) and len(calls(tmp_path)) == 4
    record = json.loads((sweep.sweep_dir / "sweep.json").read_text())
    assert record["warm_start"]["enabled"] is False
    assert "--config.sft.enabled=False" in record["warm_start"]["reason"]
    assert record["test_metrics"] == [["test/brevity", "brevity"], ["test/digits", "digits"], ["test/reward_sum", "sum"]]
    # With targets, the same config builds the shared warm start first, as train.py would train one.
    assert plan(tmp_path / "b", config=own_task_config(tmp_path, targets=True), repo=fake_repo).warm_start


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

TINY_SWEEP = [  # on top of configs/tiny.py, as command-line overrides of sweep.py
    "--config.train.num_steps=2", "--config.train.prompts_per_step=4", "--config.rl.num_generations=2",
    "--config.sft.num_steps=5", "--config.sft.batch_size=8", "--config.sampling.max_new_tokens=24",
    "--config.eval.max_examples=8", "--config.eval.batch_size=8",
    "--config.eval.split=none",  # no validation inside train.py: the sweep evaluates on test with eval.py
    "--config.data.synthetic.num_train=32", "--config.data.synthetic.num_validation=8",
    "--config.checkpoint.every_steps", "1",  # the space-separated form reaches the runs too
]


@pytest.mark.slow
def test_a_killed_sweep_resumes_without_redoing_finished_runs(tmp_path):
    sweep_dir = tmp_path / "sweep"
    env = subprocess_env(XLA_FLAGS=xla_flags(1), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")  # 1 device a run
    command = [sys.executable, str(REPO / "sweep.py"), "--config=configs/tiny.py", f"--sweep_dir={sweep_dir}",
               "--algorithms=gdpo,gd2po_hard", "--seeds=0,1", "--config.train.learning_rate=0.002", *TINY_SWEEP]
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
        assert config["train"]["learning_rate"] == 0.002  # the user's overrides reached every run
        assert config["checkpoint"]["every_steps"] == 1
        assert f"resolved.py:{run / 'config.json'}" in (run / "command.txt").read_text()
        assert len(read_metrics(run)) == 2
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert record["overrides"]["train.learning_rate"] == 0.002
    assert [r["status"] for r in record["runs"]] == [FINISHED] * 4
    assert record["warm_start"]["path"] == str(warm_starts[0])
    assert (sweep_dir / "report" / "summary.md").is_file() and (sweep_dir / "report" / "learning_curves.png").is_file()
    assert "| gd2po_hard | 2 |" in (sweep_dir / "report" / "summary.md").read_text()
    # The runs' summaries (report.py --export_summaries, gd2po_jax/experiments/study.py) from real run dirs.
    out = tmp_path / "summaries"
    assert len(study.export_summaries([sweep_dir], out)["written"]) == 4
    summary_file = out / "gd2po_hard" / "sft0-seed1.json"
    text = summary_file.read_text()
    assert len(text) < 6000 and str(tmp_path) not in text
    summary = json.loads(text)
    test = json.loads((runs[3] / "eval" / "test.json").read_text())
    assert summary["test"]["correct_acc"] == test["correct_acc"] and summary["logged_steps"] == 2
    assert summary["setting"]["train.learning_rate"] == 0.002 and summary["rl"]["algorithm"] == "gd2po_hard"
    assert summary["curves"]["advantages/kept_fraction"] == pytest.approx(
        sum(r["advantages/kept_fraction"] for r in read_metrics(runs[3])) / 2)
    loaded, _ = study.load_summaries([out])
    assert sorted(run.label for run in loaded) == [f"{m}/seed{j}" for m in ("gd2po_hard", "gdpo") for j in (0, 1)]
