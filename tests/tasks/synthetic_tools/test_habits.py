"""gd2po_jax.tasks.synthetic_tools.habits: the habit breakdown of an evaluation's generations, and
``eval.py --habits`` that prints it for a run."""

import json
import subprocess
import sys

import pytest

from configs import default
from gd2po_jax.config import RunConfig
from gd2po_jax.evaluation.command import EvalError, EvalOptions, run
from gd2po_jax.tasks.synthetic_tools import habits
from gd2po_jax.tasks.synthetic_tools.data import habit_tools
from tests.fakes import REPO, subprocess_env


def call(name, **params):
    line = json.dumps({"name": name, "parameters": params})
    return f"<think> x </think>\n<tool_call>\n{line}\n</tool_call>"


def row(truth, response, correct):
    return {"ground_truth": truth, "response": response, "correct": correct}


WEATHER = call("get_weather", city="Oslo", unit="celsius")
TIME = call("get_local_time", city="Lima")
TWO_CALLS = TIME.replace("\n</tool_call>",
                         "\n" + json.dumps({"name": "get_weather", "parameters": {}}) + "\n</tool_call>")
ROWS = [
    # a habit tool: names wrong (the habit), right, right but a wrong value
    row(WEATHER, call("get_weather", city="Oslo"), 0.0),
    row(WEATHER, call("get_weather", city="Oslo", unit="celsius"), 1.0),
    row(WEATHER, call("get_weather", unit="celsius", city="Rome"), 0.0),
    # another tool: a wrong tool, a malformed call, a response
    row(TIME, call("get_weather", city="Lima"), 0.0),
    row(TIME, "<tool_call>\n{oops\n</tool_call>", 0.0),
    row(TIME, "<response> hi </response>", 0.0),
    # not one-call rows: skipped
    row("<think> x </think>\n<response> hi </response>", "<response> hi </response>", 1.0),
    row(TWO_CALLS, "", 0.0),
]


def test_breakdown_counts_rows_names_and_exact_calls():
    out = habits.habit_breakdown(ROWS, frozenset({"get_weather"}))
    assert out == {"habit_tools": {"rows": 3, "right_names": 2, "exact": 1},
                   "other_tools": {"rows": 3, "right_names": 0, "exact": 0}}


def write_run_config(workdir, task="synthetic_tools", **synthetic):
    """A run's config.json: configs/default.py with ``data.synthetic`` fields changed (None: the
    field is left out, as in a config.json written before it existed)."""
    values = json.loads(RunConfig.from_config_dict(default.get_config()).to_json())
    values["task"] = task
    if task == "files":
        values["data"]["train"] = "train.parquet"
    for name, value in synthetic.items():
        if value is None:
            del values["data"]["synthetic"][name]
        else:
            values["data"]["synthetic"][name] = value
    (workdir / "config.json").write_text(json.dumps(values))


def test_eval_habits_reads_the_saved_generations_of_a_run(tmp_path, capsys):
    tool = sorted(habit_tools(0, 0.5))[0]
    write_run_config(tmp_path, seed=0, habit_fraction=0.5)
    (tmp_path / "eval").mkdir()
    row = {"ground_truth": call(tool, a=1, b=2), "response": call(tool, a=1), "correct": 0.0}
    (tmp_path / "eval" / "before_rl.jsonl").write_text(json.dumps(row) + "\n")
    out = run(EvalOptions(workdir=str(tmp_path), habits=("before_rl",)))
    assert out == {"before_rl": {"habit_tools": {"rows": 1, "right_names": 0, "exact": 0},
                                 "other_tools": {"rows": 0, "right_names": 0, "exact": 0}}}
    assert "before_rl   habit_tools       1            0      0" in capsys.readouterr().out
    with pytest.raises(EvalError, match=r"--habits: .*after_rl\.jsonl not found"):
        run(EvalOptions(workdir=str(tmp_path), habits=("before_rl", "after_rl")))
    # A config.json older than habit_fraction: no tool has the habit.
    write_run_config(tmp_path, seed=0, habit_fraction=None)
    out = run(EvalOptions(workdir=str(tmp_path), habits=("before_rl",), progress=False))
    assert out["before_rl"]["other_tools"]["rows"] == 1


def test_eval_habits_needs_a_synthetic_tools_run(tmp_path):
    write_run_config(tmp_path, task="files")
    with pytest.raises(EvalError, match=r"^--habits: .*config\.json has task 'files', which has no habit breakdown "
                                        r"\(tasks with one: synthetic_tools\)$"):
        run(EvalOptions(workdir=str(tmp_path), habits=("test",), progress=False))
    with pytest.raises(EvalError, match="pass only --workdir"):
        run(EvalOptions(workdir=str(tmp_path), habits=("test",), data="api_bank", progress=False))


def test_eval_command_habits_reads_before_and_after_rl_or_the_split(tmp_path):
    tool = sorted(habit_tools(0, 0.5))[0]
    write_run_config(tmp_path, seed=0, habit_fraction=0.5)
    (tmp_path / "eval").mkdir()
    right = {"ground_truth": call(tool, a=1, b=2), "response": call(tool, a=1, b=2), "correct": 1.0}
    wrong = {**right, "response": call(tool, a=1), "correct": 0.0}
    for name, rows in [("before_rl", [wrong]), ("after_rl", [right]), ("test", [wrong, right])]:
        (tmp_path / "eval" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def command(*flags):
        done = subprocess.run([sys.executable, "eval.py", f"--workdir={tmp_path}", "--habits", *flags], cwd=REPO,
                              env=subprocess_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return [line.split() for line in done.stdout.splitlines() if "habit_tools" in line]

    assert command() == [["before_rl", "habit_tools", "1", "0", "0"], ["after_rl", "habit_tools", "1", "1", "1"]]
    assert command("--split=test") == [["test", "habit_tools", "2", "1", "1"]]
