"""The ToolRL SFT JSON format: a JSON list of {"instruction", "input", "output"}; its file loader and
row converter."""

from __future__ import annotations

import os
from typing import Any

from gd2po_jax.data.schema import (
    LoadResult,
    OnError,
    build_dataset,
    check_file,
    dict_record,
    json_list,
    numbered,
    require_str,
    schema_row,
)


def toolrl_sft_row(record: Any, index: int) -> dict:
    """A ToolRL SFT record as a row of `FEATURES`: prompt [system: instruction, user: input],
    target output."""
    record = dict_record(record)
    instruction = require_str(record.get("instruction"), "instruction", allow_empty=False)
    user = require_str(record.get("input"), "input")
    output = require_str(record.get("output"), "output", allow_empty=False)
    prompt = [{"role": "system", "content": instruction}, {"role": "user", "content": user}]
    return schema_row(record, prompt, target=output, source="toolrl_sft", row=index)


def load_toolrl_sft(path: str | os.PathLike, *, on_error: OnError = "raise") -> LoadResult:
    """Load ToolRL SFT data: a JSON list of {"instruction", "input", "output"}.

    The prompt is [system: instruction, user: input] (as ToolRL builds its RL prompts from the
    same kind of records) and `target` is the output to imitate. `ground_truth` is None: SFT
    outputs are not all valid reward ground truths (some mention `<tool_call>` inside the think
    text, which the ToolRL reward would parse as the call block).
    """
    path = check_file(path)
    return build_dataset(path, numbered(json_list(path)), toolrl_sft_row, on_error)
