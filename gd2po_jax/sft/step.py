"""Supervised warm start: next-token cross-entropy on the ``target`` column (ToolRL SFT style).

Each example is the chat-template prompt followed by the target and the template's end-of-turn
text; the loss covers the completion tokens only. Prompts are left-padded to one length ``Lp`` and
completions right-padded to ``Lc``, the layout of the RL batch, so the vocabulary projection only
runs on the completion positions. With a length bucket (``config.sft.length_bucket``) both lengths are
multiples of it and each batch is cut to the shortest prompt window that holds its longest prompt
(`batch_window`): fewer padded slots, and sequence lengths the matrix kernels handle at full speed
(an SFT step of 16 x 272 tokens took 0.107 s where 16 x 275 took 0.125 s: docs/speed.md); each
window is one more compiled shape of the step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import datasets
import jax
import numpy as np
import optax

from gd2po_jax.data.chat import check_template_kwargs, column_tools, render_sft_example, with_tools
from gd2po_jax.data.loaders import dataset_columns
from gd2po_jax.data.tokenization import eos_token_ids, pad_token_id
from gd2po_jax.models.logprobs import completion_logprobs, merge_model
from gd2po_jax.rl import losses
from gd2po_jax.training.records import TrainState


@dataclasses.dataclass(frozen=True)
class SFTData:
    """Tokenized examples, ``S = Lp + Lc``.

    input_ids: [N, S] int32, left-padded prompt then right-padded completion.
    attention_mask: [N, S] bool, False on the prompt's left padding.
    loss_mask: [N, Lc] bool, the completion tokens to predict.
    prompt_lengths: [N] int32, each example's prompt tokens (the rest of its ``Lp`` is padding).
    length_bucket: ``Lp`` and ``Lc`` are multiples of it, and so are the batch windows; 0: none.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    loss_mask: np.ndarray
    prompt_lengths: np.ndarray
    length_bucket: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def prompt_length(self) -> int:
        """``Lp``: the prompt columns (``S - Lc``)."""
        return self.input_ids.shape[1] - self.loss_mask.shape[1]


def build_sft_data(
    dataset: datasets.Dataset,
    tokenizer,
    *,
    max_length: int,
    where: str,
    template_kwargs: Mapping[str, Any] | None = None,
    tools_column: str = "",
    length_bucket: int = 0,
) -> SFTData:
    """Tokenize the rows of ``dataset`` that have a ``target``, rendered as RL renders its prompts.

    Args:
      template_kwargs: keyword arguments of the chat template (``config.data.template_kwargs``).
      tools_column: the column of each row's tools, passed as ``tools=`` (``config.data.tools_column``,
        `gd2po_jax.data.chat.column_tools`); empty: none.
      length_bucket: > 0: ``Lp`` and ``Lc`` are rounded up to multiples of it (``config.sft.length_bucket``).

    Raises:
      ValueError: no row has a target, an example is longer than ``max_length`` (naming the row), a
        missing ``tools_column`` or a bad value of it, or refused template arguments.
    """
    prompts, completions = [], []
    pad_id = pad_token_id(tokenizer, eos_token_ids(tokenizer))
    template_kwargs = check_template_kwargs(template_kwargs or {}, tools_column=tools_column)
    tools = column_tools(dataset_columns(dataset, where=where), tools_column, where) if tools_column else None
    for row, (messages, target) in enumerate(zip(dataset["prompt"], dataset["target"])):
        if not target:
            continue
        row_kwargs = with_tools(template_kwargs, None if tools is None else tools[row])
        prompt_text, completion_text = render_sft_example(messages, target, tokenizer, **row_kwargs)
        prompt_ids = list(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
        completion_ids = list(tokenizer(completion_text, add_special_tokens=False)["input_ids"])
        if len(prompt_ids) + len(completion_ids) > max_length:
            raise ValueError(
                f"{where}, row {row} (0-based): prompt + target is {len(prompt_ids) + len(completion_ids)} "
                f"tokens, more than config.sft.max_length={max_length}"
            )
        prompts.append(prompt_ids)
        completions.append(completion_ids)
    if not prompts:
        raise ValueError(
            f"{where}: no row has a 'target' to train on (config.sft); give the data a target column, or "
            "--config.sft.enabled=False to run RL without a warm start"
        )
    prompt_length = _round_up(max(len(p) for p in prompts), length_bucket)
    completion_length = _round_up(max(len(c) for c in completions), length_bucket)
    count = len(prompts)
    input_ids = np.full((count, prompt_length + completion_length), pad_id, np.int32)
    attention_mask = np.ones((count, prompt_length + completion_length), bool)
    loss_mask = np.zeros((count, completion_length), bool)
    for i, (prompt_ids, completion_ids) in enumerate(zip(prompts, completions)):
        input_ids[i, prompt_length - len(prompt_ids) : prompt_length] = prompt_ids
        attention_mask[i, : prompt_length - len(prompt_ids)] = False
        input_ids[i, prompt_length : prompt_length + len(completion_ids)] = completion_ids
        loss_mask[i, : len(completion_ids)] = True
    return SFTData(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        prompt_lengths=np.array([len(p) for p in prompts], np.int32),
        length_bucket=length_bucket,
    )


def _round_up(length: int, bucket: int) -> int:
    return -(-length // bucket) * bucket if bucket > 0 else length


def batch_window(data: SFTData, rows: np.ndarray) -> int:
    """The prompt columns a batch of ``rows`` is trained on: the shortest multiple of
    ``data.length_bucket`` that holds its longest prompt (at most ``Lp``); ``Lp`` without a bucket.

    The batch is ``data.input_ids[rows, Lp - window:]``: only left padding is cut, which the
    attention mask hides and the positions (``cumsum(mask) - 1``) skip, so the loss is the full
    layout's up to the order of float sums.
    """
    if not data.length_bucket:
        return data.prompt_length
    return min(data.prompt_length, _round_up(int(data.prompt_lengths[rows].max()), data.length_bucket))


def padding_share(data: SFTData, rows: np.ndarray, first: int) -> float:
    """The share of a batch's slots that hold no token: left padding of its window (from column
    ``first``) and the completions' right padding."""
    completion_tokens = int(data.loss_mask[rows].sum())
    slots = len(rows) * (data.input_ids.shape[1] - first)
    return 1.0 - (int(data.prompt_lengths[rows].sum()) + completion_tokens) / slots


def make_sft_step(graphdef, optimizer: optax.GradientTransformation, *, compute_dtype="float32", chunk_size: int = 128):
    """``step(state, input_ids [B, S], attention_mask [B, S], loss_mask [B, Lc]) -> (state,
    metrics)``, to be jitted."""

    def loss_fn(params, input_ids, attention_mask, loss_mask):
        model = merge_model(graphdef, params, compute_dtype)
        logp, _ = completion_logprobs(model, input_ids, attention_mask, loss_mask.shape[1], chunk_size=chunk_size)
        numerator, denominator = losses.aggregate_loss(-logp, loss_mask, "token-mean")
        return losses.safe_ratio(numerator, denominator), denominator

    def step(state: TrainState, input_ids, attention_mask, loss_mask):
        (loss, tokens), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, input_ids, attention_mask, loss_mask
        )
        metrics = {"sft/loss": loss, "sft/tokens": tokens, "sft/grad_norm": optax.tree.norm(grads)}
        return state.apply_gradients(optimizer, grads), metrics

    return step
