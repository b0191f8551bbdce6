"""The typed run config (`gd2po_jax.config`) and the config files of configs/.

Every check names its field; the typed config converts back to exactly the ConfigDict's values; an
older config.json loads; configs/default.py, tiny.py and toolrl.py (every model x algorithm x reward
setting) build and validate, and toolrl.py holds the official hyperparameters.
"""

import copy
import dataclasses
import json
import re

import pytest
from absl import flags

from configs import default, safety, safety_embedded, tiny, toolrl
from gd2po_jax import cli
from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.rewards.tool_calling import SETTINGS
from gd2po_jax.rl.advantages import METHODS
from gd2po_jax.tasks import task_of
from gd2po_jax.tasks.synthetic_tools import task as synthetic_tools
from gd2po_jax.tasks.synthetic_tools.data import SyntheticToolsConfig
from tests.fakes import (
    REPO,
    alpaca_path,
    as_run_config,
    data_files,
    subprocess_env,
    tiny_policy,
    tiny_safety_policy,
    tiny_score_model_dir,
)

NUM_GPUS = 8  # one node, as the official scripts use

CONFIG_FILES = {"default": default.get_config, "tiny": tiny.get_config,
                **{f"toolrl:{m}": (lambda m=m: toolrl.get_config(m)) for m in sorted(toolrl.MODELS)}}


def with_values(base, changes: dict):
    """The plain nested dict of ``base`` (a ConfigDict) with ``changes`` (dotted name -> value)."""
    values = copy.deepcopy(base.to_dict())
    for dotted, value in changes.items():
        *parents, name = dotted.split(".")
        node = values
        for parent in parents:
            node = node[parent]
        node[name] = value
    return values


def error_of(values, num_data_shards: int | None = None) -> str:
    """The error of ``values`` as a run meets it before computing anything: the typed config, its
    task's checks (`task_of`) and, with ``num_data_shards``, the mesh's."""
    with pytest.raises(ConfigError) as info:
        config = RunConfig.from_config_dict(values)
        if num_data_shards is not None:
            config.check_mesh(num_data_shards)
        task_of(config)
    return str(info.value)


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
    assert (c.model.dtype, c.train.master_dtype, c.model.remat) == ("bfloat16", "float32", True)
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
# Every check names its field (and the value).
# ----------------------------------------------------------------------------------------------

