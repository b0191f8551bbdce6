"""Memory of an RL run on ONE device, full fine-tuning against LoRA, from the model's shapes: an
estimate to rerun with other shapes, ranks and batch sizes (docs/lora.md), not a measurement.

    python -m bench.lora_memory                                  # Qwen2.5-1.5B and -7B, rank 16 and 64
    python -m bench.lora_memory --models qwen2.5-7b --ranks 8 --rows 32 --seq 2048

Bytes per trained parameter, as docs/paper.md#memory counts them: fp32 master weights 4 + AdamW
moments 8 (held all the time), the bf16 copy the forward pass and the sampler compute with 2, fp32
gradients 4 (while the update runs) = 18 B. Full fine-tuning trains every parameter; LoRA trains
the adapters and holds the base in bf16 (``model.lora.base_dtype="bfloat16"``, which is also what a
bf16 forward reads: no second copy), 2 B per base parameter.

Then, for both: while sampling, the sampler's ``[out, in]`` copies of the matrices (bf16, made once
per generate call, `gd2po_jax.models.decode_step`) and the bf16 KV cache of the rows sampled at once
(``sampling.prompts_per_call`` x ``rl.num_generations``); while updating, the activations of one
micro-batch with ``model.remat`` (the saved layer inputs, plus the recomputed layer's attention
scores, probabilities and their gradient, and its MLP's activations, float32): the backward pass
goes through the frozen base in LoRA as in full fine-tuning, so they are the same. Not counted: the
prefill's attention scores (docs/paper.md), the reference policy of a KL term (LoRA: the base
itself, no bytes; full fine-tuning: another fp32 copy), XLA's workspace.
"""

from __future__ import annotations

import argparse
import dataclasses

from gd2po_jax.config import LORA_TARGETS

GB = 1e9


@dataclasses.dataclass(frozen=True)
class Shape:
    """A Qwen2-style decoder: hidden D, layers L, query heads H, key/value heads KV, head width hd,
    MLP width F, vocabulary V, tied embeddings."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool


# From the checkpoints' config.json (Qwen/Qwen2.5-1.5B-Instruct, Qwen/Qwen2.5-7B-Instruct).
SHAPES = {
    "qwen2.5-1.5b": Shape(hidden=1536, layers=28, heads=12, kv_heads=2, head_dim=128, intermediate=8960,
                          vocab=151936, tied=True),
    "qwen2.5-7b": Shape(hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128, intermediate=18944,
                        vocab=152064, tied=False),
}


def projection_shapes(shape: Shape) -> dict[str, tuple[int, int]]:
    """(in, out) of each projection of a layer."""
    d, q, kv, f = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    return {"q": (d, q), "k": (d, kv), "v": (d, kv), "o": (q, d), "gate": (d, f), "up": (d, f), "down": (f, d)}


def matrix_params(shape: Shape) -> int:
    """Parameters of the layers' matrices and the untied output matrix (what the sampler copies)."""
    per_layer = sum(i * o for i, o in projection_shapes(shape).values())
    return shape.layers * per_layer + (0 if shape.tied else shape.hidden * shape.vocab)


def num_params(shape: Shape) -> int:
    """Every parameter: matrices, q/k/v biases, norms, the embedding (and untied head)."""
    biases = shape.layers * (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    norms = (2 * shape.layers + 1) * shape.hidden
    return matrix_params(shape) + biases + norms + shape.vocab * shape.hidden


def adapter_params(shape: Shape, rank: int, targets=LORA_TARGETS) -> int:
    """Parameters of the adapters: ``rank * (in + out)`` per targeted projection per layer."""
    return shape.layers * sum(rank * (i + o) for name, (i, o) in projection_shapes(shape).items() if name in targets)


def kv_cache_bytes(shape: Shape, rows: int, seq: int) -> int:
    """bf16 keys and values of ``rows`` sequences of ``seq`` tokens."""
    return rows * seq * shape.layers * 2 * shape.kv_heads * shape.head_dim * 2


def activation_bytes(shape: Shape, sequences: int, seq: int) -> int:
    """One micro-batch of ``sequences`` with remat: saved layer inputs (bf16) + the recomputed layer's
    attention (3 x H x S^2, float32) and MLP (3 x S x F, float32)."""
    saved = shape.layers * seq * shape.hidden * 2
    recomputed = 3 * shape.heads * seq * seq * 4 + 3 * seq * shape.intermediate * 4
    return sequences * (saved + recomputed)


def estimate(shape: Shape, rank: int, *, rows: int, seq: int, micro_batch: int, targets=LORA_TARGETS) -> dict:
    """Bytes on one device for full fine-tuning (rank 0) or LoRA of ``rank``: ``held`` all the time
    (the trained weights and AdamW's moments, LoRA's base), ``sampling`` (while the sampler runs: the
    bf16 copy of fp32 weights, the decode copies, the KV cache) and ``update`` (while the update runs:
    the bf16 copy, fp32 gradients, activations); the peak is held + the larger phase."""
    params = num_params(shape)
    trained = adapter_params(shape, rank, targets) if rank else params
    held = {"fp32 trained weights + AdamW moments": 12 * trained}
    if rank:
        held["base weights (bf16, model.lora.base_dtype)"] = 2 * params
    copy = {"bf16 copy of the trained weights": 2 * trained}
    sampling = copy | {"decode copies of the matrices (bf16)": 2 * matrix_params(shape),
                       f"KV cache, {rows} rows x {seq} tokens (bf16)": kv_cache_bytes(shape, rows, seq)}
    update = copy | {"fp32 gradients of the trained weights": 4 * trained,
                     f"activations, {micro_batch} x {seq} tokens (remat)": activation_bytes(shape, micro_batch, seq)}
    peak = sum(held.values()) + max(sum(sampling.values()), sum(update.values()))
    return {"held": held, "sampling": sampling, "update": update, "peak": peak}


def table(name: str, shape: Shape, ranks, **sizes) -> str:
    lines = [f"{name}: {num_params(shape) / 1e9:.2f} B parameters"]
    for rank in [0, *ranks]:
        parts = estimate(shape, rank, **sizes)
        label = "full fine-tuning" if not rank else \
            f"LoRA r={rank} ({adapter_params(shape, rank) / 1e6:.1f} M adapter parameters)"
        lines.append(f"  {label}: peak {parts['peak'] / GB:.1f} GB")
        for phase in ("held", "sampling", "update"):
            lines.append(f"    {phase}: {sum(parts[phase].values()) / GB:.2f} GB")
            lines += [f"      {part:50s} {value / GB:7.2f} GB" for part, value in parts[phase].items()]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="qwen2.5-1.5b,qwen2.5-7b", help=f"comma-separated, of {sorted(SHAPES)}")
    parser.add_argument("--ranks", default="16,64", help="comma-separated LoRA ranks")
    parser.add_argument("--rows", type=int, default=64, help="rows sampled at once (prompts_per_call x G)")
    parser.add_argument("--seq", type=int, default=3072, help="prompt + completion tokens")
    parser.add_argument("--micro_batch", type=int, default=1, help="sequences per update micro-batch")
    args = parser.parse_args(argv)
    ranks = [int(r) for r in args.ranks.split(",") if r]
    for name in args.models.split(","):
        print(table(name, SHAPES[name], ranks, rows=args.rows, seq=args.seq, micro_batch=args.micro_batch))


if __name__ == "__main__":
    main()
