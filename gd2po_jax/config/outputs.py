"""What a run writes besides its metrics: ``config.checkpoint`` (`CheckpointConfig`), ``config.eval``
(`EvalConfig`), ``config.export`` (`ExportConfig`) and ``config.logging`` (`LoggingConfig`, with
`WandbConfig`).

May import: gd2po_jax.config.base.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from gd2po_jax.config.base import DTYPES, _flag, _int_at_least, _one_of, _require, _Section, _text

EVAL_SPLITS = ("validation", "test", "none", "auto")
"""The values of ``config.eval.split``."""
WANDB_MODES = ("", "online", "offline", "disabled")
"""The values of ``config.logging.wandb.mode`` (empty: the ``WANDB_MODE`` environment variable, else online)."""


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(_Section):
    """``config.checkpoint``: Orbax checkpoints of the RL state in ``WORKDIR/checkpoints``."""

    _path: ClassVar[str] = "checkpoint"

    every_steps: int
    """Save every this many steps (and at the last)."""
    keep: int
    """How many of the latest checkpoints to keep."""

    def __post_init__(self):
        _int_at_least(self.every_steps, "checkpoint.every_steps")
        _int_at_least(self.keep, "checkpoint.keep")


@dataclasses.dataclass(frozen=True)
class EvalConfig(_Section):
    """``config.eval``: greedy evaluation of the policy during a run."""

    _path: ClassVar[str] = "eval"

    split: str
    """The split evaluated before and after RL: validation | test | none (no evaluation) | auto (validation
    if the data has it, else test, else none). A named split the data lacks is an error when the run starts
    (`gd2po_jax.tasks.setup.eval_split`)."""
    max_examples: int
    """Evaluate the first this many examples of each split; 0: all."""
    batch_size: int
    """Prompts per generation batch."""
    every_steps: int
    """Also evaluate every this many RL steps; 0: only before and after RL."""
    sets: str = ""
    """Helpfulness-safety sets evaluated instead of ``split`` (before RL, every ``every_steps`` and after RL):
    a directory of verl parquet files, each a set named by its file stem (the paper's alpaca_test,
    hh_rlhf_test, pku_saferlhf_test), or one such file, scored by the run's reward models
    (`gd2po_jax.evaluation.safe_alignment`, what ``eval.py --data=DIR`` takes). Empty: ``split``."""
    max_total_tokens: int = 0
    """API-Bank evaluation (eval.py): prompt + response tokens at most, as the official generation's vLLM
    ``max_model_len``: each example gets at most this minus its prompt's tokens (and ``max_new_tokens``).
    0: no cap."""

    def __post_init__(self):
        _one_of(self.split, "eval.split", EVAL_SPLITS)
        _int_at_least(self.max_examples, "eval.max_examples", minimum=0)
        _int_at_least(self.batch_size, "eval.batch_size")
        _int_at_least(self.every_steps, "eval.every_steps", minimum=0)
        _text(self.sets, "eval.sets", "a directory of parquet sets, one parquet file, or empty")
        _int_at_least(self.max_total_tokens, "eval.max_total_tokens", minimum=0)


@dataclasses.dataclass(frozen=True)
class ExportConfig(_Section):
    """``config.export``: the policy exported in Hugging Face format, by train.py at the end of a run
    (``WORKDIR/policy``) and by export.py from a checkpoint (its ``--dtype`` default). How the result
    is stored, not what is trained: a rerun may change it (`gd2po_jax.runtime.run_dir.RESUMABLE_FIELDS`)."""

    _path: ClassVar[str] = "export"

    dtype: str = ""
    """The safetensors' dtype: float32 | bfloat16; empty: ``model.dtype``, the dtype the policy computes in
    (the master weights, in ``train.master_dtype``, are cast to it)."""

    def __post_init__(self):
        _require(
            self.dtype == "" or self.dtype in DTYPES,
            "export.dtype",
            f"must be one of {DTYPES} or empty (model.dtype), got {self.dtype!r}",
        )

    def resolved_dtype(self, model_dtype: str) -> str:
        """The dtype an export is stored in: ``dtype``, or ``model_dtype`` when empty."""
        return self.dtype or model_dtype


@dataclasses.dataclass(frozen=True)
class WandbConfig(_Section):
    """``config.logging.wandb``: Weights & Biases logging of the metrics and the config
    (`gd2po_jax.runtime.wandb_logging`; the ``wandb`` package is an optional dependency)."""

    _path: ClassVar[str] = "logging.wandb"

    enabled: bool = False
    """Log to Weights & Biases."""
    project: str = "gd2po-jax"
    """The W&B project."""
    name: str = ""
    """The run's display name; empty: the workdir's name."""
    entity: str = ""
    """The W&B user or team; empty: the logged-in default."""
    mode: str = ""
    """online | offline | disabled; empty: ``WANDB_MODE``, else online."""

    def __post_init__(self):
        _flag(self.enabled, "logging.wandb.enabled")
        for name in ("project", "name", "entity"):
            _text(getattr(self, name), f"logging.wandb.{name}")
        _one_of(self.mode, "logging.wandb.mode", WANDB_MODES)
        _require(
            not self.enabled or self.project.strip() != "",
            "logging.wandb.project",
            "is empty; name the W&B project to log to",
        )


COMPLETIONS_SHOWN = 3
"""Rollouts shown per step with ``logging.completions_every``."""


@dataclasses.dataclass(frozen=True)
class LoggingConfig(_Section):
    """``config.logging``: what a run records besides metrics.jsonl and TensorBoard. How a run is
    watched, not what it computes: a rerun may change it (`gd2po_jax.runtime.run_dir.RESUMABLE_FIELDS`)."""

    _path: ClassVar[str] = "logging"

    rollouts_every: int = 0
    """> 0: every this many RL steps (and at the last), save the step's rollouts to
    ``WORKDIR/rollouts/step_<N>.jsonl``: prompt, completion, each reward, the advantage, the GD2PO keep mask,
    conflict and SNR, the prompt's weight (`gd2po_jax.rl.rollout_log`). 0: never."""
    wandb: WandbConfig = WandbConfig()
    """Weights & Biases."""
    completions_every: int = 10
    """> 0: every this many RL steps (and at the first and the last), show a few of the step's rollouts
    (the first prompt's, up to `COMPLETIONS_SHOWN`: each reward and the completion) in the console and as
    TensorBoard text (``completions``), as TRL's ``log_completions``. 0: never."""
    compilation_cache: str = "user"
    """JAX's persistent compilation cache, so that a rerun (a resume, a sweep's next run) skips compiling:
    user (``$XDG_CACHE_HOME/gd2po_jax/jax_cache``, default ``~/.cache/gd2po_jax/jax_cache``) | off | a
    directory. The environment variable ``GD2PO_JAX_COMPILATION_CACHE`` (off, or a directory) overrides it,
    and ``JAX_COMPILATION_CACHE_DIR`` (JAX's own) overrides both. Results are identical with and without it."""

    def __post_init__(self):
        _int_at_least(self.rollouts_every, "logging.rollouts_every", minimum=0)
        _int_at_least(self.completions_every, "logging.completions_every", minimum=0)
        _require(
            isinstance(self.compilation_cache, str) and self.compilation_cache.strip() != "",
            "logging.compilation_cache",
            f"must be 'user', 'off' or a directory, got {self.compilation_cache!r}",
        )
