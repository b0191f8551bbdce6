"""The task tokenizer: Qwen2-style special tokens, ToolRL tags, ChatML template, offline reload."""

import statistics

import pytest
from transformers import AutoTokenizer

from gd2po_jax.data.chat import render_prompt, render_sft_example
from gd2po_jax.data.corpus_tokenizer import (
    MIN_VOCAB_SIZE,
    SPECIAL_TOKENS,
    TAG_TOKENS,
    build_tokenizer,
)
from gd2po_jax.data.tokenization import eos_token_ids, load_tokenizer
from gd2po_jax.tasks.synthetic_tools import data as st

PROMPT_TOKEN_BUDGET = 256
COMPLETION_TOKEN_BUDGET = 96


@pytest.fixture(scope="module")
def splits():
    return st.make_splits()


@pytest.fixture(scope="module")
def saved(splits, tmp_path_factory):
    """(tokenizer, directory it was saved to), trained on the default train split."""
    out = tmp_path_factory.mktemp("tokenizer")
    corpus = [*st.iter_corpus(splits["train"]), *st.tool_corpus()]
    return build_tokenizer(corpus, vocab_size=2048, out_dir=out), out


@pytest.fixture(scope="module")
def tokenizer(saved):
    return saved[0]


def test_training_is_deterministic(splits, tokenizer):
    again = build_tokenizer([*st.iter_corpus(splits["train"]), *st.tool_corpus()], vocab_size=2048)
    assert again.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    smaller = build_tokenizer(st.iter_corpus(splits["train"]), vocab_size=600)
    assert len(smaller) <= 600 < len(tokenizer) <= 2048


def test_special_and_tag_tokens(tokenizer):
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None and tokenizer.padding_side == "left"
    assert set(tokenizer.all_special_tokens) == set(SPECIAL_TOKENS)
    for tag in TAG_TOKENS:
        ids = tokenizer(tag)["input_ids"]
        assert len(ids) == 1 and tokenizer.decode(ids, skip_special_tokens=True) == tag
    # no BOS or other token is added around plain text
    assert tokenizer.decode(tokenizer("Paris")["input_ids"]) == "Paris"


def test_targets_round_trip_with_tags_kept(splits, tokenizer):
    texts = list(splits["validation"]["target"]) + list(splits["validation"]["ground_truth"])
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    # a whole rendered turn decodes to the assistant text once special tokens are dropped
    row = splits["validation"][0]
    prompt, completion = render_sft_example(row["prompt"], row["target"], tokenizer)
    decoded = tokenizer.decode(tokenizer(completion)["input_ids"], skip_special_tokens=True)
    assert decoded == row["target"] + "\n" and "<think>" in decoded


def test_unseen_text_is_byte_level_lossless(tokenizer):
    text = "Grüße aus Köln 🙂 — naïve café\ttab"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_chat_template_is_chatml(tokenizer):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert render_prompt(messages, tokenizer) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    prompt, completion = render_sft_example(
        messages, "<think> x </think>\n<response> y </response>", tokenizer
    )
    assert completion == "<think> x </think>\n<response> y </response><|im_end|>\n"
    # the role lines are single tokens
    for role in ("system", "user", "assistant"):
        assert len(tokenizer(role + "\n")["input_ids"]) == 2


def test_reloads_offline_with_auto_tokenizer(saved, splits):
    tokenizer, out = saved
    reloaded = AutoTokenizer.from_pretrained(str(out))
    row = splits["test"][0]
    text = render_prompt(row["prompt"], tokenizer) + row["target"]
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert reloaded.chat_template == tokenizer.chat_template
    assert (reloaded.eos_token_id, reloaded.pad_token_id) == (2, 0)
    assert render_prompt(row["prompt"], reloaded) == render_prompt(row["prompt"], tokenizer)
    project = load_tokenizer(out)
    assert project.pad_token == "<|endoftext|>" and eos_token_ids(project) == [2]
    ids = project(render_prompt(row["prompt"], project), add_special_tokens=False)["input_ids"]
    assert ids == tokenizer(render_prompt(row["prompt"], tokenizer))["input_ids"]


def test_token_lengths_fit_the_budget(splits, tokenizer):
    prompts, completions = [], []
    for split in st.SPLITS:
        for row in splits[split]:
            prompt, completion = render_sft_example(row["prompt"], row["target"], tokenizer)
            prompts.append(prompt)
            completions.append(completion)
    prompt_lengths = [len(ids) for ids in tokenizer(prompts)["input_ids"]]
    completion_lengths = [len(ids) for ids in tokenizer(completions)["input_ids"]]
    assert max(prompt_lengths) <= PROMPT_TOKEN_BUDGET
    assert 120 <= statistics.median(prompt_lengths) <= 210
    assert max(completion_lengths) <= COMPLETION_TOKEN_BUDGET


def test_bad_arguments(tokenizer):
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(["a b"], vocab_size=MIN_VOCAB_SIZE - 1)
    with pytest.raises(TypeError, match="must yield str"):
        build_tokenizer(["a", 3], vocab_size=512)
