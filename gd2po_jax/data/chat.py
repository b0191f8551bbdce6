"""Rendering chat-message prompts through a tokenizer's chat template (host-side, no jit)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Messages = Sequence[Mapping[str, str]]


def _require_template(tokenizer: Any) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__} has no chat_template; use the model's instruct "
            "tokenizer (tokenizer_config.json with a chat_template) or set tokenizer.chat_template"
        )


def render_prompt(messages: Messages, tokenizer: Any, **template_kwargs: Any) -> str:
    """The prompt text of `messages` with the assistant turn opened (add_generation_prompt=True).

    `template_kwargs` go to `apply_chat_template` (e.g. `tools=...`, `enable_thinking=False`).
    """
    _require_template(tokenizer)
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], tokenize=False, add_generation_prompt=True, **template_kwargs
    )


def render_prompts(
    prompts: Iterable[Messages], tokenizer: Any, **template_kwargs: Any
) -> list[str]:
    """`render_prompt` over many conversations, e.g. `dataset["prompt"]` of a loaded dataset."""
    return [render_prompt(messages, tokenizer, **template_kwargs) for messages in prompts]


def render_sft_example(
    messages: Messages, target: str, tokenizer: Any, **template_kwargs: Any
) -> tuple[str, str]:
    """(prompt text, completion text) for supervised training on `target` as the assistant reply.

    The completion is what the template appends after the rendered prompt when the assistant
    message is added — the target plus the template's end-of-turn text — so a trainer can
    tokenize `prompt + completion` and put the loss on the completion tokens only.

    Raises:
      ValueError: when the template does not render the conversation as the prompt followed by
        the reply (some templates rewrite earlier turns); the message says which example.
    """
    prompt = render_prompt(messages, tokenizer, **template_kwargs)
    conversation = [dict(m) for m in messages] + [{"role": "assistant", "content": target}]
    full = tokenizer.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=False, **template_kwargs
    )
    if not full.startswith(prompt):
        raise ValueError(
            "the chat template does not render the conversation as prompt + reply, so the target "
            f"cannot be separated; prompt starts {prompt[:80]!r}, full text starts {full[:80]!r}"
        )
    return prompt, full[len(prompt) :]
