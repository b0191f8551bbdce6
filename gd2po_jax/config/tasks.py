"""The sections only one task reads: ``config.data.synthetic`` (`SyntheticDataConfig`, task
synthetic_tools) and ``config.data.safety`` (`SafetyDataConfig` with its `RewardTrainingConfig`, task
safety_embedded). They are typed here, since the config imports no task; their task checks the
values (`gd2po_jax.tasks.task_of`) when the run starts.

May import: gd2po_jax.config.base.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from gd2po_jax.config.base import _OMIT_IF_NONE, _int_at_least, _learning_rate, _number, _require, _Section


def _task_default():
    """A field of the synthetic task that a config may leave out (None: the task's own default, and
    out of `to_dict`)."""
    return dataclasses.field(default=None, metadata=_OMIT_IF_NONE)


@dataclasses.dataclass(frozen=True)
class SyntheticDataConfig(_Section):
    """``config.data.synthetic``: the generated tool-calling task of ``task="synthetic_tools"``.

    Apart from ``tokenizer_vocab_size``, the fields are those of
    `gd2po_jax.tasks.synthetic_tools.data.SyntheticToolsConfig` (see its docstring); a field left out
    (None) takes that class's default and is left out of `to_dict`, so a config names only the
    fields it sets and its warm-start key depends on those.
    """

    _path: ClassVar[str] = "data.synthetic"

    tokenizer_vocab_size: int
    """Vocabulary of the tokenizer trained on the task (special and tag tokens included); it is also the
    embedded model's vocabulary."""
    seed: int | None = _task_default()
    """Seed of every random draw of the task."""
    num_train: int | None = _task_default()
    """Rows of the training split."""
    num_validation: int | None = _task_default()
    """Rows of the validation split."""
    num_test: int | None = _task_default()
    """Rows of the test split."""
    num_candidates: int | None = _task_default()
    """Tools listed in each system prompt."""
    response_fraction: float | None = _task_default()
    """Share of requests that need a plain response instead of a call."""
    multi_call_fraction: float | None = _task_default()
    """Share of requests that need two calls."""
    mistake_rate: float | None = _task_default()
    """Probability that a demonstration (an SFT target) has one mistake."""
    min_think_words: int | None = _task_default()
    """Fewest words of a demonstration's think block."""
    max_think_words: int | None = _task_default()
    """Most words of a demonstration's think block."""
    mistakes: tuple[str, ...] | None = _task_default()
    """The kinds of mistakes drawn (`synthetic_tools.MISTAKES`)."""
    habit_fraction: float | None = _task_default()
    """Share of the tools whose demonstrations have a habit (the last parameter left out)."""
    habit_rate: float | None = _task_default()
    """Probability that a demonstration of such a tool has the habit."""

    def __post_init__(self):
        _int_at_least(self.tokenizer_vocab_size, self._dotted("tokenizer_vocab_size"))


@dataclasses.dataclass(frozen=True)
class RewardTrainingConfig(_Section):
    """``config.data.safety.reward_training``: the shape and Bradley–Terry training of the
    safety_embedded task's reward models (`gd2po_jax.tasks.safety_embedded.task`, `gd2po_jax.training.reward_models`),
    one per reward name, each a tiny random Qwen2 score model on the task's tokenizer."""

    _path: ClassVar[str] = "data.safety.reward_training"

    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of the MLP."""
    num_layers: int
    """Decoder layers."""
    num_heads: int
    """Attention (query) heads."""
    num_kv_heads: int
    """Key / value heads; must divide num_heads."""
    head_dim: int
    """Width of one head."""
    seed: int
    """Seed of the random initialization and of the pair order."""
    num_steps: int
    """AdamW steps."""
    batch_size: int
    """Preference pairs per step."""
    learning_rate: float
    """Peak learning rate (3% warm-up, cosine decay to 0)."""
    regularization: float
    """Coefficient of the mean squared score (align-anything's 0.001)."""
    max_length: int
    """Longest rendered conversation (prompt + response) of a training or held-out pair, in tokens (a
    longer one is an error naming the row). What the run's reward function scores is
    ``rewards.reward_models.<name>.max_length``."""

    def __post_init__(self):
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "num_steps",
            "batch_size",
        ):
            _int_at_least(getattr(self, name), self._dotted(name))
        _int_at_least(self.seed, self._dotted("seed"), minimum=0)
        _int_at_least(self.max_length, self._dotted("max_length"), minimum=2)
        _require(
            self.num_heads % self.num_kv_heads == 0,
            self._dotted("num_kv_heads"),
            f"{self.num_kv_heads} does not divide num_heads={self.num_heads}",
        )
        _learning_rate(self.learning_rate, self._dotted("learning_rate"))
        _number(self.regularization, self._dotted("regularization"))
        _require(self.regularization >= 0, self._dotted("regularization"), f"must be >= 0, got {self.regularization}")


@dataclasses.dataclass(frozen=True)
class SafetyDataConfig(_Section):
    """``config.data.safety``: the generated helpfulness-safety world of ``task="safety_embedded"``
    (`gd2po_jax.tasks.safety_embedded.world`, whose `SafetyWorldConfig` documents the world's fields), the
    tokenizer trained on it, and its reward models' training."""

    _path: ClassVar[str] = "data.safety"

    tokenizer_vocab_size: int
    """Vocabulary of the tokenizer trained on the world (the policy's and the reward models')."""
    seed: int
    """`SafetyWorldConfig.seed`: seed of every random draw of the world."""
    num_train: int
    """`SafetyWorldConfig.num_train`: prompts of the training split."""
    num_validation: int
    """`SafetyWorldConfig.num_validation`: prompts of the validation split."""
    num_test: int
    """`SafetyWorldConfig.num_test`: prompts of the test split."""
    harmful_fraction: float
    """`SafetyWorldConfig.harmful_fraction`: share of harmful requests in every split."""
    benign_mixture: tuple[float, ...]
    """`SafetyWorldConfig.benign_mixture`: probabilities of the demonstrations' kinds for benign requests, in
    the order of `BENIGN_KINDS` (helpful, vague, refusal)."""
    harmful_mixture: tuple[float, ...]
    """`SafetyWorldConfig.harmful_mixture`: the same for harmful requests, in the order of `HARMFUL_KINDS`."""
    pairs_per_prompt: int
    """`SafetyWorldConfig.pairs_per_prompt`: preference pairs drawn per prompt."""
    annotator_temperature: float
    """`SafetyWorldConfig.annotator_temperature`: T of the simulated annotators' Bradley–Terry choice, > 0."""
    reward_training: RewardTrainingConfig
    """The reward models' shape and training."""

    def __post_init__(self):
        _int_at_least(self.tokenizer_vocab_size, self._dotted("tokenizer_vocab_size"))
