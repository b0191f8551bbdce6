"""configs/safety.py end to end on CPU, tiny: a random policy and two random score models in two
layouts (one with the policy's tokenizer, one with another vocabulary and chat template), the tiny
Alpaca-format prompts of tests/fixture_data.py as training data. One run trains a step, is resumed
for two more, validating on the three helpfulness-safety sets of a directory (the tiny ones, in the
real files' format; ``eval.sets``) before RL, every 2 steps and after RL, and `eval.py --data=DIR`
scores them with its reward models.
"""

import json

import pytest

from configs import safety
from gd2po_jax.evaluation.command import EvalOptions, run
from gd2po_jax.jobs.train import train_and_evaluate
from gd2po_jax.runtime.checkpoints import Checkpoints
from gd2po_jax.runtime.metrics_logging import read_metrics
from gd2po_jax.runtime.run_dir import RunDir
from tests.fakes import REPO, alpaca_path, as_run_config, data_files, tiny_safety_policy, tiny_score_model_dir

pytestmark = pytest.mark.slow


SETS = ("alpaca_test", "hh_rlhf_test", "pku_saferlhf_test")


def tiny_safety_config(num_steps: int):
    """configs/safety.py shrunk: 2 prompts x 4 rollouts of at most 8 tokens (prompts cut to their last
    48 tokens), float32, validation on the first 2 prompts of each of the three tiny sets every 2
    steps, a checkpoint every step."""
    config = safety.get_config()
    config.model.path = str(tiny_safety_policy())
    config.model.update(dtype="float32", remat="none")
    config.data.train = str(alpaca_path())
    config.eval.sets = str(data_files() / "safe_alignment")
    config.data.max_prompt_tokens = 48  # some Alpaca prompts are longer: cut on the left
    models = {"useful": ("amo", "chatml"), "harmless": ("sequence_classification", "plain")}
    for name, (layout, template) in models.items():
        config.rewards.reward_models[name].update(path=str(tiny_score_model_dir(layout, template)),
                                                  max_length=512, batch_size=8, dtype="float32")
    config.rl.update(num_minibatches=1, micro_batch_size=8)
    config.sampling.update(max_new_tokens=8, prompts_per_call=0)
    config.train.update(num_steps=num_steps, prompts_per_step=2, learning_rate=1e-3)
    config.checkpoint.every_steps = 1
    config.eval.update(max_examples=2, batch_size=8, every_steps=2)
    return config


@pytest.fixture(scope="module")
def safety_run(tmp_path_factory):
    """The run's workdir after one step, then resumed for two more, and the two results."""
    workdir = tmp_path_factory.mktemp("safety_run")
    first = train_and_evaluate(as_run_config(tiny_safety_config(1)), workdir, progress=False)
    second = train_and_evaluate(as_run_config(tiny_safety_config(3)), workdir, progress=False)
    return workdir, first, second


def test_a_run_logs_both_reward_models_and_the_conflict_diagnostics(safety_run):
    workdir, first, second = safety_run
    metrics = read_metrics(workdir)
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]  # step 0: the validation before RL
    for step in metrics[1:]:
        for name in ("useful", "harmless"):
            assert isinstance(step[f"reward/{name}"], float)
            assert 0.0 <= step[f"reward_truncated/{name}"] <= 1.0 and step[f"time/reward_model/{name}"] > 0
        assert 0.0 <= step["advantages/conflict_ratio"] <= 1.0
        assert 0.0 < step["advantages/kept_fraction"] <= 1.0


