"""gd2po_jax/experiments/study.py and report.py's --export_summaries, --summaries and --study, on sweeps
and summaries written by hand with known numbers."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from gd2po_jax.experiments import study
from gd2po_jax.experiments import sweep_report as report
from tests.experiments.test_sweep_report import BLOCKS, STEPS, _reward_curve, read_csv, write_warm_start_sweeps
from tests.fakes import REPO, subprocess_env

# ----------------------------------------------------------------------------------------------
# Run summaries.
# ----------------------------------------------------------------------------------------------


def test_export_writes_one_small_stable_summary_per_finished_run(tmp_path):
    dirs = write_warm_start_sweeps(tmp_path / "sweeps")
    out = tmp_path / "summaries"
    done = study.export_summaries(dirs, out)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.json"))
    assert files == sorted(f"{m}/sft{k}-seed{j}.json" for m in ("gdpo", "gd2po_hard") for k in (0, 1) for j in (0, 1, 2))
    assert len(done["written"]) == 12 and done["unchanged"] == []
    text = (out / "gd2po_hard" / "sft1-seed2.json").read_text()
    assert len(text) < 4096 and str(tmp_path) not in text
    summary = json.loads(text)
    assert list(summary) == sorted(summary)  # sorted keys: stable under git
    assert summary["run"] == "ws1/runs/gd2po_hard/seed2"
    assert (summary["method"], summary["sft_seed"], summary["train_seed"]) == ("gd2po_hard", 1, 2)
    assert summary["test"]["correct_acc"] == BLOCKS[(1, 2)][1]
    assert summary["test"]["format_acc"] == pytest.approx(0.88)
    # The training AUC: the mean of the known linear curve; conflict ratio 0.5 - 0.1 i, kept 0.5 + 0.1 i.
    assert summary["curves"]["reward/length"] == pytest.approx(np.mean(_reward_curve(0.1, 2, 2)))
    assert summary["curves"]["advantages/conflict_ratio"] == pytest.approx(np.mean([0.5 - 0.1 * i for i in range(STEPS)]))
    assert summary["curves"]["advantages/kept_fraction"] == pytest.approx(0.65)
    assert summary["logged_steps"] == STEPS
    assert summary["rl"]["algorithm"] == "gd2po_hard" and summary["rl"]["query_reweighting"] is True
    assert summary["setting"]["rewards.names"] == ["correctness", "format", "length"]
    assert summary["setting"]["rewards.conditional_length"] is True
    assert summary["setting"]["data.synthetic"]["num_test"] == 256 and summary["setting"]["train.num_steps"] == 40

    again = study.export_summaries(dirs, out)  # the same runs: nothing rewritten
    assert again["written"] == [] and len(again["unchanged"]) == 12


def test_export_refuses_a_different_run_at_a_summary_and_writes_nothing(tmp_path):
    dirs = write_warm_start_sweeps(tmp_path / "sweeps")
    out = tmp_path / "summaries"
    study.export_summaries(dirs[:1], out)
    before = {p: p.read_text() for p in out.rglob("*.json")}
    test = dirs[0] / "runs" / "gdpo" / "seed1" / "eval" / "test.json"
    test.write_text(json.dumps({**json.loads(test.read_text()), "correct_acc": 0.01}))
    with pytest.raises(report.ReportError, match=r"gdpo/sft0-seed1\.json: holds another run \(ws0/runs/gdpo/seed1\).* differ in test;"):
        study.export_summaries(dirs, out)
    assert {p: p.read_text() for p in out.rglob("*.json")} == before
    assert not (out / "gdpo" / "sft1-seed0.json").exists()  # nothing of the second sweep either
    # A variant of the method (GD2PO-Hard without reweighting) is another run too.
    test.write_text(json.dumps({**json.loads(test.read_text()), "correct_acc": BLOCKS[(0, 1)][0]}))
    config = dirs[0] / "runs" / "gd2po_hard" / "seed0" / "config.json"
    values = json.loads(config.read_text())
    values["rl"]["query_reweighting"] = False
    config.write_text(json.dumps(values))
    with pytest.raises(report.ReportError, match=r"gd2po_hard/sft0-seed0\.json: holds another run .* differ in rl;"):
        study.export_summaries(dirs, out)


def test_the_report_of_the_summaries_equals_the_report_of_the_sweeps(tmp_path):
    dirs = write_warm_start_sweeps(tmp_path / "sweeps")
    study.export_summaries(dirs, tmp_path / "summaries")
    from_sweeps = report.write_report(dirs, tmp_path / "a")
    runs, _ = study.load_summaries([tmp_path / "summaries"])
    from_summaries = report.write_runs_report(runs, tmp_path / "b", title="from summaries")
    assert read_csv(from_summaries["csv"]) == read_csv(from_sweeps["csv"])
    assert [p.name for p in from_summaries["plots"]] == []  # no curves in a summary


def write_summary(directory: pathlib.Path, method: str, sft_seed: int, seed: int, correct: float, **setting) -> None:
    """A run summary as export_summaries writes it, with test correct_acc ``correct``."""
    algorithm, tau = report.parse_method(method)
    summary = {
        "summary_version": study.SUMMARY_VERSION,
        "run": f"ws{sft_seed}/runs/{method}/seed{seed}",
        "method": method,
        "algorithm": algorithm,
        "snr_tau": tau,
        "sft_seed": sft_seed,
        "train_seed": seed,
        "reward_names": ["correctness", "length"],
        "test_columns": [list(c) for c in report.TEST_METRICS],
        "test": {"correct_acc": correct, "format_acc": 0.9, "length": 0.5 + 0.01 * seed},
        "curves": {"reward/correctness": correct / 2, "reward/length": 0.3, "advantages/conflict_ratio": 0.2,
                   "advantages/kept_fraction": 0.8 + 0.01 * sft_seed},
        "logged_steps": 40,
        "setting": {"rewards.names": ["correctness", "length"], "rewards.conditional_length": False, **setting},
        "rl": {"algorithm": algorithm, "snr_tau": 0.8 if tau is None else tau, "query_reweighting": True},
    }
    path = study.summary_path(directory, method, sft_seed, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(study.summary_text(summary))


def test_summaries_that_do_not_fit_are_named(tmp_path):
    out = tmp_path / "s"
    with pytest.raises(report.ReportError, match=rf"{out}: no run summary"):
        study.load_summaries([out])
    write_summary(out, "gdpo", 0, 0, 0.5)
    write_summary(out, "gdpo", 0, 1, 0.5, **{"rewards.conditional_length": True})
    with pytest.raises(report.ReportError, match=r"sft0-seed1\.json: another setting than .*rewards\.conditional_length"):
        study.load_summaries([out])
    moved = out / "gdpo" / "sft0-seed1.json"
    moved.rename(out / "gdpo" / "sft0-seed7.json")
    with pytest.raises(report.ReportError, match=r"sft0-seed7\.json: holds gdpo sft\.seed 0 seed 1: expected at"):
        study.load_summaries([out])
    broken = json.loads((out / "gdpo" / "sft0-seed7.json").read_text())
    del broken["curves"]
    (out / "gdpo" / "sft0-seed7.json").write_text(json.dumps(broken))
    with pytest.raises(report.ReportError, match=r"sft0-seed7\.json: missing field\(s\) curves"):
        study.load_summaries([out])


# ----------------------------------------------------------------------------------------------
# Hypotheses.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "low, high, p_holm, direction, expected",
    [
        (0.5, 3.0, 0.01, 1, "reproduced"),
        (0.5, 3.0, 0.2, 1, "inconclusive"),  # the CI excludes 0 but Holm does not reject
        (-3.0, -0.5, 0.01, -1, "reproduced"),
        (-3.0, -0.5, 0.01, 1, "inconclusive"),  # the opposite direction
        (-0.9, 0.8, 0.5, 1, "no effect >= 1 pp"),
        (-1.2, 0.8, 0.5, 1, "inconclusive"),
        (math.nan, math.nan, None, 1, "inconclusive"),
    ],
)
def test_the_decision_rule(low, high, p_holm, direction, expected):
    assert study.verdict(low, high, p_holm, direction, 1.0, 0.05) == expected


def test_one_sample_t_matches_scipy():
    d = [0.03, 0.01, 0.04, -0.005, 0.02]
    test = study.one_sample_t(d)
    low, high = stats.t.interval(0.95, df=4, loc=np.mean(d), scale=stats.sem(d))
    assert (test.low, test.high) == pytest.approx((low, high))
    assert test.p == pytest.approx(stats.ttest_1samp(d, 0).pvalue)
    assert study.one_sample_t([0.01] * 3).p == 0.0 and study.one_sample_t([0.0] * 3).p == 1.0
    assert study.one_sample_t([0.01]).p is None


def test_variance_components_of_the_warm_starts():
    # No spread within: the between SD is the SD of the warm starts' means.
    assert study.variance_components({0: [1.0] * 3, 1: [3.0] * 3}) == pytest.approx((math.sqrt(2), 0.0))
    # Equal means: no spread between (truncated at 0), the within SD pooled.
    assert study.variance_components({0: [1.0, 3.0], 1: [3.0, 1.0]}) == pytest.approx((0.0, math.sqrt(2)))
    # Balanced: s_b^2 + s_w^2 / n is the variance of the warm starts' means (when s_b^2 is not truncated).
    rng = np.random.default_rng(0)
    per = {k: list(rng.normal(0.5 * k, 0.3, size=5)) for k in range(4)}
    between, within = study.variance_components(per)
    assert between > 0
    assert between**2 + within**2 / 5 == pytest.approx(np.var([np.mean(v) for v in per.values()], ddof=1))
    assert within**2 == pytest.approx(np.mean([np.var(v, ddof=1) for v in per.values()]))
    assert math.isnan(study.variance_components({0: [1.0, 2.0]})[0])


def _noise(k: int, j: int) -> float:
    return 0.004 * ((3 * j + k) % 5 - 2) + 0.0015 * (k - 1.5)  # the warm starts' means differ


def write_study_summaries(root: pathlib.Path) -> dict[str, dict[tuple[int, int], float]]:
    """Two settings' summaries, 4 warm starts x 5 seeds; returns hypothesis -> block -> difference."""
    diffs: dict[str, dict[tuple[int, int], float]] = {"hard": {}, "snr": {}, "grpo": {}}
    for k in range(4):
        for j in range(5):
            control = 0.40 + 0.02 * k + 0.01 * j
            write_summary(root / "two", "gdpo", k, j, control)
            if (k, j) != (3, 4):  # one run missing: its block is left out
                hard = control + 0.03 + _noise(k, j)
                write_summary(root / "two", "gd2po_hard", k, j, hard)
                diffs["hard"][(k, j)] = hard - control
            snr = control + 0.5 * _noise(k, j)
            write_summary(root / "three", "gdpo", k, j, control)
            write_summary(root / "three", "gd2po_snr-tau0.5", k, j, snr)
            diffs["snr"][(k, j)] = snr - control
            grpo = control - 0.03 + _noise(k, (j + 1) % 5)
            write_summary(root / "three", "grpo", k, j, grpo)
            diffs["grpo"][(k, j)] = grpo - control
    return diffs


