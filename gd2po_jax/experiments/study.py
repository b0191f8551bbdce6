"""A method study over blocks of warm starts: per-run summary files, and hypotheses tested by a rule.

``python report.py`` runs this (docs/sweeps.md, "Studies"):

- ``--sweep_dir=A,B,... --export_summaries=DIR`` writes a small JSON per finished run of the sweeps,
  ``DIR/<method>/sft<k>-seed<j>.json`` (`run_summary`: the test metrics, the mean of each training
  curve over steps, the config fields that define the setting), to commit as runs finish;
- ``--summaries=DIR[,DIR...]`` writes the ordinary sweep report from those files;
- ``--study=FILE`` tests the hypotheses the study file lists (`load_study`, `evaluate_hypothesis`) and
  writes ``summary.json`` and ``summary.md``.

A block is (sft.seed, train.seed): the runs of one block share the warm start and the RL seed, so
two methods are compared on the blocks both have (complete pairs only). Per hypothesis, with
``d_b = treatment_b - control_b`` over the n blocks: ``diff_pp = 100 mean(d)``, its 95% t interval
(n-1 degrees of freedom) and the two-sided paired t-test p (``scipy.stats.ttest_rel``); the p-values
of the primary hypotheses are Holm-corrected together (`holm`), those of the secondary ones among
themselves. The verdict, fixed before the runs (`verdict`): "reproduced" when the CI excludes 0 in
the paper's direction and p_holm < alpha; "no effect >= m pp" when the CI lies inside (-m, +m) pp
(m the hypothesis' minimal effect); else "inconclusive".

The warm start as a random effect (`warm_start_test`): the block differences averaged per warm start,
then a t interval and test over those k means with k-1 degrees of freedom. For a balanced design
(the same number of RL seeds per warm start) this is the exact test of the mean of a random-intercept
model of the paired differences when the between-warm-start variance estimate is not negative (the
ANOVA/REML estimate), and conservative otherwise; an unbalanced design weighs every warm start equally.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import warnings
from typing import Any, Sequence

import numpy as np
from scipy import stats

from gd2po_jax.config import ConfigError
from gd2po_jax.experiments import sweep_report
from gd2po_jax.experiments.sweep_report import (
    ALPHA,
    CONFIDENCE,
    CURVE_METRICS,
    Estimate,
    ReportError,
    Run,
    check_unique,
    find_runs,
    holm,
    mean_ci,
    method_order,
    run_values,
)
from gd2po_jax.experiments.sweeps import config_values, parse_method
from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.run_dir import RunDirError

SUMMARY_VERSION = 1
SETTING_FIELDS = (
    "config_version",
    "task",
    "data.synthetic",
    "rewards.kind",
    "rewards.names",
    "rewards.weights",
    "rewards.conditional_length",
    "rewards.max_think_words",
    "rl.num_generations",
    "sampling.temperature",
    "sampling.max_new_tokens",
    "train.num_steps",
    "train.prompts_per_step",
    "train.learning_rate",
    "sft.num_steps",
)
"""The config fields recorded in a run summary's ``setting``: the runs a study compares must agree on
them (paths, which may be absolute, are left out)."""
SUMMARY_KEYS = frozenset(
    {"summary_version", "run", "method", "algorithm", "snr_tau", "sft_seed", "train_seed"}
    | {"reward_names", "test_columns", "test", "curves", "logged_steps", "setting", "rl"}
)
SOURCE_KEY = "run"  # where the summary came from (not compared when a summary is written again)
DEFAULT_MIN_EFFECT_PP = 1.0
HYPOTHESIS_KEYS = {
    "name": str,
    "summaries": str,
    "treatment_summaries": str,
    "control_summaries": str,
    "treatment": str,
    "control": str,
    "metric": str,
    "direction": int,
    "min_effect_pp": float,
    "primary": bool,
}
SECONDARY_LABELS = (
    ("auc/advantages/conflict_ratio", "conflict ratio"),
    ("auc/advantages/kept_fraction", "kept fraction"),
)


# ----------------------------------------------------------------------------------------------
# Run summaries.
# ----------------------------------------------------------------------------------------------


def _finite_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def curve_keys(run: Run) -> list[str]:
    """The metrics.jsonl keys whose mean over logged steps a summary keeps: ``reward/<name>`` per
    reward column, the conflict ratio and kept fraction, and each reward pair's conflict share."""
    keys = [f"reward/{name}" for name in run.reward_names] + [key for key, _ in CURVE_METRICS]
    return keys + sweep_report.conflict_keys([run])


