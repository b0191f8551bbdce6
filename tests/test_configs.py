"""configs/toolrl.py: every model x algorithm x reward setting is valid and official; a smoke run."""

import json

import pytest
from absl import flags
from ml_collections import config_flags

from configs import toolrl
from gd2po_jax.advantages import METHODS
from gd2po_jax.config_validation import validate_config
from gd2po_jax.rewards.tool_calling import SETTINGS
from gd2po_jax.trainer import build_setup, train_and_evaluate
from _tiny_policy import tiny_policy

NUM_GPUS = 8  # one node, as the official scripts use


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("algorithm", METHODS)
@pytest.mark.parametrize("model", sorted(toolrl.MODELS))
def test_every_combination_validates(model, algorithm, setting):
    config = toolrl.get_config(f"{model},{setting}")
    config.rl.algorithm = algorithm
    validate_config(config, num_data_shards=NUM_GPUS)
    assert tuple(config.rewards.names) == SETTINGS[setting]


@pytest.mark.parametrize("model", sorted(toolrl.MODELS))
def test_official_hyperparameters(model):
    c = toolrl.get_config(model)
    assert tuple(c.rewards.names) == ("correctness", "format", "length")  # default: three rewards
    assert c.rl.algorithm == "gd2po_snr" and c.rl.snr_tau == 0.8
    assert c.rl.num_generations == 4
    assert c.train.prompts_per_step == 512
    rollouts_per_minibatch = c.train.prompts_per_step * c.rl.num_generations // c.rl.num_minibatches
    assert rollouts_per_minibatch == 128 * 4  # ppo_mini_batch_size=128 prompts
    assert rollouts_per_minibatch % c.rl.micro_batch_size == 0
    optimizer = (c.train.learning_rate, c.train.warmup_steps, c.train.weight_decay, c.train.grad_clip)
    assert optimizer == (1e-6, 0, 0.01, 1.0)
    assert (c.rl.clip_low, c.rl.clip_high, c.rl.dual_clip) == (0.2, 0.2, 3.0)
    assert c.rl.loss_agg_mode == "token-mean" and c.rl.batch_norm == "token"
    assert c.rl.kl_coef == 0.0 and c.rl.entropy_coef == 0.0 and c.rl.ppo_epochs == 1
    assert (c.sampling.temperature, c.sampling.top_p, c.sampling.top_k) == (1.0, 1.0, 0)
    assert c.sampling.max_new_tokens == 1024 and c.data.max_prompt_tokens == 2048
    assert c.rewards.max_think_words == 512 and not c.rewards.conditional_length
    assert (c.model.dtype, c.train.master_dtype, c.model.remat) == ("bfloat16", "float32", True)
    assert (c.mesh.data, c.mesh.fsdp, c.mesh.tensor) == (1, -1, 1)
    assert c.task == "files" and c.model.path == "" and not c.sft.enabled
    assert c.data.validation.endswith("rlla_4k/test.parquet") and c.data.test == c.data.validation
    assert (c.eval.every_steps, c.checkpoint.every_steps, c.train.num_steps) == (10, 5, 7 * 30)


def test_bad_arguments_list_the_choices():
    with pytest.raises(ValueError, match="qwen2.5-7b"):
        toolrl.get_config("qwen9")
    with pytest.raises(ValueError, match="correctness_length"):
        toolrl.get_config("qwen2.5-3b,correctness_only")
    with pytest.raises(ValueError, match="needs a model"):
        toolrl.get_config()


def test_command_line_overrides_as_train_py_parses_them():
    argv = ["train.py", "--config=configs/toolrl.py:llama3.2-3b,correctness_length",
            "--config.rl.algorithm=gd2po_hard", "--config.model.path=/models/llama",
            "--config.data.train=/data/train.parquet"]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=values, lock_config=True, sys_argv=argv)
    values(argv)
    config = values.config
    assert tuple(config.rewards.names) == ("correctness", "length")
    assert (config.rl.algorithm, config.model.path, config.data.train) == ("gd2po_hard", "/models/llama",
                                                                           "/data/train.parquet")
    assert config.rl.micro_batch_size == toolrl.MODELS["llama3.2-3b"][1]


def test_missing_model_path_names_the_field(tmp_path):
    config = toolrl.get_config("qwen2.5-1.5b")
    with pytest.raises(ValueError, match=r"config\.model\.path"):
        build_setup(config, tmp_path)


@pytest.mark.slow
def test_smoke_run_with_a_tiny_model_on_rlla(shared_dir, tmp_path):
    config = toolrl.get_config("qwen2.5-1.5b,correctness_length")
    config.model.path = str(tiny_policy(shared_dir))
    config.data.train = str(shared_dir / "data" / "rlla_4k" / "test.parquet")
    config.data.max_prompt_tokens = 4096  # the tiny tokenizer is less compact than Qwen's
    config.train.num_steps = 1
    config.train.prompts_per_step = 2  # x G=4: 8 rollouts, one per simulated device
    config.rl.num_minibatches = 1
    config.rl.micro_batch_size = 8
    config.sampling.max_new_tokens = 8
    config.eval.max_examples = 8
    config.eval.batch_size = 8
    results = train_and_evaluate(config, tmp_path, progress=False)

    assert results["algorithm"] == "gd2po_snr" and results["split"] == "validation"
    for phase in ("before_rl", "after_rl"):
        assert results[phase]["num_examples"] == 8
        assert 0.0 <= results[phase]["correct_acc"] <= 1.0
        assert -3.0 <= results[phase]["correctness"] <= 3.0
    (step,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert step["step"] == 1
    assert {"reward/correctness", "reward/length"} <= set(step) and "reward/format" not in step
    assert (tmp_path / "policy" / "config.json").is_file()
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model"]["dtype"] == "bfloat16" and written["model"]["remat"] is True
