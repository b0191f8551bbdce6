"""The workdir of a run: where each file lives, atomic writes, ``config.json`` and checkpoints.

Every module that reads or writes a workdir goes through here (trainer, warm start, evaluation,
sweeps, report, metrics). A workdir holds everything a run needs to resume or be reproduced::

    config.json         the resolved config (`write_config`, `read_config`)
    base_model/         the embedded default's tokenizer + tiny random Qwen2 (HF format)
    warm_start/         the supervised warm-start checkpoint (HF format), reused when present
                        (with config.sft.cache_dir it lives in CACHE_DIR/<key> instead, shared)
    warm_start_logs/    the SFT loss of the warm start, if this run trained it
    checkpoints/        Orbax checkpoints of the RL state and data position (`Checkpoints`)
    metrics.jsonl       one JSON object per RL step;  tensorboard/  the same as event files
    eval/               <name>.json reports (before_rl, after_rl, test ...) + <name>.jsonl generations
    policy/             the final policy in HF safetensors format
    results.json        validation metrics before and after RL

Files are written through a temporary file in the same directory and a rename (`write_text`,
`write_json`), so a run killed at any moment leaves either the old file or the new one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import tempfile
from typing import Any

import jax
import orbax.checkpoint as ocp

from gd2po_jax.config import ConfigError, RunConfig, as_run_config


class RunDirError(ValueError):
    """A workdir file that is missing or unreadable; the message names the file."""


@dataclasses.dataclass(frozen=True)
class RunDir:
    """The paths of one run's workdir (nothing is created or read here)."""

    path: pathlib.Path

    def __post_init__(self):
        object.__setattr__(self, "path", pathlib.Path(self.path))

    @property
    def config(self) -> pathlib.Path:
        return self.path / "config.json"

    @property
    def base_model(self) -> pathlib.Path:
        return self.path / "base_model"

    @property
    def warm_start(self) -> pathlib.Path:
        return self.path / "warm_start"

    @property
    def warm_start_logs(self) -> pathlib.Path:
        return self.path / "warm_start_logs"

    @property
    def checkpoints(self) -> pathlib.Path:
        return self.path / "checkpoints"

    @property
    def metrics(self) -> pathlib.Path:
        return self.path / "metrics.jsonl"

    @property
    def tensorboard(self) -> pathlib.Path:
        return self.path / "tensorboard"

    @property
    def eval_dir(self) -> pathlib.Path:
        return self.path / "eval"

    def eval_report(self, name: str) -> pathlib.Path:
        """``eval/<name>.json``: the summary of one evaluation."""
        return self.eval_dir / f"{name}.json"

    def eval_generations(self, name: str) -> pathlib.Path:
        """``eval/<name>.jsonl``: its scored generations, one JSON object per example."""
        return self.eval_dir / f"{name}.jsonl"

    @property
    def policy(self) -> pathlib.Path:
        return self.path / "policy"

    @property
    def results(self) -> pathlib.Path:
        return self.path / "results.json"


# ----------------------------------------------------------------------------------------------
# Files.
# ----------------------------------------------------------------------------------------------


