"""Tool-calling rewards of ToolRL ("rlla"), as used by the GD2PO paper (docs/algorithm.md#tool-calling-rewards).

A response is scored against a ground truth of the form

    <think> ... </think>
    <tool_call>
    {"name": ..., "parameters": {...}}      one JSON object per line
    </tool_call>
    <response> ... </response>               (either block may be absent)

with three rewards:

  correctness in [-3, 3]  how well the predicted tool calls match the ground-truth calls
  format      in {0, 1}   whether the response has the layout the ground truth has
  length      in [0, 1]   words of reasoning in the (last) think block / max_think_words

The numbers reproduce the official reward code exactly, including its quirks (listed in
docs/algorithm.md#tool-calling-rewards and tested one by one). Model output is untrusted: JSON is
parsed with size and nesting limits, nothing is evaluated, and no response can make the reward
raise; malformed output gets the minimum.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gd2po_jax.rewards.base import register_reward_kind
from gd2po_jax.rewards.bounded_json import loads_bounded

MIN_CORRECTNESS = -3.0
MAX_CORRECTNESS = 3.0
DEFAULT_MAX_THINK_WORDS = 512

MAX_TOOL_BLOCK_CHARS = 200_000
"""A `<tool_call>` block longer than this scores the minimum without being parsed (bounds the
work on adversarial output; a policy's whole response is far shorter)."""

REWARD_NAMES = ("correctness", "format", "length")
"""Every column the tool-calling reward can produce, in the official order."""

SETTINGS: dict[str, tuple[str, ...]] = {
    "correctness_length": ("correctness", "length"),
    "correctness_format_length": ("correctness", "format", "length"),
}
"""The paper's two reward settings (2 and 3 rewards), by name."""

_ASSISTANT_START = "<|im_start|>assistant"
_TURN_END = "<|im_end|>"

# The four layouts of the format reward, chosen by which blocks the ground truth has. Matched
# from the start of the text (re.match); `$` also matches before one final newline, as in the
# official regexes.
_FORMAT_TOOL = re.compile(r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>$", re.DOTALL)
_FORMAT_RESPONSE = re.compile(r"^<think>.*?</think>\n<response>.*?</response>$", re.DOTALL)
_FORMAT_BOTH = re.compile(r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>\n<response>.*?</response>$", re.DOTALL)
_FORMAT_NEITHER = re.compile(r"^<think>.*?</think>$", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ToolCallScore:
    """The three ToolRL rewards of one response."""

    correctness: float
    format: float
    length: float

    @property
    def total(self) -> float:
        """format + correctness + length, summed in the official order."""
        return self.format + self.correctness + self.length


def assistant_text(response: str) -> str:
    """The text the official reward scores: after the last `<|im_start|>assistant`, before the
    next `<|im_end|>`, stripped of surrounding whitespace (the Qwen branch of the official code).

    For a response decoded without special tokens this is `response.strip()`.
    """
    return response.rpartition(_ASSISTANT_START)[2].partition(_TURN_END)[0].strip()


def _tool_block(text: str) -> str | None:
    """Text between the first `<tool_call>` and the next `</tool_call>` after it, stripped; None
    when either tag is missing from `text`. A `</tool_call>` only before the first `<tool_call>`
    does not close it: the block then runs to the end of the text."""
    if "<tool_call>" not in text or "</tool_call>" not in text:
        return None
    return text.partition("<tool_call>")[2].partition("</tool_call>")[0].strip()


def _parse_lines(block: str) -> list[Any]:
    """One JSON value per line of `block` (split on "\\n" only, lines not stripped; blank lines
    are errors). Raises ValueError on any line that is not bounded, valid JSON."""
    return [loads_bounded(line) for line in block.split("\n")]


def parse_response_calls(response: str) -> list[Any] | None:
    """The JSON values of the first ``<tool_call>`` block of a response, one per line; None when
    the block is missing or a line is not bounded, valid JSON (what correctness scores as -3)."""
    block = _tool_block(response)
    if block is None:
        return None
    try:
        return _parse_lines(block)
    except ValueError:
        return None


def parse_ground_truth_calls(ground_truth: str) -> list[Any] | None:
    """The ground truth's tool calls, or None when it has no `<tool_call>` (nothing to score).

    Raises:
      ValueError: when the ground truth has a `<tool_call>` block whose lines are not JSON. This
        is a data error (the official code crashes on it), not a model error.
    """
    if "<tool_call>" not in ground_truth:
        return None
    block = ground_truth.partition("<tool_call>")[2].partition("</tool_call>")[0].strip()
    try:
        return _parse_lines(block)
    except ValueError as err:
        raise ValueError(
            f"ground truth has a <tool_call> block that is not one JSON object per line ({err}); "
            f"fix the dataset row: {ground_truth[:200]!r}"
        ) from err


def ground_truth_problem(ground_truth: Any) -> str | None:
    """Why a dataset's ground truth cannot be scored, or None when it can: it is not text (None:
    the row has none), its `<tool_call>` block is not one JSON object per line, or a call is not
    ``{"name": str, "parameters": {...}}`` (every response would then get the minimum correctness).
    """
    if not isinstance(ground_truth, str):
        got = "none" if ground_truth is None else f"a {type(ground_truth).__name__}"
        return f"the tool_calling reward needs a ground-truth text, the row has {got}"
    try:
        calls = parse_ground_truth_calls(ground_truth)
    except ValueError as err:
        return str(err)
    for j, call in enumerate(calls or []):
        if not (
            isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(call.get("parameters"), dict)
        ):
            return (
                f'tool call {j} of the ground truth is {call!r:.100}, not {{"name": str, "parameters": '
                "{...}}: every response would get the minimum correctness"
            )
    return None


def multiset_match(a: list[Any], b: list[Any]) -> float:
    """1 if the lists are equal, 0 if either is empty, else multiset Jaccard |a∩b| / |a∪b|.

    Raises TypeError for unhashable elements of unequal non-empty lists (scored as malformed).
    """
    if a == b:
        return 1.0
    if not a or not b:
        return 0.0
    common = sum((Counter(a) & Counter(b)).values())
    union = len(a) + len(b) - common
    return common / union if union > 0 else 0.0


def _call_match_correctness(gt_calls: list[Any], pred_calls: list[Any]) -> float:
    """Correctness of parsed predicted calls against parsed ground-truth calls, in [-3, 3].

    The score is the name match plus, for each ground-truth call in order, the best
    `match(parameter names) + number of equal parameter values` over the unused predicted calls
    with the same name (a candidate scoring exactly 0 is never used), normalised by
    `1 + sum(1 + number of ground-truth parameters)`. Fields are read only when the official code
    reads them, so a malformed field raises (TypeError, KeyError, AttributeError) only then.
    """
    if gt_calls == pred_calls:
        return MAX_CORRECTNESS
    score = multiset_match([c["name"] for c in gt_calls], [c["name"] for c in pred_calls])
    local_max = 1.0
    used: set[int] = set()
    for gt_call in gt_calls:
        gt_params = gt_call["parameters"]
        local_max += 1.0 + len(gt_params)
        best_score, best_index = 0.0, None
        for i, pred_call in enumerate(pred_calls):
            if i in used or pred_call["name"] != gt_call["name"]:
                continue
            pred_params = pred_call["parameters"]
            key_match = multiset_match(list(gt_params.keys()), list(pred_params.keys()))
            equal_values = sum(1.0 for k, v in gt_params.items() if k in pred_params and pred_params[k] == v)
            candidate = key_match + equal_values
            if candidate > best_score:
                best_score, best_index = candidate, i
        if best_index is not None:
            used.add(best_index)
            score += best_score
    return (MAX_CORRECTNESS - MIN_CORRECTNESS) * score / local_max + MIN_CORRECTNESS


def correctness_reward(text: str, gt_calls: list[Any] | None) -> float:
    """Correctness of the (already extracted) response `text`; 0.0 when the ground truth has no
    tool call; the minimum when the response's tool block is missing, too long, or malformed."""
    if gt_calls is None:
        return 0.0
    block = _tool_block(text)
    if block is None or len(block) > MAX_TOOL_BLOCK_CHARS:
        return MIN_CORRECTNESS
    try:
        return _call_match_correctness(gt_calls, _parse_lines(block))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return MIN_CORRECTNESS


def format_reward(text: str, ground_truth: str) -> float:
    """1.0 when `text` has the layout of the ground truth's type (tool call, response, both or
    neither), with exactly one of each of that type's block tags; else 0.0."""
    wants_tool = "<tool_call>" in ground_truth
    wants_response = "<response>" in ground_truth
    tool_tags_once = text.count("<tool_call>") == 1 and text.count("</tool_call>") == 1
    response_tags_once = text.count("<response>") == 1 and text.count("</response>") == 1
    if wants_tool and wants_response:
        ok = tool_tags_once and response_tags_once and _FORMAT_BOTH.match(text) is not None
    elif wants_tool:
        ok = tool_tags_once and _FORMAT_TOOL.match(text) is not None
    elif wants_response:
        ok = response_tags_once and _FORMAT_RESPONSE.match(text) is not None
    else:
        ok = _FORMAT_NEITHER.match(text) is not None
    return 1.0 if ok else 0.0


def length_reward(text: str, max_think_words: int = DEFAULT_MAX_THINK_WORDS) -> float:
    """min(1, round(words / max_think_words, 2)) for the words (whitespace-separated) after the
    last `<think>` up to the next `</think>`; 0.0 unless both tags occur somewhere in `text`."""
    if "<think>" not in text or "</think>" not in text:
        return 0.0
    thought = text.rpartition("<think>")[2].partition("</think>")[0]
    return min(1.0, round(len(thought.split()) / max_think_words, 2))


def _calls_exact(correctness: float) -> bool:
    """Whether a correctness reward is the maximum (3, up to float error): the calls are right."""
    return correctness >= MAX_CORRECTNESS - 1e-9


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _as_text(response: Any) -> str | None:
    """A response as str (bytes decoded as UTF-8 with replacement), or None if it is neither."""
    if isinstance(response, str):
        return response
    if isinstance(response, (bytes, bytearray)):
        return bytes(response).decode("utf-8", errors="replace")
    return None


def score_tool_call(response: str, ground_truth: str, max_think_words: int = DEFAULT_MAX_THINK_WORDS) -> ToolCallScore:
    """Correctness, format and length of one response, exactly as the official ToolRL reward.

    Args:
      response: the assistant text (decoded without special tokens). Untrusted: any value is
        accepted and malformed output scores the minimum; this function does not raise on it.
      ground_truth: the dataset's ground truth (`<think>`/`<tool_call>`/`<response>` text).
      max_think_words: think words that earn the full length reward (official: 512).

    Raises:
      ValueError: on a malformed or non-str ground truth (see `parse_ground_truth_calls`) or a
        non-positive `max_think_words` — configuration and data errors, never model errors.
    """
    if not _positive_int(max_think_words):
        raise ValueError(f"max_think_words must be a positive int, got {max_think_words!r}")
    if not isinstance(ground_truth, str):
        raise ValueError(f"ground truth must be a str, got {type(ground_truth).__name__}")
    gt_calls = parse_ground_truth_calls(ground_truth)
    raw = _as_text(response)
    if raw is None:
        return ToolCallScore(MIN_CORRECTNESS if gt_calls is not None else 0.0, 0.0, 0.0)
    text = assistant_text(raw)
    return ToolCallScore(
        correctness=correctness_reward(text, gt_calls),
        format=format_reward(text, ground_truth),
        length=length_reward(text, max_think_words),
    )


def is_correct(response: str, ground_truth: str, correctness: float | None = None) -> bool:
    """Whether `response` solves the request of `ground_truth` (the "correct" of Correct Acc).

    For a ground truth with a tool call: maximal correctness (3), i.e. the calls are exactly right.
    For one without: the response answers with a `<response>` and makes no `<tool_call>`. The
    format is not required (it is its own metric, Format Acc).

    Args:
      response: the decoded response.
      ground_truth: its ToolRL ground truth.
      correctness: the response's correctness reward when already computed (saves scoring it
        again); None computes it.
    """
    if "<tool_call>" not in ground_truth:
        return "<response>" in response and "<tool_call>" not in response
    if correctness is None:
        correctness = score_tool_call(response, ground_truth).correctness
    return _calls_exact(correctness)


@register_reward_kind("tool_calling")
@dataclasses.dataclass(frozen=True)
class ToolCallingReward:
    """The ToolRL rewards as a batch reward function (see `gd2po_jax.rewards.base`).

    Attributes:
      names: which columns to return, in this order; a subset of ("correctness", "format",
        "length"). The paper's settings are `SETTINGS["correctness_length"]` and
        `SETTINGS["correctness_format_length"]`.
      max_think_words: think words that earn the full length reward.
      conditional_length: when True, the length reward counts only for responses whose
        correctness is at its maximum (3); otherwise it is 0 (the GDPO paper's conditioned
        length reward). Ground truths without a tool call have correctness 0, so their responses
        then never earn length.
      ground_truth_column: the dataset column holding the ground truth.
    """

    names: tuple[str, ...] = SETTINGS["correctness_format_length"]
    max_think_words: int = DEFAULT_MAX_THINK_WORDS
    conditional_length: bool = False
    ground_truth_column: str = "ground_truth"

    def __post_init__(self):
        names = tuple(self.names)
        object.__setattr__(self, "names", names)
        unknown = [n for n in names if n not in REWARD_NAMES]
        if not names or unknown or len(set(names)) != len(names):
            raise ValueError(
                f"tool_calling reward names must be distinct entries of {REWARD_NAMES}, "
                f"got {names!r}; the paper's settings are {SETTINGS}"
            )
        if not _positive_int(self.max_think_words):
            raise ValueError(f"max_think_words must be a positive int, got {self.max_think_words!r}")

    @property
    def min_values(self) -> tuple[float, ...]:
        """The lowest value of each column (what a rollout that cannot be scored gets)."""
        lowest = {"correctness": MIN_CORRECTNESS, "format": 0.0, "length": 0.0}
        return tuple(lowest[name] for name in self.names)

    def check_columns(self, columns: Mapping[str, Sequence[Any]]) -> list[tuple[int, str, str]]:
        """(row, column, problem) of each dataset row whose ground truth cannot be scored
        (`ground_truth_problem`), for `gd2po_jax.rewards.base.column_problems`."""
        column = self.ground_truth_column
        if column not in columns:
            raise ValueError(
                f"the tool_calling reward needs the dataset column {column!r}; the data has columns {sorted(columns)}"
            )
        problems = ((i, ground_truth_problem(gt)) for i, gt in enumerate(columns[column]))
        return [(i, column, problem) for i, problem in problems if problem is not None]

    def score(self, response: str, ground_truth: str) -> ToolCallScore:
        """The three rewards of one response, with the conditional length rule applied."""
        s = score_tool_call(response, ground_truth, self.max_think_words)
        if self.conditional_length and not _calls_exact(s.correctness):
            s = dataclasses.replace(s, length=0.0)
        return s

    def __call__(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        columns: Mapping[str, Sequence[Any]],
    ) -> np.ndarray:
        """Rewards `[N, K]` (float32) for N responses, K = len(self.names), columns in `names`
        order. `columns[ground_truth_column][i]` is the ground truth of response i."""
        if self.ground_truth_column not in columns:
            raise ValueError(
                f"the tool_calling reward needs the dataset column {self.ground_truth_column!r}; "
                f"the batch has columns {sorted(columns)}"
            )
        ground_truths = columns[self.ground_truth_column]
        if not len(prompts) == len(responses) == len(ground_truths):
            raise ValueError(
                f"batch sizes differ: {len(prompts)} prompts, {len(responses)} responses, "
                f"{len(ground_truths)} ground truths"
            )
        out = np.zeros((len(responses), len(self.names)), dtype=np.float32)
        for i, (response, gt) in enumerate(zip(responses, ground_truths, strict=True)):
            try:
                s = self.score(response, gt)
            except ValueError as err:
                raise ValueError(f"batch row {i} (0-based): {err}") from err
            out[i] = [getattr(s, name) for name in self.names]
        return out
