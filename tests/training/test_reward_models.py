"""Bradley–Terry training of score models (`gd2po_jax.training.reward_models`): the loss, the pair data and
the batched scoring of pairs."""

import datasets
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gd2po_jax.data.corpus_tokenizer import build_tokenizer
from gd2po_jax.models import ScoreModel
from gd2po_jax.training import reward_models as rt
from gd2po_jax.rewards.reward_model import render_conversation
from gd2po_jax.tasks.safety_embedded import world as sw
from tests.fakes import tiny_model_config


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(sw.world_corpus(), vocab_size=1024)


def test_loss_is_bradley_terry_plus_the_mean_squared_score():
    better, worse = np.array([1.0, -0.5, 2.0]), np.array([0.0, 0.5, 2.5])
    loss, metrics = rt.bradley_terry_loss(jnp.asarray(better), jnp.asarray(worse), 0.01)
    bt = np.mean(np.log1p(np.exp(-(better - worse))))  # -log sigmoid(d)
    squares = np.mean(np.concatenate([better, worse]) ** 2)
    np.testing.assert_allclose(float(metrics["bt_loss"]), bt, rtol=1e-6)
    np.testing.assert_allclose(float(loss), bt + 0.01 * squares, rtol=1e-6)
    assert float(metrics["accuracy"]) == pytest.approx(1 / 3)


def test_pair_data_puts_the_preferred_response_first_rendered_as_the_reward_model_reads_it(tokenizer):
    pairs = datasets.Dataset.from_dict({"prompt": ["How do I clean a dirty oven?"] * 2,
                                        "response_0": ["Hmm. That depends.", "I can't help with that."],
                                        "response_1": ["Mix baking soda with a little water.", "Well."],
                                        "better_response_id": [1, 0]})
    data = rt.build_pair_data(pairs, "better_response_id", tokenizer, max_length=64, where="pairs")
    messages = [{"role": "user", "content": "How do I clean a dirty oven?"}]
    for i, (better, worse) in enumerate([("Mix baking soda with a little water.", "Hmm. That depends."),
                                         ("I can't help with that.", "Well.")]):
        for ids, mask, text in ((data.better_ids, data.better_mask, better), (data.worse_ids, data.worse_mask, worse)):
            expected = tokenizer(render_conversation(tokenizer, messages, text), add_special_tokens=False)["input_ids"]
            assert ids[i, :mask[i].sum()].tolist() == expected
            assert mask[i, :len(expected)].all() and not mask[i, len(expected):].any()  # right-padded
    assert data.better_ids.shape[1] in (16, 32, 64)  # a length bucket


def test_pair_data_errors_name_the_row(tokenizer):
    pairs = datasets.Dataset.from_dict({"prompt": ["a", "b"], "response_0": ["x", "y"], "response_1": ["z", "w"],
                                        "safer_response_id": [0, 2]})
    with pytest.raises(ValueError, match=r"pairs, row 1 \(0-based\): safer_response_id=2"):
        rt.build_pair_data(pairs, "safer_response_id", tokenizer, max_length=64, where="pairs")
    with pytest.raises(ValueError, match=r"no column \['better_response_id'\]"):
        rt.build_pair_data(pairs, "better_response_id", tokenizer, max_length=64, where="pairs")
    long = pairs.map(lambda row: {"response_0": "word " * 80, "safer_response_id": 0})
    with pytest.raises(ValueError, match=r"pairs, row 0 \(0-based\): the better conversation has \d+ tokens, more "
                                         "than max_length=64"):
        rt.build_pair_data(long, "safer_response_id", tokenizer, max_length=64, where="pairs")


def test_pair_scores_score_every_pair_once_in_fixed_size_batches(tokenizer):
    """The last batch is filled with repeats whose scores are dropped; the scores are the model's own.
    (Training is measured end to end: tests/tasks/safety_embedded/test_task.py, held-out accuracy.)"""
    pairs = sw.make_preference_pairs(sw.SafetyWorldConfig(num_train=5, num_validation=0, num_test=0,
                                                          pairs_per_prompt=1))["train"]
    data = rt.build_pair_data(pairs, "safer_response_id", tokenizer, max_length=128, where="pairs")
    model = ScoreModel(tiny_model_config(vocab_size=len(tokenizer), num_layers=1), rngs=nnx.Rngs(0))
    better, worse = rt.pair_scores(model, data, batch_size=4)  # rows 0-3, then 4 + repeats of 0-2
    assert better.shape == worse.shape == (5,)
    flipped = rt.PairData(data.worse_ids[::-1], data.worse_mask[::-1], data.better_ids[::-1], data.better_mask[::-1])
    again = rt.pair_scores(model, flipped, batch_size=4)  # the same program: rows 4-1, then 0 + repeats
    np.testing.assert_allclose(better, again[1][::-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(worse, again[0][::-1], rtol=1e-5, atol=1e-6)
    assert not np.allclose(better, worse)
    assert rt.pairwise_accuracy(better, worse) == np.mean(better > worse)
    assert rt.pairwise_accuracy(better, worse, rows=[0]) == float(better[0] > worse[0])
