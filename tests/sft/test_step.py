"""Tests of gd2po_jax.sft.step: the tokenized layout, its errors, and that the step learns."""

import json

import datasets
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from gd2po_jax.models import Decoder
from gd2po_jax.training.optimizer import make_optimizer
from gd2po_jax.training.records import TrainState
from gd2po_jax.sft.step import batch_window, build_sft_data, make_sft_step, padding_share
from tests.data.test_chat import CLOCK, TOOLS_TEMPLATE, WEATHER, chat_tokenizer
from tests.fakes import TagTokenizer, tiny_model_config


def _dataset(rows):
    return datasets.Dataset.from_dict({
        "prompt": [[{"role": "user", "content": p}] for p, _ in rows],
        "target": [t for _, t in rows],
    })


def test_layout_left_pads_prompts_and_masks_completions():
    data = build_sft_data(_dataset([("ab", "xyz"), ("abcd", "q"), ("z", None)]), TagTokenizer(),
                          max_length=64, where="sft.json")
    assert len(data) == 2  # the row without a target is not trained on
    prompt_len = len("<user>abcd<assistant>")
    assert data.input_ids.shape == (2, prompt_len + 3)
    assert data.loss_mask.tolist() == [[True, True, True], [True, False, False]]
    short = len("<user>ab<assistant>")
    assert not data.attention_mask[0, : prompt_len - short].any() and data.attention_mask[0, prompt_len - short :].all()
    assert data.input_ids[0, prompt_len:].tolist() == [ord(c) % 62 + 2 for c in "xyz"]
    assert data.input_ids[1, prompt_len + 1 :].tolist() == [0, 0]  # right padding
    with pytest.raises(ValueError, match=r"sft.json, row 1 \(0-based\): prompt \+ target is 22 tokens, more "
                                         r"than config.sft.max_length=20"):
        build_sft_data(_dataset([("ab", "x"), ("abcd", "q")]), TagTokenizer(), max_length=20, where="sft.json")
    with pytest.raises(ValueError, match=r"no row has a 'target'.*--config.sft.enabled=False"):
        build_sft_data(_dataset([("ab", None)]), TagTokenizer(), max_length=64, where="sft.json")


def test_examples_render_with_the_template_kwargs_and_each_rows_tools():
    """The warm start's prompts are RL's: the run's template arguments and each row's tools."""
    dataset = _dataset([("U", "A"), ("U", "A")]).add_column("tools", [json.dumps([WEATHER, CLOCK]), None])
    tokenizer = chat_tokenizer(TOOLS_TEMPLATE)
    data = build_sft_data(dataset, tokenizer, max_length=64, where="sft.jsonl",
                          template_kwargs={"enable_thinking": False}, tools_column="tools")
    texts = [tokenizer.decode(ids[mask].tolist()) for ids, mask in zip(data.input_ids, data.attention_mask)]
    assert texts[0].startswith("TOOLS get_weather get_time NOTHINK [UNK]")  # [UNK]: the pieces of <|im_start|>
    assert texts[1].startswith("NOTHINK [UNK]")
    with pytest.raises(ValueError, match=r"^sft.jsonl: config.data.tools_column='functions' is not a column"):
        build_sft_data(dataset, tokenizer, max_length=64, where="sft.jsonl", tools_column="functions")


def test_sft_step_fits_a_small_batch():
    data = build_sft_data(_dataset([("ab", "xy"), ("cd", "zw"), ("ef", "uv"), ("gh", "st")]), TagTokenizer(),
                          max_length=64, where="sft.json")
    config = tiny_model_config()  # vocabulary 64, as TagTokenizer's ids
    graphdef, params = nnx.split(Decoder(config, rngs=nnx.Rngs(0)), nnx.Param)
    optimizer = make_optimizer(1e-2, weight_decay=0.0)
    state = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(0))
    step = jax.jit(make_sft_step(graphdef, optimizer), donate_argnums=(0,))
    batch = tuple(jnp.asarray(a) for a in (data.input_ids, data.attention_mask, data.loss_mask))
    losses = []
    for _ in range(25):
        state, metrics = step(state, *batch)
        losses.append(float(metrics["sft/loss"]))
    assert float(metrics["sft/tokens"]) == data.loss_mask.sum()
    assert losses[0] > np.log(64) * 0.8  # starts near uniform over the vocabulary
    assert losses[-1] < 0.25 * losses[0]


