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
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from gd2po_jax.errors import UserError

if TYPE_CHECKING:  # AutoTokenizer is imported in load_tokenizer: transformers' auto classes import
    # torch where it is installed (2.3 s in a fresh process on a CI machine)
    from transformers import PreTrainedTokenizerBase


class TokenizerLoadError(UserError, ValueError):
    """A directory no tokenizer loads from; one line naming it (`load_tokenizer`)."""


def load_tokenizer(path, *, padding_side: str = "left") -> PreTrainedTokenizerBase:
    """`AutoTokenizer` of a checkpoint directory; a missing pad token is set to the EOS token.

    Raises:
      TokenizerLoadError: naming ``path``, when transformers cannot load a tokenizer from it (a broken
        config.json, no tokenizer files ...).
    """
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:  # transformers' chained errors
        raise TokenizerLoadError(
            f"{path}: cannot load a tokenizer from it ({type(err).__name__}: {' '.join(str(err).split())[:300]}); "
            "give the model directory its tokenizer files (tokenizer.json, tokenizer_config.json) and a valid "
            "config.json, or config.model.tokenizer_path"
        ) from None
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise TokenizerLoadError(f"{path}: the tokenizer defines neither a pad nor an EOS token; add one")
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


class TokenizerMismatchError(UserError, ValueError):
    """A tokenizer that does not fit its model or cannot encode the data; the message names both
    directories (`check_tokenizer`)."""


def _model_vocab_size(model_dir) -> int | None:
    """``vocab_size`` of ``model_dir/config.json`` (None where it has none, or cannot be read)."""
    try:
        value = json.loads((pathlib.Path(model_dir) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def _comparable(text: str) -> str:
    """``text`` without whitespace, NFKC-normalized and case-folded: what every tokenizer of a causal
    LM gives back when it decodes what it encoded."""
    return "".join(unicodedata.normalize("NFKC", text).casefold().split())


def check_tokenizer(tokenizer, tokenizer_dir, model_dir, prompt: str, where: str = "the first training prompt") -> None:
    """Refuse a tokenizer that does not match its model, before anything is computed: more tokens
    than the model's ``vocab_size`` (ids past it index no embedding), or that encodes ``prompt`` (a
    rendered prompt of the data) to no tokens, to ids past the vocabulary, or to tokens that do not
    decode back to it (whitespace, case and Unicode compatibility forms aside): a tokenizer of another
    model, or a broken one (a model directory without ``tokenizer.json`` can load a 3-token one).

    Raises:
      TokenizerMismatchError: one line naming the tokenizer's and the model's directories.
    """
    same = pathlib.Path(tokenizer_dir) == pathlib.Path(model_dir)
    both = f"the tokenizer of {model_dir}" if same else f"the tokenizer {tokenizer_dir} (for the model {model_dir})"
    fix = (
        "give the model directory its own tokenizer files (tokenizer.json, tokenizer_config.json)"
        if same
        else "set config.model.tokenizer_path to this model's tokenizer"
    )
    vocab = _model_vocab_size(model_dir)
    size = len(tokenizer)
    if vocab is not None and size > vocab:
        raise TokenizerMismatchError(
            f"{both} has {size} tokens, more than the model's vocab_size {vocab} ({model_dir}/config.json): {fix}"
        )
    ids = [int(i) for i in tokenizer(prompt, add_special_tokens=False)["input_ids"]]
    if not ids:
        raise TokenizerMismatchError(f"{both} encodes {where} to no tokens ({prompt[:60]!r}): {fix}")
    if vocab is not None and max(ids) >= vocab:
        raise TokenizerMismatchError(
            f"{both} encodes {where} to id {max(ids)}, past the model's vocab_size {vocab}: {fix}"
        )
    back = tokenizer.decode(ids, skip_special_tokens=False)
    if _comparable(back) != _comparable(prompt):
        raise TokenizerMismatchError(
            f"{both} does not decode {where} back to its text ({prompt[:40]!r} came back as {back[:40]!r}; "
            f"{len(ids)} tokens for {len(prompt)} characters): {fix}"
        )
