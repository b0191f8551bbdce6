"""API-Bank evaluation metrics, as the ToolRL/GD2PO evaluation computes them (docs/algorithm.md#api-bank-metric).

Each test example has one reference call (`answer`: a list whose first element is
`{"name": ..., "parameters": {...}}`, or that dict itself). A model output is scored with

  correct in {0, 1}  some tool call in the output has the reference name and parameters
  format  in {0, 1}  the think / tool_call / response blocks are balanced, single and ordered
  length  in [0, 1]  words in the first think block / max_think_words, rounded to 2 decimals

and `aggregate_api_bank` turns (level, score) pairs into Correct Acc per level and overall,
Format Acc and mean Length, rounded as the official leaderboard rounds them. `api_bank_scorer`
scores generated responses against the rows of a loaded API-Bank dataset and `api_bank_report`
aggregates the scored records.

The answer format (list, bare dict or Python literal; JSON in a dataset's `ground_truth` column)
is parsed by `gd2po_jax.data.loaders.parse_api_bank_answer` / `decode_api_bank_answer` only.

This is an evaluation metric, not the training reward: parsing is lenient (unparsable lines are
skipped, extra calls do not hurt) and text before `<think>` is allowed. Model output is untrusted
and parsed with the same bounded JSON reader as the rewards; nothing here raises on model output.
A block longer than `MAX_TOOL_BLOCK_CHARS` yields no calls (bounds work on adversarial output).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

from gd2po_jax.data.loaders import decode_api_bank_answer, parse_api_bank_answer
from gd2po_jax.rewards.bounded_json import loads_bounded
from gd2po_jax.rewards.tool_calling import DEFAULT_MAX_THINK_WORDS, MAX_TOOL_BLOCK_CHARS

_TAGS = ("think", "tool_call", "response")


@dataclasses.dataclass(frozen=True)
class ApiBankScore:
    """The three API-Bank metrics of one model output."""

    correct: int
    format: int
    length: float


def reference_call(answer: Any) -> tuple[str, dict]:
    """(name, parameters) of the reference call: the first call of an API-Bank `answer` (any form
    `parse_api_bank_answer` reads).

    Raises:
      ValueError: when the answer is not a non-empty list of {'name': str, 'parameters': dict}
        (or one such dict).
    """
    call = parse_api_bank_answer(answer)[0]
    return call["name"], dict(call["parameters"])


def parse_tool_calls(output: str) -> list[Any]:
    """JSON values of the lines of the first `<tool_call>` … `</tool_call>` block of `output`.

    Lines are split with `str.splitlines`, stripped, and blank or unparsable lines are skipped;
    no block (either tag missing) or an oversized block gives [].
    """
    if "<tool_call>" not in output or "</tool_call>" not in output:
        return []
    block = output.partition("<tool_call>")[2].partition("</tool_call>")[0].strip()
    if len(block) > MAX_TOOL_BLOCK_CHARS:
        return []
    calls = []
    for line in block.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            calls.append(loads_bounded(line))
        except ValueError:
            continue
    return calls


def correct_score(calls: Sequence[Any], answer: Any) -> int:
    """1 if some call matches the reference name and parameters (Python equality), else 0.

    A JSON-string call is decoded once more; a call without `name` and `parameters` keys is
    taken as the parameters of a call to the reference tool. Calls are checked in order and the
    first one that cannot be read (a number, a string that is not JSON, …) ends the search with 0,
    as in the official evaluation.
    """
    name, parameters = reference_call(answer)
    for call in calls:
        try:
            if isinstance(call, str):
                call = loads_bounded(call)
            if "name" not in call or "parameters" not in call:
                predicted_name, predicted_parameters = name, call
            else:
                predicted_name, predicted_parameters = call["name"], call["parameters"]
            if predicted_name == name and predicted_parameters == parameters:
                return 1
        except (ValueError, TypeError, KeyError, RecursionError):
            return 0
    return 0


def format_score(output: str) -> int:
    """1 if the stripped output has well-formed blocks, else 0:

    each of think / tool_call / response opens and closes the same number of times, at most once;
    `<think>` … `</think>` is present and in order; at least one of tool_call / response is
    present; each present block closes after it opens and opens after `</think>`; when both are
    present the response opens after `</tool_call>` (and closes after the tool call opens).
    """
    text = output.strip()
    if not text:
        return 0
    for tag in _TAGS:
        opens, closes = text.count(f"<{tag}>"), text.count(f"</{tag}>")
        if opens != closes or opens > 1:
            return 0
    think_start, think_end = text.find("<think>"), text.find("</think>")
    if think_start < 0 or think_end < 0 or think_end <= think_start:
        return 0
    after_think = think_end + len("</think>")
    tool_start, tool_end = text.find("<tool_call>"), text.find("</tool_call>")
    resp_start, resp_end = text.find("<response>"), text.find("</response>")
    has_tool, has_resp = tool_start >= 0, resp_start >= 0
    if not has_tool and not has_resp:
        return 0
    if has_tool and (tool_end <= tool_start or tool_start < after_think):
        return 0
    if has_resp and (resp_end <= resp_start or resp_start < after_think):
        return 0
    if has_tool and has_resp and (resp_start < tool_end or resp_end < tool_start):
        return 0
    return 1


def think_text(output: str) -> str | None:
    """Stripped text between the first `<think>` and the first `</think>`; None when either is
    missing or the close comes first."""
    start, end = output.find("<think>"), output.find("</think>")
    if start < 0 or end < 0 or end <= start:
        return None
    return output[start + len("<think>") : end].strip()


def length_score(output: str, max_think_words: int = DEFAULT_MAX_THINK_WORDS) -> float:
    """min(1, round(think words / max_think_words, 2)), Python rounding; 0.0 without think text."""
    thought = think_text(output)
    if thought is None:
        return 0.0
    return min(1.0, round(len(thought.split()) / max_think_words, 2))


def score_api_bank(response: str, answer: Any, max_think_words: int = DEFAULT_MAX_THINK_WORDS) -> ApiBankScore:
    """Correct, format and length of one model output against an API-Bank answer.

    Args:
      response: the generated assistant text (untrusted; stripped before scoring, as the
        official generation script strips it). A non-str scores 0 everywhere.
      answer: the parsed API-Bank `answer` (a list of `{"name", "parameters"}` dicts whose first
        element is the reference, or that dict).
      max_think_words: think words that earn the full length score (official: 512).

    Raises:
      ValueError: on a malformed `answer` or a non-positive `max_think_words` (data and
        configuration errors, never model errors).
    """
    if isinstance(max_think_words, bool) or not isinstance(max_think_words, int) or max_think_words <= 0:
        raise ValueError(f"max_think_words must be a positive int, got {max_think_words!r}")
    reference_call(answer)
    if not isinstance(response, str):
        return ApiBankScore(correct=0, format=0, length=0.0)
    output = response.strip()
    return ApiBankScore(
        correct=correct_score(parse_tool_calls(output), answer),
        format=format_score(output),
        length=length_score(output, max_think_words),
    )


def api_bank_scorer(max_think_words: int) -> Callable[[str, Mapping[str, Any]], dict[str, float]]:
    """A scorer for `gd2po_jax.evaluation.generation.evaluate`: `score_api_bank` of a response
    against a loaded API-Bank row (``row["ground_truth"]``: the JSON answer), as
    ``{"correct", "format", "length"}`` floats."""

    def score(response: str, row: Mapping[str, Any]) -> dict[str, float]:
        s = score_api_bank(response, decode_api_bank_answer(row["ground_truth"]), max_think_words)
        return {"correct": float(s.correct), "format": float(s.format), "length": s.length}

    return score


@dataclasses.dataclass(frozen=True)
class ApiBankReport:
    """Aggregated API-Bank metrics. Each dict maps "level_<L>" for every level seen, and
    "overall" (pooled over all examples), to a value; None where there are no examples.

    correct_acc and format_acc are percentages rounded to 2 decimals, length the mean length
    score rounded to 4 decimals (the official leaderboard's rounding); count is the number of
    examples.
    """

    correct_acc: dict[str, float | None]
    format_acc: dict[str, float | None]
    length: dict[str, float | None]
    count: dict[str, int]

    def to_dict(self) -> dict[str, dict]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ApiBankReport:
        """The report of a `to_dict` output (extra keys, e.g. of a written summary, are ignored)."""
        return cls(**{f.name: dict(values[f.name]) for f in dataclasses.fields(cls)})

    def table(self) -> str:
        """A fixed-width text table: one row per level and one for overall."""
        header = f"{'':<10}{'count':>7}{'Correct Acc %':>15}{'Format Acc %':>14}{'Length':>9}"
        rows = [header]
        for key in self.count:
            rows.append(
                f"{key:<10}{self.count[key]:>7}{_cell(self.correct_acc[key]):>15}"
                f"{_cell(self.format_acc[key]):>14}{_cell(self.length[key]):>9}"
            )
        return "\n".join(rows)


def _cell(value: float | None) -> str:
    return "N/A" if value is None else f"{value}"


def _percent(numerator: int, denominator: int) -> float | None:
    return None if denominator <= 0 else round(numerator / denominator * 100, 2)


def _mean(total: float, count: int) -> float | None:
    return None if count <= 0 else round(total / count, 4)


def aggregate_api_bank(scores: Iterable[tuple[Hashable, ApiBankScore]]) -> ApiBankReport:
    """Correct Acc per level and overall, Format Acc and mean Length from (level, score) pairs.

    Levels are any sortable labels (API-Bank uses 1, 2, 3); keys are "level_<label>" in sorted
    order, then "overall", which pools all examples (not a mean of the level means).
    """
    totals: dict[Any, list] = {}  # level (hashable and sortable) -> [count, correct, format, length]
    for level, score in scores:
        entry = totals.setdefault(level, [0, 0, 0, 0.0])
        entry[0] += 1
        entry[1] += int(score.correct == 1)
        entry[2] += int(score.format == 1)
        entry[3] += float(score.length)
    groups = {f"level_{level}": totals[level] for level in sorted(totals)}
    per_level = list(groups.values())
    groups["overall"] = [sum(t[i] for t in per_level) for i in range(4)]
    return ApiBankReport(
        correct_acc={k: _percent(c, n) for k, (n, c, _, _) in groups.items()},
        format_acc={k: _percent(f, n) for k, (n, _, f, _) in groups.items()},
        length={k: _mean(s, n) for k, (n, _, _, s) in groups.items()},
        count={k: n for k, (n, _, _, _) in groups.items()},
    )


def api_bank_report(records: Iterable[Mapping[str, Any]]) -> ApiBankReport:
    """`aggregate_api_bank` of scored generation records (``level``, and the ``correct``,
    ``format``, ``length`` fields that `api_bank_scorer` adds)."""
    return aggregate_api_bank(
        (r["level"], ApiBankScore(correct=int(r["correct"]), format=int(r["format"]), length=r["length"]))
        for r in records
    )
