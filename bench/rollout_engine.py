"""Workload W-tail: the rollout engine against the static lock-step batch on long-tailed lengths.

    python -m bench.rollout_engine --hf_dir ../bench-models/small-qwen2 --json out.json

The checkpoint's model stops a completion with probability about 1/128 per token: its EOS ids are
``1 .. k`` (`stop_tokens`: k = 64 of the small model's 8192), the fewest whose summed probability
reaches ``--stop_probability`` on random text. Lengths are then about geometric (mean ~128), cut at
``--new_tokens`` (512). ``--prompts`` (64) random prompts x ``--num_samples`` (4) rows are generated at temperature 1,
in the same process: by the static path (every row prefilled together and decoded until the
longest stops, `gd2po_jax.models.sampling.generate(static=True)`) and by the engine
(`gd2po_jax.models.engine.run_engine`, ``--slots`` slots). Each runs once untimed (compilation),
then ``--repeats`` timed runs with compilations counted.

JSON: ``{"static": {"tokens_per_s", "median_s", "times_s", "row_steps_per_token"}, "engine":
{"tokens_per_s", "median_s", "times_s", "row_steps_per_token", "slots", "slot_counts", "chunks",
"prefills"}, "engine_over_static", "mean_length", "max_length", "compiles_after_warmup",
"compile_s", "compile_seconds" (the static decode program's and the engine's chunk program's, each
compiled afresh), "config"}``; the completions of both paths are checked equal (same per-row keys).
``--cpu-smoke`` runs a tiny random model end to end in seconds.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench import harness
from gd2po_jax.config.train import ENGINE_LAYER_SCAN, ENGINE_LAYERS
from gd2po_jax.models import Decoder, load_pretrained
from gd2po_jax.models.engine import (
    chunk_fn,
    decode_attention_kind,
    init_state,
    layer_scan,
    run_engine,
    warm_up,
    weights_fn,
)
from gd2po_jax.models.sampling import SamplingParams, bucket_length, decode_fn, generate, left_pad, prefill_fn

EOS = 1


def log(message: str) -> None:
    print(f"[rollout_engine] {message}", file=sys.stderr, flush=True)


def stop_tokens(model: Decoder, stop_probability: float, seed: int = 0) -> tuple[int, ...]:
    """The EOS ids ``1 .. k``, k the fewest whose summed probability, averaged over the final hidden
    states of random text, reaches ``stop_probability``: on a random model each token's probability
    is about 1/V, and summed over k of them it varies far less from state to state than one raised
    logit does (a single EOS row fitted to the mean hidden state gave a median probability of 1/128
    on the text it was fitted on and 1e-4 on the model's own samples: most rows ran to the budget)."""
    ids = jnp.asarray(harness.random_prompts(model.config.vocab_size, 16, 96, seed=seed + 7), jnp.int32)
    probs = np.asarray(jax.nn.softmax(model(ids), axis=-1), np.float64).reshape(-1, model.config.vocab_size)
    mass = np.cumsum(probs[:, EOS:].mean(axis=0))  # mass of ids 1..k, k = 1, 2, ...
    count = int(np.searchsorted(mass, stop_probability)) + 1
    return tuple(range(EOS, EOS + count))


def compile_seconds(model: Decoder, ids: np.ndarray, mask: np.ndarray, params: SamplingParams, num_samples: int,
                    slots: int, chunk: int) -> dict:
    """Seconds to compile the static path's decode program and the engine's chunk program (each
    lowered and compiled afresh, at this workload's shapes): the programs a sampling shape costs.
    The chunk is compiled with its layers unrolled and in a scan; ``engine_chunk_s`` is the one this
    backend runs (`gd2po_jax.models.engine.layer_scan`)."""
    graphdef, state = nnx.split(model)
    rng = jax.random.key(0)
    dstate = prefill_fn(graphdef, state, ids, mask, rng, params, num_samples, None)
    start = time.perf_counter()
    decode_fn.lower(graphdef, state, dstate, params, None).compile()
    static_s = time.perf_counter() - start
    rows = ids.shape[0] * num_samples
    seconds = {}
    for scanned in (False, True):
        engine_state = init_state(model.config, regions=slots + slots // num_samples, slots=slots, rows=rows,
                                  prompt_length=ids.shape[1], max_new_tokens=params.max_new_tokens,
                                  dtype=model.embed[...].dtype, pad_token_id=params.pad_token_id, rng=rng,
                                  stacked_layers=scanned)
        weights = weights_fn(graphdef, state, params.merge_adapters, scanned)
        assign = np.full(slots, rows, np.int32)
        start = time.perf_counter()
        attention = decode_attention_kind(None, model.config, model.embed[...].dtype, scanned)
        chunk_fn.lower(model.config, weights, engine_state, assign, np.zeros(slots, np.int32), params, chunk,
                       attention).compile()
        seconds[scanned] = time.perf_counter() - start
    engine_s = seconds[layer_scan(None)]
    return {"static_decode_s": static_s, "engine_chunk_s": engine_s, "static_over_engine": static_s / engine_s,
            "engine_chunk_loop_s": seconds[False], "engine_chunk_scan_s": seconds[True]}


def timed(fn, repeats: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return times, result


def run(model: Decoder, *, eos_ids: tuple[int, ...], prompts: int, num_samples: int, prompt_len: int,
        new_tokens: int, slots: int, min_slots: int, chunk: int, repeats: int, seed: int = 0,
        scan_layers: bool | None = None) -> dict:
    """The W-tail report for ``model`` stopping at ``eos_ids`` (`stop_tokens`); ``scan_layers``: the
    engine's layers in a scan or unrolled (None: the backend's choice, `layer_scan`)."""
    prompt_ids = harness.random_prompts(model.config.vocab_size, prompts, prompt_len, seed=seed)
    length = bucket_length(prompt_len)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, eos_token_ids=eos_ids, pad_token_id=0)
    ids, mask = left_pad(prompt_ids, length, 0)
    keys = iter(range(10**6))
    rngs = [jax.random.key(1000 + next(keys)) for _ in range(repeats + 1)]  # [0]: the warm-up's

    def static(rng):
        out = generate(model, prompt_ids, max_new_tokens=new_tokens, temperature=1.0, eos_token_ids=eos_ids,
                       pad_token_id=0, rng=rng, num_samples=num_samples, prompt_length=length, static=True)
        return out.tokens, out.lengths

    def engine(rng):
        return run_engine(model, ids, mask, params, num_samples=num_samples, rng=rng, slots=slots,
                          min_slots=min_slots, chunk=chunk, scan_layers=scan_layers)

    compiles = compile_seconds(model, ids, mask, params, num_samples, slots, chunk)
    log(f"compile: static decode {compiles['static_decode_s']:.1f} s, engine chunk {compiles['engine_chunk_s']:.1f} s")
    compile_counter = harness.CompileCounter()
    start = time.perf_counter()
    # Warm-up: the static path's two programs are compiled by `compile_seconds` (an AOT compile fills
    # the cache the calls use); every engine program runs once on empty slots.
    programs = warm_up(model, ids, mask, params, num_samples=num_samples, slots=slots, min_slots=min_slots,
                       chunk=chunk, scan_layers=scan_layers)
    warmup_s = time.perf_counter() - start
    compiles_warmup, compile_s = compile_counter.snapshot()
    log(f"warm-up: {compiles_warmup} compiles ({programs} engine programs), {warmup_s:.1f} s")
    static_times, engine_times, runs, static_out = [], [], [], None
    static_compiles = engine_compiles = 0
    for i, rng in enumerate(rngs[1:]):  # alternated, so that the machine's drift falls on both alike
        before = compile_counter.snapshot()
        t, static_out = timed(lambda rng=rng: static(rng), 1)
        static_compiles += compile_counter.since(before)[0]
        static_times += t
        log(f"run {i + 1}: static {t[0]:.1f} s")
        before = compile_counter.snapshot()
        start = time.perf_counter()
        result = engine(rng)
        jax.block_until_ready(result.tokens)
        engine_times.append(time.perf_counter() - start)
        engine_compiles += compile_counter.since(before)[0]
        log(f"run {i + 1}: engine {engine_times[-1]:.1f} s")
        runs.append(result)
    compile_counter.close()
    static_tokens, static_lengths = (np.asarray(x) for x in static_out)
    last = runs[-1]
    engine_tokens, engine_lengths = np.asarray(last.tokens), np.asarray(last.lengths)
    rows_equal = (static_tokens == engine_tokens).all(axis=1) & (static_lengths == engine_lengths)
    same = bool(rows_equal.all())
    tokens = int(static_lengths.sum())
    longest = int(static_lengths.max())
    static_median, engine_median = statistics.median(static_times), statistics.median(engine_times)
    return {
        "static": {
            "tokens_per_s": tokens / static_median,
            "median_s": static_median,
            "times_s": static_times,
            # every row steps until the longest stops (token 0 comes from the prefill)
            "row_steps_per_token": len(static_lengths) * max(longest - 1, 0) / tokens,
        },
        "engine": {
            "tokens_per_s": tokens / engine_median,
            "median_s": engine_median,
            "times_s": engine_times,
            "row_steps_per_token": last.stats.slot_steps_per_token,
            "slots": slots,
            "layer_scan": layer_scan(scan_layers),
            "min_slots": min_slots,
            "chunk": chunk,
            "slot_counts": last.stats.slot_counts,
            "chunks": last.stats.chunks,
            "prefills": last.stats.prefills,
        },
        "engine_over_static": static_median / engine_median,
        "completions_equal": same,
        # Rows whose whole completion is the static path's (a near-tie flipped by the batch size's
        # rounding changes the rest of a row: over hundreds of tokens a few rows differ).
        "rows_equal_fraction": float(rows_equal.mean()),
        "tokens": tokens,
        "mean_length": float(static_lengths.mean()),
        "max_length": longest,
        "truncated_fraction": float(np.mean(static_lengths >= new_tokens)),
        "compiles_after_warmup": engine_compiles,  # the engine's timed runs
        # The static path's timed runs: its two programs are warm; generate's small op-by-op steps
        # around them (the prompts repeated G times ...) compile on its first call (milliseconds).
        "static_compiles_after_warmup": static_compiles,
        "compile_seconds": compiles,
        "warmup_s": warmup_s,
        "compile_s": compile_s,
        "compiles_in_warmup": compiles_warmup,
    }


def add_w_tail_arguments(parser: argparse.ArgumentParser, *, prompts: int, new_tokens: int, repeats: int) -> None:
    """The arguments of the scripts that run W-tail's model (this one, bench.group_scoring,
    bench.engine_refill): the checkpoint, the report file, the workload's size and stopping, repeats,
    ``--cpu-smoke``."""
    parser.add_argument("--hf_dir", default=None, help="the checkpoint (the harness's small model)")
    parser.add_argument("--json", default=None, help="also write the report here")
    parser.add_argument("--prompts", type=int, default=prompts)
    parser.add_argument("--num_samples", type=int, default=4)
    parser.add_argument("--prompt_len", type=int, default=64)
    parser.add_argument("--new_tokens", type=int, default=new_tokens)
    parser.add_argument("--stop_probability", type=float, default=1 / 128)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--cpu-smoke", "--cpu_smoke", dest="cpu_smoke", action="store_true",
                        help="a tiny random model and workload: checks the script end to end in seconds")