def write_study_file(root: pathlib.Path, **extra) -> pathlib.Path:
    hypotheses = [
        {"name": "hard", "summaries": "two", "treatment": "gd2po_hard", "control": "gdpo",
         "metric": "test/correct_acc", "direction": 1, "min_effect_pp": 1},
        {"name": "snr", "summaries": "three", "treatment": "gd2po_snr-tau0.5", "control": "gdpo",
         "metric": "test/correct_acc", "direction": 1},
        {"name": "grpo", "summaries": "three", "treatment": "grpo", "control": "gdpo",
         "metric": "test/correct_acc", "direction": 1, **extra},
    ]
    file = root / "study.json"
    file.write_text(json.dumps({"title": "Study v2 (test)", "hypotheses": hypotheses}))
    return file


def test_a_study_tests_each_hypothesis_by_block_with_holm_and_the_rule(tmp_path):
    diffs = write_study_summaries(tmp_path)
    written = study.write_study(write_study_file(tmp_path), tmp_path / "out")
    record = json.loads((tmp_path / "out" / "summary.json").read_text())
    results = {r["name"]: r for r in record["hypotheses"]}
    p_raw = {}
    for name, by_block in diffs.items():
        r = results[name]
        blocks = sorted(by_block)
        d = np.array([by_block[b] for b in blocks])
        assert r["n_blocks"] == len(blocks) == (19 if name == "hard" else 20)
        assert r["diff_pp"] == pytest.approx(100 * d.mean())
        low, high = stats.t.interval(0.95, df=len(d) - 1, loc=d.mean(), scale=stats.sem(d))
        assert r["ci95_pp"] == pytest.approx([100 * low, 100 * high])
        treatment = [study.read_summary(study.summary_path(tmp_path / ("two" if name == "hard" else "three"),
                                                           r["treatment"], *b)).test["correct_acc"] for b in blocks]
        control = np.array(treatment) - d
        p_raw[name] = stats.ttest_rel(treatment, control).pvalue
        assert r["p"] == pytest.approx(p_raw[name])
        # Per warm start and the random-effect test over the 4 warm-start means (3 df).
        means = [np.mean([by_block[b] for b in blocks if b[0] == k]) for k in range(4)]
        assert [w["diff_pp"] for w in r["per_warm_start"]] == pytest.approx([100 * m for m in means])
        assert [w["n_blocks"] for w in r["per_warm_start"]] == ([5, 5, 5, 4] if name == "hard" else [5] * 4)
        ws = r["warm_start_random_effect"]
        assert ws["k"] == 4 and ws["p"] == pytest.approx(stats.ttest_1samp(means, 0).pvalue)
        ws_low, ws_high = stats.t.interval(0.95, df=3, loc=np.mean(means), scale=stats.sem(means))
        assert ws["ci95_pp"] == pytest.approx([100 * ws_low, 100 * ws_high])
        per = {k: [by_block[b] for b in blocks if b[0] == k] for k in range(4)}
        assert [ws["sd_between_pp"], ws["sd_within_pp"]] == pytest.approx([100 * v for v in study.variance_components(per)])
    # Holm over the three primary hypotheses, by hand.
    order = sorted(p_raw, key=p_raw.get)
    expected, running = {}, 0.0
    for rank, name in enumerate(order):
        running = max(running, min(1.0, (3 - rank) * p_raw[name]))
        expected[name] = running
    for name in p_raw:
        assert results[name]["p_holm"] == pytest.approx(expected[name])
    assert results["hard"]["verdict"] == "reproduced"
    assert results["hard"]["unpaired_runs"] == ["gdpo/sft3-seed4"]
    assert results["snr"]["verdict"] == "no effect >= 1 pp"
    assert results["grpo"]["verdict"] == "inconclusive"
    assert results["grpo"]["ci_excludes_zero"] == "in the opposite direction"
    markdown = written["markdown"].read_text()
    assert markdown.startswith("# Study v2 (test)")
    assert study.verdict_line(results["hard"]) in markdown
    assert "the CI excludes 0 in the opposite direction" in study.verdict_line(results["grpo"])
    assert "## Secondary metrics: two" in markdown and "## Secondary metrics: three" in markdown
    three = markdown.split("## Secondary metrics: three")[1].splitlines()
    header = next(line for line in three if line.startswith("| method | blocks |"))
    assert header.endswith("| AUC correctness | AUC length | conflict ratio | kept fraction |")
    row = next(line for line in three if line.startswith("| gdpo | 20 |"))
    kept = [0.80 + 0.01 * k for k in range(4) for _ in range(5)]  # the kept fraction of gdpo's 20 blocks
    low, high = stats.t.interval(0.95, df=19, loc=np.mean(kept), scale=stats.sem(kept))
    assert row.endswith(f"| {np.mean(kept):.3f} ± {(high - low) / 2:.3f} |")


