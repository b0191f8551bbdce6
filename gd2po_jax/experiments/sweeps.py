"""Sweeps: a grid of ordinary training runs (algorithm x SNR threshold x seed), run and evaluated.

``python sweep.py`` runs this. Every run is a plain ``train.py`` run in its own workdir: the sweep
resolves the run's config once (the config file, the user's ``--config.*`` overrides, and the run's
own ``rl.algorithm`` / ``rl.snr_tau`` / ``train.seed``), writes it to the workdir's config.json and
launches ``train.py --config=configs/resolved.py:WORKDIR/config.json``, then evaluates the run on
the test split with ``eval.py``, so a run is reproducible from its workdir alone. The sweep
directory::

    sweep.json                     the grid, the config file, the overrides, the base config, and
                                   each run's status (rewritten as runs finish)
    warm_starts/<key>/             the SFT warm start every run starts from (config.sft.cache_dir)
    warm_start_build/              workdir, command.txt and log.txt of the call that trained it
    runs/<method>/seed<k>/         one train.py workdir per run (config.json, metrics.jsonl,
                                   results.json, eval/test.json ...), plus
        command.txt                the exact train.py and eval.py command lines
        log.txt                    their stdout and stderr (appended on each attempt)
    report/                        summary.md, summary.csv, *.png (`gd2po_jax.experiments.sweep_report`)

A method is the algorithm, with the threshold for GD2PO-SNR: ``gdpo``, ``gd2po_snr-tau0.5``.
Rerunning the same sweep command skips finished runs (results.json and eval/test.json present),
evaluates trained ones, and reruns interrupted or failed ones (train.py resumes from the latest
checkpoint in the workdir by itself). A run whose config.json differs from the config the sweep
resolves for it now (other overrides) is refused, naming the fields that differ.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import queue
import re
import shlex
import subprocess
import sys
import threading
import time
from concurrent import futures
from typing import Any, Callable, Mapping, Sequence, cast

import tqdm

from gd2po_jax.config import ALGORITHMS as METHODS
from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.config.run import redacted
from gd2po_jax.errors import UserError
from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.run_dir import RunDir, RunDirError

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SNR_ALGORITHM = "gd2po_snr"  # the only algorithm with a threshold to sweep
# The fields the sweep sets per run (not user overrides), and the sweep.py flag that sets each.
SWEPT_FIELDS = {"rl.algorithm": "--algorithms", "rl.snr_tau": "--snr_taus", "train.seed": "--seeds"}
TEST_SPLIT = "test"
WARM_START_BUILD = "warm_start_build"  # DIR/warm_start_build: the workdir of the warm start's build
NO_TARGETS = (
    "config.sft.only_with_targets: the SFT data has no row with a target, so the runs start RL from "
    "config.model.path without a warm start (as train.py does; --config.sft.enabled=False says so)"
)
RESOLVED_CONFIG = pathlib.Path("configs") / "resolved.py"  # in the repository: loads a config.json

# Status of a run, from its workdir (`run_status`) or from the attempt in this sweep (`execute_run`).
PENDING = "pending"  # nothing started
STARTED = "started"  # train.py started (interrupted or failed before); it resumes from its checkpoint
TRAINED = "trained"  # results.json, no eval/test.json yet
FINISHED = "finished"  # results.json and eval/test.json
FAILED = "failed"  # train.py or eval.py exited non-zero in this sweep
INTERRUPTED = "interrupted"  # the sweep was stopped while this run was going


class SweepError(UserError, ValueError):
    """A sweep request that cannot work; the message names the flag, field or file to fix."""


# ----------------------------------------------------------------------------------------------
# The grid.
# ----------------------------------------------------------------------------------------------


def method_name(algorithm: str, snr_tau: float | None = None) -> str:
    """``gdpo``; ``gd2po_snr-tau0.5`` for an algorithm with a threshold."""
    return algorithm if snr_tau is None else f"{algorithm}-tau{snr_tau:g}"


def parse_method(method: str) -> tuple[str, float | None]:
    """The inverse of `method_name`: ``"gd2po_snr-tau0.5" -> ("gd2po_snr", 0.5)``."""
    algorithm, sep, tau = method.partition("-tau")
    return (algorithm, float(tau)) if sep else (algorithm, None)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of the grid. ``snr_tau`` is set for GD2PO-SNR only (it is unused by the others)."""

    algorithm: str
    seed: int
    snr_tau: float | None = None

    @property
    def method(self) -> str:
        return method_name(self.algorithm, self.snr_tau)

    @property
    def name(self) -> str:
        """``<method>/seed<k>``: also the run's workdir under ``DIR/runs``."""
        return f"{self.method}/seed{self.seed}"

    def apply(self, config: RunConfig) -> RunConfig:
        """``config`` with this run's algorithm, threshold and seed (validated).

        Raises:
          ConfigError: the resulting config is invalid.
        """
        changes = {"rl.algorithm": self.algorithm, "train.seed": self.seed}
        if self.snr_tau is not None:
            changes["rl.snr_tau"] = self.snr_tau
        return config.replace(changes)


