"""Sampler throughput: prefill tokens/s and generated tokens/s of `gd2po_jax.models.sampling.generate`.

Default: a random 29M-parameter Qwen2-shaped model (hidden 512, 8 layers, 8 heads, 2 kv heads,
intermediate 1408, vocab 12288, tied embeddings), fp32, 32 prompts x 64 prompt tokens x 64 new tokens.

    python -m bench.bench_sampling                       # the default above
    python -m bench.bench_sampling --preset qwen2.5-0.5b --dtype bfloat16 --batch 64
    python -m bench.bench_sampling --hf_dir /path/to/checkpoint

A seconds-long check that the script runs (a 1-layer model, 2 prompts, 4 new tokens):

    python -m bench.bench_sampling --hidden=32 --layers=1 --heads=2 --kv_heads=1 --intermediate=64
        --vocab=128 --head_dim=16 --batch=2 --prompt_len=8 --new_tokens=4 --repeats=1

No EOS is set, so every row generates exactly --new_tokens tokens. Compilation is excluded (one
warm-up call); each timing is reported as the best and the median of --repeats calls (the best is
the better estimate on a shared, noisy machine).

XLA options, measured against the defaults in one process: --compile_options takes a JSON object
of XLA debug options (the names of XLA_FLAGS without the dashes); the prefill and decode programs
are compiled once with the defaults and once with these options, then timed in --pairs alternated
pairs, so that the machine's drift falls on both alike:

    python -m bench.bench_sampling --hf_dir ../bench-models/small-qwen2 --pairs 8 \
        --compile_options '{"xla_cpu_experimental_ynn_fusion_type": "", "xla_cpu_use_xnnpack": true}'

The rollout engine against the static lock-step batch on these shapes (the harness's workload W:
no EOS, so every row runs to the budget and lock-step is the best any batching can do): whole
`generate` calls through each (``static=False``, the default, and ``static=True``) in
--static_pairs alternated pairs, their medians and the median of the per-pair ratios:

    python -m bench.bench_sampling --hf_dir ../bench-models/tiny-qwen2 --repeats 1 --static_pairs 12
"""

from __future__ import annotations

import argparse
import json
import statistics

import jax
import jax.numpy as jnp
from flax import nnx

from bench import harness
from gd2po_jax.models import Decoder, load_pretrained
from gd2po_jax.models.sampling import SamplingParams, bucket_length, decode_fn, generate, left_pad, prefill_fn


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_shape_arguments(parser)
    parser.add_argument("--hf_dir", "--hf-dir", default=None, help="load this checkpoint instead of a random model")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--batch", type=int, default=32, help="number of prompts P")
    parser.add_argument("--num_samples", "--num-samples", type=int, default=1, help="completions per prompt G")
    parser.add_argument("--prompt_len", "--prompt-len", type=int, default=64)
    parser.add_argument("--new_tokens", "--new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top_p", "--top-p", type=float, default=1.0)
    parser.add_argument("--top_k", "--top-k", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile_options", "--compile-options", type=compile_options, default=None,
                        help='JSON object of XLA debug options to compare with the defaults, e.g. '
                             '\'{"xla_cpu_use_xnnpack": true}\'')
    parser.add_argument("--pairs", type=int, default=6, help="alternated pairs of the --compile_options comparison")
    parser.add_argument("--static_pairs", type=int, default=0,
                        help="also time generate through the engine against its static path, in this many "
                             "alternated pairs")
    return parser.parse_args(argv)


def compile_options(text: str) -> dict:
    """--compile_options: a JSON object (option name -> value)."""
    try:
        options = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err}): {text!r}") from None
    if not isinstance(options, dict) or not options:
        raise argparse.ArgumentTypeError(f"expected a non-empty JSON object of XLA options, got {text!r}")
    return options


def build_model(args) -> Decoder:
    dtype = jnp.dtype(args.dtype)
    if args.hf_dir:
        return load_pretrained(args.hf_dir, dtype=dtype)
    return harness.random_model(harness.qwen2_config(**harness.preset_shape(args)), dtype)


def main(argv=None) -> None:
    args = parse_args(argv)
    model = build_model(args)
    config = model.config
    prompts = harness.random_prompts(config.vocab_size, args.batch, args.prompt_len)
    kwargs = dict(
        max_new_tokens=args.new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        num_samples=args.num_samples,
    )
    n_rows = args.batch * args.num_samples
    generated = n_rows * args.new_tokens

    _, compile_s = harness.time_call(lambda: generate(model, prompts, rng=jax.random.key(0), **kwargs).tokens)
    total = harness.best_and_median(
        harness.time_calls(lambda: generate(model, prompts, rng=jax.random.key(1), **kwargs).tokens, args.repeats))

    # Prefill and decode timed separately, with the same compiled programs generate uses.
    graphdef, state = nnx.split(model)
    params = SamplingParams(**{k: v for k, v in kwargs.items() if k != "num_samples"})
    ids, mask = left_pad(prompts, bucket_length(args.prompt_len), 0)
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)
    programs = generate_programs(graphdef, params, args.num_samples)
    prefill_times, decode_times, _ = zip(*(prefill_then_decode(programs, state, ids, mask, jax.random.key(i))
                                           for i in range(args.repeats)))
    prefill, decode = harness.best_and_median(prefill_times), harness.best_and_median(decode_times)
    prefill_tokens = args.batch * ids.shape[1]

    print(f"device: {harness.device_description()}  dtype={args.dtype}")
    print(
        f"model: {config.model_type} hidden={config.hidden_size} layers={config.num_layers} "
        f"heads={config.num_heads}/{config.num_kv_heads} head_dim={config.head_dim} "
        f"intermediate={config.intermediate_size} vocab={config.vocab_size} "
        f"tied={config.tie_word_embeddings} params={config.num_params() / 1e6:.1f}M"
    )
    print(
        f"batch: {args.batch} prompts x {args.num_samples} samples, prompt {args.prompt_len} "
        f"(bucket {ids.shape[1]}), {args.new_tokens} new tokens, T={args.temperature} "
        f"top_p={args.top_p} top_k={args.top_k}"
    )
    print(f"first call (compile + run): {compile_s:.2f} s")
    for i, label in enumerate(("best", "median")):
        print(
            f"[{label:>6}] prefill {prefill[i] * 1e3:7.1f} ms = {prefill_tokens / prefill[i]:8,.0f} prefill tokens/s"
            f" | decode {decode[i] * 1e3:7.1f} ms = {generated / decode[i]:8,.0f} tokens/s"
            f" | generate {total[i] * 1e3:7.1f} ms = {generated / total[i]:8,.0f} generated tokens/s"
        )

    if args.compile_options:
        compare_options(graphdef, state, ids, mask, params, args.num_samples, args.compile_options, args.pairs)
    if args.static_pairs:
        compare_static(model, prompts, kwargs, args.static_pairs)


