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
