"""gd2po_jax/data/chat.py: prompts and SFT examples rendered through a chat template."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gd2po_jax.data import load_toolrl_sft, load_verl_parquet, render_prompt, render_prompts, render_sft_example
from tests.fakes import data_files
from tests.fixture_data import SYSTEM_PREFIX

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {"[UNK]": 0, "<|im_start|>": 1, "<|im_end|>": 2, "user": 3, "assistant": 4, "system": 5}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", eos_token="<|im_end|>"
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def test_render_prompt_opens_the_assistant_turn(tokenizer):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    want = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt(messages, tokenizer) == want


def test_render_prompts_of_a_loaded_dataset(tokenizer):
    ds = load_verl_parquet(data_files() / "rlla_4k" / "test.parquet").dataset.select(range(3))
    texts = render_prompts(ds["prompt"], tokenizer)
    assert len(texts) == 3
    for text, messages in zip(texts, ds["prompt"], strict=True):
        assert text.startswith(f"<|im_start|>system\n{SYSTEM_PREFIX}")
        assert messages[1]["content"] in text and text.endswith("<|im_start|>assistant\n")


def test_render_sft_example_splits_prompt_and_completion(tokenizer):
    row = load_toolrl_sft(data_files() / "rlla_4k" / "rlla_sft.json").dataset[0]
    prompt, completion = render_sft_example(row["prompt"], row["target"], tokenizer)
    assert prompt == render_prompt(row["prompt"], tokenizer)
    assert completion == row["target"] + "<|im_end|>\n"


def test_render_errors(tokenizer):
    bare = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, unk_token="[UNK]")
    with pytest.raises(ValueError, match="no chat_template"):
        render_prompt([{"role": "user", "content": "x"}], bare)
    rewriting = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend_tokenizer, unk_token="[UNK]"
    )
    rewriting.chat_template = (
        "{% if messages[-1]['role'] == 'assistant' %}REWRITTEN{% endif %}"
        "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    )
    with pytest.raises(ValueError, match="cannot be separated"):
        render_sft_example([{"role": "user", "content": "x"}], "y", rewriting)
