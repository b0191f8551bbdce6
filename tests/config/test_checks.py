"""Every check of the typed run config names its field (and the value); unknown and missing
fields are named."""

import re

import pytest

from configs import tiny
from gd2po_jax.config import RunConfig
from tests.config.common import error_of, with_values

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
    ({"model.attention": "flash"}, "model.attention"),
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
    ({"rewards.score_groups": "yes"}, "rewards.score_groups"),
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
    ({"sampling.engine_layers": "fast"}, "sampling.engine_layers"),
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
# Unknown and missing fields.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, policy", [(True, "full"), (False, "none"), ("True", "full"), ("false", "none"),
                                           ("minimal", "minimal"), ("dots", "dots")])
def test_model_remat_is_a_policy_and_reads_the_boolean_of_older_configs(value, policy):
    """A config.json written before the policies holds true / false (a command line, "True")."""
    assert RunConfig.from_dict(with_values(tiny.get_config(), {"model.remat": value})).model.remat == policy


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
