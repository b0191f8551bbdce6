"""The whole run config (`RunConfig`) and the one rule of batch divisibility (`check_batch_layout`),
the checks that depend on more than one section or on the device mesh.

May import: the other modules of gd2po_jax.config.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from gd2po_jax.config.base import ConfigError, _is_int, _require, _Section, _text
from gd2po_jax.config.data import DataConfig
from gd2po_jax.config.model import PolicyModelConfig
from gd2po_jax.config.outputs import CheckpointConfig, EvalConfig, ExportConfig, LoggingConfig
from gd2po_jax.config.rewards import RewardsConfig
from gd2po_jax.config.rl import RLConfig
from gd2po_jax.config.runtime import DistributedConfig, MeshConfig
from gd2po_jax.config.train import SamplingConfig, SFTConfig, TrainConfig
from gd2po_jax.config.versions import CONFIG_VERSION


def check_batch_layout(
    rollouts: int, num_minibatches: int, micro_batch_size: int, num_data_shards: int = 1
) -> tuple[int, int]:
    """(minibatch rows, micro-batch rows) of a step: the one rule of batch divisibility.

    The B = P x G ``rollouts`` of a step split into ``num_minibatches`` minibatches (one optimizer
    step each), and each minibatch into micro-batches of ``micro_batch_size`` rows (0: the whole
    minibatch) whose gradients are summed. With the batch split over ``num_data_shards`` devices
    (mesh data x fsdp), the rollouts and every micro-batch must divide by it too.

    Raises:
      ValueError: the message starts with the config field at fault, ``train.prompts_per_step``,
        ``rl.num_minibatches`` or ``rl.micro_batch_size``, then a colon.
    """
    if rollouts % num_data_shards:
        raise ValueError(
            f"train.prompts_per_step: the {rollouts} rollouts of a step (train.prompts_per_step x "
            f"rl.num_generations) cannot be split over {num_data_shards} data-parallel devices (config.mesh)"
        )
    if rollouts % num_minibatches:
        raise ValueError(
            f"rl.num_minibatches: {num_minibatches} does not divide the {rollouts} rollouts of a step "
            "(train.prompts_per_step x rl.num_generations)"
        )
    minibatch = rollouts // num_minibatches
    micro = micro_batch_size or minibatch
    if minibatch % micro:
        raise ValueError(f"rl.micro_batch_size: {micro} does not divide the minibatch of {minibatch} rollouts")
    if micro % num_data_shards:
        raise ValueError(
            f"rl.micro_batch_size: micro-batches of {micro} rollouts cannot be split over "
            f"{num_data_shards} data-parallel devices (config.mesh); use a multiple"
        )
    return minibatch, micro


def _batch_layout(config: RunConfig, num_data_shards: int) -> tuple[int, int]:
    """`check_batch_layout` of a step's rollouts, its error as a `ConfigError`."""
    rollouts = config.train.prompts_per_step * config.rl.num_generations
    try:
        return check_batch_layout(rollouts, config.rl.num_minibatches, config.rl.micro_batch_size, num_data_shards)
    except ValueError as err:  # its message starts with the field at fault
        raise ConfigError(f"config.{err}") from None


SECRET_NAME = re.compile(r"key|token|secret|password", re.IGNORECASE)
"""An option whose name matches looks like a secret (``api_key``, ``hf_token``, ``client_secret``,
``password``): its value is never written to config.json nor sent to W&B (`redacted`)."""
REDACTED = "<redacted>"
"""What config.json and W&B hold in place of a secret's value."""


