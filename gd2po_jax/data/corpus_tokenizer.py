"""A small byte-level BPE tokenizer in the Qwen2 layout, trained locally on a task's corpus.

    tokenizer = build_tokenizer(iter_corpus(splits["train"]), vocab_size=2048, out_dir=model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)   # offline, same tokenizer

Like Qwen2's: NFC normalization, the Qwen2 pre-tokenization regex (digits one by one, a word with
at most one leading non-letter), byte-level BPE (no unknown tokens), the special tokens
`<|endoftext|>` (pad), `<|im_start|>` and `<|im_end|>` (end of turn = EOS), and a ChatML chat
template. The ToolRL tags (`<think>`, `</think>`, `<tool_call>`, `</tool_call>`, `<response>`,
`</response>`) are single added tokens that are not special, so decoding with
`skip_special_tokens=True` keeps them and the rewards see them.

Training is deterministic: the same corpus and vocab_size give the same vocabulary and merges.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)
from transformers import PreTrainedTokenizerFast

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
"""Special tokens (ids 0, 1, 2), dropped by `decode(..., skip_special_tokens=True)`."""

TAG_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<response>", "</response>")
"""ToolRL tags: one token each, not special (kept when decoding without special tokens)."""

PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2's pre-tokenization regex (contractions, words, single digits, punctuation, spaces)."""

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML: `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then
`<|im_start|>assistant\\n` when add_generation_prompt (no default system message)."""

_ROLE_LINES = ("system\n", "user\n", "assistant\n")
"""Role lines of the chat template; added to the corpus (as often as BPE's minimum frequency
asks) so that each role is one token."""
_MIN_FREQUENCY = 2

MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS) + len(TAG_TOKENS)
"""256 byte tokens, the special tokens and the tags."""


def _backend(vocab_size: int) -> tuple[Tokenizer, trainers.BpeTrainer]:
    """An untrained Qwen2-style byte-level BPE tokenizer and its trainer."""
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAG_TOKENS),
        min_frequency=_MIN_FREQUENCY,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tokenizer, trainer


def _without_tags(texts: Iterable[str]) -> Iterable[str]:
    """The corpus with the tag strings cut out, so BPE spends no merges on pieces of them."""
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"the tokenizer corpus must yield str, got {type(text).__name__}")
        for tag in TAG_TOKENS:
            text = text.replace(tag, " ")
        yield text


def build_tokenizer(
    corpus: Iterable[str],
    vocab_size: int = 2048,
    out_dir: str | os.PathLike | None = None,
    *,
    model_max_length: int = 4096,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `corpus` and wrap it as a transformers tokenizer.

    Args:
      corpus: the training texts (e.g. `synthetic_tools.iter_corpus(...)`); read once.
      vocab_size: total vocabulary size, special and tag tokens included (at least
        `MIN_VOCAB_SIZE`). The result may be smaller when the corpus has too few distinct pairs.
      out_dir: when given, the tokenizer is saved there with `save_pretrained`, loadable offline
        by `transformers.AutoTokenizer.from_pretrained(out_dir)`.
      model_max_length: the tokenizer's `model_max_length`.

    Returns:
      A `PreTrainedTokenizerFast` with eos `<|im_end|>`, pad `<|endoftext|>`, no bos, left
      padding, and the ChatML `chat_template`.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be an int >= {MIN_VOCAB_SIZE}, got {vocab_size!r}")
    backend, trainer = _backend(vocab_size)
    backend.train_from_iterator(_without_tags([*_ROLE_LINES * _MIN_FREQUENCY, *corpus]), trainer=trainer)
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    if out_dir is not None:
        pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(str(out_dir))
    return tokenizer
