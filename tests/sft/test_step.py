"""Tests of gd2po_jax.sft.step: the tokenized layout, its errors, and that the step learns."""

import json

import datasets
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gd2po_jax.models import Decoder
from gd2po_jax.rl.optimizer import make_optimizer
from gd2po_jax.rl.records import TrainState
from gd2po_jax.sft.step import build_sft_data, make_sft_step, sft_batches
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
    with pytest.raises(ValueError, match="no row has a 'target'"):
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


def test_sft_batches_are_epochs_of_permutations():
    order = sft_batches(num_examples=6, batch_size=4, num_steps=3, seed=0)
    assert order.shape == (3, 4)
    assert sorted(order.reshape(-1)[:6].tolist()) == list(range(6))


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
