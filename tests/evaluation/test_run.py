"""eval.py and gd2po_jax/evaluation/run.py: API-Bank on a plain HF model, and a training run's
checkpoints (latest, --checkpoint_step, exported policy) on its own splits and on API-Bank."""

import json
import pathlib
import shutil
import subprocess
import sys
import types

import jax
import numpy as np
import pytest
from flax import nnx

from configs import safety, tiny
from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.data.tokenization import load_tokenizer
from gd2po_jax.evaluation import run as eval_run
from gd2po_jax.evaluation.run import EvalError, EvalOptions
from gd2po_jax.models import load_pretrained
from gd2po_jax.rewards.reward_model import RewardModelReward
from gd2po_jax.tasks.setup import build_setup
from gd2po_jax.jobs.train import train_and_evaluate
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
    assert eval_run.first_per_level(levels, 2) == [0, 1, 3, 4, 5, 6]
    assert eval_run.first_per_level(levels, 0) == list(range(8))


def test_output_dir_and_argument_errors(tmp_path):
    assert eval_run.output_dir(EvalOptions(model_path="/models/Qwen2.5-3B-Instruct")) == \
        pathlib.Path("runs/eval/Qwen2.5-3B-Instruct")
    assert eval_run.output_dir(EvalOptions(workdir=str(tmp_path), model_path="/m")) == tmp_path
    with pytest.raises(EvalError, match="--workdir"):
        eval_run.run(EvalOptions())
    with pytest.raises(EvalError, match="config.json not found.*--model_path"):
        eval_run.run(EvalOptions(workdir=str(tmp_path)))
    with pytest.raises(EvalError, match="--model_path needs --data"):
        eval_run.run(EvalOptions(workdir=str(tmp_path), model_path=str(tmp_path)))
    with pytest.raises(EvalError, match="--data=/nowhere/api"):
        eval_run.run(EvalOptions(workdir=str(tmp_path), model_path=str(tmp_path), data="/nowhere/api"))
    with pytest.raises(EvalError, match="--model_path=.*no config.json"):
        eval_run.run(EvalOptions(workdir=str(tmp_path), model_path=str(tmp_path), data="api_bank",
                                 api_bank_dir=str(data_files() / "api_bank")))


def test_the_data_keywords_name_no_directory_but_the_flag_and_the_public_data(tmp_path):
    """``--data=api_bank`` reads ``--api_bank_dir``, which has no default; ``--data=safe_alignment``
    names no directory: the errors name the flag to pass and where the data sets are published."""
    with pytest.raises(EvalError, match=r"^--data=api_bank needs --api_bank_dir=DIR.*level-\{1,2,3\}-api_processed"
                                        r"\.json.*github\.com/Qwen-Applications/GD2PO"):
        eval_run.run(EvalOptions(workdir=str(tmp_path), model_path=str(tmp_path), data="api_bank"))
    with pytest.raises(EvalError, match=r"^--api_bank_dir=/nowhere/api: /nowhere/api does not exist"):
        eval_run.run(EvalOptions(workdir=str(tmp_path), model_path=str(tmp_path), data="api_bank",
                                 api_bank_dir="/nowhere/api"))
    with pytest.raises(EvalError, match=r"^--data=safe_alignment: pass --data=DIR.*alpaca_test\.parquet.*"
                                        r"github\.com/Qwen-Applications/GD2PO"):
        eval_run.run(EvalOptions(workdir=str(tmp_path), model_path=str(tmp_path), data="safe_alignment"))


def test_a_run_config_without_the_new_eval_and_reward_model_fields_loads_with_their_defaults():
    """config.json of runs before eval.sets, eval.max_total_tokens and reward_models.<name>.truncation."""
    values = as_run_config(safety.get_config()).to_dict()
    del values["eval"]["sets"], values["eval"]["max_total_tokens"]
    for model in values["rewards"]["reward_models"].values():
        del model["truncation"]
    config = RunConfig.from_config_dict(values)
    assert (config.eval.sets, config.eval.max_total_tokens) == ("", 0)
    assert {m.truncation for m in config.rewards.reward_models.values()} == {"right"}
    with pytest.raises(ConfigError, match=r"config\.rewards\.reward_models\.useful\.truncation: 'left' is not one of"):
        as_run_config(safety.get_config()).replace({"rewards.reward_models.useful.truncation": "left"})
    with pytest.raises(ConfigError, match=r"config\.eval\.max_total_tokens: must be an integer >= 0"):
        as_run_config(safety.get_config()).replace({"eval.max_total_tokens": -1})


