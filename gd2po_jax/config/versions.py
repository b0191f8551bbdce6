"""The config format's versions, and `upgrade`, which brings a run's config.json written by an older
version up to the current one.

A version changes when a field's default changes: a config.json leaves out no field that existed when
it was written, but a run written before a field existed lacks it, and that run computed with the
field's default of then. `RunConfig.config_version` records the version in every config.json (one
without it is version 1); `upgrade` fills, version by version, the old default of each field whose
default changed where the file lacks the field, so that a resumed, evaluated or exported run goes on
with the values it computed with. `gd2po_jax.runtime.run_dir.load_run_config` calls it on every
config.json it reads.

Version 2 (issue 57): the dataclass defaults became the recommended values of configs/default.py
(`OLD_DEFAULTS` [2] lists what they were). Version 3 (issue 58): dynamic sampling refills inside the
rollout engine (``rl.dynamic_sampling_refill``; before, rounds).

May import: gd2po_jax.config.base.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gd2po_jax.config.base import ConfigError, _is_int

CONFIG_VERSION = 3
"""The version of the config format this code writes (`RunConfig.config_version`)."""

OLD_DEFAULTS: dict[int, dict[str, Any]] = {
    2: {
        "rl.old_logprobs": "sampler",
        "rl.skip_zero_advantage_rows": False,
        "rewards.timeout_s": 0.0,
        "rewards.max_failed_fraction": 1.0,
        "sft.length_bucket": 0,
    },
    3: {"rl.dynamic_sampling_refill": "rounds"},
}
"""For each version, the defaults (dotted name -> value) the fields whose default it changed had
before it: what `upgrade` fills into an older config.json that lacks them."""


def version_of(values: Mapping[str, Any]) -> int:
    """The config version of a config.json's values: its ``config_version``, else 1.

    Raises:
      ConfigError: naming config.config_version when it is not a version this code can read.
    """
    version = values.get("config_version", 1)
    if not (_is_int(version) and 1 <= version <= CONFIG_VERSION):
        raise ConfigError(
            f"config.config_version: {version!r} is not a config version this gd2po_jax reads "
            f"(1 to {CONFIG_VERSION}); a newer gd2po_jax wrote it?"
        )
    return version


def upgrade(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a run's config.json values (a nested mapping) brought up to `CONFIG_VERSION`: for each
    version after the file's, each field of `OLD_DEFAULTS` that the file lacks takes its old default;
    then ``config_version`` is the current one. Values the file has are kept; a section it lacks is
    left out (`RunConfig.from_dict` names it).

    Raises:
      ConfigError: ``config_version`` is not a version this code reads.
    """
    if not isinstance(values, Mapping):
        raise ConfigError(f"config: must be a group of config sections, got {values!r}")
    version = version_of(values)
    out = copy.deepcopy(dict(values))
    for step in range(version + 1, CONFIG_VERSION + 1):
        for dotted, old in OLD_DEFAULTS.get(step, {}).items():
            *parents, name = dotted.split(".")
            node: Any = out  # a section (dict) or, past the last one, any value
            for parent in parents:
                node = node.get(parent) if isinstance(node, Mapping) else None
            if isinstance(node, dict) and name not in node:
                node[name] = copy.deepcopy(old)
    out["config_version"] = CONFIG_VERSION
    return out
