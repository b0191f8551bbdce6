"""Data: loaders for verl / ToolRL / API-Bank / JSONL files and chat-template rendering."""

from gd2po_jax.data.chat import render_prompt, render_prompts, render_sft_example
from gd2po_jax.data.loaders import (
    FEATURES,
    KINDS,
    DataFormatError,
    LoadResult,
    decode_api_bank_answer,
    detect_kind,
    encode_api_bank_answer,
    load_api_bank,
    load_api_bank_file,
    load_data,
    load_jsonl,
    load_toolrl_sft,
    load_verl_parquet,
    parse_api_bank_answer,
)

__all__ = [
    "FEATURES",
    "KINDS",
    "DataFormatError",
    "LoadResult",
    "decode_api_bank_answer",
    "detect_kind",
    "encode_api_bank_answer",
    "load_api_bank",
    "load_api_bank_file",
    "load_data",
    "load_jsonl",
    "load_toolrl_sft",
    "load_verl_parquet",
    "parse_api_bank_answer",
    "render_prompt",
    "render_prompts",
    "render_sft_example",
]