INVALID = [
    # (changes to configs/tiny.py, the field the error names)
    ({"task": "web"}, "task"),
    ({"task": "files"}, "data.train"),  # the files task needs a training file
    ({"model.path": None}, "model.path"),
    ({"model.tokenizer_path": 3}, "model.tokenizer_path"),
    ({"model.dtype": "float16"}, "model.dtype"),
    ({"model.remat": "yes"}, "model.remat"),
    ({"model.tiny.hidden_size": 0}, "model.tiny.hidden_size"),
    ({"model.tiny.seed": -1}, "model.tiny.seed"),
    ({"model.tiny.num_kv_heads": 3}, "model.tiny.num_kv_heads"),  # does not divide 4 heads
    ({"data.train": None}, "data.train"),
    ({"data.test": 1}, "data.test"),
    ({"data.kind": "verl_parquet"}, "data.kind"),  # the kind is "verl"
    ({"data.on_error": "ignore"}, "data.on_error"),
    ({"data.max_prompt_tokens": 0}, "data.max_prompt_tokens"),
    ({"data.synthetic.tokenizer_vocab_size": 0}, "data.synthetic.tokenizer_vocab_size"),
    ({"data.synthetic.num_train": -1}, "data.synthetic.num_train"),
    ({"data.synthetic.mistake_rate": 1.5}, "data.synthetic.mistake_rate"),
    ({"data.synthetic.num_candidates": 99}, "data.synthetic.num_candidates"),
    ({"data.synthetic.min_think_words": 9}, "data.synthetic.min_think_words"),  # > max_think_words
    ({"rewards.kind": 1}, "rewards.kind"),
    ({"rewards.names": []}, "rewards.names"),
    ({"rewards.names": ["correctness", 2]}, "rewards.names"),
    ({"rewards.max_think_words": 0}, "rewards.max_think_words"),
    ({"rewards.conditional_length": "no"}, "rewards.conditional_length"),
    ({"rewards.weights": [1.0]}, "rewards.weights"),  # 1 weight for 3 rewards
    ({"rewards.weights": ["a", "b", "c"]}, "rewards.weights"),
    ({"rewards.on_error": "skip"}, "rewards.on_error"),
    ({"rewards.num_workers": 0}, "rewards.num_workers"),
    ({"rewards.timeout_s": -1.0}, "rewards.timeout_s"),
    ({"rewards.timeout_s": "1m"}, "rewards.timeout_s"),
    ({"rewards.max_failed_fraction": 1.5}, "rewards.max_failed_fraction"),
    ({"rewards.offload": "yes"}, "rewards.offload"),
    ({"rewards.reward_models": [1]}, "rewards.reward_models"),
    ({"rewards.reward_models": {"judge": {"path": "/rm", "size": 7}}}, "rewards.reward_models.judge.size"),
    ({"rewards.reward_models": {"judge": {"path": None}}}, "rewards.reward_models.judge.path"),
    ({"rewards.reward_models": {"judge": {"path": "/rm", "negate": "no"}}}, "rewards.reward_models.judge.negate"),
    ({"rewards.reward_models": {"judge": {"path": "/rm", "max_length": 1}}}, "rewards.reward_models.judge.max_length"),
    ({"rewards.reward_models": {"judge": {"path": "/rm", "dtype": "fp8"}}}, "rewards.reward_models.judge.dtype"),
    ({"rewards.kind": "reward_model"}, "rewards.reward_models"),  # no model for correctness, format, length
    ({"data.prompt_truncation": "right"}, "data.prompt_truncation"),
    ({"rl.algorithm": "ppo"}, "rl.algorithm"),
    ({"rl.snr_tau": 1.5}, "rl.snr_tau"),
    ({"rl.snr_tau": -0.1}, "rl.snr_tau"),
    ({"rl.num_generations": 1}, "rl.num_generations"),
    ({"rl.batch_norm": "batch"}, "rl.batch_norm"),
    ({"rl.group_eps": "small"}, "rl.group_eps"),
    ({"rl.drop_zero_variance_groups": 1}, "rl.drop_zero_variance_groups"),
    ({"rl.clip_low": 1.5}, "rl.clip_low"),
    ({"rl.clip_high": 11.0}, "rl.clip_high"),
    ({"rl.dual_clip": 1.0}, "rl.dual_clip"),
    ({"rl.loss_agg_mode": "sum"}, "rl.loss_agg_mode"),
    ({"rl.filtered_in_denominator": None}, "rl.filtered_in_denominator"),
    ({"rl.kl_coef": -0.1}, "rl.kl_coef"),
    ({"rl.kl_estimator": "k2"}, "rl.kl_estimator"),
    ({"rl.entropy_coef": None}, "rl.entropy_coef"),
    ({"rl.ppo_epochs": 0}, "rl.ppo_epochs"),
    ({"rl.num_minibatches": 0}, "rl.num_minibatches"),
    ({"rl.num_minibatches": 3}, "rl.num_minibatches"),  # does not divide the 32 rollouts of a step
    ({"rl.micro_batch_size": -1}, "rl.micro_batch_size"),
    ({"rl.micro_batch_size": 3}, "rl.micro_batch_size"),  # does not divide the minibatch of 32
    ({"rl.tempered_logprobs": "yes"}, "rl.tempered_logprobs"),
    ({"rl.length_bucket": -1}, "rl.length_bucket"),
    ({"rl.length_bucket": 2.5}, "rl.length_bucket"),
    ({"rl.old_logprobs": "vllm"}, "rl.old_logprobs"),
    ({"rl.rollout_is_cap": -1.0}, "rl.rollout_is_cap"),
    ({"rl.shuffle_minibatches": 0}, "rl.shuffle_minibatches"),
    ({"rl.micro_batch_max_tokens": -1}, "rl.micro_batch_max_tokens"),
    ({"rl.micro_batch_ranks": 0}, "rl.micro_batch_ranks"),
    ({"rl.query_reweighting": "no"}, "rl.query_reweighting"),
    ({"rl.snr_eps": 0.0}, "rl.snr_eps"),
    ({"rl.halves_ranking": "group"}, "rl.halves_ranking"),
    ({"rl.skip_zero_advantage_rows": 1}, "rl.skip_zero_advantage_rows"),
    ({"sampling.max_new_tokens": 0}, "sampling.max_new_tokens"),
    ({"sampling.temperature": 0.0}, "sampling.temperature"),
    ({"sampling.top_p": 0.0}, "sampling.top_p"),
    ({"sampling.top_k": -1}, "sampling.top_k"),
    ({"sampling.prompts_per_call": -1}, "sampling.prompts_per_call"),
    ({"sampling.prompts_per_call": 3}, "sampling.prompts_per_call"),  # does not divide 8 prompts
    ({"train.num_steps": -1}, "train.num_steps"),
    ({"train.prompts_per_step": 0}, "train.prompts_per_step"),
    ({"train.seed": -1}, "train.seed"),
    ({"train.learning_rate": 0.0}, "train.learning_rate"),
    ({"train.warmup_steps": -1}, "train.warmup_steps"),
    ({"train.weight_decay": "none"}, "train.weight_decay"),
    ({"train.grad_clip": None}, "train.grad_clip"),
    ({"train.master_dtype": "float16"}, "train.master_dtype"),
    ({"train.logit_chunk_size": 0}, "train.logit_chunk_size"),
    ({"train.log_every": 0}, "train.log_every"),
    ({"train.max_consecutive_skipped_steps": 0}, "train.max_consecutive_skipped_steps"),
    ({"sft.enabled": "yes"}, "sft.enabled"),
    ({"sft.data": None}, "sft.data"),
    ({"sft.num_steps": -1}, "sft.num_steps"),
    ({"sft.batch_size": 0}, "sft.batch_size"),
    ({"sft.learning_rate": "high"}, "sft.learning_rate"),
    ({"sft.max_length": 1}, "sft.max_length"),
    ({"sft.seed": -1}, "sft.seed"),
    ({"sft.length_bucket": -16}, "sft.length_bucket"),
    ({"sft.cache_dir": None}, "sft.cache_dir"),
    ({"checkpoint.every_steps": 0}, "checkpoint.every_steps"),
    ({"checkpoint.keep": 0}, "checkpoint.keep"),
    ({"eval.split": None}, "eval.split"),
    ({"eval.split": "valdation"}, "eval.split"),  # a typo no longer turns evaluation off
    ({"eval.max_examples": -1}, "eval.max_examples"),
    ({"eval.batch_size": 0}, "eval.batch_size"),
    ({"eval.every_steps": -1}, "eval.every_steps"),
    ({"mesh.data": 0}, "mesh.data"),
    ({"mesh.fsdp": "all"}, "mesh.fsdp"),
    ({"model.lora.rank": -1}, "model.lora.rank"),
    ({"model.lora.alpha": 0.0}, "model.lora.alpha"),
    ({"model.lora.dropout": 1.0}, "model.lora.dropout"),
    ({"model.lora.targets": "q"}, "model.lora.targets"),  # a string, not a tuple of names
    ({"model.lora.targets": ("q", "lm_head")}, "model.lora.targets"),
    ({"model.lora.base_dtype": "float16"}, "model.lora.base_dtype"),
]


