"""A resolved config: the ``config.json`` of a run (or a copy of one), as train.py wrote it.

    python train.py --config=configs/resolved.py:runs/default/config.json --workdir=DIR

runs again exactly what that run ran; ``--config.*`` overrides apply on top as usual. sweep.py
launches each of its runs this way, from the config it resolved into the run's workdir.
"""

import ml_collections

from gd2po_jax.run_dir import load_config


def get_config(path: str) -> ml_collections.ConfigDict:
    # Through the typed config: validated, and with tuple fields as tuples again (JSON has lists),
    # so that --config.rewards.names=a,b overrides them as it does those of configs/default.py.
    return ml_collections.ConfigDict(load_config(path).to_dict())
