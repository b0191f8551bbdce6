"""The rollouts of a training step, saved for a person to read: ``WORKDIR/rollouts/step_<N>.jsonl``.

With ``config.logging.rollouts_every = n > 0`` the trainer saves the rollouts of every n-th RL step
and of the last one (`is_logged_step`), after the step's update. One JSON object per rollout, in
the step's order (rollout ``i = p * G + g`` is sample g of prompt p), keys in this order
(docs/logging.md)::

    step              the RL step, 1-based (as in metrics.jsonl)
    rollout           i, the rollout's index in the step (0 .. P*G-1)
    prompt_index      p, its prompt's index in the step (0 .. P-1)
    row               the prompt's data row (the data set's ``row`` column; null without one)
    prompt            the rendered prompt (chat template applied): what the policy reads
    completion        the decoded completion
    rewards           {name: value} of each reward; null where it abstained (NaN)
    response_length   completion tokens (EOS included)
    truncated         no EOS within sampling.max_new_tokens
    advantage         the rollout's advantage in the update
    keep              kept by the algorithm (false: filtered out, e.g. GD2PO's conflicting rollouts)
    conflict          the weighted reward-wise advantages disagree in sign
    snr               their signal-to-noise ratio, in [-1, 1]
    query_weight      kappa of the prompt: the kept fraction of its rollouts (GD2PO's query weight)
    reward_advantages {name: A_k}: the group-normalized advantage of each reward
    extras            {column: value} the reward functions reported for the rollout (TRL's
                      ``log_extra``); only on rollouts that have some
    dynamic_sampling  with ``rl.dynamic_sampling`` on only: counted | filler (in the batch) | no_signal |
                      surplus (drawn but dropped: listed after the batch's, advantage 0;
                      `refill_records`, docs/dynamic_sampling.md)

The advantage fields are computed on the host by `gd2po_jax.rl.train_step.step_advantages`, the
function the jitted update calls, on the same rewards, response lengths and valid mask with the
same `StepConfig`; only on logged steps. They equal the update's up to float rounding (a program
sharded otherwise may sum in another order), so ``keep`` averages to the step's
``advantages/kept_fraction``.

JSON is strict: a number that is not finite (an abstained reward's NaN) is written as null, and the
file is written with ``allow_nan=False`` (any JSON reader reads it; metrics.jsonl, which Python
reads back, keeps ``NaN`` instead). Floats are written as their float32 values' shortest form.

Several processes: the host arrays of `Rollouts` are whole on every process, but the decoded
responses only those of a process's rows; every process calls `save_step_rollouts` (it gathers the
completion tokens and the reward functions' extras), process 0 decodes what it lacks and writes
the file, atomically (`gd2po_jax.runtime.run_dir.write_text`): a kill leaves the old file or the
new one, and a resumed run's step overwrites it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from gd2po_jax.data.prompts import PromptSet
from gd2po_jax.data.tokenization import decode_completions
from gd2po_jax.rl.advantages import AdvantageOutput
from gd2po_jax.rl.dynamic_sampling import RefilledRollouts
from gd2po_jax.rl.rollout import Rollouts
from gd2po_jax.rl.train_step import StepConfig, host_advantages
from gd2po_jax.runtime import distributed, run_dir
from gd2po_jax.runtime.run_dir import RunDir

logger = logging.getLogger(__name__)


def is_logged_step(step: int, every: int, num_steps: int) -> bool:
    """Whether RL step ``step`` (1-based) saves its rollouts: ``every > 0`` and ``step`` is a multiple
    of it or the last step ``num_steps``."""
    return every > 0 and (step % every == 0 or step == num_steps)


# ----------------------------------------------------------------------------------------------
# The records (pure).
# ----------------------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    """A float32 value as the shortest float that reads back as it; None when not finite."""
    value = np.float32(value)
    return float(str(value)) if np.isfinite(value) else None


def _plain(value: Any) -> Any:
    """A JSON-ready copy of a reward function's extra value: numpy scalars and arrays unwrapped,
    non-finite floats as None, anything else that JSON cannot hold as its text."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def rollout_records(
    step: int,
    prompts: PromptSet,
    responses: Sequence[str],
    rewards: np.ndarray,
    lengths: np.ndarray,
    truncated: np.ndarray,
    advantages: AdvantageOutput,
    reward_names: Sequence[str],
    extras: Mapping[str, Mapping[int, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The records of one step's rollouts (the fields of the module docstring), in rollout order.

    Args:
      step: the RL step, 1-based.
      prompts: the step's P prompts (`PromptSet`: texts and columns).
      responses: the P*G decoded completions, rollout-major (``i = p * G + g``).
      rewards: [P, G, K] float (NaN: abstained).
      lengths: [P, G] or [P*G] int, completion tokens.
      truncated: [P*G] bool.
      advantages: `AdvantageOutput` of numpy arrays for these rollouts (`host_advantages`).
      reward_names: the K names.
      extras: column -> {rollout index: value} (`Rollouts.reward_extras`, of every process).

    Raises:
      ValueError: the sizes disagree (naming them).
    """
    num_prompts, group, num_rewards = rewards.shape
    num_rollouts = num_prompts * group
    lengths, truncated = np.asarray(lengths).reshape(-1), np.asarray(truncated).reshape(-1)
    sizes = {
        "prompts": len(prompts) * group,
        "responses": len(responses),
        "lengths": lengths.size,
        "truncated": truncated.size,
        "advantages": advantages.advantages.size,
    }
    if any(n != num_rollouts for n in sizes.values()) or len(reward_names) != num_rewards:
        raise ValueError(
            f"rollout_records: rewards [P, G, K] = {rewards.shape} ({len(reward_names)} reward names) "
            f"but {sizes} (rollouts, expected P*G = {num_rollouts} each)"
        )
    data_rows = prompts.columns.get("row")
    extras = extras or {}
    records = []
    for i in range(num_rollouts):
        p, g = divmod(i, group)
        record = {
            "step": int(step),
            "rollout": i,
            "prompt_index": p,
            "row": None if data_rows is None else _plain(data_rows[p]),
            "prompt": prompts.texts[p],
            "completion": responses[i],
            "rewards": {name: _number(rewards[p, g, k]) for k, name in enumerate(reward_names)},
            "response_length": int(lengths[i]),
            "truncated": bool(truncated[i]),
            "advantage": _number(advantages.advantages[p, g]),
            "keep": bool(advantages.keep[p, g]),
            "conflict": bool(advantages.conflict[p, g]),
            "snr": _number(advantages.snr[p, g]),
            "query_weight": _number(advantages.query_weight[p]),
            "reward_advantages": {
                name: _number(advantages.reward_advantages[p, g, k]) for k, name in enumerate(reward_names)
            },
        }
        mine = {column: _plain(values[i]) for column, values in extras.items() if i in values}
        if mine:
            record["extras"] = mine
        records.append(record)
    return records


def refill_records(
    step: int,
    records: list[dict[str, Any]],
    rollouts: RefilledRollouts,
    step_config: StepConfig,
    reward_names: Sequence[str],
) -> list[dict[str, Any]]:
    """A dynamically sampled step's records: those of its batch (``records``) with ``dynamic_sampling``
    = counted | filler (a short step's stand-in, not in the update), then the groups it drew but dropped,
    ``dynamic_sampling`` = no_signal | surplus, numbered on after the batch (``rollout``,
    ``prompt_index``). A dropped group's keep, conflict, snr, query_weight and reward_advantages are
    the method's for it (they are per group); its advantage is 0 (it is not in the update); its
    completion is null where this process did not decode it (several processes)."""
    group = rollouts.rewards.shape[1]
    for record in records:
        record["dynamic_sampling"] = rollouts.marks[record["prompt_index"]]
    if rollouts.dropped is None:
        return records
    prompts, rewards, lengths, truncated, responses, marks = rollouts.dropped
    advantages = host_advantages(rewards, lengths, np.ones(len(prompts), bool), step_config)
    advantages = dataclasses.replace(advantages, advantages=cast(Any, np.zeros_like(advantages.advantages)))
    texts = responses if responses is not None else [""] * (len(prompts) * group)
    dropped = rollout_records(step, prompts, texts, rewards, lengths, truncated, advantages, reward_names)
    first_rollout, first_prompt = len(records), len(rollouts.marks)
    for record in dropped:
        p = record["prompt_index"]
        record.update(
            rollout=first_rollout + record["rollout"], prompt_index=first_prompt + p, dynamic_sampling=marks[p]
        )
        if responses is None:
            record["completion"] = None
    return records + dropped


def jsonl_text(records: Sequence[Mapping[str, Any]]) -> str:
    """The records as JSON lines: strict JSON (`rollout_records` has made every number finite or
    null), ASCII (other characters escaped, as eval/<name>.jsonl writes them)."""
    return "".join(json.dumps(record, allow_nan=False) + "\n" for record in records)


# ----------------------------------------------------------------------------------------------
# I/O: gather (every process), write (process 0).
# ----------------------------------------------------------------------------------------------


def _gather_json(value: Any) -> list[Any]:
    """Every process's JSON-able ``value``, in process order (`distributed.gather_texts`, at the
    length of the longest). In one process: ``[value]``."""
    if jax.process_count() == 1:
        return [value]
    text = json.dumps(value, default=str)
    # every process gives a text: none of them is None
    longest = max(int(n) for n in cast("list[str]", distributed.gather_texts(str(len(text.encode())))))
    return [json.loads(t) for t in cast("list[str]", distributed.gather_texts(text, limit=longest))]


def gather_extras(extras: Mapping[str, Mapping[int, Any]]) -> dict[str, dict[int, Any]]:
    """`Rollouts.reward_extras` of every process merged: column -> {rollout index: value}."""
    merged: dict[str, dict[int, Any]] = {}
    for part in _gather_json(
        {column: {str(i): _plain(v) for i, v in values.items()} for column, values in extras.items()}
    ):
        for column, values in part.items():
            merged.setdefault(column, {}).update({int(i): v for i, v in values.items()})
    return merged


def gather_completions(rollouts: Rollouts, tokenizer) -> tuple[list[str] | None, np.ndarray, np.ndarray]:
    """(the P*G decoded completions, lengths [P*G], valid [P]), whole. Every process calls this (the
    arrays are gathered from all); the completions are ``rollouts.responses`` where that holds every
    rollout (one process), else process 0 decodes the gathered tokens as `collect_rollouts` did
    (`decode_completions`) and the other processes get None."""
    batch = rollouts.batch
    completion_length = batch.old_logp.shape[1]
    lengths, tokens, valid = distributed.host_value(
        (jnp.sum(batch.response_mask, axis=-1), batch.input_ids[:, -completion_length:], batch.valid)
    )
    if not distributed.is_primary():
        return None, lengths, valid
    responses = (
        rollouts.responses
        if len(rollouts.responses) == len(lengths)
        else decode_completions(tokenizer, tokens, lengths)
    )
    return list(responses), lengths, valid


def save_step_rollouts(
    files: RunDir,
    step: int,
    prompts: PromptSet,
    rollouts: Rollouts,
    tokenizer,
    step_config: StepConfig,
    reward_names: Sequence[str],
) -> pathlib.Path | None:
    """Write ``rollouts/step_<step>.jsonl`` (`rollout_records`) for one step; returns its path on
    process 0, None elsewhere. Every process calls it (`gather_completions`, `gather_extras`).

    Raises:
      WriteFailedError: the write failed (a full disk), naming the file.
    """
    responses, lengths, valid = gather_completions(rollouts, tokenizer)
    extras = gather_extras(rollouts.reward_extras)
    if responses is None:
        return None
    advantages = host_advantages(rollouts.rewards, lengths, valid, step_config)
    records = rollout_records(
        step, prompts, responses, rollouts.rewards, lengths, rollouts.truncated, advantages, reward_names, extras
    )
    if isinstance(rollouts, RefilledRollouts):  # rl.dynamic_sampling: each group marked, the dropped ones added
        records = refill_records(step, records, rollouts, step_config, reward_names)
    path = files.rollout_file(step)
    with run_dir.writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    run_dir.write_text(path, jsonl_text(records))
    return path


_STEP_FILE = re.compile(r"step_(\d+)\.jsonl")


def remove_later_rollouts(files: RunDir, step: int) -> list[pathlib.Path]:
    """Delete the rollout files of steps after ``step`` (a run resumed there does them again: the
    files then are those of an uninterrupted run, as metrics.jsonl is); returns what was deleted."""
    if not files.rollouts.is_dir():
        return []
    later = [
        path
        for path in files.rollouts.iterdir()
        if (match := _STEP_FILE.fullmatch(path.name)) and int(match.group(1)) > step
    ]
    for path in later:
        path.unlink(missing_ok=True)
    return later