@pytest.mark.parametrize("changes, field", INVALID, ids=[f for _, f in INVALID])
def test_each_invalid_value_is_refused_naming_its_field(changes, field):
    values = with_values(tiny.get_config(), changes)
    message = error_of(values)
    assert re.match(re.escape(f"config.{field}") + r"\b", message), message
    (value,) = changes.values()
    if field.startswith(("rl.", "sampling.top", "train.", "model.", "mesh.")) and value is not None:
        assert repr(value) in message or str(value) in message, message  # and says what it got


@pytest.mark.parametrize("changes, field, says", [
    ({"rl.rollout_is_cap": 2.0, "rl.old_logprobs": "sampler"}, "rl.rollout_is_cap",
     "needs rl.old_logprobs='recompute'"),
    ({"rl.micro_batch_max_tokens": 4096}, "rl.micro_batch_max_tokens", "set rl.shuffle_minibatches=False"),
    ({"rl.micro_batch_max_tokens": 4096, "rl.shuffle_minibatches": False, "rl.loss_agg_mode": "seq-mean-token-mean"},
     "rl.micro_batch_max_tokens", "token-mean"),
    ({"rl.micro_batch_max_tokens": 4096, "rl.shuffle_minibatches": False, "rl.micro_batch_ranks": 3},
     "rl.micro_batch_ranks", "32 rollouts of a step do not split into 3 ranks"),
])
def test_verls_update_fields_are_refused_without_what_they_need(changes, field, says):
    message = error_of(with_values(tiny.get_config(), changes))
    assert message.startswith(f"config.{field}:") and says in message, message


