"""bench/reward_concurrency.py runs and prints one JSON object per num_workers (no timing asserted)."""

import json

from bench import reward_concurrency


def test_the_bench_prints_one_line_per_setting(capsys):
    reward_concurrency.main(["--sleep_s=0.01", "--rollouts=4", "--repeats=1"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["num_workers"] for line in lines] == [1, 3]
    assert all(line["functions"] == 3 and line["step_scoring_s"] > 0 for line in lines)
