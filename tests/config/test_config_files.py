"""The config files of configs/ build, validate and convert back to exactly the ConfigDict's
values: default.py, tiny.py, toolrl.py (every model x algorithm x reward setting, with the official
hyperparameters), safety_embedded.py and safety.py (the official values; the fields users fill)."""

import dataclasses
import json

import pytest
from absl import flags

from configs import default, safety, safety_embedded, tiny, toolrl
from gd2po_jax import cli
from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.rewards.tool_calling import SETTINGS
from gd2po_jax.rl.advantages import METHODS
from gd2po_jax.tasks.synthetic_tools import task as synthetic_tools
from tests.config.common import CONFIG_FILES, NUM_GPUS, error_of, with_values
from tests.fakes import (
    alpaca_path,
    as_run_config,
    tiny_safety_policy,
    tiny_score_model_dir,
)

# ----------------------------------------------------------------------------------------------
# The config files build and validate.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CONFIG_FILES))
def test_every_config_file_builds_validates_and_converts_back(name):
    source = CONFIG_FILES[name]()
    config = RunConfig.from_config_dict(source)
    config.check_mesh(NUM_GPUS)
    assert config.to_dict() == source.to_dict()
    assert config.to_json() == source.to_json_best_effort(indent=2, sort_keys=True)  # config.json's text
    # Downstream code reads the same dotted names.
    assert config.rl.algorithm == source.rl.algorithm and config.model.tiny.head_dim == source.model.tiny.head_dim
    assert config.rewards.names == tuple(source.rewards.names)


def test_types_survive_the_round_trip_through_config_json():
    source = default.get_config()
    config = RunConfig.from_config_dict(source)
    again = RunConfig.from_config_dict(json.loads(config.to_json()))  # JSON has lists, not tuples
    assert again == config and again.to_dict() == source.to_dict()
    assert isinstance(again.rewards.names, tuple) and isinstance(again.rewards.weights, tuple)
    assert type(again.train.num_steps) is int and type(again.train.learning_rate) is float
    assert type(again.sft.enabled) is bool and type(again.rl.snr_tau) is float
    # An int given for a float field stays an int: the warm-start key hashes the value as written.
    values = with_values(source, {"train.weight_decay": 0, "rewards.weights": [1, 2, 3]})
    config = RunConfig.from_config_dict(values)
    assert type(config.train.weight_decay) is int and config.rewards.weights == (1, 2, 3)
    assert json.loads(config.to_json())["train"]["weight_decay"] == 0


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("algorithm", METHODS)
@pytest.mark.parametrize("model", sorted(toolrl.MODELS))
def test_every_toolrl_combination_validates(model, algorithm, setting):
    source = toolrl.get_config(f"{model},{setting}")
    source.rl.algorithm = algorithm
    config = RunConfig.from_config_dict(source)
    config.check_mesh(NUM_GPUS)
    assert config.rewards.names == SETTINGS[setting] and config.rl.algorithm == algorithm


@pytest.mark.parametrize("model", sorted(toolrl.MODELS))
def test_official_hyperparameters(model):
    c = RunConfig.from_config_dict(toolrl.get_config(model))
    assert c.rewards.names == ("correctness", "format", "length")  # default: three rewards
    assert c.rl.algorithm == "gd2po_snr" and c.rl.snr_tau == 0.8
    assert c.rl.num_generations == 4
    assert c.train.prompts_per_step == 512
    rollouts_per_minibatch = c.train.prompts_per_step * c.rl.num_generations // c.rl.num_minibatches
    assert rollouts_per_minibatch == 128 * 4  # ppo_mini_batch_size=128 prompts
    assert rollouts_per_minibatch % c.rl.micro_batch_size == 0
    optimizer = (c.train.learning_rate, c.train.warmup_steps, c.train.weight_decay, c.train.grad_clip)
    assert optimizer == (1e-6, 0, 0.01, 1.0)
    assert (c.rl.clip_low, c.rl.clip_high, c.rl.dual_clip) == (0.2, 0.2, 3.0)
    assert c.rl.loss_agg_mode == "token-mean" and c.rl.batch_norm == "token"
    assert c.rl.kl_coef == 0.0 and c.rl.entropy_coef == 0.0 and c.rl.ppo_epochs == 1
    assert (c.sampling.temperature, c.sampling.top_p, c.sampling.top_k) == (1.0, 1.0, 0)
    assert c.sampling.max_new_tokens == 1024 and c.data.max_prompt_tokens == 2048
    assert c.rewards.max_think_words == 512 and not c.rewards.conditional_length
    assert (c.model.dtype, c.train.master_dtype, c.model.remat) == ("bfloat16", "float32", "full")
    assert c.rl.tempered_logprobs  # verl's log-probs at the rollout temperature (1: the same numbers)
    # verl's update: old log-probs recomputed, mini-batches in order, dynamic batches of 16384 tokens per GPU
    assert (c.rl.old_logprobs, c.rl.shuffle_minibatches, c.rl.rollout_is_cap) == ("recompute", False, 0.0)
    assert (c.rl.micro_batch_max_tokens, c.rl.micro_batch_ranks, c.rl.snr_eps) == (16384, NUM_GPUS, 1e-8)
    assert c.rl.query_reweighting
    assert (c.mesh.data, c.mesh.fsdp, c.mesh.tensor) == (1, -1, 1)
    assert c.task == "files" and c.model.path == "" and not c.sft.enabled
    assert (c.data.train, c.data.validation, c.data.test) == ("", "", "")  # no default: the user gives them
    assert (c.eval.every_steps, c.checkpoint.every_steps, c.train.num_steps) == (10, 5, 7 * 30)


