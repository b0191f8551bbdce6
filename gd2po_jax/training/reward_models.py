"""Reward models trained on preference pairs, as align-anything trains the GD2PO paper's ones.

A `gd2po_jax.models.ScoreModel` scores the rendered conversation (prompt + response, the score
model's chat template, ``add_generation_prompt=False``) at its last token. For a pair whose
preferred ("better") response has score r_b and the other r_w, the loss is the Bradley–Terry
negative log-likelihood plus align-anything's score regularizer (``train_cfgs.regularization``,
0.001 in its reward-model configs):

    loss = mean_pairs( -log sigmoid(r_b - r_w) ) + regularization * mean( [r_b, r_w]^2 )

(the second mean is over both responses of every pair). The regularizer keeps the scores near 0,
so that a model's scale does not drift where the pairs do not pin it. Pairwise accuracy is the
share of pairs with r_b > r_w. The optimizer is AdamW (betas 0.9 / 0.95, no weight decay, as
align-anything's defaults; gradients clipped to global norm 1, as its DeepSpeed configs'
``gradient_clipping``) with a 3% linear warm-up then cosine decay to 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import nnx

from gd2po_jax.data.tokenization import eos_token_ids, pad_token_id
from gd2po_jax.models import ScoreModel
from gd2po_jax.models.sampling import bucket_length
from gd2po_jax.rewards.reward_model import render_conversation
from gd2po_jax.training.batches import sft_batches
from gd2po_jax.training.optimizer import init_optimizer_state, make_optimizer
from gd2po_jax.training.records import TrainState

ADAM_B2 = 0.95  # align-anything's adam_betas: [0.9, 0.95]
WARMUP_FRACTION = 0.03  # align-anything's lr_warmup_ratio


def bradley_terry_loss(better: jax.Array, worse: jax.Array, regularization: float) -> tuple[jax.Array, dict]:
    """The reward-model loss of a batch of pairs and its metrics.

    Args:
      better: [B] scores of the preferred responses; worse: [B] of the others.
      regularization: the coefficient of the mean squared score (align-anything: 0.001).

    Returns:
      (loss, {"loss", "bt_loss", "accuracy", "score_mean", "score_abs_mean"}), scalars.
    """
    bt_loss = -jnp.mean(jax.nn.log_sigmoid(better - worse))
    both = jnp.stack([better, worse])
    loss = bt_loss + regularization * jnp.mean(jnp.square(both))
    metrics = {
        "loss": loss,
        "bt_loss": bt_loss,
        "accuracy": jnp.mean((better > worse).astype(jnp.float32)),
        "score_mean": jnp.mean(both),
        "score_abs_mean": jnp.mean(jnp.abs(both)),
    }
    return loss, metrics


@dataclasses.dataclass(frozen=True)
class PairData:
    """Tokenized preference pairs, right-padded to one length T.

    better_ids, worse_ids: [N, T] int32 token ids of the preferred / other conversation.
    better_mask, worse_mask: [N, T] bool, True on tokens.
    """

    better_ids: np.ndarray
    better_mask: np.ndarray
    worse_ids: np.ndarray
    worse_mask: np.ndarray

    def __len__(self) -> int:
        return len(self.better_ids)

    def batch(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.better_ids[rows], self.better_mask[rows], self.worse_ids[rows], self.worse_mask[rows]


def build_pair_data(pairs, preference: str, tokenizer, *, max_length: int, where: str) -> PairData:
    """Tokenize PKU-SafeRLHF-shaped rows (``prompt``: the user's text, ``response_0``,
    ``response_1``) with ``preference`` (``better_response_id`` or ``safer_response_id``) naming
    the preferred response. Each conversation is rendered as the reward-model reward renders a
    rollout (`gd2po_jax.rewards.reward_model.render_conversation`: the tokenizer's chat template,
    ``add_generation_prompt=False``), tokenized without added special tokens, and right-padded.

    Raises:
      ValueError: a missing column, a preference id that is not 0 or 1, or a conversation longer
        than ``max_length`` tokens, naming ``where`` and the row.
    """
    missing = [c for c in ("prompt", "response_0", "response_1", preference) if c not in pairs.column_names]
    if missing:
        raise ValueError(
            f"{where}: no column {missing} (PKU-SafeRLHF's prompt, response_0, response_1 and {preference} are needed)"
        )
    texts: dict[str, list[str]] = {"better": [], "worse": []}
    for row, (prompt, first, second, preferred) in enumerate(
        zip(pairs["prompt"], pairs["response_0"], pairs["response_1"], pairs[preference])
    ):
        if preferred not in (0, 1):
            raise ValueError(f"{where}, row {row} (0-based): {preference}={preferred!r}, expected 0 or 1")
        messages = [{"role": "user", "content": prompt}]
        responses = (first, second)
        texts["better"].append(render_conversation(tokenizer, messages, responses[preferred]))
        texts["worse"].append(render_conversation(tokenizer, messages, responses[1 - preferred]))
    ids = {side: tokenizer(values, add_special_tokens=False)["input_ids"] for side, values in texts.items()}
    longest = 0
    for side in ids:
        for row, tokens in enumerate(ids[side]):
            if len(tokens) > max_length:
                raise ValueError(
                    f"{where}, row {row} (0-based): the {side} conversation has {len(tokens)} tokens, "
                    f"more than max_length={max_length}"
                )
            longest = max(longest, len(tokens))
    length = bucket_length(longest)
    pad_id = pad_token_id(tokenizer, eos_token_ids(tokenizer))
    arrays = {}
    for side, rows in ids.items():
        tokens = np.full((len(rows), length), pad_id, np.int32)
        mask = np.zeros((len(rows), length), bool)
        for i, row in enumerate(rows):
            tokens[i, : len(row)] = row
            mask[i, : len(row)] = True
        arrays[f"{side}_ids"], arrays[f"{side}_mask"] = tokens, mask
    return PairData(**arrays)


def make_reward_step(graphdef, optimizer: optax.GradientTransformation, regularization: float):
    """``step(state, better_ids, better_mask, worse_ids, worse_mask) -> (state, metrics)``, to be
    jitted: one AdamW update of `bradley_terry_loss` on ``[B, T]`` pairs (both sides in one
    forward pass)."""

    def loss_fn(params, better_ids, better_mask, worse_ids, worse_mask):
        model = nnx.merge(graphdef, params)
        scores = model.raw_scores(jnp.concatenate([better_ids, worse_ids]), jnp.concatenate([better_mask, worse_mask]))
        better, worse = jnp.split(scores, 2)
        return bradley_terry_loss(better, worse, regularization)

    def step(state: TrainState, *batch):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, *batch)
        metrics = metrics | {"grad_norm": optax.tree.norm(grads)}
        return state.apply_gradients(optimizer, grads), metrics

    return step


def train_reward_model(
    model: ScoreModel,
    data: PairData,
    *,
    num_steps: int,
    batch_size: int,
    learning_rate: float,
    regularization: float,
    seed: int,
    grad_clip: float = 1.0,
    progress: bool = True,
    desc: str = "reward model",
) -> tuple[ScoreModel, list[dict[str, float]]]:
    """Train ``model`` (in place: its parameters are replaced) for ``num_steps`` AdamW steps of
    ``batch_size`` pairs drawn in seeded epochs (`gd2po_jax.training.batches.sft_batches`).

    Returns:
      (the model, metrics logged every 10 steps and at the last: step, loss, bt_loss, accuracy,
      score_mean, score_abs_mean, grad_norm).
    """
    graphdef, params = nnx.split(model, nnx.Param)
    warmup = max(1, round(WARMUP_FRACTION * num_steps))
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup, max(warmup + 1, num_steps))
    optimizer = make_optimizer(schedule, weight_decay=0.0, grad_clip=grad_clip, b2=ADAM_B2)
    state = TrainState(
        params, init_optimizer_state(optimizer, params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(seed)
    )
    step_fn = jax.jit(make_reward_step(graphdef, optimizer, regularization), donate_argnums=(0,))
    order = sft_batches(len(data), batch_size, num_steps, seed)
    history = []
    bar = tqdm.tqdm(order, desc=desc, disable=not progress)
    for i, rows in enumerate(bar):
        state, metrics = step_fn(state, *(jnp.asarray(a) for a in data.batch(rows)))
        if i % 10 == 0 or i == len(order) - 1:
            record = {"step": i + 1} | {k: float(v) for k, v in jax.device_get(metrics).items()}
            history.append(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['accuracy']:.2f}")
    nnx.update(model, state.params)
    return model, history


def pair_scores(model: ScoreModel, data: PairData, batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """([N] scores of the preferred responses, [N] of the others), by the model's ``__call__``
    (normalized and signed as it is loaded), in fixed-size batches (the last one padded with
    repeats that are discarded, so one program is compiled)."""
    score = nnx.jit(lambda m, ids, mask: m(ids, mask))
    better, worse = [], []
    for start in range(0, len(data), batch_size):
        rows = np.arange(start, start + batch_size) % len(data)
        real = min(batch_size, len(data) - start)
        b_ids, b_mask, w_ids, w_mask = data.batch(rows)
        better.append(np.asarray(score(model, jnp.asarray(b_ids), jnp.asarray(b_mask)))[:real])
        worse.append(np.asarray(score(model, jnp.asarray(w_ids), jnp.asarray(w_mask)))[:real])
    return np.concatenate(better), np.concatenate(worse)


def pairwise_accuracy(better: np.ndarray, worse: np.ndarray, rows: Any = None) -> float:
    """Share of pairs (of ``rows``, default all) whose preferred response scores higher."""
    rows = slice(None) if rows is None else rows
    return float(np.mean(np.asarray(better)[rows] > np.asarray(worse)[rows]))
