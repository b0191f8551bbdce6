"""The run config, typed: frozen dataclasses built once from a configs/*.py ``ConfigDict``.

Owns: every section of the run config (its fields, their documentation, defaults and checks), the
batch-layout rule, and the config format's versions (`versions.upgrade` of an older config.json).
May import: errors.
Its modules import only each other and `gd2po_jax.errors` (the base of `ConfigError`), checked by
tests/test_package.py; every other package may import it.

Experiments are Python files in ``configs/`` that return an ``ml_collections.ConfigDict``, so that
``--config.rl.snr_tau=0.5`` overrides any field from the command line. The entry points
(train.py, eval.py, sweep.py) convert that ConfigDict once with `RunConfig.from_config_dict`;
every library function takes the typed `RunConfig` (or one of its sections), with the
same dotted names (``config.rl.algorithm``, ``config.sampling.temperature`` ...)::

    config = RunConfig.from_config_dict(configs.default.get_config())   # validated
    config.check_mesh(num_data_shards=8)                                # the mesh-dependent checks
    config.to_dict()                                                    # == the ConfigDict's to_dict()

Each field is documented beside it, in the module of its section; its default is the recommended
value (configs/default.py's). The modules:

    base.py      `ConfigError`, the checks that name a field, `_Section` (mapping <-> section)
    model.py     config.model: `PolicyModelConfig`, `LoRAConfig`, `TinyModelConfig`
    data.py      config.data: `DataConfig`
    tasks.py     the sections only one task reads: `SyntheticDataConfig`, `SafetyDataConfig`,
                 `RewardTrainingConfig`
    rewards.py   config.rewards: `RewardsConfig`, `RewardModelConfig`, `FunctionEntry`
    rl.py        config.rl: `RLConfig`
    train.py     config.sampling, config.train, config.sft: `SamplingConfig`, `TrainConfig`, `SFTConfig`
    outputs.py   config.checkpoint, config.eval, config.export, config.logging: `CheckpointConfig`,
                 `EvalConfig`, `ExportConfig`, `LoggingConfig`, `WandbConfig`
    runtime.py   config.mesh, config.distributed: `MeshConfig`, `DistributedConfig`
    run.py       `RunConfig`, `check_batch_layout`
    versions.py  `CONFIG_VERSION`, `upgrade` (an older config.json, with the old defaults it ran with)

Each field is checked where it is defined (``__post_init__``), before anything is computed; a
`ConfigError` names the dotted field and the value. Every number must be finite (``inf`` or ``nan``
from the command line is refused). The fields only one task reads (``data.synthetic``,
``data.safety``, the files task's paths) are checked by that task (`gd2po_jax.tasks.task_of`) when
the run starts. Fields that depend on more than one section (the batch layout, the files task's
data) are checked by `RunConfig`, and those that depend on the device mesh by
`RunConfig.check_mesh`. The paper's symbols (G, tau, eps_low ...) are those of
docs/algorithm.md#notation; configs/default.py and docs/embedded_task.md say why the default values
are what they are.
"""

from gd2po_jax.config.base import DTYPES, ConfigError
from gd2po_jax.config.data import DATA_KINDS, PROMPT_TRUNCATIONS, DataConfig
from gd2po_jax.config.model import (
    ATTENTION_IMPLEMENTATIONS,
    LORA_TARGETS,
    REMAT_POLICIES,
    LoRAConfig,
    PolicyModelConfig,
    TinyModelConfig,
    remat_policy_name,
)
from gd2po_jax.config.outputs import (
    EVAL_SPLITS,
    WANDB_MODES,
    CheckpointConfig,
    EvalConfig,
    ExportConfig,
    LoggingConfig,
    WandbConfig,
)
from gd2po_jax.config.rewards import (
    FUNCTION_ON_ERROR,
    REWARD_MODEL_TRUNCATIONS,
    FunctionEntry,
    RewardModelConfig,
    RewardsConfig,
)
from gd2po_jax.config.rl import (
    ALGORITHMS,
    BATCH_NORMS,
    HALVES_RANKINGS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    OLD_LOGPROBS,
    SNR_HALF_ALGORITHMS,
    RLConfig,
)
from gd2po_jax.config.run import RunConfig, check_batch_layout
from gd2po_jax.config.runtime import AUTO_COORDINATOR, DistributedConfig, MeshConfig
from gd2po_jax.config.tasks import RewardTrainingConfig, SafetyDataConfig, SyntheticDataConfig
from gd2po_jax.config.train import (
    MIN_BF16_MASTER_LEARNING_RATE,
    PREEMPTION_SIGNALS,
    SamplingConfig,
    SFTConfig,
    TrainConfig,
)
from gd2po_jax.config.versions import CONFIG_VERSION, upgrade

__all__ = [
    "ALGORITHMS",
    "ATTENTION_IMPLEMENTATIONS",
    "AUTO_COORDINATOR",
    "BATCH_NORMS",
    "CONFIG_VERSION",
    "DATA_KINDS",
    "DTYPES",
    "EVAL_SPLITS",
    "FUNCTION_ON_ERROR",
    "HALVES_RANKINGS",
    "KL_ESTIMATORS",
    "LORA_TARGETS",
    "LOSS_AGG_MODES",
    "MIN_BF16_MASTER_LEARNING_RATE",
    "OLD_LOGPROBS",
    "PREEMPTION_SIGNALS",
    "PROMPT_TRUNCATIONS",
    "REMAT_POLICIES",
    "REWARD_MODEL_TRUNCATIONS",
    "SNR_HALF_ALGORITHMS",
    "WANDB_MODES",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "DistributedConfig",
    "EvalConfig",
    "ExportConfig",
    "FunctionEntry",
    "LoRAConfig",
    "LoggingConfig",
    "MeshConfig",
    "PolicyModelConfig",
    "RLConfig",
    "RewardModelConfig",
    "RewardTrainingConfig",
    "RewardsConfig",
    "RunConfig",
    "SFTConfig",
    "SafetyDataConfig",
    "SamplingConfig",
    "SyntheticDataConfig",
    "TinyModelConfig",
    "TrainConfig",
    "WandbConfig",
    "check_batch_layout",
    "remat_policy_name",
    "upgrade",
]