def redacted(values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(a copy of ``values`` -- a config as a nested dict, `RunConfig.to_dict` -- whose secrets are
    `REDACTED`, the dotted fields redacted). A secret is a string value, at any depth of a reward
    function's ``options`` (``rewards.functions[i].options``), whose name matches `SECRET_NAME`;
    numbers and booleans (``max_tokens: 64``) are kept. Secrets belong in the environment: a reward
    function reads ``os.environ["MY_API_KEY"]`` (docs/reliability.md)."""
    values = copy.deepcopy(values)
    fields: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for name, value in node.items():
                if isinstance(value, str) and SECRET_NAME.search(str(name)) and value != REDACTED:
                    node[name] = REDACTED
                    fields.append(f"{where}.{name}")
                else:
                    walk(value, f"{where}.{name}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{where}[{index}]")

    functions = (values.get("rewards") or {}).get("functions") or ()
    for index, entry in enumerate(functions):
        if isinstance(entry, dict) and isinstance(entry.get("options"), dict):
            walk(entry["options"], f"rewards.functions[{index}].options")
    return values, fields


def redacted_fields(values: Any) -> list[str]:
    """The dotted fields of ``values`` (a config as a nested dict) that hold `REDACTED`: secrets a
    config.json does not have (`redacted`)."""
    found: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for name, value in node.items():
                walk(value, f"{where}.{name}" if where else str(name))
        elif isinstance(node, (list, tuple)):
            for index, value in enumerate(node):
                walk(value, f"{where}[{index}]")
        elif node == REDACTED:
            found.append(where)

    walk(values, "")
    return found


@dataclasses.dataclass(frozen=True)
class RunConfig(_Section):
    """The whole config of a run, as configs/*.py write it; build it with `from_config_dict`."""

    task: str
    """Where prompts come from: the name of a registered task (`gd2po_jax.tasks`; its own fields are checked
    by `gd2po_jax.tasks.task_of`): synthetic_tools (generated, ``data.synthetic``) | files (``data.train``
    ...) | safety_embedded (generated, ``data.safety``, with reward models trained on it)."""
    model: PolicyModelConfig
    """The policy."""
    data: DataConfig
    """The prompts."""
    rewards: RewardsConfig
    """The reward functions."""
    rl: RLConfig
    """The advantages and the loss."""
    sampling: SamplingConfig
    """The rollouts."""
    train: TrainConfig
    """The RL loop and its optimizer."""
    sft: SFTConfig
    """The warm start."""
    checkpoint: CheckpointConfig
    """The checkpoints."""
    eval: EvalConfig
    """The evaluations."""
    mesh: MeshConfig
    """The device mesh."""
    distributed: DistributedConfig = DistributedConfig()
    """How the processes of a multi-host run find each other (default: one process)."""
    export: ExportConfig = ExportConfig()
    """The dtype of the exported policy (default: model.dtype)."""
    logging: LoggingConfig = LoggingConfig()
    """Rollout files and Weights & Biases (default: neither)."""
    config_version: int = CONFIG_VERSION
    """The config format's version (`gd2po_jax.config.versions`), written into config.json. A config.json
    of an older version (without this field: version 1) is brought up to date by
    `gd2po_jax.config.versions.upgrade` when it is read (`gd2po_jax.runtime.run_dir.load_run_config`)."""

    def __post_init__(self):
        _text(self.task, "task", "the name of a registered task (gd2po_jax.tasks) or module:object of your own")
        _require(
            _is_int(self.config_version) and self.config_version == CONFIG_VERSION,
            "config_version",
            f"{self.config_version!r}: this gd2po_jax reads version {CONFIG_VERSION}; an older config.json "
            "is upgraded by gd2po_jax.config.versions.upgrade (gd2po_jax.runtime.run_dir.load_run_config "
            "does it)",
        )
        prompts, per_call = self.train.prompts_per_step, self.sampling.prompts_per_call
        _require(
            per_call == 0 or per_call >= prompts or prompts % per_call == 0,
            "sampling.prompts_per_call",
            f"{per_call} must be 0 (all at once), at least, or a divisor of train.prompts_per_step={prompts}",
        )
        _batch_layout(self, num_data_shards=1)
        if self.rl.micro_batch_max_tokens:
            rollouts, parts = prompts * self.rl.num_generations, self.rl.num_minibatches * self.rl.micro_batch_ranks
            _require(
                rollouts % parts == 0,
                "rl.micro_batch_ranks",
                f"the {rollouts} rollouts of a step do not split into {self.rl.micro_batch_ranks} ranks x "
                f"{self.rl.num_minibatches} minibatches (rl.num_minibatches) of equal size",
            )

    @classmethod
    def from_config_dict(cls, config: Any) -> RunConfig:
        """The typed, validated config of an ``ml_collections.ConfigDict`` (configs/*.py, with the
        command line's overrides) or of a plain nested mapping (a run's config.json, once
        `gd2po_jax.config.versions.upgrade` has brought it up to date).

        Raises:
          ConfigError: naming the first invalid, unknown or missing field.
        """
        return cls.from_dict(config.to_dict() if hasattr(config, "to_dict") else config)

    def check_mesh(self, num_data_shards: int) -> None:
        """The checks that depend on the devices: the step's rollouts, each micro-batch and each
        evaluation batch must split evenly over the ``num_data_shards`` devices the batch is split
        over (mesh data x fsdp).

        Raises:
          ConfigError: naming the field to change.
        """
        _batch_layout(self, num_data_shards)
        _require(
            self.eval.batch_size % num_data_shards == 0,
            "eval.batch_size",
            f"{self.eval.batch_size} is not divisible by the {num_data_shards} data-parallel devices",
        )
        if self.rewards.kind == "reward_model":
            for name, model in self.rewards.reward_models.items():
                _require(
                    model.batch_size % num_data_shards == 0,
                    f"rewards.reward_models.{name}.batch_size",
                    f"{model.batch_size} is not divisible by the {num_data_shards} data-parallel devices",
                )

    def to_json(self, *, redact: bool = False) -> str:
        """The text of a run's ``config.json``: indented JSON with sorted keys (what
        ``ConfigDict.to_json_best_effort(indent=2, sort_keys=True)`` writes for the same config);
        with ``redact``, secrets replaced by `REDACTED` (`redacted`)."""
        values = self.to_dict()
        return json.dumps(redacted(values)[0] if redact else values, indent=2, sort_keys=True)

    def replace(self, changes: Mapping[str, Any]) -> RunConfig:
        """A validated copy with ``changes`` (dotted name -> value, e.g. ``{"rl.algorithm": "gdpo"}``).

        Raises:
          ConfigError: for an unknown name or an invalid result.
        """
        values = self.to_dict()
        for dotted, value in changes.items():
            *parents, name = dotted.split(".")
            node: Any = values  # a section (dict) or, past the last one, any value
            for depth, parent in enumerate(parents):
                node = node.get(parent) if isinstance(node, dict) else None
                if not isinstance(node, dict):
                    raise ConfigError(f"config.{'.'.join(parents[: depth + 1])}: not a section, cannot set {dotted}")
            node[name] = value
        return RunConfig.from_dict(values)
