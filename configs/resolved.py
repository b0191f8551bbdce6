"""A resolved config: the ``config.json`` of a run (or a copy of one), as train.py wrote it.

    python train.py --config=configs/resolved.py:runs/default/config.json --workdir=DIR

runs again exactly what that run ran; ``--config.*`` overrides apply on top as usual. sweep.py
launches each of its runs this way, from the config it resolved into the run's workdir.
"""

import ml_collections

from gd2po_jax.config import ConfigError, DistributedConfig
from gd2po_jax.config.run import redacted_fields
from gd2po_jax.runtime.run_dir import load_run_config


def get_config(path: str) -> ml_collections.ConfigDict:
    # Through the typed config: validated, and with tuple fields as tuples again (JSON has lists),
    # so that --config.rewards.names=a,b overrides them as it does those of configs/default.py.
    values = load_run_config(path).to_dict()
    # Secrets are not in a config.json (gd2po_jax.runtime.run_dir.write_config): a rerun from it would
    # hand the reward functions the placeholder. They belong in the environment (docs/reliability.md).
    secrets = [field for field in redacted_fields(values) if field.startswith("rewards.")]
    if secrets:
        raise ConfigError(
            f"{path}: {', '.join(secrets)} looked like a secret and was not written there; have the reward "
            "function read it from the environment (os.environ; docs/reliability.md), or give it with "
            "--config=configs/<your config>.py instead"
        )
    # How the run was launched (process 0's coordinator ...) is not what it computes: a rerun is
    # launched anew, one process unless --config.distributed.* says otherwise.
    values["distributed"] = DistributedConfig().to_dict()
    return ml_collections.ConfigDict(values)
