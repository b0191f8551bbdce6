"""Using a typed config: frozen, `RunConfig.replace` gives a validated copy, `as_run_config`
converts once."""

import dataclasses

import pytest

from configs import tiny
from gd2po_jax.config import ConfigError, RunConfig
from tests.fakes import (
    as_run_config,
)

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
