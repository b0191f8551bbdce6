"""The config format's versions (`gd2po_jax.config.versions`): a config.json written before
``config_version`` existed (version 1) loads with the old defaults its run used; one of the current
version round-trips; a version this code does not know is refused."""

import dataclasses
import json
import typing

import pytest

from configs import default
from gd2po_jax.config import CONFIG_VERSION, ConfigError, RewardsConfig, RLConfig, RunConfig, SFTConfig, upgrade
from gd2po_jax.config.base import _Section
from gd2po_jax.config.tasks import SyntheticDataConfig
from gd2po_jax.config.versions import OLD_DEFAULTS
from gd2po_jax.runtime import run_dir
from gd2po_jax.tasks.synthetic_tools import task as synthetic_tools
from gd2po_jax.tasks.synthetic_tools.data import SyntheticToolsConfig

CHANGED = {"rl.old_logprobs": ("sampler", "recompute"), "rl.skip_zero_advantage_rows": (False, True),
           "rewards.timeout_s": (0.0, 600.0), "rewards.max_failed_fraction": (1.0, 0.1),
           "sft.length_bucket": (0, 16)}
"""The defaults version 2 changed: dotted name -> (old default, new default)."""
CHANGED_3 = {"rl.dynamic_sampling_refill": ("rounds", "engine")}
"""Version 3's (issue 58): dynamic sampling refills inside the engine."""
SECTIONS = {"rl": RLConfig, "rewards": RewardsConfig, "sft": SFTConfig}


def current_json() -> dict:
    """configs/default.py as its run's config.json (the current version)."""
    return json.loads(RunConfig.from_config_dict(default.get_config()).to_json())


def version_1_json() -> dict:
    """configs/default.py as a run made before config_version existed wrote it, without the fields
    added since (they were absent then, and took their defaults)."""
    old = current_json()
    del old["config_version"]
    del old["sft"]["seed"], old["sft"]["cache_dir"], old["sampling"]["prompts_per_call"]
    del old["data"]["synthetic"]["num_candidates"], old["data"]["synthetic"]["habit_rate"]
    del old["rewards"]["timeout_s"], old["rewards"]["max_failed_fraction"]
    del old["rl"]["tempered_logprobs"], old["train"]["max_consecutive_skipped_steps"]
    del old["rewards"]["reward_models"], old["rewards"]["offload"], old["rl"]["length_bucket"]
    for name in ("old_logprobs", "rollout_is_cap", "shuffle_minibatches", "micro_batch_max_tokens",
                 "micro_batch_ranks", "query_reweighting", "snr_eps", "halves_ranking"):
        del old["rl"][name]  # issue 36's fields
    del old["rl"]["skip_zero_advantage_rows"]
    del old["sft"]["length_bucket"]
    del old["rl"]["dynamic_sampling_refill"]  # issue 58's
    return old


def test_the_changed_defaults_are_configs_default_values_and_versions_2_and_3_record_the_old_ones():
    assert CONFIG_VERSION == 3 and {name: old for name, (old, _) in CHANGED.items()} == OLD_DEFAULTS[2]
    assert {name: old for name, (old, _) in CHANGED_3.items()} == OLD_DEFAULTS[3]
    values = current_json()
    for dotted, (old, new) in (CHANGED | CHANGED_3).items():
        section, name = dotted.split(".")
        assert values[section][name] == new != old, dotted  # what configs/default.py sets
        assert getattr(SECTIONS[section], name) == new, dotted  # the dataclass default


def test_every_dataclass_default_is_configs_default_value():
    """The defaults are configs/default.py's values (data.synthetic's None is the task's own default). A
    test that fails here after a default changed: bump CONFIG_VERSION and record the old default in
    versions.OLD_DEFAULTS, so that older runs' config.json keep the value they ran with."""

    def check(cls, values, prefix):
        for field in dataclasses.fields(cls):
            hint = typing.get_type_hints(cls)[field.name]
            if isinstance(hint, type) and issubclass(hint, _Section) and hint is not SyntheticDataConfig:
                check(hint, values[field.name], f"{prefix}{field.name}.")
            elif field.default is not dataclasses.MISSING and field.name in values:
                assert values[field.name] == field.default, f"{prefix}{field.name}"

    check(RunConfig, default.get_config().to_dict(), "")


def test_an_older_config_json_loads_with_the_values_its_run_used(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(version_1_json()))
    config = run_dir.load_run_config(tmp_path)
    assert config.config_version == CONFIG_VERSION
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
    assert config.rl.dynamic_sampling_refill == "rounds"  # refilled by rounds then
    # Synthetic-task fields it lacks take the task's defaults and stay out of its dict (and its
    # warm-start key), as before.
    assert config.data.synthetic.num_candidates is None
    task = synthetic_tools.world_config(config.data.synthetic)
    assert (task.num_candidates, task.habit_rate) == (SyntheticToolsConfig.num_candidates,
                                                      SyntheticToolsConfig.habit_rate)
    assert task.habit_fraction == 0.5  # what it sets
    assert "num_candidates" not in config.to_dict()["data"]["synthetic"]


def test_upgrade_keeps_what_a_version_1_file_has_and_does_not_change_its_argument():
    old = version_1_json()
    old["rl"]["old_logprobs"], old["sft"]["length_bucket"] = "recompute", 32  # recorded values win
    before = json.dumps(old, sort_keys=True)
    new = upgrade(old)
    assert json.dumps(old, sort_keys=True) == before  # a copy
    assert (new["config_version"], new["rl"]["old_logprobs"], new["sft"]["length_bucket"]) == (3, "recompute", 32)
    assert new["rl"]["dynamic_sampling_refill"] == "rounds"  # version 3's old default
    assert (new["rl"]["skip_zero_advantage_rows"], new["rewards"]["timeout_s"]) == (False, 0.0)
    assert "seed" not in new["sft"]  # a field whose default did not change keeps taking it
    del old["rewards"]
    assert "rewards" not in upgrade(old)  # a missing section stays missing, for RunConfig to name
    with pytest.raises(ConfigError, match=r"config\.rewards is missing"):
        RunConfig.from_config_dict(upgrade(old))


def test_a_current_config_json_round_trips(tmp_path):
    config = RunConfig.from_config_dict(default.get_config())
    assert config.config_version == CONFIG_VERSION and config.to_dict()["config_version"] == CONFIG_VERSION
    run_dir.write_config(tmp_path, config)
    assert json.loads((tmp_path / "config.json").read_text())["config_version"] == CONFIG_VERSION
    assert upgrade(current_json()) == current_json()  # nothing to do
    assert run_dir.load_run_config(tmp_path) == config


@pytest.mark.parametrize("version", [0, 4, "2", 2.0, None])
def test_a_version_this_code_does_not_read_is_refused(tmp_path, version):
    values = current_json()
    values["config_version"] = version
    (tmp_path / "config.json").write_text(json.dumps(values))
    with pytest.raises(ConfigError, match=r"config\.config_version: .* not a config version"):
        run_dir.load_run_config(tmp_path)


def test_an_older_version_given_to_run_config_directly_is_refused_naming_upgrade():
    values = version_1_json()
    values["config_version"] = 1
    with pytest.raises(ConfigError, match=r"^config\.config_version: 1: .*versions\.upgrade"):
        RunConfig.from_config_dict(values)
    assert RunConfig.from_config_dict(upgrade(values)).rl.old_logprobs == "sampler"
