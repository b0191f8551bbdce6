"""The two orientations of a decode step's weight products, and the two key-cache layouts of its
attention, timed on this machine.

A decode step multiplies N rows by every weight matrix. `gd2po_jax.models.decode_step` computes
each product as ``W^T [F, K] @ x^T [K, N]`` (feature-major, F output rows) instead of
``x [N, K] @ W [K, F]`` (N output rows); this script shows why, for the matrix shapes of a model:

    python bench/decode_layouts.py                                   # the small anchor model's shapes
    python bench/decode_layouts.py --hidden=896 --intermediate=4864 --heads=14 --kv_heads=2 --vocab=151936
    python bench/decode_layouts.py --rows=64 --repeats=50

Each product feeds an elementwise op (as in the model, so XLA cannot fold a transpose into it) and
is timed as the 10th-percentile of ``--repeats`` calls; GFLOP/s = 2 N K F / time.

Then one decode step's attention (scores, softmax, the values' product) over a full cache of
``--cache_len`` slots, for every layer (``--layers``), with the keys stored ``[N, KV, S, hd]``
or ``[N, KV, hd, S]`` (`gd2po_jax.models.decoder.KVCache` keeps the second); values
``[N, KV, S, hd]`` in both. The fp32 matmul peak (2048^3) is measured last, for scale.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp


def percentile_time(fn, *args, repeats: int) -> float:
    """10th-percentile wall time of ``fn(*args)`` over ``repeats`` calls (after 3 warm-ups)."""
    for _ in range(3):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 10]


def matrix_shapes(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, vocab: int):
    """(name, K, F) of the decode step's products: fused qkv, o, fused gate/up, down, the LM head."""
    return [("qkv", hidden, (heads + 2 * kv_heads) * head_dim), ("o", heads * head_dim, hidden),
            ("gate_up", hidden, 2 * intermediate), ("down", intermediate, hidden), ("lm_head", hidden, vocab)]


def attention_fn(keys_transposed: bool):
    """One decode step's attention over every layer's cache: ``q [N, KV, G, hd]`` against keys
    ``[N, KV, S, hd]`` (or ``[N, KV, hd, S]``) and values ``[N, KV, S, hd]``; each layer's output
    is the next layer's query, so the layers run one after another, as in the model."""
    key_spec = "nkds" if keys_transposed else "nksd"

    def attend(q, keys, values):
        for k, v in zip(keys, values):
            scores = jnp.einsum(f"nkgd,{key_spec}->nkgs", q, k) * q.shape[-1] ** -0.5
            q = jnp.einsum("nkgs,nksd->nkgd", jax.nn.softmax(scores, axis=-1), v)
        return q

    return jax.jit(attend)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv_heads", type=int, default=4)
    parser.add_argument("--head_dim", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--rows", type=int, default=32, help="N, rows decoded at once")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--cache_len", type=int, default=128, help="S, cache slots (prompt + completion)")
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--peak_size", type=int, default=2048)
    args = parser.parse_args(argv)
    row_major = jax.jit(lambda x, w: jax.nn.silu(x @ w))  # [N, K] @ [K, F] -> [N, F]
    feature_major = jax.jit(lambda w_t, x_t: jax.nn.silu(w_t @ x_t))  # [F, K] @ [K, N] -> [F, N]
    key = jax.random.key(0)
    print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, N = {args.rows} rows, float32")
    shapes = matrix_shapes(args.hidden, args.intermediate, args.heads, args.kv_heads, args.head_dim, args.vocab)
    for name, k, f in shapes:
        x = jax.random.normal(key, (args.rows, k), jnp.float32)
        w = 0.02 * jax.random.normal(key, (k, f), jnp.float32)
        w_t, x_t = jnp.asarray(w.T), jnp.asarray(x.T)
        flops = 2 * args.rows * k * f
        rm = flops / percentile_time(row_major, x, w, repeats=args.repeats) / 1e9
        fm = flops / percentile_time(feature_major, w_t, x_t, repeats=args.repeats) / 1e9
        print(f"{name:8s} K={k:6d} F={f:7d}: x @ W {rm:7.1f} GFLOP/s | W^T @ x^T {fm:7.1f} GFLOP/s | ratio {fm / rm:4.2f}")
    groups = args.heads // args.kv_heads
    q = jax.random.normal(key, (args.rows, args.kv_heads, groups, args.head_dim), jnp.float32)
    cache_shape = (args.rows, args.kv_heads, args.cache_len, args.head_dim)
    keys = [jax.random.normal(jax.random.fold_in(key, i), cache_shape, jnp.float32) for i in range(args.layers)]
    values = [jax.random.normal(jax.random.fold_in(key, 1000 + i), cache_shape, jnp.float32) for i in range(args.layers)]
    keys_t = [jnp.asarray(k.swapaxes(-1, -2)) for k in keys]
    slots_last = percentile_time(attention_fn(True), q, keys_t, values, repeats=args.repeats)
    slots_major = percentile_time(attention_fn(False), q, keys, values, repeats=args.repeats)
    print(f"attention {args.layers} layers, S={args.cache_len}: keys [N, KV, S, hd] {slots_major * 1e3:7.2f} ms | "
          f"keys [N, KV, hd, S] {slots_last * 1e3:7.2f} ms | ratio {slots_major / slots_last:4.2f}")
    a = jax.random.normal(key, (args.peak_size, args.peak_size), jnp.float32)
    peak = 2 * args.peak_size**3 / percentile_time(jax.jit(lambda m: m @ m), a, repeats=5) / 1e9
    print(f"matmul peak ({args.peak_size}^3): {peak:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
