"""Tasks as plug-ins (`gd2po_jax.tasks.base`): the registry, its errors, and a task defined here, outside
the package, trained end to end by the trainer that knows it only through the interface."""

from __future__ import annotations

import json
import pathlib
import pickle

import pytest

from gd2po_jax.config import ConfigError
from gd2po_jax.data.loaders import FEATURES, decode_extra_columns
from gd2po_jax.tasks import NoHabitsError, Task, register_task, registered_tasks, task_named, task_of
from gd2po_jax.tasks.base import build_tiny_model, dataset_splits
from tests.fakes import tiny_run_config

WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "ember", "quartz")


def echo_rows(split: str, count: int, offset: int) -> list[dict]:
    """Rows of the echo task: "say WORD" answered by a plain ToolRL response naming the word."""
    rows = []
    for i in range(count):
        word = WORDS[(i + offset) % len(WORDS)]
        answer = f"<think> say {word} </think>\n<response> {word} </response>"
        rows.append({"prompt": [{"role": "user", "content": f"say {word}"}], "ground_truth": answer,
                     "target": answer, "level": 0, "source": "echo", "row": i})
    return rows


class EchoTask(Task):
    """A toy task: prompts generated here, a tiny random model built from their words, and hooks
    that leave a trace (the evaluation summary, the results table)."""

    calls: list[str] = []

    def check_config(self, config):
        if config.data.max_prompt_tokens < 8:
            raise ConfigError("config.data.max_prompt_tokens: the echo task needs at least 8")

    def load_splits(self, config, workdir):
        self.calls.append("load_splits")
        splits = dict(dataset_splits({"train": echo_rows("train", 16, 0), "validation": echo_rows("validation", 8, 3)}))
        corpus = [message["content"] for row in splits["train"] for message in row["prompt"]]
        corpus += list(splits["train"]["target"])
        model = build_tiny_model(pathlib.Path(workdir) / "base_model", corpus, config.model.tiny, vocab_size=300)
        return splits, model

    def prepare(self, config, workdir, *, progress=True):
        self.calls.append(f"prepare(progress={progress})")
        return config

    def eval_summary(self, config, summary):
        return {**summary, "echo": "evaluated by the echo task"}

    def results_table(self, config, results):
        return "echo results: " + super().results_table(config, results)


def test_a_registered_task_is_looked_up_by_name_and_checked():
    register_task("echo_lookup")(EchoTask)
    assert "echo_lookup" in registered_tasks()
    assert {"synthetic_tools", "safety_embedded", "files"} <= set(registered_tasks())
    task = task_of(tiny_run_config(task="echo_lookup"))
    assert isinstance(task, EchoTask) and task.name == "echo_lookup"
    with pytest.raises(ConfigError, match=r"^config\.data\.max_prompt_tokens: the echo task needs at least 8"):
        task_of(tiny_run_config(task="echo_lookup", data__max_prompt_tokens=4))


def test_an_unknown_task_is_named_with_the_registered_ones():
    with pytest.raises(ConfigError, match=r"^config\.task: 'web' is not a registered task; registered: .*files.*"
                                          r"synthetic_tools.*; a task of your own: module:object or "
                                          r"path/to/file\.py:object"):
        task_of(tiny_run_config(task="web"))


def test_a_task_of_your_own_is_found_by_its_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_tasks.py").write_text(
        "from gd2po_jax.tasks import Task\n\n"
        "class MyTask(Task):\n    def load_splits(self, config, workdir):\n        return {}, workdir\n\n"
        "INSTANCE = MyTask()\nNOT_A_TASK = 3\n")
    monkeypatch.chdir(tmp_path)
    task = task_of(tiny_run_config(task="my_tasks:MyTask"))
    assert type(task).__name__ == "MyTask" and task.name == "my_tasks:MyTask"
    assert task_of(tiny_run_config(task="my_tasks:MyTask")) is task  # registered once, then looked up
    assert task_of(tiny_run_config(task=f"{tmp_path / 'my_tasks.py'}:INSTANCE")).name.endswith("my_tasks.py:INSTANCE")
    with pytest.raises(ConfigError, match=r"^config\.task \('my_tasks:NOT_A_TASK'\): 'NOT_A_TASK' in .*my_tasks\.py "
                       r"is a int, not a gd2po_jax\.tasks\.Task subclass or instance"):
        task_of(tiny_run_config(task="my_tasks:NOT_A_TASK"))
    with pytest.raises(ConfigError, match=r"^config\.task \('my_tasks:Other'\): .*my_tasks\.py has no 'Other'; "
                       r"it defines MyTask"):
        task_of(tiny_run_config(task="my_tasks:Other"))


