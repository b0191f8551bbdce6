"""Workload E of bench/anchor_workloads.py: one whole RL step of the trainer on a checkpoint directory,
with the harness's two rewards written as TRL reward functions (``../shared/bench/anchors``'s
definition, so that E can be compared with TRL's and tunix's in the same run)."""

import json
import shutil

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tests.fakes import VOCAB, load_bench_script, tiny_checkpoint


def test_e_rewards_are_the_harness_definitions():
    anchor_workloads = load_bench_script("anchor_workloads")
    assert anchor_workloads.e_digits(["p"] * 3, ["t12 t3", "", "abc"]) == [pytest.approx(3 / 6), 0.0, 0.0]
    assert anchor_workloads.e_length(["p"] * 3, ["x" * 360, "x" * 180, "x" * 800]) == [1.0, 0.5, 0.0]


@pytest.fixture(scope="module")
def word_checkpoint(tmp_path_factory):
    """The tiny Qwen2 checkpoint with the harness's kind of tokenizer: words ``t0`` .. ``t{V-1}``."""
    source, _ = tiny_checkpoint("qwen2", tie=True)
    directory = tmp_path_factory.mktemp("e") / "qwen2-words"
    shutil.copytree(source, directory)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t0", eos_token="t1").save_pretrained(
        directory)
    return directory


@pytest.mark.slow
def test_workload_e_runs_the_trainers_step(word_checkpoint, tmp_path, capsys):
    anchor_workloads = load_bench_script("anchor_workloads")
    report_path = tmp_path / "report.json"
    anchor_workloads.main([f"--hf_dir={word_checkpoint}", "--workloads=E", "--prompt_len=8", "--new_tokens=6",
                           "--e_prompts=4", "--e_generations=2", "--e_steps=2", "--e_warmup=1", "--peak_size=128",
                           f"--json={report_path}"])
    result = json.loads(report_path.read_text())["workloads"]["E"]
    assert result["tokens"] == 4 * 2 * 6  # exactly new_tokens per rollout (no EOS)
    assert len(result["times_s"]) == 2 and len(result["steps"]) == 3  # warm-up + timed
    assert result["compiles_after_warmup"] == 0, result["steps"]  # step 1 compiles everything
    assert result["steps"][0]["compiles"] > 0
    assert result["tokens_per_s"] == pytest.approx(result["tokens"] / result["median_s"])
    assert result["per_token_ms"] == pytest.approx(result["median_s"] / result["tokens"] * 1e3)
    for step in result["steps"]:
        assert step["step_s"] >= step["rollout_s"] >= step["sampling_s"] > 0 and step["update_s"] > 0
        assert step["peak_rss_mb"] > 0
    assert "E: step " in capsys.readouterr().out
    assert result["config"] == {"algorithm": "gd2po_snr", "old_logprobs": "recompute", "micro_batch_size": 8,
                                "skip_zero_advantage_rows": True}  # configs/default.py's update
    assert all(0 <= step["skipped_rows"] <= 1 and 0 <= step["kept_fraction"] <= 1 for step in result["steps"])


def test_workload_e_config_takes_the_default_and_the_overrides(word_checkpoint):
    anchor_workloads = load_bench_script("anchor_workloads")
    overrides = anchor_workloads.parse_overrides(["rl.algorithm=grpo", "rl.skip_zero_advantage_rows=False",
                                                  "rl.old_logprobs=sampler"])
    assert overrides == {"rl.algorithm": "grpo", "rl.skip_zero_advantage_rows": False, "rl.old_logprobs": "sampler"}
    config = anchor_workloads.e2e_config(word_checkpoint, prompts=4, generations=2, new_tokens=6, steps=1,
                                         micro_batch_size=0, overrides=overrides)
    assert (config.rl.algorithm, config.rl.skip_zero_advantage_rows, config.rl.old_logprobs) == \
        ("grpo", False, "sampler")
    assert config.rl.micro_batch_size == 0 and config.sampling.max_new_tokens == 6
    with pytest.raises(ValueError, match=r"--e_set rl.no_such_field: not a field"):
        anchor_workloads.e2e_config(word_checkpoint, prompts=4, generations=2, new_tokens=6, steps=1,
                                    overrides={"rl.no_such_field": 1})
    nested = anchor_workloads.e2e_config(word_checkpoint, prompts=4, generations=2, new_tokens=6, steps=1,
                                         overrides={"model.lora.rank": 4})  # a field of a nested group
    assert nested.model.lora.rank == 4 and nested.rl.micro_batch_size == 8  # the default's micro-batches
    with pytest.raises(ValueError, match=r"expected FIELD=VALUE"):
        anchor_workloads.parse_overrides(["rl.algorithm"])
