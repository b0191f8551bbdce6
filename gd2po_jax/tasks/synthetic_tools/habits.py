"""What RL did to the habit of the synthetic task (`SyntheticToolsConfig.habit_fraction`).

    python eval.py --workdir=runs/default --habits=before_rl,after_rl

asks the run's task (`gd2po_jax.tasks.synthetic_tools.task.SyntheticToolsTask.habit_breakdown`), which
reads the run's resolved config (which tools have the habit, `habit_tools`) and its saved greedy
evaluations ``eval/before_rl.jsonl`` and ``eval/after_rl.jsonl``; it prints `habit_breakdown`: for
the one-call requests, split by whether the requested tool is a habit tool, the rows, the responses
that call that tool with exactly the ground truth's parameter names, and the exactly correct
responses. The habit leaves out a tool's last parameter, so "right names" is what RL has to repair;
values that are still wrong show up as the gap between "right names" and "exact".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gd2po_jax.rewards.tool_calling import parse_ground_truth_calls, parse_response_calls
from gd2po_jax.tasks.synthetic_tools.data import SyntheticToolsConfig, habit_tools


def habit_breakdown(generations: Iterable[Mapping[str, Any]], habits: frozenset[str]) -> dict[str, dict[str, int]]:
    """Counts over the one-call rows of ``generations`` (rows of an ``eval/<name>.jsonl``: at least
    ``response``, ``ground_truth`` and ``correct``).

    Returns:
      ``{"habit_tools": counts, "other_tools": counts}``, each ``{"rows", "right_names", "exact"}``.
    """
    out = {group: {"rows": 0, "right_names": 0, "exact": 0} for group in ("habit_tools", "other_tools")}
    for row in generations:
        truth = parse_ground_truth_calls(row["ground_truth"])
        if not truth or len(truth) != 1:
            continue
        (wanted,) = truth
        counts = out["habit_tools" if wanted["name"] in habits else "other_tools"]
        counts["rows"] += 1
        calls = parse_response_calls(row["response"])
        counts["right_names"] += bool(
            calls
            and len(calls) == 1
            and isinstance(calls[0], dict)
            and calls[0].get("name") == wanted["name"]
            and isinstance(calls[0].get("parameters"), dict)
            and sorted(calls[0]["parameters"]) == sorted(wanted["parameters"])
        )
        counts["exact"] += int(row["correct"] >= 1.0)
    return out


def habits_of_evaluations(
    world: SyntheticToolsConfig, names: Sequence[str], generations: Callable[[str], Iterable[Mapping[str, Any]]]
) -> dict[str, dict[str, dict[str, int]]]:
    """`habit_breakdown` of the saved generations of each evaluation of ``names`` (``generations(name)``:
    the rows of its ``eval/<name>.jsonl``), with the habit tools of the run's world (``world.seed``
    and ``world.habit_fraction``: ``data.synthetic``'s)."""
    habits = habit_tools(world.seed, world.habit_fraction)
    return {name: habit_breakdown(generations(name), habits) for name in names}


def habits_table(results: dict[str, dict[str, dict[str, int]]]) -> str:
    """`habits_of_evaluations` as a text table: per evaluation and tool group, the one-call rows, the
    calls with the right parameter names, and the exactly correct ones."""
    lines = [f"{'eval':<12}{'tools':<13}{'rows':>6}{'right names':>13}{'exact':>7}"]
    for name, groups in results.items():
        for group, counts in groups.items():
            lines.append(f"{name:<12}{group:<13}{counts['rows']:>6}{counts['right_names']:>13}{counts['exact']:>7}")
    return "\n".join(lines)
