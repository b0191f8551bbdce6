"""What RL did to the habit of the synthetic task (`SyntheticToolsConfig.habit_fraction`).

    python -m gd2po_jax.tasks.habits --workdir=runs/default

reads the run's resolved config (which tools have the habit) and its greedy evaluations
`eval/before_rl.jsonl` and `eval/after_rl.jsonl`, and prints, for the one-call requests, split by
whether the requested tool is a habit tool: the rows, the responses that call that tool with exactly
the ground truth's parameter names, and the exactly correct responses. The habit leaves out a tool's
last parameter, so "right names" is what RL has to repair; values that are still wrong show up as
the gap between "right names" and "exact".
"""

from __future__ import annotations

import argparse
import json
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any

from gd2po_jax.rewards.tool_calling import parse_ground_truth_calls, parse_response_calls
from gd2po_jax.tasks.synthetic_tools import habit_tools


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
            calls and len(calls) == 1 and isinstance(calls[0], dict) and calls[0].get("name") == wanted["name"]
            and isinstance(calls[0].get("parameters"), dict)
            and sorted(calls[0]["parameters"]) == sorted(wanted["parameters"])
        )
        counts["exact"] += int(row["correct"] >= 1.0)
    return out


def _read_jsonl(path: pathlib.Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such evaluation (run train.py with an eval split first)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> dict[str, dict[str, dict[str, int]]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="a train.py workdir of the synthetic_tools task")
    parser.add_argument("--evals", default="before_rl,after_rl", help="names of eval/<name>.jsonl files")
    args = parser.parse_args(argv)
    workdir = pathlib.Path(args.workdir)
    config = json.loads((workdir / "config.json").read_text())
    if config.get("task") != "synthetic_tools":
        raise SystemExit(f"{workdir}: task is {config.get('task')!r}; habits exist only in synthetic_tools")
    synthetic = config["data"]["synthetic"]
    habits = habit_tools(synthetic["seed"], synthetic.get("habit_fraction", 0.0))
    results = {}
    print(f"{'eval':<12}{'tools':<13}{'rows':>6}{'right names':>13}{'exact':>7}")
    for name in args.evals.split(","):
        results[name] = habit_breakdown(_read_jsonl(workdir / "eval" / f"{name}.jsonl"), habits)
        for group, counts in results[name].items():
            print(f"{name:<12}{group:<13}{counts['rows']:>6}{counts['right_names']:>13}{counts['exact']:>7}")
    return results


if __name__ == "__main__":
    main()