def generate_programs(graphdef, params: SamplingParams, num_samples: int):
    """``(prefill(state, ids, mask, rng), decode(state, dstate))``: the jitted programs `generate` runs."""
    return (lambda state, ids, mask, rng: prefill_fn(graphdef, state, ids, mask, rng, params, num_samples, None),
            lambda state, dstate: decode_fn(graphdef, state, dstate, params, None))


def compiled_programs(graphdef, state, ids, mask, params: SamplingParams, num_samples: int, options: dict):
    """The same two programs compiled with the XLA ``options`` (called with the same arguments)."""
    key = jax.random.key(0)
    prefill = prefill_fn.lower(graphdef, state, ids, mask, key, params, num_samples, None).compile(options)
    decode = decode_fn.lower(graphdef, state, prefill(state, ids, mask, key), params, None).compile(options)
    return prefill, decode


def prefill_then_decode(programs, state, ids, mask, rng) -> tuple[float, float, jax.Array]:
    """(prefill seconds, decode seconds, tokens [N, M]) of one run of ``programs``."""
    prefill, decode = programs
    dstate, prefill_s = harness.time_call(lambda: prefill(state, ids, mask, rng))
    tokens, decode_s = harness.time_call(lambda: decode(state, dstate).tokens)
    return prefill_s, decode_s, tokens


def compare_options(graphdef, state, ids, mask, params: SamplingParams, num_samples: int, options: dict,
                    pairs: int) -> None:
    """Times the default programs and those compiled with ``options`` in ``pairs`` alternated pairs
    (default first in even pairs) and prints the medians and the median of the per-pair ratios."""
    programs = {"default": generate_programs(graphdef, params, num_samples),
                "options": compiled_programs(graphdef, state, ids, mask, params, num_samples, options)}

    def run(name: str, i: int) -> tuple[float, float, jax.Array]:
        return prefill_then_decode(programs[name], state, ids, mask, jax.random.key(i))

    same_tokens = bool(jnp.all(run("default", 0)[2] == run("options", 0)[2]))  # also the warm-up
    times = {"default": [], "options": []}
    for i in range(pairs):
        for name in ("default", "options") if i % 2 == 0 else ("options", "default"):
            times[name].append(run(name, i + 1)[:2])
    print(f"compile options {json.dumps(options)}: {pairs} alternated pairs, medians default / with them / ratio")
    for part, label in enumerate(("prefill", "decode")):
        default = [t[part] for t in times["default"]]
        with_options = [t[part] for t in times["options"]]
        ratio = statistics.median(b / a for a, b in zip(default, with_options))
        print(f"  {label:7s} {statistics.median(default) * 1e3:8.1f} ms / {statistics.median(with_options) * 1e3:8.1f} ms"
              f" / {ratio:5.3f}")
    print(f"  same tokens: {same_tokens}")


def compare_static(model: Decoder, prompts, kwargs: dict, pairs: int) -> None:
    """Times whole `generate` calls through the engine and through the static path in ``pairs``
    alternated pairs (static first in even pairs; each call its own key, the same for both) and
    prints the medians and the median of the per-pair ratios static / engine (> 1: the engine is
    faster), and how many rows the two completed alike for the same key (a near-tie that the batch
    size's rounding flips changes the rest of a row)."""

    def call(static: bool, key: int) -> tuple[float, jax.Array]:
        tokens, seconds = harness.time_call(
            lambda: generate(model, prompts, rng=jax.random.key(key), static=static, **kwargs).tokens)
        return seconds, tokens

    rows_equal = jnp.all(call(False, 0)[1] == call(True, 0)[1], axis=1)  # also both paths' warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(pairs):
        for static in (True, False) if i % 2 == 0 else (False, True):
            times[static].append(call(static, i + 1)[0])
    ratio = statistics.median(s / e for s, e in zip(times[True], times[False]))
    print(f"engine against static: {pairs} alternated pairs, generate medians engine / static / static over engine")
    print(f"  generate {statistics.median(times[False]) * 1e3:8.1f} ms / {statistics.median(times[True]) * 1e3:8.1f} ms"
          f" / {ratio:5.3f}")
    print(f"  rows equal: {int(jnp.sum(rows_equal))} of {rows_equal.shape[0]}")


if __name__ == "__main__":
    main()
