"""Dynamic sampling's refill inside the rollout engine against refill by rounds
(``rl.dynamic_sampling_refill`` engine | rounds; `gd2po_jax.rl.dynamic_sampling.collect_counted`).

    python -m bench.engine_refill --hf_dir ../bench-models/small-qwen2 --json out.json

The checkpoint's model with W-tail's stopping (`bench.rollout_engine.stop_tokens`: lengths about
geometric, mean ~128, cut at ``--new_tokens``); a step of ``--prompts`` P prompts x ``--num_samples``
G drawn in order from a stream of random prompts, of which a share ``--drop`` gives a group that does
not count (two scripted rewards, constant in such a group, varying in the others; mode ``signal``);
at most P x ``--max_rounds`` prompts. Both ways run the same steps (the same stream position and
key per repeat), alternated (A B A B) after one untimed step of each, in the same process; a later
step may still meet a program shape the warm-up did not (counted: ``compiles``).

JSON: ``{"engine": {"median_s", "times_s", "prompts_drawn", "generated_tokens", "groups_counted",
"compiles"}, "rounds": {...}, "rounds_over_engine", "config"}``. ``--cpu-smoke`` runs a tiny random
model in seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import jax
import numpy as np

from bench import harness
from bench.group_scoring import IdsTokenizer
from bench.rollout_engine import add_w_tail_arguments, w_tail_model, write_report
from gd2po_jax.config import SamplingConfig
from gd2po_jax.data.prompts import PromptSet
from gd2po_jax.models import Decoder
from gd2po_jax.rewards.base import ROLLOUT_INDEX
from gd2po_jax.rl import dynamic_sampling as ds
from gd2po_jax.rl.rollout import RolloutSettings, collect_rollouts


@dataclasses.dataclass
class ScriptedRewards:
    """K=2 by the prompt's ``kind``: flat (1, 0 on every rollout: no signal) or varies (g, -g for
    rollout g of its group)."""

    num_samples: int
    names: tuple[str, ...] = ("a", "b")

    def __call__(self, prompts, responses, columns):
        out = []
        for kind, index in zip(columns["kind"], columns[ROLLOUT_INDEX]):
            g = float(index % self.num_samples)
            out.append((1.0, 0.0) if kind == "flat" else (g, -g))
        return np.asarray(out, np.float32)


class PromptStream:
    """Random prompts in order from ``start``; prompt i is ``flat`` with probability ``drop``."""

    def __init__(self, vocab: int, length: int, drop: float, start: int):
        self.vocab, self.length, self.drop, self.position = vocab, length, drop, start

    def draw(self, n: int) -> PromptSet:
        indices = range(self.position, self.position + n)
        self.position += n
        ids = [harness.random_prompts(self.vocab, 1, self.length, seed=i)[0] for i in indices]
        kinds = ["flat" if np.random.default_rng(10_000 + i).random() < self.drop else "varies" for i in indices]
        return PromptSet(texts=[f"p{i}" for i in indices], token_ids=ids, columns={"kind": kinds})


def run(model: Decoder, *, eos_ids: tuple[int, ...], prompts: int, num_samples: int, prompt_len: int,
        new_tokens: int, drop: float, max_rounds: int, repeats: int) -> dict:
    sampling = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, top_k=0)
    settings = RolloutSettings(num_generations=num_samples, sampling=sampling, eos_token_ids=eos_ids,
                               pad_token_id=0, prompt_length=prompt_len)
    reward = ScriptedRewards(num_samples)
    config = harness.step_config(algorithm="gdpo", num_generations=num_samples)

    def collect(prompt_set, rng, refill=None):
        return collect_rollouts(model, prompt_set, IdsTokenizer(), reward, settings, rng=rng, refill=refill)

    def step(way: str, repeat: int):
        stream = PromptStream(model.config.vocab_size, prompt_len, drop, start=repeat * 10 * prompts * max_rounds)
        first = stream.draw(prompts)
        start = time.perf_counter()
        out = ds.collect_counted(first, stream.draw, collect, rng=jax.random.key(repeat), step_config=config,
                                 mode="signal", min_kept=2, max_rounds=max_rounds, settings=settings,
                                 reward_names=reward.names, collect_refilled=collect if way == "engine" else None)
        jax.block_until_ready(out.batch.input_ids)
        return time.perf_counter() - start, out

    ways = ("engine", "rounds")
    for way in ways:  # compile
        step(way, 0)
    results: dict[str, dict[str, list[float]]] = {
        way: {"times_s": [], "prompts_drawn": [], "generated_tokens": [], "groups_counted": [], "compiles": []}
        for way in ways
    }
    with harness.CompileCounter() as compiles:
        for repeat in range(1, repeats + 1):
            for way in ways:
                before = compiles.snapshot()
                seconds, out = step(way, repeat)
                m = out.sampling_metrics
                entry = results[way]
                entry["times_s"].append(seconds)
                entry["prompts_drawn"].append(m["dynamic_sampling/prompts_drawn"])
                entry["generated_tokens"].append(m["dynamic_sampling/generated_tokens"])
                entry["groups_counted"].append(m["dynamic_sampling/groups_counted"])
                entry["compiles"].append(compiles.since(before)[0])
    summary: dict = {way: {"median_s": statistics.median(v["times_s"]), **v} for way, v in results.items()}
    summary["rounds_over_engine"] = summary["rounds"]["median_s"] / summary["engine"]["median_s"]
    return summary


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_w_tail_arguments(parser, prompts=16, new_tokens=256, repeats=3)
    parser.add_argument("--drop", type=float, default=0.4, help="share of prompts whose group does not count")
    parser.add_argument("--max_rounds", type=int, default=4)
    args = parser.parse_args(argv)
    model, eos_ids = w_tail_model(args, parser, prompts=4, new_tokens=24, prompt_len=8, repeats=1,
                                  stop_probability=1 / 8)
    result = run(model, eos_ids=eos_ids, prompts=args.prompts, num_samples=args.num_samples,
                 prompt_len=args.prompt_len, new_tokens=args.new_tokens, drop=args.drop, max_rounds=args.max_rounds,
                 repeats=args.repeats)
    write_report(result, args, eos_ids)


if __name__ == "__main__":
    main()
