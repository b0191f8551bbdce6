"""Data, below the rewards: the files users have (verl parquet, ToolRL SFT, API-Bank, JSONL:
`loaders`, one module a format in `formats`) read into one row schema (`schema`; the column names in
`columns`), where they come from (`sources`), chat-template rendering (`chat`), the prompts served to
the sampler (`prompts`) and the tokenizers (`tokenization`, `corpus_tokenizer`).

May import: errors, config, runtime.
"""

from gd2po_jax.data.chat import column_tools, parse_tools, render_prompt, render_prompts, render_sft_example
from gd2po_jax.data.columns import EXTRA_COLUMNS, PROMPT_TEXT, RESERVED_COLUMNS
from gd2po_jax.data.loaders import (
    FEATURES,
    KINDS,
    DataFormatError,
    LoadResult,
    dataset_columns,
    decode_api_bank_answer,
    decode_extra_columns,
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
    "EXTRA_COLUMNS",
    "FEATURES",
    "KINDS",
    "PROMPT_TEXT",
    "RESERVED_COLUMNS",
    "DataFormatError",
    "LoadResult",
    "column_tools",
    "dataset_columns",
    "decode_api_bank_answer",
    "decode_extra_columns",
    "detect_kind",
    "encode_api_bank_answer",
    "load_api_bank",
    "load_api_bank_file",
    "load_data",
    "load_jsonl",
    "load_toolrl_sft",
    "load_verl_parquet",
    "parse_api_bank_answer",
    "parse_tools",
    "render_prompt",
    "render_prompts",
    "render_sft_example",
]
