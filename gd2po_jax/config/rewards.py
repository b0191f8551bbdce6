"""``config.rewards`` (`RewardsConfig`): the K reward functions, scored on the host: a registered
family (the ToolRL rules, score models: `RewardModelConfig`) and functions of your own
(`FunctionEntry`).

May import: gd2po_jax.config.base.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from gd2po_jax.config.base import (
    DTYPES,
    _flag,
    _in_range,
    _int_at_least,
    _is_number,
    _number,
    _one_of,
    _require,
    _Section,
    _text,
)

REWARD_MODEL_TRUNCATIONS = ("right", "error")
"""The values of ``config.rewards.reward_models.<name>.truncation``: what a conversation longer than the
model's ``max_length`` does (`gd2po_jax.rewards.reward_model`)."""
FUNCTION_ON_ERROR = ("raise", "min", "abstain")
"""What a failing entry of ``rewards.functions`` does (`FunctionEntry.on_error`)."""


@dataclasses.dataclass(frozen=True)
class RewardModelConfig(_Section):
    """``config.rewards.reward_models.<name>``: the score model that gives the reward ``<name>`` of
    ``rewards.kind="reward_model"`` (`gd2po_jax.rewards.reward_model`). Checked by `RewardsConfig`,
    which knows the name."""

    path: str
    """A Hugging Face score-model directory or Hub id (a transformers ``*ForSequenceClassification``,
    align-anything or safe-rlhf checkpoint: `gd2po_jax.models.score_model`) with its tokenizer, whose chat
    template renders the conversations (without one: align-anything's plain ``ROLE: content`` lines).
    Empty: the run stops when it starts, naming this field."""
    negate: bool | None = None
    """Flip the sign of the score (a model where higher = worse); None: only for a safe-rlhf
    ``score_type="cost"`` checkpoint."""
    normalize: bool | None = None
    """Apply safe-rlhf's normalizer; None: as the checkpoint's ``do_normalize`` says (off for the other
    layouts)."""
    max_length: int = 2048
    """Tokens of the rendered conversation the model scores (the official runs: 2048)."""
    batch_size: int = 32
    """Conversations per forward pass, fixed (one compiled program per length bucket); it must divide by the
    data-parallel devices (mesh data x fsdp)."""
    dtype: str = "bfloat16"
    """Parameter and compute dtype (float32 | bfloat16); the scores are float32."""
    truncation: str = "right"
    """What a conversation longer than ``max_length`` does: right: cut on the right to ``max_length`` and
    scored (the official verl worker's ``truncation="right"``; also a conversation whose prompt alone fills
    it, whose response then counts for nothing), counted per step as ``reward_truncated/<name>``; error:
    stop the run naming the rollout and its data row (and, when the data is loaded, every row whose prompt
    alone fills ``max_length``)."""
    adapter: str = ""
    """A PEFT LoRA adapter directory trained on ``path`` (a LoRA-trained reward model:
    ``adapter_config.json`` + ``adapter_model.safetensors``, with the score head PEFT saves for
    ``task_type="SEQ_CLS"``), merged into ``path``'s weights when loaded; empty: none."""

    def check(self, prefix: str) -> None:
        """Raises `ConfigError` naming ``config.<prefix>.<field>`` for an invalid value."""
        _text(self.path, f"{prefix}.path", "a directory path")
        for name in ("negate", "normalize"):
            value = getattr(self, name)
            _require(
                value is None or isinstance(value, bool),
                f"{prefix}.{name}",
                f"must be True, False or None (the checkpoint's own setting), got {value!r}",
            )
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
    """

    _path: ClassVar[str] = "rewards"

    kind: str
    """The registered reward family (`gd2po_jax.rewards.base.build_reward_function`): tool_calling (the
    ToolRL rewards), reward_model (one score model per reward), or empty: none (the rewards are
    ``functions``')."""
    names: tuple[str, ...]
    """The family's rewards, in order (empty exactly when ``kind`` is)."""
    max_think_words: int
    """Lmax of the length reward: think words that earn the full reward."""
    conditional_length: bool
    """The length reward counts only for an exactly correct call (the GDPO paper's conditioned variant; the
    official GD2PO code does not condition it)."""
    weights: tuple[float, ...]
    """w_k, one per reward column (of ``names`` and of ``functions``); empty: each function's entry
    ``weight`` (default 1), 1 for the family's rewards (official)."""
    on_error: str
    """raise | min | abstain: what a reward function that fails (raises, or times out) on a rollout does:
    raise stops the run naming the rollout; min gives the rollout that function's minimum of each of its
    rewards; abstain leaves them unscored (NaN); both counted per step as ``reward_failed/<name>`` in
    metrics.jsonl. An entry of ``functions`` may set its own."""
    num_workers: int
    """Reward calls in flight at once: the step's reward functions run side by side (threads for plain
    functions, one event loop for ``async def`` ones), each group's rollouts (scored as the sampler
    completes it, `gd2po_jax.rl.rollout.GroupScoring`) cut into chunks (this many for one function; dealt
    out among several), at most this many calls at a time (`gd2po_jax.rewards.scoring`). 1: one call
    after another."""
    score_groups: bool = True
    """Score each prompt's G rollouts as soon as the rollout engine completes them, while it decodes the
    rest (one process, host rewards: `gd2po_jax.rl.rollout.GroupScoring`); a call then sees one group's
    rollouts. False: score the whole step after the decode (for functions that need the whole batch)."""
    timeout_s: float = 600.0
    """Seconds the scoring of one step's rollouts may take (and the trial call before compute); calls still
    running then fail (``on_error``), and their threads are abandoned (Python cannot stop them). 0: no
    limit. An entry of ``functions`` may set a limit per call (its ``timeout_s``)."""
    max_failed_fraction: float = 0.1
    """With on_error=min, stop the run (naming the step, the reward and the first error) when a reward
    failed on more than this share of a step's rollouts; 1: never stop."""
    reward_models: dict[str, RewardModelConfig] = dataclasses.field(default_factory=dict)
    """kind reward_model: the score model of each reward, by name; its names must be those of ``names``."""
    offload: bool = False
    """kind reward_model: keep the score models' parameters in host memory between scoring calls (copied to
    the devices for each step's scoring), for runs where the policy and the reward models do not fit on the
    devices together."""
    functions: tuple[Any, ...] = ()
    """Reward functions of your own (`FunctionEntry`), each an import path ``module:callable`` or
    ``path/to/file.py:callable`` (short form), or a mapping ``{"fn": ..., "name": ..., "names": {...},
    "weight": ..., "options": {...}, "on_error": ..., "min_value": ..., "timeout_s": ...}`` (config-file
    form)."""

    def __post_init__(self):
        _text(self.kind, "rewards.kind", "the name of a registered reward family, or empty (none)")
        _require(
            isinstance(self.names, tuple) and all(isinstance(n, str) for n in self.names),
            "rewards.names",
            f"must be a tuple of reward names, got {self.names!r}",
        )
        _require(
            isinstance(self.functions, tuple),
            "rewards.functions",
            f"must be a tuple of module:callable entries, got {self.functions!r}",
        )
        entries = self.function_entries()
        if self.kind:
            _require(
                len(self.names) >= 1,
                "rewards.names",
                f"rewards.kind={self.kind!r} needs at least one of its rewards named",
            )
        else:
            _require(
                not self.names,
                "rewards.names",
                f"{self.names} names rewards of no family: rewards.kind is empty (set it, e.g. tool_calling, "
                "or leave rewards.names empty)",
            )
            _require(
                bool(entries),
                "rewards.functions",
                "no rewards: give reward functions (--config.rewards.functions=my_rewards:fn,...) or a "
                "reward family (rewards.kind and rewards.names)",
            )
        if entries and self.weights:
            weighted = [f"rewards.functions[{e.index}]" for e in entries if e.weight is not None]
            _require(
                not weighted,
                "rewards.weights",
                f"is given, and so is a weight of {', '.join(weighted)}: give the weights in one place",
            )
        _int_at_least(self.max_think_words, "rewards.max_think_words")
        _flag(self.conditional_length, "rewards.conditional_length")
        _require(
            isinstance(self.weights, tuple) and all(map(_is_number, self.weights)),
            "rewards.weights",
            f"must be a tuple of finite numbers (empty: all ones), got {self.weights!r}",
        )
        _require(
            not self.weights or entries or len(self.weights) == len(self.names),
            "rewards.weights",
            f"has {len(self.weights)} entries for {len(self.names)} rewards {self.names}",
        )
        _one_of(self.on_error, "rewards.on_error", ("raise", "min", "abstain"))
        _int_at_least(self.num_workers, "rewards.num_workers")
        _flag(self.score_groups, "rewards.score_groups")
        _number(self.timeout_s, "rewards.timeout_s")
        _require(self.timeout_s >= 0, "rewards.timeout_s", f"must be >= 0 (0: no limit), got {self.timeout_s}")
        _in_range(self.max_failed_fraction, "rewards.max_failed_fraction", 0.0, 1.0)
        _flag(self.offload, "rewards.offload")
        for name, model in self.reward_models.items():
            _require(
                isinstance(model, RewardModelConfig),
                f"rewards.reward_models.{name}",
                f"must be a group of fields (path, negate, ...), got {model!r}",
            )
            model.check(f"rewards.reward_models.{name}")
        if self.kind == "reward_model":
            _require(
                self.on_error == "raise",
                "rewards.on_error",
                f"{self.on_error!r}: a reward model has no minimum to score a failed rollout with; use 'raise' "
                "(a NaN score always stops the run)",
            )
            _require(len(set(self.names)) == len(self.names), "rewards.names", f"repeats a name: {self.names}")
            missing = [name for name in self.names if name not in self.reward_models]
            extra = sorted(set(self.reward_models) - set(self.names))
            _require(
                not missing and not extra,
                "rewards.reward_models",
                f"needs one reward model per name of rewards.names={self.names}; "
                + (f"none for {missing}" if missing else "")
                + ("; " if missing and extra else "")
                + (f"{extra} not in rewards.names" if extra else "")
                + " (e.g. --config.rewards.reward_models.<name>.path=DIR)",
            )

    def function_entries(self) -> tuple[FunctionEntry, ...]:
        """``functions`` as `FunctionEntry` objects, in order.

        Raises:
          ConfigError: naming ``config.rewards.functions[i]`` (and the key) of an invalid entry.
        """
        return tuple(FunctionEntry.parse(entry, i) for i, entry in enumerate(self.functions))


@dataclasses.dataclass(frozen=True)
class FunctionEntry:
    """One entry of ``config.rewards.functions``: a reward function of your own
    (`gd2po_jax.rewards.user_functions` imports and calls it)."""

    index: int
    """The entry's position in ``rewards.functions`` (named in errors)."""
    fn: str
    """``module:callable`` (a module importable from the working directory or ``sys.path``) or
    ``path/to/file.py:callable``; the callable may be dotted (``module:Class.method``)."""
    name: str | None = None
    """The reward column's name; None: the callable's ``__name__`` (a function with a ``names`` attribute
    gives its K columns those names; a TRL-form function that returns components, ``<name>/<component>``)."""
    weight: float | dict[str, float] | None = None
    """w_k of its columns: one number for all, or a mapping component (or column) -> weight (1 for the
    others); None: ``rewards.weights``, else 1."""
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments: a class is built with them, a function gets them with every call."""
    on_error: str | None = None
    """raise | min | abstain: what a call that raises does (None: ``rewards.on_error``); min scores the
    rollout ``min_value``, abstain leaves it unscored (NaN); both count in ``reward_failed/<name>``."""
    min_value: float | None = None
    """The score of a failed rollout with on_error=min (None: the function's own ``min_values``, if it
    declares them)."""
    names: dict[str, str] | None = None
    """Column names of its rewards, in order: component -> column for a TRL-form function returning
    components (which fixes the components before any call), or each of a batch function's ``names`` ->
    its new name; None: ``<name>/<component>``, or the function's own names."""
    timeout_s: float | None = None
    """Seconds one call of it may take (one chunk of a step's rollouts); a call still running then fails
    (``on_error``) and is abandoned. None: only the step's limit, ``rewards.timeout_s``."""

    KEYS: ClassVar[tuple[str, ...]] = ("fn", "name", "names", "weight", "options", "on_error", "min_value", "timeout_s")

    @classmethod
    def parse(cls, entry: Any, index: int) -> FunctionEntry:
        """The entry of ``rewards.functions[index]``: a string (``fn``) or a mapping of `KEYS`.

        Raises:
          ConfigError: naming ``config.rewards.functions[index]`` and what is wrong.
        """
        field = f"rewards.functions[{index}]"
        if isinstance(entry, str):
            entry = {"fn": entry}
        _require(
            isinstance(entry, Mapping),
            field,
            f"must be 'module:callable', 'path/file.py:callable' or a mapping with 'fn', got {entry!r}",
        )
        unknown = sorted(set(entry) - set(cls.KEYS))
        _require(
            not unknown,
            field,
            f"unknown key{'s' if len(unknown) > 1 else ''} {unknown}; an entry has {', '.join(cls.KEYS)}",
        )
        fn = entry.get("fn")
        _require(
            isinstance(fn, str) and ":" in fn and all(p.strip() for p in fn.rsplit(":", 1)),
            f"{field}.fn",
            f"{fn!r} is not 'module:callable' or 'path/to/file.py:callable'",
        )
        name = entry.get("name")
        _require(
            name is None or (isinstance(name, str) and name.strip() != ""),
            f"{field}.name",
            f"must be a non-empty string, got {name!r}",
        )
        weight = entry.get("weight")
        _require(
            weight is None
            or _is_number(weight)
            or (isinstance(weight, Mapping) and all(isinstance(k, str) and _is_number(v) for k, v in weight.items())),
            f"{field}.weight",
            f"must be a finite number, or a mapping of component to finite number, got {weight!r}",
        )
        names = entry.get("names")
        _require(
            names is None
            or (
                isinstance(names, Mapping)
                and len(names) >= 1
                and all(isinstance(k, str) and isinstance(v, str) and k.strip() and v.strip() for k, v in names.items())
                and len(set(names.values())) == len(names)
            ),
            f"{field}.names",
            f"must map each component (or reward) to a distinct column name, e.g. {{'correct': 'judge_correct'}}; "
            f"got {names!r}",
        )
        timeout_s = entry.get("timeout_s")
        _require(
            timeout_s is None or (_is_number(timeout_s) and timeout_s > 0),
            f"{field}.timeout_s",
            f"must be a number of seconds > 0 (None: only rewards.timeout_s), got {timeout_s!r}",
        )
        options = entry.get("options") or {}
        _require(
            isinstance(options, Mapping) and all(isinstance(k, str) for k in options),
            f"{field}.options",
            f"must be a mapping of keyword arguments, got {options!r}",
        )
        on_error = entry.get("on_error")
        _require(
            on_error is None or on_error in FUNCTION_ON_ERROR,
            f"{field}.on_error",
            f"{on_error!r} is not one of {FUNCTION_ON_ERROR}",
        )
        min_value = entry.get("min_value")
        _require(
            min_value is None or _is_number(min_value),
            f"{field}.min_value",
            f"must be a finite number, got {min_value!r}",
        )
        return cls(
            index=index,
            fn=fn.strip(),
            name=name,
            weight=None if weight is None else dict(weight) if isinstance(weight, Mapping) else float(weight),
            options=dict(options),
            on_error=on_error,
            min_value=None if min_value is None else float(min_value),
            names=None if names is None else {str(k): str(v) for k, v in names.items()},
            timeout_s=None if timeout_s is None else float(timeout_s),
        )
