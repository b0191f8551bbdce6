"""Weights & Biases: a training run's metrics and config, mirrored to a W&B run (docs/logging.md).

``config.logging.wandb`` turns it on. Process 0 starts one W&B run per training run: its config is
`RunConfig.to_dict`, each step logs the record metrics.jsonl gets (`MetricsWriter.write`) at that
step, and the W&B run is finished when the training run ends, also when it stops early: a
preemption (`gd2po_jax.runtime.preemption.Preempted`: marked preempting, with the process's exit
code) or an error (exit code 1).

A resumed run (train.py rerun in the same workdir) continues the same W&B run: its id is kept in
``WORKDIR/wandb_run_id.txt`` and passed with ``resume="allow"``. The steps a killed run logged after
its last checkpoint are done again by the rerun; W&B keeps the first values it got for a step
(metrics.jsonl has the rerun's, equal in a deterministic run), and metrics.jsonl stays the record.

``wandb`` is an optional dependency (``pip install wandb``, or the package's ``wandb`` extra), imported
only when W&B is on.
"""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from gd2po_jax.config import ConfigError, RunConfig, WandbConfig
from gd2po_jax.config.run import redacted
from gd2po_jax.runtime import preemption, run_dir
from gd2po_jax.runtime.run_dir import RunDir

logger = logging.getLogger(__name__)

DEFAULT_MODE = "online"


def import_wandb():
    """The ``wandb`` module.

    Raises:
      ConfigError: naming ``config.logging.wandb.enabled`` and how to install it, when it is missing.
    """
    try:
        import wandb
    except ImportError as err:
        raise ConfigError(
            f"config.logging.wandb.enabled: True, but the wandb package cannot be imported ({err}); "
            "pip install wandb (or pip install 'gd2po-jax[wandb]'), or turn W&B off with "
            "--config.logging.wandb.enabled=False"
        ) from None
    return wandb


def resolved_mode(settings: WandbConfig, environ: Mapping[str, str] = os.environ) -> str:
    """online | offline | disabled: ``settings.mode``, or when empty the ``WANDB_MODE`` environment
    variable, else online."""
    return settings.mode or environ.get("WANDB_MODE", "") or DEFAULT_MODE


def is_on(config: RunConfig, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a run of ``config`` logs to W&B: ``logging.wandb.enabled`` and a mode other than
    disabled (``WANDB_MODE=disabled`` turns W&B off without importing it)."""
    return config.logging.wandb.enabled and resolved_mode(config.logging.wandb, environ) != "disabled"


def run_id(workdir: str | pathlib.Path) -> str:
    """The id of the workdir's W&B run: the one in ``WORKDIR/wandb_run_id.txt``, else a new one,
    written there (atomically) for a resumed run to continue."""
    path = RunDir(workdir).wandb_run_id
    if path.is_file():
        existing = path.read_text().strip()
        if existing:
            return existing
    new = os.urandom(8).hex()  # 16 characters of [0-9a-f]: a valid W&B run id
    with run_dir.writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    run_dir.write_text(path, new + "\n")
    return new


def init_arguments(
    config: RunConfig, workdir: str | pathlib.Path, wandb_id: str, environ: Mapping[str, str] = os.environ
) -> dict[str, Any]:
    """The keyword arguments of ``wandb.init`` for a run of ``config`` in ``workdir``: project, name
    (default: the workdir's name), entity (None: the logged-in default), mode (`resolved_mode`), dir
    (the workdir: W&B writes ``WORKDIR/wandb/``), the config, the run id and ``resume="allow"``
    (a resumed run continues it; the resumable fields may change, hence ``allow_val_change``)."""
    settings, workdir = config.logging.wandb, pathlib.Path(workdir)
    return dict(
        project=settings.project,
        name=settings.name or workdir.absolute().name,
        entity=settings.entity or None,
        mode=resolved_mode(settings, environ),
        dir=str(workdir.absolute()),
        config=redacted(config.to_dict())[0],  # secrets are not sent (as config.json: run_dir.write_config)
        id=wandb_id,
        resume="allow",
        allow_val_change=True,
    )


def _scalars(record: Mapping[str, Any]) -> dict[str, Any]:
    """A metrics.jsonl record without its ``step`` (W&B takes that as ``step=``)."""
    return {name: value for name, value in record.items() if name != "step"}


class WandbLogger:
    """The W&B run of one training run, on process 0 (elsewhere, and with W&B off, every method does
    nothing). Use it as a context manager around the run: `start` after the workdir's config is
    checked, `log` each metrics.jsonl record; leaving the block finishes the W&B run.

    Args:
      config: the run's config (``logging.wandb``; all of it is logged).
      workdir: the run's workdir.
      primary: whether this is process 0 (`gd2po_jax.runtime.distributed.is_primary`).

    Raises:
      ConfigError: W&B is on and ``wandb`` cannot be imported (`import_wandb`), at construction:
        before anything is computed.
    """

    def __init__(self, config: RunConfig, workdir: str | pathlib.Path, *, primary: bool = True):
        self.config, self.workdir = config, pathlib.Path(workdir)
        self.enabled = primary and is_on(config)
        self._wandb = import_wandb() if self.enabled else None
        self.run = None

    def start(self) -> None:
        """Start (or, in a workdir that has one, resume) the W&B run."""
        if self._wandb is None or self.run is not None:
            return
        kwargs = init_arguments(self.config, self.workdir, run_id(self.workdir))
        self.run = self._wandb.init(**kwargs)
        logger.info("W&B run %s (%s, project %s)", kwargs["id"], kwargs["mode"], kwargs["project"])

    def log(self, record: Mapping[str, Any]) -> None:
        """Log one metrics.jsonl record (`MetricsWriter.write`'s return) at its ``step``."""
        if self.run is not None:
            self.run.log(_scalars(record), step=int(record["step"]))

    def finish(self, error: BaseException | None = None) -> None:
        """Finish the W&B run: exit code 0; after a preemption marked preempting with its exit code
        (128 + the signal), after another error 1. A failure of W&B itself is logged, not raised (the
        run's record is metrics.jsonl)."""
        run, self.run = self.run, None
        if run is None:
            return
        exit_code = 0 if error is None else 1
        try:
            if isinstance(error, preemption.Preempted):
                exit_code = error.exit_code
                run.mark_preempting()
            run.finish(exit_code=exit_code)
        except Exception as err:  # noqa: BLE001 - W&B mirrors metrics.jsonl; its failure must not mask the run's
            logger.warning("W&B: finishing the run failed (%s: %s)", type(err).__name__, err)

    def __enter__(self) -> WandbLogger:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish(exc)
