"""Prompts on the host: rendered once through the chat template, tokenized once, and served in
fixed-size batches in a seeded order whose position is saved in checkpoints."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import datasets
import numpy as np

from gd2po_jax.data.chat import check_template_kwargs, column_tools, render_prompts
from gd2po_jax.data.columns import PROMPT, RESPONSE_IDS, ROLLOUT_INDEX
from gd2po_jax.data.schema import dataset_columns
from gd2po_jax.errors import UserError

logger = logging.getLogger(__name__)


class PromptError(UserError, ValueError):
    """A prompt of the data that cannot be used (too long, no tokens ...); the message names where it
    is (the file or field) and the row (`build_prompt_set`)."""


@dataclasses.dataclass(frozen=True)
class PromptSet:
    """N prompts ready for the sampler.

    texts: N rendered prompt strings (what reward functions receive as ``prompts``; whole, also
      where ``token_ids`` were cut on the left).
    token_ids: N token-id lists (unpadded): what the policy reads.
    columns: the dataset's columns (``prompt``, the chat messages; ground_truth, level, prompt_text,
      ...) but ``extra_columns``, then the rows' extra columns decoded (a data file's own columns:
      `gd2po_jax.data.schema.dataset_columns`; ``columns["answer"][i]`` is row i's answer), N
      values each: what reward functions receive as ``columns``.
    """

    texts: list[str]
    token_ids: list[list[int]]
    columns: dict[str, list[Any]]

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def max_tokens(self) -> int:
        return max((len(ids) for ids in self.token_ids), default=0)

    @property
    def min_tokens(self) -> int:
        return min((len(ids) for ids in self.token_ids), default=0)

    def extend(self, other: PromptSet) -> None:
        """Appends ``other``'s prompts, which have the same columns, in place."""
        if set(other.columns) != set(self.columns):
            raise ValueError(f"prompt columns {sorted(other.columns)} do not match {sorted(self.columns)}")
        self.texts.extend(other.texts)
        self.token_ids.extend(other.token_ids)
        for name, values in self.columns.items():
            values.extend(other.columns[name])

    def select(self, indices: Sequence[int]) -> PromptSet:
        """The prompts at ``indices`` (repeats allowed), in that order."""
        return PromptSet(
            texts=[self.texts[i] for i in indices],
            token_ids=[self.token_ids[i] for i in indices],
            columns={name: [values[i] for i in indices] for name, values in self.columns.items()},
        )


