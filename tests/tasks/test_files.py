"""gd2po_jax/tasks/files.py: which of a JSONL row's schema columns the files task reads (and so types), and
the message that names it; every other column is the user's own, of any type."""

from __future__ import annotations

import json

import pytest

from gd2po_jax.data.schema import DataFormatError, dataset_columns
from gd2po_jax.tasks.files import load_file, read_columns
from tests.fakes import REPO, as_run_config


def _config(**changes):
    from configs import files

    config = files.get_config()
    config.model.path, config.data.train = "m", "d.jsonl"
    config.rewards.functions = (f"{REPO / 'examples' / 'own_task' / 'rewards.py'}:brevity",)
    for name, value in changes.items():
        section, field = name.split("__")
        config[section][field] = value
    return as_run_config(config)


def test_the_files_task_reads_target_for_the_warm_start_and_ground_truth_for_a_family():
    assert set(read_columns(_config(), "data.train")) == {"target"}  # sft.enabled: the warm start's data
    assert read_columns(_config(), "data.validation") == {}  # the warm start does not read it
    assert read_columns(_config(sft__enabled=False), "data.train") == {}
    assert set(read_columns(_config(rewards__kind="tool_calling", rewards__names=("correctness",)), "data.test")) \
        == {"ground_truth"}


def test_a_wrong_type_where_the_task_reads_it_names_the_task_else_any_type_is_yours(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "p", "target": 7, "ground_truth": {"a": 1}, "level": "hard"}) + "\n")
    with pytest.raises(DataFormatError, match=r"field 'target': expected a string, got int; the files task's warm "
                                              r"start \(config\.sft\.enabled\) reads it as the text to imitate"):
        load_file(str(path), _config(), "data.train")
    dataset = load_file(str(path), _config(sft__enabled=False), "data.train")  # nothing reads them: yours
    columns = dataset_columns(dataset)
    assert columns["target"] == [7] and columns["ground_truth"] == [{"a": 1}] and columns["level"] == ["hard"]
    assert "source" not in columns
