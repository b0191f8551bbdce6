"""gd2po_jax/evaluation/generation.py: greedy evaluation's records, with a stand-in for the sampler."""

from __future__ import annotations

import datetime
import json
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

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
