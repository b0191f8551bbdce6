"""gd2po_jax/rl/rollout_log.py: the records of a step's rollouts, with the update's advantages."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from bench.harness import step_config
from gd2po_jax.data.prompts import PromptSet
from gd2po_jax.rl import rollout_log
from gd2po_jax.rl.advantages import compute_advantages
from gd2po_jax.training.records import RolloutBatch
from gd2po_jax.rl.rollout import Rollouts
from gd2po_jax.runtime.run_dir import RunDir
from tests.fakes import DigitTokenizer

NAMES = ("correctness", "format")
NAN = float("nan")
# [P=2, G=4, K=2]. Prompt 0: rollout 0 is good in both rewards, 3 bad in both; 1 and 2 are good in
# one reward and bad in the other by as much (a sign conflict with SNR 0: GD2PO-SNR drops them).
# Prompt 1: the format reward abstained on rollout 0 (NaN).
REWARDS = np.array([[[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]],
                    [[1.0, NAN], [0.0, 0.5], [1.0, 0.2], [0.0, 0.1]]], np.float32)
LENGTHS = np.array([[5, 7, 3, 9], [4, 4, 6, 2]], np.int32)
TRUNCATED = np.array([False, False, False, True, False, False, True, False])


def prompt_set() -> PromptSet:
    return PromptSet(texts=["<user>call a", "<user>call b"], token_ids=[[1, 2], [3]],
                     columns={"row": [np.int64(17), 4], "prompt": [[], []]})


def responses() -> list[str]:
    return [f"answer {i}" for i in range(8)]


def records(config):
    advantages = rollout_log.host_advantages(REWARDS, LENGTHS, np.ones(2, bool), config)
    return rollout_log.rollout_records(3, prompt_set(), responses(), REWARDS, LENGTHS, TRUNCATED, advantages, NAMES)


def test_records_carry_the_update_s_advantages_keep_mask_and_conflicts():
    config = step_config(algorithm="gd2po_snr", snr_tau=0.8, reward_names=NAMES, reward_weights=(1.0, 2.0))
    got = records(config)
    # compute_advantages with the arguments the jitted step gives it.
    expected = compute_advantages(jnp.asarray(REWARDS), jnp.asarray(LENGTHS), "gd2po_snr", snr_tau=0.8,
                                  reward_weights=jnp.asarray([1.0, 2.0]), batch_norm="token", group_eps=1e-6,
                                  valid=jnp.ones(2, bool), drop_zero_variance_groups=False)
    assert [r["rollout"] for r in got] == list(range(8)) and [r["prompt_index"] for r in got] == [0] * 4 + [1] * 4
    for record in got:
        p, g = divmod(record["rollout"], 4)
        assert record["keep"] == bool(expected.keep[p, g]) and record["conflict"] == bool(expected.conflict[p, g])
        assert np.float32(record["advantage"]) == expected.advantages[p, g]
        assert np.float32(record["snr"]) == expected.snr[p, g]
        assert np.float32(record["query_weight"]) == expected.query_weight[p]
        for k, name in enumerate(NAMES):
            assert np.float32(record["reward_advantages"][name]) == expected.reward_advantages[p, g, k]
    # The conflicting rollouts of prompt 0 are filtered, the agreeing ones kept; kappa = 2/4.
    assert [(r["conflict"], r["keep"]) for r in got[:4]] == [(False, True), (True, False), (True, False),
                                                              (False, True)]
    assert got[1]["advantage"] == 0.0 and got[0]["advantage"] > 0 > got[3]["advantage"]
    assert got[0]["query_weight"] == 0.5


def test_records_name_the_prompt_its_data_row_the_completion_and_each_reward():
    got = records(step_config(reward_names=NAMES))
    first, abstained = got[0], got[4]
    assert list(first) == ["step", "rollout", "prompt_index", "row", "prompt", "completion", "rewards",
                           "response_length", "truncated", "advantage", "keep", "conflict", "snr", "query_weight",
                           "reward_advantages"]
    assert (first["step"], first["row"], first["prompt"], first["completion"]) == (3, 17, "<user>call a",
                                                                                        "answer 0")
    assert first["rewards"] == {"correctness": 1.0, "format": 1.0}
    assert abstained["row"] == 4 and abstained["prompt"] == "<user>call b"
    assert abstained["rewards"] == {"correctness": 1.0, "format": None}  # NaN: abstained
    assert abstained["reward_advantages"]["format"] == 0.0
    assert [r["response_length"] for r in got] == LENGTHS.reshape(-1).tolist()
    assert [r["truncated"] for r in got] == TRUNCATED.tolist()
    assert got[2]["rewards"]["format"] == 1.0 and got[5]["rewards"]["format"] == 0.5  # float32 written short


def test_sizes_that_disagree_are_named():
    advantages = rollout_log.host_advantages(REWARDS, LENGTHS, np.ones(2, bool), step_config())
    with pytest.raises(ValueError, match=r"responses.: 7"):
        rollout_log.rollout_records(1, prompt_set(), responses()[:7], REWARDS, LENGTHS, TRUNCATED, advantages, NAMES)


def fake_rollouts(responses_held: list[str], extras=None) -> Rollouts:
    """A step's `Rollouts` of REWARDS: completions of LENGTHS tokens (token t of rollout i is 10 i + t)."""
    num_rollouts, budget, prompt_length = 8, 10, 3
    completion = np.arange(budget)[None, :] + 10 * np.arange(num_rollouts)[:, None]
    batch = RolloutBatch(
        input_ids=jnp.asarray(np.concatenate([np.zeros((num_rollouts, prompt_length)), completion], 1), jnp.int32),
        attention_mask=jnp.ones((num_rollouts, prompt_length + budget), bool),
        response_mask=jnp.arange(budget)[None, :] < jnp.asarray(LENGTHS.reshape(-1))[:, None],
        old_logp=jnp.zeros((num_rollouts, budget)), ref_logp=jnp.zeros((num_rollouts, budget)),
        rewards=jnp.asarray(REWARDS), valid=jnp.ones(2, bool))
    return Rollouts(batch=batch, responses=responses_held, rewards=REWARDS, abstained=np.zeros(2), failed=np.zeros(2),
                    first_failure=None, truncated=TRUNCATED, generated_tokens=int(LENGTHS.sum()), sampling_seconds=0.0,
                    reward_seconds=0.0, reward_extras=extras or {})