NOT_FINITE_OR_OUT_OF_RANGE = [
    ({"train.learning_rate": float("inf")}, "train.learning_rate"),
    ({"train.learning_rate": float("nan")}, "train.learning_rate"),
    ({"train.learning_rate": 1.5}, "train.learning_rate"),
    ({"sft.learning_rate": -5e-3}, "sft.learning_rate"),
    ({"sft.learning_rate": float("inf")}, "sft.learning_rate"),
    ({"train.weight_decay": float("nan")}, "train.weight_decay"),
    ({"train.weight_decay": -0.01}, "train.weight_decay"),
    ({"train.grad_clip": float("inf")}, "train.grad_clip"),
    ({"rl.kl_coef": float("inf")}, "rl.kl_coef"),
    ({"rl.entropy_coef": float("nan")}, "rl.entropy_coef"),
    ({"rl.group_eps": -1e-6}, "rl.group_eps"),
    ({"rl.dual_clip": float("inf")}, "rl.dual_clip"),
    ({"rl.snr_tau": float("nan")}, "rl.snr_tau"),
    ({"sampling.temperature": float("inf")}, "sampling.temperature"),
    ({"rewards.weights": (1.0, float("nan"), 1.0)}, "rewards.weights"),
]


@pytest.mark.parametrize("changes, field", NOT_FINITE_OR_OUT_OF_RANGE,
                         ids=[f"{f}={v}" for c, f in NOT_FINITE_OR_OUT_OF_RANGE for v in c.values()])
def test_non_finite_and_senseless_numbers_are_refused_naming_their_field(changes, field):
    message = error_of(with_values(tiny.get_config(), changes))
    assert re.match(re.escape(f"config.{field}") + r"\b", message), message


def test_bfloat16_master_weights_are_refused_below_their_smallest_learning_rate():
    # At the paper's lr 1e-6, bf16 rounds AdamW's updates away (config.MIN_BF16_MASTER_LEARNING_RATE).
    message = error_of(with_values(tiny.get_config(), {"train.master_dtype": "bfloat16", "train.learning_rate": 1e-6}))
    assert message.startswith("config.train.master_dtype: bfloat16 master weights lose AdamW updates of "
                              "train.learning_rate=1e-06")
    assert "train.master_dtype='float32'" in message and "learning_rate >= 0.0001" in message
    for lr in (1e-4, 1e-3):
        config = RunConfig.from_config_dict(with_values(tiny.get_config(), {"train.master_dtype": "bfloat16",
                                                                            "train.learning_rate": lr}))
        assert config.train.master_dtype == "bfloat16"
    # float32 master weights take any learning rate, the paper's among them (configs/toolrl.py).
    assert RunConfig.from_config_dict(with_values(tiny.get_config(), {"train.learning_rate": 1e-6}))


def test_sft_values_are_only_checked_when_the_warm_start_is_on():
    values = with_values(tiny.get_config(), {"sft.enabled": False, "sft.num_steps": -1, "sft.max_length": 0})
    assert RunConfig.from_config_dict(values).sft.num_steps == -1
    assert error_of(with_values(tiny.get_config(), {"sft.num_steps": -1})).startswith("config.sft.num_steps:")


@pytest.mark.parametrize("changes, field", [
    ({"train.prompts_per_step": 3, "rl.num_generations": 2}, "train.prompts_per_step"),  # 6 rollouts, 8 devices
    ({"rl.micro_batch_size": 4}, "rl.micro_batch_size"),  # 32 rollouts in micro-batches of 4 over 8 devices
    ({"eval.batch_size": 12}, "eval.batch_size"),
])
def test_the_mesh_checks_need_the_number_of_data_shards(changes, field):
    values = with_values(tiny.get_config(), changes)
    config = RunConfig.from_config_dict(values)  # valid on one device
    config.check_mesh(1)
    assert re.match(re.escape(f"config.{field}:"), error_of(values, num_data_shards=8))


# ----------------------------------------------------------------------------------------------
# Unknown, missing and newer fields.
# ----------------------------------------------------------------------------------------------


