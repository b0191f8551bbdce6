"""gd2po_jax/experiments/sweep_report.py and report.py on a sweep directory written by hand with known numbers."""

from __future__ import annotations

import csv
import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from scipy import stats

from configs import default
from gd2po_jax.config import RunConfig
from gd2po_jax.experiments import sweep_report as report
from gd2po_jax.experiments.sweep_report import Paired, curve_area, mean_ci, method_order, paired_test
from gd2po_jax.runtime import run_dir
from tests.fakes import REPO, subprocess_env

REWARDS = ("correctness", "format", "length")
SEEDS = (0, 1, 2)
# (algorithm, snr_tau) -> test correct_acc per seed
CORRECT = {
    ("gdpo", None): [0.50, 0.55, 0.45],
    ("grpo", None): [0.40, 0.47, 0.33],
    ("gd2po_snr", 0.5): [0.60, 0.62, 0.61],
    ("gd2po_hard", None): [0.58],  # one seed only: no CI, no paired test
}
STEPS = 4


def _method(algorithm, tau):
    return algorithm if tau is None else f"{algorithm}-tau{tau:g}"


def _reward_curve(offset: float, seed: int, name_index: int) -> list[float]:
    """A known training curve: reward k at step s (1-based) of a run."""
    return [offset + 0.1 * name_index + 0.01 * seed + 0.05 * s for s in range(1, STEPS + 1)]


def _offset(algorithm: str) -> float:
    return {"gdpo": 0.0, "grpo": -0.2, "gd2po_snr": 0.3, "gd2po_hard": 0.1}[algorithm]


def write_run(sweep_dir: pathlib.Path, algorithm: str, tau: float | None, seed: int, correct: float,
              *, finished: bool = True, sft_seed: int = 0) -> pathlib.Path:
    workdir = sweep_dir / "runs" / _method(algorithm, tau) / f"seed{seed}"
    (workdir / "eval").mkdir(parents=True)
    config = default.get_config()
    config.rl.update(algorithm=algorithm, snr_tau=0.8 if tau is None else tau)
    config.train.seed = seed
    config.sft.seed = sft_seed
    run_dir.write_config(workdir, RunConfig.from_config_dict(config))
    curves = [_reward_curve(_offset(algorithm), seed, k) for k in range(len(REWARDS))]
    with (workdir / "metrics.jsonl").open("w") as file:
        for i in range(STEPS):
            record = {"step": i + 1, "advantages/conflict_ratio": 0.5 - 0.1 * i,
                      "advantages/kept_fraction": 0.5 + 0.1 * i}
            record.update({f"reward/{name}": curves[k][i] for k, name in enumerate(REWARDS)})
            file.write(json.dumps(record) + "\n")
    if finished:
        (workdir / "results.json").write_text(json.dumps({"algorithm": algorithm}))
        test = {"split": "test", "correct_acc": correct, "format_acc": 0.9 - 0.01 * seed, "length": 0.7 + 0.02 * seed}
        (workdir / "eval" / "test.json").write_text(json.dumps(test))
    return workdir


@pytest.fixture
def sweep_dir(tmp_path) -> pathlib.Path:
    for (algorithm, tau), values in CORRECT.items():
        for seed, value in zip(SEEDS, values):
            write_run(tmp_path, algorithm, tau, seed, value)
    write_run(tmp_path, "grpo", None, 3, 0.99, finished=False)  # interrupted: left out, listed
    return tmp_path


def read_csv(path: pathlib.Path) -> dict[tuple[str, str], dict[str, str]]:
    with path.open() as file:
        return {(row["method"], row["metric"]): row for row in csv.DictReader(file)}


