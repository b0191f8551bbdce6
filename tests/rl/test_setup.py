"""gd2po_jax.rl.setup: what a run is made of is checked before anything is computed — a model
directory that does not exist, data rows the reward could never score, an evaluation split the
data does not have — with errors naming the field, the file and the row."""

import types

import jax
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from configs import safety, toolrl
from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.data.loaders import DataFormatError
from gd2po_jax.models.pretrained import load_pretrained
from gd2po_jax.rewards.base import build_reward_function
from gd2po_jax.rewards.reward_model import RewardModelReward
from gd2po_jax.rl.setup import build_setup, eval_split, load_splits, reward_spec
from gd2po_jax.tasks import task_of
from tests.fakes import as_run_config, tiny_config, tiny_safety_policy, tiny_score_model_dir


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


def _usable_splits(config: RunConfig, workdir, reward_fn):
    """The splits as `build_setup` has them: loaded, then checked against the reward function."""
    splits, _ = load_splits(config, workdir)
    return task_of(config).usable_rows(config, splits, reward_fn)


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
        _usable_splits(as_run_config(config), tmp_path / "run", _reward_fn(config))
    assert (info.value.path, info.value.row) == (path, 4)

    skipping = _files_config(tmp_path, data__train=path, data__validation=path, data__test="", data__on_error="skip")
    splits = _usable_splits(as_run_config(skipping), tmp_path / "run", _reward_fn(skipping))
    for split in ("train", "validation"):
        rows = splits[split]["row"]
        assert len(rows) == 78 and 4 not in rows and 9 not in rows


def test_rows_without_a_ground_truth_cannot_train_a_tool_calling_reward(shared_dir, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "hi", "ground_truth": "<response> hi </response>"}\n{"prompt": "no truth"}\n')
    config = _files_config(tmp_path, data__train=str(path), data__validation="", data__test="")
    with pytest.raises(DataFormatError, match=r"prompts\.jsonl, row 1 \(0-based\), field 'ground_truth': the "
                                              r"tool_calling reward needs a ground-truth text, the row has none"):
        _usable_splits(as_run_config(config), tmp_path / "run", _reward_fn(config))
    config = _files_config(tmp_path, data__train=str(path), data__validation="", data__test="", data__on_error="skip")
    path.write_text('{"prompt": "no truth"}\n')
    with pytest.raises(DataFormatError, match=r"prompts\.jsonl: no usable rows: the reward 'tool_calling' cannot "
                                              r"score any of the 1 rows"):
        _usable_splits(as_run_config(config), tmp_path / "run", _reward_fn(config))


# ---------------------------------------------------------------- reward models


def _safety_config(shared_dir, **changes) -> RunConfig:
    """configs/safety.py on the Alpaca test prompts with the tiny policy and score models (the
    harmless one with a plain-text template), 8 rows per reward-model batch, and ``changes``."""
    config = safety.get_config()
    alpaca = str(shared_dir / "data" / "safe_alignment" / "alpaca_test.parquet")
    config.model.path, config.data.train = str(tiny_safety_policy(shared_dir)), alpaca
    for name, (layout, template) in {"useful": ("amo", "chatml"), "harmless": ("beaver", "plain")}.items():
        config.rewards.reward_models[name].update(path=str(tiny_score_model_dir(shared_dir, layout, template)),
                                                  batch_size=8, dtype="float32")
    for name, value in changes.items():
        *parents, field = name.split("__")
        node = config
        for parent in parents:
            node = node[parent]
        node[field] = value
    return as_run_config(config)


def test_the_reward_spec_is_made_per_kind(shared_dir, tmp_path):
    tool_calling = _files_config(tmp_path)
    assert reward_spec(tool_calling) == {"kind": "tool_calling", "names": ("correctness", "format", "length"),
                                         "max_think_words": 512, "conditional_length": False}
    config = _safety_config(shared_dir)
    tokenizer = object()
    spec = reward_spec(config, tokenizer=tokenizer, eos_ids=[2], mesh="mesh")
    assert spec["reward_models"]["harmless"] == config.rewards.reward_models["harmless"].to_dict()
    assert (spec["kind"], spec["names"], spec["offload"]) == ("reward_model", ("useful", "harmless"), False)
    assert (spec["policy_tokenizer"], spec["policy_eos_ids"], spec["mesh"]) == (tokenizer, [2], "mesh")
    missing = _safety_config(shared_dir, rewards__reward_models__useful__path=str(tmp_path / "none"))
    with pytest.raises(ConfigError, match=r"^config\.rewards\.reward_models\.useful\.path: .*none' does not exist"):
        reward_spec(missing)


