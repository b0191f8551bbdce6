"""gd2po_jax/runtime/metrics_logging.py: metrics.jsonl is the record; TensorBoard shows what it has."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gd2po_jax.runtime.metrics_logging import MetricsWriter, read_metrics
from gd2po_jax.runtime.run_dir import RunDirError
from tests.fakes import tensorboard_scalars


def write_steps(workdir, steps, resume_step=None) -> None:
    writer = MetricsWriter(workdir, resume_step=resume_step)
    for step in steps:
        writer.write(step, {"reward/correctness": float(step), "loss/kl": np.float32(step / 10)})
    writer.close()


def test_non_finite_metrics_are_written_and_read_back_as_such(tmp_path):
    writer = MetricsWriter(tmp_path, tensorboard=False)
    record = writer.write(1, {"loss/grad_norm": np.float32("nan"), "up": float("inf"), "down": -math.inf,
                              "kept": 0.5})
    writer.close()
    assert math.isnan(record["loss/grad_norm"])
    line = (tmp_path / "metrics.jsonl").read_text()
    assert '"loss/grad_norm": NaN' in line and '"up": Infinity' in line and '"down": -Infinity' in line
    [back] = read_metrics(tmp_path)
    assert math.isnan(back["loss/grad_norm"]) and back["up"] == math.inf and back["down"] == -math.inf
    assert back["kept"] == 0.5


def test_resume_cuts_metrics_back_and_rebuilds_tensorboard_from_them(tmp_path):
    write_steps(tmp_path, [1, 2, 3, 4, 5])
    # A killed process: its last metrics line was cut short, and its event file lost what it had
    # not flushed yet (steps before the checkpoint too) and ends in half a record.
    with (tmp_path / "metrics.jsonl").open("a") as file:
        file.write('{"step": 6, "reward/corr')
    [events] = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    data = events.read_bytes()
    events.write_bytes(data[:len(data) // 2])
    assert len(tensorboard_scalars(tmp_path / "tensorboard")["reward/correctness"]) < 3

    write_steps(tmp_path, [4, 5], resume_step=3)  # resumed from the checkpoint of step 3
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]
    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    assert sorted(scalars) == ["loss/kl", "reward/correctness"]
    assert scalars["reward/correctness"] == [(s, float(s)) for s in (1, 2, 3, 4, 5)]  # each step once
    assert [step for step, _ in scalars["loss/kl"]] == [1, 2, 3, 4, 5]


def test_a_fresh_start_clears_what_an_earlier_attempt_logged(tmp_path):
    write_steps(tmp_path, [1, 2])  # killed before its first checkpoint
    write_steps(tmp_path, [1])
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]
    assert tensorboard_scalars(tmp_path / "tensorboard")["reward/correctness"] == [(1, 1.0)]


def test_only_a_torn_last_line_is_forgiven_on_resume(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "x"\n{"step": 3}\n')
    with pytest.raises(RunDirError, match=r"metrics\.jsonl, line 2: not JSON"):
        MetricsWriter(tmp_path, resume_step=3, tensorboard=False)


def test_reward_sum_is_the_weighted_total_of_each_valid_rollout():
    import numpy as np

    from gd2po_jax.runtime.metrics_logging import reward_sum_metrics

    rewards = np.array([[[1.0, 0.0], [0.5, np.nan]], [[9.0, 9.0], [9.0, 9.0]]])  # prompt 1 is padding
    totals = np.array([1.0 * 2 + 0.0, 0.5 * 2])  # weights (2, 1); an abstained reward adds 0
    metrics = reward_sum_metrics(rewards, np.array([True, False]), (2.0, 1.0))
    assert metrics == {"reward_sum/mean": totals.mean(), "reward_sum/std": totals.std()}
    assert reward_sum_metrics(rewards, np.array([True, True]))["reward_sum/mean"] == (1 + 0.5 + 18 + 18) / 4


def test_completions_table_and_tensorboard_text(tmp_path):
    import numpy as np

    from gd2po_jax.runtime.metrics_logging import MetricsWriter, completions_table

    table = completions_table(3, ["brevity", "digits"], np.array([[1.0, np.nan], [0.25, 0.5]]),
                              ["1234", "line one\nline two " + "x" * 200])
    lines = table.splitlines()
    assert lines[0] == "step 3: 2 rollouts of its first prompt" and "brevity" in lines[1] and "digits" in lines[1]
    assert lines[2].split() == ["1.000", "-", "1234"]
    assert "line one\\nline two" in lines[3] and lines[3].endswith("...")
    writer = MetricsWriter(tmp_path)
    writer.write(3, {"loss": 1.0})
    writer.write_text(3, "completions", table)
    writer.close()
    events = b"".join(p.read_bytes() for p in (tmp_path / "tensorboard").rglob("*") if p.is_file())
    assert b"completions" in events and b"1234" in events


def test_completions_table_refuses_rewards_and_completions_that_do_not_pair():
    import numpy as np

    from gd2po_jax.runtime.metrics_logging import completions_table

    with pytest.raises(ValueError, match="2 rows of rewards for 3 completions"):
        completions_table(1, ["a"], np.zeros((2, 1)), ["x", "y", "z"])
