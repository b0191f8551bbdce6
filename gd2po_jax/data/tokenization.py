"""Tokenizer helpers: loading, EOS and pad ids, decoding completions (host side, no jit).

    tokenizer = load_tokenizer(checkpoint_dir)
    eos = eos_token_ids(tokenizer, checkpoint_dir)
    out = generate(model, prompts, eos_token_ids=eos, pad_token_id=pad_token_id(tokenizer, eos), ...)
    texts = decode_completions(tokenizer, out.tokens, out.lengths)

(prompts are rendered and tokenized by `gd2po_jax.data.prompts.build_prompt_set`.)

Pad equal to EOS: many tokenizers (Qwen, Llama 3) have no pad token, and we then pad with EOS. A
completion's EOS must still be trained on, so loss masks come from completion lengths
(`gd2po_jax.models.sampling.completion_mask`), never from ``tokens != pad_token_id``.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

if TYPE_CHECKING:  # AutoTokenizer is imported in load_tokenizer: transformers' auto classes import
    # torch where it is installed (2.3 s in a fresh process on a CI machine)
    from transformers import PreTrainedTokenizerBase


def load_tokenizer(path, *, padding_side: str = "left") -> PreTrainedTokenizerBase:
    """`AutoTokenizer` of a checkpoint directory; a missing pad token is set to the EOS token."""
    from transformers import AutoTokenizer

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


def pad_token_id(tokenizer: PreTrainedTokenizerBase, eos_ids: Sequence[int]) -> int:
    """The id that pads prompts (on the left) and completions (after EOS): the tokenizer's pad
    token, else the first EOS id of ``eos_ids`` (from `eos_token_ids`).

    Raises:
      ValueError: when the tokenizer has no pad token and ``eos_ids`` is empty.
    """
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    if not len(eos_ids):
        raise ValueError("no pad token id: the tokenizer has no pad token and there is no EOS id to pad with")
    return int(eos_ids[0])


def decode_completions(
    tokenizer: PreTrainedTokenizerBase, tokens, lengths, *, skip_special_tokens: bool = True
) -> list[str]:
    """Texts of completions ``tokens [N, M]`` cut at ``lengths [N]`` (EOS dropped as special)."""
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    return [
        cast(str, tokenizer.decode(row[:n].tolist(), skip_special_tokens=skip_special_tokens))  # one row: a str
        for row, n in zip(tokens, lengths)
    ]