def test_eval_target_is_the_sets_or_the_split_and_checks_the_sets(tmp_path):
    """A run with eval.sets evaluates them ("sets"), scored by its reward models alone; checked when the
    run starts, naming config.eval.sets."""
    config = as_run_config(safety.get_config())
    reward_models = types.SimpleNamespace(reward_fn=RewardModelReward.__new__(RewardModelReward))
    sets = str(data_files() / "safe_alignment")
    assert eval_run.eval_target(config.replace({"eval.sets": sets}), reward_models) == eval_run.SETS
    with pytest.raises(ConfigError, match=rf"^config\.eval\.sets='{tmp_path}/none': .*does not exist"):
        eval_run.eval_target(config.replace({"eval.sets": str(tmp_path / "none")}), reward_models)
    with pytest.raises(ConfigError, match=r"^config\.eval\.sets: helpfulness-safety sets are scored by the run's "
                                          r"reward models, but its rewards are config\.rewards\.kind='tool_calling'"):
        eval_run.eval_target(config.replace({"eval.sets": sets, "rewards.kind": "tool_calling",
                                             "rewards.names": ("correctness",), "rewards.reward_models": {}}),
                             types.SimpleNamespace(reward_fn=object()))


def test_eval_metrics_of_a_split_and_of_sets():
    split = {"split": "validation", "num_examples": 8, "useful": 1.0, "reward_names": ["useful"]}
    assert eval_run.eval_metrics(split) == {"eval/num_examples": 8, "eval/useful": 1.0}
    per_set = {"a": {"num_examples": 2, "useful": 1.0}, "b": {"num_examples": 2, "useful": 3.0}}
    sets = {"useful": 2.0, "sets": per_set, "overall": {"useful": 2.0, "num_examples": 4}, "max_new_tokens": 8}
    assert eval_run.eval_metrics(sets) == {"eval/useful": 2.0, "eval/num_examples": 4, "eval/a/num_examples": 2,
                                           "eval/a/useful": 1.0, "eval/b/num_examples": 2, "eval/b/useful": 3.0}
    config = as_run_config(safety.get_config())
    assert eval_run.logged_before_rl(config, sets) == {}  # a split's before-RL evaluation: eval/before_rl.json only
    assert eval_run.logged_before_rl(config.replace({"eval.sets": "DIR"}), sets) == eval_run.eval_metrics(sets)
    assert eval_run.logged_before_rl(config.replace({"eval.sets": "DIR"}), None) == {}