def test_only_tasks_register():
    with pytest.raises(TypeError, match=r"register_task\('x'\): .* is not a gd2po_jax\.tasks\.Task"):
        register_task("x")(object)


def test_the_evaluation_hooks_default_to_nothing_and_a_task_without_habits_says_so_in_one_line():
    """What eval.py asks a task (`Task.split_table_extra`, `Task.habit_breakdown`, `Task.habit_table`):
    no extra lines by default, and no habits, in one line naming the tasks that have them (eval.py
    prints it after ``--habits: <config.json>``)."""
    register_task("echo_hooks")(EchoTask)
    config = tiny_run_config(task="echo_hooks")
    task = task_of(config)
    assert task.split_table_extra(config, {"split": "test", "num_examples": 8}) == ""
    with pytest.raises(NoHabitsError, match=r"^has task 'echo_hooks', which has no habit breakdown \(tasks with "
                                            r"one: .*synthetic_tools.*\)$") as raised:
        task.habit_breakdown(config, ["test"], lambda name: pytest.fail("no generations are read"))
    assert "\n" not in str(raised.value)
    assert task.habit_table(config, {"test": {"rows": 2}}) == 'test: {"rows": 2}'
    assert task_named("echo_hooks") is task  # the same task, its config unchecked
    with pytest.raises(ConfigError, match=r"^config\.task: 'web' is not a registered task"):
        task_named("web")


def test_dataset_splits_are_typed_even_when_empty():
    splits = dataset_splits({"train": echo_rows("train", 2, 0), "test": []})
    assert len(splits["train"]) == 2 and len(splits["test"]) == 0
    assert splits["test"].features == splits["train"].features


def test_generated_rows_may_leave_out_the_prompt_text_and_extra_columns():
    rows = echo_rows("train", 2, 0)
    rows[1] |= {"prompt_text": "say river", "extra_columns": pickle.dumps({"word": "river"})}
    train = dataset_splits({"train": rows})["train"]
    assert train.features == FEATURES and train["prompt_text"] == [None, "say river"]
    assert decode_extra_columns(train) == {"word": [None, "river"]}
    with pytest.raises(KeyError, match="ground_truth"):  # the other columns stay required
        dataset_splits({"train": [{k: v for k, v in rows[0].items() if k != "ground_truth"}]})


@pytest.mark.slow
def test_a_task_defined_outside_the_package_trains_for_two_steps(tmp_path):
    from gd2po_jax.jobs.train import train_and_evaluate

    register_task("echo")(EchoTask)
    EchoTask.calls.clear()
    config = tiny_run_config(task="echo", sft__enabled=False, train__num_steps=2, train__log_every=1,
                             rewards__names=("correctness", "format"), eval__max_examples=8)
    results = train_and_evaluate(config, tmp_path, progress=False)

    assert EchoTask.calls == ["load_splits", "prepare(progress=True)", "prepare(progress=False)"]
    assert results["steps"] == 2 and results["split"] == "validation"
    assert results["after_rl"]["echo"] == "evaluated by the echo task"  # the task's evaluation hook
    assert results["after_rl"]["num_examples"] == 8
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert json.loads((tmp_path / "config.json").read_text())["task"] == "echo"
    assert (tmp_path / "policy" / "config.json").is_file()