def strict_json_lines(path) -> list[dict]:
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_the_step_file_is_strict_json_written_whole_and_replaced_by_a_rerun(tmp_path):
    files, config = RunDir(tmp_path), step_config(reward_names=NAMES)
    extras = {"parsed_call": {0: "search(q)", 6: np.float32(NAN)}}
    path = rollout_log.save_step_rollouts(files, 3, prompt_set(), fake_rollouts(responses(), extras),
                                          DigitTokenizer(), config, NAMES)
    assert path == files.rollout_file(3) == tmp_path / "rollouts" / "step_3.jsonl"
    lines = strict_json_lines(path)
    assert len(lines) == 8 and [r["completion"] for r in lines] == responses()
    assert lines[0]["extras"] == {"parsed_call": "search(q)"} and lines[6]["extras"] == {"parsed_call": None}
    assert "extras" not in lines[1]
    assert [p.name for p in path.parent.iterdir()] == ["step_3.jsonl"]  # no temporary file left

    # A resumed run's step 3 overwrites it. This process holds 3 of the 8 responses (as one of several
    # processes would): the completions are decoded from the step's tokens instead.
    rollout_log.save_step_rollouts(files, 3, prompt_set(), fake_rollouts(responses()[:3]), DigitTokenizer(), config,
                                   NAMES)
    lines = strict_json_lines(path)
    assert lines[1]["completion"] == "10 11 12 13 14 15 16" and "extras" not in lines[0]  # 7 tokens of rollout 1
    assert [r["response_length"] for r in lines] == LENGTHS.reshape(-1).tolist()


def test_which_steps_are_logged():
    assert [s for s in range(1, 7) if rollout_log.is_logged_step(s, 4, 6)] == [4, 6]  # and the last
    assert [s for s in range(1, 4) if rollout_log.is_logged_step(s, 1, 3)] == [1, 2, 3]
    assert not any(rollout_log.is_logged_step(s, 0, 6) for s in range(1, 7))


def test_a_resumed_run_removes_the_files_of_the_steps_it_redoes(tmp_path):
    files = RunDir(tmp_path)
    assert rollout_log.remove_later_rollouts(files, 0) == []  # no rollouts/ yet
    files.rollouts.mkdir()
    for step in (2, 4, 6, 10):
        files.rollout_file(step).write_text("{}\n")
    (files.rollouts / "notes.txt").write_text("mine")
    removed = rollout_log.remove_later_rollouts(files, 4)
    assert sorted(p.name for p in removed) == ["step_10.jsonl", "step_6.jsonl"]
    assert sorted(p.name for p in files.rollouts.iterdir()) == ["notes.txt", "step_2.jsonl", "step_4.jsonl"]