def build_prompt_set(
    dataset: datasets.Dataset,
    tokenizer,
    *,
    max_prompt_tokens: int,
    where: str,
    truncation: str | None = "error",
    template_kwargs: Mapping[str, Any] | None = None,
    tools_column: str = "",
) -> PromptSet:
    """Render ``dataset["prompt"]`` with the chat template and tokenize.

    Args:
      truncation: what a prompt over ``max_prompt_tokens`` does: "error" (or None) raises; "left"
        keeps its last ``max_prompt_tokens`` tokens (verl's ``data.truncation=left``), logging how
        many were cut. ``texts`` and ``columns`` keep the whole prompt.
      template_kwargs: keyword arguments of ``apply_chat_template`` for every prompt
        (``config.data.template_kwargs``, e.g. ``{"enable_thinking": False}``); None: none.
      tools_column: a column (extra columns included) holding each row's tools, a list of
        JSON-schema dicts or that list as JSON text, passed as ``tools=`` (a row whose value is None:
        no tools); ``config.data.tools_column``. Empty: no tools.

    Raises:
      PromptError: a prompt longer than ``max_prompt_tokens`` (with "error") or one that renders to no
        tokens, naming ``where`` and the row.
      ValueError: a column named `RESPONSE_IDS` or `ROLLOUT_INDEX`, a missing ``tools_column`` or a bad
        value of it, or template arguments `check_template_kwargs` refuses, naming ``where`` and the
        row.
    """
    columns = dataset_columns(dataset, where=where)
    for name, what in (
        (RESPONSE_IDS, "the sampled token ids of each response"),
        (ROLLOUT_INDEX, "the index of each rollout in its step"),
    ):
        if name in columns:
            raise ValueError(
                f"{where}: a data column is named {name!r}, the name rollouts give {what}; rename the column"
            )
    template_kwargs = check_template_kwargs(template_kwargs or {}, tools_column=tools_column)
    tools = column_tools(columns, tools_column, where) if tools_column else None
    texts = render_prompts(columns[PROMPT], tokenizer, row_tools=tools, **template_kwargs)
    token_ids = [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    cut = 0
    for row, ids in enumerate(token_ids):
        if len(ids) > max_prompt_tokens:
            if truncation == "left":
                token_ids[row], cut = ids[-max_prompt_tokens:], cut + 1
                continue
            raise PromptError(
                f"{where}, row {row} (0-based): the prompt has {len(ids)} tokens, more than "
                f"config.data.max_prompt_tokens={max_prompt_tokens} (config.data.prompt_truncation='left' "
                "keeps the last ones instead)"
            )
        if not ids:
            raise PromptError(
                f"{where}, row {row} (0-based): the prompt renders to no tokens (is the tokenizer the model's?)"
            )
    if cut:
        logger.warning(
            "%s: %d of %d prompts are longer than config.data.max_prompt_tokens=%d and keep their last "
            "%d tokens (config.data.prompt_truncation='left')",
            where,
            cut,
            len(token_ids),
            max_prompt_tokens,
            max_prompt_tokens,
        )
    return PromptSet(texts=texts, token_ids=token_ids, columns=columns)


@dataclasses.dataclass
class EpochSampler:
    """Indices of ``num_prompts`` items in a fresh seeded permutation each epoch.

    The position (``epoch``, ``offset``) is all the state there is: save it, restore it, and the
    same batches follow. As verl's training DataLoader (``drop_last=True``), an epoch serves only
    full batches: the last ``size % num_prompts`` items of its permutation are skipped, and the
    next batch starts the next epoch. Only a data set smaller than one batch lets a batch span
    epochs (verl would have no batch at all).
    """

    size: int
    seed: int
    epoch: int = 0
    offset: int = 0

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.size)

    def next_batch(self, num_prompts: int) -> list[int]:
        """The next ``num_prompts`` indices (distinct unless the data has fewer items)."""
        if self.size == 0:
            raise ValueError("the training data is empty")
        if num_prompts > self.size:
            return self._spanning_batch(num_prompts)
        if self.offset + num_prompts > self.size:  # the rest of the epoch is a partial batch: skipped
            self.epoch, self.offset = self.epoch + 1, 0
        take = self._order(self.epoch)[self.offset : self.offset + num_prompts]
        self.offset += num_prompts
        if self.offset == self.size:
            self.epoch, self.offset = self.epoch + 1, 0
        return [int(i) for i in take]

    def _spanning_batch(self, num_prompts: int) -> list[int]:
        """A batch larger than the data: the rest of this epoch, then whole epochs, then the start
        of the next one."""
        indices: list[int] = []
        while len(indices) < num_prompts:
            order = self._order(self.epoch)
            take = order[self.offset : self.offset + num_prompts - len(indices)]
            indices.extend(int(i) for i in take)
            self.offset += len(take)
            if self.offset >= self.size:
                self.epoch, self.offset = self.epoch + 1, 0
        return indices

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def check_state(self, state: Any) -> dict[str, int]:
        """``state`` (a checkpoint's data position) if `state` could have written it for this data:
        a JSON object of exactly the integers ``epoch`` >= 0 and ``offset`` in [0, size).

        Raises:
          ValueError: naming what is wrong (a checkpoint whose position is damaged).
        """
        if not isinstance(state, dict) or set(state) != {"epoch", "offset"}:
            raise ValueError(f"the data position is not {{'epoch': E, 'offset': O}}: {state!r}")
        epoch, offset = state["epoch"], state["offset"]
        if type(epoch) is not int or type(offset) is not int:
            raise ValueError(f"the data position's epoch and offset are not integers: {state!r}")
        if epoch < 0 or not 0 <= offset < max(self.size, 1):
            raise ValueError(f"the data position {state!r} is out of bounds for {self.size} prompts")
        return {"epoch": epoch, "offset": offset}

    def restore(self, state: dict[str, int]) -> None:
        """Move to ``state`` (`check_state` checks it first).

        Raises:
          ValueError: ``state`` is not a data position of this data (`check_state`).
        """
        state = self.check_state(state)
        self.epoch, self.offset = state["epoch"], state["offset"]


def padded_batches(num_items: int, batch_size: int) -> list[tuple[list[int], int]]:
    """Fixed-size batches over ``range(num_items)``: (indices, number of real items). The last batch
    is filled by repeating its first item, so every batch has one shape (one compiled program)."""
    batches = []
    for start in range(0, num_items, batch_size):
        real = list(range(start, min(start + batch_size, num_items)))
        batches.append((real + [real[0]] * (batch_size - len(real)), len(real)))
    return batches