def _parse_list(values: Sequence[Any], flag: str, kind: Callable[[str], Any]) -> list[Any]:
    parsed = []
    for value in values:
        try:
            parsed.append(kind(str(value).strip()))
        except ValueError:
            raise SweepError(f"--{flag}: {value!r} is not a valid {kind.__name__}") from None
    if len(set(parsed)) != len(parsed):
        raise SweepError(f"--{flag}: {list(values)} has duplicates")
    return parsed


def expand_grid(
    algorithms: Sequence[str], snr_taus: Sequence[str | float], seeds: Sequence[str | int]
) -> list[RunSpec]:
    """Every (algorithm, threshold, seed) of the grid, seed-major (all methods of seed 0 first, so
    that an interrupted sweep already has complete seeds to compare). The thresholds multiply
    GD2PO-SNR only.

    Raises:
      SweepError: naming the flag (--algorithms, --snr_taus, --seeds) with a bad value.
    """
    algorithms = _parse_list(algorithms, "algorithms", str)
    if not algorithms:
        raise SweepError("--algorithms: give at least one of " + ",".join(METHODS))
    for algorithm in algorithms:
        if algorithm not in METHODS:
            raise SweepError(f"--algorithms: {algorithm!r} is not one of {','.join(METHODS)}")
    taus = _parse_list(snr_taus, "snr_taus", float)
    if SNR_ALGORITHM in algorithms:
        if not taus:
            raise SweepError(f"--snr_taus: {SNR_ALGORITHM} needs at least one threshold")
        for tau in taus:
            if not 0.0 <= tau <= 1.0:
                raise SweepError(f"--snr_taus: {tau:g} is outside [0, 1]")
    seeds = _parse_list(seeds, "seeds", int)
    if not seeds or min(seeds) < 0:
        raise SweepError(f"--seeds: give one or more integers >= 0, got {list(seeds)}")
    specs = []
    for seed in seeds:
        for algorithm in algorithms:
            for tau in taus if algorithm == SNR_ALGORITHM else [None]:
                specs.append(RunSpec(algorithm, seed, tau))
    return specs


def run_workdir(sweep_dir: pathlib.Path, spec: RunSpec) -> pathlib.Path:
    """``DIR/runs/<method>/seed<k>``."""
    return pathlib.Path(sweep_dir) / "runs" / spec.method / f"seed{spec.seed}"


def evaluated(workdir: pathlib.Path) -> bool:
    """Whether eval.py finished the run's test evaluation: eval/test.json is a JSON object. eval.py
    writes it once, atomically, when it is done; a file that does not read as one (cut short by
    something else) counts as not evaluated, and the run is evaluated again."""
    try:
        report = run_dir.read_json(RunDir(workdir).eval_report(TEST_SPLIT))
    except RunDirError:
        return False
    return isinstance(report, dict)


def run_status(workdir: pathlib.Path) -> str:
    """`FINISHED`, `TRAINED`, `STARTED` or `PENDING`, from the files of the workdir (config.json is
    written when the sweep launches train.py)."""
    files = RunDir(workdir)
    if files.results.is_file():
        return FINISHED if evaluated(workdir) else TRAINED
    return STARTED if files.config.is_file() else PENDING


# ----------------------------------------------------------------------------------------------
# Run configs and commands.
# ----------------------------------------------------------------------------------------------


