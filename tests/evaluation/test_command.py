"""eval.py and gd2po_jax/evaluation/command.py: API-Bank on a plain HF model, and a training run's
checkpoints (latest, --checkpoint_step, exported policy) on its own splits and on API-Bank. (The
training run's policies are here too, `gd2po_jax.evaluation.policy.policy_from_run`: they share its
one training run.)"""

import json
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from configs import tiny
from gd2po_jax.data.tokenization import load_tokenizer
from gd2po_jax.evaluation import command as eval_command
from gd2po_jax.evaluation.command import EvalError, EvalOptions
from gd2po_jax.evaluation.policy import Policy, policy_from_run
from gd2po_jax.jobs.train import train_and_evaluate
from gd2po_jax.models import load_pretrained
from gd2po_jax.tasks.setup import build_setup
from tests.fakes import REPO, as_run_config, data_files, subprocess_env, tiny_policy

LEVELS = ("level_1", "level_2", "level_3")


def _assert_api_bank_report(result: dict, per_level: int) -> None:
    assert result["count"] == {**{lv: per_level for lv in LEVELS}, "overall": 3 * per_level}
    assert result["num_examples"] == 3 * per_level
    for key in (*LEVELS, "overall"):
        assert 0.0 <= result["correct_acc"][key] <= 100.0
        assert 0.0 <= result["format_acc"][key] <= 100.0
        assert 0.0 <= result["length"][key] <= 1.0


# ---------------------------------------------------------------------------------- no model


def test_first_per_level_keeps_file_order():
    levels = [1, 1, 1, 2, 3, 3, 2, 2]
    assert eval_command.first_per_level(levels, 2) == [0, 1, 3, 4, 5, 6]
    assert eval_command.first_per_level(levels, 0) == list(range(8))


def test_output_dir_and_argument_errors(tmp_path):
    assert eval_command.output_dir(EvalOptions(model_path="/models/Qwen2.5-3B-Instruct")) == \
        pathlib.Path("runs/eval/Qwen2.5-3B-Instruct")
    assert eval_command.output_dir(EvalOptions(workdir=str(tmp_path), model_path="/m")) == tmp_path
    with pytest.raises(EvalError, match="--workdir"):
        eval_command.run(EvalOptions())
    with pytest.raises(EvalError, match="config.json not found.*--model_path"):
        eval_command.run(EvalOptions(workdir=str(tmp_path)))
    with pytest.raises(EvalError, match="--model_path needs --data"):
        eval_command.run(EvalOptions(workdir=str(tmp_path), model_path=str(tmp_path)))
    with pytest.raises(EvalError, match="--data=/nowhere/api"):
        eval_command.run(EvalOptions(workdir=str(tmp_path), model_path=str(tmp_path), data="/nowhere/api"))
    with pytest.raises(EvalError, match="--model_path=.*no config.json"):
        eval_command.run(EvalOptions(workdir=str(tmp_path), model_path=str(tmp_path), data="api_bank",
                                 api_bank_dir=str(data_files() / "api_bank")))


def test_the_data_keywords_name_no_directory_but_the_flag_and_the_public_data(tmp_path):
    """``--data=api_bank`` reads ``--api_bank_dir``, which has no default; ``--data=safe_alignment``
    names no directory: the errors name the flag to pass and where the data sets are published."""
    with pytest.raises(EvalError, match=r"^--data=api_bank needs --api_bank_dir=DIR.*level-\{1,2,3\}-api_processed"
                                        r"\.json.*github\.com/Qwen-Applications/GD2PO"):
        eval_command.run(EvalOptions(workdir=str(tmp_path), model_path=str(tmp_path), data="api_bank"))
    with pytest.raises(EvalError, match=r"^--api_bank_dir=/nowhere/api: /nowhere/api does not exist"):
        eval_command.run(EvalOptions(workdir=str(tmp_path), model_path=str(tmp_path), data="api_bank",
                                 api_bank_dir="/nowhere/api"))
    with pytest.raises(EvalError, match=r"^--data=safe_alignment: pass --data=DIR.*alpaca_test\.parquet.*"
                                        r"github\.com/Qwen-Applications/GD2PO"):
        eval_command.run(EvalOptions(workdir=str(tmp_path), model_path=str(tmp_path), data="safe_alignment"))


