"""``config.data`` (`DataConfig`): where the prompts (and the warm start's targets) come from, and how
they become model input.

May import: gd2po_jax.config.base, gd2po_jax.config.tasks.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from gd2po_jax.config.base import (
    _OMIT_IF_NONE,
    _int_at_least,
    _literal_or_text,
    _one_of,
    _require,
    _Section,
    _text,
)
from gd2po_jax.config.tasks import SafetyDataConfig, SyntheticDataConfig

DATA_KINDS = ("verl", "toolrl_sft", "api_bank", "jsonl")
"""The data file formats of ``config.data.kind`` besides auto (`gd2po_jax.data.loaders`)."""
PROMPT_TRUNCATIONS = ("error", "left")
"""The values of ``config.data.prompt_truncation``."""


@dataclasses.dataclass(frozen=True)
class DataConfig(_Section):
    """``config.data``: where the prompts (and the warm start's targets) come from."""

    _path: ClassVar[str] = "data"

    train: str
    """The files task's training data (`gd2po_jax.data.sources`): a verl parquet, ToolRL JSON, API-Bank JSON
    or JSONL file, a directory or glob of such files, a datasets ``save_to_disk`` folder (``DIR`` or
    ``DIR:split``) or a Hub data set id (``org/name:split``)."""
    validation: str
    """The files task's validation data, as ``train``; may be empty."""
    test: str
    """The files task's test data, as ``train``; may be empty."""
    kind: str
    """The files' format: auto (from the extension and keys) or one of `DATA_KINDS`."""
    on_error: str
    """raise | skip: what a malformed row does (skipped rows are counted and logged)."""
    max_prompt_tokens: int
    """Longest prompt allowed, in tokens (after the chat template); what a longer one does is
    ``prompt_truncation``'s."""
    synthetic: SyntheticDataConfig
    """The generated task of ``task="synthetic_tools"``."""
    prompt_truncation: str | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    """error | left: a prompt over ``max_prompt_tokens`` is an error naming its row, or keeps its last
    ``max_prompt_tokens`` tokens (verl's ``data.truncation=left``; the number cut is logged). Reward functions
    still receive the whole prompt (its text and messages). None: error, and left out of `to_dict` (so the
    warm-start key of a config that does not set it stays what it was)."""
    safety: SafetyDataConfig | None = dataclasses.field(default=None, metadata=_OMIT_IF_NONE)
    """The generated world of ``task="safety_embedded"``; None (and out of `to_dict`) for the other tasks."""
    chat_template_kwargs: tuple[str, ...] = ()
    """Keyword arguments of the chat template (``apply_chat_template``), as ``NAME=VALUE`` strings whose value
    is a Python literal or else text, e.g. ``("enable_thinking=False",)`` for Qwen3
    (``--config.data.chat_template_kwargs=enable_thinking=False``); `DataConfig.template_kwargs` gives them
    as a dict. Empty: none."""
    tools_column: str = ""
    """The name of a data column holding each row's tool schemas (a list of JSON-schema dicts, or that list
    as JSON text), passed to the chat template as ``tools=`` (a row whose value is null: no tools). Empty:
    none."""

    def __post_init__(self):
        _require(
            isinstance(self.chat_template_kwargs, tuple),
            "data.chat_template_kwargs",
            f"must be a tuple of NAME=VALUE strings, got {self.chat_template_kwargs!r}",
        )
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
            _require(
                bool(equals) and name.strip().isidentifier(),
                f"data.chat_template_kwargs[{i}]",
                f"{entry!r} is not NAME=VALUE (e.g. enable_thinking=False)",
            )
            kwargs[name.strip()] = _literal_or_text(text.strip())
        return kwargs
