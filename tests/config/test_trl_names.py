"""TRL's names where they mean the same thing (issue 62, item 8; gd2po_jax/config/rl.py): rl.scale_rewards,
TRL's loss_type names as the verl modes they equal (the others refused naming the nearest), rl.num_iterations
as ppo_epochs, rl.mask_truncated_completions, and a "did you mean" that knows TRL's names."""

from __future__ import annotations

import json
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from bench.harness import step_config
from gd2po_jax.cli import override_error_message, trl_aliases
from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.config.rl import SCALE_REWARDS, TRL_LOSS_TYPES
from gd2po_jax.rl.advantages import compute_advantages
from gd2po_jax.rl.train_step import step_advantages
from tests.fakes import REPO, subprocess_env, tiny_config, tiny_run_config
from tests.xla_env import xla_flags


def _rl(**changes):
    values = json.loads(tiny_run_config().to_json())
    values["rl"].update(changes)
    return RunConfig.from_dict(values).rl


@pytest.mark.parametrize("trl, verl", sorted(TRL_LOSS_TYPES.items()))
def test_trls_loss_types_are_the_verl_modes_they_equal(trl, verl):
    assert tiny_run_config(rl__loss_agg_mode=trl).rl.loss_agg_mode == verl
    assert _rl(loss_type=trl).loss_agg_mode == verl  # TRL's field name too (a config file, config.json)


@pytest.mark.parametrize("trl, nearest", [("bnpo", "token-mean"), ("cispo", "token-mean"),
                                          ("luspo", "seq-mean-token-mean")])
def test_a_trl_loss_type_with_no_equal_is_refused_naming_the_nearest(trl, nearest):
    with pytest.raises(ConfigError, match=rf"^config\.rl\.loss_agg_mode: TRL's loss_type '{trl}' has no equal "
                                          rf"here; the nearest is '{nearest}'"):
        tiny_run_config(rl__loss_agg_mode=trl)
    with pytest.raises(ConfigError, match=r"'nonsense' is not one of"):
        tiny_run_config(rl__loss_agg_mode="nonsense")


def test_num_iterations_is_ppo_epochs():
    assert _rl(num_iterations=3).ppo_epochs == 3  # over the config file's ppo_epochs
    assert trl_aliases(["train.py", "--config.rl.num_iterations=2", "--config.rl.loss_type=dapo", "--config.rl.x=1"]) \
        == ["train.py", "--config.rl.ppo_epochs=2", "--config.rl.loss_agg_mode=dapo", "--config.rl.x=1"]


def test_scale_rewards_is_the_group_normalizations_divisor():
    assert tiny_run_config().rl.scale_rewards == "group" and SCALE_REWARDS == ("group", "batch", "none")
    with pytest.raises(ConfigError, match=r"^config\.rl\.scale_rewards: 'sequence' is not one of"):
        tiny_run_config(rl__scale_rewards="sequence")
    rng = np.random.default_rng(0)
    rewards = jnp.asarray(rng.integers(0, 3, size=(4, 4, 2)).astype(np.float32))
    lengths, valid = jnp.full((4, 4), 5), jnp.ones(4, bool)
    for algorithm in ("grpo", "gdpo", "gd2po_snr"):
        outputs = []
        for scale in SCALE_REWARDS:
            config = step_config(algorithm=algorithm, scale_rewards=scale)
            got = step_advantages(rewards, lengths, valid, config).advantages
            want = compute_advantages(rewards, lengths, algorithm, snr_tau=config.rl.snr_tau, group_scale=scale,
                                      batch_norm=config.rl.batch_norm, group_eps=config.rl.group_eps).advantages
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
            outputs.append(np.asarray(got))
        if algorithm == "grpo":  # GRPO has no batch step: the divisor shows
            assert not np.allclose(outputs[0], outputs[2])


def test_mask_truncated_completions_is_a_flag():
    assert tiny_run_config().rl.mask_truncated_completions is False
    assert tiny_run_config(rl__mask_truncated_completions=True).rl.mask_truncated_completions is True
    with pytest.raises(ConfigError, match=r"^config\.rl\.mask_truncated_completions"):
        _rl(mask_truncated_completions="yes")


def test_did_you_mean_knows_trls_names():
    error = AttributeError('Did you mean "kl_coef" instead of "beta"?')
    line = override_error_message(["train.py", "--config.rl.beta=0.04"], error)
    assert line == ("--config.rl.beta=0.04: config.rl has no field 'beta'; TRL's beta is --config.rl.kl_coef here "
                    "(the fields are those of the --config file)")
    error = AttributeError('Did you mean "num_generations" instead of "max_completion_length"?')
    line = override_error_message(["train.py", "--config.rl.max_completion_length=64"], error)
    assert "TRL's max_completion_length is --config.sampling.max_new_tokens here" in line


def test_the_command_line_takes_trls_names(tmp_path):
    """``--config.rl.num_iterations`` reaches rl.ppo_epochs (its check names the field); TRL's beta gets
    TRL's answer, not the nearest spelling."""
    def train(*args):
        proc = subprocess.run([sys.executable, str(REPO / "train.py"), f"--workdir={tmp_path / 'run'}",
                               f"--config={REPO / 'configs/tiny.py'}", *args], cwd=tmp_path,
                              env=subprocess_env(XLA_FLAGS=xla_flags(1)), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        return proc.stderr.strip().splitlines()[-1]

    assert train("--config.rl.num_iterations=0").startswith("train.py: config.rl.ppo_epochs: ")
    assert "TRL's beta is --config.rl.kl_coef here" in train("--config.rl.beta=0.04")
    assert tiny_config() is not None