WINDOW_ROWS = [("ab", "xyz"), ("abcdefghijk", "q"), ("abc", "uvwxyzuvw"), ("abcd", "pq")]


def test_a_length_bucket_pads_both_parts_to_its_multiples_and_cuts_each_batch_to_its_prompt_window():
    plain = build_sft_data(_dataset(WINDOW_ROWS), TagTokenizer(), max_length=64, where="sft.json")
    data = build_sft_data(_dataset(WINDOW_ROWS), TagTokenizer(), max_length=64, where="sft.json", length_bucket=8)
    shortest, longest = len("<user>ab<assistant>"), len("<user>abcdefghijk<assistant>")  # 19 and 28 tokens
    assert data.prompt_lengths.tolist() == [shortest, longest, shortest + 1, shortest + 2]
    assert plain.input_ids.shape == (4, longest + 9)  # the longest target: 9 tokens
    assert data.input_ids.shape == (4, 32 + 16) and data.loss_mask.shape == (4, 16)
    # The same tokens, only more padding: left of the prompts and right of the completions.
    np.testing.assert_array_equal(data.input_ids[:, 32 - longest : 32 + 9], plain.input_ids)
    np.testing.assert_array_equal(data.loss_mask[:, :9], plain.loss_mask)
    assert not data.loss_mask[:, 9:].any() and not data.attention_mask[:, : 32 - longest].any()
    # A batch's window: the shortest multiple of 8 holding its longest prompt; without a bucket, Lp.
    assert batch_window(data, np.array([0, 2, 3])) == 24 and batch_window(data, np.array([3, 1])) == 32
    assert batch_window(plain, np.array([0, 2])) == longest
    # Rows 0 and 3 in a 24-token window: prompts of 19 and 21 tokens, targets "xyz" and "pq", in
    # 2 x (24 + 16) slots.
    assert padding_share(data, np.array([0, 3]), 32 - 24) == pytest.approx(1 - (19 + 21 + 3 + 2) / 80)


def test_a_batch_cut_to_its_window_trains_as_the_full_layout():
    """Only left padding is cut (masked, and skipped by the positions): the loss and the update equal
    the unbucketed layout's up to the order of float sums."""
    plain = build_sft_data(_dataset(WINDOW_ROWS), TagTokenizer(), max_length=64, where="sft.json")
    data = build_sft_data(_dataset(WINDOW_ROWS), TagTokenizer(), max_length=64, where="sft.json", length_bucket=8)
    graphdef, params = nnx.split(Decoder(tiny_model_config(), rngs=nnx.Rngs(0)), nnx.Param)
    optimizer = optax.sgd(1.0)
    step = jax.jit(make_sft_step(graphdef, optimizer))
    rows = np.array([0, 2, 3])  # prompts of 19-21 tokens: a 24-token window of the 32
    updates = []
    for layout, first in ((plain, 0), (data, 32 - batch_window(data, rows))):
        state = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(0))
        batch = (layout.input_ids[rows, first:], layout.attention_mask[rows, first:], layout.loss_mask[rows])
        assert batch[0].shape[1] == (plain.input_ids.shape[1] if layout is plain else 24 + 16)
        updates.append(step(state, *(jnp.asarray(a) for a in batch)))
    (plain_state, plain_metrics), (cut_state, cut_metrics) = updates
    assert float(cut_metrics["sft/tokens"]) == float(plain_metrics["sft/tokens"]) == plain.loss_mask[rows].sum()
    np.testing.assert_allclose(cut_metrics["sft/loss"], plain_metrics["sft/loss"], rtol=1e-6)
    np.testing.assert_allclose(cut_metrics["sft/grad_norm"], plain_metrics["sft/grad_norm"], rtol=1e-5)
    for cut, full, start in zip(jax.tree.leaves(cut_state.params), jax.tree.leaves(plain_state.params),
                                jax.tree.leaves(params)):
        np.testing.assert_allclose(cut - start, full - start, rtol=1e-4, atol=1e-7)
