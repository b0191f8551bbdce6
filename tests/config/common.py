"""What the tests of the typed run config share: the config files by name, a config's dict
with changes, and the error a config meets."""

import copy

import pytest

from configs import default, tiny, toolrl
from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.tasks import task_of

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