def config_values(config: RunConfig) -> dict[str, Any]:
    """``config`` as the plain JSON values of its config.json (tuples as lists; secrets redacted, as there:
    `gd2po_jax.runtime.run_dir.write_config`)."""
    return redacted(json.loads(config.to_json()))[0]


def check_same_config(workdir: pathlib.Path, config: RunConfig) -> None:
    """Refuse to continue a run that an earlier sweep started with another config than ``config``
    (the run's resolved config now).

    Raises:
      SweepError: naming the run's config.json and the fields whose values differ.
    """
    file = RunDir(workdir).config
    if not file.is_file():
        return
    try:
        before = run_dir.load_run_config(workdir)
    except (ConfigError, RunDirError) as err:  # both name the file
        raise SweepError(f"{err}; delete the run to start it again") from None
    changes = run_dir.config_changes(config_values(before), config_values(config))
    if changes:
        raise SweepError(
            f"{file}: this run was started with other values of {changes}. Use a new "
            "--sweep_dir for other overrides, or delete the run."
        )


@dataclasses.dataclass(frozen=True)
class Commands:
    """How runs are launched: interpreter, repository (train.py, eval.py, configs/resolved.py), and
    the directory they run in (the sweep's own, so that relative paths in the config mean the same).
    train.py reads each run's config from its workdir's config.json."""

    python: str = sys.executable
    repo: pathlib.Path = REPO_ROOT
    cwd: pathlib.Path = dataclasses.field(default_factory=pathlib.Path.cwd)

    def train(self, workdir: pathlib.Path, *flags: str) -> list[str]:
        config = f"{self.repo / RESOLVED_CONFIG}:{RunDir(workdir).config}"
        return [self.python, str(self.repo / "train.py"), f"--config={config}", f"--workdir={workdir}", *flags]

    def evaluate(self, workdir: pathlib.Path) -> list[str]:
        """eval.py on the test split; ``--trust_workdir_code``: the run's config.json is the one the sweep
        wrote from the user's own config, so the code it names (reward functions, a task) is the user's."""
        return [
            self.python,
            str(self.repo / "eval.py"),
            f"--workdir={workdir}",
            f"--split={TEST_SPLIT}",
            "--trust_workdir_code",
        ]

    def warm_start(self, workdir: pathlib.Path) -> list[str]:
        return self.train(workdir, "--warm_start_only")


def command_line(command: Sequence[str], env: dict[str, str] | None = None, cwd: pathlib.Path | None = None) -> str:
    """A shell line for ``command``: ``[cd CWD && ][ENV=VALUE ...] python script args``."""
    prefix = [f"cd {shlex.quote(str(cwd))} &&"] if cwd is not None else []
    prefix += [f"{k}={shlex.quote(v)}" for k, v in sorted((env or {}).items())]
    return " ".join(prefix + [shlex.quote(part) for part in command])


# ----------------------------------------------------------------------------------------------
# Devices.
# ----------------------------------------------------------------------------------------------


def parse_gpu_list(text: str) -> list[str]:
    """GPU indices from ``nvidia-smi -L`` output (``GPU 0: NVIDIA H100 ...`` lines)."""
    return re.findall(r"^GPU (\d+):", text, flags=re.MULTILINE)


