"""A sweep directory (`gd2po_jax.experiments.sweeps`) as tables, paired significance tests and plots.

``python report.py --sweep_dir=DIR`` runs this (sweep.py does too, once every run has finished).
It reads the finished runs of ``DIR/runs/<method>/seed<k>`` (config.json, metrics.jsonl,
results.json, eval/test.json) and writes ``DIR/report``::

    summary.md           per method: the final test metrics of the task (`test_metrics`: those the
                         task names in sweep.json, e.g. Correct Acc, Format Acc, Length for tool
                         calling; each reward's mean and their weighted sum for a task of your own
                         reward functions; the reward models' means and the ground-truth rates per
                         request kind for the helpfulness-safety task) and the area under the
                         training curve of each of the run's reward columns (its metrics.jsonl's,
                         not config.rewards.names: `run_reward_names`), as mean ± 95% CI over
                         seeds; a warning when a method has fewer than `MIN_SEEDS` seeds; each
                         method against GDPO, paired by seed (paired t-test p-values); and "which
                         tau": per test metric, every threshold of gd2po_snr against every other,
                         paired by seed, Holm-corrected, the best tau marked with its CI
    summary.csv          the same numbers, one row per (method, metric)
    tau_tests.csv        the tau-vs-tau tests, one row per (metric, tau a, tau b)
    learning_curves.png  reward/<name> over RL steps per method, mean ± 95% CI band over seeds
    diagnostics.png      advantages/conflict_ratio and advantages/kept_fraction over RL steps
    conflicts.png        advantages/conflict/<a>~<b> (the share of rollouts where two rewards'
                         advantages have opposite signs) over RL steps, one panel per run; only
                         when metrics.jsonl has them
    tau.png              each test metric against the SNR threshold of gd2po_snr (GDPO at tau = 0
                         and GD2PO-Hard at tau = 1 as references), the best tau circled; only if
                         there is one

Every figure has one legend for all its panels; a band is clipped to its metric's range (`metric_range`:
[0, 1] for shares and accuracies, else the range the seeds' values span).

Statistics: the CI half-width is ``t_{0.975, n-1} * s / sqrt(n)`` (``s`` the sample standard
deviation over the n seeds; none for n < 2). A method is compared with GDPO on the seeds both
have (two-sided paired t-test, ``scipy.stats.ttest_rel``); "n/a" for fewer than 2 such seeds, and
p = 1 when the two agree exactly on every seed. The thresholds of gd2po_snr are compared pairwise the
same way, per metric, and the p-values of a metric's pairs are Holm-corrected (`holm`); the best tau
of a metric is the one with the highest mean (every metric reported is higher-is-better). The area
under a training curve is the mean of the metric over the logged steps (the area normalised by the
number of steps).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import pathlib
import warnings
from typing import Any, Sequence

import numpy as np
from scipy import stats

from gd2po_jax.config import SNR_HALF_ALGORITHMS, ConfigError, RunConfig
from gd2po_jax.errors import UserError
from gd2po_jax.experiments.sweeps import (
    FINISHED,
    SNR_ALGORITHM,
    TEST_SPLIT,
    TRAINED,
    method_name,
    parse_method,
    run_status,
)
from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.metrics_logging import read_metrics
from gd2po_jax.runtime.run_dir import RunDir, RunDirError

BASELINE = "gdpo"
CONFIDENCE = 0.95
ALPHA = 0.05
TEST_METRICS = (("test/correct_acc", "Correct Acc"), ("test/format_acc", "Format Acc"), ("test/length", "Length"))
"""(key, label) of the tool-calling test metrics (eval/test.json's ``correct_acc`` ...)."""
CURVE_METRICS = (("advantages/conflict_ratio", "conflict ratio"), ("advantages/kept_fraction", "kept fraction"))
ALGORITHM_ORDER = ("grpo", "gdpo", "gd2po_hard", SNR_ALGORITHM, *SNR_HALF_ALGORITHMS)
DPI = 100
MIN_SEEDS = 5
"""Seeds per method below which summary.md warns that the intervals are wide and the tests weak."""
CONFLICT_PREFIX = "advantages/conflict/"
"""metrics.jsonl's ``advantages/conflict/<a>~<b>``: the share of rollouts where two rewards' advantages
have opposite signs (plotted per run in conflicts.png)."""
UNIT_RANGE_KEYS = (
    "advantages/conflict_ratio",
    "advantages/kept_fraction",
    CONFLICT_PREFIX,
    "test/correct_acc",
    "test/format_acc",
    "test/length",
    "test/correctness",
    "test/truncation_rate",
    "test/gt/",
    "reward_abstained/",
    "reward_failed/",
)
"""Metric keys (or prefixes, ending in ``/``) whose values are shares or accuracies, in [0, 1]."""


class ReportError(UserError, ValueError):
    """A sweep directory the report cannot read; the message names the file."""


# ----------------------------------------------------------------------------------------------
# Loading.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Run:
    """One finished run of a sweep.

    test: eval/test.json (correct_acc, format_acc, length, ...).
    metrics: the records of metrics.jsonl, one per logged RL step (``step``, ``reward/<name>`` ...).
    test_columns: (key, label) of the test metrics of the run's task (`test_metrics`).
    """

    method: str
    algorithm: str
    snr_tau: float | None
    seed: int
    workdir: pathlib.Path
    reward_names: tuple[str, ...]
    test: dict[str, Any]
    metrics: list[dict[str, Any]]
    test_columns: tuple[tuple[str, str], ...] = TEST_METRICS
    sft_seed: int = 0
    values: dict[str, float] | None = None  # precomputed `run_values` and more (a run summary's)

    @property
    def block(self) -> tuple[int, int]:
        """(sft.seed, train.seed): the runs of one block share the warm start and the RL seed."""
        return self.sft_seed, self.seed

    @property
    def label(self) -> str:
        """``<method>/seed<k>``, or ``<method>/sft<w>-seed<k>`` for a warm start other than sft.seed 0."""
        return (
            f"{self.method}/seed{self.seed}"
            if self.sft_seed == 0
            else f"{self.method}/sft{self.sft_seed}-seed{self.seed}"
        )


def test_metrics(
    sweep_dir: pathlib.Path, config: RunConfig, test: dict[str, Any] | None = None
) -> tuple[tuple[str, str], ...]:
    """(key, label) of the test metrics reported for the runs of ``sweep_dir``: those sweep.json
    records (the task's own choice, `gd2po_jax.tasks.Task.test_metrics`); for a sweep.json without
    them (older sweeps), each reward's mean and their sum when the run's eval/test.json (``test``)
    was scored by its rewards (it names them: ``reward_names``) or for reward-model runs, else
    `TEST_METRICS`.

    Raises:
      ReportError: naming sweep.json when it does not read.
    """
    file = pathlib.Path(sweep_dir) / "sweep.json"
    if file.is_file():
        try:
            recorded = run_dir.read_json(file).get("test_metrics")
        except RunDirError as err:
            raise ReportError(str(err)) from None
        if recorded:
            return tuple((key, label) for key, label in recorded)
    if test is not None and test.get("reward_names"):  # scored by the run's own rewards
        return tuple((f"test/{name}", name) for name in test["reward_names"]) + (("test/reward_sum", "sum"),)
    if config.rewards.kind == "reward_model":
        return tuple((f"test/{name}", name) for name in config.rewards.names) + (("test/reward_sum", "sum"),)
    return TEST_METRICS


def load_run(workdir: pathlib.Path) -> Run:
    """A finished run from its workdir (``SWEEP_DIR/runs/<method>/seed<k>``); method, threshold and
    seed come from its config.json, the test metrics to report from the sweep's (`test_metrics`).

    Raises:
      ReportError: naming the file that is missing, unreadable, or lacks a field.
    """
    files = RunDir(workdir)
    try:
        config = run_dir.load_run_config(workdir)
        test = run_dir.read_json(files.eval_report(TEST_SPLIT))
        metrics = read_metrics(workdir)
        results = run_dir.read_json(files.results) if files.results.is_file() else {}
    except (ConfigError, RunDirError) as err:  # both name the file
        raise ReportError(str(err)) from None
    if not isinstance(test, dict):
        raise ReportError(f"{files.eval_report(TEST_SPLIT)}: expected a JSON object (eval.py's report)")
    algorithm, seed = config.rl.algorithm, config.train.seed
    snr_tau = float(config.rl.snr_tau) if algorithm == SNR_ALGORITHM else None
    reward_names = run_reward_names(metrics, results if isinstance(results, dict) else {}, config)
    return Run(
        method=method_name(algorithm, snr_tau),
        algorithm=algorithm,
        snr_tau=snr_tau,
        seed=seed,
        workdir=workdir,
        reward_names=reward_names,
        test=test,
        metrics=metrics,
        test_columns=test_metrics(workdir.parents[2], config, test),
        sft_seed=config.sft.seed,
    )


def run_reward_names(metrics: Sequence[dict[str, Any]], results: dict[str, Any], config: RunConfig) -> tuple[str, ...]:
    """The reward columns of a run, as it trained: the names of metrics.jsonl's
    ``reward_failed/<name>`` (one per reward column, train.py logs it every logged step), else
    those results.json's evaluations name (``reward_names``), else ``config.rewards.names`` (a
    built-in family's; empty when the rewards are ``rewards.functions``)."""
    names = [key.split("/", 1)[1] for record in metrics for key in record if key.startswith("reward_failed/")]
    if names:
        return tuple(dict.fromkeys(names))
    for when in ("after_rl", "before_rl"):
        evaluation = results.get(when)
        if isinstance(evaluation, dict) and evaluation.get("reward_names"):
            return tuple(evaluation["reward_names"])
    return tuple(config.rewards.names)


def find_runs(sweep_dir: pathlib.Path) -> tuple[list[Run], list[pathlib.Path]]:
    """(the finished runs, the workdirs of the unfinished ones) under ``sweep_dir/runs``.

    A trained run whose eval/test.json exists but does not read (the sweep evaluates it again) is
    loaded anyway, so that `load_run` raises `ReportError` naming the file rather than the report
    leaving the run out."""
    finished, unfinished = [], []
    for workdir in sorted(pathlib.Path(sweep_dir).glob("runs/*/seed*")):
        if not workdir.is_dir():
            continue
        status = run_status(workdir)
        if status == FINISHED or (status == TRAINED and RunDir(workdir).eval_report(TEST_SPLIT).is_file()):
            finished.append(load_run(workdir))
        else:
            unfinished.append(workdir)
    return finished, unfinished


def method_order(methods: Sequence[str]) -> list[str]:
    """GRPO, GDPO, GD2PO-Hard, GD2PO-SNR by threshold, the low- then the high-conflict SNR half,
    then anything else by name."""

    def key(method: str):
        algorithm, tau = parse_method(method)
        rank = ALGORITHM_ORDER.index(algorithm) if algorithm in ALGORITHM_ORDER else len(ALGORITHM_ORDER)
        return rank, -1.0 if tau is None else tau, method

    return sorted(set(methods), key=key)


# ----------------------------------------------------------------------------------------------
# Statistics.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Mean over seeds with the half-width of its ``CONFIDENCE`` t-interval (NaN for n < 2)."""

    n: int
    mean: float
    half_width: float


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """`Estimate` of the finite ``values``: mean ± t_{(1+c)/2, n-1} * std(ddof=1) / sqrt(n)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    n = len(x)
    if n == 0:
        return Estimate(0, math.nan, math.nan)
    if n == 1:
        return Estimate(1, float(x[0]), math.nan)
    t = stats.t.ppf(0.5 + confidence / 2, n - 1)
    return Estimate(n, float(x.mean()), float(t * x.std(ddof=1) / math.sqrt(n)))


@dataclasses.dataclass(frozen=True)
class Paired:
    """A paired comparison over the seeds two methods share; ``p_value`` None for < 2 pairs."""

    n_pairs: int
    p_value: float | None

    @property
    def significant(self) -> bool | None:
        return None if self.p_value is None else self.p_value < ALPHA


def paired_test(a: dict[Any, float], b: dict[Any, float]) -> Paired:
    """Two-sided paired t-test of ``a`` against ``b`` (seed or block -> value) on their common keys."""
    seeds = sorted(s for s in set(a) & set(b) if math.isfinite(a[s]) and math.isfinite(b[s]))
    if len(seeds) < 2:
        return Paired(len(seeds), None)
    x, y = np.array([a[s] for s in seeds]), np.array([b[s] for s in seeds])
    if np.all(x - y == 0):
        return Paired(len(seeds), 1.0)  # identical on every seed: no evidence of a difference
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nearly constant differences
        p_value = float(stats.ttest_rel(x, y).pvalue)
    return Paired(len(seeds), p_value)


def curve_area(records: Sequence[dict[str, Any]], key: str) -> float:
    """Area under the training curve of ``key`` normalised by steps: its mean over logged steps
    (NaN if never logged)."""
    values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    return float(np.mean(values)) if values else math.nan


def run_values(run: Run) -> dict[str, float]:
    """The summary metrics of one run: ``test/<name>`` and ``auc/reward/<name>`` (from ``run.values``
    when the run was read from its summary file, `gd2po_jax.experiments.study`)."""
    if run.values is not None:
        keys = [key for key, _ in run.test_columns] + [f"auc/reward/{name}" for name in run.reward_names]
        return {key: float(run.values.get(key, math.nan)) for key in keys}
    values = {}
    for key, _ in run.test_columns:
        value = run.test.get(key.split("/", 1)[1])
        values[key] = float(value) if isinstance(value, (int, float)) else math.nan
    for name in run.reward_names:
        values[f"auc/reward/{name}"] = curve_area(run.metrics, f"reward/{name}")
    return values


def metric_columns(runs: Sequence[Run]) -> list[tuple[str, str]]:
    """(key, label) of every summary metric, the runs' test metrics first, then one curve area per reward."""
    tests = list(dict.fromkeys(column for run in runs for column in run.test_columns))
    names = list(dict.fromkeys(name for run in runs for name in run.reward_names))
    return tests + [(f"auc/reward/{name}", f"AUC {name}") for name in names]


@dataclasses.dataclass(frozen=True)
class MethodSummary:
    """One row of the table: a method's estimates and its paired tests against GDPO (by metric key)."""

    method: str
    seeds: tuple[tuple[int, int], ...]  # the blocks (sft.seed, train.seed) of the method's runs
    estimates: dict[str, Estimate]
    versus_baseline: dict[str, Paired] | None  # None for the baseline itself or without one


def summarize(runs: Sequence[Run], baseline: str = BASELINE) -> list[MethodSummary]:
    """Per method (in `method_order`): mean ± CI of every metric and paired tests against ``baseline``."""
    columns = metric_columns(runs)
    by_method: dict[str, dict[tuple[int, int], dict[str, float]]] = {}
    for run in runs:
        by_method.setdefault(run.method, {})[run.block] = run_values(run)
    rows = []
    for method in method_order(list(by_method)):
        per_seed = by_method[method]
        estimates = {key: mean_ci([v.get(key, math.nan) for v in per_seed.values()]) for key, _ in columns}
        versus = None
        if method != baseline and baseline in by_method:
            versus = {
                key: paired_test(
                    {s: v.get(key, math.nan) for s, v in per_seed.items()},
                    {s: v.get(key, math.nan) for s, v in by_method[baseline].items()},
                )
                for key, _ in columns
            }
        rows.append(MethodSummary(method, tuple(sorted(per_seed)), estimates, versus))
    return rows


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (None: no test, left out of the family):
    the i-th smallest of m becomes ``max_{j <= i} min(1, (m - j + 1) p_(j))``, in the input's order."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running, m = 0.0, len(tested)
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


@dataclasses.dataclass(frozen=True)
class TauPair:
    """gd2po_snr at threshold ``a`` against threshold ``b`` on one metric, paired by seed."""

    a: float
    b: float
    paired: Paired
    p_holm: float | None  # Holm-corrected over the metric's pairs

    @property
    def significant(self) -> bool | None:
        return None if self.p_holm is None else self.p_holm < ALPHA


@dataclasses.dataclass(frozen=True)
class TauComparison:
    """Which tau, on one metric: each threshold's estimate, the best (highest mean; None without a
    finite mean) and every pair of thresholds tested (`TauPair`)."""

    key: str
    label: str
    estimates: dict[float, Estimate]
    best: float | None
    pairs: list[TauPair]


def snr_taus(runs: Sequence[Run]) -> list[float]:
    """The thresholds of the sweep's gd2po_snr runs, ascending."""
    return sorted({run.snr_tau for run in runs if run.algorithm == SNR_ALGORITHM and run.snr_tau is not None})


def compare_taus(runs: Sequence[Run], columns: Sequence[tuple[str, str]]) -> list[TauComparison]:
    """Per metric of ``columns`` (the task's test metrics): gd2po_snr's thresholds against each other,
    paired by seed (`paired_test`), Holm-corrected over the metric's pairs; empty without gd2po_snr."""
    taus = snr_taus(runs)
    if not taus:
        return []
    per_tau: dict[float, dict[tuple[int, int], dict[str, float]]] = {tau: {} for tau in taus}
    for run in runs:
        if run.algorithm == SNR_ALGORITHM and run.snr_tau is not None:
            per_tau[run.snr_tau][run.block] = run_values(run)
    out = []
    for key, label in columns:
        values = {tau: {s: v.get(key, math.nan) for s, v in seeds.items()} for tau, seeds in per_tau.items()}
        estimates = {tau: mean_ci(list(values[tau].values())) for tau in taus}
        finite = [tau for tau in taus if estimates[tau].n and math.isfinite(estimates[tau].mean)]
        best = max(finite, key=lambda tau: estimates[tau].mean) if finite else None
        tests = [(a, b, paired_test(values[a], values[b])) for i, a in enumerate(taus) for b in taus[i + 1 :]]
        adjusted = holm([t.p_value for _, _, t in tests])
        pairs = [TauPair(a, b, t, p) for (a, b, t), p in zip(tests, adjusted)]
        out.append(TauComparison(key, label, estimates, best, pairs))
    return out


def few_seeds(rows: Sequence[MethodSummary], minimum: int = MIN_SEEDS) -> list[MethodSummary]:
    """The methods with fewer than ``minimum`` finished seeds."""
    return [row for row in rows if len(row.seeds) < minimum]


def metric_range(key: str, values: Sequence[float]) -> tuple[float, float]:
    """The range a band of ``key`` is clipped to: [0, 1] for shares and accuracies (`UNIT_RANGE_KEYS`),
    else the range of ``values`` (the seeds' own values: a mean's band cannot leave what some seed
    reached); (-inf, inf) without a finite value."""
    if any(key == known or (known.endswith("/") and key.startswith(known)) for known in UNIT_RANGE_KEYS):
        return 0.0, 1.0
    finite = [v for v in values if math.isfinite(v)]
    return (min(finite), max(finite)) if finite else (-math.inf, math.inf)


# ----------------------------------------------------------------------------------------------
# Tables.
# ----------------------------------------------------------------------------------------------


def _format_estimate(e: Estimate) -> str:
    if e.n == 0:
        return "-"
    return f"{e.mean:.3f}" if e.n < 2 else f"{e.mean:.3f} ± {e.half_width:.3f}"


def _format_p(p: Paired) -> str:
    if p.p_value is None:
        return "n/a"
    return f"{p.p_value:.3g}" + (" (p<0.05)" if p.significant else "")


def markdown_table(
    rows: Sequence[MethodSummary],
    columns: Sequence[tuple[str, str]],
    *,
    baseline: str = BASELINE,
    title: str = "Sweep report",
    notes: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> str:
    """The Markdown summary: estimates per method, then p-values against ``baseline``, then ``extra``
    lines (the tau comparison)."""
    lines = [
        f"# {title}",
        "",
        f"Mean ± {CONFIDENCE:.0%} CI over seeds (t-distribution, n-1 degrees of freedom). Test metrics "
        "from eval/test.json of each run; AUC: mean of the reward over RL steps (metrics.jsonl).",
        "",
    ]
    lines.extend(notes)
    if notes:
        lines.append("")
    header = ["method", "seeds"] + [label for _, label in columns]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.method, str(len(row.seeds))] + [_format_estimate(row.estimates[key]) for key, _ in columns]
        lines.append("| " + " | ".join(cells) + " |")
    compared = [row for row in rows if row.versus_baseline is not None]
    lines += ["", f"## Against {baseline.upper()} (paired by seed, two-sided paired t-test, p-values)", ""]
    if not compared:
        lines.append(f"No comparison: the sweep has no finished {baseline} run, or no other method.")
        return "\n".join([*lines, *extra]) + "\n"
    header = ["method", "pairs"] + [label for _, label in columns]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in compared:
        assert row.versus_baseline is not None  # compared holds these only
        pairs = max(p.n_pairs for p in row.versus_baseline.values())
        cells = [row.method, str(pairs)] + [_format_p(row.versus_baseline[key]) for key, _ in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, *extra]) + "\n"


