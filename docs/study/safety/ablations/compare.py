"""Issue 36's ablations on the embedded helpfulness-safety task, across the three sweeps of
docs/study/README.md: GD2PO-Hard with and without query reweighting (``rl.query_reweighting``, the
paper's "filtering alone"), and GDPO against GD2PO-Hard at G = 4 and G = 8 (the paper's appendix C.2).

    python docs/study/safety/ablations/compare.py --study_dir=runs/study/ablations \
        > docs/study/safety/ablations/compare.md

Same statistics as report.py (mean ± 95% t-interval over seeds, two-sided paired t-test by seed),
from each run's eval/test.json (test split, greedy).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
from absl import app, flags

from gd2po_jax.experiments.sweep_report import mean_ci, paired_test

flags.DEFINE_string("study_dir", None, "The directory holding the sweeps g4/, no_reweighting/ and g8/.",
                    required=True)
FLAGS = flags.FLAGS

ARMS = {  # name -> (sweep, method)
    "GDPO, G=4": ("g4", "gdpo"),
    "GD2PO-Hard, G=4": ("g4", "gd2po_hard"),
    "GD2PO-Hard without reweighting, G=4": ("no_reweighting", "gd2po_hard"),
    "GDPO, G=8": ("g8", "gdpo"),
    "GD2PO-Hard, G=8": ("g8", "gd2po_hard"),
}
METRICS = (
    ("gt/harmful/level_1", "harmful (harmful req.)"), ("gt/redirect/level_1", "redirect (harmful req.)"),
    ("gt/helpful/level_0", "helpful (benign req.)"), ("gt/refusal/level_0", "refusal (benign req.)"),
    ("useful", "useful"), ("harmless", "harmless"), ("reward_sum", "useful + harmless"),
)
PAIRS = (
    ("GD2PO-Hard, G=4", "GD2PO-Hard without reweighting, G=4"),
    ("GD2PO-Hard, G=4", "GDPO, G=4"),
    ("GD2PO-Hard, G=8", "GDPO, G=8"),
    ("GDPO, G=8", "GDPO, G=4"),
    ("GD2PO-Hard, G=8", "GD2PO-Hard, G=4"),
)


def test_results(study: pathlib.Path, sweep: str, method: str) -> dict[int, dict]:
    """Seed -> eval/test.json of the runs of ``method`` in ``study/sweep`` that have one."""
    runs = study / sweep / "runs" / method
    found = {}
    for run in sorted(runs.glob("seed*")):
        path = run / "eval" / "test.json"
        if path.is_file():
            found[int(run.name.removeprefix("seed"))] = json.loads(path.read_text())
    return found


def estimate(values) -> str:
    e = mean_ci(values)
    return f"{e.mean:.3f} ± {e.half_width:.3f}"


def main(argv):
    del argv
    study = pathlib.Path(FLAGS.study_dir)
    results = {arm: test_results(study, *where) for arm, where in ARMS.items()}
    labels = [label for _, label in METRICS]
    print("# Ablations: query reweighting, and GDPO vs GD2PO-Hard at G = 4 and G = 8\n")
    print("Output of `docs/study/safety/ablations/compare.py`. Test split (256 prompts, greedy), mean ± 95% CI over "
          "seeds; p: two-sided paired t-test by seed; the difference is the first arm's mean minus the second's.\n")
    print("| arm | seeds | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 2) + "|")
    for arm, by_seed in results.items():
        cells = [estimate([t[key] for t in by_seed.values()]) for key, _ in METRICS]
        print(f"| {arm} | {len(by_seed)} | " + " | ".join(cells) + " |")
    print("\n| comparison | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 1) + "|")
    for a, b in PAIRS:
        if not results[a] or not results[b]:
            continue
        cells = []
        for key, _ in METRICS:
            x = {s: t[key] for s, t in results[a].items()}
            y = {s: t[key] for s, t in results[b].items()}
            p = paired_test(x, y).p_value
            diff = np.mean(list(x.values())) - np.mean(list(y.values()))
            cells.append(f"{diff:+.3f} (p = {'-' if p is None else f'{p:.2g}'})")
        print(f"| {a} − {b} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    app.run(main)
