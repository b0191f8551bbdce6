"""JSON parsing for untrusted model output, with size and nesting limits checked before parsing.

Python's `json.loads` recurses once per nesting level, so a few thousand `[` characters raise
`RecursionError` (or worse, deep inside a caller's stack). Model outputs are untrusted, so every
JSON value read from a response goes through `loads_bounded`, which rejects a text that is too long
or nested too deeply before `json.loads` ever sees it. Accepted texts parse exactly as `json.loads`
parses them (same values, same Python equality), so scores do not change for ordinary output.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

MAX_JSON_CHARS = 100_000
"""Longest text handed to `json.loads` (characters); far above any tool call a policy emits."""

MAX_JSON_DEPTH = 100
"""Deepest nesting of arrays/objects accepted; real tool arguments nest a handful of levels."""

# A JSON string literal, or an unterminated one running to the end of the text. Every character
# after the opening quote is consumed by one branch, so a match never fails once started and the
# scan stays linear even on adversarial input (no re-scanning from later quotes).
_STRING = re.compile(r'"(?:[^"\\]++|\\[\s\S]|\\\Z)*+(?:"|\Z)')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DELTA = {"[": 1, "{": 1, "]": -1, "}": -1}


def nesting_depth(text: str) -> int:
    """Deepest array/object nesting of a JSON-like text, ignoring brackets inside string literals.

    Linear time. For invalid JSON the value is an upper bound good enough for rejecting input.
    """
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    return max(0, max(itertools.accumulate(map(_DELTA.__getitem__, brackets))))


def loads_bounded(text: str, *, max_chars: int = MAX_JSON_CHARS, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads(text)` after checking that `text` is a str of at most `max_chars` characters
    nested at most `max_depth` deep.

    Raises:
      ValueError: for a non-str input, a text over either limit, or invalid JSON (every failure is
        a ValueError, so callers need a single except clause).
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a JSON text (str), got {type(text).__name__}")
    if len(text) > max_chars:
        raise ValueError(f"JSON text of {len(text)} characters exceeds the limit of {max_chars}")
    if text.count("[") + text.count("{") > max_depth and nesting_depth(text) > max_depth:
        raise ValueError(f"JSON text nested deeper than the limit of {max_depth}")
    try:
        return json.loads(text)
    except RecursionError as err:  # only reachable if the caller's own stack is already deep
        raise ValueError("JSON text nested too deeply for the interpreter stack") from err
