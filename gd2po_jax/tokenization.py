"""Tokenizer and chat-template helpers (host side; nothing here runs under jit).

    tokenizer = load_tokenizer(checkpoint_dir)
    prompts = encode_prompts(tokenizer, [[{"role": "user", "content": "2+2?"}]])   # ragged id lists
    eos = eos_token_ids(tokenizer, checkpoint_dir)
    out = generate(model, prompts, eos_token_ids=eos, pad_token_id=tokenizer.pad_token_id, ...)
    texts = decode_completions(tokenizer, out.tokens, out.lengths)

Pad equal to EOS: many tokenizers (Qwen, Llama 3) have no pad token, and we then pad with EOS. A
completion's EOS must still be trained on, so loss masks come from completion lengths
(`gd2po_jax.sampling.completion_mask`), never from ``tokens != pad_token_id``.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

import numpy as np
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from gd2po_jax.data.chat import render_prompt

Message = dict[str, str]


def load_tokenizer(path, *, padding_side: str = "left") -> PreTrainedTokenizerBase:
    """`AutoTokenizer` of a checkpoint directory; a missing pad token is set to the EOS token."""
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"{path}: the tokenizer defines neither a pad nor an EOS token; add one")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, model_dir=None) -> list[int]:
    """EOS ids: the tokenizer's, then those of ``generation_config.json`` (chat models often end
    turns with a different token than pretraining, e.g. Qwen's ``<|im_end|>``), without repeats."""
    ids = _as_list(tokenizer.eos_token_id)
    if model_dir is not None:
        file = pathlib.Path(model_dir) / "generation_config.json"
        if file.is_file():
            ids += _as_list(json.loads(file.read_text()).get("eos_token_id"))
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise ValueError("no EOS token id: the tokenizer has none and generation_config.json lists none")
    return ids


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str | Sequence[Message]],
    *,
    chat: bool | None = None,
    **template_kwargs,
) -> list[list[int]]:
    """Token ids (unpadded, one list per prompt) of strings or chat conversations.

    A conversation (list of ``{"role", "content"}``) always goes through the chat template. A string
    is wrapped as a single user message when ``chat`` is true (default: when the tokenizer has a
    chat template), else tokenized as is with the tokenizer's special tokens (e.g. BOS).
    """
    use_chat = tokenizer.chat_template is not None if chat is None else chat
    encoded = []
    for prompt in prompts:
        if isinstance(prompt, str) and not use_chat:
            encoded.append(list(tokenizer(prompt, add_special_tokens=True)["input_ids"]))
            continue
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        text = render_prompt(messages, tokenizer, **template_kwargs)
        encoded.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return encoded


def decode_completions(
    tokenizer: PreTrainedTokenizerBase, tokens, lengths, *, skip_special_tokens: bool = True
) -> list[str]:
    """Texts of completions ``tokens [N, M]`` cut at ``lengths [N]`` (EOS dropped as special)."""
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    return [
        tokenizer.decode(row[:n].tolist(), skip_special_tokens=skip_special_tokens)
        for row, n in zip(tokens, lengths)
    ]
