"""Data sources (`gd2po_jax.data.sources.load_source`): files, directories and globs of files,
``save_to_disk`` folders and Hub data set ids (offline, from a cache the test writes), and the files
task reading them as training data."""

from __future__ import annotations

import json
import pathlib

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gd2po_jax.config import ConfigError
from gd2po_jax.data.loaders import DataFormatError, decode_extra_columns
from gd2po_jax.data.sources import load_source
from gd2po_jax.tasks.base import build_tiny_model
from gd2po_jax.tasks.setup import build_setup
from tests.fakes import tiny_run_config
from tests.runtime.test_hub import write_cached_repo

ANSWER = "<think> x </think>\n<response> {word} </response>"


def verl_records(words) -> list[dict]:
    """Rows as verl's RL parquet files hold them."""
    return [{"prompt": [{"role": "user", "content": f"say {w}"}], "data_source": "words",
             "reward_model": {"ground_truth": ANSWER.format(word=w), "style": "rule"}} for w in words]


def write_verl_parquet(path: pathlib.Path, words) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(verl_records(words)), path)
    return path


def test_a_file_loads_as_before(tmp_path):
    result = load_source(str(write_verl_parquet(tmp_path / "train.parquet", ["a", "b"])))
    assert result.dataset["ground_truth"] == [ANSWER.format(word="a"), ANSWER.format(word="b")]


def test_a_save_to_disk_folder_loads_and_its_row_errors_name_it(tmp_path):
    datasets.Dataset.from_list(verl_records(["a", "b", "c"])).save_to_disk(tmp_path / "saved")
    result = load_source(str(tmp_path / "saved"))
    assert result.dataset["row"] == [0, 1, 2] and result.dataset["source"] == ["words"] * 3
    bad = verl_records(["a", "b"])
    bad[1]["prompt"] = None
    datasets.Dataset.from_list(bad).save_to_disk(tmp_path / "bad")
    with pytest.raises(DataFormatError, match=rf"^{tmp_path / 'bad'}, row 1 \(0-based\), field 'prompt'"):
        load_source(str(tmp_path / "bad"))


def test_a_save_to_disk_folder_keeps_its_other_columns_as_extras(tmp_path):
    records = verl_records(["a", "b"])
    records[0] |= {"extra_info": {"index": 7, "split": "train"}, "ability": "spelling"}
    records[1] |= {"ability": "saying"}  # no extra_info: datasets fills None
    datasets.Dataset.from_list(records).save_to_disk(tmp_path / "saved")
    extras = decode_extra_columns(load_source(str(tmp_path / "saved")).dataset)
    assert extras["ability"] == ["spelling", "saying"]
    assert extras["extra_info"] == [{"index": 7, "split": "train"}, None]
    assert extras["data_source"] == ["words", "words"] and extras["reward_model"][1]["style"] == "rule"
    # A folder saved from a loaded dataset holds the loader's own columns: refused, never unpickled.
    load_source(str(tmp_path / "saved")).dataset.save_to_disk(tmp_path / "resaved")
    with pytest.raises(DataFormatError, match=r"resaved, row 0 \(0-based\), field 'row': is a reserved column name"):
        load_source(str(tmp_path / "resaved"))


def test_a_saved_dataset_dict_needs_a_split(tmp_path):
    folder = tmp_path / "dict"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(verl_records(["a", "b"])),
                          "test": datasets.Dataset.from_list(verl_records(["c"]))}).save_to_disk(folder)
    assert load_source(f"{folder}:test").dataset["ground_truth"] == [ANSWER.format(word="c")]
    with pytest.raises(DataFormatError, match=r"holds the splits \['test', 'train'\]: name one as .*dict:SPLIT"):
        load_source(str(folder))
    with pytest.raises(DataFormatError, match=r"has no split 'validation'; it has \['test', 'train'\]"):
        load_source(f"{folder}:validation")


