"""The run config, typed: frozen dataclasses built once from a configs/*.py ``ConfigDict``.

Experiments are Python files in ``configs/`` that return an ``ml_collections.ConfigDict``, so that
``--config.rl.snr_tau=0.5`` overrides any field from the command line. The entry points
(train.py, eval.py, sweep.py) convert that ConfigDict once with `RunConfig.from_config_dict`;
every library function takes the typed `RunConfig` (or one of its sections), with the
same dotted names (``config.rl.algorithm``, ``config.sampling.temperature`` ...)::

    config = RunConfig.from_config_dict(configs.default.get_config())   # validated
    config.check_mesh(num_data_shards=8)                                # the mesh-dependent checks
    config.to_dict()                                                    # == the ConfigDict's to_dict()

Each field is checked where it is defined (``__post_init__``), before anything is computed; a
`ConfigError` names the dotted field and the value. The fields only one task reads (``data.synthetic``,
``data.safety``, the files task's paths) are checked by that task (`gd2po_jax.tasks.task_of`) when
the run starts. This module imports nothing of the package: every other module may import it.
Every number must be finite (``inf`` or
``nan`` from the command line is refused). Fields that depend on more than one section
(the batch layout, the files task's data) are checked by `RunConfig`, and those that depend on the
device mesh by `RunConfig.check_mesh`. The paper's symbols (G, tau, eps_low ...) are those of
docs/algorithm.md#notation; configs/default.py and docs/embedded_task.md say why the default
values are what they are.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import math
import re
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

DTYPES = ("float32", "bfloat16")
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
"""The projections a LoRA adapter may be put on (``model.lora.targets``): attention's q, k, v, o and the MLP's
gate, up, down (Hugging Face's q_proj ... down_proj)."""
ALGORITHMS = ("grpo", "gdpo", "gd2po_hard", "gd2po_snr", "low_conflict_half", "high_conflict_half")
"""The values of ``config.rl.algorithm``: the advantage estimators of `gd2po_jax.rl.advantages`."""
SNR_HALF_ALGORITHMS = ("low_conflict_half", "high_conflict_half")
"""The paper's ablation of the SNR ranking (no official code)."""
BATCH_NORMS = ("token", "sequence", "none")
"""The values of ``config.rl.batch_norm`` (`gd2po_jax.rl.advantages`)."""
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
"""The values of ``config.rl.loss_agg_mode`` (verl's names; `gd2po_jax.rl.losses.aggregate_loss`)."""
KL_ESTIMATORS = ("k1", "k3")
"""The values of ``config.rl.kl_estimator`` (`gd2po_jax.rl.losses`)."""
OLD_LOGPROBS = ("recompute", "sampler")
"""The values of ``config.rl.old_logprobs``: where the update's old log-probs come from
(`gd2po_jax.rl.train_step`)."""
HALVES_RANKINGS = ("prompt", "batch")
"""The values of ``config.rl.halves_ranking``: over what the SNR halves rank rollouts
(`gd2po_jax.rl.advantages.snr_halves`)."""
DATA_KINDS = ("verl", "toolrl_sft", "api_bank", "jsonl")
"""The data file formats of ``config.data.kind`` besides auto (`gd2po_jax.data.loaders`)."""
PROMPT_TRUNCATIONS = ("error", "left")
"""The values of ``config.data.prompt_truncation``."""


EVAL_SPLITS = ("validation", "test", "none", "auto")
REWARD_MODEL_TRUNCATIONS = ("right", "error")
"""The values of ``config.rewards.reward_models.<name>.truncation``: what a conversation longer than the
model's ``max_length`` does (`gd2po_jax.rewards.reward_model`)."""
"""The values of ``config.eval.split``."""

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


class ConfigError(ValueError):
    """A config value that cannot work; the message starts with the field's dotted name."""


# ----------------------------------------------------------------------------------------------
# Checks shared by the sections. ``field`` is the dotted name without "config.".
# ----------------------------------------------------------------------------------------------


def _require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"config.{field}: {message}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """An int or a finite float (NaN and infinities are not numbers a config can use)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _one_of(value: Any, field: str, choices) -> None:
    _require(value in tuple(choices), field, f"{value!r} is not one of {tuple(choices)}")


def _int_at_least(value: Any, field: str, minimum: int = 1) -> None:
    _require(_is_int(value) and value >= minimum, field, f"must be an integer >= {minimum}, got {value!r}")


def _in_range(value: Any, field: str, low: float, high: float) -> None:
    _require(_is_number(value) and low <= value <= high, field, f"must be in [{low}, {high}], got {value!r}")


def _number(value: Any, field: str) -> None:
    _require(_is_number(value), field, f"must be a finite number, got {value!r}")


def _learning_rate(value: Any, field: str) -> None:
    _require(_is_number(value) and 0 < value < 1, field,
             f"must be a finite number in (0, 1) (an AdamW step size), got {value!r}")


def _flag(value: Any, field: str) -> None:
    _require(isinstance(value, bool), field, f"must be True or False, got {value!r}")


def _text(value: Any, field: str, what: str = "a string") -> None:
    _require(isinstance(value, str), field, f"must be {what}, got {value!r}")


def _literal_or_text(text: str) -> Any:
    """``text`` as the Python literal it spells (``False``, ``2``, ``'a'``, ``[1, 2]``), else itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


# ----------------------------------------------------------------------------------------------
# Conversion between nested mappings and sections.
# ----------------------------------------------------------------------------------------------

# Field metadata: the field is left out of `to_dict` while it is None (data.synthetic's task
# fields, whose None means "the task's own default").
_OMIT_IF_NONE = {"omit_if_none": True}


class _Section:
    """Conversion shared by every section: `from_dict` (checks unknown and missing fields) and
    `to_dict`. ``_path`` is the section's dotted name in the run config."""

    _path: ClassVar[str] = ""

    @classmethod
    def _dotted(cls, name: str) -> str:
        return f"{cls._path}.{name}" if cls._path else name

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], path: str | None = None):
        """The section from its nested mapping (a ConfigDict's ``to_dict()`` or JSON): sub-sections
        (and groups of named sub-sections, ``dict[str, <section>]`` fields) are converted, lists
        become tuples for tuple fields, and absent fields with a default take it (fields added
        after older runs wrote their config.json).

        Args:
          path: the section's dotted name in errors; default ``_path`` (a named sub-section such
            as ``rewards.reward_models.useful`` passes its own).

        Raises:
          ConfigError: for unknown fields (naming all of them), a missing field without a default,
            or any invalid value.
        """
        prefix = cls._path if path is None else path

        def dotted(name: str) -> str:
            return f"{prefix}.{name}" if prefix else name

        where = f"config.{prefix}" if prefix else "config"
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}: must be a group of fields, got {values!r}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            names = ", ".join(f"config.{dotted(name)}" for name in unknown)
            raise ConfigError(f"{names}: unknown field{'s' if len(unknown) > 1 else ''}; {where} has "
                              f"{', '.join(fields)} (see configs/default.py)")
        hints = _type_hints(cls)
        kwargs = {}
        for name, field in fields.items():
            if name not in values:
                if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                    raise ConfigError(f"config.{dotted(name)} is missing (start from configs/default.py)")
                continue
            value, hint = values[name], hints[name]
            named = _named_sections_hint(hint)
            if isinstance(hint, type) and issubclass(hint, _Section):
                value = hint.from_dict(value)
            elif _optional_section_hint(hint) is not None and value is not None:
                value = _optional_section_hint(hint).from_dict(value)
            elif named is not None:
                if not isinstance(value, Mapping):
                    raise ConfigError(f"config.{dotted(name)}: must be a group of named sections, got {value!r}")
                value = {key: named.from_dict(item, f"{dotted(name)}.{key}") for key, item in value.items()}
            elif _is_tuple_hint(hint) and isinstance(value, (list, tuple)):
                value = tuple(value)
            kwargs[name] = value
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Nested plain values, as ``ConfigDict.to_dict()`` gives them for the same config (tuples
        stay tuples, ints ints, floats floats; JSON writes tuples as lists)."""
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.metadata.get("omit_if_none"):
                continue
            if isinstance(value, _Section):
                value = value.to_dict()
            elif _named_sections_hint(_type_hints(type(self))[field.name]) is not None:
                value = {key: section.to_dict() for key, section in value.items()}
            out[field.name] = value
        return out


@functools.cache
def _type_hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _optional_section_hint(hint: Any) -> type[_Section] | None:
    """The section type of a ``<section> | None`` field (``data.safety``), else None."""
    sections = [a for a in typing.get_args(hint) if isinstance(a, type) and issubclass(a, _Section)]
    return sections[0] if len(sections) == 1 and type(None) in typing.get_args(hint) else None


def _named_sections_hint(hint: Any) -> type[_Section] | None:
    """The section type of a ``dict[str, <section>]`` field (a group of named sub-sections, e.g.
    ``rewards.reward_models``), else None."""
    if typing.get_origin(hint) is not dict:
        return None
    _, value_type = typing.get_args(hint)
    return value_type if isinstance(value_type, type) and issubclass(value_type, _Section) else None


def _is_tuple_hint(hint: Any) -> bool:
    """``tuple[...]``, or an optional one (``tuple[...] | None``)."""
    return typing.get_origin(hint) is tuple or any(typing.get_origin(a) is tuple for a in typing.get_args(hint))


# ----------------------------------------------------------------------------------------------
# The sections.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TinyModelConfig(_Section):
    """``config.model.tiny``: the shape of the random Qwen2 that the embedded default builds in
    ``WORKDIR/base_model`` when ``model.path`` is empty (synthetic_tools task only).

    Attributes:
      vocab_size: recorded only (it enters the warm-start key); the model's vocabulary is that of
        the tokenizer trained on the task, of ``data.synthetic.tokenizer_vocab_size`` tokens.
      hidden_size: width of the residual stream.
      intermediate_size: width of the MLP.
      num_layers: decoder layers.
      num_heads: attention (query) heads.
      num_kv_heads: key / value heads (num_heads: multi-head attention; fewer: grouped queries).
      head_dim: width of one head.
      seed: seed of the random initialization.
    """

    _path: ClassVar[str] = "model.tiny"

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    seed: int

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            _int_at_least(getattr(self, name), self._dotted(name))
        _int_at_least(self.seed, self._dotted("seed"), minimum=0)
        _require(self.num_heads % self.num_kv_heads == 0, self._dotted("num_kv_heads"),
                 f"{self.num_kv_heads} does not divide model.tiny.num_heads={self.num_heads}")


@dataclasses.dataclass(frozen=True)
class LoRAConfig(_Section):
    """``config.model.lora``: train low-rank adapters instead of the whole policy (docs/lora.md).

    Attributes:
      rank: r of every adapter; 0: no adapters, full fine-tuning (the default).
      alpha: the adapters' output is scaled by alpha / rank (PEFT's ``lora_alpha``).
      dropout: PEFT's ``lora_dropout``: the probability of zeroing an input of an adapter in the
        update's forward passes with a gradient (not in sampling, nor in the old log-probs'
        recompute); also in the exported adapter_config.json.
      targets: the projections with an adapter, from `LORA_TARGETS` (default: attention and MLP).
      base_dtype: the dtype the frozen base weights are held in (float32 | bfloat16); "":
        ``train.master_dtype``. The adapters and their optimizer state are in ``train.master_dtype``.
    Absent from older runs' config.json: rank 0.
    """

    _path: ClassVar[str] = "model.lora"

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = LORA_TARGETS
    base_dtype: str = ""

    def __post_init__(self):
        _int_at_least(self.rank, "model.lora.rank", minimum=0)
        _number(self.alpha, "model.lora.alpha")
        _require(self.alpha > 0, "model.lora.alpha", f"must be > 0, got {self.alpha}")
        _number(self.dropout, "model.lora.dropout")
        _require(0 <= self.dropout < 1, "model.lora.dropout", f"must be in [0, 1), got {self.dropout}")
        _require(isinstance(self.targets, tuple) and len(self.targets) > 0
                 and all(t in LORA_TARGETS for t in self.targets) and len(set(self.targets)) == len(self.targets),
                 "model.lora.targets", f"must be distinct names from {LORA_TARGETS}, got {self.targets!r}")
        _one_of(self.base_dtype, "model.lora.base_dtype", ("",) + DTYPES)

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclasses.dataclass(frozen=True)
class PolicyModelConfig(_Section):
    """``config.model``: the policy to train and the dtypes it runs in.

    Attributes:
      path: a Hugging Face checkpoint directory, or a Hub id ``org/name[@revision]`` (fetched into
        the Hugging Face cache: `gd2po_jax.runtime.hub`). Empty: the embedded tiny random Qwen2
        (`TinyModelConfig`, built in ``WORKDIR/base_model`` with a tokenizer trained on the
        synthetic task); the files task needs a path.
      tokenizer_path: the tokenizer's directory or Hub id; empty: ``path``.
      dtype: compute dtype of sampling and of the forward pass (float32 | bfloat16). The master
        weights and optimizer state are in ``train.master_dtype``.
      remat: recompute each decoder layer in the backward pass (gradient checkpointing): less
        activation memory for more compute; the layers then run as one scan (one layer compiled).
      tiny: the embedded model's shape.
      lora: low-rank adapters (`LoRAConfig`; rank 0, the default: full fine-tuning).
    """

    _path: ClassVar[str] = "model"

    path: str
    tokenizer_path: str
    dtype: str
    remat: bool
    tiny: TinyModelConfig
    lora: LoRAConfig = LoRAConfig()

    def __post_init__(self):
        _text(self.path, "model.path", "a directory path (empty: the embedded tiny model)")
        _text(self.tokenizer_path, "model.tokenizer_path", "a directory path (empty: model.path)")
        _one_of(self.dtype, "model.dtype", DTYPES)
        _flag(self.remat, "model.remat")


@dataclasses.dataclass(frozen=True)
class SyntheticDataConfig(_Section):
    """``config.data.synthetic``: the generated tool-calling task of ``task="synthetic_tools"``.

    Apart from ``tokenizer_vocab_size``, the fields are those of
    `gd2po_jax.tasks.synthetic_tools.data.SyntheticToolsConfig` (see its docstring); a field left out
    (None) takes that class's default and is left out of `to_dict`, so a config names only the
    fields it sets and its warm-start key depends on those.

    Attributes:
      tokenizer_vocab_size: vocabulary of the tokenizer trained on the task (special and tag
        tokens included); it is also the embedded model's vocabulary.
      seed: seed of every random draw of the task.
      num_train, num_validation, num_test: rows per split.
      num_candidates: tools listed in each system prompt.
      response_fraction: share of requests that need a plain response instead of a call.
      multi_call_fraction: share of requests that need two calls.
      mistake_rate: probability that a demonstration (an SFT target) has one mistake.
      min_think_words, max_think_words: word range of the demonstrations' think blocks.
      mistakes: the kinds of mistakes drawn (`synthetic_tools.MISTAKES`).
      habit_fraction: share of the tools whose demonstrations have a habit (the last parameter
        left out).
      habit_rate: probability that a demonstration of such a tool has the habit.
    """

    _path: ClassVar[str] = "data.synthetic"

    tokenizer_vocab_size: int
    seed: int | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    num_train: int | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    num_validation: int | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    num_test: int | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    num_candidates: int | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    response_fraction: float | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    multi_call_fraction: float | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    mistake_rate: float | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    min_think_words: int | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    max_think_words: int | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    mistakes: tuple[str, ...] | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    habit_fraction: float | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    habit_rate: float | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)

    def __post_init__(self):
        _int_at_least(self.tokenizer_vocab_size, self._dotted("tokenizer_vocab_size"))


@dataclasses.dataclass(frozen=True)
class RewardTrainingConfig(_Section):
    """``config.data.safety.reward_training``: the shape and Bradley–Terry training of the
    safety_embedded task's reward models (`gd2po_jax.tasks.safety.task`, `gd2po_jax.rewards.training`),
    one per reward name, each a tiny random Qwen2 score model on the task's tokenizer.

    Attributes:
      hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim: the shape.
      seed: seed of the random initialization and of the pair order.
      num_steps: AdamW steps; batch_size: preference pairs per step.
      learning_rate: peak learning rate (3% warm-up, cosine decay to 0).
      regularization: coefficient of the mean squared score (align-anything's 0.001).
      max_length: longest rendered conversation (prompt + response) of a training or held-out pair,
        in tokens (a longer one is an error naming the row). What the run's reward function scores
        is ``rewards.reward_models.<name>.max_length``.
    """

    _path: ClassVar[str] = "data.safety.reward_training"

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    seed: int
    num_steps: int
    batch_size: int
    learning_rate: float
    regularization: float
    max_length: int

    def __post_init__(self):
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "num_steps", "batch_size"):
            _int_at_least(getattr(self, name), self._dotted(name))
        _int_at_least(self.seed, self._dotted("seed"), minimum=0)
        _int_at_least(self.max_length, self._dotted("max_length"), minimum=2)
        _require(self.num_heads % self.num_kv_heads == 0, self._dotted("num_kv_heads"),
                 f"{self.num_kv_heads} does not divide num_heads={self.num_heads}")
        _learning_rate(self.learning_rate, self._dotted("learning_rate"))
        _number(self.regularization, self._dotted("regularization"))
        _require(self.regularization >= 0, self._dotted("regularization"), f"must be >= 0, got {self.regularization}")


@dataclasses.dataclass(frozen=True)
class SafetyDataConfig(_Section):
    """``config.data.safety``: the generated helpfulness-safety world of ``task="safety_embedded"``
    (`gd2po_jax.tasks.safety.world`, whose `SafetyWorldConfig` documents the world's fields), the
    tokenizer trained on it, and its reward models' training.

    Attributes:
      tokenizer_vocab_size: vocabulary of the tokenizer trained on the world (the policy's and the
        reward models').
      seed, num_train, num_validation, num_test, harmful_fraction, benign_mixture, harmful_mixture,
        pairs_per_prompt, annotator_temperature: `SafetyWorldConfig`'s fields.
      reward_training: the reward models (`RewardTrainingConfig`).
    """

    _path: ClassVar[str] = "data.safety"

    tokenizer_vocab_size: int
    seed: int
    num_train: int
    num_validation: int
    num_test: int
    harmful_fraction: float
    benign_mixture: tuple[float, ...]
    harmful_mixture: tuple[float, ...]
    pairs_per_prompt: int
    annotator_temperature: float
    reward_training: RewardTrainingConfig

    def __post_init__(self):
        _int_at_least(self.tokenizer_vocab_size, self._dotted("tokenizer_vocab_size"))


@dataclasses.dataclass(frozen=True)
class DataConfig(_Section):
    """``config.data``: where the prompts (and the warm start's targets) come from.

    Attributes:
      train, validation, test: the files task's data (`gd2po_jax.data.sources`): a verl parquet,
        ToolRL JSON, API-Bank JSON or JSONL file, a directory or glob of such files, a datasets
        ``save_to_disk`` folder (``DIR`` or ``DIR:split``) or a Hub data set id (``org/name:split``);
        validation and test may be empty.
      kind: the files' format: auto (from the extension and keys) or one of
        `gd2po_jax.data.loaders.KINDS`.
      on_error: raise | skip: what a malformed row does (skipped rows are counted and logged).
      max_prompt_tokens: longest prompt allowed, in tokens (after the chat template); what a longer
        one does is ``prompt_truncation``'s.
      synthetic: the generated task of ``task="synthetic_tools"``.
      safety: the generated world of ``task="safety_embedded"`` (`SafetyDataConfig`). Left out
        (None) for the other tasks, and out of `to_dict`.
      prompt_truncation: error | left: a prompt over ``max_prompt_tokens`` is an error naming its
        row, or keeps its last ``max_prompt_tokens`` tokens (verl's ``data.truncation=left``; the
        number cut is logged). Reward functions still receive the whole prompt (its text and
        messages). Left out (None): error, and out of `to_dict` (so the warm-start key of a config
        that does not set it stays what it was).
      chat_template_kwargs: keyword arguments of the chat template (``apply_chat_template``), as
        ``NAME=VALUE`` strings whose value is a Python literal or else text, e.g.
        ``("enable_thinking=False",)`` for Qwen3 (``--config.data.chat_template_kwargs=enable_thinking=False``);
        `DataConfig.template_kwargs` gives them as a dict. Empty: none. Absent from older runs' config.json: empty.
      tools_column: the name of a data column holding each row's tool schemas (a list of JSON-schema
        dicts, or that list as JSON text), passed to the chat template as ``tools=`` (a row whose
        value is null: no tools). Empty: none. Absent from older runs' config.json: empty.
    """

    _path: ClassVar[str] = "data"

    train: str
    validation: str
    test: str
    kind: str
    on_error: str
    max_prompt_tokens: int
    synthetic: SyntheticDataConfig
    prompt_truncation: str | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    safety: SafetyDataConfig | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    chat_template_kwargs: tuple[str, ...] = ()
    tools_column: str = ""

    def __post_init__(self):
        _require(isinstance(self.chat_template_kwargs, tuple), "data.chat_template_kwargs",
                 f"must be a tuple of NAME=VALUE strings, got {self.chat_template_kwargs!r}")
        self.template_kwargs  # noqa: B018 - checks each entry, naming it
        _text(self.tools_column, "data.tools_column", "a column name (empty: no tools)")
        for split in ("train", "validation", "test"):
            _text(getattr(self, split), f"data.{split}", "a file path (or empty)")
        _one_of(self.kind, "data.kind", ("auto", *DATA_KINDS))
        _one_of(self.on_error, "data.on_error", ("raise", "skip"))
        _int_at_least(self.max_prompt_tokens, "data.max_prompt_tokens")
        if self.prompt_truncation is not None:
            _one_of(self.prompt_truncation, "data.prompt_truncation", PROMPT_TRUNCATIONS)

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """``chat_template_kwargs`` as a dict (``"enable_thinking=False"`` -> ``{"enable_thinking": False}``).

        Raises:
          ConfigError: naming the entry that is not NAME=VALUE with NAME an identifier.
        """
        kwargs = {}
        for i, entry in enumerate(self.chat_template_kwargs):
            name, equals, text = entry.partition("=") if isinstance(entry, str) else ("", "", "")
            _require(bool(equals) and name.strip().isidentifier(), f"data.chat_template_kwargs[{i}]",
                     f"{entry!r} is not NAME=VALUE (e.g. enable_thinking=False)")
            kwargs[name.strip()] = _literal_or_text(text.strip())
        return kwargs


@dataclasses.dataclass(frozen=True)
class RewardModelConfig(_Section):
    """``config.rewards.reward_models.<name>``: the score model that gives the reward ``<name>`` of
    ``rewards.kind="reward_model"`` (`gd2po_jax.rewards.reward_model`). Checked by `RewardsConfig`,
    which knows the name.

    Attributes:
      path: a Hugging Face score-model directory or Hub id (a transformers ``*ForSequenceClassification``,
        align-anything or safe-rlhf checkpoint: `gd2po_jax.models.score_model`) with its tokenizer,
        whose chat template renders the conversations (without one: align-anything's plain
        ``ROLE: content`` lines). Empty: the run stops when it starts, naming this field.
      negate: flip the sign of the score (a model where higher = worse); None: only for a safe-rlhf
        ``score_type="cost"`` checkpoint.
      normalize: apply safe-rlhf's normalizer; None: as the checkpoint's ``do_normalize`` says (off
        for the other layouts).
      max_length: tokens of the rendered conversation the model scores (the official runs: 2048).
      truncation: what a longer conversation does: right: cut on the right to ``max_length`` and
        scored (the official verl worker's ``truncation="right"``; also a conversation whose prompt
        alone fills it, whose response then counts for nothing), counted per step as
        ``reward_truncated/<name>``; error: stop the run naming the rollout and its data row (and,
        when the data is loaded, every row whose prompt alone fills ``max_length``). Absent from
        older runs' config.json: right.
      batch_size: conversations per forward pass, fixed (one compiled program per length bucket);
        it must divide by the data-parallel devices (mesh data x fsdp).
      dtype: parameter and compute dtype (float32 | bfloat16); the scores are float32.
      adapter: a PEFT LoRA adapter directory trained on ``path`` (a LoRA-trained reward model:
        ``adapter_config.json`` + ``adapter_model.safetensors``, with the score head PEFT saves for
        ``task_type="SEQ_CLS"``), merged into ``path``'s weights when loaded; empty: none.
    """

    path: str
    negate: bool | None = None
    normalize: bool | None = None
    max_length: int = 2048
    batch_size: int = 32
    dtype: str = "bfloat16"
    truncation: str = "right"
    adapter: str = ""

    def check(self, prefix: str) -> None:
        """Raises `ConfigError` naming ``config.<prefix>.<field>`` for an invalid value."""
        _text(self.path, f"{prefix}.path", "a directory path")
        for name in ("negate", "normalize"):
            value = getattr(self, name)
            _require(value is None or isinstance(value, bool), f"{prefix}.{name}",
                     f"must be True, False or None (the checkpoint's own setting), got {value!r}")
        _int_at_least(self.max_length, f"{prefix}.max_length", minimum=2)
        _one_of(self.truncation, f"{prefix}.truncation", REWARD_MODEL_TRUNCATIONS)
        _int_at_least(self.batch_size, f"{prefix}.batch_size")
        _one_of(self.dtype, f"{prefix}.dtype", DTYPES)
        _text(self.adapter, f"{prefix}.adapter", "a PEFT adapter directory (empty: none)")


@dataclasses.dataclass(frozen=True)
class RewardsConfig(_Section):
    """``config.rewards``: the K reward functions, scored on the host.

    The run's K reward columns, in the order of the reward tensor's last axis ([P, G, K]): first the
    ``names`` of the built-in family ``kind`` (none when ``kind`` is empty), then the columns of each
    entry of ``functions`` in order (`gd2po_jax.rewards.user_functions`).

    Attributes:
      kind: the registered reward family (`gd2po_jax.rewards.base.build_reward_function`):
        tool_calling (the ToolRL rewards), reward_model (one score model per reward), or empty: none
        (the rewards are ``functions``').
      names: the family's rewards, in order (empty exactly when ``kind`` is).
      functions: reward functions of your own (`FunctionEntry`), each an import path
        ``module:callable`` or ``path/to/file.py:callable`` (short form), or a mapping
        ``{"fn": ..., "name": ..., "weight": ..., "options": {...}, "on_error": ..., "min_value": ...}``
        (config-file form). Absent from older runs' config.json: none.
      max_think_words: Lmax of the length reward: think words that earn the full reward.
      conditional_length: the length reward counts only for an exactly correct call (the GDPO
        paper's conditioned variant; the official GD2PO code does not condition it).
      weights: w_k, one per reward column (of ``names`` and of ``functions``); empty: each
        function's entry ``weight`` (default 1), 1 for the family's rewards (official).
      on_error: raise | min | abstain: what a reward function that fails (raises, or times out) on a
        rollout does: raise stops the run naming the rollout; min gives the rollout that function's
        minimum of each of its rewards; abstain leaves them unscored (NaN); both counted per step as
        ``reward_failed/<name>`` in metrics.jsonl. An entry of ``functions`` may set its own.
      num_workers: threads scoring rollouts in parallel.
      timeout_s: seconds the scoring of one step's rollouts may take; calls still running then fail
        (on_error), and their threads are abandoned (Python cannot stop them). 0: no limit. Absent
        from older runs' config.json: 0.
      max_failed_fraction: with on_error=min, stop the run (naming the step, the reward and the
        first error) when a reward failed on more than this share of a step's rollouts; 1: never
        stop. Absent from older runs' config.json: 1.
      reward_models: kind reward_model: the score model of each reward, by name (`RewardModelConfig`);
        its names must be those of ``names``. Absent from older runs' config.json: none.
      offload: kind reward_model: keep the score models' parameters in host memory between scoring
        calls (copied to the devices for each step's scoring), for runs where the policy and the
        reward models do not fit on the devices together. Absent from older runs' config.json: False.
    """

    _path: ClassVar[str] = "rewards"

    kind: str
    names: tuple[str, ...]
    max_think_words: int
    conditional_length: bool
    weights: tuple[float, ...]
    on_error: str
    num_workers: int
    timeout_s: float = 0.0
    max_failed_fraction: float = 1.0
    reward_models: dict[str, RewardModelConfig] = dataclasses.field(default_factory=dict)
    offload: bool = False
    functions: tuple[Any, ...] = ()

    def __post_init__(self):
        _text(self.kind, "rewards.kind", "the name of a registered reward family, or empty (none)")
        _require(isinstance(self.names, tuple) and all(isinstance(n, str) for n in self.names),
                 "rewards.names", f"must be a tuple of reward names, got {self.names!r}")
        _require(isinstance(self.functions, tuple), "rewards.functions",
                 f"must be a tuple of module:callable entries, got {self.functions!r}")
        entries = self.function_entries()
        if self.kind:
            _require(len(self.names) >= 1, "rewards.names",
                     f"rewards.kind={self.kind!r} needs at least one of its rewards named")
        else:
            _require(not self.names, "rewards.names",
                     f"{self.names} names rewards of no family: rewards.kind is empty (set it, e.g. tool_calling, "
                     "or leave rewards.names empty)")
            _require(bool(entries), "rewards.functions",
                     "no rewards: give reward functions (--config.rewards.functions=my_rewards:fn,...) or a "
                     "reward family (rewards.kind and rewards.names)")
        if entries and self.weights:
            weighted = [f"rewards.functions[{e.index}]" for e in entries if e.weight is not None]
            _require(not weighted, "rewards.weights",
                     f"is given, and so is a weight of {', '.join(weighted)}: give the weights in one place")
        _int_at_least(self.max_think_words, "rewards.max_think_words")
        _flag(self.conditional_length, "rewards.conditional_length")
        _require(isinstance(self.weights, tuple) and all(map(_is_number, self.weights)),
                 "rewards.weights", f"must be a tuple of finite numbers (empty: all ones), got {self.weights!r}")
        _require(not self.weights or entries or len(self.weights) == len(self.names), "rewards.weights",
                 f"has {len(self.weights)} entries for {len(self.names)} rewards {self.names}")
        _one_of(self.on_error, "rewards.on_error", ("raise", "min", "abstain"))
        _int_at_least(self.num_workers, "rewards.num_workers")
        _number(self.timeout_s, "rewards.timeout_s")
        _require(self.timeout_s >= 0, "rewards.timeout_s", f"must be >= 0 (0: no limit), got {self.timeout_s}")
        _in_range(self.max_failed_fraction, "rewards.max_failed_fraction", 0.0, 1.0)
        _flag(self.offload, "rewards.offload")
        for name, model in self.reward_models.items():
            _require(isinstance(model, RewardModelConfig), f"rewards.reward_models.{name}",
                     f"must be a group of fields (path, negate, ...), got {model!r}")
            model.check(f"rewards.reward_models.{name}")
        if self.kind == "reward_model":
            _require(self.on_error == "raise", "rewards.on_error",
                     f"{self.on_error!r}: a reward model has no minimum to score a failed rollout with; use 'raise' "
                     "(a NaN score always stops the run)")
            _require(len(set(self.names)) == len(self.names), "rewards.names", f"repeats a name: {self.names}")
            missing = [name for name in self.names if name not in self.reward_models]
            extra = sorted(set(self.reward_models) - set(self.names))
            _require(not missing and not extra, "rewards.reward_models",
                     f"needs one reward model per name of rewards.names={self.names}; "
                     + (f"none for {missing}" if missing else "") + ("; " if missing and extra else "")
                     + (f"{extra} not in rewards.names" if extra else "")
                     + " (e.g. --config.rewards.reward_models.<name>.path=DIR)")

    def function_entries(self) -> tuple[FunctionEntry, ...]:
        """``functions`` as `FunctionEntry` objects, in order.

        Raises:
          ConfigError: naming ``config.rewards.functions[i]`` (and the key) of an invalid entry.
        """
        return tuple(FunctionEntry.parse(entry, i) for i, entry in enumerate(self.functions))


FUNCTION_ON_ERROR = ("raise", "min", "abstain")
"""What a failing entry of ``rewards.functions`` does (`FunctionEntry.on_error`)."""


@dataclasses.dataclass(frozen=True)
class FunctionEntry:
    """One entry of ``config.rewards.functions``: a reward function of your own
    (`gd2po_jax.rewards.user_functions` imports and calls it).

    Attributes:
      index: the entry's position in ``rewards.functions`` (named in errors).
      fn: ``module:callable`` (a module importable from the working directory or ``sys.path``) or
        ``path/to/file.py:callable``; the callable may be dotted (``module:Class.method``).
      name: the reward column's name; None: the callable's ``__name__`` (a function with a ``names``
        attribute gives its K columns those names).
      weight: w_k of its columns; None: ``rewards.weights``, else 1.
      options: keyword arguments: a class is built with them, a function gets them with every call.
      on_error: raise | min | abstain: what a call that raises does (None: ``rewards.on_error``);
        min scores the rollout ``min_value``, abstain leaves it unscored (NaN); both count in
        ``reward_failed/<name>``.
      min_value: the score of a failed rollout with on_error=min (None: the function's own
        ``min_values``, if it declares them).
    """

    index: int
    fn: str
    name: str | None = None
    weight: float | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    on_error: str | None = None
    min_value: float | None = None

    KEYS: ClassVar[tuple[str, ...]] = ("fn", "name", "weight", "options", "on_error", "min_value")

    @classmethod
    def parse(cls, entry: Any, index: int) -> FunctionEntry:
        """The entry of ``rewards.functions[index]``: a string (``fn``) or a mapping of `KEYS`.

        Raises:
          ConfigError: naming ``config.rewards.functions[index]`` and what is wrong.
        """
        field = f"rewards.functions[{index}]"
        if isinstance(entry, str):
            entry = {"fn": entry}
        _require(isinstance(entry, Mapping), field,
                 f"must be 'module:callable', 'path/file.py:callable' or a mapping with 'fn', got {entry!r}")
        unknown = sorted(set(entry) - set(cls.KEYS))
        _require(not unknown, field, f"unknown key{'s' if len(unknown) > 1 else ''} {unknown}; an entry has "
                 f"{', '.join(cls.KEYS)}")
        fn = entry.get("fn")
        _require(isinstance(fn, str) and ":" in fn and all(p.strip() for p in fn.rsplit(":", 1)), f"{field}.fn",
                 f"{fn!r} is not 'module:callable' or 'path/to/file.py:callable'")
        name = entry.get("name")
        _require(name is None or (isinstance(name, str) and name.strip() != ""), f"{field}.name",
                 f"must be a non-empty string, got {name!r}")
        weight = entry.get("weight")
        _require(weight is None or _is_number(weight), f"{field}.weight", f"must be a finite number, got {weight!r}")
        options = entry.get("options") or {}
        _require(isinstance(options, Mapping) and all(isinstance(k, str) for k in options), f"{field}.options",
                 f"must be a mapping of keyword arguments, got {options!r}")
        on_error = entry.get("on_error")
        _require(on_error is None or on_error in FUNCTION_ON_ERROR, f"{field}.on_error",
                 f"{on_error!r} is not one of {FUNCTION_ON_ERROR}")
        min_value = entry.get("min_value")
        _require(min_value is None or _is_number(min_value), f"{field}.min_value",
                 f"must be a finite number, got {min_value!r}")
        return cls(index=index, fn=fn.strip(), name=name, weight=None if weight is None else float(weight),
                   options=dict(options), on_error=on_error,
                   min_value=None if min_value is None else float(min_value))


@dataclasses.dataclass(frozen=True)
class RLConfig(_Section):
    """``config.rl``: the advantage method and the policy loss (docs/algorithm.md).

    Attributes:
      algorithm: grpo | gdpo | gd2po_hard | gd2po_snr, or the paper's SNR-ranking ablation
        low_conflict_half | high_conflict_half (`gd2po_jax.rl.advantages.METHODS`).
      snr_tau: tau, the SNR threshold of GD2PO-SNR, in [0, 1] (0: GDPO, 1: GD2PO-Hard).
      num_generations: G, rollouts sampled per prompt (>= 2: a group needs a spread).
      batch_norm: how GDPO / GD2PO normalize over the batch: token (official) | sequence (TRL) |
        none.
      group_eps: eps_group, added to the group std.
      drop_zero_variance_groups: also drop groups whose rewards are all equal (DAPO's filter).
      clip_low, clip_high: eps_low, eps_high, the clip range [1 - eps_low, 1 + eps_high] of the
        importance ratio.
      dual_clip: c, the dual-clip bound of negative-advantage losses; <= 0 disables it.
      loss_agg_mode: how token losses become one number (verl's names, `losses.LOSS_AGG_MODES`).
      filtered_in_denominator: rollouts that GD2PO filters out (advantage 0) stay in the token-mean
        denominator (official).
      kl_coef: beta, the coefficient of the KL penalty to the starting policy (0: none, and no
        reference forward pass).
      kl_estimator: k1 | k3, the KL estimator.
      entropy_coef: coefficient of the entropy bonus.
      ppo_epochs: passes over each step's rollouts.
      num_minibatches: optimizer updates per pass; they split the step's P x G rollouts.
      micro_batch_size: rollouts per forward / backward pass, accumulated into one minibatch
        update; 0: the whole minibatch at once.
      tempered_logprobs: the old, new and reference log-probs are those of the policy at the
        sampling temperature, ``softmax(logits / sampling.temperature)``, as verl computes them;
        False: of the temperature-1 policy (the raw logits). The same at temperature 1. Absent from
        older runs' config.json: False.
      length_bucket: > 0: the update cuts left padding in steps of this many tokens. Each
        minibatch's rollouts are sorted by prompt length before they split into micro-batches
        (``micro_batch_size``), and each micro-batch runs at the shortest multiple of
        ``length_bucket`` that holds its longest prompt (exact: the cut slots are masked out).
        The update is compiled once, with a branch per length from the training data's shortest
        prompt up to the padded length (`gd2po_jax.rl.train_step.prompt_window_lengths`); the metrics
        ``update/prompt_padding`` and ``update/padding`` say what share of the update's token slots
        is left padding (and padding after the response). 0: every micro-batch at the padded
        length. Absent from older runs' config.json: 0.

    The fields below came with issue 36 (docs/algorithm.md#where-we-differ-from-the-official-code);
    older runs' config.json files lack them and take the defaults.

      old_logprobs: where the update's old log-probs (of the ratio rho) come from: recompute (verl)
        runs the training policy's forward pass over the step's rollouts before the update, inside
        the jitted step, with the update's dtype, micro-batches and log-prob temperature; sampler
        takes the sampler's own (from its KV cache). With recompute the first minibatch's ratios are
        1, and the step logs ``rollout/logprob_diff_mean`` and ``_max`` (|sampler - recomputed| over
        response tokens). configs/default.py and the paper's configs set recompute; absent from an
        older run's config.json: sampler, what that run computed (so a resumed run goes on as it began).
      rollout_is_cap: > 0: verl's truncated importance sampling (``actor.tis_imp_ratio_cap``): the
        policy-gradient loss of each token is multiplied by ``min(exp(recomputed - sampler), cap)``,
        correcting what remains of the sampler / trainer mismatch; needs old_logprobs=recompute.
        0: off (default; the official runs have no such correction).
      shuffle_minibatches: reshuffle the rollouts before each epoch splits them into minibatches
        (default); False: split them in order, as verl (``actor.shuffle: false``).
      micro_batch_max_tokens: > 0: weight the loss per micro-batch as verl's dynamic batches do
        (``actor.use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu`` = this): each minibatch is cut
        into micro-batches of about this many tokens (prompt + response) per rank, each micro-batch's
        loss is its own token mean, weighted by its share of the minibatch's rows
        (`gd2po_jax.rl.micro_batches`). Needs loss_agg_mode=token-mean and shuffle_minibatches=False;
        the micro-batches the update computes in stay ``micro_batch_size`` rows. 0 (default): one
        token mean over the whole minibatch.
      micro_batch_ranks: with micro_batch_max_tokens: verl's data-parallel ranks (GPUs), which each
        take their share of a minibatch (dealt by token count, verl's ``trainer.balance_batch``) and
        cut it by the budget on their own. Default 1.
      query_reweighting: GD2PO scales each prompt's summed advantage by kappa, its kept fraction,
        before the batch step (default); False: weight 1 for every prompt, the paper's "filtering
        alone" ablation.
      snr_eps: added to the SNR denominator, sum_k |T_k| + snr_eps (the official
        ``algorithm.gdpo_filter_ratio_conflict_eps``: 1e-8 in the tool-calling runs, 1e-6 in the
        helpfulness-safety ones). Default 1e-8. The sign test keeps 1e-8.
      halves_ranking: low_conflict_half / high_conflict_half rank the rollouts of each prompt
        (prompt, default) or of the whole batch (batch).

      skip_zero_advantage_rows (issue 41): rollouts whose advantage is 0 (those GD2PO filters out,
        groups of equal rewards) add nothing to the gradient when kl_coef and entropy_coef are 0:
        the update sorts them after the others in each minibatch and does not compute a
        micro-batch that holds only such rollouts (`gd2po_jax.rl.train_step`). The gradient is the
        same, up to the order of float sums; the ``loss/*`` metrics are over the rollouts with a
        gradient; ``update/skipped_rows`` is the share not computed. Needs micro-batches
        (``micro_batch_size`` below the minibatch) to skip part of one. configs/default.py: True;
        absent from an older run's config.json: False, what that run computed.
    """

    _path: ClassVar[str] = "rl"

    algorithm: str
    snr_tau: float
    num_generations: int
    batch_norm: str
    group_eps: float
    drop_zero_variance_groups: bool
    clip_low: float
    clip_high: float
    dual_clip: float
    loss_agg_mode: str
    filtered_in_denominator: bool
    kl_coef: float
    kl_estimator: str
    entropy_coef: float
    ppo_epochs: int
    num_minibatches: int
    micro_batch_size: int
    tempered_logprobs: bool = False
    length_bucket: int = 0
    old_logprobs: str = "sampler"
    rollout_is_cap: float = 0.0
    shuffle_minibatches: bool = True
    micro_batch_max_tokens: int = 0
    micro_batch_ranks: int = 1
    query_reweighting: bool = True
    snr_eps: float = 1e-8
    halves_ranking: str = "prompt"
    skip_zero_advantage_rows: bool = False

    def __post_init__(self):
        _one_of(self.algorithm, "rl.algorithm", ALGORITHMS)
        _in_range(self.snr_tau, "rl.snr_tau", 0.0, 1.0)
        _int_at_least(self.num_generations, "rl.num_generations", minimum=2)
        _one_of(self.batch_norm, "rl.batch_norm", BATCH_NORMS)
        _number(self.group_eps, "rl.group_eps")
        _require(self.group_eps >= 0, "rl.group_eps", f"must be >= 0, got {self.group_eps}")
        _flag(self.drop_zero_variance_groups, "rl.drop_zero_variance_groups")
        _in_range(self.clip_low, "rl.clip_low", 0.0, 1.0)
        _in_range(self.clip_high, "rl.clip_high", 0.0, 10.0)
        _number(self.dual_clip, "rl.dual_clip")
        _require(self.dual_clip <= 0 or self.dual_clip > 1, "rl.dual_clip",
                 f"must be > 1 (or <= 0 to disable), got {self.dual_clip}")
        _one_of(self.loss_agg_mode, "rl.loss_agg_mode", LOSS_AGG_MODES)
        _flag(self.filtered_in_denominator, "rl.filtered_in_denominator")
        _number(self.kl_coef, "rl.kl_coef")
        _require(self.kl_coef >= 0, "rl.kl_coef", f"must be >= 0, got {self.kl_coef}")
        _one_of(self.kl_estimator, "rl.kl_estimator", KL_ESTIMATORS)
        _number(self.entropy_coef, "rl.entropy_coef")
        _int_at_least(self.ppo_epochs, "rl.ppo_epochs")
        _int_at_least(self.num_minibatches, "rl.num_minibatches")
        _int_at_least(self.micro_batch_size, "rl.micro_batch_size", minimum=0)
        _flag(self.tempered_logprobs, "rl.tempered_logprobs")
        _int_at_least(self.length_bucket, "rl.length_bucket", minimum=0)
        _one_of(self.old_logprobs, "rl.old_logprobs", OLD_LOGPROBS)
        _number(self.rollout_is_cap, "rl.rollout_is_cap")
        _require(self.rollout_is_cap >= 0, "rl.rollout_is_cap", f"must be >= 0 (0: off), got {self.rollout_is_cap}")
        _require(not self.rollout_is_cap or self.old_logprobs == "recompute", "rl.rollout_is_cap",
                 "corrects the sampler's log-probs towards the recomputed ones: it needs rl.old_logprobs='recompute'")
        _flag(self.shuffle_minibatches, "rl.shuffle_minibatches")
        _int_at_least(self.micro_batch_max_tokens, "rl.micro_batch_max_tokens", minimum=0)
        _int_at_least(self.micro_batch_ranks, "rl.micro_batch_ranks")
        if self.micro_batch_max_tokens:
            _require(not self.shuffle_minibatches, "rl.micro_batch_max_tokens",
                     "verl's micro-batches are cut from minibatches taken in order: set rl.shuffle_minibatches=False")
            _require(self.loss_agg_mode == "token-mean", "rl.micro_batch_max_tokens",
                     f"verl's per-micro-batch weighting is implemented for rl.loss_agg_mode='token-mean', got "
                     f"{self.loss_agg_mode!r} (the sequence modes weight micro-batches by their rows already)")
        _flag(self.query_reweighting, "rl.query_reweighting")
        _number(self.snr_eps, "rl.snr_eps")
        _require(self.snr_eps > 0, "rl.snr_eps", f"must be > 0, got {self.snr_eps}")
        _one_of(self.halves_ranking, "rl.halves_ranking", HALVES_RANKINGS)
        _flag(self.skip_zero_advantage_rows, "rl.skip_zero_advantage_rows")


@dataclasses.dataclass(frozen=True)
class SamplingConfig(_Section):
    """``config.sampling``: how RL rollouts are sampled (evaluation is greedy).

    Attributes:
      max_new_tokens: longest response, in tokens (also evaluation's budget); a longer one is
        truncated.
      temperature: sampling temperature, > 0. The update's log-probs are those of the
        temperature-1 policy, or of this one with ``rl.tempered_logprobs``.
      top_p: nucleus sampling's probability mass, in (0, 1]; 1: off.
      top_k: sample among the k likeliest tokens; 0: off.
      prompts_per_call: > 0: sample a step's prompts in chunks of this many (less KV-cache and
        prefill memory); 0: all at once. Absent from older runs' config.json: 0.
    """

    _path: ClassVar[str] = "sampling"

    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    prompts_per_call: int = 0

    def __post_init__(self):
        _int_at_least(self.max_new_tokens, "sampling.max_new_tokens")
        _number(self.temperature, "sampling.temperature")
        _require(self.temperature > 0, "sampling.temperature",
                 f"RL rollouts need temperature > 0, got {self.temperature}")
        _in_range(self.top_p, "sampling.top_p", 1e-6, 1.0)
        _int_at_least(self.top_k, "sampling.top_k", minimum=0)
        _int_at_least(self.prompts_per_call, "sampling.prompts_per_call", minimum=0)


@dataclasses.dataclass(frozen=True)
class TrainConfig(_Section):
    """``config.train``: the RL loop and its optimizer (AdamW with global-norm clipping).

    Attributes:
      num_steps: RL steps (0: only the warm start and the evaluations).
      prompts_per_step: P, prompts sampled per step; the step has P x G rollouts.
      seed: seed of the prompt order, the sampling and the RL state (not of the warm start).
      learning_rate: AdamW's peak learning rate, in (0, 1).
      warmup_steps: linear warmup from 0 over this many steps; 0: constant from the start.
      weight_decay: AdamW's decoupled weight decay (also the warm start's).
      grad_clip: clip the global gradient norm to this (also the warm start's); <= 0: no clipping.
      master_dtype: dtype of the master weights and the optimizer state (float32 | bfloat16).
        bfloat16 needs a learning_rate of at least `MIN_BF16_MASTER_LEARNING_RATE`: it keeps 8
        significant bits, so smaller AdamW updates round away (docs/algorithm.md#the-update).
      logit_chunk_size: response tokens per chunk of the log-prob computation (bounds the [B, T, V]
        logits held at once).
      log_every: write metrics every this many steps (and at the last).
      max_consecutive_skipped_steps: stop the run when this many RL steps in a row skipped an
        optimizer update for a non-finite gradient (`gd2po_jax.rl.train_step.count_skipped_steps`).
        Absent from older runs' config.json: 5.
      preemption_signals: the signals that stop the run for a preemption (docs/preemption.md,
        `gd2po_jax.runtime.preemption`): the step in flight finishes and is checkpointed, and
        train.py exits with 128 + the signal's number (143 for SIGTERM). Absent from older runs'
        config.json: ("SIGTERM", "SIGUSR1"); () handles none.
      preemption_grace_s: seconds from the preemption signal to the process's end at the latest
        (the step in flight plus its checkpoint; past it the process ends at once, the previous
        checkpoint intact); 0: no limit. Keep it under the notice (SLURM's --signal lead time, a
        spot VM's 30 s). Absent from older runs' config.json: 25.
    """

    _path: ClassVar[str] = "train"

    num_steps: int
    prompts_per_step: int
    seed: int
    learning_rate: float
    warmup_steps: int
    weight_decay: float
    grad_clip: float
    master_dtype: str
    logit_chunk_size: int
    log_every: int
    max_consecutive_skipped_steps: int = 5
    preemption_signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1")
    preemption_grace_s: float = 25.0

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
        _require(self.master_dtype != "bfloat16" or self.learning_rate >= MIN_BF16_MASTER_LEARNING_RATE,
                 "train.master_dtype",
                 f"bfloat16 master weights lose AdamW updates of train.learning_rate={self.learning_rate}: "
                 "bfloat16 keeps 8 significant bits, so an update below about |w| x 2^-9 rounds away (at lr "
                 "1e-6 only 2% of a model's weights changed in 10 steps, against 100% in float32). Use "
                 "train.master_dtype='float32' (model.dtype='bfloat16' still computes in bfloat16), or a "
                 f"learning_rate >= {MIN_BF16_MASTER_LEARNING_RATE:g}")
        _int_at_least(self.logit_chunk_size, "train.logit_chunk_size")
        _int_at_least(self.log_every, "train.log_every")
        _int_at_least(self.max_consecutive_skipped_steps, "train.max_consecutive_skipped_steps")
        _require(isinstance(self.preemption_signals, tuple) and all(
            isinstance(name, str) and name in PREEMPTION_SIGNALS for name in self.preemption_signals),
            "train.preemption_signals", f"must be a tuple of signal names from {PREEMPTION_SIGNALS}, "
            f"got {self.preemption_signals!r}")
        _number(self.preemption_grace_s, "train.preemption_grace_s")
        _require(self.preemption_grace_s >= 0, "train.preemption_grace_s",
                 f"must be >= 0 (0: no limit), got {self.preemption_grace_s}")


@dataclasses.dataclass(frozen=True)
class SFTConfig(_Section):
    """``config.sft``: the supervised warm start on the data's ``target`` column, trained once and
    reused (``WORKDIR/warm_start``, or shared under a hash of its inputs in ``cache_dir``). Its
    learning rate warms up over the first 10% of the steps, then decays (cosine) to 10%.

    Attributes:
      enabled: train (or reuse) a warm start before RL; False: RL starts from ``model.path``.
      data: a file with the targets; empty: the training data's.
      num_steps: SFT steps.
      batch_size: examples per SFT step.
      learning_rate: peak learning rate, in (0, 1).
      max_length: longest example (prompt + target), in tokens; a longer one is an error naming
        its row.
      seed: seed of the example order (not train.seed: RL seeds share one warm start). Absent
        from older runs' config.json: 0.
      cache_dir: a directory shared by runs, holding warm starts under the hash of their inputs
        (see sweep.py); empty: ``WORKDIR/warm_start``. Absent from older runs' config.json: empty.
      only_with_targets: with ``enabled``, warm-start only when the SFT data has a row with a
        ``target``; without any, RL starts from ``model.path`` (logged). False: data without targets
        is an error. Absent from older runs' config.json: False.
      length_bucket: > 0: prompts are padded to a multiple of this many tokens, and so are targets;
        each batch is cut to the shortest such prompt window that holds its longest prompt (only
        left padding is cut: the loss is the same up to float sums). Each window the batches need
        is one more compiled shape of the step. 0: every batch at the longest example. Not part of
        the warm start's cache key. Absent from older runs' config.json: 0.
    """

    _path: ClassVar[str] = "sft"

    enabled: bool
    data: str
    num_steps: int
    batch_size: int
    learning_rate: float
    max_length: int
    seed: int = 0
    cache_dir: str = ""
    only_with_targets: bool = False
    length_bucket: int = 0

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


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(_Section):
    """``config.checkpoint``: Orbax checkpoints of the RL state in ``WORKDIR/checkpoints``.

    Attributes:
      every_steps: save every this many steps (and at the last).
      keep: how many of the latest checkpoints to keep.
    """

    _path: ClassVar[str] = "checkpoint"

    every_steps: int
    keep: int

    def __post_init__(self):
        _int_at_least(self.every_steps, "checkpoint.every_steps")
        _int_at_least(self.keep, "checkpoint.keep")


@dataclasses.dataclass(frozen=True)
class EvalConfig(_Section):
    """``config.eval``: greedy evaluation of the policy during a run.

    Attributes:
      split: the split evaluated before and after RL: validation | test | none (no evaluation) |
        auto (validation if the data has it, else test, else none). A named split the data lacks is
        an error when the run starts (`gd2po_jax.rl.setup.eval_split`).
      max_examples: evaluate the first this many examples of each split; 0: all.
      batch_size: prompts per generation batch.
      every_steps: also evaluate every this many RL steps; 0: only before and after RL.
      sets: helpfulness-safety sets evaluated instead of ``split`` (before RL, every ``every_steps``
        and after RL): a directory of verl parquet files, each a set named by its file stem (the
        paper's alpaca_test, hh_rlhf_test, pku_saferlhf_test), or one such file, scored by the run's
        reward models (`gd2po_jax.evaluation.safe_alignment`, what ``eval.py --data=DIR`` takes).
        Empty: ``split``. Absent from older runs' config.json: empty.
      max_total_tokens: API-Bank evaluation (eval.py): prompt + response tokens at most, as the
        official generation's vLLM ``max_model_len``: each example gets at most this minus its
        prompt's tokens (and ``max_new_tokens``). 0: no cap. Absent from older runs' config.json: 0.
    """

    _path: ClassVar[str] = "eval"

    split: str
    max_examples: int
    batch_size: int
    every_steps: int
    sets: str = ""
    max_total_tokens: int = 0

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
    is stored, not what is trained: a rerun may change it (`gd2po_jax.runtime.workdir.RESUMABLE_FIELDS`).

    Attributes:
      dtype: the safetensors' dtype: float32 | bfloat16; empty: ``model.dtype``, the dtype the policy
        computes in (the master weights, in ``train.master_dtype``, are cast to it).
    """

    _path: ClassVar[str] = "export"

    dtype: str = ""

    def __post_init__(self):
        _require(self.dtype == "" or self.dtype in DTYPES, "export.dtype",
                 f"must be one of {DTYPES} or empty (model.dtype), got {self.dtype!r}")

    def resolved_dtype(self, model_dtype: str) -> str:
        """The dtype an export is stored in: ``dtype``, or ``model_dtype`` when empty."""
        return self.dtype or model_dtype


WANDB_MODES = ("", "online", "offline", "disabled")
"""The values of ``config.logging.wandb.mode`` (empty: the ``WANDB_MODE`` environment variable, else online)."""


@dataclasses.dataclass(frozen=True)
class WandbConfig(_Section):
    """``config.logging.wandb``: Weights & Biases logging of the metrics and the config
    (`gd2po_jax.runtime.wandb_logging`; the ``wandb`` package is an optional dependency).

    Attributes:
      enabled: log to Weights & Biases (off by default).
      project: the W&B project.
      name: the run's display name; empty: the workdir's name.
      entity: the W&B user or team; empty: the logged-in default.
      mode: online | offline | disabled; empty: ``WANDB_MODE``, else online.
    """

    _path: ClassVar[str] = "logging.wandb"

    enabled: bool = False
    project: str = "gd2po-jax"
    name: str = ""
    entity: str = ""
    mode: str = ""

    def __post_init__(self):
        _flag(self.enabled, "logging.wandb.enabled")
        for name in ("project", "name", "entity"):
            _text(getattr(self, name), f"logging.wandb.{name}")
        _one_of(self.mode, "logging.wandb.mode", WANDB_MODES)
        _require(not self.enabled or self.project.strip() != "", "logging.wandb.project",
                 "is empty; name the W&B project to log to")


@dataclasses.dataclass(frozen=True)
class LoggingConfig(_Section):
    """``config.logging``: what a run records besides metrics.jsonl and TensorBoard. How a run is
    watched, not what it computes: a rerun may change it (`gd2po_jax.runtime.workdir.RESUMABLE_FIELDS`).

    Attributes:
      rollouts_every: > 0: every this many RL steps (and at the last), save the step's rollouts to
        ``WORKDIR/rollouts/step_<N>.jsonl``: prompt, completion, each reward, the advantage, the
        GD2PO keep mask, conflict and SNR, the prompt's weight (`gd2po_jax.rl.rollout_log`). 0: never.
      wandb: Weights & Biases (`WandbConfig`).
    """

    _path: ClassVar[str] = "logging"

    rollouts_every: int = 0
    wandb: WandbConfig = WandbConfig()

    def __post_init__(self):
        _int_at_least(self.rollouts_every, "logging.rollouts_every", minimum=0)


@dataclasses.dataclass(frozen=True)
class MeshConfig(_Section):
    """``config.mesh``: the device mesh (`gd2po_jax.runtime.sharding.make_mesh`). One size may be -1:
    all remaining devices. The batch is split over data x fsdp.

    Attributes:
      data: data-parallel devices (each holds all parameters).
      fsdp: devices the parameters and optimizer state are split over (and the batch too).
      tensor: tensor-parallel devices.
    """

    _path: ClassVar[str] = "mesh"

    data: int
    fsdp: int
    tensor: int

    def __post_init__(self):
        for name in ("data", "fsdp", "tensor"):
            value = getattr(self, name)
            _require(_is_int(value) and (value >= 1 or value == -1), f"mesh.{name}",
                     f"must be a device count >= 1, or -1 (all remaining devices), got {value!r}")


AUTO_COORDINATOR = "auto"
"""``distributed.coordinator_address`` meaning: detected by `jax.distributed.initialize` (Cloud TPU
pods, SLURM, Open MPI, Kubernetes JobSets)."""


@dataclasses.dataclass(frozen=True)
class DistributedConfig(_Section):
    """``config.distributed``: one process per host on JAX's multi-controller runtime
    (`gd2po_jax.runtime.distributed`; docs/multihost.md). Every process runs the same command with the same
    ``--workdir`` (shared storage). How a run is launched, not what it computes: a rerun may change
    any of these (`gd2po_jax.runtime.workdir.RESUMABLE_FIELDS`).

    Attributes:
      coordinator_address: ``HOST:PORT`` of process 0's coordinator; ``"auto"``: detected from the
        cluster (TPU pod, SLURM, Open MPI, Kubernetes); empty: one process, unless the environment
        has ``JAX_COORDINATOR_ADDRESS`` (JAX's own variable), which then stands for it.
      num_processes: how many processes (hosts) take part; 0: detected from the cluster.
      process_id: this process's index in [0, num_processes); -1: detected from the cluster.
      initialization_timeout_s: how long a process waits for the others to join.
      heartbeat_timeout_s: a process not heard from for this long is dead, and the others stop
        (JAX's coordination service).
    """

    _path: ClassVar[str] = "distributed"

    coordinator_address: str = ""
    num_processes: int = 0
    process_id: int = -1
    initialization_timeout_s: int = 300
    heartbeat_timeout_s: int = 100

    def __post_init__(self):
        _text(self.coordinator_address, "distributed.coordinator_address",
              f"HOST:PORT, {AUTO_COORDINATOR!r} or empty (one process)")
        address = self.coordinator_address
        _require(not address or address == AUTO_COORDINATOR or re.fullmatch(r"\S+:\d+", address) is not None,
                 "distributed.coordinator_address",
                 f"{address!r} is not HOST:PORT (process 0's host and a free port), {AUTO_COORDINATOR!r} or empty")
        _int_at_least(self.num_processes, "distributed.num_processes", minimum=0)
        _int_at_least(self.process_id, "distributed.process_id", minimum=-1)
        _require(self.num_processes == 0 or self.process_id < self.num_processes, "distributed.process_id",
                 f"{self.process_id} is not below distributed.num_processes={self.num_processes}")
        _int_at_least(self.initialization_timeout_s, "distributed.initialization_timeout_s")
        _int_at_least(self.heartbeat_timeout_s, "distributed.heartbeat_timeout_s")


# ----------------------------------------------------------------------------------------------
# The run.
# ----------------------------------------------------------------------------------------------


def check_batch_layout(
    rollouts: int, num_minibatches: int, micro_batch_size: int, num_data_shards: int = 1
) -> tuple[int, int]:
    """(minibatch rows, micro-batch rows) of a step: the one rule of batch divisibility.

    The B = P x G ``rollouts`` of a step split into ``num_minibatches`` minibatches (one optimizer
    step each), and each minibatch into micro-batches of ``micro_batch_size`` rows (0: the whole
    minibatch) whose gradients are summed. With the batch split over ``num_data_shards`` devices
    (mesh data x fsdp), the rollouts and every micro-batch must divide by it too.

    Raises:
      ValueError: the message starts with the config field at fault, ``train.prompts_per_step``,
        ``rl.num_minibatches`` or ``rl.micro_batch_size``, then a colon.
    """
    if rollouts % num_data_shards:
        raise ValueError(
            f"train.prompts_per_step: the {rollouts} rollouts of a step (train.prompts_per_step x "
            f"rl.num_generations) cannot be split over {num_data_shards} data-parallel devices (config.mesh)"
        )
    if rollouts % num_minibatches:
        raise ValueError(
            f"rl.num_minibatches: {num_minibatches} does not divide the {rollouts} rollouts of a step "
            "(train.prompts_per_step x rl.num_generations)"
        )
    minibatch = rollouts // num_minibatches
    micro = micro_batch_size or minibatch
    if minibatch % micro:
        raise ValueError(f"rl.micro_batch_size: {micro} does not divide the minibatch of {minibatch} rollouts")
    if micro % num_data_shards:
        raise ValueError(
            f"rl.micro_batch_size: micro-batches of {micro} rollouts cannot be split over "
            f"{num_data_shards} data-parallel devices (config.mesh); use a multiple"
        )
    return minibatch, micro


def _batch_layout(config: RunConfig, num_data_shards: int) -> tuple[int, int]:
    """`check_batch_layout` of a step's rollouts, its error as a `ConfigError`."""
    rollouts = config.train.prompts_per_step * config.rl.num_generations
    try:
        return check_batch_layout(rollouts, config.rl.num_minibatches, config.rl.micro_batch_size,
                                  num_data_shards)
    except ValueError as err:
        message = str(err).removeprefix("config.")
        field = re.match(r"[A-Za-z_][\w.]*", message)
        if field and message[field.end():].startswith(":"):
            raise ConfigError(f"config.{message}") from None
        raise ConfigError(f"config.{field.group(0) if field else 'rl'}: {message}") from None


@dataclasses.dataclass(frozen=True)
class RunConfig(_Section):
    """The whole config of a run, as configs/*.py write it; build it with `from_config_dict`.

    Attributes:
      task: where prompts come from: the name of a registered task (`gd2po_jax.tasks`; its own
        fields are checked by `gd2po_jax.tasks.task_of`): synthetic_tools (generated,
        ``data.synthetic``) | files (``data.train`` ...) | safety_embedded (generated,
        ``data.safety``, with reward models trained on it).
      model, data, rewards, rl, sampling, train, sft, checkpoint, eval, mesh: the sections.
      distributed: how the processes of a multi-host run find each other (defaults: one process).
      export: the dtype of the exported policy (default: model.dtype; older config.json files lack it).
      logging: rollout files and Weights & Biases (defaults: neither; older config.json files lack it).
    """

    task: str
    model: PolicyModelConfig
    data: DataConfig
    rewards: RewardsConfig
    rl: RLConfig
    sampling: SamplingConfig
    train: TrainConfig
    sft: SFTConfig
    checkpoint: CheckpointConfig
    eval: EvalConfig
    mesh: MeshConfig
    distributed: DistributedConfig = DistributedConfig()
    export: ExportConfig = ExportConfig()
    logging: LoggingConfig = LoggingConfig()

    def __post_init__(self):
        _text(self.task, "task", "the name of a registered task (gd2po_jax.tasks) or module:object of your own")
        prompts, per_call = self.train.prompts_per_step, self.sampling.prompts_per_call
        _require(per_call == 0 or per_call >= prompts or prompts % per_call == 0, "sampling.prompts_per_call",
                 f"{per_call} must be 0 (all at once), at least, or a divisor of train.prompts_per_step={prompts}")
        _batch_layout(self, num_data_shards=1)
        if self.rl.micro_batch_max_tokens:
            rollouts, parts = prompts * self.rl.num_generations, self.rl.num_minibatches * self.rl.micro_batch_ranks
            _require(rollouts % parts == 0, "rl.micro_batch_ranks",
                     f"the {rollouts} rollouts of a step do not split into {self.rl.micro_batch_ranks} ranks x "
                     f"{self.rl.num_minibatches} minibatches (rl.num_minibatches) of equal size")

    @classmethod
    def from_config_dict(cls, config: Any) -> RunConfig:
        """The typed, validated config of an ``ml_collections.ConfigDict`` (configs/*.py, with the
        command line's overrides) or of a plain nested mapping (a run's config.json).

        Raises:
          ConfigError: naming the first invalid, unknown or missing field.
        """
        return cls.from_dict(config.to_dict() if hasattr(config, "to_dict") else config)

    def check_mesh(self, num_data_shards: int) -> None:
        """The checks that depend on the devices: the step's rollouts, each micro-batch and each
        evaluation batch must split evenly over the ``num_data_shards`` devices the batch is split
        over (mesh data x fsdp).

        Raises:
          ConfigError: naming the field to change.
        """
        _batch_layout(self, num_data_shards)
        _require(self.eval.batch_size % num_data_shards == 0, "eval.batch_size",
                 f"{self.eval.batch_size} is not divisible by the {num_data_shards} data-parallel devices")
        if self.rewards.kind == "reward_model":
            for name, model in self.rewards.reward_models.items():
                _require(model.batch_size % num_data_shards == 0, f"rewards.reward_models.{name}.batch_size",
                         f"{model.batch_size} is not divisible by the {num_data_shards} data-parallel devices")

    def to_json(self) -> str:
        """The text of a run's ``config.json``: indented JSON with sorted keys (what
        ``ConfigDict.to_json_best_effort(indent=2, sort_keys=True)`` writes for the same config)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def replace(self, changes: Mapping[str, Any]) -> RunConfig:
        """A validated copy with ``changes`` (dotted name -> value, e.g. ``{"rl.algorithm": "gdpo"}``).

        Raises:
          ConfigError: for an unknown name or an invalid result.
        """
        values = self.to_dict()
        for dotted, value in changes.items():
            *parents, name = dotted.split(".")
            node = values
            for depth, parent in enumerate(parents):
                node = node.get(parent) if isinstance(node, dict) else None
                if not isinstance(node, dict):
                    raise ConfigError(f"config.{'.'.join(parents[:depth + 1])}: not a section, cannot set {dotted}")
            node[name] = value
        return RunConfig.from_dict(values)