def test_a_reward_model_run_loads_prompt_only_data_and_its_reward_models_on_the_mesh(shared_dir, tmp_path):
    setup = build_setup(as_run_config(_safety_config(shared_dir, eval__max_examples=4)), tmp_path)
    assert isinstance(setup.reward_fn, RewardModelReward) and setup.reward_fn.names == ("useful", "harmless")
    assert setup.reward_fn.fast == {"useful": True, "harmless": False}  # the policy's tokenizer: no re-rendering
    assert len(setup.train) == 512 and len(setup.evals["validation"]) == 4  # no ground truth needed
    assert setup.train.columns["prompt"][0][0]["role"] == "user"
    params = setup.reward_fn.models["harmless"]._state
    assert {leaf.sharding.mesh for leaf in jax.tree.leaves(params)} == {setup.mesh}


def test_prompts_a_reward_model_cannot_score_are_found_when_the_data_is_loaded(shared_dir, tmp_path):
    rows = pq.read_table(shared_dir / "data" / "safe_alignment" / "alpaca_test.parquet").slice(0, 6).to_pylist()
    rows[3]["prompt"] = [{"role": "user", "content": "word " * 3000}]
    path = tmp_path / "long_prompt.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    config = _safety_config(shared_dir, data__train=str(path), data__validation="", data__test="",
                            data__max_prompt_tokens=8192)
    with pytest.raises(DataFormatError, match=r"long_prompt\.parquet, row 3 \(0-based\), field 'prompt': the prompt "
                                              r"renders to \d+ tokens with reward model 'useful' .* max_length=2048"):
        build_setup(as_run_config(config), tmp_path / "run")


# ---------------------------------------------------------------- the model directory


@pytest.mark.parametrize("field", ["model__path", "model__tokenizer_path"])
def test_a_model_path_that_does_not_exist_says_so_and_downloads_nothing(tmp_path, monkeypatch, field):
    monkeypatch.chdir(tmp_path)  # "Qwen/Qwen2.5-3B-Instruct" is a relative path that does not exist
    config = _files_config(tmp_path, **{field: "Qwen/Qwen2.5-3B-Instruct"})
    dotted = field.replace("__", ".")
    with pytest.raises(ConfigError, match=rf"^config\.{dotted}: 'Qwen/Qwen2.5-3B-Instruct' does not exist; it must "
                                          r"be a local Hugging Face model directory.*Nothing is downloaded"):
        _usable_splits(as_run_config(config), tmp_path / "run", _reward_fn(config))
    # The embedded task too, when it is given a model.
    synthetic = as_run_config(tiny_config(**{field: str(tmp_path / "missing")}))
    with pytest.raises(ConfigError, match=rf"^config\.{dotted}: .*missing' does not exist"):
        load_splits(as_run_config(synthetic), tmp_path / "run")


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
    with pytest.raises(ConfigError, match=r"^config\.eval\.split: the data has no 'test' split \(config\.data\.test "
                                          r"gives it no rows\); choose one of \['validation', 'none'\]"):
        eval_split(as_run_config(files), setup)
    synthetic = as_run_config(tiny_config(eval__split="test", data__synthetic__num_test=0))
    with pytest.raises(ConfigError, match=r"no 'test' split \(config\.data\.synthetic\.num_test gives it no rows\)"):
        eval_split(as_run_config(synthetic), setup)
    assert eval_split(as_run_config(files.replace({"eval.split": "validation"})), setup) == "validation"
    assert eval_split(as_run_config(files.replace({"eval.split": "none"})), setup) is None


@pytest.mark.slow
def test_the_trainer_checks_the_eval_split_before_the_warm_start(tmp_path):
    from gd2po_jax.rl.trainer import train_and_evaluate

    config = tiny_config(eval__split="test", data__synthetic__num_test=0)
    with pytest.raises(ConfigError, match=r"config\.eval\.split: the data has no 'test' split"):
        train_and_evaluate(as_run_config(config), tmp_path, progress=False)
    assert not (tmp_path / "warm_start").exists() and not (tmp_path / "config.json").exists()