def test_unknown_fields_are_refused_naming_all_of_them():
    message = error_of(with_values(tiny.get_config(), {"rl.snr_threshold": 0.5, "rl.tau": 0.5}))
    assert message.startswith("config.rl.snr_threshold, config.rl.tau: unknown fields")
    assert "snr_tau" in message  # and lists the known ones
    assert error_of(with_values(tiny.get_config(), {"optimizer": {}})).startswith("config.optimizer: unknown field")
    assert error_of(with_values(tiny.get_config(), {"model.tiny.depth": 2})).startswith("config.model.tiny.depth:")
    assert error_of(with_values(tiny.get_config(), {"data.synthetic.rows": 2})).startswith(
        "config.data.synthetic.rows:")


def test_a_missing_field_or_section_is_named():
    values = tiny.get_config().to_dict()
    del values["rl"]["snr_tau"]
    assert error_of(values).startswith("config.rl.snr_tau is missing")
    values = tiny.get_config().to_dict()
    del values["mesh"]
    assert error_of(values).startswith("config.mesh is missing")
    assert error_of(with_values(tiny.get_config(), {"rl": 0.5})).startswith("config.rl: must be a group of fields")


def test_an_older_config_json_loads_with_the_values_its_run_used():
    old = json.loads(default.get_config().to_json_best_effort())
    del old["sft"]["seed"], old["sft"]["cache_dir"], old["sampling"]["prompts_per_call"]
    del old["data"]["synthetic"]["num_candidates"], old["data"]["synthetic"]["habit_rate"]
    del old["rewards"]["timeout_s"], old["rewards"]["max_failed_fraction"]
    del old["rl"]["tempered_logprobs"], old["train"]["max_consecutive_skipped_steps"]
    del old["rewards"]["reward_models"], old["rewards"]["offload"], old["rl"]["length_bucket"]
    for name in ("old_logprobs", "rollout_is_cap", "shuffle_minibatches", "micro_batch_max_tokens",
                 "micro_batch_ranks", "query_reweighting", "snr_eps", "halves_ranking"):
        del old["rl"][name]  # issue 36's fields: what older runs computed (old_logprobs: the sampler's)
    del old["rl"]["skip_zero_advantage_rows"]
    del old["sft"]["length_bucket"]
    config = RunConfig.from_config_dict(old)
    rl = config.rl
    assert (rl.old_logprobs, rl.rollout_is_cap, rl.shuffle_minibatches, rl.micro_batch_max_tokens,
            rl.micro_batch_ranks, rl.query_reweighting, rl.snr_eps, rl.halves_ranking) == \
        ("sampler", 0.0, True, 0, 1, True, 1e-8, "prompt")
    assert config.rl.length_bucket == 0  # every micro-batch at the padded length, as then
    assert not config.rl.skip_zero_advantage_rows  # every row computed, as then (issue 41's field)
    assert (config.rewards.reward_models, config.rewards.offload, config.data.prompt_truncation) == ({}, False, None)
    assert not config.rl.tempered_logprobs and config.train.max_consecutive_skipped_steps == 5
    assert (config.sft.seed, config.sft.cache_dir, config.sampling.prompts_per_call) == (0, "", 0)
    assert config.sft.length_bucket == 0  # every batch at the longest example, as then
    assert (config.rewards.timeout_s, config.rewards.max_failed_fraction) == (0.0, 1.0)  # no limits then
    # Synthetic-task fields it lacks take the task's defaults and stay out of its dict (and its
    # warm-start key), as before.
    assert config.data.synthetic.num_candidates is None
    task = synthetic_tools.world_config(config.data.synthetic)
    assert (task.num_candidates, task.habit_rate) == (SyntheticToolsConfig.num_candidates,
                                                      SyntheticToolsConfig.habit_rate)
    assert task.habit_fraction == 0.5  # what it sets
    assert "num_candidates" not in config.to_dict()["data"]["synthetic"]


# ----------------------------------------------------------------------------------------------
# Using a typed config.
# ----------------------------------------------------------------------------------------------


def test_a_config_is_frozen_and_replace_gives_a_validated_copy():
    config = RunConfig.from_config_dict(tiny.get_config())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.rl.algorithm = "gdpo"
    other = config.replace({"rl.algorithm": "gdpo", "train.seed": 3})
    assert (other.rl.algorithm, other.train.seed) == ("gdpo", 3) and config.rl.algorithm == "gd2po_snr"
    assert other.sft == config.sft and other != config
    with pytest.raises(ConfigError, match=r"^config\.rl\.snr_tau:"):
        config.replace({"rl.snr_tau": 2.0})
    with pytest.raises(ConfigError, match=r"^config\.rl\.tau: unknown field"):
        config.replace({"rl.tau": 0.5})
    with pytest.raises(ConfigError, match=r"^config\.task: not a section"):
        config.replace({"task.kind": "x"})