def test_a_directory_of_parquet_shards_is_concatenated_and_errors_name_the_shard(tmp_path):
    shards = tmp_path / "shards"
    write_verl_parquet(shards / "part-0.parquet", ["a", "b"])
    write_verl_parquet(shards / "part-1.parquet", ["c"])
    (shards / "README.md").write_text("not data")
    result = load_source(str(shards))
    assert [p[0]["content"] for p in result.dataset["prompt"]] == ["say a", "say b", "say c"]
    assert result.dataset["row"] == [0, 1, 0]  # each row's index in its own file
    rows = verl_records(["d"])
    rows[0]["reward_model"] = None
    pq.write_table(pa.Table.from_pylist(verl_records(["e"]) + rows), shards / "part-2.parquet")
    with pytest.raises(DataFormatError, match=r"part-2\.parquet, row 1 \(0-based\), field 'reward_model'"):
        load_source(str(shards))
    with pytest.raises(DataFormatError, match=r"holds no data files"):
        load_source(str(tmp_path))  # no data file directly in it


def test_a_glob_of_jsonl_files(tmp_path):
    for name, words in (("a.jsonl", ["x", "y"]), ("b.jsonl", ["z"])):
        (tmp_path / name).write_text("".join(json.dumps({"prompt": f"say {w}", "extra": 1}) + "\n" for w in words))
    result = load_source(str(tmp_path / "*.jsonl"))
    assert [p[0]["content"] for p in result.dataset["prompt"]] == ["say x", "say y", "say z"]


@pytest.fixture
def offline_hub(tmp_path, monkeypatch) -> pathlib.Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets_cache"))
    return cache


def test_a_hub_data_set_id_loads_offline_from_the_cache(tmp_path, offline_hub):
    files = tmp_path / "repo"
    write_verl_parquet(files / "data" / "train-00000-of-00001.parquet", ["a", "b"])
    write_verl_parquet(files / "data" / "test-00000-of-00001.parquet", ["c"])
    write_cached_repo(offline_hub, "org/words", files, repo_type="datasets")
    assert len(load_source("org/words").dataset) == 2  # split train by default
    assert load_source("org/words:test").dataset["ground_truth"] == [ANSWER.format(word="c")]
    with pytest.raises(FileNotFoundError, match=r"^config\.data\.train: 'org/absent' is not in the Hugging Face cache "
                                                r".*hf download org/absent --repo-type dataset$"):
        load_source("org/absent", what="config.data.train")


def test_a_missing_file_is_not_looked_up_on_the_hub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^config\.data\.train: 'data/train\.parquet' does not exist; give a "
                                                r"data file, a directory or glob"):
        load_source("data/train.parquet", what="config.data.train")


def test_the_files_task_trains_on_a_saved_folder_and_a_parquet_directory(tmp_path):
    words = ["apple", "river", "stone", "cloud", "maple", "tiger", "ember", "quartz"]
    datasets.Dataset.from_list(verl_records(words)).save_to_disk(tmp_path / "train_saved")
    write_verl_parquet(tmp_path / "validation" / "part-0.parquet", words[:3])
    write_verl_parquet(tmp_path / "validation" / "part-1.parquet", words[3:5])
    corpus = [f"say {w}" for w in words] + [ANSWER.format(word=w) for w in words]
    model = build_tiny_model(tmp_path / "model", corpus, tiny_run_config().model.tiny, vocab_size=300)
    config = tiny_run_config(task="files", model__path=str(model), data__train=str(tmp_path / "train_saved"),
                             data__validation=str(tmp_path / "validation"), data__test="", sft__enabled=False)
    setup = build_setup(config, tmp_path / "run")
    assert len(setup.train) == 8 and len(setup.evals["validation"]) == 5
    assert setup.train.columns["ground_truth"][0] == ANSWER.format(word="apple")
    missing = tiny_run_config(task="files", model__path=str(model), data__train=str(tmp_path / "nothing.parquet"),
                              sft__enabled=False)
    with pytest.raises(ConfigError, match=r"^config\.data\.train: '.*nothing\.parquet' does not exist"):
        build_setup(missing, tmp_path / "run2")