def test_a_secondary_hypothesis_is_left_out_of_the_primary_family(tmp_path):
    write_study_summaries(tmp_path)
    results = {r["name"]: r for r in study.write_study(write_study_file(tmp_path, primary=False), tmp_path)["results"]}
    p = sorted([results["hard"]["p"], results["snr"]["p"]])
    assert sorted([results["hard"]["p_holm"], results["snr"]["p_holm"]]) == pytest.approx([2 * p[0], max(2 * p[0], p[1])])
    assert results["grpo"]["p_holm"] == pytest.approx(results["grpo"]["p"])  # a family of one
    assert (tmp_path / "summary.json").is_file()  # default out_dir: the study file's


@pytest.mark.parametrize(
    "change, message",
    [
        ({"direction": 2}, r"study\.json: hypotheses\[2\]\.direction: expected \+1"),
        ({"metric": "test/accuracy"}, r"three: hypothesis 'grpo': metric 'test/accuracy' is not in the runs"),
        ({"treatment": "gd2po_hard"}, r"three: no run of treatment 'gd2po_hard'"),
        ({"typo": 1}, r"hypotheses\[2\]: unknown field\(s\) typo"),
        ({"min_effect_pp": -1}, r"hypotheses\[2\]\.min_effect_pp: expected a positive"),
        ({"summaries": "missing"}, r"missing: no run summary"),
    ],
)
def test_a_study_file_that_does_not_fit_is_named(tmp_path, change, message):
    write_study_summaries(tmp_path)
    with pytest.raises(report.ReportError, match=message):
        study.write_study(write_study_file(tmp_path, **change))


