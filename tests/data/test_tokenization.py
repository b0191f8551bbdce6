"""gd2po_jax.data.tokenization: tokenizer loading, EOS and pad ids, pad == EOS masking, decoding."""

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gd2po_jax.data.chat import render_prompt
from gd2po_jax.data.tokenization import (
    decode_completions,
    eos_token_ids,
    load_tokenizer,
    pad_token_id,
)
from gd2po_jax.models.sampling import completion_mask

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


def test_pad_id_is_the_pad_token_else_the_first_eos(tmp_path):
    vocab = _save_tokenizer(tmp_path, generation_eos=[0, 2])
    tokenizer = load_tokenizer(tmp_path)
    eos = eos_token_ids(tokenizer, tmp_path)
    assert eos == [vocab["<|im_end|>"], vocab["<|endoftext|>"]]
    assert pad_token_id(tokenizer, eos) == vocab["<|im_end|>"]  # load_tokenizer set pad = EOS
    tokenizer.pad_token = "<s>"
    assert pad_token_id(tokenizer, eos) == vocab["<s>"]
    tokenizer.pad_token = None
    assert pad_token_id(tokenizer, [vocab["<|endoftext|>"], 2]) == vocab["<|endoftext|>"]
    with pytest.raises(ValueError, match="no pad token id"):
        pad_token_id(tokenizer, [])


def test_chat_prompts_render_to_template_tokens_without_extra_specials(tmp_path):
    vocab = _save_tokenizer(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    conversation = [{"role": "system", "content": "hello"}, {"role": "user", "content": "what is two plus two"}]
    ids = tokenizer(render_prompt(conversation, tokenizer), add_special_tokens=False)["input_ids"]
    v = vocab
    assert ids == [v["<|im_start|>"], v["system"], v["hello"], v["<|im_end|>"],
                   v["<|im_start|>"], v["user"], v["what"], v["is"], v["two"], v["plus"], v["two"],
                   v["<|im_end|>"], v["<|im_start|>"], v["assistant"]]
    _save_tokenizer(tmp_path / "plain", chat=False)
    plain = load_tokenizer(tmp_path / "plain")
    with pytest.raises(ValueError, match="no chat_template"):
        render_prompt([{"role": "user", "content": "hello"}], plain)


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


# ----------------------------------------------------------------------------------------------
# A tokenizer that does not match its model (issue 63, finding 3).
# ----------------------------------------------------------------------------------------------


def _model_dir(directory, vocab_size: int):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": vocab_size}))
    return directory


def test_a_tokenizer_that_does_not_fit_its_model_is_one_line_naming_both(tmp_path):
    from gd2po_jax.data.tokenization import TokenizerMismatchError, check_tokenizer

    _save_tokenizer(tmp_path / "tok")
    tokenizer = load_tokenizer(tmp_path / "tok")  # 15 tokens
    model = _model_dir(tmp_path / "model", 374)
    check_tokenizer(tokenizer, tmp_path / "tok", model, "what is two plus four")  # fits
    cases = [
        (_model_dir(tmp_path / "small", 10), "what is two", r"has 15 tokens, more than the model's vocab_size 10"),
        (model, "what is seven plus eight", r"does not decode the first training prompt back to its text"),
        (model, "", r"encodes the first training prompt to no tokens"),
    ]
    for model_dir, prompt, message in cases:
        with pytest.raises(TokenizerMismatchError, match=message) as refused:
            check_tokenizer(tokenizer, tmp_path / "tok", model_dir, prompt)
        line = str(refused.value)
        assert "\n" not in line and str(tmp_path / "tok") in line and str(model_dir) in line
        assert "config.model.tokenizer_path" in line
    # The model directory's own tokenizer: named once, and what to do about it.
    with pytest.raises(TokenizerMismatchError, match=r"^the tokenizer of .*small has 15 tokens.*tokenizer\.json"):
        check_tokenizer(tokenizer, tmp_path / "small", tmp_path / "small", "what is two")


def test_a_run_with_a_foreign_tokenizer_stops_before_compute(tmp_path):
    """The red team's run: a 3-token tokenizer for a 374-token model trained on garbage, exit 0."""
    from gd2po_jax.data.tokenization import TokenizerMismatchError
    from gd2po_jax.tasks.setup import build_setup
    from tests.fakes import tiny_run_config

    _save_tokenizer(tmp_path / "tok")
    config = tiny_run_config(model__tokenizer_path=str(tmp_path / "tok"))
    with pytest.raises(TokenizerMismatchError, match=rf"^the tokenizer {tmp_path / 'tok'} \(for the model "
                                                     rf"{tmp_path / 'run' / 'base_model'}\)"):
        build_setup(config, tmp_path / "run")
