"""bench/dynamic_sampling.py's summary of a run (the runs themselves are train.py's: tests/jobs)."""

import json

import pytest

from bench.dynamic_sampling import run_dir_name, summarize


def write_run(workdir, records):
    workdir.mkdir()
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def step(n, **extra):
    return {"step": n, "loss/grad_norm": 0.5 * n, "advantages/kept_fraction": 0.25 * n, "reward/a": -1.0 + n,
            "generated_tokens": 100.0 * n, "time/rollout": 2.0, "time/update": 1.0, "time/first_step": 30.0} | extra


def test_a_run_without_refill_is_summarized_from_its_batch_metrics(tmp_path):
    write_run(tmp_path / "r", [{"step": 0, "eval/x": 1.0}, step(1), step(2), step(3)])
    s = summarize(tmp_path / "r")
    assert s["steps"] == 3
    assert s["generated_tokens_cumulative"] == [100.0, 300.0, 600.0]
    assert s["sampled_reward"] == s["batch_reward"] == {"a": [0.0, 1.0, 2.0]}
    assert s["grad_norm_mean"] == pytest.approx(1.0) and s["kept_fraction_mean"] == pytest.approx(0.5)
    assert s["seconds_per_step"] == 3.0  # steps 2.., time/first_step left out
    assert s["rounds_mean"] == 1.0 and s["after_rl"] is None


def test_a_refill_run_counts_every_round_s_tokens_and_the_sampled_reward(tmp_path):
    extra = {"dynamic_sampling/generated_tokens": 250.0, "dynamic_sampling/sampled_reward/a": -0.5,
             "dynamic_sampling/rounds": 3.0, "dynamic_sampling/filler_groups": 1.0}
    write_run(tmp_path / "r", [step(1, **extra), step(2, **extra)])
    s = summarize(tmp_path / "r")
    assert s["generated_tokens_cumulative"] == [250.0, 500.0]
    assert s["sampled_reward"] == {"a": [-0.5, -0.5]} and s["batch_reward"] == {"a": [0.0, 1.0]}
    assert s["rounds_mean"] == 3.0 and s["filler_groups_total"] == 2.0
    assert run_dir_name("configs/tiny.py", "gd2po_hard", "kept", 3) == "tiny-gd2po_hard-kept-s3"


def labelled(workdir, algorithm, mode, seed, records, test=None):
    workdir.parent.mkdir(parents=True, exist_ok=True)
    write_run(workdir, records)
    config = {"rl": {"algorithm": algorithm, "dynamic_sampling": mode}, "train": {"seed": seed}}
    (workdir / "config.json").write_text(json.dumps(config))
    (workdir / "results.json").write_text(json.dumps({"after_rl": {"a": float(seed)}}))
    if test is not None:
        (workdir / "eval").mkdir()
        (workdir / "eval" / "test.json").write_text(json.dumps(test))


def test_existing_runs_compare_refill_at_the_token_budget_of_the_run_without_it(tmp_path, capsys):
    from bench.dynamic_sampling import main

    refill = {"dynamic_sampling/generated_tokens": 200.0, "dynamic_sampling/rounds": 2.0}
    for seed in (0, 1):
        # off: 100 tokens a step, sampled reward 0, 1, 2; kept: 200 tokens a step, sampled reward 0, 2, 4 (+ seed)
        labelled(tmp_path / "sweep" / f"off{seed}", "gd2po_hard", "off", seed,
                 [step(n, **{"reward/a": n - 1.0}) for n in (1, 2, 3)], test={"correct_acc": 0.5 + seed / 10})
        labelled(tmp_path / "other" / "deep" / f"kept{seed}", "gd2po_hard", "kept", seed,
                 [step(n, **refill, **{"dynamic_sampling/sampled_reward/a": 2.0 * (n - 1) + seed}) for n in (1, 2, 3)])
    (tmp_path / "other" / "unfinished").mkdir()
    assert main([f"--from_runs={tmp_path / 'sweep'},{tmp_path / 'other'}", "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 9  # four runs, the table, then the table in markdown (a header, a rule and 2 rows)
    table = json.loads(lines[4])
    assert lines[5].startswith("| arm | seeds | tokens | rounds/step |") and "test correct_acc" in lines[5]
    assert lines[7].startswith("| gd2po_hard/kept | 2 | 600 ± 0 | 2.00 ± 0.00 |")
    assert lines[8].endswith("| 0.550 ± 0.071 |")  # off: test correct_acc
    assert sorted(table) == ["gd2po_hard/kept", "gd2po_hard/off"]
    off, kept = table["gd2po_hard/off"], table["gd2po_hard/kept"]
    assert off["seeds"] == kept["seeds"] == [0, 1]
    assert off["generated_tokens"] == {"mean": 600.0, "sd": 0.0} and kept["generated_tokens"]["mean"] == 600.0
    assert kept["rounds"]["mean"] == 2.0 and off["rounds"]["mean"] == 1.0
    assert kept["final_sampled_reward"]["a"]["mean"] == pytest.approx(4.5)
    # off's budget is 600 tokens = kept's step 3 (cumulative 200, 400, 600): the same as its final reward here
    assert kept["sampled_reward_at_off_tokens"]["a"]["mean"] == pytest.approx(4.5)
    assert off["sampled_reward_at_off_tokens"]["a"]["mean"] == pytest.approx(2.0)
    assert off["test"]["correct_acc"]["mean"] == pytest.approx(0.55) and kept["test"] == {}
    assert off["after_rl"]["a"] == {"mean": 0.5, "sd": pytest.approx(0.7071, abs=1e-4)}
    labelled(tmp_path / "sweep" / "gdpo0", "gdpo", "off", 0, [step(1)], test={"correct_acc": 0.1, "other": 1.0})
    assert main([f"--from_runs={tmp_path / 'sweep'}", "--markdown", "--test_keys=correct_acc"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + 1 + 3  # --algorithms (default: gd2po_hard, gd2po_snr) leaves gdpo out
    assert lines[3].endswith("| test correct_acc |") and lines[5].endswith("| 0.550 ± 0.071 |")


def test_the_reward_at_a_token_budget_is_interpolated_along_the_steps():
    from bench.dynamic_sampling import reward_at_tokens

    summary = {"generated_tokens_cumulative": [100.0, 300.0], "sampled_reward": {"a": [0.0, 1.0]}}
    assert reward_at_tokens(summary, 200.0) == {"a": 0.5}
    assert reward_at_tokens(summary, 1000.0) == {"a": 1.0} and reward_at_tokens(summary, 50.0) == {"a": 0.0}