def test_the_report_command_exports_and_tests_a_study(tmp_path):
    dirs = write_warm_start_sweeps(tmp_path / "sweeps")
    summaries = tmp_path / "study" / "summaries"
    summaries.parent.mkdir()
    (tmp_path / "study" / "study.json").write_text(json.dumps({"hypotheses": [
        {"name": "two rewards", "summaries": "summaries", "treatment": "gd2po_hard", "control": "gdpo",
         "metric": "test/correct_acc", "direction": 1}]}))

    def report_py(*flags):
        return subprocess.run([sys.executable, str(REPO / "report.py"), *flags], env=subprocess_env(),
                              capture_output=True, text=True, cwd=tmp_path, timeout=120)

    proc = report_py(f"--sweep_dir={dirs[0]},{dirs[1]}", f"--export_summaries={summaries}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"12 run summaries written, 0 unchanged in {summaries}" in proc.stdout
    proc = report_py(f"--study={tmp_path / 'study' / 'study.json'}", f"--out_dir={tmp_path / 'out'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    verdicts = [line for line in lines if line.startswith("two rewards: ")]
    assert len(verdicts) == 1 and "6 blocks" in verdicts[0]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["hypotheses"][0]["n_blocks"] == 6
    proc = report_py(f"--summaries={summaries}", f"--out_dir={tmp_path / 'report'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| gd2po_hard | 6 |" in proc.stdout and (tmp_path / "report" / "summary.csv").is_file()
    proc = report_py(f"--summaries={summaries}")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        "report.py: --summaries: give --out_dir (where the report goes)")


def test_the_study_file_example_of_the_docs_loads(tmp_path):
    text = (REPO / "docs" / "sweeps.md").read_text().split("## Studies:")[1]
    example = text.split("```json\n")[1].split("```")[0]
    (tmp_path / "study.json").write_text(example)
    loaded = study.load_study(tmp_path / "study.json")
    assert [h.name for h in loaded.hypotheses] == ["H1 two rewards", "H2 three rewards"]
    assert loaded.hypotheses[1].summaries == tmp_path / "three_rewards" / "summaries"
    assert loaded.hypotheses[1].min_effect_pp == 1.0 and loaded.hypotheses[1].primary


def test_a_hypothesis_may_take_its_treatment_from_another_arm(tmp_path):
    write_study_summaries(tmp_path)
    for k in range(3):  # a secondary arm: 3 warm starts x 4 seeds, GD2PO-Hard without reweighting
        for j in range(4):
            write_summary(tmp_path / "noreweight", "gd2po_hard", k, j, 0.40 + 0.02 * k + 0.01 * j + 0.001 * j * j)
    file = tmp_path / "study.json"
    hypothesis = {"name": "no reweighting", "summaries": "two", "treatment_summaries": "noreweight",
                  "treatment": "gd2po_hard", "control": "gdpo", "metric": "test/correct_acc", "direction": 1}
    file.write_text(json.dumps({"hypotheses": [hypothesis]}))
    [result] = study.write_study(file, tmp_path / "out")["results"]
    d = [0.001 * j * j for k in range(3) for j in range(4)]
    assert result["n_blocks"] == 12 and result["diff_pp"] == pytest.approx(100 * np.mean(d))
    assert result["treatment_summaries"] == "noreweight" and result["control_summaries"] is None
    assert result["p"] == pytest.approx(stats.ttest_1samp(d, 0).pvalue)
    assert len(result["unpaired_runs"]) == 8  # gdpo of sft 3 (5) and seed 4 of sft 0..2 (3)
    assert "## Secondary metrics: noreweight" in (tmp_path / "out" / "summary.md").read_text()
    write_summary(tmp_path / "other", "gd2po_hard", 0, 0, 0.5, **{"train.num_steps": 80})
    file.write_text(json.dumps({"hypotheses": [{**hypothesis, "treatment_summaries": "other"}]}))
    with pytest.raises(report.ReportError, match=r"other: hypothesis 'no reweighting': another setting than .*two "
                                                 r"\(train\.num_steps differ\)"):
        study.write_study(file)
