"""RL learns: a short seeded run of the whole trainer whose correctness reward rises.

The task is the smallest one where the correctness reward has something clear to teach: one tool,
requests in eight phrasings, and the same right call for all of them. Half of the demonstrations of
every phrasing leave out the call's last parameter (the synthetic task's "habit"), so the warm-started
policy samples the complete call about half of the time, and the correctness reward (3 for the
complete call, 0.75 without the parameter) is the only thing that tells the two apart. RL with the
default algorithm and rewards must raise the sampled correctness reward within 10 steps.
"""

import json
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gd2po_jax.data.corpus_tokenizer import build_tokenizer
from gd2po_jax.models import Decoder, save_pretrained
from gd2po_jax.runtime.metrics_logging import read_metrics
from tests.fakes import REPO, subprocess_env, tiny_model_config
from tests.xla_env import xla_flags

SYSTEM = (
    "You are a helpful assistant that can call tools.\n\n**Available Tools**\n1. Name: get_weather\n"
    'Description: Weather forecast for a city.\nParameters: {"city": {"type": "string"}, "unit": {"type": "string"}}'
)
REQUESTS = (
    "What's the weather in Oslo?", "Give me the Oslo forecast.", "How warm is it in Oslo?",
    "Is it raining in Oslo?", "Oslo weather please.", "Tell me the forecast for Oslo.",
    "Will it be sunny in Oslo?", "Weather for Oslo today?",
)


def answer(parameters: dict) -> str:
    call = json.dumps({"name": "get_weather", "parameters": parameters})
    return f"<think> The user wants the weather. </think>\n<tool_call>\n{call}\n</tool_call>"


COMPLETE = answer({"city": "Oslo", "unit": "celsius"})
HABIT = answer({"city": "Oslo"})


def write_task(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A JSONL data file (64 rows: every phrasing 8 times, half with the habit) and a random
    2-layer Qwen2 with a tokenizer trained on the task's text."""
    rows = [
        {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": REQUESTS[i % 8]}],
         "ground_truth": COMPLETE, "target": COMPLETE if (i // 8) % 2 else HABIT}
        for i in range(64)
    ]
    data = directory / "weather.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tokenizer = build_tokenizer([SYSTEM, *REQUESTS, COMPLETE, HABIT], 400)
    config = tiny_model_config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, head_dim=16,
                               tie_word_embeddings=True, max_position_embeddings=1024)
    model_dir = directory / "model"
    save_pretrained(Decoder(config, dtype=jnp.float32, rngs=nnx.Rngs(0)), model_dir, tokenizer=tokenizer)
    return data, model_dir


CONFIG = """
import sys
sys.path.insert(0, {repo!r})
from configs.default import get_config as default_config


def get_config():
    config = default_config()  # GD2PO-SNR on correctness, format and the conditioned length reward
    config.task = "files"
    config.model.path = {model!r}
    config.data.train = config.data.validation = {data!r}
    config.sft.update(num_steps=150, batch_size=16, learning_rate=1e-2)
    config.train.update(num_steps=10, prompts_per_step=8, learning_rate=1e-3)
    config.rl.num_generations = 8
    config.rewards.max_think_words = 6
    config.sampling.update(max_new_tokens=64, temperature=1.0)  # its bounds were measured at temperature 1
    config.eval.update(max_examples=16, batch_size=8)
    return config
"""


@pytest.mark.slow
def test_rl_raises_the_correctness_reward(tmp_path):
    data, model_dir = write_task(tmp_path)
    config_file = tmp_path / "config.py"
    config_file.write_text(CONFIG.format(repo=str(REPO), model=str(model_dir), data=str(data)))
    workdir = tmp_path / "run"
    # One CPU device: this is about learning, not sharding, and 8 simulated devices on 2 cores
    # would make the run several times slower.
    env = subprocess_env(XLA_FLAGS=xla_flags(1))
    proc = subprocess.run([sys.executable, str(REPO / "train.py"), f"--config={config_file}", f"--workdir={workdir}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    correctness = np.array([r["reward/correctness"] for r in read_metrics(workdir)])
    assert len(correctness) == 10
    first, last = correctness[:4].mean(), correctness[-4:].mean()
    # The warm start samples the complete call about half of the time (mean correctness near
    # (3 + 0.75) / 2); RL must move it clearly towards 3.
    assert 1.2 < first < 2.6, correctness
    assert last > first + 0.3, correctness
    results = json.loads((workdir / "results.json").read_text())
    assert results["after_rl"]["correctness"] >= results["before_rl"]["correctness"]
