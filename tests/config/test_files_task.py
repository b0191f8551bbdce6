"""The files task's config on the RLLA data (a tiny model): the fields users fill are named when
empty, one line from train.py, and a smoke run."""

import json
import re

import pytest

from configs import safety, toolrl
from tests.config.common import error_of
from tests.fakes import (
    REPO,
    as_run_config,
    data_files,
    subprocess_env,
    tiny_policy,
)

# ----------------------------------------------------------------------------------------------
# The files task on the RLLA data (a tiny model).
# ----------------------------------------------------------------------------------------------


def _rlla() -> str:
    """The RLLA-format parquet of the tiny data sets (tests/fixture_data.py)."""
    return str(data_files() / "rlla_4k" / "test.parquet")


def test_missing_model_path_names_the_field(tmp_path):
    from gd2po_jax.tasks.setup import build_setup

    source = toolrl.get_config("qwen2.5-1.5b")
    source.data.train = source.data.validation = _rlla()
    with pytest.raises(ValueError, match=r"config\.model\.path"):
        build_setup(as_run_config(source), tmp_path)


def test_empty_data_paths_name_the_field_and_where_the_data_is_published():
    """configs/toolrl.py and configs/safety.py have no default data path (nothing outside the
    repository): a run stops at the first empty one, naming it and the public data set."""
    toolrl_values = toolrl.get_config("qwen2.5-1.5b").to_dict()
    assert re.match(r"config\.data\.train: the files task needs a training data file \(the paper's tool_calling runs "
                    r"use ToolRL's RLLA 4K, dataset/rlla_4k/train\.parquet .*github\.com/qiancheng0/ToolRL\)$",
                    error_of(toolrl_values))
    assert (toolrl_values["data"]["validation"], toolrl_values["data"]["test"]) == ("", "")
    safety_values = safety.get_config().to_dict()
    assert re.match(r"config\.data\.train: the files task needs a training data file \(the paper's reward_model runs "
                    r"use GD2PO's Alpaca prompts, safe-alignment/dataset/alpaca_prompt_only/train\.parquet .*"
                    r"github\.com/Qwen-Applications/GD2PO\)$", error_of(safety_values))
    assert (safety_values["data"]["validation"], safety_values["data"]["test"]) == ("", "")


@pytest.mark.slow
def test_an_empty_data_path_is_one_line_from_train_py(tmp_path):
    import subprocess
    import sys

    command = [sys.executable, "train.py", "--config=configs/toolrl.py:qwen2.5-1.5b", f"--workdir={tmp_path}",
               "--config.model.path=/models/qwen"]
    done = subprocess.run(command, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert re.fullmatch(r"train\.py: config\.data\.train: the files task needs a training data file \(.*"
                        r"github\.com/qiancheng0/ToolRL\)\n", done.stderr[done.stderr.rfind("train.py: "):])


@pytest.mark.slow
def test_smoke_run_with_a_tiny_model_on_rlla(tmp_path):
    from gd2po_jax.jobs.train import train_and_evaluate

    config = toolrl.get_config("qwen2.5-1.5b,correctness_length")
    config.model.path = str(tiny_policy())
    config.data.train = config.data.validation = _rlla()
    config.data.max_prompt_tokens = 4096  # the tiny tokenizer is less compact than Qwen's
    config.train.num_steps = 1
    config.train.prompts_per_step = 2  # x G=4: 8 rollouts, one per simulated device
    config.rl.num_minibatches = 1
    config.rl.micro_batch_size = 8
    config.sampling.max_new_tokens = 8
    config.eval.max_examples = 8
    config.eval.batch_size = 8
    results = train_and_evaluate(as_run_config(config), tmp_path, progress=False)

    assert results["algorithm"] == "gd2po_snr" and results["split"] == "validation"
    for phase in ("before_rl", "after_rl"):
        assert results[phase]["num_examples"] == 8
        assert 0.0 <= results[phase]["correct_acc"] <= 1.0
        assert -3.0 <= results[phase]["correctness"] <= 3.0
    (step,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert step["step"] == 1
    assert {"reward/correctness", "reward/length"} <= set(step) and "reward/format" not in step
    assert (tmp_path / "policy" / "config.json").is_file()
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model"]["dtype"] == "bfloat16" and written["model"]["remat"] == "full"
