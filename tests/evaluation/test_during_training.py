"""gd2po_jax/evaluation/during_training.py: what a training run evaluates (a split or eval.sets,
checked when it starts) and its evaluations as metrics.jsonl's eval/... (the evaluations themselves
run in tests/jobs/test_train.py and tests/evaluation/test_command.py)."""

import types

import pytest

from configs import safety
from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.evaluation import during_training
from gd2po_jax.rewards.reward_model import RewardModelReward
from tests.fakes import as_run_config, data_files


def test_a_run_config_without_the_new_eval_and_reward_model_fields_loads_with_their_defaults():
    """config.json of runs before eval.sets, eval.max_total_tokens and reward_models.<name>.truncation."""
    values = as_run_config(safety.get_config()).to_dict()
    del values["eval"]["sets"], values["eval"]["max_total_tokens"]
    for model in values["rewards"]["reward_models"].values():
        del model["truncation"]
    config = RunConfig.from_config_dict(values)
    assert (config.eval.sets, config.eval.max_total_tokens) == ("", 0)
    assert {m.truncation for m in config.rewards.reward_models.values()} == {"right"}
    with pytest.raises(ConfigError, match=r"config\.rewards\.reward_models\.useful\.truncation: 'left' is not one of"):
        as_run_config(safety.get_config()).replace({"rewards.reward_models.useful.truncation": "left"})
    with pytest.raises(ConfigError, match=r"config\.eval\.max_total_tokens: must be an integer >= 0"):
        as_run_config(safety.get_config()).replace({"eval.max_total_tokens": -1})


def test_eval_target_is_the_sets_or_the_split_and_checks_the_sets(tmp_path):
    """A run with eval.sets evaluates them ("sets"), scored by its reward models alone; checked when the
    run starts, naming config.eval.sets."""
    config = as_run_config(safety.get_config())
    reward_models = types.SimpleNamespace(reward_fn=RewardModelReward.__new__(RewardModelReward))
    sets = str(data_files() / "safe_alignment")
    assert during_training.eval_target(config.replace({"eval.sets": sets}), reward_models) == during_training.SETS
    with pytest.raises(ConfigError, match=rf"^config\.eval\.sets='{tmp_path}/none': .*does not exist"):
        during_training.eval_target(config.replace({"eval.sets": str(tmp_path / "none")}), reward_models)
    with pytest.raises(ConfigError, match=r"^config\.eval\.sets: helpfulness-safety sets are scored by the run's "
                                          r"reward models, but its rewards are config\.rewards\.kind='tool_calling'"):
        during_training.eval_target(config.replace({"eval.sets": sets, "rewards.kind": "tool_calling",
                                             "rewards.names": ("correctness",), "rewards.reward_models": {}}),
                             types.SimpleNamespace(reward_fn=object()))


def test_eval_metrics_of_a_split_and_of_sets():
    split = {"split": "validation", "num_examples": 8, "useful": 1.0, "reward_names": ["useful"]}
    assert during_training.eval_metrics(split) == {"eval/num_examples": 8, "eval/useful": 1.0}
    per_set = {"a": {"num_examples": 2, "useful": 1.0}, "b": {"num_examples": 2, "useful": 3.0}}
    sets = {"useful": 2.0, "sets": per_set, "overall": {"useful": 2.0, "num_examples": 4}, "max_new_tokens": 8}
    assert during_training.eval_metrics(sets) == {"eval/useful": 2.0, "eval/num_examples": 4, "eval/a/num_examples": 2,
                                           "eval/a/useful": 1.0, "eval/b/num_examples": 2, "eval/b/useful": 3.0}
    config = as_run_config(safety.get_config())
    # A split's before-RL evaluation: eval/before_rl.json only.
    assert during_training.logged_before_rl(config, sets) == {}
    assert during_training.logged_before_rl(config.replace({"eval.sets": "DIR"}), sets) == \
        during_training.eval_metrics(sets)
    assert during_training.logged_before_rl(config.replace({"eval.sets": "DIR"}), None) == {}