def expected_ci(values) -> tuple[float, float]:
    """Mean and 95% CI half-width computed with scipy's own interval (not the module's formula)."""
    x = np.asarray(values)
    low, high = stats.t.interval(0.95, df=len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    return float(x.mean()), float((high - low) / 2)


def expected_paired_p(a, b) -> float:
    d = np.asarray(a) - np.asarray(b)
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    return float(2 * stats.t.sf(abs(t), len(d) - 1))


# ----------------------------------------------------------------------------------------------
# Statistics.
# ----------------------------------------------------------------------------------------------


def test_mean_ci_matches_the_t_interval():
    values = [0.1, 0.4, 0.35, 0.2]
    mean, half = expected_ci(values)
    e = mean_ci(values)
    assert e.n == 4 and e.mean == pytest.approx(mean) and e.half_width == pytest.approx(half)
    assert e.half_width == pytest.approx(3.182446 * np.std(values, ddof=1) / 2, rel=1e-6)  # t_{.975,3}


def test_mean_ci_skips_missing_values_and_has_no_interval_below_two():
    e = mean_ci([0.3, None, math.nan])
    assert (e.n, e.mean) == (1, 0.3) and math.isnan(e.half_width)
    assert mean_ci([]).n == 0


def test_paired_test_pairs_by_seed_only_on_common_seeds():
    a = {0: 0.5, 1: 0.7, 2: 0.6, 7: 100.0}  # seed 7 has no partner
    b = {0: 0.4, 1: 0.5, 2: 0.55, 9: -100.0}
    result = paired_test(a, b)
    assert result.n_pairs == 3
    assert result.p_value == pytest.approx(expected_paired_p([0.5, 0.7, 0.6], [0.4, 0.5, 0.55]))
    assert paired_test({0: 1.0, 1: 2.0}, {1: 0.0, 2: 0.0}) == Paired(1, None)  # one pair: n/a
    assert paired_test({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}).p_value == 1.0  # identical
    assert Paired(3, 0.01).significant and not Paired(3, 0.2).significant and Paired(1, None).significant is None


def test_curve_area_is_the_mean_over_logged_steps():
    records = [{"step": 1, "r": 0.0}, {"step": 2, "r": None}, {"step": 3, "r": 1.0}, {"step": 4}]
    assert curve_area(records, "r") == 0.5
    assert math.isnan(curve_area(records, "other"))


def test_method_order():
    methods = ["gd2po_snr-tau0.8", "x", "gdpo", "gd2po_snr-tau0.2", "gd2po_hard", "grpo"]
    assert method_order(methods) == ["grpo", "gdpo", "gd2po_hard", "gd2po_snr-tau0.2", "gd2po_snr-tau0.8", "x"]
    # The SNR halves (the paper's Table 6) follow GD2PO-SNR, the low-conflict half first.
    methods = ["high_conflict_half", "a", "low_conflict_half", "gdpo", "gd2po_snr-tau0.5"]
    assert method_order(methods) == ["gdpo", "gd2po_snr-tau0.5", "low_conflict_half", "high_conflict_half", "a"]


# ----------------------------------------------------------------------------------------------
# The report of a sweep directory.
# ----------------------------------------------------------------------------------------------


def test_report_tables_have_the_known_means_intervals_and_p_values(sweep_dir):
    written = report.write_report(sweep_dir)
    assert written["markdown"] == sweep_dir / "report" / "summary.md"
    rows = read_csv(written["csv"])
    methods = ["grpo", "gdpo", "gd2po_hard", "gd2po_snr-tau0.5"]
    assert list(dict.fromkeys(m for m, _ in rows)) == methods
    for (algorithm, tau), values in CORRECT.items():
        row = rows[(_method(algorithm, tau), "test/correct_acc")]
        assert int(row["n"]) == len(values)
        assert float(row["mean"]) == pytest.approx(np.mean(values))
        if len(values) > 1:
            assert float(row["ci95_half_width"]) == pytest.approx(expected_ci(values)[1])
        else:
            assert row["ci95_half_width"] == "n/a"
    # Curve areas: the mean of a known linear curve over 4 steps, averaged over seeds.
    gdpo_auc = rows[("gdpo", "auc/reward/format")]
    per_seed = [np.mean(_reward_curve(0.0, s, 1)) for s in SEEDS]
    assert float(gdpo_auc["mean"]) == pytest.approx(np.mean(per_seed))
    assert float(gdpo_auc["ci95_half_width"]) == pytest.approx(expected_ci(per_seed)[1])
    # Against GDPO, paired by seed.
    for method, key in [("grpo", ("grpo", None)), ("gd2po_snr-tau0.5", ("gd2po_snr", 0.5))]:
        row = rows[(method, "test/correct_acc")]
        p = expected_paired_p(CORRECT[key], CORRECT[("gdpo", None)])
        assert int(row["n_pairs_vs_gdpo"]) == 3
        assert float(row["p_value_vs_gdpo"]) == pytest.approx(p)
        assert row["significant_vs_gdpo"] == ("yes" if p < 0.05 else "no")
    # grpo - gdpo correct_acc is (-0.10, -0.08, -0.12): significant; snr - gdpo (0.10, 0.07, 0.16): not.
    assert rows[("grpo", "test/correct_acc")]["significant_vs_gdpo"] == "yes"
    assert rows[("gd2po_snr-tau0.5", "test/correct_acc")]["significant_vs_gdpo"] == "no"
    assert rows[("gd2po_hard", "test/correct_acc")]["p_value_vs_gdpo"] == "n/a"  # one pair
    assert rows[("gdpo", "test/correct_acc")]["p_value_vs_gdpo"] == "n/a"  # the baseline itself

    markdown = written["markdown"].read_text()
    mean, half = expected_ci(CORRECT[("gdpo", None)])
    assert f"| gdpo | 3 | {mean:.3f} ± {half:.3f} |" in markdown
    assert "| gd2po_hard | 1 | 0.580 |" in markdown
    p_grpo = expected_paired_p(CORRECT[("grpo", None)], CORRECT[("gdpo", None)])
    assert f"| grpo | 3 | {p_grpo:.3g} (p<0.05) |" in markdown
    assert "| gd2po_hard | 1 | n/a |" in markdown
    assert "`grpo/seed3`" in markdown  # the unfinished run is named, not counted
    assert "AUC correctness" in markdown and "AUC length" in markdown


def test_report_plots_are_small_valid_pngs(sweep_dir):
    written = report.write_report(sweep_dir)
    names = [p.name for p in written["plots"]]
    assert names == ["learning_curves.png", "diagnostics.png", "tau.png"]
    for path in written["plots"]:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            width, height = image.size
        assert width <= 1300 and height <= 400, (path.name, image.size)
    with Image.open(written["plots"][0]) as image:
        assert image.size == (1200, 320)  # 3 rewards x 4 in, 3.2 in, 100 dpi


def test_tau_points_place_gdpo_at_zero_and_hard_at_one(sweep_dir):
    runs, _ = report.find_runs(sweep_dir)
    points = report.tau_points(report.summarize(runs))
    assert [t for t, _ in points["snr"]] == [0.5]
    assert points["gdpo"][0][0] == 0.0 and points["gd2po_hard"][0][0] == 1.0
    assert points["gd2po_hard"][0][1].mean == pytest.approx(0.58)


def test_no_tau_plot_without_gd2po_snr_and_no_comparison_without_gdpo(tmp_path):
    for seed, value in zip(SEEDS, CORRECT[("grpo", None)]):
        write_run(tmp_path, "grpo", None, seed, value)
    written = report.write_report(tmp_path)
    assert [p.name for p in written["plots"]] == ["learning_curves.png", "diagnostics.png"]
    assert "No comparison" in written["markdown"].read_text()


def test_a_sweep_without_finished_runs_is_an_error_naming_the_directory(tmp_path):
    write_run(tmp_path, "gdpo", None, 0, 0.5, finished=False)
    with pytest.raises(report.ReportError, match=r"runs: no finished run"):
        report.write_report(tmp_path)


def test_a_broken_file_is_named(sweep_dir):
    bad = sweep_dir / "runs" / "gdpo" / "seed1" / "eval" / "test.json"
    bad.write_text("{not json")
    with pytest.raises(report.ReportError, match=str(bad)):
        report.write_report(sweep_dir)
    bad.write_text("{}")
    config = sweep_dir / "runs" / "gdpo" / "seed1" / "config.json"
    values = json.loads(config.read_text())
    values["rl"]["algorithm"] = "ppo"
    config.write_text(json.dumps(values))
    with pytest.raises(report.ReportError, match=rf"{config}: config\.rl\.algorithm"):
        report.write_report(sweep_dir)


def test_report_command_imports_no_jax(sweep_dir, tmp_path):
    """``python report.py`` (statistics over finished runs) neither needs nor loads JAX, Flax or a task."""
    out = tmp_path / "elsewhere"
    argv = [str(REPO / "report.py"), f"--sweep_dir={sweep_dir}", f"--out_dir={out}"]
    code = ("import atexit, runpy, sys\n"
            "atexit.register(lambda: print('loaded:', sorted(m for m in ('jax', 'flax', 'optax', 'gd2po_jax.tasks') "
            "if m in sys.modules)))\n"
            f"sys.argv = {argv!r}\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| gdpo | 3 |" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "loaded: []"
    assert sorted(p.name for p in out.iterdir()) == ["diagnostics.png", "learning_curves.png", "summary.csv",
                                                      "summary.md", "tau.png"]


def test_a_safety_sweep_reports_ground_truth_rates_and_reward_model_scores(tmp_path):
    """Runs of the embedded helpfulness-safety task are reported by its own test metrics (the
    ground-truth rates per request kind, the reward models' means), not by tool-calling ones: the
    task names them, sweep.py records them in sweep.json, the report reads them there."""
    from configs import safety_embedded
    from gd2po_jax.tasks import task_of

    harmful_rate = {"gdpo": (0.40, 0.50), "gd2po_hard": (0.30, 0.32)}
    for method, rates in harmful_rate.items():
        for seed, rate in enumerate(rates):
            workdir = tmp_path / "runs" / method / f"seed{seed}"
            (workdir / "eval").mkdir(parents=True)
            config = safety_embedded.get_config()
            config.rl.algorithm, config.train.seed = method, seed
            run_dir.write_config(workdir, RunConfig.from_config_dict(config))
            records = [{"step": s, "reward/useful": 1.0 + s, "reward/harmless": rate, "advantages/conflict_ratio": 0.8,
                        "advantages/kept_fraction": 0.3} for s in (1, 2)]
            (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
            (workdir / "results.json").write_text(json.dumps({"algorithm": method}))
            test = {"split": "test", "gt/harmful/level_1": rate, "gt/redirect/level_1": 1 - rate,
                    "gt/helpful/level_0": 0.6, "gt/refusal/level_0": 0.1 * seed, "useful": 2.0, "harmless": -rate}
            (workdir / "eval" / "test.json").write_text(json.dumps(test))
    typed = RunConfig.from_config_dict(safety_embedded.get_config())
    # Without sweep.json's record (an older sweep): each reward model's mean and their sum.
    header = next(line for line in report.write_report(tmp_path)["markdown"].read_text().splitlines()
                  if line.startswith("| method | seeds |"))
    assert header == "| method | seeds | useful | harmless | sum | AUC useful | AUC harmless |"
    run_dir.write_json(tmp_path / "sweep.json", {"test_metrics": task_of(typed).test_metrics(typed)})
    paths = report.write_report(tmp_path)
    markdown = paths["markdown"].read_text()
    header = next(line for line in markdown.splitlines() if line.startswith("| method | seeds |"))
    assert header == ("| method | seeds | harmful (harmful req.) | redirect (harmful req.) | helpful (benign req.) | "
                      "refusal (benign req.) | useful | harmless | AUC useful | AUC harmless |")
    rows = read_csv(paths["csv"])
    assert float(rows[("gdpo", "test/gt/harmful/level_1")]["mean"]) == pytest.approx(0.45)
    assert float(rows[("gd2po_hard", "test/harmless")]["mean"]) == pytest.approx(-0.31)
    assert float(rows[("gd2po_hard", "auc/reward/useful")]["mean"]) == pytest.approx(2.5)
    assert rows[("gd2po_hard", "test/gt/helpful/level_0")]["p_value_vs_gdpo"] == "1.0"  # equal on every seed
    assert ("gdpo", "test/correct_acc") not in rows


# ----------------------------------------------------------------------------------------------
# A sweep of a task of your own: TRL-form reward functions, no built-in family, no targets.
# ----------------------------------------------------------------------------------------------

OWN_REWARDS = ("brevity", "digits")
OWN_TAUS = (0.3, 0.7)
# tau -> per seed: test brevity, test digits
OWN_TEST = {0.3: [(0.20, 0.50), (0.30, 0.60), (0.25, 0.55)], 0.7: [(0.60, 0.52), (0.70, 0.61), (0.65, 0.56)]}


def write_own_run(sweep_dir: pathlib.Path, tau: float, seed: int, test_values: tuple[float, float]) -> pathlib.Path:
    """A finished gd2po_snr run of configs/files.py with two TRL-form functions (config.rewards.names empty):
    metrics.jsonl as train.py writes it (reward/<name>, reward_failed/<name>, the pair conflict), eval/test.json
    scored by the functions (reward_names)."""
    from configs import files

    workdir = sweep_dir / "runs" / f"gd2po_snr-tau{tau:g}" / f"seed{seed}"
    (workdir / "eval").mkdir(parents=True)
    config = files.get_config()
    config.model.path, config.data.train, config.data.test = "tiny_model", "prompts.jsonl", "test.jsonl"
    config.rewards.functions = tuple(f"rewards:{name}" for name in OWN_REWARDS)
    config.sft.enabled = False
    config.rl.update(algorithm="gd2po_snr", snr_tau=tau)
    config.train.seed = seed
    run_dir.write_config(workdir, RunConfig.from_config_dict(config))
    records = []
    for step in range(1, STEPS + 1):
        record = {"step": step, "advantages/conflict_ratio": 0.4, "advantages/kept_fraction": 0.6,
                  "advantages/conflict/brevity~digits": 0.1 * step + 0.01 * seed}
        for k, name in enumerate(OWN_REWARDS):
            record[f"reward/{name}"] = tau * (k + 1) * step / STEPS + 0.01 * seed
            record[f"reward_failed/{name}"] = 0.0
        records.append(record)
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (workdir / "results.json").write_text(json.dumps({"algorithm": "gd2po_snr", "split": None, "before_rl": None,
                                                      "after_rl": None}))
    brevity, digits = test_values
    test = {"split": "test", "brevity": brevity, "digits": digits, "reward_sum": brevity + digits,
            "reward_names": list(OWN_REWARDS)}
    (workdir / "eval" / "test.json").write_text(json.dumps(test))
    return workdir


@pytest.fixture
def own_sweep(tmp_path) -> pathlib.Path:
    for tau, values in OWN_TEST.items():
        for seed, test_values in enumerate(values):
            write_own_run(tmp_path, tau, seed, test_values)
    return tmp_path


def test_a_sweep_of_your_own_reward_functions_reports_their_curves_auc_and_which_tau(own_sweep):
    """config.rewards.names is empty (the rewards are rewards.functions): the report takes the reward
    columns from each run's metrics.jsonl, writes every PNG, has an AUC column per reward and the test
    metrics eval.py scored with the functions, and answers which tau per metric (Holm over the pairs)."""
    written = report.write_report(own_sweep)
    assert [p.name for p in written["plots"]] == ["learning_curves.png", "diagnostics.png", "conflicts.png",
                                                  "tau.png"]
    for path in written["plots"]:
        with Image.open(path) as image:
            image.verify()
    markdown = written["markdown"].read_text()
    header = next(line for line in markdown.splitlines() if line.startswith("| method | seeds |"))
    assert header == "| method | seeds | brevity | digits | sum | AUC brevity | AUC digits |"
    rows = read_csv(written["csv"])
    per_seed = [np.mean([0.3 * 2 * s / STEPS + 0.01 * seed for s in range(1, STEPS + 1)]) for seed in range(3)]
    assert float(rows[("gd2po_snr-tau0.3", "auc/reward/digits")]["mean"]) == pytest.approx(np.mean(per_seed))
    # Which tau: brevity is clearly better at 0.7, digits hardly differs.
    assert "## Which tau" in markdown
    brevity = next(line for line in markdown.splitlines() if line.startswith("| brevity | "))
    mean, half = expected_ci([v[0] for v in OWN_TEST[0.7]])
    assert f"**{mean:.3f} ± {half:.3f}** (best)" in brevity and brevity.endswith(f"| 0.7: {mean:.3f} ± {half:.3f} |")
    with written["tau_csv"].open() as file:
        tests = {row["metric"]: row for row in csv.DictReader(file)}
    p = expected_paired_p([v[0] for v in OWN_TEST[0.3]], [v[0] for v in OWN_TEST[0.7]])
    assert float(tests["test/brevity"]["p_value"]) == pytest.approx(p)
    assert float(tests["test/brevity"]["p_holm"]) == pytest.approx(p)  # one pair per metric: Holm leaves it
    assert tests["test/brevity"]["best_tau"] == "0.7"
    # Three seeds per tau: the warning names both cells.
    assert "**Warning: fewer than 5 seeds** for gd2po_snr-tau0.3 (3), gd2po_snr-tau0.7 (3)" in markdown


def test_holm_adjusts_a_family_in_step_down_order():
    assert report.holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None], nan_ok=True)
    assert report.holm([0.5, 0.6]) == [1.0, 1.0]
    assert report.holm([]) == []


def test_three_taus_are_compared_pairwise_with_holm(tmp_path):
    values = {0.2: [0.1, 0.2, 0.15, 0.12, 0.18], 0.5: [0.3, 0.45, 0.32, 0.36, 0.41], 0.8: [0.31, 0.4, 0.3, 0.37, 0.4]}
    for tau, per_seed in values.items():
        for seed, value in enumerate(per_seed):
            write_run(tmp_path, "gd2po_snr", tau, seed, value)
    runs, _ = report.find_runs(tmp_path)
    correct = report.compare_taus(runs, [("test/correct_acc", "Correct Acc")])[0]
    assert [(p.a, p.b) for p in correct.pairs] == [(0.2, 0.5), (0.2, 0.8), (0.5, 0.8)]
    raw = [expected_paired_p(values[p.a], values[p.b]) for p in correct.pairs]
    assert [p.paired.p_value for p in correct.pairs] == pytest.approx(raw)
    order = np.argsort(raw)
    expected = np.maximum.accumulate(np.minimum(1.0, (3 - np.arange(3)) * np.asarray(raw)[order]))
    assert np.asarray([p.p_holm for p in correct.pairs])[order] == pytest.approx(expected)
    assert correct.best == 0.5
    markdown = report.write_report(tmp_path)["markdown"].read_text()
    assert "fewer than 5 seeds" not in markdown  # five seeds each


def test_bands_are_clipped_to_the_metric_range():
    assert report.metric_range("advantages/kept_fraction", [0.2, 0.3]) == (0.0, 1.0)
    assert report.metric_range("advantages/conflict/a~b", []) == (0.0, 1.0)
    assert report.metric_range("test/format_acc", [2.0]) == (0.0, 1.0)
    assert report.metric_range("reward/brevity", [0.5, -1.0, math.nan, 2.0]) == (-1.0, 2.0)
    assert report.metric_range("reward/x", []) == (-math.inf, math.inf)


def test_the_report_command_of_an_own_task_sweep(own_sweep, tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "report.py"), f"--sweep_dir={own_sweep}"],
                          env=subprocess_env(), capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "AUC brevity" in proc.stdout and "## Which tau" in proc.stdout
    assert (own_sweep / "report" / "learning_curves.png").is_file()


