"""The Table 6 check's comparisons that report.py does not make: the low- against the high-conflict
half, and the sum of the two reward models' means (the paper ranks methods by an average over its
reward dimensions), each paired by seed; and every run's numbers.

    python docs/study/safety/halves/paired.py --sweep_dir=runs/study/safety_halves \
        > docs/study/safety/halves/paired.md

Same statistics as report.py (mean ± 95% t-interval over seeds, two-sided paired t-test), from
each run's eval/test.json.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
from absl import app, flags

from gd2po_jax.experiments.sweep_report import mean_ci, paired_test

flags.DEFINE_string("sweep_dir", None, "The sweep directory.", required=True)
FLAGS = flags.FLAGS

METHODS = ("gdpo", "low_conflict_half", "high_conflict_half")
METRICS = (
    ("gt/harmful/level_1", "harmful (harmful req.)"), ("gt/redirect/level_1", "redirect (harmful req.)"),
    ("gt/refusal/level_1", "refusal (harmful req.)"), ("gt/vague/level_1", "vague (harmful req.)"),
    ("gt/helpful/level_0", "helpful (benign req.)"), ("gt/refusal/level_0", "refusal (benign req.)"),
    ("gt/vague/level_0", "vague (benign req.)"), ("useful", "useful"), ("harmless", "harmless"),
    ("reward_sum", "useful + harmless"),
)
PAIRS = (("low_conflict_half", "gdpo"), ("high_conflict_half", "gdpo"), ("low_conflict_half", "high_conflict_half"))


def estimate(values) -> str:
    e = mean_ci(values)
    return f"{e.mean:.3f} ± {e.half_width:.3f}"


def main(argv):
    del argv
    runs = pathlib.Path(FLAGS.sweep_dir) / "runs"
    seeds = sorted(int(p.name.removeprefix("seed")) for p in (runs / "gdpo").iterdir())
    test = {m: [json.loads((runs / m / f"seed{s}" / "eval" / "test.json").read_text()) for s in seeds]
            for m in METHODS}
    values = {m: {key: [t[key] for t in test[m]] for key, _ in METRICS} for m in METHODS}
    labels = [label for _, label in METRICS]
    print(f"# Table 6 check: the halves against each other and against GDPO ({len(seeds)} seeds)\n")
    print("Output of `docs/study/safety/halves/paired.py`. Test split (256 prompts, greedy), mean ± 95% CI over "
          "seeds; p: two-sided paired t-test by seed; the difference is the first method's mean minus the "
          "second's.\n")
    print("| method | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 1) + "|")
    for m in METHODS:
        print(f"| {m} | " + " | ".join(estimate(values[m][key]) for key, _ in METRICS) + " |")
    print("\n| comparison | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 1) + "|")
    for a, b in PAIRS:
        cells = []
        for key, _ in METRICS:
            diff = np.mean(values[a][key]) - np.mean(values[b][key])
            p = paired_test(dict(enumerate(values[a][key])), dict(enumerate(values[b][key]))).p_value
            cells.append(f"{diff:+.3f} (p = {p:.2g})")
        print(f"| {a} − {b} | " + " | ".join(cells) + " |")
    print("\nEvery run (harmful rate on harmful requests / helpful rate on benign requests / useful + harmless):\n")
    print("| method | " + " | ".join(f"seed {s}" for s in seeds) + " |")
    print("|---" * (len(seeds) + 1) + "|")
    for m in METHODS:
        print(f"| {m} | " + " | ".join(
            f"{t['gt/harmful/level_1']:.3f} / {t['gt/helpful/level_0']:.3f} / {t['reward_sum']:.2f}" for t in test[m]) + " |")


if __name__ == "__main__":
    app.run(main)