def test_api_bank_prompts_that_leave_no_response_token_are_named_before_generating(tmp_path):
    tokenizer = load_tokenizer(tiny_policy())
    policy = Policy(model=None, tokenizer=tokenizer, eos_ids=[tokenizer.eos_token_id], pad_id=0, source={})
    path = data_files() / "api_bank"
    shortest = min(len(ids) for ids in eval_command.api_bank_prompts(path, tokenizer, 1, 4096).token_ids)
    with pytest.raises(EvalError, match=rf"^API-Bank {path}, example \d+ \(0-based\): the prompt has \d+ tokens, at "
                                        rf"least max_total_tokens={shortest}"):
        eval_command.evaluate_api_bank(policy, path, tmp_path, batch_size=2, max_new_tokens=8, max_examples=1,
                                   max_think_words=512, max_prompt_tokens=4096, progress=False,
                                   max_total_tokens=shortest)


# ---------------------------------------------------------------------------------- --model_path


def test_model_path_on_api_bank_command_line(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "eval.py", f"--model_path={tiny_policy()}", "--data=api_bank",
               f"--api_bank_dir={data_files() / 'api_bank'}", f"--workdir={out}", "--max_examples=2",
               "--max_new_tokens=6", "--batch_size=8", "--dtype=float32"]
    done = subprocess.run(command, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Correct Acc" in done.stdout and "overall" in done.stdout
    result = json.loads((out / "eval" / "api_bank.json").read_text())
    _assert_api_bank_report(result, per_level=2)
    assert result["max_new_tokens"] == 6 and result["policy"] == {"model_path": str(tiny_policy())}
    assert result["max_total_tokens"] == 4096  # the official generation's max_model_len
    records = [json.loads(line) for line in (out / "eval" / "api_bank.jsonl").read_text().splitlines()]
    assert [r["level"] for r in records] == [1, 1, 2, 2, 3, 3]
    assert all(0 < r["response_tokens"] <= 6 and isinstance(r["response"], str) for r in records)


def test_command_line_error_is_one_readable_line(tmp_path):
    done = subprocess.run([sys.executable, "eval.py", f"--workdir={tmp_path}"], cwd=REPO, env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("eval.py: ")
    assert "config.json not found" in done.stderr
    done = subprocess.run([sys.executable, "eval.py", f"--workdir={tmp_path}", "--data=api_bank"], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("eval.py: --data=api_bank needs --api_bank_dir=DIR")


# ---------------------------------------------------------------------------------- a training run


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A 2-step run of configs/tiny.py (a 2-step warm start, 8 validation / test examples) with a
    checkpoint after each step."""
    config = tiny.get_config()
    config.sft.num_steps = 2
    config.train.num_steps = 2
    config.train.prompts_per_step = 4
    config.data.synthetic.num_validation = 8
    config.sampling.max_new_tokens = 16
    config.eval.max_examples = 8
    config.checkpoint.every_steps = 1
    config.checkpoint.keep = 3
    workdir = tmp_path_factory.mktemp("run")
    train_and_evaluate(as_run_config(config), workdir, progress=False)
    return workdir


def _params(model) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.mark.slow
def test_split_eval_restores_the_latest_checkpoint(trained_run):
    result = eval_command.run(EvalOptions(workdir=str(trained_run), split="test", progress=False))
    written = json.loads((trained_run / "eval" / "test.json").read_text())
    assert written == result
    assert result["split"] == "test" and result["num_examples"] == 8
    assert result["policy"] == {"checkpoint": str(trained_run / "checkpoints"), "step": 2}
    for key in ("correct_acc", "format_acc"):
        assert 0.0 <= result[key] <= 1.0
    assert 0.0 <= result["length"] <= 1.0
    assert len((trained_run / "eval" / "test.jsonl").read_text().splitlines()) == 8


@pytest.mark.slow
def test_a_report_is_written_once_whole_while_the_workdir_is_locked(trained_run, monkeypatch):
    """eval/<split>.json is the sweep's sign that a run is evaluated: it is written once, atomically,
    with every field; and while train.py (or another eval.py) holds the workdir, eval.py stops."""
    from gd2po_jax.runtime import run_dir

    writes = []
    write_text = run_dir.write_text
    monkeypatch.setattr(run_dir, "write_text", lambda path, text: (writes.append(pathlib.Path(path).name),
                                                                    write_text(path, text)))
    result = eval_command.run(EvalOptions(workdir=str(trained_run), split="validation", checkpoint_step=1,
                                      max_examples=2, progress=False))
    assert writes == ["validation.jsonl", "validation.json"]
    assert json.loads((trained_run / "eval" / "validation.json").read_text())["policy"]["step"] == 1 == \
        result["policy"]["step"]
    with run_dir.lock_workdir(trained_run, "train.py"):
        with pytest.raises(run_dir.WorkdirBusyError, match=rf"{trained_run} is in use by train.py"):
            eval_command.run(EvalOptions(workdir=str(trained_run), split="validation", progress=False))


@pytest.mark.slow
def test_checkpoint_step_selects_the_parameters(trained_run):
    config = eval_command.load_run_config_or_eval_error(trained_run)
    setup = build_setup(as_run_config(config), trained_run)
    latest = _params(policy_from_run(config, setup, trained_run, None).model)
    first = _params(policy_from_run(config, setup, trained_run, 1).model)
    exported = _params(load_pretrained(trained_run / "policy"))
    assert all(np.array_equal(a, b) for a, b in zip(latest, exported, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, latest, strict=True))

    result = eval_command.run(EvalOptions(workdir=str(trained_run), split="validation", checkpoint_step=1,
                                      progress=False))
    assert result["policy"]["step"] == 1 and result["num_examples"] == 8
    with pytest.raises(EvalError, match=r"--checkpoint_step=7: .*available steps: \[1, 2\]"):
        eval_command.run(EvalOptions(workdir=str(trained_run), checkpoint_step=7, progress=False))


@pytest.mark.slow
def test_without_checkpoints_the_exported_policy_then_a_clear_error(trained_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    result = eval_command.run(EvalOptions(workdir=str(copy), split="test", progress=False))
    assert result["policy"] == {"model_path": str(copy / "policy")}
    shutil.rmtree(copy / "policy")
    with pytest.raises(EvalError, match="no checkpoint .* and no exported policy"):
        eval_command.run(EvalOptions(workdir=str(copy), split="test", progress=False))


@pytest.mark.slow
def test_api_bank_eval_of_a_training_run(trained_run):
    result = eval_command.run(EvalOptions(workdir=str(trained_run), data=str(data_files() / "api_bank"),
                                      max_examples=1, max_new_tokens=4, progress=False))
    _assert_api_bank_report(result, per_level=1)
    assert result["policy"]["step"] == 2 and result["max_total_tokens"] == 0  # the run's eval.max_total_tokens
    assert json.loads((trained_run / "eval" / "api_bank.json").read_text()) == result
    # Capped: each example gets at most max_total_tokens minus its prompt (the longest prompt: 1 token).
    tokenizer = load_tokenizer(trained_run / "policy")
    records = [json.loads(line) for line in (trained_run / "eval" / "api_bank.jsonl").read_text().splitlines()]
    lengths = [len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in records]
    cap = max(lengths) + 1
    capped = eval_command.run(EvalOptions(workdir=str(trained_run), data=str(data_files() / "api_bank"),
                                      max_examples=1, max_new_tokens=4, max_total_tokens=cap, progress=False))
    assert capped["max_total_tokens"] == cap
    records = [json.loads(line) for line in (trained_run / "eval" / "api_bank.jsonl").read_text().splitlines()]
    assert all(r["response_tokens"] <= min(4, cap - n) for r, n in zip(records, lengths))
    assert {r["response_tokens"] for r, n in zip(records, lengths) if n == max(lengths)} == {1}


# ---------------------------------------------------------------------------------- your own task


@pytest.fixture(scope="module")
def own_run(tmp_path_factory):
    """A 2-step run of a user's own task (tests/own_task_helpers.py: two TRL-form functions from the user's
    file, no reward family, JSONL prompts with columns of the user's own of any type and no target, so no
    warm start); the keyword arguments the functions got are recorded."""
    import os

    from gd2po_jax.tasks.base import results_table
    from tests.own_task_helpers import own_task_config, write_user_dir

    user = write_user_dir(tmp_path_factory.mktemp("user"))
    log = user / "kwargs.jsonl"
    os.environ["OWN_TASK_KWARGS_LOG"] = str(log)
    try:
        results = train_and_evaluate(own_task_config(user), user / "run", progress=False)
    finally:
        del os.environ["OWN_TASK_KWARGS_LOG"]
    assert "Correct Acc" not in results_table(results)
    return user


@pytest.mark.slow
def test_your_own_columns_reach_your_functions_as_they_are_and_no_others(own_run):
    """``"ground_truth": 7``, a dict, ``"level": "hard"`` load (the task reads none of them) and reach the
    functions as keyword arguments; no target or source the data does not have is injected."""
    calls = [json.loads(line) for line in (own_run / "kwargs.jsonl").read_text().splitlines()]
    assert calls and all({"answer", "ground_truth", "meta", "level"} <= set(c) for c in calls)
    assert not any({"target", "source", "prompt", "row", "prompt_text"} & set(c) for c in calls)


@pytest.mark.slow
def test_eval_data_scores_your_own_data_in_every_form_the_loaders_read(own_run, tmp_path):
    """``eval.py --workdir=RUN --data=SOURCE``: a JSONL file, a parquet file and a ``save_to_disk`` folder of
    the user's rows, each scored by the run's own functions; the table lists them, not the built-in task's
    metrics."""
    import datasets

    from tests.own_task_helpers import rows

    workdir = own_run / "run"
    data = [dict(row, meta=json.dumps(row["meta"])) for row in rows(3, offset=70)]  # one Arrow type a column
    datasets.Dataset.from_list(data).to_parquet(str(tmp_path / "held_out.parquet"))
    datasets.Dataset.from_list(data).save_to_disk(str(tmp_path / "saved"))
    for source, name, count in ((own_run / "val.jsonl", "data-val", 4), (tmp_path / "held_out.parquet",
                                "data-held_out", 3), (tmp_path / "saved", "data-saved", 3)):
        result = eval_command.run(EvalOptions(workdir=str(workdir), data=str(source), progress=False))
        assert result["num_examples"] == count and result["reward_names"] == ["brevity", "digits"]
        assert 0.0 <= result["brevity"] <= 1.0 and 0.0 <= result["digits"] <= 1.0 and "reward_sum" in result
        assert result["data"] == str(source) and result["policy"]["step"] == 2
        assert json.loads((workdir / "eval" / f"{name}.json").read_text()) == result
        assert len((workdir / "eval" / f"{name}.jsonl").read_text().splitlines()) == count
        table = eval_command.split_table(result)
        assert "brevity" in table and "digits" in table and "Sum" in table
        assert not any(label in table for label in ("Correct Acc", "Format Acc", "Correctness", "Length"))
    # The test split's table too (eval.py --split=test): the run's own metrics.
    table = eval_command.split_table(eval_command.run(EvalOptions(workdir=str(workdir), progress=False)))
    assert "digits" in table and "Correct Acc" not in table
    with pytest.raises(EvalError, match=r"^--data: .*nothing\.jsonl' does not exist"):
        eval_command.run(EvalOptions(workdir=str(workdir), data=str(tmp_path / "nothing.jsonl"), progress=False))


def test_the_data_report_name_and_what_is_api_bank(tmp_path):
    assert eval_command.data_report_name("val.jsonl") == "data-val"
    assert eval_command.data_report_name("org/held-out:test") == "data-held-out"
    assert eval_command.data_report_name(str(tmp_path) + "/") == f"data-{tmp_path.name}"
    api_bank = data_files() / "api_bank"
    assert eval_command.is_api_bank_data(str(api_bank)) and eval_command.is_api_bank_data("api_bank")
    assert eval_command.is_api_bank_data(str(next(api_bank.glob("level-1-*.json"))))
    (tmp_path / "v.jsonl").write_text('{"prompt": "p"}\n{"prompt": "q"}\n')
    assert not eval_command.is_api_bank_data(str(tmp_path / "v.jsonl"))


def test_tables_list_the_runs_own_metrics():
    summary = {"split": "test", "policy": {"model_path": "m"}, "num_examples": 2, "brevity": 0.5, "digits": 1.0,
               "reward_sum": 1.5, "reward_names": ["brevity", "digits"], "truncation_rate": 0.0}
    table = eval_command.split_table(summary)
    assert [line.split()[0] for line in table.splitlines()[1:]] == ["examples", "brevity", "digits", "Sum",
                                                                    "Truncation", "Resp."]
    tool = eval_command.split_table({"split": "test", "policy": {"model_path": "m"}, "correct_acc": 0.5})
    assert "Correct Acc" in tool and "Format Acc" in tool
    from gd2po_jax.tasks.base import results_table

    table = results_table({"split": None, "algorithm": "gdpo", "steps": 2, "before_rl": None, "after_rl": None})
    assert "Correct Acc" not in table and table.startswith("no evaluation (gdpo, 2 RL steps)")
