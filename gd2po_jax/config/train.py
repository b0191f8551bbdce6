"""``config.sampling`` (`SamplingConfig`), ``config.train`` (`TrainConfig`: the RL loop and its
optimizer) and ``config.sft`` (`SFTConfig`: the supervised warm start).

May import: gd2po_jax.config.base.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from gd2po_jax.config.base import (
    DTYPES,
    _flag,
    _in_range,
    _int_at_least,
    _learning_rate,
    _number,
    _one_of,
    _require,
    _Section,
    _text,
)

# sampling.engine_layers: how the engine's step runs the layers, and the scan_layers it means
# (`gd2po_jax.models.engine.run_engine`; None: by backend).
ENGINE_LAYER_SCAN: dict[str, bool | None] = {"auto": None, "scan": True, "loop": False}
ENGINE_LAYERS = tuple(ENGINE_LAYER_SCAN)
PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGXCPU")
"""The values of ``config.train.preemption_signals``: what schedulers send ahead of a stop (SIGTERM:
spot VMs, Kubernetes, JAX's TPU maintenance notifier; SIGUSR1/2: SLURM's --signal; SIGXCPU: a CPU
time limit)."""

MIN_BF16_MASTER_LEARNING_RATE = 1e-4
"""The smallest ``train.learning_rate`` that ``train.master_dtype="bfloat16"`` accepts. An AdamW
update (about lr per step) rounds away on a bf16 weight w when it is below half a unit in the last
place, |w| x 2^-9 .. 2^-8: at 1e-4 that spares weights up to |w| ~ 0.03 (1.5 std of a normal(0.02)
init). Measured on a tiny Qwen2 over 10 steps: 2% of the weights changed at lr 1e-6, 16% at 1e-5,
87% at 1e-4, 99% at 3e-4 (100% in float32 at every lr; norm scales of 1 need lr > 4e-3)."""


@dataclasses.dataclass(frozen=True)
class SamplingConfig(_Section):
    """``config.sampling``: how RL rollouts are sampled (evaluation is greedy)."""

    _path: ClassVar[str] = "sampling"

    max_new_tokens: int
    """Longest response, in tokens (also evaluation's budget); a longer one is truncated."""
    temperature: float
    """Sampling temperature, > 0. The update's log-probs are those of the temperature-1 policy, or of this
    one with ``rl.tempered_logprobs``."""
    top_p: float
    """Nucleus sampling's probability mass, in (0, 1]; 1: off."""
    top_k: int
    """Sample among the k likeliest tokens; 0: off."""
    prompts_per_call: int = 0
    """> 0: sample a step's prompts in chunks of this many (less KV-cache and prefill memory); 0: all at
    once."""
    engine: bool = True
    """Sample with the rollout engine (`gd2po_jax.models.engine`: rows flow through slots, a finished row's
    slot goes to the next waiting one); False: the static lock-step batch (every row decoded until the
    longest stops), kept for comparison. A model sharded over several devices samples in lock-step."""
    engine_slots: int = 0
    """Rows the engine decodes at once (each slot holds one row's KV cache); 0: one per row of a sampler
    call (P x G, or prompts_per_call x G)."""
    engine_chunk: int = 16
    """Decode steps the engine runs between two looks from the host (admitting rows, freeing slots)."""
    engine_layers: str = "auto"
    """How the engine's decode step runs the layers: "scan" (one `jax.lax.scan`, compiled once for
    all of them), "loop" (unrolled, one copy each), "auto" (a scan on GPU and TPU, the loop on CPU,
    where a scan's per-layer cache slices are copies: docs/rollout_engine.md)."""

    def __post_init__(self):
        _int_at_least(self.max_new_tokens, "sampling.max_new_tokens")
        _number(self.temperature, "sampling.temperature")
        _require(
            self.temperature > 0, "sampling.temperature", f"RL rollouts need temperature > 0, got {self.temperature}"
        )
        _in_range(self.top_p, "sampling.top_p", 1e-6, 1.0)
        _int_at_least(self.top_k, "sampling.top_k", minimum=0)
        _int_at_least(self.prompts_per_call, "sampling.prompts_per_call", minimum=0)
        _require(isinstance(self.engine, bool), "sampling.engine", f"expected True or False, got {self.engine!r}")
        _int_at_least(self.engine_slots, "sampling.engine_slots", minimum=0)
        _int_at_least(self.engine_chunk, "sampling.engine_chunk")
        _require(
            self.engine_layers in ENGINE_LAYERS,
            "sampling.engine_layers",
            f"expected one of {', '.join(ENGINE_LAYERS)}, got {self.engine_layers!r}",
        )


@dataclasses.dataclass(frozen=True)
class TrainConfig(_Section):
    """``config.train``: the RL loop and its optimizer (AdamW with global-norm clipping)."""

    _path: ClassVar[str] = "train"

    num_steps: int
    """RL steps (0: only the warm start and the evaluations)."""
    prompts_per_step: int
    """P, prompts sampled per step; the step has P x G rollouts."""
    seed: int
    """Seed of the prompt order, the sampling and the RL state (not of the warm start)."""
    learning_rate: float
    """AdamW's peak learning rate, in (0, 1)."""
    warmup_steps: int
    """Linear warmup from 0 over this many steps; 0: constant from the start."""
    weight_decay: float
    """AdamW's decoupled weight decay (also the warm start's)."""
    grad_clip: float
    """Clip the global gradient norm to this (also the warm start's); <= 0: no clipping."""
    master_dtype: str
    """Dtype of the master weights and the optimizer state (float32 | bfloat16). bfloat16 needs a
    learning_rate of at least `MIN_BF16_MASTER_LEARNING_RATE`: it keeps 8 significant bits, so smaller
    AdamW updates round away (docs/algorithm.md#the-update)."""
    logit_chunk_size: int
    """Response tokens per chunk of the log-prob computation (bounds the [B, T, V] logits held at once)."""
    log_every: int
    """Write metrics every this many steps (and at the last)."""
    max_consecutive_skipped_steps: int = 5
    """Stop the run when this many RL steps in a row skipped an optimizer update for a non-finite gradient
    (`gd2po_jax.rl.train_step.count_skipped_steps`)."""
    preemption_signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1")
    """The signals that stop the run for a preemption (docs/preemption.md, `gd2po_jax.runtime.preemption`):
    the step in flight finishes and is checkpointed, and train.py exits with 128 + the signal's number (143
    for SIGTERM). (): handle none."""
    preemption_grace_s: float = 25.0
    """Seconds from the preemption signal to the process's end at the latest (the step in flight plus its
    checkpoint; past it the process ends at once, the previous checkpoint intact); 0: no limit. Keep it
    under the notice (SLURM's --signal lead time, a spot VM's 30 s)."""

    def __post_init__(self):
        _int_at_least(self.num_steps, "train.num_steps", minimum=0)
        _int_at_least(self.prompts_per_step, "train.prompts_per_step")
        _int_at_least(self.seed, "train.seed", minimum=0)
        _learning_rate(self.learning_rate, "train.learning_rate")
        _int_at_least(self.warmup_steps, "train.warmup_steps", minimum=0)
        _number(self.weight_decay, "train.weight_decay")
        _require(self.weight_decay >= 0, "train.weight_decay", f"must be >= 0, got {self.weight_decay}")
        _number(self.grad_clip, "train.grad_clip")
        _one_of(self.master_dtype, "train.master_dtype", DTYPES)
        _require(
            self.master_dtype != "bfloat16" or self.learning_rate >= MIN_BF16_MASTER_LEARNING_RATE,
            "train.master_dtype",
            f"bfloat16 master weights lose AdamW updates of train.learning_rate={self.learning_rate}: "
            "bfloat16 keeps 8 significant bits, so an update below about |w| x 2^-9 rounds away (at lr "
            "1e-6 only 2% of a model's weights changed in 10 steps, against 100% in float32). Use "
            "train.master_dtype='float32' (model.dtype='bfloat16' still computes in bfloat16), or a "
            f"learning_rate >= {MIN_BF16_MASTER_LEARNING_RATE:g}",
        )
        _int_at_least(self.logit_chunk_size, "train.logit_chunk_size")
        _int_at_least(self.log_every, "train.log_every")
        _int_at_least(self.max_consecutive_skipped_steps, "train.max_consecutive_skipped_steps")
        _require(
            isinstance(self.preemption_signals, tuple)
            and all(isinstance(name, str) and name in PREEMPTION_SIGNALS for name in self.preemption_signals),
            "train.preemption_signals",
            f"must be a tuple of signal names from {PREEMPTION_SIGNALS}, got {self.preemption_signals!r}",
        )
        _number(self.preemption_grace_s, "train.preemption_grace_s")
        _require(
            self.preemption_grace_s >= 0,
            "train.preemption_grace_s",
            f"must be >= 0 (0: no limit), got {self.preemption_grace_s}",
        )


@dataclasses.dataclass(frozen=True)
class SFTConfig(_Section):
    """``config.sft``: the supervised warm start on the data's ``target`` column, trained once and
    reused (``WORKDIR/warm_start``, or shared under a hash of its inputs in ``cache_dir``). Its
    learning rate warms up over the first 10% of the steps, then decays (cosine) to 10%."""

    _path: ClassVar[str] = "sft"

    enabled: bool
    """Train (or reuse) a warm start before RL; False: RL starts from ``model.path``."""
    data: str
    """A file with the targets; empty: the training data's."""
    num_steps: int
    """SFT steps."""
    batch_size: int
    """Examples per SFT step."""
    learning_rate: float
    """Peak learning rate, in (0, 1)."""
    max_length: int
    """Longest example (prompt + target), in tokens; a longer one is an error naming its row."""
    seed: int = 0
    """Seed of the example order (not train.seed: RL seeds share one warm start)."""
    cache_dir: str = ""
    """A directory shared by runs, holding warm starts under the hash of their inputs (see sweep.py);
    empty: ``WORKDIR/warm_start``."""
    only_with_targets: bool = False
    """With ``enabled``, warm-start only when the SFT data has a row with a ``target``; without any, RL
    starts from ``model.path`` (logged). False: data without targets is an error."""
    length_bucket: int = 16
    """> 0: prompts are padded to a multiple of this many tokens, and so are targets; each batch is cut to
    the shortest such prompt window that holds its longest prompt (only left padding is cut: the loss is the
    same up to float sums). Each window the batches need is one more compiled shape of the step. 0: every
    batch at the longest example. Not part of the warm start's cache key."""

    def __post_init__(self):
        _flag(self.enabled, "sft.enabled")
        _flag(self.only_with_targets, "sft.only_with_targets")
        _text(self.data, "sft.data", "a file path (empty: the training data)")
        _text(self.cache_dir, "sft.cache_dir", "a directory path (a string; empty: WORKDIR/warm_start)")
        if self.enabled:
            _int_at_least(self.num_steps, "sft.num_steps", minimum=0)
            _int_at_least(self.batch_size, "sft.batch_size")
            _learning_rate(self.learning_rate, "sft.learning_rate")
            _int_at_least(self.max_length, "sft.max_length", minimum=2)
            _int_at_least(self.seed, "sft.seed", minimum=0)
            _int_at_least(self.length_bucket, "sft.length_bucket", minimum=0)