def visible_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs a run may be pinned to: CUDA_VISIBLE_DEVICES if set, else what ``nvidia-smi -L``
    lists, else none (CPU). The sweep itself never initializes a device."""
    env = os.environ if env is None else env
    if "CUDA_VISIBLE_DEVICES" in env:
        return [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip() and d.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_gpu_list(out.stdout) if out.returncode == 0 else []


def worker_devices(parallel: int, gpus: Sequence[str]) -> list[str | None]:
    """One entry per worker: the GPU it owns, or None on CPU.

    ``parallel`` 0 means one worker per GPU, or a single worker on CPU.

    Raises:
      SweepError: more workers than GPUs (each run gets a whole device), or ``parallel`` < 0.
    """
    if parallel < 0:
        raise SweepError(f"--parallel: must be >= 0 (0: one run per GPU, 1 on CPU), got {parallel}")
    if not gpus:
        return [None] * max(parallel, 1)
    parallel = parallel or len(gpus)
    if parallel > len(gpus):
        raise SweepError(
            f"--parallel={parallel}: only {len(gpus)} GPUs are visible ({','.join(gpus)}); each run gets one GPU"
        )
    return list(gpus[:parallel])


def device_env(device: str | None) -> dict[str, str]:
    """Environment overrides pinning a run to ``device`` (nothing on CPU)."""
    return {} if device is None else {"CUDA_VISIBLE_DEVICES": device}


# ----------------------------------------------------------------------------------------------
# Running.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    """What happened to one run (or to the warm-start build) in this sweep."""

    name: str
    workdir: pathlib.Path
    status: str
    returncode: int | None = None
    seconds: float = 0.0

    @property
    def log(self) -> pathlib.Path:
        return self.workdir / "log.txt"


class ProcessGroup:
    """The subprocesses the sweep has running, so that an interrupted sweep can stop them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self.stopping = threading.Event()

    def call(self, command: Sequence[str], log, env: dict[str, str], cwd: pathlib.Path) -> int:
        """Run ``command`` with stdout/stderr to ``log``; its exit status (-1 if the sweep stops)."""
        with self._lock:
            if self.stopping.is_set():
                return -1
            proc = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
            self._procs.add(proc)
        try:
            return proc.wait()
        finally:
            with self._lock:
                self._procs.discard(proc)

    def stop(self, grace_seconds: float = 30.0) -> None:
        """Terminate every running subprocess (SIGTERM, then SIGKILL after ``grace_seconds``)."""
        self.stopping.set()
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + grace_seconds
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()


def _attempt(
    name: str,
    workdir: pathlib.Path,
    steps: list[list[str]],
    env_overrides: dict[str, str],
    base_env: dict[str, str],
    cwd: pathlib.Path,
    group: ProcessGroup,
) -> Outcome:
    """Run the ``steps`` (commands) one after another from ``cwd``, logging to workdir/log.txt."""
    start = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**base_env, **env_overrides}
    with (workdir / "log.txt").open("a") as log:
        for command in steps:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {command_line(command, env_overrides)}\n")
            log.flush()
            code = group.call(command, log, env, cwd)
            if code != 0:
                status = INTERRUPTED if group.stopping.is_set() else FAILED
                return Outcome(name, workdir, status, code, time.monotonic() - start)
    return Outcome(name, workdir, FINISHED, 0, time.monotonic() - start)


