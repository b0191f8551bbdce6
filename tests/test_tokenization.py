"""gd2po_jax.tokenization: tokenizer loading, chat templates, EOS ids, pad == EOS masking."""

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gd2po_jax.sampling import completion_mask
from gd2po_jax.tokenization import (
    decode_completions,
    encode_prompts,
    eos_token_ids,
    load_tokenizer,
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
WORDS = ["user", "assistant", "system", "what", "is", "two", "plus", "four", "hello", "you", "<unk>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


def _save_tokenizer(directory, *, chat=True, generation_eos=None):
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", unk_token="<unk>")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS[:3]})
    if chat:
        tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    if generation_eos is not None:
        (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))
    return vocab


def test_missing_pad_token_becomes_eos_and_padding_is_left(tmp_path):
    vocab = _save_tokenizer(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.pad_token == "<|im_end|>"
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == vocab["<|im_end|>"]
    assert tokenizer.padding_side == "left"


def test_eos_ids_merge_generation_config_without_repeats(tmp_path):
    vocab = _save_tokenizer(tmp_path, generation_eos=[2, 0])  # <|im_end|>, <|endoftext|>
    tokenizer = load_tokenizer(tmp_path)
    assert (vocab["<|im_end|>"], vocab["<|endoftext|>"]) == (2, 0)
    assert eos_token_ids(tokenizer, tmp_path) == [2, 0]
    assert eos_token_ids(tokenizer) == [2]


def test_chat_prompts_use_the_template_without_extra_special_tokens(tmp_path):
    vocab = _save_tokenizer(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    conversation = [{"role": "system", "content": "hello"}, {"role": "user", "content": "what is two plus two"}]
    ids = encode_prompts(tokenizer, [conversation, "hello you"])
    v = vocab
    assert ids[0] == [v["<|im_start|>"], v["system"], v["hello"], v["<|im_end|>"],
                      v["<|im_start|>"], v["user"], v["what"], v["is"], v["two"], v["plus"], v["two"],
                      v["<|im_end|>"], v["<|im_start|>"], v["assistant"]]
    assert ids[1] == [v["<|im_start|>"], v["user"], v["hello"], v["you"], v["<|im_end|>"],
                      v["<|im_start|>"], v["assistant"]]


def test_plain_strings_without_chat(tmp_path):
    vocab = _save_tokenizer(tmp_path, chat=False)
    tokenizer = load_tokenizer(tmp_path)
    assert encode_prompts(tokenizer, ["two plus four"]) == [[vocab["two"], vocab["plus"], vocab["four"]]]
    with pytest.raises(ValueError, match="no chat_template"):
        encode_prompts(tokenizer, [[{"role": "user", "content": "hello"}]])


def test_pad_equal_to_eos_keeps_eos_in_the_loss_mask(tmp_path):
    vocab = _save_tokenizer(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    eos = pad = tokenizer.pad_token_id
    tokens = np.array([[vocab["four"], eos, pad, pad], [vocab["two"], vocab["plus"], vocab["two"], vocab["four"]]])
    lengths = np.array([2, 4])  # row 0 ended with EOS at step 2, row 1 hit the length budget
    mask = np.asarray(completion_mask(lengths, 4))
    np.testing.assert_array_equal(mask, [[True, True, False, False], [True, True, True, True]])
    assert mask[0, 1] and tokens[0, 1] == eos  # the EOS token is trained on even though EOS == pad
    assert not np.array_equal(mask, tokens != pad)
    assert decode_completions(tokenizer, tokens, lengths) == ["four", "two plus two four"]
    raw = decode_completions(tokenizer, tokens, lengths, skip_special_tokens=False)
    assert raw[0] == "four <|im_end|>"
