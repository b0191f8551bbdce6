"""Supervised warm start: next-token cross-entropy on the ``target`` column (ToolRL SFT style).

Each example is the chat-template prompt followed by the target and the template's end-of-turn
text; the loss covers the completion tokens only. Sequences are right-padded to one fixed length so
the step compiles once.
"""

from __future__ import annotations

import dataclasses

import datasets
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from gd2po_jax import losses
from gd2po_jax.data.chat import render_sft_example
from gd2po_jax.train_step import TrainState, _cast, unembedding


@dataclasses.dataclass(frozen=True)
class SFTData:
    """Tokenized examples. input_ids: [N, S] int32 (right-padded); loss_mask: [N, S] bool, True
    on completion tokens (positions whose token is predicted from the ones before)."""

    input_ids: np.ndarray
    loss_mask: np.ndarray

    def __len__(self) -> int:
        return len(self.input_ids)


def build_sft_data(dataset: datasets.Dataset, tokenizer, *, max_length: int, where: str) -> SFTData:
    """Tokenize the rows of ``dataset`` that have a ``target``.

    Raises:
      ValueError: no row has a target, or an example is longer than ``max_length`` (naming the row).
    """
    sequences, masks = [], []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for row, (messages, target) in enumerate(zip(dataset["prompt"], dataset["target"])):
        if not target:
            continue
        prompt_text, completion_text = render_sft_example(messages, target, tokenizer)
        prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(completion_text, add_special_tokens=False)["input_ids"]
        ids = list(prompt_ids) + list(completion_ids)
        if len(ids) > max_length:
            raise ValueError(
                f"{where}, row {row} (0-based): prompt + target is {len(ids)} tokens, more than "
                f"config.sft.max_length={max_length}"
            )
        sequences.append(ids)
        masks.append([False] * len(prompt_ids) + [True] * len(completion_ids))
    if not sequences:
        raise ValueError(f"{where}: no row has a 'target' to train on (config.sft)")
    length = max(len(s) for s in sequences)
    input_ids = np.full((len(sequences), length), pad_id, np.int32)
    loss_mask = np.zeros((len(sequences), length), bool)
    for i, (ids, mask) in enumerate(zip(sequences, masks)):
        input_ids[i, : len(ids)] = ids
        loss_mask[i, : len(mask)] = mask
    return SFTData(input_ids=input_ids, loss_mask=loss_mask)


def make_sft_step(graphdef, optimizer: optax.GradientTransformation, *, compute_dtype="float32",
                  chunk_size: int = 128):
    """``step(state, input_ids [B, S], loss_mask [B, S]) -> (state, metrics)``, to be jitted."""

    def loss_fn(params, input_ids, loss_mask):
        model = nnx.merge(graphdef, _cast(params, jnp.dtype(compute_dtype)))
        # Right padding only follows the real tokens, which causal attention never lets them see.
        hidden, _ = model.hidden_states(input_ids)
        logp, _ = losses.chunked_token_logprobs(
            hidden[:, :-1], unembedding(model), input_ids[:, 1:], chunk_size=chunk_size
        )
        mask = loss_mask[:, 1:]
        numerator, denominator = losses.aggregate_loss(-logp, mask, "token-mean")
        return losses.safe_ratio(numerator, denominator), denominator

    def step(state: TrainState, input_ids, loss_mask):
        (loss, tokens), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, input_ids, loss_mask)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"sft/loss": loss, "sft/tokens": tokens, "sft/grad_norm": optax.global_norm(grads)}
        return TrainState(params=params, opt_state=opt_state, step=state.step + 1, rng=state.rng), metrics

    return step


def sft_batches(num_examples: int, batch_size: int, num_steps: int, seed: int):
    """Row indices of ``num_steps`` batches: epochs of seeded permutations, concatenated."""
    needed = num_steps * batch_size
    orders = []
    epoch = 0
    while sum(len(o) for o in orders) < needed:
        orders.append(np.random.default_rng([seed, 10_000 + epoch]).permutation(num_examples))
        epoch += 1
    flat = np.concatenate(orders)[:needed] if orders else np.zeros((0,), np.int64)
    return flat.reshape(num_steps, batch_size)
