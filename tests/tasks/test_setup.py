"""gd2po_jax.tasks.setup: what a run is made of is checked before anything is computed — a model
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
from gd2po_jax.tasks import task_of
from gd2po_jax.tasks.setup import build_setup, eval_split, reward_spec, with_local_models
from tests import fixture_data
from tests.fakes import (
    alpaca_path,
    as_run_config,
    data_files,
    tiny_config,
    tiny_safety_policy,
    tiny_score_model_dir,
    with_changes,
)


def _rlla() -> str:
    """The RLLA-format parquet of the tiny data sets (tests/fixture_data.py)."""
    return str(data_files() / "rlla_4k" / "test.parquet")


def _files_config(tmp_path, **changes) -> RunConfig:
    """configs/toolrl.py on the RLLA-format file (every split), with an (empty) existing model directory
    and ``changes`` (dotted names with "__" for ".")."""
    config = toolrl.get_config("qwen2.5-1.5b")
    config.model.path = str(tmp_path)
    config.data.train = config.data.validation = config.data.test = _rlla()
    return as_run_config(with_changes(config, changes))


def _reward_fn(config):
    return build_reward_function({"kind": config.rewards.kind, "names": config.rewards.names})


def _usable_splits(config: RunConfig, workdir, reward_fn):
    """The splits as `build_setup` has them: the models found, the data loaded, then checked against
    the reward function."""
    config = with_local_models(config)
    splits, _ = task_of(config).load_splits(config, workdir)
    return task_of(config).usable_rows(config, splits, reward_fn)


def _with_bad_ground_truths(tmp_path, bad: dict[int, str | None]):
    """A copy of the RLLA-format parquet whose rows ``bad`` have those ground truths."""
    rows = pq.read_table(_rlla()).to_pylist()
    for row, ground_truth in bad.items():
        rows[row]["reward_model"]["ground_truth"] = ground_truth
    path = tmp_path / "bad_ground_truth.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


# ---------------------------------------------------------------- ground truths, when loaded


def test_a_ground_truth_the_reward_cannot_parse_is_found_when_the_data_is_loaded(tmp_path):
    unparseable = "<think> x </think>\n<tool_call>\n{\"name\": \"GetNews\", \n</tool_call>"
    not_a_call = "<think> x </think>\n<tool_call>\n[1, 2]\n</tool_call>"
    path = _with_bad_ground_truths(tmp_path, {4: unparseable, 9: not_a_call})
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
        assert len(rows) == fixture_data.ROWS["rlla_4k/test.parquet"] - 2 and 4 not in rows and 9 not in rows


def test_every_row_of_the_real_rlla_split_can_train_the_tool_calling_reward(data_dir, tmp_path):
    rlla = str(data_dir / "rlla_4k" / "test.parquet")
    config = _files_config(tmp_path, data__train=rlla, data__validation=rlla, data__test="")
    splits = _usable_splits(as_run_config(config), tmp_path / "run", _reward_fn(config))
    assert splits["train"]["row"] == splits["validation"]["row"] == list(range(80))


def test_rows_without_a_ground_truth_cannot_train_a_tool_calling_reward(tmp_path):
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


def _safety_config(**changes) -> RunConfig:
    """configs/safety.py on the Alpaca-format prompts (training and validation) with the tiny policy
    and score models (the harmless one with a plain-text template), 8 rows per reward-model batch,
    and ``changes``."""
    config = safety.get_config()
    config.model.path = str(tiny_safety_policy())
    config.data.train = config.data.validation = str(alpaca_path())
    for name, (layout, template) in {"useful": ("amo", "chatml"), "harmless": ("beaver", "plain")}.items():
        config.rewards.reward_models[name].update(path=str(tiny_score_model_dir(layout, template)),
                                                  batch_size=8, dtype="float32")
    return as_run_config(with_changes(config, changes))


def test_the_reward_spec_is_made_per_kind(tmp_path):
    tool_calling = _files_config(tmp_path)
    assert reward_spec(tool_calling) == {"kind": "tool_calling", "names": ("correctness", "format", "length"),
                                         "max_think_words": 512, "conditional_length": False}
    config = _safety_config()
    tokenizer = object()
    spec = reward_spec(config, tokenizer=tokenizer, eos_ids=[2], mesh="mesh")
    assert spec["reward_models"]["harmless"] == config.rewards.reward_models["harmless"].to_dict()
    assert (spec["kind"], spec["names"], spec["offload"]) == ("reward_model", ("useful", "harmless"), False)
    assert (spec["policy_tokenizer"], spec["policy_eos_ids"], spec["mesh"]) == (tokenizer, [2], "mesh")
    missing = _safety_config(rewards__reward_models__useful__path=str(tmp_path / "none"))
    with pytest.raises(ConfigError, match=r"^config\.rewards\.reward_models\.useful\.path: .*none' does not exist"):
        reward_spec(missing)


def test_a_reward_model_run_loads_prompt_only_data_and_its_reward_models_on_the_mesh(tmp_path):
    setup = build_setup(as_run_config(_safety_config(eval__max_examples=4)), tmp_path)
    assert isinstance(setup.reward_fn, RewardModelReward) and setup.reward_fn.names == ("useful", "harmless")
    assert setup.reward_fn.fast == {"useful": True, "harmless": False}  # the policy's tokenizer: no re-rendering
    assert len(setup.train) == fixture_data.ROWS["safe_alignment/alpaca_test.parquet"]  # no ground truth needed
    assert len(setup.evals["validation"]) == 4
    assert setup.train.columns["prompt"][0][0]["role"] == "user"
    params = setup.reward_fn.models["harmless"]._state
    assert {leaf.sharding.mesh for leaf in jax.tree.leaves(params)} == {setup.mesh}


def test_prompts_a_reward_model_cannot_score_are_found_when_the_data_is_loaded(tmp_path):
    """With truncation='error' (configs/safety.py cuts on the right, as the official runs)."""
    rows = pq.read_table(alpaca_path()).slice(0, 6).to_pylist()
    rows[3]["prompt"] = [{"role": "user", "content": "word " * 3000}]
    path = tmp_path / "long_prompt.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    config = _safety_config(data__train=str(path), data__validation="", data__test="",
                            data__max_prompt_tokens=8192, rewards__reward_models__useful__truncation="error")
    with pytest.raises(DataFormatError, match=r"long_prompt\.parquet, row 3 \(0-based\), field 'prompt': the prompt "
                                              r"renders to \d+ tokens with reward model 'useful' .* max_length=2048"):
        build_setup(as_run_config(config), tmp_path / "run")


# ---------------------------------------------------------------- the model directory


@pytest.mark.parametrize("field", ["model__path", "model__tokenizer_path"])
def test_a_model_that_is_neither_local_nor_cached_is_named_with_the_command_that_fetches_it(
        tmp_path, monkeypatch, field):
    monkeypatch.chdir(tmp_path)  # "Qwen/Qwen2.5-3B-Instruct" is a relative path that does not exist: a Hub id
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # (tests/conftest.py sets it too) the empty cache only
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    config = _files_config(tmp_path, **{field: "Qwen/Qwen2.5-3B-Instruct"})
    dotted = field.replace("__", ".")
    with pytest.raises(ConfigError, match=rf"^config\.{dotted}: 'Qwen/Qwen2.5-3B-Instruct' is not in the Hugging Face "
                                          r"cache .*; fetch it with: hf download Qwen/Qwen2.5-3B-Instruct$"):
        _usable_splits(as_run_config(config), tmp_path / "run", _reward_fn(config))
    # The embedded task too, when it is given a model; a path that is not a Hub id is named as missing.
    synthetic = as_run_config(tiny_config(**{field: str(tmp_path / "missing")}))
    with pytest.raises(ConfigError, match=rf"^config\.{dotted}: .*missing' does not exist; give a local Hugging Face "
                                          r"model directory .* or a Hub id"):
        with_local_models(synthetic)


def test_load_pretrained_names_a_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^model directory: '/no/such/dir' does not exist; give a local"):
        load_pretrained("/no/such/dir")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"file' is a file, not a directory"):
        load_pretrained(tmp_path / "file")


# ---------------------------------------------------------------- the evaluation split


def test_eval_split_must_be_a_split_the_data_has(tmp_path):
    with pytest.raises(ConfigError, match=r"^config\.eval\.split: 'valdation' is not one of \('validation', "
                                          r"'test', 'none', 'auto'\)"):
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
    from gd2po_jax.jobs.train import train_and_evaluate

    config = tiny_config(eval__split="test", data__synthetic__num_test=0)
    with pytest.raises(ConfigError, match=r"config\.eval\.split: the data has no 'test' split"):
        train_and_evaluate(as_run_config(config), tmp_path, progress=False)
    assert not (tmp_path / "warm_start").exists() and not (tmp_path / "config.json").exists()


def test_an_over_long_prompt_is_one_line_naming_the_file_and_the_row(tmp_path):
    """Issue 62 item 9: a 26-line traceback naming "training data" instead of the file and the row."""
    from gd2po_jax.cli import one_line
    from gd2po_jax.data.prompts import PromptError
    from gd2po_jax.errors import UserError
    from tests.fakes import tiny_policy

    config = _files_config(tmp_path, model__path=str(tiny_policy()), data__max_prompt_tokens=8,
                           data__validation="", data__test="")
    with pytest.raises(PromptError) as refused:
        build_setup(config, tmp_path / "run")
    assert isinstance(refused.value, UserError)  # the commands print it in one line, exit code 2
    assert one_line(refused.value).startswith(f"config.data.train={_rlla()}, row 0 (0-based): the prompt has ")
    assert "more than config.data.max_prompt_tokens=8" in str(refused.value)
