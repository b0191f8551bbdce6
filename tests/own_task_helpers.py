"""A user's own task, as issue 62 describes one: TRL-form reward functions in a file of the user's, no
built-in reward family, JSONL prompts with columns of the user's own and no ``target`` column, a tiny
random model. Shared by the tests of what comes after training (eval.py --data, report.py, the columns
reward functions receive, the end-to-end sweep)."""

from __future__ import annotations

import json
import pathlib

from gd2po_jax.config import RunConfig, TinyModelConfig

REWARDS = '''
import json, os


def brevity(completions, **kwargs):
    """TRL's form: 1 for an empty reply, falling to 0 at 12 words; records the keyword arguments it got."""
    log = os.environ.get("OWN_TASK_KWARGS_LOG")
    if log:
        with open(log, "a") as file:
            file.write(json.dumps(sorted(kwargs)) + "\\n")
    return [max(0.0, 1.0 - len(_text(c).split()) / 12) for c in completions]


def digits(completions, answer, **kwargs):
    """The share of the answer's digits the reply has in the right places."""
    scores = []
    for completion, wanted in zip(completions, answer):
        got = "".join(ch for ch in _text(completion) if ch.isdigit())
        wanted = str(wanted)
        scores.append(sum(a == b for a, b in zip(got, wanted)) / max(len(wanted), len(got), 1))
    return scores


def _text(completion):
    return completion if isinstance(completion, str) else completion[-1]["content"]
'''

TINY = TinyModelConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                       num_kv_heads=1, head_dim=16, seed=0)


def rows(count: int, offset: int = 0) -> list[dict]:
    """Prompts with the user's own columns: ``answer`` (str), ``ground_truth`` (an int), ``meta`` (a dict),
    ``level`` (a word): none is a column the task reads, and there is no ``target``."""
    return [{"prompt": f"Reply with {1000 + 37 * (i + offset)} in digits.", "answer": str(1000 + 37 * (i + offset)),
             "ground_truth": i + offset, "meta": {"id": i + offset, "tags": ["x"]}, "level": "hard"}
            for i in range(count)]


def write_user_dir(directory: pathlib.Path) -> pathlib.Path:
    """``directory`` with rewards.py, prompts.jsonl (8 rows), val.jsonl (4 rows) and tiny_model/."""
    from gd2po_jax.tasks.base import build_tiny_model

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "rewards.py").write_text(REWARDS)
    for name, data in (("prompts.jsonl", rows(8)), ("val.jsonl", rows(4, offset=50))):
        (directory / name).write_text("".join(json.dumps(row) + "\n" for row in data))
    corpus = [row["prompt"] for row in rows(8) + rows(4, offset=50)] + [str(d) for d in range(10)]
    build_tiny_model(directory / "tiny_model", corpus, TINY, TINY.vocab_size)
    return directory


def own_task_changes(directory: pathlib.Path) -> dict:
    """configs/files.py's fields for the user's task in ``directory``, shrunk to seconds."""
    return {
        "model.path": str(directory / "tiny_model"),
        "data.train": str(directory / "prompts.jsonl"),
        "data.test": str(directory / "val.jsonl"),
        "rewards.functions": (f"{directory / 'rewards.py'}:brevity", f"{directory / 'rewards.py'}:digits"),
        "train.num_steps": 2,
        "train.prompts_per_step": 4,
        "rl.num_generations": 4,
        "rl.micro_batch_size": 8,
        "sampling.max_new_tokens": 8,
        "eval.max_examples": 8,
        "eval.batch_size": 8,
        "checkpoint.every_steps": 1,
        "train.learning_rate": 1e-4,
    }


def own_task_config(directory: pathlib.Path, **changes) -> RunConfig:
    """configs/files.py for the user's task in ``directory`` (`own_task_changes`), with ``changes``
    (dotted names)."""
    from configs import files

    config = files.get_config()
    for name, value in {**own_task_changes(directory), **changes}.items():
        section, _, field = name.rpartition(".")
        node = config
        for part in section.split("."):
            node = node[part]
        node[field] = value
    return RunConfig.from_config_dict(config)


def override_flags(directory: pathlib.Path, **changes) -> list[str]:
    """`own_task_changes` (and ``changes``) as train.py / sweep.py ``--config.<field>=value`` flags."""
    flags = []
    for name, value in {**own_task_changes(directory), **changes}.items():
        text = ",".join(value) if isinstance(value, tuple) else str(value)
        flags.append(f"--config.{name}={text}")
    return flags
