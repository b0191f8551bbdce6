"""Checks of a training config before any compute; every error names the config field."""

from __future__ import annotations

from typing import Any

from gd2po_jax.advantages import BATCH_NORMS, METHODS
from gd2po_jax.losses import KL_ESTIMATORS, LOSS_AGG_MODES

DTYPES = ("float32", "bfloat16")


class ConfigError(ValueError):
    """A config value that cannot work; the message starts with the field's dotted name."""


def _get(config, dotted: str) -> Any:
    value = config
    for part in dotted.split("."):
        if part not in value:
            raise ConfigError(f"config.{dotted} is missing (start from configs/default.py)")
        value = value[part]
    return value


def _require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"config.{field}: {message}")


def _one_of(config, field: str, choices) -> None:
    value = _get(config, field)
    _require(value in choices, field, f"{value!r} is not one of {tuple(choices)}")


def _positive_int(config, field: str, minimum: int = 1) -> int:
    value = _get(config, field)
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
             field, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _in_range(config, field: str, low: float, high: float) -> float:
    value = _get(config, field)
    _require(isinstance(value, (int, float)) and low <= value <= high, field,
             f"must be in [{low}, {high}], got {value!r}")
    return float(value)


def validate_config(config, num_data_shards: int = 1) -> None:
    """Raise `ConfigError` for the first invalid field.

    Args:
      config: the training `ml_collections.ConfigDict` (see configs/default.py).
      num_data_shards: devices the batch is split over (mesh data x fsdp); the rollouts of a step
        and each micro-batch must divide by it.
    """
    _one_of(config, "task", ("synthetic_tools", "files"))
    if config.task == "files":
        _require(bool(config.data.train), "data.train", "the files task needs a training data file")
    _one_of(config, "model.dtype", DTYPES)
    _one_of(config, "train.master_dtype", ("float32", "bfloat16"))
    _one_of(config, "data.on_error", ("raise", "skip"))
    _one_of(config, "rewards.on_error", ("raise", "min"))
    _positive_int(config, "rewards.num_workers")
    _require(len(config.rewards.names) >= 1, "rewards.names", "at least one reward is needed")
    weights = tuple(config.rewards.weights)
    _require(not weights or len(weights) == len(config.rewards.names), "rewards.weights",
             f"has {len(weights)} entries for {len(config.rewards.names)} rewards {tuple(config.rewards.names)}")

    _one_of(config, "rl.algorithm", METHODS)
    _in_range(config, "rl.snr_tau", 0.0, 1.0)
    _positive_int(config, "rl.num_generations", minimum=2)
    _one_of(config, "rl.batch_norm", BATCH_NORMS)
    _one_of(config, "rl.loss_agg_mode", LOSS_AGG_MODES)
    _one_of(config, "rl.kl_estimator", KL_ESTIMATORS)
    _in_range(config, "rl.clip_low", 0.0, 1.0)
    _in_range(config, "rl.clip_high", 0.0, 10.0)
    dual = _get(config, "rl.dual_clip")
    _require(dual <= 0 or dual > 1, "rl.dual_clip", f"must be > 1 (or <= 0 to disable), got {dual}")
    _require(config.rl.kl_coef >= 0, "rl.kl_coef", f"must be >= 0, got {config.rl.kl_coef}")
    _positive_int(config, "rl.ppo_epochs")
    minibatches = _positive_int(config, "rl.num_minibatches")
    micro = _positive_int(config, "rl.micro_batch_size", minimum=0)

    _positive_int(config, "sampling.max_new_tokens")
    _require(config.sampling.temperature > 0, "sampling.temperature",
             f"RL rollouts need temperature > 0, got {config.sampling.temperature}")
    _in_range(config, "sampling.top_p", 1e-6, 1.0)
    _positive_int(config, "sampling.top_k", minimum=0)

    _positive_int(config, "train.num_steps", minimum=0)
    prompts = _positive_int(config, "train.prompts_per_step")
    per_call = config.sampling.get("prompts_per_call", 0)
    chunked_ok = per_call == 0 or per_call >= prompts or prompts % per_call == 0
    _require(isinstance(per_call, int) and per_call >= 0 and chunked_ok,
             "sampling.prompts_per_call",
             f"{per_call} must be 0 (all at once), at least, or a divisor of train.prompts_per_step={prompts}")
    _require(config.train.learning_rate > 0, "train.learning_rate", "must be > 0")
    _positive_int(config, "train.warmup_steps", minimum=0)
    _positive_int(config, "train.log_every")
    _positive_int(config, "train.logit_chunk_size")
    _positive_int(config, "checkpoint.every_steps")
    _positive_int(config, "checkpoint.keep")
    _positive_int(config, "eval.batch_size")
    _positive_int(config, "eval.max_examples", minimum=0)
    _positive_int(config, "eval.every_steps", minimum=0)
    if config.sft.enabled:
        _positive_int(config, "sft.num_steps", minimum=0)
        _positive_int(config, "sft.batch_size")
        _positive_int(config, "sft.max_length", minimum=2)
        # Added later than the rest: a config.json of an older run may lack them (defaults 0 and "").
        if "seed" in config.sft:
            _positive_int(config, "sft.seed", minimum=0)
        if "cache_dir" in config.sft:
            _require(isinstance(config.sft.cache_dir, str), "sft.cache_dir",
                     f"must be a directory path (a string; empty: WORKDIR/warm_start), got {config.sft.cache_dir!r}")

    rollouts = prompts * config.rl.num_generations
    _require(rollouts % num_data_shards == 0, "train.prompts_per_step",
             f"{prompts} prompts x rl.num_generations={config.rl.num_generations} = {rollouts} rollouts "
             f"per step cannot be split over {num_data_shards} data-parallel devices (config.mesh)")
    _require(rollouts % minibatches == 0, "rl.num_minibatches",
             f"{minibatches} does not divide the {rollouts} rollouts of a step "
             "(train.prompts_per_step x rl.num_generations)")
    minibatch = rollouts // minibatches
    micro = micro or minibatch
    _require(minibatch % micro == 0, "rl.micro_batch_size",
             f"{micro} does not divide the minibatch of {minibatch} rollouts")
    _require(micro % num_data_shards == 0, "rl.micro_batch_size",
             f"micro-batches of {micro} rollouts cannot be split over {num_data_shards} data-parallel "
             "devices (config.mesh); use a multiple")
    _require(config.eval.batch_size % num_data_shards == 0, "eval.batch_size",
             f"{config.eval.batch_size} is not divisible by the {num_data_shards} data-parallel devices")
