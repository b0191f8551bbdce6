"""The two orientations of a decode step's weight products, and the two key-cache layouts of its
attention, timed on this machine.

A decode step multiplies N rows by every weight matrix. `gd2po_jax.models.decode_step` computes
each product as ``W^T [F, K] @ x^T [K, N]`` (feature-major, F output rows) instead of
``x [N, K] @ W [K, F]`` (N output rows); this script shows why, for the matrix shapes of a model:

    python -m bench.decode_layouts                                   # the small anchor model's shapes
    python -m bench.decode_layouts --hidden=896 --intermediate=4864 --heads=14 --kv_heads=2 --vocab=151936
    python -m bench.decode_layouts --rows=64 --repeats=50

Each product feeds an elementwise op (as in the model, so XLA cannot fold a transpose into it) and
is timed as the 10th-percentile of ``--repeats`` calls; GFLOP/s = 2 N K F / time.

Then one decode step's attention (scores, softmax, the values' product) over a full cache of
``--cache_len`` slots, for every layer (``--layers``), with the keys stored ``[N, KV, S, hd]``
or ``[N, KV, hd, S]`` (`gd2po_jax.models.decoder.KVCache` keeps the second); values
``[N, KV, S, hd]`` in both.

Then the weight products of one whole decode step, chained as in the model (each layer's output
feeds the next), with every layer's own matrices (``--layers`` x the layer's weights: more than a
CPU's last-level cache holds for the small model, so they stream from memory every step) and with
layer 0's matrices in every layer (the same FLOPs over weights that stay in the cache); and the
time to merely read the first set once (a sum), the memory's streaming rate for the same bytes.
Where the first product chain runs far below both others, the decode's products are bound by how
they read memory. The fp32 matmul peak (2048^3) is measured last, for scale.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import gd2po_jax  # noqa: F401  (the project's host-memory settings: gd2po_jax.runtime.host_memory)
from bench import harness


def percentile_time(fn, *args, repeats: int) -> float:
    """10th-percentile wall time of ``fn(*args)`` over ``repeats`` calls (after 3 warm-ups)."""
    times = harness.time_calls(lambda: fn(*args), repeats, warmup=3)
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


def layer_matrices(key, shapes, layers: int) -> tuple[list[tuple[jax.Array, ...]], jax.Array]:
    """Each layer's ``[F, K]`` matrices (qkv, o, gate_up, down; distinct values per layer) and the
    LM head's, from `matrix_shapes`."""
    *per_layer, (_, hidden, vocab) = shapes
    stacks = [tuple(0.02 * jax.random.normal(jax.random.fold_in(key, 10 * i + j), (f, k), jnp.float32)
                    for j, (_, k, f) in enumerate(per_layer)) for i in range(layers)]
    return stacks, 0.02 * jax.random.normal(jax.random.fold_in(key, 10**6), (vocab, hidden), jnp.float32)


@jax.jit
def step_products(x_t: jax.Array, stacks, lm_head: jax.Array) -> jax.Array:
    """One decode step's weight products, feature-major as in `gd2po_jax.models.decode_step`:
    ``x_t [D, N]`` through every layer's (qkv ``[(H + 2 KV) hd, D]``, o ``[D, H hd]``, gate_up
    ``[2 F, D]``, down ``[D, F]``), then the LM head ``[V, D]``; returns ``[V, N]``."""
    h = x_t
    for qkv, o, gate_up, down in stacks:
        attn = (qkv @ h)[: o.shape[1]]  # the queries' rows stand in for the attention's output
        h = h + o @ attn
        gate, up = jnp.split(gate_up @ h, 2, axis=0)
        h = h + down @ (jax.nn.silu(gate) * up)
        h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=0, keepdims=True) + 1e-6)
    return lm_head @ h


@jax.jit
def read_all(stacks) -> jax.Array:
    """Reads every matrix once (their sum): the memory's streaming rate for the same bytes."""
    return sum(jnp.sum(m) for layer in stacks for m in layer)


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
    print(f"device: {harness.device_description()}, N = {args.rows} rows, float32")
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
    stacks, lm_head = layer_matrices(key, shapes, args.layers)
    x_t = jax.random.normal(key, (args.hidden, args.rows), jnp.float32)
    step_flops = 2 * args.rows * (sum(m.size for layer in stacks for m in layer) + lm_head.size)
    layer_bytes = sum(m.nbytes for layer in stacks for m in layer)
    streamed = percentile_time(step_products, x_t, stacks, lm_head, repeats=args.repeats)
    resident = percentile_time(step_products, x_t, [stacks[0]] * args.layers, lm_head, repeats=args.repeats)
    read = percentile_time(read_all, stacks, repeats=args.repeats)
    print(f"step products, {args.layers} layers + LM head: each layer's weights {streamed * 1e3:7.2f} ms "
          f"({step_flops / streamed / 1e9:6.1f} GFLOP/s, layers' weights at {layer_bytes / streamed / 1e9:5.1f} GB/s) | "
          f"layer 0's in every layer {resident * 1e3:7.2f} ms ({step_flops / resident / 1e9:6.1f} GFLOP/s) | "
          f"ratio {streamed / resident:4.2f}")
    print(f"reading the layers' {layer_bytes / 2**20:.1f} MiB of weights once: {read * 1e3:7.2f} ms = "
          f"{layer_bytes / read / 1e9:5.1f} GB/s")
    peak = harness.matmul_peak_gflops(args.peak_size)
    print(f"matmul peak ({args.peak_size}^3): {peak:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
