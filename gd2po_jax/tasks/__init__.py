"""Built-in tasks: the synthetic tool-calling world and a tokenizer trained on its corpus."""

from gd2po_jax.tasks.synthetic_tools import (
    SyntheticToolsConfig,
    iter_corpus,
    make_splits,
    tool_corpus,
)
from gd2po_jax.tasks.tokenizer import build_tokenizer

__all__ = [
    "SyntheticToolsConfig",
    "build_tokenizer",
    "iter_corpus",
    "make_splits",
    "tool_corpus",
]
