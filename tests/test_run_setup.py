"""gd2po_jax.run_setup: what a run is made of is checked before anything is computed — a model
directory that does not exist, data rows the reward could never score, an evaluation split the
data does not have — with errors naming the field, the file and the row."""

import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from configs import toolrl
from gd2po_jax.config import ConfigError, RunConfig, as_run_config
from gd2po_jax.data.loaders import DataFormatError
from gd2po_jax.models.pretrained import load_pretrained
from gd2po_jax.rewards.base import build_reward_function
from gd2po_jax.run_setup import eval_split, load_splits
from tests.fakes import tiny_config


def _files_config(tmp_path, **changes) -> RunConfig:
    """configs/toolrl.py on the RLLA file, with an (empty) existing model directory and ``changes``
    (dotted names with "__" for ".")."""
    config = toolrl.get_config("qwen2.5-1.5b")
    config.model.path = str(tmp_path)
    for name, value in changes.items():
        *parents, field = name.split("__")
        node = config
        for parent in parents:
            node = node[parent]
        node[field] = value
    return as_run_config(config)


def _reward_fn(config):
    return build_reward_function({"kind": config.rewards.kind, "names": config.rewards.names})


def _with_bad_ground_truths(shared_dir, tmp_path, bad: dict[int, str | None]):
    """A copy of the RLLA parquet whose rows ``bad`` have those ground truths."""
    rows = pq.read_table(shared_dir / "data" / "rlla_4k" / "test.parquet").to_pylist()
    for row, ground_truth in bad.items():
        rows[row]["reward_model"]["ground_truth"] = ground_truth
    path = tmp_path / "bad_ground_truth.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


# ---------------------------------------------------------------- ground truths, when loaded


def test_a_ground_truth_the_reward_cannot_parse_is_found_when_the_data_is_loaded(shared_dir, tmp_path):
    unparseable = "<think> x </think>\n<tool_call>\n{\"name\": \"GetNews\", \n</tool_call>"
    not_a_call = "<think> x </think>\n<tool_call>\n[1, 2]\n</tool_call>"
    path = _with_bad_ground_truths(shared_dir, tmp_path, {4: unparseable, 9: not_a_call})
    config = _files_config(tmp_path, data__train=path, data__validation="", data__test="")
    with pytest.raises(DataFormatError, match=r"bad_ground_truth\.parquet, row 4 \(0-based\), field 'ground_truth': "
                                              r"ground truth has a <tool_call> block that is not one JSON object "
                                              r"per line.*\(1 more rows like it\).*on_error='skip'") as info:
        load_splits(config, tmp_path / "run", _reward_fn(config))
    assert (info.value.path, info.value.row) == (path, 4)

    skipping = _files_config(tmp_path, data__train=path, data__validation=path, data__test="", data__on_error="skip")
    splits, _ = load_splits(skipping, tmp_path / "run", _reward_fn(skipping))
    for split in ("train", "validation"):
        rows = splits[split]["row"]
        assert len(rows) == 78 and 4 not in rows and 9 not in rows


def test_rows_without_a_ground_truth_cannot_train_a_tool_calling_reward(shared_dir, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "hi", "ground_truth": "<response> hi </response>"}\n{"prompt": "no truth"}\n')
    config = _files_config(tmp_path, data__train=str(path), data__validation="", data__test="")
    with pytest.raises(DataFormatError, match=r"prompts\.jsonl, row 1 \(0-based\), field 'ground_truth': the "
                                              r"tool_calling reward needs a ground-truth text, the row has none"):
        load_splits(config, tmp_path / "run", _reward_fn(config))
    config = _files_config(tmp_path, data__train=str(path), data__validation="", data__test="", data__on_error="skip")
    path.write_text('{"prompt": "no truth"}\n')
    with pytest.raises(DataFormatError, match=r"prompts\.jsonl: no usable rows: the reward 'tool_calling' cannot "
                                              r"score any of the 1 rows"):
        load_splits(config, tmp_path / "run", _reward_fn(config))


# ---------------------------------------------------------------- the model directory


@pytest.mark.parametrize("field", ["model__path", "model__tokenizer_path"])
def test_a_model_path_that_does_not_exist_says_so_and_downloads_nothing(tmp_path, monkeypatch, field):
    monkeypatch.chdir(tmp_path)  # "Qwen/Qwen2.5-3B-Instruct" is a relative path that does not exist
    config = _files_config(tmp_path, **{field: "Qwen/Qwen2.5-3B-Instruct"})
    dotted = field.replace("__", ".")
    with pytest.raises(ConfigError, match=rf"^config\.{dotted}: 'Qwen/Qwen2.5-3B-Instruct' does not exist; it must "
                                          r"be a local Hugging Face model directory.*Nothing is downloaded"):
        load_splits(config, tmp_path / "run", _reward_fn(config))
    # The embedded task too, when it is given a model.
    synthetic = as_run_config(tiny_config(**{field: str(tmp_path / "missing")}))
    with pytest.raises(ConfigError, match=rf"^config\.{dotted}: .*missing' does not exist"):
        load_splits(synthetic, tmp_path / "run")


def test_load_pretrained_names_a_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^model directory: 'org/name' does not exist.*Nothing is downloaded"):
        load_pretrained("org/name")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"file' is a file, not a directory"):
        load_pretrained(tmp_path / "file")


# ---------------------------------------------------------------- the evaluation split


def test_eval_split_must_be_a_split_the_data_has(tmp_path):
    with pytest.raises(ConfigError, match=r"^config\.eval\.split: 'valdation' is not one of \('validation', "
                                          r"'test', 'none'\)"):
        as_run_config(tiny_config(eval__split="valdation"))
    setup = types.SimpleNamespace(evals={"validation": object()})
    files = _files_config(tmp_path, data__test="", eval__split="test")
    with pytest.raises(ConfigError, match=r"^config\.eval\.split: the data has no 'test' split \(config\.data\.test is "
                                          r"empty\); choose one of \['validation', 'none'\]"):
        eval_split(files, setup)
    synthetic = as_run_config(tiny_config(eval__split="test", data__synthetic__num_test=0))
    with pytest.raises(ConfigError, match=r"no 'test' split \(data\.synthetic\.num_test=0\)"):
        eval_split(synthetic, setup)
    assert eval_split(files.replace({"eval.split": "validation"}), setup) == "validation"
    assert eval_split(files.replace({"eval.split": "none"}), setup) is None


@pytest.mark.slow
def test_the_trainer_checks_the_eval_split_before_the_warm_start(tmp_path):
    from gd2po_jax.trainer import train_and_evaluate

    config = tiny_config(eval__split="test", data__synthetic__num_test=0)
    with pytest.raises(ConfigError, match=r"config\.eval\.split: the data has no 'test' split"):
        train_and_evaluate(config, tmp_path, progress=False)
    assert not (tmp_path / "warm_start").exists() and not (tmp_path / "config.json").exists()
