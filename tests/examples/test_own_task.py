"""examples/own_task end to end, as a user runs it: the example's reward file and JSONL copied outside
the repository, the command of docs/own_task.md (configs/files.py, ``rewards.functions`` by module name
from the working directory) against a local model directory; then the same model by Hub id from an
offline cache, the data as a ``save_to_disk`` folder and the functions by file path. Shrunk to a few
steps: what is checked is that every piece reaches the run, not what it learns."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil
import subprocess
import sys

import datasets
import pytest

from configs import files
from gd2po_jax.jobs.train import train_and_evaluate
from gd2po_jax.runtime.metrics_logging import read_metrics
from tests.fakes import REPO, as_run_config, subprocess_env, with_changes
from tests.runtime.test_hub import offline_cache, write_cached_repo  # noqa: F401 - a fixture
from tests.xla_env import xla_flags

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "own_task"
SHRUNK = {"train.num_steps": 2, "train.prompts_per_step": 4, "sft.num_steps": 4, "sft.batch_size": 4,
          "sampling.max_new_tokens": 12, "eval.max_examples": 8, "eval.batch_size": 8, "logging.rollouts_every": 1,
          "train.learning_rate": 3e-4}


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> pathlib.Path:
    """A user's directory: the example's files and the tiny model its make_tiny_model.py builds."""
    directory = tmp_path_factory.mktemp("user")
    for name in ("rewards.py", "prompts.jsonl", "validation.jsonl", "make_tiny_model.py"):
        shutil.copy(EXAMPLE / name, directory / name)
    spec = importlib.util.spec_from_file_location("make_tiny_model", directory / "make_tiny_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(str(directory / "tiny_model"))
    return directory


def _rollouts(workdir: pathlib.Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (workdir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]


def test_the_documented_command_trains_the_example_with_its_two_rewards(user_dir):
    overrides = [f"--config.{name}={value}" for name, value in SHRUNK.items()]
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), f"--config={REPO / 'configs' / 'files.py'}",
         "--config.model.path=tiny_model", "--config.data.train=prompts.jsonl",
         "--config.data.validation=validation.jsonl",
         "--config.rewards.functions=rewards:brevity,rewards:digits", "--workdir=runs/own_task", *overrides],
        cwd=user_dir, env=subprocess_env(XLA_FLAGS=xla_flags(1)), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    workdir = user_dir / "runs" / "own_task"
    metrics = read_metrics(workdir)
    assert [m["step"] for m in metrics] == [1, 2]
    for step in metrics:
        assert 0.0 <= step["reward/brevity"] <= 1.0 and 0.0 <= step["reward/digits"] <= 1.0
        assert 0.0 <= step["advantages/conflict_ratio"] <= 1.0
    records = _rollouts(workdir, 2)
    assert len(records) == 4 * 4 and {"brevity", "digits"} <= set(records[0]["rewards"])
    results = json.loads((workdir / "results.json").read_text())
    assert results["after_rl"]["reward_names"] == ["brevity", "digits"]
    assert "brevity" in proc.stdout and "digits" in proc.stdout  # the before/after table


def test_a_hub_id_a_save_to_disk_folder_and_a_file_path_work_the_same(user_dir, offline_cache, tmp_path,  # noqa: F811
                                                                       monkeypatch):
    write_cached_repo(offline_cache, "me/tiny-own", user_dir / "tiny_model")
    saved = tmp_path / "saved"
    datasets.load_dataset("json", data_files=str(user_dir / "prompts.jsonl"), split="train").save_to_disk(str(saved))
    monkeypatch.chdir(tmp_path)  # not the rewards' directory: they are found by their path
    changes = {**SHRUNK, "model.path": "me/tiny-own", "data.train": str(saved), "eval.split": "none",
               "rewards.functions": (f"{user_dir / 'rewards.py'}:digits", {"fn": f"{user_dir / 'rewards.py'}:brevity",
                                                                          "weight": 0.5})}
    config = as_run_config(with_changes(files.get_config(), {k.replace(".", "__"): v for k, v in changes.items()}))
    train_and_evaluate(config, tmp_path / "run", progress=False)
    metrics = read_metrics(tmp_path / "run")
    assert {"reward/digits", "reward/brevity"} <= set(metrics[-1])
    record = _rollouts(tmp_path / "run", 1)[0]
    assert set(record["rewards"]) == {"digits", "brevity"}
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["path"] == "me/tiny-own"


def test_make_tiny_model_runs_from_the_example_directory_of_a_checkout(tmp_path):
    """The example's README runs ``python make_tiny_model.py tiny_model`` in examples/own_task/ of a clone,
    where gd2po_jax is not installed: the script finds the checkout's package (no PYTHONPATH given)."""
    env = subprocess_env(XLA_FLAGS=xla_flags(1))
    env["PYTHONPATH"] = str(REPO / "tests" / "runtime_install")  # test-only modules hidden; the checkout not on it
    proc = subprocess.run([sys.executable, "make_tiny_model.py", str(tmp_path / "tiny_model")], cwd=EXAMPLE, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "tiny_model" / "config.json").is_file() and (tmp_path / "tiny_model" / "tokenizer.json").is_file()