def w_tail_model(args: argparse.Namespace, parser: argparse.ArgumentParser, **smoke) -> tuple[Decoder, tuple[int, ...]]:
    """``(model, eos_ids)``: the checkpoint ``--hf_dir`` (or, with ``--cpu-smoke``, a tiny random model,
    ``args`` changed by ``smoke``: argument -> its smoke value) and the EOS ids of its stopping
    (`stop_tokens`)."""
    if args.cpu_smoke:
        model = harness.random_model(harness.qwen2_config(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128,
                                                          vocab=512, head_dim=16))
        for name, value in smoke.items():
            setattr(args, name, value)
    elif args.hf_dir is None:
        parser.error("--hf_dir is required (or --cpu-smoke)")
    else:
        model = load_pretrained(args.hf_dir)
    return model, stop_tokens(model, args.stop_probability)


def write_report(report: dict, args: argparse.Namespace, eos_ids: tuple[int, ...]) -> None:
    """Adds ``config`` (the arguments, the EOS ids' count, the device) to ``report``, prints it and
    writes it to ``--json``."""
    report["config"] = vars(args) | {"eos_ids": len(eos_ids), "device": harness.device_description()}
    text = json.dumps(report, indent=2)
    print(text, flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_w_tail_arguments(parser, prompts=64, new_tokens=512, repeats=1)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--min_slots", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=16)
    parser.add_argument("--layers", choices=ENGINE_LAYERS, default="auto",
                        help="the engine's decode step: layers in a scan, unrolled, or the backend's choice")
    args = parser.parse_args(argv)
    model, eos_ids = w_tail_model(args, parser, prompts=8, new_tokens=48, slots=8, prompt_len=16,
                                  stop_probability=1 / 12)
    report = run(model, eos_ids=eos_ids, prompts=args.prompts, num_samples=args.num_samples, prompt_len=args.prompt_len,
                 new_tokens=args.new_tokens, slots=args.slots, min_slots=args.min_slots, chunk=args.chunk,
                 repeats=args.repeats, scan_layers=ENGINE_LAYER_SCAN[args.layers])
    write_report(report, args, eos_ids)


if __name__ == "__main__":
    main()
