"""configs/files.py with several rewards all the way (issue 61's "Done when"): one TRL-form function
returning two components, an async function and a plain one (three functions, four reward columns),
scored side by side, ``rl.algorithm`` an aggregator from the user's own file, 3 RL steps: metrics.jsonl has
``reward/<column>`` of each of the four and ``advantages/conflict/<a>~<b>`` of every pair, and the saved
rollouts each reward's advantage and the keep decision."""

from __future__ import annotations

import itertools
import json
import pathlib
import shutil
import textwrap

import pytest

from configs import files
from gd2po_jax.config import RunConfig, TinyModelConfig
from gd2po_jax.jobs.train import train_and_evaluate
from gd2po_jax.runtime.metrics_logging import read_metrics
from tests.fakes import REPO

pytestmark = pytest.mark.slow

REWARDS = textwrap.dedent('''
    import asyncio


    def judge(completions, answer, **kwargs):
        """One call, two criteria: the answer's digits present, and a short reply (a bool, as TRL allows)."""
        return [{"correct": float(a in c), "short": len(c.split()) <= 3} for c, a in zip(completions, answer)]


    async def polite(completions, **kwargs):
        await asyncio.sleep(0.01)  # a remote judge, awaited on the scorer's event loop
        return [1.0 if "please" in c else 0.5 * (len(c) % 2) for c in completions]


    def brevity(completions, **kwargs):
        return [max(0.0, 1.0 - len(c) / 40) for c in completions]
''')

TINY = TinyModelConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                       num_kv_heads=1, head_dim=16, seed=0)


def _user_dir(directory: pathlib.Path) -> pathlib.Path:
    from gd2po_jax.tasks.base import build_tiny_model

    rows = [{"prompt": f"Reply with {1000 + 37 * i} please.", "answer": str(1000 + 37 * i)} for i in range(8)]
    directory.mkdir(parents=True)
    (directory / "rewards.py").write_text(REWARDS)
    (directory / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    shutil.copy(REPO / "examples" / "aggregators" / "quantile_gdpo.py", directory / "my_aggregator.py")
    build_tiny_model(directory / "tiny_model", [r["prompt"] for r in rows] + [str(d) for d in range(10)], TINY,
                     TINY.vocab_size)
    return directory


def test_three_functions_four_columns_and_a_users_aggregator_train_for_three_steps(tmp_path):
    user = _user_dir(tmp_path / "user")
    config = files.get_config()
    changes = {
        "model.path": str(user / "tiny_model"), "data.train": str(user / "prompts.jsonl"),
        "rewards.functions": (f"{user / 'rewards.py'}:judge", {"fn": f"{user / 'rewards.py'}:polite", "timeout_s": 60},
                              f"{user / 'rewards.py'}:brevity"),
        "rewards.num_workers": 3, "rl.algorithm": f"{user / 'my_aggregator.py'}:quantile_gdpo",
        "train.num_steps": 3, "train.prompts_per_step": 4, "rl.num_generations": 4, "rl.micro_batch_size": 8,
        "sampling.max_new_tokens": 8, "eval.split": "none", "logging.rollouts_every": 1, "train.learning_rate": 1e-4,
    }
    for name, value in changes.items():
        section, _, field = name.rpartition(".")
        config[section][field] = value
    train_and_evaluate(RunConfig.from_config_dict(config), tmp_path / "run", progress=False)

    columns = ("judge/correct", "judge/short", "polite", "brevity")
    metrics = read_metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for step in metrics:
        for name in columns:
            assert 0.0 <= step[f"reward/{name}"] <= 1.0
            assert f"advantages/opposes_sum/{name}" in step
        for a, b in itertools.combinations(columns, 2):
            assert 0.0 <= step[f"advantages/conflict/{a}~{b}"] <= 1.0
        assert step["advantages/pre_batch_abs_mean"] >= 0.0
    assert len([k for k in metrics[0] if k.startswith("advantages/conflict/")]) == 6
    record = json.loads((tmp_path / "run" / "rollouts" / "step_3.jsonl").read_text().splitlines()[0])
    assert set(record["rewards"]) == set(record["reward_advantages"]) == set(columns)
    assert isinstance(record["keep"], bool)