def run_summary(run: Run, setting: dict[str, Any], source: str, rl: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary of a finished run (`find_runs`) as JSON values: method, algorithm, snr_tau,
    sft_seed, train_seed, reward_names, test_columns, ``test`` (eval/test.json's numbers),
    ``curves`` (key -> mean over logged steps, `curve_keys`; the training AUC), logged_steps,
    ``setting`` (`setting_values`), ``rl`` (the run's config.rl: which variant of the method, e.g.
    query_reweighting) and ``run`` (``source``: where it came from, no absolute path).
    NaN is written as null."""
    test = {k: float(v) for k, v in run.test.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {
        "summary_version": SUMMARY_VERSION,
        "run": source,
        "method": run.method,
        "algorithm": run.algorithm,
        "snr_tau": run.snr_tau,
        "sft_seed": run.sft_seed,
        "train_seed": run.seed,
        "reward_names": list(run.reward_names),
        "test_columns": [list(column) for column in run.test_columns],
        "test": {k: _finite_or_none(v) for k, v in test.items()},
        "curves": {key: _finite_or_none(sweep_report.curve_area(run.metrics, key)) for key in curve_keys(run)},
        "logged_steps": len(run.metrics),
        "setting": setting,
        "rl": dict(rl or {}),
    }


def setting_values(values: dict[str, Any]) -> dict[str, Any]:
    """The `SETTING_FIELDS` of a config as JSON values (``config_values``), by dotted name."""
    out = {}
    for field in SETTING_FIELDS:
        node: Any = values
        for part in field.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        out[field] = node
    return out


def summary_path(out_dir: pathlib.Path, method: str, sft_seed: int, train_seed: int) -> pathlib.Path:
    """``out_dir/<method>/sft<k>-seed<j>.json``."""
    return out_dir / method / f"sft{sft_seed}-seed{train_seed}.json"


def summary_text(summary: dict[str, Any]) -> str:
    """A summary as its file's text: sorted keys, indented, a final newline (stable under git)."""
    return json.dumps(summary, indent=1, sort_keys=True, allow_nan=False) + "\n"


def export_summaries(dirs: Sequence[pathlib.Path], out_dir: pathlib.Path) -> dict[str, list[pathlib.Path]]:
    """Write the summary of every finished run of the sweeps ``dirs`` into ``out_dir`` (`summary_path`).
    A file that exists with the same summary (``run`` aside) is left as it is. Nothing is written when
    one would collide. Returns ``written``, ``unchanged`` (paths) and ``unfinished`` (workdirs).

    Raises:
      ReportError: no finished run; two runs of one method in one block; a file of ``out_dir`` that
        holds a different run (naming it and the fields that differ) or does not read.
    """
    runs: list[Run] = []
    unfinished: list[pathlib.Path] = []
    sources: list[str] = []  # per run: <sweep dir name>/runs/<method>/seed<j>
    for directory in dirs:
        found, left = find_runs(directory)
        sources += [f"{directory.name}/{run.workdir.relative_to(directory).as_posix()}" for run in found]
        runs += found
        unfinished += left
    if not runs:
        where = ", ".join(str(d / "runs") for d in dirs)
        raise ReportError(f"{where}: no finished run (results.json and eval/test.json); run sweep.py first")
    check_unique(runs)
    planned: list[tuple[pathlib.Path, str]] = []
    unchanged = []
    for run, source in zip(runs, sources):
        try:
            values = config_values(run_dir.load_run_config(run.workdir))
        except (ConfigError, RunDirError) as err:
            raise ReportError(str(err)) from None
        summary = run_summary(run, setting_values(values), source, values.get("rl"))
        path = summary_path(out_dir, run.method, run.sft_seed, run.seed)
        if path.is_file():
            before = _read_json(path)
            differ = sorted(
                k for k in set(before) | set(summary) if k != SOURCE_KEY and before.get(k) != summary.get(k)
            )
            if differ:
                raise ReportError(
                    f"{path}: holds another run ({before.get(SOURCE_KEY)}) than {summary[SOURCE_KEY]}: "
                    f"they differ in {', '.join(differ)}; delete the file to replace it"
                )
            if summary_text(before) == summary_text(summary):
                unchanged.append(path)
                continue
        planned.append((path, summary_text(summary)))
    for path, text in planned:
        path.parent.mkdir(parents=True, exist_ok=True)
        run_dir.write_text(path, text)  # atomic: a kill leaves no half summary to commit
    return {"written": [p for p, _ in planned], "unchanged": unchanged, "unfinished": unfinished}


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    try:
        value = run_dir.read_json(path)
    except RunDirError as err:
        raise ReportError(str(err)) from None
    if not isinstance(value, dict):
        raise ReportError(f"{path}: expected a JSON object")
    return value


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def read_summary(path: pathlib.Path) -> Run:
    """The `Run` of a summary file (no metrics records: ``values`` holds ``test/<key>`` and
    ``auc/<curve key>``, `study_values`).

    Raises:
      ReportError: naming the file and the field that is missing or wrong.
    """
    summary = _read_json(path)
    missing = sorted(SUMMARY_KEYS - set(summary))
    if missing:
        raise ReportError(f"{path}: missing field(s) {', '.join(missing)}; write it with report.py --export_summaries")
    if summary["summary_version"] != SUMMARY_VERSION:
        raise ReportError(
            f"{path}: summary_version {summary['summary_version']!r}, this report reads {SUMMARY_VERSION}"
        )
    checks = (("sft_seed", int), ("train_seed", int), ("test", dict), ("curves", dict), ("setting", dict), ("rl", dict))
    for key, kind in checks:
        if not isinstance(summary[key], kind) or isinstance(summary[key], bool):
            raise ReportError(f"{path}: {key}: expected {kind.__name__}, got {summary[key]!r}")
    method = str(summary["method"])
    if parse_method(method) != (summary["algorithm"], summary["snr_tau"]):
        raise ReportError(
            f"{path}: method {method!r} is not algorithm {summary['algorithm']!r} at snr_tau {summary['snr_tau']!r}"
        )
    expected = summary_path(path.parents[1], method, summary["sft_seed"], summary["train_seed"])
    if expected.name != path.name or path.parent.name != method:
        raise ReportError(
            f"{path}: holds {method} sft.seed {summary['sft_seed']} seed {summary['train_seed']}: "
            f"expected at {expected}"
        )
    values = {f"test/{k}": _number(v) for k, v in summary["test"].items()}
    values.update({f"auc/{k}": _number(v) for k, v in summary["curves"].items()})
    return Run(
        method=method,
        algorithm=str(summary["algorithm"]),
        snr_tau=None if summary["snr_tau"] is None else float(summary["snr_tau"]),
        seed=summary["train_seed"],
        workdir=path,
        reward_names=tuple(summary["reward_names"]),
        test=dict(summary["test"]),
        metrics=[],
        test_columns=tuple((str(k), str(label)) for k, label in summary["test_columns"]),
        sft_seed=summary["sft_seed"],
        values=values,
    )


def load_summaries(dirs: Sequence[pathlib.Path]) -> tuple[list[Run], list[dict[str, Any]]]:
    """(the runs of the summary files ``DIR/<method>/sft<k>-seed<j>.json`` of ``dirs``, their settings).

    Raises:
      ReportError: a directory without a summary; a file that does not read; two summaries of one
        method in one block; runs whose settings differ (naming a file and the fields).
    """
    runs, settings = [], []
    for directory in dirs:
        files = sorted(directory.glob("*/sft*-seed*.json"))
        if not files:
            raise ReportError(
                f"{directory}: no run summary (<method>/sft<k>-seed<j>.json); write them with report.py "
                "--sweep_dir=... --export_summaries=DIR"
            )
        for file in files:
            runs.append(read_summary(file))
            settings.append(_read_json(file)["setting"])
    check_unique(runs)
    check_same_setting(runs, settings)
    return runs, settings


def check_same_setting(runs: Sequence[Run], settings: Sequence[dict[str, Any]]) -> None:
    """Refuse runs whose settings (`SETTING_FIELDS`) differ.

    Raises:
      ReportError: naming the first run that differs from the first run, and the fields.
    """
    for run, setting in zip(runs[1:], settings[1:]):
        differ = sorted(k for k in set(setting) | set(settings[0]) if setting.get(k) != settings[0].get(k))
        if differ:
            raise ReportError(
                f"{run.workdir}: another setting than {runs[0].workdir} ({', '.join(differ)} differ); "
                "compare runs of one setting"
            )


def study_values(run: Run) -> dict[str, float]:
    """Every metric of a run a study can test: `run_values` (``test/<key>``, ``auc/reward/<name>``)
    and ``auc/<key>`` of every curve mean (``auc/advantages/conflict_ratio`` ...)."""
    values = dict(run_values(run))
    if run.values is not None:
        values.update(run.values)
    else:
        values.update({f"test/{k}": _number(v) for k, v in run.test.items()})
        values.update({f"auc/{key}": sweep_report.curve_area(run.metrics, key) for key in curve_keys(run)})
    return values


# ----------------------------------------------------------------------------------------------
# The study file.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    """One hypothesis of a study file: ``treatment`` against ``control`` on ``metric``, the paper's
    ``direction`` (+1: treatment higher), the minimal effect in percentage points. The runs of both
    are in ``summaries``, unless ``treatment_summaries`` / ``control_summaries`` name another directory
    for one of them (an arm of its own, e.g. GD2PO-Hard without reweighting against the primary GDPO)."""

    name: str
    summaries: pathlib.Path
    treatment: str
    control: str
    metric: str
    direction: int
    min_effect_pp: float = DEFAULT_MIN_EFFECT_PP
    primary: bool = True
    given: dict[str, str] = dataclasses.field(default_factory=dict)  # the directories as the file writes them
    treatment_summaries: pathlib.Path | None = None
    control_summaries: pathlib.Path | None = None

    def directory(self, role: str) -> pathlib.Path:
        """The summaries directory of the ``treatment`` or the ``control``."""
        return getattr(self, f"{role}_summaries") or self.summaries


@dataclasses.dataclass(frozen=True)
class Study:
    file: pathlib.Path
    title: str
    alpha: float
    hypotheses: tuple[Hypothesis, ...]


def load_study(file: str | pathlib.Path) -> Study:
    """The study file (JSON): ``{"title": ..., "alpha": 0.05, "hypotheses": [{"name", "summaries"
    (a directory, relative to the file), "treatment", "control", "metric", "direction" (+1 or -1),
    "min_effect_pp" (default 1), "primary" (default true)}, ...]}``.

    Raises:
      ReportError: naming the file and the field that is missing or wrong.
    """
    file = pathlib.Path(file)
    if not file.is_file():
        raise ReportError(f"{file}: no such study file")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ReportError(f"{file}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ReportError(f"{file}: expected a JSON object with hypotheses")
    unknown = sorted(set(data) - {"title", "alpha", "hypotheses"})
    if unknown:
        raise ReportError(f"{file}: unknown field(s) {', '.join(unknown)} (title, alpha, hypotheses)")
    alpha = data.get("alpha", ALPHA)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha < 1:
        raise ReportError(f"{file}: alpha: expected a number in (0, 1), got {alpha!r}")
    items = data.get("hypotheses")
    if not isinstance(items, list) or not items:
        raise ReportError(f"{file}: hypotheses: expected a non-empty list")
    hypotheses = []
    for index, item in enumerate(items):
        where = f"{file}: hypotheses[{index}]"
        if not isinstance(item, dict):
            raise ReportError(f"{where}: expected an object")
        unknown = sorted(set(item) - set(HYPOTHESIS_KEYS))
        if unknown:
            raise ReportError(f"{where}: unknown field(s) {', '.join(unknown)} ({', '.join(HYPOTHESIS_KEYS)})")
        fields: dict[str, Any] = {}
        for key, kind in HYPOTHESIS_KEYS.items():
            if key not in item:
                if key in ("min_effect_pp", "primary", "treatment_summaries", "control_summaries"):
                    continue
                raise ReportError(f"{where}.{key}: missing")
            value = item[key]
            ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
            if kind is float:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or (kind is str and not value.strip()):
                raise ReportError(
                    f"{where}.{key}: expected a {'non-empty string' if kind is str else kind.__name__}, got {value!r}"
                )
            fields[key] = value
        if fields["direction"] not in (1, -1):
            raise ReportError(f"{where}.direction: expected +1 (treatment higher) or -1, got {fields['direction']!r}")
        if fields.get("min_effect_pp", DEFAULT_MIN_EFFECT_PP) <= 0:
            raise ReportError(f"{where}.min_effect_pp: expected a positive number of percentage points")
        if fields["treatment"] == fields["control"]:
            raise ReportError(f"{where}: treatment and control are both {fields['treatment']!r}")
        fields["given"] = {}
        for key in ("summaries", "treatment_summaries", "control_summaries"):
            if key in fields:
                fields["given"][key] = fields[key]
                fields[key] = file.parent / fields[key]
        if "min_effect_pp" in fields:
            fields["min_effect_pp"] = float(fields["min_effect_pp"])
        hypotheses.append(Hypothesis(**fields))
    names = [h.name for h in hypotheses]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise ReportError(f"{file}: hypotheses: the name {duplicate!r} appears twice")
    return Study(file, str(data.get("title") or file.parent.name), float(alpha), tuple(hypotheses))


# ----------------------------------------------------------------------------------------------
# Tests and the decision rule.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BlockTest:
    """Paired differences over ``n`` units: mean, its CI (low, high) and the two-sided t-test p
    (None for n < 2; NaN interval)."""

    n: int
    mean: float
    low: float
    high: float
    sd: float
    p: float | None


def one_sample_t(differences: Sequence[float], confidence: float = CONFIDENCE) -> BlockTest:
    """The t interval and two-sided t-test (n-1 df) of the mean of ``differences`` against 0; with
    equal differences the interval is that value and p is 1 (all 0) or 0."""
    d = np.asarray(differences, dtype=np.float64)
    n = len(d)
    if n == 0:
        return BlockTest(0, math.nan, math.nan, math.nan, math.nan, None)
    mean = float(d.mean())
    if n == 1:
        return BlockTest(1, mean, math.nan, math.nan, math.nan, None)
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        return BlockTest(n, mean, mean, mean, 0.0, 1.0 if mean == 0.0 else 0.0)
    half = mean_ci(d.tolist(), confidence).half_width  # the same t interval as the report's tables
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.ttest_1samp(d, 0.0).pvalue)
    return BlockTest(n, mean, mean - half, mean + half, sd, p)


def paired_by_block(
    treatment: Sequence[Run], control: Sequence[Run], metric: str
) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray]:
    """(the blocks both have a finite ``metric`` on, sorted; treatment values [n]; control values [n])."""
    a = {run.block: study_values(run).get(metric, math.nan) for run in treatment}
    b = {run.block: study_values(run).get(metric, math.nan) for run in control}
    blocks = sorted(k for k in set(a) & set(b) if math.isfinite(a[k]) and math.isfinite(b[k]))
    return (
        blocks,
        np.array([a[k] for k in blocks], dtype=np.float64),
        np.array([b[k] for k in blocks], dtype=np.float64),
    )


def warm_start_test(
    blocks: Sequence[tuple[int, int]], differences: Sequence[float]
) -> tuple[dict[int, list[float]], BlockTest]:
    """(sft.seed -> its blocks' differences, the t-test over the per-warm-start means, k-1 df)."""
    per: dict[int, list[float]] = {}
    for (sft_seed, _), d in zip(blocks, differences):
        per.setdefault(sft_seed, []).append(float(d))
    return per, one_sample_t([float(np.mean(v)) for _, v in sorted(per.items())])


def variance_components(per: dict[int, list[float]]) -> tuple[float, float]:
    """(between-warm-start SD, within-warm-start SD) of the differences grouped by warm start (``per``:
    sft.seed -> differences): the one-way ANOVA (method of moments) estimates of a random-intercept
    model, ``s_w^2 = MSW`` and ``s_b^2 = max(0, (MSB - MSW) / n0)`` with
    ``n0 = (N - sum n_i^2 / N) / (k - 1)``; NaN where there are too few groups or values."""
    groups = [np.asarray(v, dtype=np.float64) for _, v in sorted(per.items())]
    k, total = len(groups), sum(len(g) for g in groups)
    if k == 0 or total - k < 1:
        within = math.nan
    else:
        within = float(sum(((g - g.mean()) ** 2).sum() for g in groups) / (total - k))
    if k < 2 or not math.isfinite(within):
        return math.nan, math.sqrt(within) if math.isfinite(within) else math.nan
    grand = float(np.concatenate(groups).mean())
    between = sum(len(g) * (g.mean() - grand) ** 2 for g in groups) / (k - 1)
    n0 = (total - sum(len(g) ** 2 for g in groups) / total) / (k - 1)
    return math.sqrt(max(0.0, (between - within) / n0)), math.sqrt(within)


def verdict(
    low_pp: float, high_pp: float, p_holm: float | None, direction: int, min_effect_pp: float, alpha: float
) -> str:
    """The decision rule: "reproduced" when the CI [low, high] (pp) excludes 0 in ``direction`` and
    ``p_holm < alpha``; "no effect >= m pp" when it lies inside (-m, +m); else "inconclusive"."""
    if not (math.isfinite(low_pp) and math.isfinite(high_pp)):
        return "inconclusive"
    if ci_side(low_pp, high_pp, direction) == "paper" and p_holm is not None and p_holm < alpha:
        return "reproduced"
    if -min_effect_pp < low_pp and high_pp < min_effect_pp:
        return f"no effect >= {min_effect_pp:g} pp"
    return "inconclusive"


def ci_side(low: float, high: float, direction: int) -> str:
    """Where the CI [low, high] lies against 0: "paper" (excludes 0 in ``direction``), "opposite"
    (excludes 0 the other way) or "includes 0"."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "includes 0"
    if low > 0 or high < 0:
        return "paper" if (low > 0) == (direction > 0) else "opposite"
    return "includes 0"


def _pp(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else 100.0 * value


def _pp_pair(test: BlockTest) -> list[float | None]:
    return [_pp(test.low), _pp(test.high)]


def evaluate_hypothesis(
    hypothesis: Hypothesis, treatment_runs: Sequence[Run], control_runs: Sequence[Run]
) -> dict[str, Any]:
    """The numbers of one hypothesis, from the runs of its treatment's and its control's summaries
    directories (the same one unless the study file names two), p_holm and verdict not yet set.

    Raises:
      ReportError: the treatment or control has no run, or the metric is in none of their runs.
    """
    by_role = {}
    for role, method, runs in (
        ("treatment", hypothesis.treatment, treatment_runs),
        ("control", hypothesis.control, control_runs),
    ):
        by_role[role] = [r for r in runs if r.method == method]
        if not by_role[role]:
            have = ", ".join(method_order([r.method for r in runs]))
            raise ReportError(
                f"{hypothesis.directory(role)}: no run of {role} {method!r} (hypothesis {hypothesis.name!r}; "
                f"has: {have})"
            )
    chosen = by_role["treatment"] + by_role["control"]
    present = {k for r in chosen for k in study_values(r)}
    if hypothesis.metric not in present:
        raise ReportError(
            f"{hypothesis.summaries}: hypothesis {hypothesis.name!r}: metric {hypothesis.metric!r} is not in the runs "
            f"(has: {', '.join(sorted(present))})"
        )
    blocks, a, b = paired_by_block(by_role["treatment"], by_role["control"], hypothesis.metric)
    test = one_sample_t(a - b)
    if len(blocks) >= 2 and test.sd > 0:  # the same test as scipy's paired one
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            test = dataclasses.replace(test, p=float(stats.ttest_rel(a, b).pvalue))
    per, ws = warm_start_test(blocks, list(a - b))
    sd_between, sd_within = variance_components(per)
    unpaired = sorted(r.label for r in chosen if r.block not in set(blocks))
    return {
        "name": hypothesis.name,
        "primary": hypothesis.primary,
        "summaries": hypothesis.given.get("summaries", str(hypothesis.summaries)),
        "treatment_summaries": hypothesis.given.get("treatment_summaries"),
        "control_summaries": hypothesis.given.get("control_summaries"),
        "treatment": hypothesis.treatment,
        "control": hypothesis.control,
        "metric": hypothesis.metric,
        "direction": hypothesis.direction,
        "min_effect_pp": hypothesis.min_effect_pp,
        "n_blocks": len(blocks),
        "n_warm_starts": len(per),
        "treatment_mean": float(a.mean()) if len(a) else None,
        "control_mean": float(b.mean()) if len(b) else None,
        "diff_pp": _pp(test.mean),
        "ci95_pp": _pp_pair(test),
        "sd_pp": _pp(test.sd),
        "p": test.p,
        "unpaired_runs": unpaired,
        "per_warm_start": [
            {"sft_seed": k, "n_blocks": len(v), "diff_pp": _pp(float(np.mean(v)))} for k, v in sorted(per.items())
        ],
        "warm_start_random_effect": {
            "method": "t over the per-warm-start mean differences, k-1 df (balanced random-intercept model)",
            "k": ws.n,
            "diff_pp": _pp(ws.mean),
            "ci95_pp": _pp_pair(ws),
            "p": ws.p,
            "sd_between_pp": _pp(sd_between),
            "sd_within_pp": _pp(sd_within),
        },
    }


def decide(results: list[dict[str, Any]], alpha: float) -> None:
    """Set p_holm (Holm over the primary hypotheses, and over the secondary ones apart), the
    random-effect test's p_holm, the verdict and ``ci_excludes_zero`` of each result, in place."""
    for primary in (True, False):
        family = [r for r in results if r["primary"] == primary]
        for r, p in zip(family, holm([r["p"] for r in family])):
            r["p_holm"] = p
        for r, p in zip(family, holm([r["warm_start_random_effect"]["p"] for r in family])):
            r["warm_start_random_effect"]["p_holm"] = p
    for r in results:
        low, high = (math.nan if v is None else v for v in r["ci95_pp"])
        r["ci_excludes_zero"] = {"paper": "in the paper's direction", "opposite": "in the opposite direction"}.get(
            ci_side(low, high, r["direction"]), "no"
        )
        r["verdict"] = verdict(low, high, r["p_holm"], r["direction"], r["min_effect_pp"], alpha)


# ----------------------------------------------------------------------------------------------
# The study report.
# ----------------------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str = "+.2f") -> str:
    return "n/a" if value is None else format(value, spec)


def verdict_line(r: dict[str, Any]) -> str:
    """``<name>: <verdict> (diff +x.xx pp, 95% CI [a, b], n_blocks n, p_holm p)``."""
    low, high = r["ci95_pp"]
    text = (
        f"{r['name']}: {r['verdict']} ({r['treatment']} - {r['control']} on {r['metric']}: {_fmt(r['diff_pp'])} pp, "
        f"95% CI [{_fmt(low)}, {_fmt(high)}], {r['n_blocks']} blocks, p_holm {_fmt(r['p_holm'], '.3g')})"
    )
    if r["ci_excludes_zero"] == "in the opposite direction":
        text += "; the CI excludes 0 in the opposite direction"
    return text


def secondary_rows(runs: Sequence[Run]) -> tuple[list[tuple[str, str]], list[tuple[str, int, dict[str, Estimate]]]]:
    """((key, label) of the secondary metrics: the test metrics, the training-reward AUCs, conflict
    ratio, kept fraction; per method (its name, blocks, key -> mean ± CI over blocks))."""
    columns = sweep_report.metric_columns(runs) + list(SECONDARY_LABELS)
    rows = []
    for method in method_order([r.method for r in runs]):
        values = [study_values(r) for r in runs if r.method == method]
        rows.append((method, len(values), {k: mean_ci([v.get(k, math.nan) for v in values]) for k, _ in columns}))
    return columns, rows


def _relative(path: pathlib.Path, base: pathlib.Path) -> str:
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return str(path)


def study_markdown(study: Study, results: Sequence[dict[str, Any]], runs_by_dir: dict[pathlib.Path, list[Run]]) -> str:
    """summary.md: the hypotheses' table and verdict lines, per warm start, then the secondary metrics."""
    lines = [
        f"# {study.title}",
        "",
        f"Paired by block (sft.seed, train.seed): treatment - control in percentage points, {CONFIDENCE:.0%} t "
        f"interval over blocks, two-sided paired t-test, Holm over the primary hypotheses (alpha {study.alpha:g}). "
        "Verdict: reproduced = CI excludes 0 in the paper's direction and p_holm < alpha; no effect >= m pp = CI "
        "inside (-m, +m); else inconclusive.",
        "",
        "| hypothesis | primary | treatment | control | metric | blocks | diff (pp) | 95% CI (pp) | p | p (Holm) "
        "| verdict |",
        "|" + "---|" * 11,
    ]
    for r in results:
        low, high = r["ci95_pp"]
        lines.append(
            "| "
            + " | ".join(
                [
                    r["name"],
                    "yes" if r["primary"] else "no",
                    r["treatment"],
                    r["control"],
                    r["metric"],
                    str(r["n_blocks"]),
                    _fmt(r["diff_pp"]),
                    f"[{_fmt(low)}, {_fmt(high)}]",
                    _fmt(r["p"], ".3g"),
                    _fmt(r["p_holm"], ".3g"),
                    r["verdict"],
                ]
            )
            + " |"
        )
    lines += ["", *[f"- {verdict_line(r)}" for r in results], ""]
    lines += [
        "## Per warm start",
        "",
        "Mean difference (pp) per sft.seed; the random-effect test: t over the per-warm-start means (k-1 df); "
        "SD of the differences between and within warm starts (one-way ANOVA estimates, pp).",
        "",
        "| hypothesis | per sft.seed: diff pp (blocks) | warm starts | diff (pp) | 95% CI (pp) | p | p (Holm) "
        "| SD between / within (pp) |",
        "|" + "---|" * 8,
    ]
    for r in results:
        ws = r["warm_start_random_effect"]
        per = ", ".join(f"{w['sft_seed']}: {_fmt(w['diff_pp'])} ({w['n_blocks']})" for w in r["per_warm_start"]) or "-"
        lines.append(
            f"| {r['name']} | {per} | {ws['k']} | {_fmt(ws['diff_pp'])} | [{_fmt(ws['ci95_pp'][0])}, "
            f"{_fmt(ws['ci95_pp'][1])}] | {_fmt(ws['p'], '.3g')} | {_fmt(ws['p_holm'], '.3g')} | "
            f"{_fmt(ws['sd_between_pp'], '.2f')} / {_fmt(ws['sd_within_pp'], '.2f')} |"
        )
    unpaired = [r for r in results if r["unpaired_runs"]]
    if unpaired:
        lines.append("")
        lines += [f"Left out of {r['name']} (no pair in its block): {', '.join(r['unpaired_runs'])}." for r in unpaired]
    for directory, runs in runs_by_dir.items():
        columns, rows = secondary_rows(runs)
        lines += [
            "",
            f"## Secondary metrics: {_relative(directory, study.file.parent)}",
            "",
            f"Mean ± {CONFIDENCE:.0%} CI over blocks; AUC: the mean over RL steps of the training reward, conflict "
            "ratio and kept fraction likewise.",
            "",
            "| method | blocks | " + " | ".join(label for _, label in columns) + " |",
            "|" + "---|" * (len(columns) + 2),
        ]
        for method, n, estimates in rows:
            cells = [sweep_report._format_estimate(estimates[k]) for k, _ in columns]
            lines.append(f"| {method} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def write_study(file: str | pathlib.Path, out_dir: str | pathlib.Path | None = None) -> dict[str, Any]:
    """Test the hypotheses of the study ``file`` on their summaries and write ``out_dir`` (default: the
    study file's directory) ``/summary.json`` (``hypotheses``: per hypothesis n_blocks, diff_pp,
    ci95_pp, p, p_holm, verdict, per_warm_start, warm_start_random_effect ...) and ``summary.md``.
    Returns ``json``, ``markdown`` (paths) and ``results``.

    Raises:
      ReportError: the study file, a summary, or a hypothesis that does not fit its summaries.
    """
    study = load_study(file)
    runs_by_dir: dict[pathlib.Path, list[Run]] = {}
    setting_of: dict[pathlib.Path, dict[str, Any]] = {}
    results = []
    for h in study.hypotheses:
        for role in ("treatment", "control"):
            directory = h.directory(role)
            if directory not in runs_by_dir:
                runs, settings = load_summaries([directory])
                runs_by_dir[directory], setting_of[directory] = runs, settings[0]
        treatment, control = h.directory("treatment"), h.directory("control")
        differ = sorted(
            k
            for k in set(setting_of[treatment]) | set(setting_of[control])
            if setting_of[treatment].get(k) != setting_of[control].get(k)
        )
        if differ:
            raise ReportError(
                f"{treatment}: hypothesis {h.name!r}: another setting than {control} ({', '.join(differ)} differ)"
            )
        results.append(evaluate_hypothesis(h, runs_by_dir[treatment], runs_by_dir[control]))
    decide(results, study.alpha)
    out = pathlib.Path(out_dir) if out_dir else study.file.parent
    out.mkdir(parents=True, exist_ok=True)
    record = {"title": study.title, "alpha": study.alpha, "confidence": CONFIDENCE, "hypotheses": results}
    json_path = out / "summary.json"
    run_dir.write_text(json_path, json.dumps(_json_safe(record), indent=1, sort_keys=True, allow_nan=False) + "\n")
    markdown = out / "summary.md"
    run_dir.write_text(markdown, study_markdown(study, results, runs_by_dir))
    return {"json": json_path, "markdown": markdown, "results": results}
