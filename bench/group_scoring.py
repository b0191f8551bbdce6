"""Rewards scored while the engine decodes: a step's rollouts scored a group at a time against the
whole step after the decode (`gd2po_jax.rl.rollout.GroupScoring`, ``rewards.score_groups``).

    python -m bench.group_scoring --hf_dir ../bench-models/small-qwen2 --json out.json

The checkpoint's model with W-tail's stopping (`bench.rollout_engine.stop_tokens`: lengths about
geometric, mean ~128, cut at ``--new_tokens``), ``--prompts`` random prompts x ``--num_samples``
rows through ``--slots`` slots, and a reward that waits ``--sleep_ms`` per rollout it scores (a
verifier that runs code or calls a service: its time is not the CPU's, so here it can overlap the
decode; a reward that computes in Python shares the host's cores with the decode instead).
`gd2po_jax.rl.rollout.collect_rollouts` runs the step with ``score_groups`` on and off, alternated
(A B A B, ``--repeats`` each) after one untimed run of each, in the same process.

JSON: ``{"groups": {"median_s", "times_s", "reward_s"}, "whole": {...}, "whole_over_groups",
"scoring_s" (the reward's own time per step), "tokens", "config"}``; the rewards of both ways are
checked equal. ``--cpu-smoke`` runs a tiny random model in seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import jax
import numpy as np

from bench import harness
from bench.rollout_engine import add_w_tail_arguments, w_tail_model, write_report
from gd2po_jax.config import SamplingConfig
from gd2po_jax.data.prompts import PromptSet
from gd2po_jax.models import Decoder
from gd2po_jax.rl.rollout import RolloutSettings, collect_rollouts


@dataclasses.dataclass
class WaitingReward:
    """K=1: the response's length in characters, after waiting ``sleep_s`` per rollout of the call."""

    sleep_s: float
    names: tuple[str, ...] = ("length",)

    def __call__(self, prompts, responses, columns):
        time.sleep(self.sleep_s * len(responses))
        return [[float(len(r))] for r in responses]


class IdsTokenizer:
    """Decodes ids as their numbers (the reward reads lengths only; no tokenizer files needed)."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids)


def run(model: Decoder, *, eos_ids: tuple[int, ...], prompts: int, num_samples: int, prompt_len: int,
        new_tokens: int, slots: int, sleep_ms: float, num_workers: int, repeats: int) -> dict:
    ids = harness.random_prompts(model.config.vocab_size, prompts, prompt_len, seed=0)
    prompt_set = PromptSet(texts=[f"p{i}" for i in range(prompts)], token_ids=ids, columns={})
    sampling = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, top_k=0, engine_slots=slots)
    reward = WaitingReward(sleep_ms / 1e3)

    def settings(score_groups: bool) -> RolloutSettings:
        return RolloutSettings(num_generations=num_samples, sampling=sampling, eos_token_ids=eos_ids,
                               pad_token_id=0, prompt_length=prompt_len, num_workers=num_workers,
                               score_groups=score_groups)

    def step(score_groups: bool, seed: int):
        start = time.perf_counter()
        out = collect_rollouts(model, prompt_set, IdsTokenizer(), reward, settings(score_groups),
                               rng=jax.random.key(seed))
        jax.block_until_ready(out.batch.input_ids)
        return time.perf_counter() - start, out

    ways = {"groups": True, "whole": False}
    for name, flag in ways.items():  # compile
        step(flag, 0)
    times: dict[str, list[float]] = {name: [] for name in ways}
    reward_s: dict[str, list[float]] = {name: [] for name in ways}
    tokens = 0
    for seed in range(1, repeats + 1):
        outs = {}
        for name, flag in ways.items():
            seconds, outs[name] = step(flag, seed)
            times[name].append(seconds)
            reward_s[name].append(outs[name].reward_seconds)
        np.testing.assert_array_equal(outs["groups"].rewards, outs["whole"].rewards)
        tokens = outs["groups"].generated_tokens
    result = {name: {"median_s": statistics.median(times[name]), "times_s": times[name],
                     "reward_s": statistics.median(reward_s[name])} for name in ways}
    result["whole_over_groups"] = result["whole"]["median_s"] / result["groups"]["median_s"]
    result["scoring_s"] = prompts * num_samples * sleep_ms / 1e3 / num_workers
    result["tokens"] = tokens
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_w_tail_arguments(parser, prompts=16, new_tokens=256, repeats=3)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--sleep_ms", type=float, default=50.0, help="the reward's wait per rollout")
    parser.add_argument("--num_workers", type=int, default=1)
    args = parser.parse_args(argv)
    model, eos_ids = w_tail_model(args, parser, prompts=4, new_tokens=24, prompt_len=8, slots=4, sleep_ms=5.0,
                                  repeats=1, stop_probability=1 / 8)
    result = run(model, eos_ids=eos_ids, prompts=args.prompts, num_samples=args.num_samples,
                 prompt_len=args.prompt_len, new_tokens=args.new_tokens, slots=args.slots, sleep_ms=args.sleep_ms,
                 num_workers=args.num_workers, repeats=args.repeats)
    write_report(result, args, eos_ids)


if __name__ == "__main__":
    main()