def test_the_run_validates_on_the_three_sets_before_rl_and_every_eval_step(safety_run):
    """As the official runs (data.val_files: the three test sets, val_before_train, test_freq): each
    set's useful, harmless and their sum in metrics.jsonl (step 0 before RL, then every 2 steps; after
    RL in eval/after_rl.json and results.json), the reward models' scores of greedy responses."""
    workdir, first, second = safety_run
    metrics = {m["step"]: m for m in read_metrics(workdir)}
    files = RunDir(workdir)
    for step, name in ((0, "before_rl"), (2, "step_2")):
        report = json.loads(files.eval_report(name).read_text())
        assert list(report["sets"]) == list(SETS) and report["reward_names"] == ["useful", "harmless"]
        for set_name in SETS:
            summary = report["sets"][set_name]
            assert summary["num_examples"] == 2
            assert summary["reward_sum"] == pytest.approx(summary["useful"] + summary["harmless"], abs=1e-6)
            for metric in ("useful", "harmless", "reward_sum"):
                assert metrics[step][f"eval/{set_name}/{metric}"] == summary[metric]
        for metric in ("useful", "harmless", "reward_sum"):  # and their mean, every set counting once
            assert metrics[step][f"eval/{metric}"] == pytest.approx(
                sum(report["sets"][s][metric] for s in SETS) / 3)
        records = [json.loads(line) for line in files.eval_generations(name).read_text().splitlines()]
        assert [r["set"] for r in records] == [s for s in SETS for _ in range(2)]
    assert not any(k.startswith("eval/") for step in (1, 3) for k in metrics[step])
    for phase in ("before_rl", "after_rl"):
        summary = second[phase]
        assert list(summary["sets"]) == list(SETS) and summary["num_examples"] == 6
        assert summary["reward_sum"] == pytest.approx(summary["useful"] + summary["harmless"], abs=1e-6)
    assert second["before_rl"] == first["before_rl"]  # read back, not evaluated again
    assert second["split"] == "sets" and not files.eval_report("step_1").exists()


def test_the_run_checkpoints_and_resumes(safety_run):
    workdir, first, second = safety_run
    with Checkpoints(RunDir(workdir).checkpoints, create=False) as checkpoints:
        assert checkpoints.steps() == [2, 3]  # checkpoint.keep = 2
    assert (first["steps"], second["steps"]) == (1, 3)
    written = json.loads((workdir / "config.json").read_text())
    assert written["rewards"]["kind"] == "reward_model" and written["train"]["num_steps"] == 3
    assert written["eval"]["sets"] == str(data_files() / "safe_alignment")
    for model in written["rewards"]["reward_models"].values():
        assert model["truncation"] == "right" and model["negate"] is False
    assert (RunDir(workdir).policy / "config.json").is_file()


def test_eval_scores_the_safe_alignment_sets_with_the_runs_reward_models(safety_run):
    workdir, _, _ = safety_run
    report = run(EvalOptions(workdir=str(workdir), data=str(data_files() / "safe_alignment"), max_examples=2,
                             progress=False))
    assert list(report["sets"]) == ["alpaca_test", "hh_rlhf_test", "pku_saferlhf_test"]
    for summary in report["sets"].values():
        assert summary["num_examples"] == 2
        assert summary["reward_sum"] == pytest.approx(summary["useful"] + summary["harmless"], abs=1e-6)
    for metric in ("useful", "harmless", "reward_sum"):  # every set counts once
        assert report["overall"][metric] == pytest.approx(sum(s[metric] for s in report["sets"].values()) / 3)
    assert report["overall"]["num_examples"] == 6 and report["policy"]["step"] == 3
    files = RunDir(workdir)
    assert json.loads(files.eval_report("safe_alignment").read_text()) == report
    records = [json.loads(line) for line in files.eval_generations("safe_alignment").read_text().splitlines()]
    assert [r["set"] for r in records] == ["alpaca_test"] * 2 + ["hh_rlhf_test"] * 2 + ["pku_saferlhf_test"] * 2
    assert all(isinstance(r["response"], str) and isinstance(r["harmless"], float) for r in records)


def test_a_rule_function_and_the_reward_models_train_together(tmp_path):
    """A format rule of your own (examples/own_task's brevity, TRL's form) beside the two reward models:
    three reward columns in the stated order (the family's, then the functions'), each logged with the
    reward models' own metrics, and the conflict diagnostics over all three."""
    config = tiny_safety_config(1)
    config.rewards.functions = (f"{REPO / 'examples' / 'own_task' / 'rewards.py'}:brevity",)
    config.eval.update(split="none", sets="")  # sets are scored by the reward models alone
    train_and_evaluate(as_run_config(config), tmp_path, progress=False)
    (step,) = read_metrics(tmp_path)
    for name in ("useful", "harmless", "brevity"):
        assert isinstance(step[f"reward/{name}"], float) and step[f"reward_abstained/{name}"] == 0.0
    assert 0.0 <= step["advantages/zero_std_fraction/brevity"] <= 1.0
    assert 0.0 <= step["reward_truncated/useful"] <= 1.0 and step["time/reward_model/harmless"] > 0
    assert 0.0 <= step["advantages/conflict_ratio"] <= 1.0