def write_text(path: str | pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temporary file in the same directory, then
    `os.replace`. A kill at any moment leaves the old content or the new one, and no temporary file
    survives an exception."""
    path = pathlib.Path(path)
    fd, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(staging, path)
    except BaseException:
        pathlib.Path(staging).unlink(missing_ok=True)
        raise


def write_json(path: str | pathlib.Path, value: Any) -> None:
    """`write_text` of ``value`` as indented JSON with sorted keys."""
    write_text(path, json.dumps(value, indent=2, sort_keys=True))


def read_json(path: str | pathlib.Path) -> Any:
    """The JSON value in ``path``.

    Raises:
      RunDirError: naming the file, when it is missing or not JSON.
    """
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise RunDirError(f"{path}: cannot read it as JSON ({err})") from None


def read_jsonl(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (``metrics.jsonl``, ``eval/<name>.jsonl``) in order.

    Raises:
      RunDirError: naming the file (and the line), when it is missing or a line is not JSON.
    """
    try:
        lines = pathlib.Path(path).read_text().splitlines()
    except OSError as err:
        raise RunDirError(f"{path}: cannot read it ({err})") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise RunDirError(f"{path}, line {number}: not JSON ({err})") from None
    return records


# ----------------------------------------------------------------------------------------------
# config.json
# ----------------------------------------------------------------------------------------------


def config_json(config) -> str:
    """The text of ``config.json`` for ``config`` (a `RunConfig`, or a ConfigDict it is made from):
    indented JSON with sorted keys."""
    return as_run_config(config).to_json()


def write_config(workdir: str | pathlib.Path, config) -> None:
    """Write the resolved ``config`` (a `RunConfig`, or a ConfigDict it is made from) to
    ``workdir/config.json`` (atomically)."""
    write_text(RunDir(workdir).config, config_json(config))


def load_config(file: str | pathlib.Path) -> RunConfig:
    """The typed config in a file written by `write_config` (a run's ``config.json``, or a copy of
    one). A file written before some fields existed reads with their defaults, which are the values
    those runs used (`RunConfig.from_config_dict`).

    Raises:
      RunDirError: the file is missing or not a JSON object.
      ConfigError: naming the file and the first invalid or unknown field.
    """
    values = read_json(file)
    if not isinstance(values, dict):
        raise RunDirError(f"{file}: not a config (a JSON object of config sections)")
    try:
        return RunConfig.from_config_dict(values)
    except ConfigError as err:
        raise ConfigError(f"{file}: {err}") from None


def read_config(workdir: str | pathlib.Path) -> RunConfig:
    """`load_config` of ``workdir/config.json``."""
    return load_config(RunDir(workdir).config)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested JSON objects as one level of dotted names (``{"rl": {"snr_tau": 0.8}}`` ->
    ``{"rl.snr_tau": 0.8}``)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else key))
    return out


def config_changes(before: dict[str, Any], after: dict[str, Any], *, limit: int = 5) -> str:
    """The fields whose values differ between two JSON configs (nested dicts), as
    ``"rl.snr_tau (was 0.8, now 0.5), ..."``: the first ``limit`` by name, then how many more.
    Empty when they agree."""
    old, new = flatten(before), flatten(after)
    changed = sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name))
    details = ", ".join(f"{name} (was {old.get(name)!r}, now {new.get(name)!r})" for name in changed[:limit])
    more = f" and {len(changed) - limit} more" if len(changed) > limit else ""
    return details + more


# ----------------------------------------------------------------------------------------------
# Checkpoints.
# ----------------------------------------------------------------------------------------------


class Checkpoints:
    """Orbax checkpoints of ``(TrainState pytree, JSON metadata)`` in ``WORKDIR/checkpoints``.

    A checkpoint is written to a temporary directory and renamed when complete, so a run killed at
    any moment (also during a save) resumes from the last complete one. The trainer saves and
    restores the whole state; evaluation reads only its ``params`` (`restore_params`).

    Args:
      directory: e.g. ``RunDir(workdir).checkpoints``.
      keep: how many of the latest checkpoints to keep (None: all).
      create: create ``directory`` if it does not exist; False to only read (then a missing
        directory has no steps).
    """

    def __init__(self, directory: str | pathlib.Path, keep: int | None = 2, *, create: bool = True):
        self.directory = pathlib.Path(directory).absolute()
        self._manager = None
        if create or self.directory.is_dir():
            options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                                   enable_async_checkpointing=False)
            self._manager = ocp.CheckpointManager(self.directory, options=options)

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def steps(self) -> list[int]:
        """The steps of the complete checkpoints, ascending."""
        return sorted(self._manager.all_steps()) if self._manager is not None else []

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, step: int, state: Any, metadata: dict[str, Any]) -> None:
        """Write checkpoint ``step`` (blocking until it is complete on disk); older ones beyond
        ``keep`` are deleted."""
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(metadata)),
            force=True,
        )
        self._manager.wait_until_finished()

    def _check_step(self, step: int | None) -> int:
        steps = self.steps()
        if step is None and not steps:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if step is not None and step not in steps:
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; available: {steps}")
        return steps[-1] if step is None else step

    def restore(self, step: int | None, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """(state, metadata) of checkpoint ``step`` (default: the latest), placed on the shardings of
        ``abstract_state`` (a pytree of arrays or `jax.ShapeDtypeStruct`s)."""
        step = self._check_step(step)
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
        return restored.state, dict(restored.meta)

    def restore_params(self, step: int | None, target: Any) -> Any:
        """Only the ``params`` field of the state saved at ``step`` (default: the latest), restored
        onto ``target``'s shapes, dtypes and shardings (`jax.ShapeDtypeStruct` leaves allocate
        nothing else); the optimizer state is not read."""
        step = self._check_step(step)
        item = {"params": target}
        restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True)))
        return restored.state["params"]

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
