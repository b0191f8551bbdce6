"""Greedy generation over a prompt set and scoring of the outputs (validation, eval.py).

Generation runs in fixed-size batches (the last one filled with repeats that are discarded), with
one padded prompt length and one token budget, so evaluating compiles one prefill and one decode
program. A cap on prompt + response tokens (``max_total_tokens``, vLLM's ``max_model_len``) keeps that
one program: the set is generated with the budget of its shortest prompt, and each response is then
cut to its own (`response_budgets`), which is what a greedy decoder stopped there would have given.
"""

from __future__ import annotations

import json
import pathlib
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import tqdm

from gd2po_jax.data.prompts import PromptSet, padded_batches
from gd2po_jax.data.tokenization import decode_completions
from gd2po_jax.models.sampling import generate
from gd2po_jax.rewards.base import RESPONSE_IDS
from gd2po_jax.rewards.scorers import BatchScorer, Scorer
from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.distributed import host_value, is_primary


def response_budgets(
    prompt_lengths: Sequence[int], max_new_tokens: int, max_total_tokens: int, where: str = "eval"
) -> np.ndarray:
    """``[N]`` the response tokens each prompt may get: ``max_new_tokens``, and with ``max_total_tokens``
    > 0 at most ``max_total_tokens`` minus the prompt's tokens, as vLLM stops a sequence that reaches
    ``max_model_len`` (``vllm/v1/core/sched/utils.py``, ``check_stop``).

    Raises:
      ValueError: a prompt of ``max_total_tokens`` tokens or more (no response token fits), naming
        ``where`` and the example (its index among ``prompt_lengths``).
    """
    lengths = np.asarray(prompt_lengths, np.int64)
    budgets = np.full(len(lengths), max_new_tokens, np.int64)
    if not max_total_tokens:
        return budgets
    too_long = np.flatnonzero(lengths >= max_total_tokens)
    if len(too_long):
        row = int(too_long[0])
        raise ValueError(
            f"{where}, example {row} (0-based): the prompt has {lengths[row]} tokens, at least "
            f"max_total_tokens={max_total_tokens} (config.eval.max_total_tokens, eval.py "
            "--max_total_tokens): no token of a response fits"
        )
    return np.minimum(budgets, max_total_tokens - lengths)


def evaluate(
    model,
    prompt_set: PromptSet,
    tokenizer,
    scorer: Scorer | BatchScorer,
    *,
    batch_size: int,
    max_new_tokens: int,
    eos_token_ids: list[int],
    pad_token_id: int,
    prompt_length: int,
    progress: bool = True,
    desc: str = "eval",
    max_total_tokens: int = 0,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Greedy completions of every prompt, scored (by a `BatchScorer` one generation batch at a time).

    Each response gets at most ``max_new_tokens``, and with ``max_total_tokens`` > 0 at most that
    minus its prompt's tokens (`response_budgets`): the whole set is generated with the largest
    budget (its shortest prompt's), one program, and each response is cut to its own budget
    afterwards (then ``truncated`` unless it ended within it). Greedy decoding is causal, so the cut
    response is the one a decoder stopped at the budget gives, as vLLM's per-sequence limit does.

    Returns:
      summary: ``<metric>`` means over all examples, ``<metric>/level_<L>`` per level when the data
        has levels, ``num_examples``, ``truncation_rate`` and ``response_tokens``.
      records: one dict per example: row, level, prompt, response, ground_truth and its scores.
        The data's other columns (a file's extra columns among them, which may hold what JSON
        cannot, e.g. bytes or dates) reach the scorer but not the records, so `write_report` can
        always write them; ``row`` finds them in the data.
    """
    records: list[dict[str, Any]] = []
    budgets = response_budgets([len(ids) for ids in prompt_set.token_ids], max_new_tokens, max_total_tokens, desc)
    budget = int(budgets.max()) if len(budgets) else max_new_tokens  # one program for the whole set
    batches = padded_batches(len(prompt_set), batch_size)
    for indices, real in tqdm.tqdm(batches, desc=desc, disable=not progress, leave=False):
        part = prompt_set.select(indices)
        out = generate(
            model,
            part.token_ids,
            max_new_tokens=budget,
            temperature=0.0,
            eos_token_ids=eos_token_ids,
            pad_token_id=pad_token_id,
            prompt_length=prompt_length,
        )
        # Whole on every process of a multi-host run, which all score every example alike.
        tokens, lengths, finished = host_value((out.tokens, out.lengths, out.finished))
        own = budgets[np.asarray(indices)]
        cut = np.asarray(lengths) > own  # ran past its own budget: cut there, unfinished
        lengths, finished = np.where(cut, own, lengths), np.asarray(finished) & ~cut
        responses = decode_completions(tokenizer, tokens[:real], lengths[:real])
        rows = [
            {name: values[i] for name, values in part.columns.items()} | {RESPONSE_IDS: tokens[i, :n].tolist()}
            for i, n in enumerate(lengths[:real])
        ]
        if hasattr(scorer, "score_rows"):
            scores = scorer.score_rows(part.texts[:real], responses, rows)
        else:
            scores = [scorer(response, row) for response, row in zip(responses, rows)]
        for i, (response, row) in enumerate(zip(responses, rows)):
            records.append(
                {
                    "row": row.get("row", indices[i]),
                    "level": row.get("level"),
                    "prompt": part.texts[i],
                    "response": response,
                    "ground_truth": row.get("ground_truth"),
                    "truncated": bool(not finished[i]),
                    "response_tokens": int(lengths[i]),
                    **scores[i],
                }
            )
    return summarize(records), records


def write_report(out_dir: pathlib.Path, name: str, summary: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """``out_dir/<name>.jsonl`` (one record a line), then ``<name>.json`` (the summary), each written
    atomically (`run_dir.write_text`): a summary on disk means its generations are complete. Only
    process 0 of a multi-host run writes (the others hold the same records)."""
    if not is_primary():
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    run_dir.write_text(out_dir / f"{name}.jsonl", "".join(json.dumps(record) + "\n" for record in records))
    run_dir.write_json(out_dir / f"{name}.json", summary)


def _mean(values: list[float]) -> float:
    """The mean of the values that are not NaN (a reward that abstained on a response); NaN if all are."""
    array = np.asarray(values, np.float64)
    present = ~np.isnan(array)
    return float(np.mean(array[present])) if present.any() else float("nan")


def summarize(records: list[dict[str, Any]]) -> dict[str, float]:
    """Means of the score fields over all records (those a reward abstained on left out) and per level."""
    if not records:
        return {"num_examples": 0}
    metrics = [k for k, v in records[0].items() if isinstance(v, float) and k not in ("row", "level")]
    summary: dict[str, float] = {"num_examples": len(records)}
    for name in metrics:
        summary[name] = _mean([r[name] for r in records])
    summary["truncation_rate"] = float(np.mean([r["truncated"] for r in records]))
    summary["response_tokens"] = float(np.mean([r["response_tokens"] for r in records]))
    by_level: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        level = record.get("level")
        if isinstance(level, int) and not isinstance(level, bool):  # a task's level (a row's own may be anything)
            by_level[level].append(record)
    if len(by_level) > 1:
        for level, group in sorted(by_level.items()):
            for name in metrics:
                summary[f"{name}/level_{level}"] = _mean([r[name] for r in group])
    return summary
