"""gd2po_jax.evaluation.safe_alignment: which sets --data names, the overall average (every set counts
once), the table, and reward-model scores of generation batches (the end-to-end eval.py run is in
tests/configs/test_safety.py)."""

import numpy as np
import pytest

from gd2po_jax.data.tokenization import load_tokenizer
from gd2po_jax.evaluation.safe_alignment import (
    REWARD_SUM,
    RewardModelScorer,
    is_safe_alignment_data,
    overall,
    resolve_sets,
    safe_alignment_table,
    set_metrics,
)
from gd2po_jax.rewards.base import RESPONSE_IDS, build_reward_function
from tests.fakes import alpaca_prompts, data_files, tiny_safety_policy, tiny_score_model_dir


def test_data_names_a_directory_of_sets_or_one_file(tmp_path):
    sets = data_files() / "safe_alignment"
    assert list(resolve_sets(str(sets))) == ["alpaca_test", "hh_rlhf_test", "pku_saferlhf_test"]
    assert resolve_sets(str(sets))["alpaca_test"] == sets / "alpaca_test.parquet"
    hh_rlhf = sets / "hh_rlhf_test.parquet"
    assert resolve_sets(str(hh_rlhf)) == {"hh_rlhf_test": hh_rlhf}
    with pytest.raises(FileNotFoundError, match="holds no .parquet file"):
        resolve_sets(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="missing.parquet does not exist"):
        resolve_sets(str(tmp_path / "missing.parquet"))
    # The paper's sets have no default directory: the keyword asks for one, naming where they are published.
    with pytest.raises(FileNotFoundError, match=r"^pass --data=DIR, .*alpaca_test\.parquet, hh_rlhf_test\.parquet and "
                                                r"pku_saferlhf_test\.parquet: .*github\.com/Qwen-Applications/GD2PO"):
        resolve_sets("safe_alignment")
    assert is_safe_alignment_data("safe_alignment") and is_safe_alignment_data(str(sets))
    assert not is_safe_alignment_data("api_bank") and not is_safe_alignment_data(str(data_files() / "api_bank"))


def test_the_real_sets_are_found_by_name(data_dir):
    sets = data_dir / "safe_alignment"
    assert list(resolve_sets(str(sets))) == ["alpaca_test", "hh_rlhf_test", "pku_saferlhf_test"]
    assert is_safe_alignment_data(str(sets)) and not is_safe_alignment_data(str(data_dir / "api_bank"))


def test_overall_is_the_mean_of_the_sets_each_counting_once():
    per_set = {"big": {"num_examples": 300, "useful": 1.0, "harmless": -1.0, REWARD_SUM: 0.0, "level": None},
               "small": {"num_examples": 3, "useful": 3.0, "harmless": 0.0, REWARD_SUM: 3.0}}
    assert overall(per_set) == {"useful": 2.0, "harmless": -0.5, REWARD_SUM: 1.5, "num_examples": 303, "num_sets": 2}
    report = {"sets": per_set, "overall": overall(per_set), "reward_names": ["useful", "harmless"]}
    table = safe_alignment_table(report, "title")
    assert table.splitlines()[0] == "title" and "overall (mean of sets)" in table
    assert table.splitlines()[-1].split()[-5:] == ["2.0000", "-0.5000", "1.5000", "nan", "303"]


def test_set_metrics_name_each_sets_numbers_and_the_overall_mean():
    """What a run validating on eval.sets logs (under eval/): the overall mean and each set's numbers."""
    per_set = {"alpaca_test": {"num_examples": 2, "useful": 1.0, "harmless": -1.0, REWARD_SUM: 0.0},
               "hh_rlhf_test": {"num_examples": 2, "useful": 3.0, "harmless": 0.0, REWARD_SUM: 3.0}}
    metrics = set_metrics({"sets": per_set, "overall": overall(per_set), "reward_names": ["useful", "harmless"]})
    assert metrics == {"useful": 2.0, "harmless": -0.5, REWARD_SUM: 1.5, "num_examples": 4, "num_sets": 2,
                       **{f"{name}/{k}": v for name, summary in per_set.items() for k, v in summary.items()}}


def test_scores_of_a_generation_batch_and_errors_naming_the_data_row():
    policy = load_tokenizer(tiny_safety_policy())
    nan_token = policy.convert_tokens_to_ids("<|im_start|>")
    specs = {"useful": {"path": str(tiny_score_model_dir("amo")), "dtype": "float32", "batch_size": 4},
             "harmless": {"path": str(tiny_score_model_dir("amo", "plain", 1, nan_token)),
                          "dtype": "float32", "batch_size": 4}}
    fn = build_reward_function({"kind": "reward_model", "names": ("useful", "harmless"), "reward_models": specs,
                                "policy_tokenizer": policy, "policy_eos_ids": [policy.eos_token_id]})
    messages = alpaca_prompts()[:3]
    prompts = [policy.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]
    ids = [policy("A fine answer.", add_special_tokens=False)["input_ids"] + [policy.eos_token_id]] * 3
    rows = [{"prompt": m, "row": 10 + i, RESPONSE_IDS: x} for i, (m, x) in enumerate(zip(messages, ids))]
    scores = RewardModelScorer(fn).score_rows(prompts, ["A fine answer."] * 3, rows)
    expected = fn(prompts, [""] * 3, {"prompt": messages, RESPONSE_IDS: ids})
    for record, values in zip(scores, expected):
        assert (record["useful"], record["harmless"]) == tuple(float(v) for v in values)
        assert record[REWARD_SUM] == pytest.approx(float(np.sum(values)))
        assert record["reward_truncated/useful"] == 0.0
    rows[2][RESPONSE_IDS] = [nan_token] + ids[2]
    with pytest.raises(ValueError, match=r"^data row 12 \(0-based\): .*reward 'harmless', rollout 2: reward model"):
        RewardModelScorer(fn).score_rows(prompts, ["x"] * 3, rows)
    with pytest.raises(TypeError, match="needs the reward_model reward"):
        RewardModelScorer(object())