# ----------------------------------------------------------------------------------------------
# Several sweeps: blocks of warm starts.
# ----------------------------------------------------------------------------------------------
# (sft.seed, train.seed) -> test correct_acc of (gdpo, gd2po_hard); the warm start moves both.
BLOCKS = {(k, j): (0.40 + 0.05 * k + 0.01 * j, 0.42 + 0.05 * k + 0.01 * j + 0.007 * ((j + 2 * k) % 3))
          for k in (0, 1) for j in (0, 1, 2)}


def write_warm_start_sweeps(root: pathlib.Path) -> list[pathlib.Path]:
    """Two sweeps (sft.seed 0 and 1) of gdpo and gd2po_hard over seeds 0..2 with `BLOCKS`' numbers."""
    dirs = []
    for k in (0, 1):
        sweep = root / f"ws{k}"
        for j in (0, 1, 2):
            control, treatment = BLOCKS[(k, j)]
            write_run(sweep, "gdpo", None, j, control, sft_seed=k)
            write_run(sweep, "gd2po_hard", None, j, treatment, sft_seed=k)
        dirs.append(sweep)
    return dirs


def test_several_sweeps_pair_methods_by_block(tmp_path):
    dirs = write_warm_start_sweeps(tmp_path)
    out = tmp_path / "report"
    written = report.write_report(",".join(map(str, dirs)), out)
    rows = read_csv(written["csv"])
    control = [BLOCKS[b][0] for b in sorted(BLOCKS)]
    treatment = [BLOCKS[b][1] for b in sorted(BLOCKS)]
    row = rows[("gd2po_hard", "test/correct_acc")]
    assert int(row["n"]) == 6 and int(row["n_pairs_vs_gdpo"]) == 6
    assert float(row["mean"]) == pytest.approx(np.mean(treatment))
    assert float(row["p_value_vs_gdpo"]) == pytest.approx(stats.ttest_rel(treatment, control).pvalue)
    markdown = written["markdown"].read_text()
    assert "Runs of 2 warm starts (sft.seed 0, 1)" in markdown and "| gdpo | 6 |" in markdown
    assert "Sweep report: ws0, ws1" in markdown
    # Seed j of one warm start is another block than seed j of the other: pairing by train.seed alone
    # (3 pairs) would give another p-value.
    assert float(row["p_value_vs_gdpo"]) != pytest.approx(stats.ttest_rel(treatment[:3], control[:3]).pvalue)


def test_several_sweeps_need_an_out_dir_and_distinct_blocks(tmp_path):
    dirs = write_warm_start_sweeps(tmp_path)
    with pytest.raises(report.ReportError, match=r"--out_dir: required"):
        report.write_report([dirs[0], dirs[1]])
    with pytest.raises(report.ReportError, match=r"ws0/runs/gd2po_hard/seed0: a second gd2po_hard run of sft\.seed 0"):
        report.write_report([dirs[0], dirs[0]], tmp_path / "out")
    with pytest.raises(report.ReportError, match=r"--sweep_dir: give a sweep directory"):
        report.write_report(" , ", tmp_path / "out")
