"""gd2po_jax.tasks.habits: the habit breakdown of an evaluation's generations."""

import json

import pytest

from gd2po_jax.tasks import habits
from gd2po_jax.tasks.synthetic_tools import habit_tools


def call(name, **params):
    line = json.dumps({"name": name, "parameters": params})
    return f"<think> x </think>\n<tool_call>\n{line}\n</tool_call>"


ROWS = [
    # a habit tool: names wrong (the habit), right, right but a wrong value
    {"ground_truth": call("get_weather", city="Oslo", unit="celsius"), "response": call("get_weather", city="Oslo"), "correct": 0.0},
    {"ground_truth": call("get_weather", city="Oslo", unit="celsius"), "response": call("get_weather", city="Oslo", unit="celsius"), "correct": 1.0},
    {"ground_truth": call("get_weather", city="Oslo", unit="celsius"), "response": call("get_weather", unit="celsius", city="Rome"), "correct": 0.0},
    # another tool: a wrong tool, a malformed call, a response
    {"ground_truth": call("get_local_time", city="Lima"), "response": call("get_weather", city="Lima"), "correct": 0.0},
    {"ground_truth": call("get_local_time", city="Lima"), "response": "<tool_call>\n{oops\n</tool_call>", "correct": 0.0},
    {"ground_truth": call("get_local_time", city="Lima"), "response": "<response> hi </response>", "correct": 0.0},
    # not one-call rows: skipped
    {"ground_truth": "<think> x </think>\n<response> hi </response>", "response": "<response> hi </response>", "correct": 1.0},
    {"ground_truth": call("get_local_time", city="Lima").replace("\n</tool_call>", "\n" + json.dumps({"name": "get_weather", "parameters": {}}) + "\n</tool_call>"),
     "response": "", "correct": 0.0},
]


def test_breakdown_counts_rows_names_and_exact_calls():
    out = habits.habit_breakdown(ROWS, frozenset({"get_weather"}))
    assert out == {"habit_tools": {"rows": 3, "right_names": 2, "exact": 1},
                   "other_tools": {"rows": 3, "right_names": 0, "exact": 0}}


def test_command_reads_the_workdir(tmp_path, capsys):
    tool = sorted(habit_tools(0, 0.5))[0]
    (tmp_path / "config.json").write_text(json.dumps({"task": "synthetic_tools", "data": {"synthetic": {"seed": 0, "habit_fraction": 0.5}}}))
    (tmp_path / "eval").mkdir()
    row = {"ground_truth": call(tool, a=1, b=2), "response": call(tool, a=1), "correct": 0.0}
    (tmp_path / "eval" / "before_rl.jsonl").write_text(json.dumps(row) + "\n")
    out = habits.main([f"--workdir={tmp_path}", "--evals=before_rl"])
    assert out["before_rl"]["habit_tools"] == {"rows": 1, "right_names": 0, "exact": 0}
    assert "habit_tools" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="after_rl.jsonl"):
        habits.main([f"--workdir={tmp_path}"])