def tau_section(comparisons: Sequence[TauComparison]) -> list[str]:
    """summary.md's "Which tau" lines: per metric, each threshold's mean ± CI with the best marked,
    then the tau-vs-tau tests (raw and Holm-corrected p-values); empty without gd2po_snr."""
    if not comparisons:
        return []
    lines = [
        "",
        f"## Which tau ({SNR_ALGORITHM}: thresholds against each other, paired by seed, two-sided paired "
        "t-test, Holm-corrected per metric)",
        "",
    ]
    taus = list(comparisons[0].estimates)
    header = ["metric"] + [f"tau {tau:g}" for tau in taus] + ["best tau"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in comparisons:
        cells = [c.label]
        for tau in taus:
            text = _format_estimate(c.estimates[tau])
            cells.append(f"**{text}** (best)" if tau == c.best and len(taus) > 1 else text)
        best = "-" if c.best is None else f"{c.best:g}: {_format_estimate(c.estimates[c.best])}"
        cells.append(best)
        lines.append("| " + " | ".join(cells) + " |")
    pairs = [(c, pair) for c in comparisons for pair in c.pairs]
    lines.append("")
    if not pairs:
        lines.append("One threshold only: nothing to compare (give --snr_taus several values).")
        return lines
    header = ["metric", "tau a", "tau b", "pairs", "mean a - b", "p", "p (Holm)"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c, pair in pairs:
        diff = c.estimates[pair.a].mean - c.estimates[pair.b].mean
        holm_p = "n/a" if pair.p_holm is None else f"{pair.p_holm:.3g}" + (" (p<0.05)" if pair.significant else "")
        cells = [
            c.label,
            f"{pair.a:g}",
            f"{pair.b:g}",
            str(pair.paired.n_pairs),
            f"{diff:+.3f}",
            "n/a" if pair.paired.p_value is None else f"{pair.paired.p_value:.3g}",
            holm_p,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


TAU_CSV_FIELDS = (
    "metric",
    "tau_a",
    "tau_b",
    "n_pairs",
    "mean_a",
    "mean_b",
    "p_value",
    "p_holm",
    "significant_holm",
    "best_tau",
)


def tau_csv_rows(comparisons: Sequence[TauComparison]) -> list[dict[str, Any]]:
    """One dict per (metric, tau a, tau b) with `TAU_CSV_FIELDS`; "n/a" where a number does not exist."""
    return [
        {
            "metric": c.key,
            "tau_a": pair.a,
            "tau_b": pair.b,
            "n_pairs": pair.paired.n_pairs,
            "mean_a": c.estimates[pair.a].mean,
            "mean_b": c.estimates[pair.b].mean,
            "p_value": "n/a" if pair.paired.p_value is None else pair.paired.p_value,
            "p_holm": "n/a" if pair.p_holm is None else pair.p_holm,
            "significant_holm": "n/a" if pair.significant is None else ("yes" if pair.significant else "no"),
            "best_tau": "" if c.best is None else c.best,
        }
        for c in comparisons
        for pair in c.pairs
    ]


def seed_warning(rows: Sequence[MethodSummary], minimum: int = MIN_SEEDS) -> list[str]:
    """summary.md's warning naming the methods with fewer than ``minimum`` seeds (empty when none)."""
    few = few_seeds(rows, minimum)
    if not few:
        return []
    cells = ", ".join(f"{row.method} ({len(row.seeds)})" for row in few)
    return [
        f"**Warning: fewer than {minimum} seeds** for {cells}: with so few seeds the 95% intervals are wide "
        "(they may leave a metric's possible range) and the paired tests have little power; add --seeds.",
    ]


CSV_FIELDS = (
    "method",
    "algorithm",
    "snr_tau",
    "metric",
    "n",
    "mean",
    "ci95_half_width",
    "n_pairs_vs_gdpo",
    "p_value_vs_gdpo",
    "significant_vs_gdpo",
)


def csv_rows(rows: Sequence[MethodSummary], columns: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """One dict per (method, metric) with `CSV_FIELDS`; "n/a" where a number does not exist."""
    out = []
    for row in rows:
        algorithm, tau = row.method.partition("-tau")[::2]
        for key, _ in columns:
            e = row.estimates[key]
            p = (row.versus_baseline or {}).get(key)
            out.append(
                {
                    "method": row.method,
                    "algorithm": algorithm,
                    "snr_tau": tau or "",
                    "metric": key,
                    "n": e.n,
                    "mean": e.mean if e.n else "n/a",
                    "ci95_half_width": e.half_width if e.n >= 2 else "n/a",
                    "n_pairs_vs_gdpo": p.n_pairs if p else "n/a",
                    "p_value_vs_gdpo": p.p_value if p and p.p_value is not None else "n/a",
                    "significant_vs_gdpo": ("yes" if p.significant else "no") if p and p.p_value is not None else "n/a",
                }
            )
    return out


def write_csv(path: pathlib.Path, rows: list[dict[str, Any]], fields: Sequence[str] = CSV_FIELDS) -> None:
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(fields))
        writer.writeheader()
        writer.writerows(rows)


# ----------------------------------------------------------------------------------------------
# Plots.
# ----------------------------------------------------------------------------------------------


def curve_band(runs: Sequence[Run], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps [S], mean [S], CI half-width [S], NaN where < 2 seeds) of ``key`` over the runs of one
    method, at every step any of them logged."""
    by_step: dict[int, list[float]] = {}
    for run in runs:
        for record in run.metrics:
            if isinstance(record.get(key), (int, float)):
                by_step.setdefault(int(record["step"]), []).append(float(record[key]))
    steps = np.array(sorted(by_step), dtype=np.int64)
    estimates = [mean_ci(by_step[s]) for s in steps]
    return steps, np.array([e.mean for e in estimates]), np.array([e.half_width for e in estimates])


def logged_values(runs: Sequence[Run], key: str) -> list[float]:
    """Every value of ``key`` the runs' metrics.jsonl logged (for `metric_range`)."""
    return [float(r[key]) for run in runs for r in run.metrics if isinstance(r.get(key), (int, float))]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(methods: Sequence[str]) -> dict[str, Any]:
    plt = _pyplot()
    cycle = plt.get_cmap("tab10")
    return {m: cycle(i % 10) for i, m in enumerate(methods)}


def _shared_legend(fig, axes) -> None:
    """One legend for every panel of ``fig``, under them (the labels of all panels, once each)."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="lower center",
            ncol=min(len(handles), 6),
            fontsize=7,
            frameon=False,
        )


def _save(fig, path: pathlib.Path, legend_rows: int) -> None:
    plt = _pyplot()
    fig.tight_layout(rect=(0, 0.06 * legend_rows + 0.02, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_curves(runs: Sequence[Run], keys: Sequence[tuple[str, str]], path: pathlib.Path, *, title: str) -> bool:
    """One panel per (key, label): a line per method (mean over seeds) with its CI band, clipped to
    the metric's range (`metric_range`); one legend for all panels. False (nothing written) without
    a key."""
    if not keys:
        return False
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    methods = method_order([r.method for r in runs])
    colors = _colors(methods)
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2), squeeze=False)
    for ax, (key, label) in zip(axes[0], keys):
        low, high = metric_range(key, logged_values(runs, key))
        for method in methods:
            steps, mean, half = curve_band([r for r in runs if r.method == method], key)
            if not len(steps):
                continue
            ax.plot(steps, mean, color=colors[method], label=method, linewidth=1.2)
            band = np.isfinite(half)
            lower = np.clip((mean - half)[band], low, high)
            upper = np.clip((mean + half)[band], low, high)
            ax.fill_between(steps[band], lower, upper, color=colors[method], alpha=0.2, linewidth=0)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("RL step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
    _shared_legend(fig, axes[0])
    fig.suptitle(title, fontsize=9)
    _save(fig, path, legend_rows=1 + (len(methods) - 1) // 6)
    return True


def conflict_keys(runs: Sequence[Run]) -> list[str]:
    """The ``advantages/conflict/<a>~<b>`` keys any run's metrics.jsonl has, in order of first appearance."""
    keys = [key for run in runs for record in run.metrics for key in record if key.startswith(CONFLICT_PREFIX)]
    return list(dict.fromkeys(keys))


def plot_conflicts(runs: Sequence[Run], path: pathlib.Path) -> bool:
    """One panel per run (``<method>/seed<k>``): each pair's ``advantages/conflict/<a>~<b>`` over RL
    steps, in [0, 1]; one legend (the pairs). False (nothing written) when no run logged them."""
    keys = conflict_keys(runs)
    if not keys:
        return False
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    ordered = sorted(runs, key=lambda r: (method_order([x.method for x in runs]).index(r.method), r.block))
    columns = min(len(ordered), 4)
    rows = -(-len(ordered) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.6 * rows + 0.4), squeeze=False)
    cycle = plt.get_cmap("tab10")
    for ax, run in zip(axes.flat, ordered):
        for i, key in enumerate(keys):
            points = [(int(r["step"]), float(r[key])) for r in run.metrics if isinstance(r.get(key), (int, float))]
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, color=cycle(i % 10), label=key[len(CONFLICT_PREFIX) :], linewidth=1.2)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(run.label, fontsize=8)
        ax.set_xlabel("RL step", fontsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(ordered) :]:
        ax.set_visible(False)
    _shared_legend(fig, axes.flat)
    fig.suptitle("Reward pair conflicts: share of rollouts whose two advantages have opposite signs", fontsize=9)
    _save(fig, path, legend_rows=1 + (len(keys) - 1) // 6)
    return True


def tau_points(rows: Sequence[MethodSummary], key: str = "test/correct_acc") -> dict[str, list[tuple[float, Estimate]]]:
    """(tau, estimate) points of ``key``: ``snr`` for gd2po_snr by threshold, ``gdpo`` at 0 and
    ``gd2po_hard`` at 1 (the thresholds at which GD2PO-SNR equals them)."""
    points: dict[str, list[tuple[float, Estimate]]] = {"snr": [], "gdpo": [], "gd2po_hard": []}
    for row in rows:
        algorithm, tau = row.method.partition("-tau")[::2]
        if algorithm == SNR_ALGORITHM and tau:
            points["snr"].append((float(tau), row.estimates[key]))
        elif row.method == "gdpo":
            points["gdpo"].append((0.0, row.estimates[key]))
        elif row.method == "gd2po_hard":
            points["gd2po_hard"].append((1.0, row.estimates[key]))
    points["snr"].sort(key=lambda p: p[0])
    return points


def plot_tau(
    rows: Sequence[MethodSummary],
    path: pathlib.Path,
    columns: Sequence[tuple[str, str]] = TEST_METRICS,
    comparisons: Sequence[TauComparison] = (),
    values: dict[str, list[float]] | None = None,
) -> bool:
    """One panel per test metric of ``columns`` (key, label): the final value against tau (mean ± CI,
    clipped to the metric's range from ``values``: key -> the seeds' values), the best tau of
    ``comparisons`` circled; one legend. False (nothing written) without gd2po_snr."""
    if not columns or not tau_points(rows, columns[0][0])["snr"]:
        return False
    plt = _pyplot()
    best = {c.key: c.best for c in comparisons}
    width = min(len(columns), 4)
    height = -(-len(columns) // width)
    fig, axes = plt.subplots(height, width, figsize=(4 * width, 3.2 * height + 0.3), squeeze=False)
    for ax in list(axes.flat)[len(columns) :]:
        ax.set_visible(False)
    for ax, (key, label) in zip(axes.flat, columns):
        points = tau_points(rows, key)
        low, high = metric_range(key, (values or {}).get(key, []))

        def draw(series, **style):
            x = [t for t, _ in series]
            y = [e.mean for _, e in series]
            half = [0.0 if not math.isfinite(e.half_width) else e.half_width for _, e in series]
            below = [m - max(low, m - h) if math.isfinite(m) else 0.0 for m, h in zip(y, half)]
            above = [min(high, m + h) - m if math.isfinite(m) else 0.0 for m, h in zip(y, half)]
            ax.errorbar(x, y, yerr=[below, above], capsize=3, **style)

        draw(points["snr"], marker="o", color="tab:red", label=SNR_ALGORITHM)
        if points["gdpo"]:
            draw(points["gdpo"], marker="s", linestyle="none", color="tab:blue", label="gdpo (tau=0)")
        if points["gd2po_hard"]:
            draw(points["gd2po_hard"], marker="^", linestyle="none", color="tab:green", label="gd2po_hard (tau=1)")
        tau = best.get(key)
        if tau is not None:
            mean = dict(points["snr"])[tau].mean
            ax.plot(
                [tau],
                [mean],
                marker="o",
                markersize=12,
                markerfacecolor="none",
                color="black",
                linestyle="none",
                label="best tau",
            )
        ax.set_title(f"test {label}", fontsize=9)
        ax.set_xlabel("SNR threshold tau", fontsize=8)
        ax.set_xlim(-0.05, 1.05)
        ax.tick_params(labelsize=7)
    _shared_legend(fig, axes.flat)
    _save(fig, path, legend_rows=1)
    return True


# ----------------------------------------------------------------------------------------------
# The report.
# ----------------------------------------------------------------------------------------------


def sweep_dirs(text: str | pathlib.Path | Sequence[str | pathlib.Path]) -> list[pathlib.Path]:
    """The directories of ``--sweep_dir``: one path, a comma-separated list, or a sequence of paths.

    Raises:
      ReportError: no directory given.
    """
    items = text.split(",") if isinstance(text, str) else [text] if isinstance(text, pathlib.Path) else list(text)
    dirs = [pathlib.Path(str(item).strip()) for item in items if str(item).strip()]
    if not dirs:
        raise ReportError("--sweep_dir: give a sweep directory (or several, comma-separated)")
    return dirs


def check_unique(runs: Sequence[Run]) -> None:
    """Refuse two runs of one method in one block (sft.seed, train.seed), e.g. two sweeps of one warm
    start given together.

    Raises:
      ReportError: naming both runs' files.
    """
    seen: dict[tuple[str, tuple[int, int]], Run] = {}
    for run in runs:
        other = seen.setdefault((run.method, run.block), run)
        if other is not run:
            raise ReportError(
                f"{run.workdir}: a second {run.method} run of sft.seed {run.sft_seed}, train.seed {run.seed} "
                f"(the first: {other.workdir}); give sweeps of different warm starts (--config.sft.seed)"
            )


def write_report(
    sweep_dir: str | pathlib.Path | Sequence[str | pathlib.Path], out_dir: str | pathlib.Path | None = None
) -> dict[str, Any]:
    """Write the report of the finished runs in ``sweep_dir`` to ``out_dir`` (default
    ``sweep_dir/report``). Several sweep directories (a comma-separated string or a sequence; then
    ``out_dir`` is required) are read as one: runs are paired by block (sft.seed, train.seed), so
    sweeps of different warm starts add blocks. Returns the paths written: ``markdown``, ``csv``,
    ``plots`` (a list) and ``tau_csv`` (None without two thresholds of gd2po_snr to compare).

    Raises:
      ReportError: no finished run, a file of a finished run that cannot be read, or two runs of
        one method in one block.
    """
    dirs = sweep_dirs(sweep_dir)
    if len(dirs) > 1 and not out_dir:
        raise ReportError("--out_dir: required with several --sweep_dir directories")
    runs: list[Run] = []
    unfinished: list[str] = []
    for directory in dirs:
        found, left = find_runs(directory)
        runs += found
        prefix = f"{directory.name}/" if len(dirs) > 1 else ""
        unfinished += [f"{prefix}{w.relative_to(directory / 'runs')}" for w in left]
    if not runs:
        where = ", ".join(str(d / "runs") for d in dirs)
        raise ReportError(f"{where}: no finished run (results.json and eval/test.json); run sweep.py first")
    check_unique(runs)
    if len(dirs) == 1:
        notes = [f"{len(runs)} finished runs in `{dirs[0]}`."]
        title = f"Sweep report: {dirs[0].name}"
    else:
        notes = [f"{len(runs)} finished runs in {len(dirs)} sweeps: " + ", ".join(f"`{d}`" for d in dirs) + "."]
        title = "Sweep report: " + ", ".join(d.name for d in dirs)
    if unfinished:
        notes.append(f"Not included ({len(unfinished)} unfinished): " + ", ".join(f"`{u}`" for u in unfinished) + ".")
    return write_runs_report(runs, pathlib.Path(out_dir) if out_dir else dirs[0] / "report", title=title, notes=notes)


def write_runs_report(
    runs: Sequence[Run], out_dir: pathlib.Path, *, title: str, notes: Sequence[str] = ()
) -> dict[str, Any]:
    """`write_report` of ``runs`` (finished; from sweep directories or run summaries) into ``out_dir``,
    with ``notes`` under the title. Runs without metrics.jsonl records (read from summaries) have no
    training curves: then learning_curves.png, diagnostics.png and conflicts.png are not drawn."""
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = metric_columns(runs)
    rows = summarize(runs)
    test_columns = list(dict.fromkeys(column for run in runs for column in run.test_columns))
    comparisons = compare_taus(runs, test_columns)
    notes = list(notes)
    sft_seeds = sorted({run.sft_seed for run in runs})
    if len(sft_seeds) > 1:
        notes.append(
            f'Runs of {len(sft_seeds)} warm starts (sft.seed {", ".join(map(str, sft_seeds))}): "seeds" are '
            "blocks (sft.seed, train.seed), and methods are paired by block."
        )
    notes += seed_warning(rows)
    markdown = out_dir / "summary.md"
    markdown.write_text(markdown_table(rows, columns, title=title, notes=notes, extra=tau_section(comparisons)))
    table = out_dir / "summary.csv"
    write_csv(table, csv_rows(rows, columns))
    tau_table = None
    if any(c.pairs for c in comparisons):
        tau_table = out_dir / "tau_tests.csv"
        write_csv(tau_table, tau_csv_rows(comparisons), TAU_CSV_FIELDS)
    curves = [run for run in runs if run.metrics]
    reward_names = dict.fromkeys(name for run in curves for name in run.reward_names)
    reward_keys = [(f"reward/{name}", f"reward/{name}") for name in reward_names]
    plots = []
    band = f"mean ± {CONFIDENCE:.0%} CI over seeds"
    if curves and plot_curves(curves, reward_keys, out_dir / "learning_curves.png", title=f"Training rewards ({band})"):
        plots.append(out_dir / "learning_curves.png")
    if curves and plot_curves(
        curves, CURVE_METRICS, out_dir / "diagnostics.png", title=f"Advantage filtering ({band})"
    ):
        plots.append(out_dir / "diagnostics.png")
    if plot_conflicts(curves, out_dir / "conflicts.png"):
        plots.append(out_dir / "conflicts.png")
    values = {key: [v for run in runs if math.isfinite(v := run_values(run).get(key, math.nan))] for key, _ in columns}
    if plot_tau(rows, out_dir / "tau.png", test_columns, comparisons, values):
        plots.append(out_dir / "tau.png")
    return {"markdown": markdown, "csv": table, "plots": plots, "tau_csv": tau_table}