def test_as_run_config_converts_once():
    config = as_run_config(tiny.get_config())
    assert isinstance(config, RunConfig) and as_run_config(config) is config
    assert as_run_config(config.to_dict()) == config


# ----------------------------------------------------------------------------------------------
# The files task on the RLLA data (a tiny model).
# ----------------------------------------------------------------------------------------------


def _rlla() -> str:
    """The RLLA-format parquet of the tiny data sets (tests/fixture_data.py)."""
    return str(data_files() / "rlla_4k" / "test.parquet")


def test_missing_model_path_names_the_field(tmp_path):
    from gd2po_jax.tasks.setup import build_setup

    source = toolrl.get_config("qwen2.5-1.5b")
    source.data.train = source.data.validation = _rlla()
    with pytest.raises(ValueError, match=r"config\.model\.path"):
        build_setup(as_run_config(source), tmp_path)


def test_empty_data_paths_name_the_field_and_where_the_data_is_published():
    """configs/toolrl.py and configs/safety.py have no default data path (nothing outside the
    repository): a run stops at the first empty one, naming it and the public data set."""
    toolrl_values = toolrl.get_config("qwen2.5-1.5b").to_dict()
    assert re.match(r"config\.data\.train: the files task needs a training data file \(the paper's tool_calling runs "
                    r"use ToolRL's RLLA 4K, dataset/rlla_4k/train\.parquet .*github\.com/qiancheng0/ToolRL\)$",
                    error_of(toolrl_values))
    assert (toolrl_values["data"]["validation"], toolrl_values["data"]["test"]) == ("", "")
    safety_values = safety.get_config().to_dict()
    assert re.match(r"config\.data\.train: the files task needs a training data file \(the paper's reward_model runs "
                    r"use GD2PO's Alpaca prompts, safe-alignment/dataset/alpaca_prompt_only/train\.parquet .*"
                    r"github\.com/Qwen-Applications/GD2PO\)$", error_of(safety_values))
    assert (safety_values["data"]["validation"], safety_values["data"]["test"]) == ("", "")


@pytest.mark.slow
def test_an_empty_data_path_is_one_line_from_train_py(tmp_path):
    import subprocess
    import sys

    command = [sys.executable, "train.py", "--config=configs/toolrl.py:qwen2.5-1.5b", f"--workdir={tmp_path}",
               "--config.model.path=/models/qwen"]
    done = subprocess.run(command, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stdout == ""
    assert re.fullmatch(r"train\.py: config\.data\.train: the files task needs a training data file \(.*"
                        r"github\.com/qiancheng0/ToolRL\)\n", done.stderr[done.stderr.rfind("train.py: "):])


@pytest.mark.slow
def test_smoke_run_with_a_tiny_model_on_rlla(tmp_path):
    from gd2po_jax.jobs.train import train_and_evaluate

    config = toolrl.get_config("qwen2.5-1.5b,correctness_length")
    config.model.path = str(tiny_policy())
    config.data.train = config.data.validation = _rlla()
    config.data.max_prompt_tokens = 4096  # the tiny tokenizer is less compact than Qwen's
    config.train.num_steps = 1
    config.train.prompts_per_step = 2  # x G=4: 8 rollouts, one per simulated device
    config.rl.num_minibatches = 1
    config.rl.micro_batch_size = 8
    config.sampling.max_new_tokens = 8
    config.eval.max_examples = 8
    config.eval.batch_size = 8
    results = train_and_evaluate(as_run_config(config), tmp_path, progress=False)

    assert results["algorithm"] == "gd2po_snr" and results["split"] == "validation"
    for phase in ("before_rl", "after_rl"):
        assert results[phase]["num_examples"] == 8
        assert 0.0 <= results[phase]["correct_acc"] <= 1.0
        assert -3.0 <= results[phase]["correctness"] <= 3.0
    (step,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert step["step"] == 1
    assert {"reward/correctness", "reward/length"} <= set(step) and "reward/format" not in step
    assert (tmp_path / "policy" / "config.json").is_file()
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model"]["dtype"] == "bfloat16" and written["model"]["remat"] is True


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