def test_bad_toolrl_arguments_list_the_choices():
    with pytest.raises(ValueError, match="qwen2.5-7b"):
        toolrl.get_config("qwen9")
    with pytest.raises(ValueError, match="correctness_length"):
        toolrl.get_config("qwen2.5-3b,correctness_only")
    with pytest.raises(ValueError, match="needs a model"):
        toolrl.get_config()


def test_toolrl_command_line_overrides_as_train_py_parses_them():
    argv = ["train.py", "--config=configs/toolrl.py:llama3.2-3b,correctness_length",
            "--config.rl.algorithm=gd2po_hard", "--config.model.path=/models/llama",
            "--config.data.train=/data/train.parquet"]
    values = flags.FlagValues()
    cli.define_config_flag(flag_values=values, sys_argv=argv)
    values(argv)
    config = RunConfig.from_config_dict(values.config)
    assert config.rewards.names == ("correctness", "length")
    assert (config.rl.algorithm, config.model.path, config.data.train) == ("gd2po_hard", "/models/llama",
                                                                           "/data/train.parquet")
    assert config.rl.micro_batch_size == toolrl.MODELS["llama3.2-3b"][1]


def test_tiny_is_the_default_shrunk():
    small, full = RunConfig.from_config_dict(tiny.get_config()), RunConfig.from_config_dict(default.get_config())
    assert small.model.tiny.hidden_size < full.model.tiny.hidden_size
    assert small.sft.num_steps < full.sft.num_steps and small.train.num_steps < full.train.num_steps
    # The algorithm is the default's; the update runs unbucketed, in one micro-batch (configs/tiny.py).
    assert (small.rl.micro_batch_size, small.rl.length_bucket) == (0, 0)
    same_update = dict(micro_batch_size=full.rl.micro_batch_size, length_bucket=full.rl.length_bucket)
    assert dataclasses.replace(small.rl, **same_update) == full.rl
    assert small.task == full.task == "synthetic_tools"
    task = synthetic_tools.world_config(small.data.synthetic)
    assert (task.num_candidates, task.multi_call_fraction, task.num_train) == (1, 0.0, 64)


# ----------------------------------------------------------------------------------------------
# configs/safety.py: the paper's helpfulness-safety run.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["low_conflict_half", "high_conflict_half"])
def test_the_snr_halves_validate_on_the_embedded_safety_task(algorithm):
    source = safety_embedded.get_config()
    source.rl.algorithm = algorithm
    config = RunConfig.from_config_dict(source)
    assert config.rl.algorithm == algorithm
    assert RunConfig.from_config_dict(json.loads(config.to_json())) == config  # config.json reads back
    source.rl.algorithm = "snr_low_half"
    with pytest.raises(ConfigError, match=r"rl\.algorithm.*low_conflict_half.*high_conflict_half"):
        RunConfig.from_config_dict(source)


def _safety(**changes):
    """configs/safety.py with its training and validation files filled in and ``changes`` (dotted name
    -> value)."""
    source = safety.get_config()
    source.data.train = "/data/alpaca/train.parquet"
    source.data.validation = "/data/alpaca/test.parquet"
    return with_values(source, changes) if changes else source


