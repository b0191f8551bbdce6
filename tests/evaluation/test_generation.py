"""gd2po_jax/evaluation/generation.py: greedy evaluation's records, with a stand-in for the sampler."""

from __future__ import annotations

import datetime
import json
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gd2po_jax.data.loaders import load_verl_parquet
from gd2po_jax.data.prompts import build_prompt_set
from gd2po_jax.evaluation import generation
from tests.fakes import DigitTokenizer, EchoTokenizer


class _EchoIdsTokenizer(EchoTokenizer, DigitTokenizer):
    """Renders and tokenizes as `EchoTokenizer`, decodes as `DigitTokenizer`."""


def _greedy(model, token_ids, *, max_new_tokens, **_):
    """Every prompt answered by the tokens 7 8, finished."""
    count = len(token_ids)
    return types.SimpleNamespace(tokens=np.tile(np.array([[7, 8]]), (count, 1)), lengths=np.full(count, 2),
                                 finished=np.ones(count, bool))


def test_records_leave_out_extra_columns_json_cannot_hold_but_the_scorer_sees_them(tmp_path, monkeypatch):
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "reward_model": {"ground_truth": f"g{i}"},
             "asked_on": datetime.date(2024, 3, 26 + i), "blob": bytes([i])} for i in range(3)]
    path = tmp_path / "dated.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    prompts = build_prompt_set(load_verl_parquet(path).dataset, _EchoIdsTokenizer(), max_prompt_tokens=16, where="d")
    monkeypatch.setattr(generation, "generate", _greedy)
    seen = []

    def scorer(response, row):
        seen.append((row["asked_on"], row["blob"]))
        return {"correct": float(response == "7 8")}

    summary, records = generation.evaluate(
        None, prompts, _EchoIdsTokenizer(), scorer, batch_size=2, max_new_tokens=2, eos_token_ids=[1],
        pad_token_id=0, prompt_length=16, progress=False)
    assert seen == [(datetime.date(2024, 3, 26 + i), bytes([i])) for i in range(3)]
    assert summary["correct"] == 1.0 and [r["ground_truth"] for r in records] == ["g0", "g1", "g2"]
    generation.write_report(tmp_path / "out", "eval", summary, records)
    written = [json.loads(line) for line in (tmp_path / "out" / "eval.jsonl").read_text().splitlines()]
    assert [r["row"] for r in written] == [0, 1, 2] and not {"asked_on", "blob"} & set(written[0])


def test_response_budgets_cap_prompt_plus_response_as_vllms_max_model_len():
    assert generation.response_budgets([10, 100, 4000], 4096, 0).tolist() == [4096, 4096, 4096]
    assert generation.response_budgets([10, 100, 4000], 4096, 4096).tolist() == [4086, 3996, 96]
    assert generation.response_budgets([10, 100], 50, 4096).tolist() == [50, 50]  # max_new_tokens still holds
    with pytest.raises(ValueError, match=r"^API-Bank, example 1 \(0-based\): the prompt has 4096 tokens, at least "
                                         r"max_total_tokens=4096 \(config.eval.max_total_tokens"):
        generation.response_budgets([10, 4096], 4096, 4096, "API-Bank")


def test_a_total_token_cap_is_one_program_and_cuts_each_response_at_its_own_budget(tmp_path, monkeypatch):
    """Prompts of 2, 6 and 10 tokens, max_total_tokens=12: one generation budget for the set (10, the
    shortest prompt's), then each response cut at 12 minus its prompt (10, 6, 2 tokens), unfinished
    where cut; a response that ends (EOS) within its budget is kept whole and finished."""
    rows = [{"prompt": [{"role": "user", "content": " ".join(["q"] * n)}], "reward_model": {"ground_truth": "g"}}
            for n in (1, 3, 5)]
    path = tmp_path / "lengths.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    prompts = build_prompt_set(load_verl_parquet(path).dataset, _EchoIdsTokenizer(), max_prompt_tokens=16, where="d")
    assert [len(ids) for ids in prompts.token_ids] == [2, 6, 10]
    budgets_asked = []

    def greedy(model, token_ids, *, max_new_tokens, **_):
        """Every prompt answered by max_new_tokens tokens 7, unfinished; the 6-token one ends after 4 (EOS 1)."""
        budgets_asked.append(max_new_tokens)
        tokens = np.full((len(token_ids), max_new_tokens), 7)
        lengths, finished = np.full(len(token_ids), max_new_tokens), np.zeros(len(token_ids), bool)
        for i, ids in enumerate(token_ids):
            if len(ids) == 6:
                tokens[i, 3], lengths[i], finished[i] = 1, 4, True
        return types.SimpleNamespace(tokens=tokens, lengths=lengths, finished=finished)

    monkeypatch.setattr(generation, "generate", greedy)
    summary, records = generation.evaluate(
        None, prompts, _EchoIdsTokenizer(), lambda response, row: {}, batch_size=2, max_new_tokens=100,
        eos_token_ids=[1], pad_token_id=0, prompt_length=16, progress=False, max_total_tokens=12)
    assert budgets_asked == [10, 10]  # two batches, one budget: one compiled program
    assert [r["response_tokens"] for r in records] == [10, 4, 2]
    assert [r["truncated"] for r in records] == [True, False, True]
    assert [r["response"] for r in records] == ["7 7 7 7 7 7 7 7 7 7", "7 7 7 1", "7 7"]  # cut at its budget
    assert summary["truncation_rate"] == pytest.approx(2 / 3)