def execute_run(
    spec: RunSpec, sweep: Sweep, device: str | None, base_env: dict[str, str], group: ProcessGroup
) -> Outcome:
    """Train (or resume) and evaluate one run, unless its workdir says that part is done. Before
    train.py starts, the run's resolved config is written to its config.json."""
    workdir, commands = sweep.workdir(spec), sweep.commands
    status = run_status(workdir)
    if status == FINISHED:
        return Outcome(spec.name, workdir, FINISHED)
    train, evaluate = commands.train(workdir), commands.evaluate(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if status != TRAINED:
        run_dir.write_config(workdir, sweep.run_config(spec))
    lines = [command_line(command, cwd=commands.cwd) for command in (train, evaluate)]
    run_dir.write_text(workdir / "command.txt", "\n".join(lines) + "\n")
    steps = [evaluate] if status == TRAINED else [train, evaluate]
    return _attempt(spec.name, workdir, steps, device_env(device), base_env, commands.cwd, group)


@dataclasses.dataclass
class Sweep:
    """A sweep request, resolved: what to run, where, and how.

    config: the base config (file + user overrides, with ``sft.cache_dir`` set), for the warm start
      and sweep.json; a run's config is `run_config` (the base with the run's algorithm, threshold
      and seed).
    config_file, overrides: where the base config came from (for sweep.json): the ``--config``
      file and the ``--config.*`` overrides (dotted name -> value).
    test_metrics: (key, label) of the test metrics the report shows (`gd2po_jax.tasks.Task.test_metrics`
      of the run's task), recorded in sweep.json so that the report needs no task code.
    warm_start: whether the runs start RL from a warm start, as train.py decides it for one run
      (`gd2po_jax.tasks.setup.plans_warm_start`: ``sft.enabled``, and with ``sft.only_with_targets``
      only when the SFT data has a target); False: none is built, each run starts from the model.
    """

    sweep_dir: pathlib.Path
    specs: list[RunSpec]
    config: RunConfig
    commands: Commands
    devices: list[str | None]
    grid: dict[str, Any]
    config_file: str = ""
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    test_metrics: tuple[tuple[str, str], ...] = ()
    warm_start: bool = True

    def workdir(self, spec: RunSpec) -> pathlib.Path:
        return run_workdir(self.sweep_dir, spec)

    def run_config(self, spec: RunSpec) -> RunConfig:
        """The resolved config of one run: what its config.json holds and train.py runs."""
        return spec.apply(self.config)


def plan_sweep(
    sweep_dir: str | pathlib.Path,
    *,
    config: RunConfig,
    algorithms: Sequence[str],
    snr_taus: Sequence[str],
    seeds: Sequence[str],
    config_file: str = "",
    overrides: Mapping[str, Any] | None = None,
    parallel: int = 0,
    gpus: Sequence[str] | None = None,
    repo: pathlib.Path = REPO_ROOT,
    python: str = sys.executable,
    cwd: pathlib.Path | None = None,
) -> Sweep:
    """Check a sweep request and resolve it, before anything runs.

    Every run's config is resolved and validated here (`RunConfig`, without the mesh checks:
    the device split is checked by train.py), and a run that an earlier invocation started with
    another config is refused (`check_same_config`).

    Args:
      config: the config file with the user's overrides applied.
      algorithms, snr_taus, seeds: the grid (`expand_grid`).
      config_file, overrides: the ``--config`` file and the overridden fields (dotted name ->
        value), recorded in sweep.json; an override of a field the sweep sets is refused.
      parallel, gpus: workers and the GPUs to pin them to (`worker_devices`; default `visible_gpus`).
      repo, python, cwd: where train.py / eval.py are, the interpreter, and the directory the runs
        start in (default: this process's).

    Raises:
      SweepError: naming the flag, config field or file at fault.
    """
    sweep_dir = pathlib.Path(sweep_dir).resolve()
    specs = expand_grid(algorithms, snr_taus, seeds)
    overrides = json.loads(json.dumps(dict(overrides or {}), default=str))  # as sweep.json records them
    for field, flag in SWEPT_FIELDS.items():
        if field in overrides:
            raise SweepError(f"--config.{field}: the sweep sets it for each run; use {flag}")
    if config.sft.enabled and not config.sft.cache_dir:  # the runs share one warm start through it
        config = config.replace({"sft.cache_dir": str(sweep_dir / "warm_starts")})
    from gd2po_jax.tasks import task_of  # the tasks import JAX; the report (this module's reader) does not
    from gd2po_jax.tasks.setup import plans_warm_start

    try:
        task = task_of(config)
        warm_start = plans_warm_start(config, sweep_dir / WARM_START_BUILD)
    except ConfigError as err:
        raise SweepError(str(err)) from None
    if not task.has_split(config, TEST_SPLIT):
        raise SweepError(
            f"config.{task.split_field(config, TEST_SPLIT)} gives no {TEST_SPLIT} rows: the sweep "
            f"evaluates every run on the {TEST_SPLIT} split (eval.py --split={TEST_SPLIT})"
        )
    commands = Commands(python=python, repo=repo, cwd=(cwd or pathlib.Path.cwd()).resolve())
    devices = worker_devices(parallel, visible_gpus() if gpus is None else gpus)
    grid = {
        "algorithms": list(dict.fromkeys(s.algorithm for s in specs)),
        "snr_taus": sorted({s.snr_tau for s in specs if s.snr_tau is not None}),
        "seeds": list(dict.fromkeys(s.seed for s in specs)),
    }
    sweep = Sweep(
        sweep_dir,
        specs,
        config,
        commands,
        devices,
        grid,
        config_file=config_file,
        overrides=cast("dict[str, Any]", overrides),  # the JSON of a dict: a dict
        test_metrics=task.test_metrics(config),
        warm_start=warm_start,
    )
    for spec in specs:
        check_same_config(sweep.workdir(spec), sweep.run_config(spec))
    return sweep


def sweep_record(sweep: Sweep, outcomes: dict[str, Outcome], warm_start: dict[str, Any]) -> dict[str, Any]:
    """The content of ``DIR/sweep.json``."""
    runs = []
    for spec in sweep.specs:
        workdir = sweep.workdir(spec)
        outcome = outcomes.get(spec.name)
        entry = {
            "name": spec.name,
            "method": spec.method,
            "algorithm": spec.algorithm,
            "snr_tau": spec.snr_tau,
            "seed": spec.seed,
            "workdir": str(workdir.relative_to(sweep.sweep_dir)),
            "status": outcome.status if outcome else run_status(workdir),
        }
        if outcome and outcome.status in (FAILED, INTERRUPTED):
            entry.update(returncode=outcome.returncode, log=str(outcome.log))
        if outcome and outcome.seconds:
            entry["seconds"] = round(outcome.seconds, 1)
        runs.append(entry)
    return {
        "grid": sweep.grid,
        "config_file": sweep.config_file,
        "overrides": sweep.overrides,
        "base_config": config_values(sweep.config),
        "warm_start": warm_start,
        "test_metrics": [list(column) for column in sweep.test_metrics],
        "devices": [d if d is not None else "cpu" for d in sweep.devices],
        "updated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "runs": runs,
    }


def build_shared_warm_start(
    sweep: Sweep, group: ProcessGroup, base_env: dict[str, str]
) -> tuple[dict[str, Any], Outcome | None]:
    """Train the warm start the runs share, once, before they start (unless it exists or no run
    needs it). Returns (its sweep.json entry, the build's outcome or None if nothing was run)."""
    if not sweep.config.sft.enabled:
        return {"enabled": False}, None
    if not sweep.warm_start:
        return {"enabled": False, "reason": NO_TARGETS}, None
    from gd2po_jax.sft.warm_start import warm_start_key  # its imports (models, SFT) are heavy; only here

    key = warm_start_key(sweep.config)
    path = pathlib.Path(sweep.config.sft.cache_dir) / key
    entry = {"enabled": True, "path": str(path), "key": key}
    needed = any(run_status(sweep.workdir(s)) in (PENDING, STARTED) for s in sweep.specs)
    if (path / "config.json").is_file() or not needed:
        return entry, None
    workdir = sweep.sweep_dir / WARM_START_BUILD
    command = sweep.commands.warm_start(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    run_dir.write_config(workdir, sweep.config)
    run_dir.write_text(workdir / "command.txt", command_line(command, cwd=sweep.commands.cwd) + "\n")
    tqdm.tqdm.write(f"training the shared warm start {path} (log: {workdir / 'log.txt'})")
    return entry, _attempt(
        "warm start", workdir, [command], device_env(sweep.devices[0]), base_env, sweep.commands.cwd, group
    )


def _run_pool(
    sweep: Sweep,
    todo: list[RunSpec],
    outcomes: dict[str, Outcome],
    on_outcome: Callable[[], None],
    base_env: dict[str, str],
    group: ProcessGroup,
    progress: bool,
) -> None:
    """Run ``todo`` on a pool of workers, one per device, recording each `Outcome` in ``outcomes``.

    On an exception (Ctrl-C) runs not yet started are cancelled (sweep.json then gives them their
    workdir's status), the running ones are stopped and recorded as they ended, and it re-raises.
    """
    devices: queue.Queue = queue.Queue()
    for device in sweep.devices:
        devices.put(device)

    def work(spec: RunSpec) -> Outcome:
        device = devices.get()
        try:
            return execute_run(spec, sweep, device, base_env, group)
        except Exception as err:  # noqa: BLE001 -- e.g. the interpreter cannot start: a failed run
            with (sweep.workdir(spec) / "log.txt").open("a") as log:
                log.write(f"\nsweep: could not run {spec.name}: {err!r}\n")
            return Outcome(spec.name, sweep.workdir(spec), FAILED)
        finally:
            devices.put(device)

    bar = tqdm.tqdm(
        total=len(sweep.specs), initial=len(sweep.specs) - len(todo), desc="sweep", unit="run", disable=not progress
    )
    with bar, futures.ThreadPoolExecutor(max_workers=len(sweep.devices)) as pool:
        pending = {pool.submit(work, spec): spec for spec in todo}
        try:
            for future in futures.as_completed(pending):
                outcome = future.result()
                outcomes[outcome.name] = outcome
                on_outcome()
                bar.update(1)
                bar.set_postfix(failed=sum(o.status == FAILED for o in outcomes.values()))
                if outcome.status == FAILED:
                    bar.write(f"FAILED {outcome.name} (exit code {outcome.returncode}); log: {outcome.log}")
                elif progress:
                    bar.write(f"finished {outcome.name} in {outcome.seconds:.0f} s")
        except BaseException:
            cancelled = [future for future in pending if future.cancel()]
            group.stop()
            pool.shutdown(wait=True)
            for future, spec in pending.items():
                if future not in cancelled and spec.name not in outcomes:
                    ended = future.done() and future.exception() is None
                    outcomes[spec.name] = (
                        future.result() if ended else Outcome(spec.name, sweep.workdir(spec), INTERRUPTED)
                    )
            raise


def run_sweep(sweep: Sweep, *, env: dict[str, str] | None = None, progress: bool = True) -> dict[str, Outcome]:
    """Run every unfinished run of ``sweep``, ``len(sweep.devices)`` at a time; writes sweep.json.

    First the shared warm start is trained (`build_shared_warm_start`; if that fails no run
    starts). Then the runs go seed-major through a pool of workers, each owning one device; a
    failing run does not stop the others. Ctrl-C (or SIGTERM, see sweep.py) stops the running
    subprocesses, marks their runs interrupted, writes sweep.json and re-raises.

    Args:
      env: the environment of the subprocesses (default: this process's); a persistent XLA
        compilation cache in DIR/xla_cache is added unless JAX_COMPILATION_CACHE_DIR is set.

    Returns:
      run name -> `Outcome`, for every run of the grid (also those finished before), and
      ``"warm start"`` -> its `Outcome` if building it failed.
    """
    base_env = dict(os.environ if env is None else env)
    base_env.setdefault("JAX_COMPILATION_CACHE_DIR", str(sweep.sweep_dir / "xla_cache"))
    sweep.sweep_dir.mkdir(parents=True, exist_ok=True)
    group = ProcessGroup()
    outcomes: dict[str, Outcome] = {}
    warm_entry: dict[str, Any] = {}
    lock = threading.Lock()

    def save():
        with lock:
            run_dir.write_json(sweep.sweep_dir / "sweep.json", sweep_record(sweep, outcomes, warm_entry))

    todo = []
    for spec in sweep.specs:
        if run_status(sweep.workdir(spec)) == FINISHED:
            outcomes[spec.name] = Outcome(spec.name, sweep.workdir(spec), FINISHED)
        else:
            todo.append(spec)
    save()
    try:
        entry, built = build_shared_warm_start(sweep, group, base_env)
        warm_entry.update(entry)
        if built is not None:
            warm_entry.update(build_status=built.status, build_log=str(built.log))
            if built.status != FINISHED:
                for spec in todo:  # every run would train it again and fail the same way
                    outcomes[spec.name] = Outcome(spec.name, sweep.workdir(spec), PENDING)
                outcomes["warm start"] = built
                return outcomes
        save()
        _run_pool(sweep, todo, outcomes, save, base_env, group, progress)
    except BaseException:
        group.stop()  # also a warm-start build in progress
        raise
    finally:
        save()
    return outcomes


def summary_lines(outcomes: dict[str, Outcome]) -> tuple[list[str], int]:
    """Lines to print at the end of a sweep and its exit status (0 if every run finished)."""
    counts: dict[str, int] = {}
    for outcome in outcomes.values():
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    lines = ["sweep: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))]
    bad = [o for o in outcomes.values() if o.status != FINISHED]
    for outcome in bad:
        if outcome.status in (FAILED, INTERRUPTED):
            lines.append(f"  {outcome.status} {outcome.name} (exit code {outcome.returncode}): {outcome.log}")
        else:
            lines.append(f"  {outcome.status} {outcome.name} (not run: the warm start failed)")
    return lines, (1 if bad else 0)
