"""Seconds to compile the decode program: another tree's (the one before the engine) against this one's.

    git worktree add ../pre58 f41effb^     # the tree as it was before issue 58
    python bench/decode_compile.py --before ../pre58 --hf_dir ../bench-models/small-qwen2 --json out.json

Each time is one fresh process tracing, lowering and compiling one program at workload W-tail's
shapes (`bench.rollout_engine`: 64 prompts x 4 rows, 64 prompt tokens, 512 new tokens, 64 EOS ids,
temperature 1): nothing compiled or traced before it, no compilation cache. The programs:

- ``before``: the static path's decode program (``sampling.decode_fn``) of the tree at ``--before``;
- ``chunk``: this tree's engine chunk (``engine.chunk_fn``, 64 slots, chunks of 16 steps) with the
  layers as this backend runs them (`gd2po_jax.models.engine.layer_scan`);
- ``chunk_other``: the chunk with the layers the other way (in a scan on CPU, unrolled elsewhere).

They run in turn, ``--pairs`` times (before, chunk, chunk_other, before, ...), so a drift of the
machine's speed reaches all of them alike; each pair gives one ratio. JSON: ``{"before_s": [...],
"chunk_s": [...], "chunk_other_s": [...], "before_over_chunk": [...] (pair by pair),
"median_before_over_chunk", "median_before_over_chunk_other", "config"}``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent.parent  # this tree


# (prompts, rows per prompt, prompt tokens, new tokens, slots, chunk steps): W-tail's, or seconds-long ones.
SHAPES = {"w_tail": (64, 4, 64, 512, 64, 16), "smoke": (4, 2, 8, 16, 4, 4)}


def child(program: str, tree: str, hf_dir: str, eos_ids: int, shapes: str) -> dict:
    """Times one program in this process (the child): ``tree`` is imported as gd2po_jax."""
    sys.path.insert(0, tree)
    import jax
    import numpy as np
    from flax import nnx

    from gd2po_jax.models import load_pretrained
    from gd2po_jax.models.sampling import SamplingParams, bucket_length, left_pad

    model = load_pretrained(hf_dir)
    graphdef, state = nnx.split(model)
    prompts, num_samples, prompt_len, new_tokens, slots, chunk = SHAPES[shapes]
    params = SamplingParams(
        max_new_tokens=new_tokens, temperature=1.0, eos_token_ids=tuple(range(1, 1 + eos_ids)), pad_token_id=0
    )
    rng = jax.random.key(0)
    if program == "before":
        from gd2po_jax.models.sampling import decode_fn, prefill_fn

        prompt_ids = (
            np.random.default_rng(0).integers(1 + eos_ids, model.config.vocab_size, (prompts, prompt_len)).tolist()
        )
        ids, mask = left_pad(prompt_ids, bucket_length(prompt_len), 0)
        decode_state = prefill_fn(graphdef, state, ids, mask, rng, params, num_samples, None)
        start = time.perf_counter()
        decode_fn.lower(graphdef, state, decode_state, params, None).compile()
        return {"program": program, "seconds": time.perf_counter() - start}
    from gd2po_jax.models.engine import chunk_fn, decode_attention_kind, init_state, layer_scan, weights_fn

    scanned = layer_scan(None) if program == "chunk" else not layer_scan(None)
    dtype = model.embed[...].dtype
    rows = prompts * num_samples
    engine_state = init_state(
        model.config,
        regions=slots + slots // num_samples,
        slots=slots,
        rows=rows,
        prompt_length=bucket_length(prompt_len),
        max_new_tokens=params.max_new_tokens,
        dtype=dtype,
        pad_token_id=0,
        rng=rng,
        stacked_layers=scanned,
    )
    weights = weights_fn(graphdef, state, params.merge_adapters, scanned)
    attention = decode_attention_kind(None, model.config, dtype, scanned)
    assign = np.full(slots, rows, np.int32)
    start = time.perf_counter()
    chunk_fn.lower(
        model.config, weights, engine_state, assign, np.zeros(slots, np.int32), params, chunk, attention
    ).compile()
    return {"program": program, "seconds": time.perf_counter() - start, "layers": "scan" if scanned else "unrolled"}


def measure(program: str, tree: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", program, "--tree", tree, "--hf_dir", args.hf_dir]
    command += ["--eos_ids", str(args.eos_ids), "--shapes", args.shapes]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"decode_compile: the {program} program of {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", help="the tree whose static decode program is compared (e.g. ../pre58)")
    parser.add_argument("--hf_dir", required=True, help="the checkpoint (the harness's small model)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--eos_ids", type=int, default=64, help="EOS ids 1..k (W-tail's k on the small model)")
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="w_tail", help="w_tail, or smoke: seconds")
    parser.add_argument("--json", help="write the report here too")
    parser.add_argument("--child", choices=["before", "chunk", "chunk_other"], help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.tree, args.hf_dir, args.eos_ids, args.shapes)), flush=True)
        return {}
    if not args.before or not (pathlib.Path(args.before) / "gd2po_jax").is_dir():
        parser.error(f"--before must name a tree holding gd2po_jax (got {args.before!r})")
    times: dict[str, list[float]] = {"before": [], "chunk": [], "chunk_other": []}
    layers = {}
    for pair in range(args.pairs):
        for program in times:
            result = measure(
                program, str(pathlib.Path(args.before).resolve()) if program == "before" else str(HERE), args
            )
            times[program].append(round(result["seconds"], 3))
            layers[program] = result.get("layers")
            print(
                f"[decode_compile] pair {pair + 1}/{args.pairs} {program}: {result['seconds']:.3f} s", file=sys.stderr
            )
    ratios = [round(b / c, 2) for b, c in zip(times["before"], times["chunk"])]
    ratios_other = [round(b / c, 2) for b, c in zip(times["before"], times["chunk_other"])]
    report = {
        "before_s": times["before"],
        "chunk_s": times["chunk"],
        "chunk_other_s": times["chunk_other"],
        "before_over_chunk": ratios,
        "before_over_chunk_other": ratios_other,
        "median_before_over_chunk": statistics.median(ratios),
        "median_before_over_chunk_other": statistics.median(ratios_other),
        "config": {
            "before": str(pathlib.Path(args.before).resolve()),
            "hf_dir": args.hf_dir,
            "pairs": args.pairs,
            "shapes": dict(
                zip(("prompts", "num_samples", "prompt_len", "new_tokens", "slots", "chunk"), SHAPES[args.shapes])
            ),
            "chunk_layers": layers["chunk"],
            "chunk_other_layers": layers["chunk_other"],
        },
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