def test_safety_builds_validates_converts_back_and_holds_the_official_values():
    source = _safety()
    c = RunConfig.from_config_dict(source)
    c.check_mesh(NUM_GPUS)
    assert c.to_dict() == source.to_dict()
    assert c.to_json() == source.to_json_best_effort(indent=2, sort_keys=True)
    assert RunConfig.from_config_dict(json.loads(c.to_json())) == c  # config.json reads back
    assert c.rewards.kind == "reward_model" and c.rewards.names == ("useful", "harmless")
    for model in c.rewards.reward_models.values():
        # The official runs score as the checkpoints do (never negated) and cut at 2048 on the right.
        assert (model.path, model.negate, model.normalize, model.max_length, model.truncation) == \
            ("", False, None, 2048, "right")
    assert not c.rewards.offload
    assert c.rl.algorithm == "gd2po_snr" and c.rl.snr_tau == 0.8 and c.rl.num_generations == 4
    assert c.train.prompts_per_step == 512 and c.train.num_steps == 100
    assert c.train.prompts_per_step // c.rl.num_minibatches == 128  # PPO mini-batch: 4 updates per step
    assert (c.sampling.temperature, c.sampling.top_p, c.sampling.top_k) == (0.7, 1.0, 0)
    assert c.rl.tempered_logprobs and c.train.learning_rate == 1e-6
    assert c.rl.kl_coef == 0.0 and c.rl.entropy_coef == 0.0
    # verl's update of the safe-alignment scripts: ppo_max_token_len_per_gpu=2048, 8 GPUs, SNR eps 1e-6
    assert (c.rl.old_logprobs, c.rl.shuffle_minibatches, c.rl.snr_eps) == ("recompute", False, 1e-6)
    assert (c.rl.micro_batch_max_tokens, c.rl.micro_batch_ranks) == (2048, NUM_GPUS)
    assert (c.data.max_prompt_tokens, c.data.prompt_truncation, c.sampling.max_new_tokens) == (512, "left", 1024)
    assert (c.checkpoint.every_steps, c.eval.every_steps, c.eval.split, c.eval.sets) == (20, 10, "validation", "")
    assert (c.data.validation, c.data.test, c.model.path) == ("/data/alpaca/test.parquet", "", "")
    assert (safety.get_config().data.train, safety.get_config().data.validation) == ("", "")  # no default


def test_safety_fields_users_fill_are_named_when_empty(tmp_path):
    from gd2po_jax.tasks.setup import build_setup

    assert error_of(safety.get_config().to_dict()).startswith("config.data.train: the files task needs")
    with pytest.raises(ValueError, match=r"^config\.model\.path"):
        build_setup(RunConfig.from_config_dict(_safety()), tmp_path)
    config = RunConfig.from_config_dict(_safety(**{
        "model.path": str(tiny_safety_policy()),
        "data.train": str(alpaca_path()),
        "data.validation": str(alpaca_path()),
        "rewards.reward_models.useful.path": str(tiny_score_model_dir("amo")),
    }))
    with pytest.raises(ConfigError, match=r"^config\.rewards\.reward_models\.harmless\.path: empty"):
        build_setup(as_run_config(config), tmp_path)


def test_safety_command_line_overrides_as_train_py_parses_them():
    argv = ["train.py", "--config=configs/safety.py", "--config.model.path=/models/qwen",
            "--config.data.train=/data/train.parquet", "--config.rewards.reward_models.useful.path=/models/rm",
            "--config.rewards.reward_models.harmless.path=/models/cm",
            "--config.rewards.reward_models.harmless.negate=True", "--config.rl.algorithm=gdpo"]
    values = flags.FlagValues()
    cli.define_config_flag(flag_values=values, sys_argv=argv)
    values(argv)
    config = RunConfig.from_config_dict(values.config)
    models = config.rewards.reward_models
    assert (models["useful"].path, models["harmless"].path) == ("/models/rm", "/models/cm")
    assert models["harmless"].negate is True
    assert models["useful"].negate is False and config.rl.algorithm == "gdpo"  # pinned in configs/safety.py


def test_reward_models_must_match_the_reward_names():
    message = error_of(_safety(**{"rewards.names": ("useful", "harmless", "honest")}))
    assert message.startswith("config.rewards.reward_models: needs one reward model per name of rewards.names="
                              "('useful', 'harmless', 'honest'); none for ['honest']")
    values = _safety()
    values = with_values(values, {"rewards.reward_models": {**values.rewards.reward_models.to_dict(),
                                                            "honest": {"path": "/rm"}}})
    assert "['honest'] not in rewards.names" in error_of(values)
    assert error_of(_safety(**{"rewards.on_error": "min"})).startswith("config.rewards.on_error: 'min': a reward model")
    assert error_of(_safety(**{"rewards.reward_models.useful.batch_size": 12}), NUM_GPUS).startswith(
        "config.rewards.reward_models.useful.batch_size: 12 is not divisible by the 8 data-parallel devices")