def test_api_bank_prompts_that_leave_no_response_token_are_named_before_generating(tmp_path):
    tokenizer = load_tokenizer(tiny_policy())
    policy = eval_run.Policy(model=None, tokenizer=tokenizer, eos_ids=[tokenizer.eos_token_id], pad_id=0, source={})
    path = data_files() / "api_bank"
    shortest = min(len(ids) for ids in eval_run.api_bank_prompts(path, tokenizer, 1, 4096).token_ids)
    with pytest.raises(EvalError, match=rf"^API-Bank {path}, example \d+ \(0-based\): the prompt has \d+ tokens, at "
                                        rf"least max_total_tokens={shortest}"):
        eval_run.evaluate_api_bank(policy, path, tmp_path, batch_size=2, max_new_tokens=8, max_examples=1,
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
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("eval.py: ")
    assert "config.json not found" in done.stderr
    done = subprocess.run([sys.executable, "eval.py", f"--workdir={tmp_path}", "--data=api_bank"], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
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
    result = eval_run.run(EvalOptions(workdir=str(trained_run), split="test", progress=False))
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
    result = eval_run.run(EvalOptions(workdir=str(trained_run), split="validation", checkpoint_step=1,
                                      max_examples=2, progress=False))
    assert writes == ["validation.jsonl", "validation.json"]
    assert json.loads((trained_run / "eval" / "validation.json").read_text())["policy"]["step"] == 1 == \
        result["policy"]["step"]
    with run_dir.lock_workdir(trained_run, "train.py"):
        with pytest.raises(run_dir.WorkdirBusyError, match=rf"{trained_run} is in use by train.py"):
            eval_run.run(EvalOptions(workdir=str(trained_run), split="validation", progress=False))


@pytest.mark.slow
def test_checkpoint_step_selects_the_parameters(trained_run):
    config = eval_run.load_run_config_or_eval_error(trained_run)
    setup = build_setup(as_run_config(config), trained_run)
    latest = _params(eval_run.policy_from_run(config, setup, trained_run, None).model)
    first = _params(eval_run.policy_from_run(config, setup, trained_run, 1).model)
    exported = _params(load_pretrained(trained_run / "policy"))
    assert all(np.array_equal(a, b) for a, b in zip(latest, exported, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, latest, strict=True))

    result = eval_run.run(EvalOptions(workdir=str(trained_run), split="validation", checkpoint_step=1,
                                      progress=False))
    assert result["policy"]["step"] == 1 and result["num_examples"] == 8
    with pytest.raises(EvalError, match=r"--checkpoint_step=7: .*available steps: \[1, 2\]"):
        eval_run.run(EvalOptions(workdir=str(trained_run), checkpoint_step=7, progress=False))


@pytest.mark.slow
def test_without_checkpoints_the_exported_policy_then_a_clear_error(trained_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    result = eval_run.run(EvalOptions(workdir=str(copy), split="test", progress=False))
    assert result["policy"] == {"model_path": str(copy / "policy")}
    shutil.rmtree(copy / "policy")
    with pytest.raises(EvalError, match="no checkpoint .* and no exported policy"):
        eval_run.run(EvalOptions(workdir=str(copy), split="test", progress=False))


@pytest.mark.slow
def test_api_bank_eval_of_a_training_run(trained_run):
    result = eval_run.run(EvalOptions(workdir=str(trained_run), data=str(data_files() / "api_bank"),
                                      max_examples=1, max_new_tokens=4, progress=False))
    _assert_api_bank_report(result, per_level=1)
    assert result["policy"]["step"] == 2 and result["max_total_tokens"] == 0  # the run's eval.max_total_tokens
    assert json.loads((trained_run / "eval" / "api_bank.json").read_text()) == result
    # Capped: each example gets at most max_total_tokens minus its prompt (the longest prompt: 1 token).
    tokenizer = load_tokenizer(trained_run / "policy")
    records = [json.loads(line) for line in (trained_run / "eval" / "api_bank.jsonl").read_text().splitlines()]
    lengths = [len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in records]
    cap = max(lengths) + 1
    capped = eval_run.run(EvalOptions(workdir=str(trained_run), data=str(data_files() / "api_bank"),
                                      max_examples=1, max_new_tokens=4, max_total_tokens=cap, progress=False))
    assert capped["max_total_tokens"] == cap
    records = [json.loads(line) for line in (trained_run / "eval" / "api_bank.jsonl").read_text().splitlines()]
    assert all(r["response_tokens"] <= min(4, cap - n) for r, n in zip(records, lengths))
    assert {r["response_tokens"] for r, n in zip(records, lengths) if n == max(lengths)} == {1}


def test_a_peft_adapter_directory_is_evaluated_on_its_base(tmp_path):
    """--model_path=ADAPTER_DIR (a run's policy_adapter/): the base its adapter_config.json names, with
    the adapters loaded (the same logits), the base's tokenizer; an adapter of a missing base is named."""
    import json as json_module

    from gd2po_jax.models.decoder import LoRASpec
    from gd2po_jax.models.lora import adapters_of, save_peft_adapter

    base = tiny_policy()
    model = load_pretrained(base, lora=LoRASpec(4, 8.0))
    for _, _, adapter in adapters_of(model):
        adapter.lora_b.set_value(adapter.lora_b[...] + 0.1)
    save_peft_adapter(model, tmp_path / "adapter", base)
    policy = eval_run.policy_from_model_path(str(tmp_path / "adapter"), "float32")
    assert policy.source == {"model_path": str(tmp_path / "adapter"), "base_model": str(base)}
    assert policy.tokenizer.vocab_size == load_tokenizer(base).vocab_size
    ids = np.array([[3, 9, 27, 81]], np.int32)
    np.testing.assert_allclose(np.asarray(policy.model(ids)), np.asarray(model(ids)), rtol=0, atol=1e-5)
    config = json_module.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (tmp_path / "adapter" / "adapter_config.json").write_text(json_module.dumps(config))
    with pytest.raises(EvalError, match=r"--model_path=.*adapter.*base_model_name_or_path"):
        eval_run.policy_from_model_path(str(tmp_path / "adapter"), "float32")
