"""Rendering chat-message prompts through a tokenizer's chat template (host-side, no jit).

Besides the messages, a template may take keyword arguments (`check_template_kwargs`; e.g. Qwen3's
``enable_thinking=False``, ``config.data.chat_template_kwargs``) and each row's tools: the value of a
data column (`column_tools`, ``config.data.tools_column``), passed as ``tools=``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Messages = Sequence[Mapping[str, str]]
Tools = list[dict[str, Any]]

FIXED_TEMPLATE_ARGUMENTS = (
    "conversation",
    "tokenize",
    "add_generation_prompt",
    "continue_final_message",
    "return_dict",
    "return_tensors",
)
"""Arguments of ``apply_chat_template`` the renderers set themselves (the output is text, with the
assistant turn opened or closed): a template keyword argument of one of these names is refused."""


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


def with_tools(template_kwargs: Mapping[str, Any], tools: Tools | None) -> dict[str, Any]:
    """``template_kwargs`` plus ``tools=tools`` when a row has tools (None: left out)."""
    return dict(template_kwargs) if tools is None else {**template_kwargs, "tools": tools}


def render_prompts(
    prompts: Iterable[Messages],
    tokenizer: Any,
    *,
    row_tools: Sequence[Tools | None] | None = None,
    **template_kwargs: Any,
) -> list[str]:
    """`render_prompt` over many conversations, e.g. `dataset["prompt"]` of a loaded dataset.

    Args:
      row_tools: one tool list per conversation (None: that one has none), passed as ``tools=``
        (`column_tools`); None: none but a ``tools`` of ``template_kwargs`` (the same for all).
    """
    prompts = list(prompts)
    if row_tools is None:
        return [render_prompt(messages, tokenizer, **template_kwargs) for messages in prompts]
    if "tools" in template_kwargs:
        raise ValueError("tools are given for all prompts (tools=) and for each one (row_tools=); give one")
    if len(row_tools) != len(prompts):
        raise ValueError(f"{len(row_tools)} tool lists for {len(prompts)} prompts")
    return [
        render_prompt(messages, tokenizer, **with_tools(template_kwargs, tools))
        for messages, tools in zip(prompts, row_tools)
    ]


def check_template_kwargs(template_kwargs: Mapping[str, Any], *, tools_column: str = "") -> dict[str, Any]:
    """``template_kwargs`` as a dict, checked: none of `FIXED_TEMPLATE_ARGUMENTS`, and no ``tools``
    when the tools come from a column.

    Raises:
      ValueError: naming ``config.data.chat_template_kwargs`` and the argument.
    """
    fixed = sorted(set(template_kwargs) & set(FIXED_TEMPLATE_ARGUMENTS))
    if fixed:
        raise ValueError(
            f"config.data.chat_template_kwargs: {', '.join(fixed)} cannot be given: the renderer sets "
            f"{', '.join(FIXED_TEMPLATE_ARGUMENTS)} itself"
        )
    if tools_column and "tools" in template_kwargs:
        raise ValueError(
            f"config.data.chat_template_kwargs: gives tools, and so does config.data.tools_column="
            f"{tools_column!r}; give the tools in one place"
        )
    return dict(template_kwargs)


def parse_tools(value: Any) -> Tools | None:
    """A row's tools: a list of JSON-schema dicts (kept), that list as JSON text (parsed), or None.

    Raises:
      ValueError: saying what the value is instead.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError) as err:
            raise ValueError(f"not valid JSON ({err}): {value!r:.80}") from None
    if not isinstance(value, (list, tuple)):
        raise ValueError(
            f"expected a list of tool schemas (JSON-schema dicts) or that list as JSON text, got "
            f"{type(value).__name__} {value!r:.80}"
        )
    for i, tool in enumerate(value):
        if not isinstance(tool, Mapping):
            raise ValueError(f"tool {i} is not a JSON-schema dict: {tool!r:.80}")
    return [dict(tool) for tool in value]


def column_tools(columns: Mapping[str, Sequence[Any]], tools_column: str, where: str) -> list[Tools | None]:
    """Each row's tools (`parse_tools`) from the column ``tools_column`` of ``columns`` (a dataset's
    columns, extra columns among them: `gd2po_jax.data.loaders.dataset_columns`).

    Raises:
      ValueError: a missing column (naming ``where``, ``config.data.tools_column`` and the columns
        there are) or a bad value (naming ``where``, the 0-based row and the column).
    """
    if tools_column not in columns:
        raise ValueError(
            f"{where}: config.data.tools_column={tools_column!r} is not a column of the data; its "
            f"columns are {sorted(columns)}"
        )
    tools = []
    for row, value in enumerate(columns[tools_column]):
        try:
            tools.append(parse_tools(value))
        except ValueError as err:
            raise ValueError(
                f"{where}, row {row} (0-based), column {tools_column!r} (config.data.tools_column): {err}"
            ) from None
    return tools


def render_sft_example(messages: Messages, target: str, tokenizer: Any, **template_kwargs: Any) -> tuple[str, str]:
    """(prompt text, completion text) for supervised training on `target` as the assistant reply.

    The completion is what the template appends after the rendered prompt when the assistant
    message is added — the target plus the template's end-of-turn text — so a trainer can
    tokenize `prompt + completion` and put the loss on the completion tokens only.
    `template_kwargs` go to `apply_chat_template` for both (e.g. `tools=...`, `enable_thinking=False`),
    so the prompt is the one RL renders.

    Raises:
      ValueError: when the template does not render the conversation as the prompt followed by
        the reply (some templates rewrite earlier turns); the message says which example.
    """
    prompt = render_prompt(messages, tokenizer, **template_kwargs)
    conversation = [dict(m) for m in messages] + [{"role": "assistant", "content": target}]
    full = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False, **template_kwargs)
    if not full.startswith(prompt):
        raise ValueError(
            "the chat template does not render the conversation as prompt + reply, so the target "
            f"cannot be separated; prompt starts {prompt[:80]!r}, full text starts {full[:80]!r}"
        )
    return prompt, full[len(prompt) :]
