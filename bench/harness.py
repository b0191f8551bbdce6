"""The measuring helpers the bench scripts share: timing calls, counting XLA compilations, random
prompts, random Qwen2-shaped models, an RL step's rollouts and an update's hyperparameters, the
matmul peak, the device's name and its peak memory.

Each is written once here; the scripts (``python -m bench.<name>`` from the repository root) import
it as ``from bench import harness``. Times are wall-clock seconds of calls whose results JAX has
finished computing (`jax.block_until_ready`), so that asynchronous dispatch is not mistaken for speed.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gd2po_jax.models import Decoder, ModelConfig, RopeConfig

Clock = Callable[[], float]

# ----------------------------------------------------------------------------------------------
# Timing.
# ----------------------------------------------------------------------------------------------


def time_call(fn: Callable[[], Any], clock: Clock = time.perf_counter) -> tuple[Any, float]:
    """``(result, seconds)`` of one call of ``fn``: the wall time until its result (any pytree of
    arrays) is computed on the device. ``clock`` is the time source (seconds; tests pass a fake)."""
    start = clock()
    result = jax.block_until_ready(fn())
    return result, clock() - start


def time_calls(fn: Callable[[], Any], repeats: int, warmup: int = 0, clock: Clock = time.perf_counter) -> list[float]:
    """Seconds of each of ``repeats`` timed calls of ``fn`` (`time_call`), in call order, after
    ``warmup`` untimed calls (compilation); ``warmup`` alone with ``repeats=0`` warms up only."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    return [time_call(fn, clock)[1] for _ in range(repeats)]


def best_and_median(times: Sequence[float]) -> tuple[float, float]:
    """``(best, median)`` of ``times`` (seconds): the fastest call and the median call. The best is
    the better estimate on a shared, noisy machine; the median is what the anchors report."""
    if not times:
        raise ValueError("best_and_median of no timings")
    return min(times), statistics.median(times)


# ----------------------------------------------------------------------------------------------
# Compilations.
# ----------------------------------------------------------------------------------------------

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch.BACKEND_COMPILE_EVENT


class CompileCounter:
    """XLA compilations of this process while it listens (from creation to `close`, or within a
    ``with`` block), counted from `jax.monitoring`'s backend-compile duration event: ``count``
    (programs; a persistent-cache hit counts too, each is a new executable; a call served from the
    in-memory jit cache does not) and ``seconds`` (their compile time)."""

    def __init__(self):
        self.count, self.seconds = 0, 0.0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration_secs: float, **_) -> None:
        if event == BACKEND_COMPILE_EVENT:
            self.count += 1
            self.seconds += duration_secs

    def close(self) -> None:
        """Stops listening (the counts stay as they are)."""
        jax.monitoring.unregister_event_duration_listener(self._on_event)

    def __enter__(self) -> CompileCounter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def snapshot(self) -> tuple[int, float]:
        """``(count, seconds)`` so far, for `since`."""
        return self.count, self.seconds

    def since(self, snapshot: tuple[int, float]) -> tuple[int, float]:
        """``(compilations, compile seconds)`` since ``snapshot`` (`snapshot`)."""
        return self.count - snapshot[0], self.seconds - snapshot[1]


# ----------------------------------------------------------------------------------------------
# Inputs and models.
# ----------------------------------------------------------------------------------------------


def random_prompts(vocab_size: int, count: int, length: int, seed: int = 0, ragged: bool = False) -> list[list[int]]:
    """``count`` prompts of random token ids in ``[2, vocab_size)`` (0 and 1 are left to pad / EOS),
    each a list of ints: ``length`` ids, or with ``ragged`` a random length in ``[length // 2, length]``
    (the first ids of a row). Drawn with NumPy's ``default_rng(seed)``: one ``[count, length]`` draw
    (as the head-to-head harness draws its prompts), then the lengths."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, vocab_size, size=(count, length), dtype=np.int64)
    lengths = rng.integers(length // 2, length + 1, size=count) if ragged else [length] * count
    return [row[:n].tolist() for row, n in zip(ids, lengths)]


# Qwen2 shapes (`qwen2_config`'s arguments): the project's speed frame, a 29M-parameter model
# (docs/speed.md), and Qwen2.5-0.5B's and -1.5B's (494M and 1.54B parameters).
QWEN2_SHAPES = {
    "qwen2-29m": dict(hidden=512, layers=8, heads=8, kv_heads=2, intermediate=1408, vocab=12288, head_dim=64),
    "qwen2.5-0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936, head_dim=64),
    "qwen2.5-1.5b": dict(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936, head_dim=128),
}


SHAPE_FIELDS = ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab", "head_dim")
"""The sizes of a `QWEN2_SHAPES` entry, each a command-line override of the benches' ``--preset``."""


def add_shape_arguments(parser, presets=("qwen2-29m", "qwen2.5-0.5b"), default: str = "qwen2-29m") -> None:
    """``--preset`` (one of ``presets`` in `QWEN2_SHAPES`) and an override flag per `SHAPE_FIELDS`
    on an argparse ``parser``; `preset_shape` reads them back."""
    parser.add_argument("--preset", choices=sorted(presets), default=default)
    for name in SHAPE_FIELDS:
        parser.add_argument(f"--{name}", type=int, default=None, help="override the preset")


def preset_shape(args) -> dict[str, int]:
    """The sizes chosen by `add_shape_arguments`' flags: the preset's, with the given overrides."""
    return QWEN2_SHAPES[args.preset] | {k: getattr(args, k) for k in SHAPE_FIELDS if getattr(args, k) is not None}


def qwen2_config(*, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int,
                 head_dim: int) -> ModelConfig:
    """The `ModelConfig` of a Qwen2-shaped model of these sizes (rope theta 1e6, qkv biases, tied
    embeddings), as Qwen2.5's small checkpoints are."""
    return ModelConfig(model_type="qwen2", vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                       num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                       rope=RopeConfig(theta=1e6), qkv_bias=True, tie_word_embeddings=True)


def random_model(config: ModelConfig, dtype=jnp.float32) -> Decoder:
    """A `Decoder` of ``config`` with random weights (seed 0), parameters and compute in ``dtype``,
    initialized in one jitted program."""
    return nnx.jit(lambda: Decoder(config, dtype=jnp.dtype(dtype), rngs=nnx.Rngs(0)))()


def step_rollouts(config, setup, policy, step: int):
    """The `gd2po_jax.rl.rollout.Rollouts` of RL step ``step`` (from 0) of a run, collected as the
    trainer's loop collects them (``config``'s sampling, reward and chunking settings, log-probs at
    `logprob_temperature`) by ``policy`` (a `Decoder`) from ``setup`` (`gd2po_jax.tasks.setup.build_setup`),
    except that the prompts are the training set's next ``train.prompts_per_step`` in order (wrapping
    around) rather than a shuffled epoch's, and the sampling key is ``jax.random.key(step)``, so that
    a measurement is the same in every run."""
    # Imported here: the scripts that time no RL step (decode_layouts) need not import the trainer.
    from gd2po_jax.rl.rollout import RolloutSettings, collect_rollouts  # noqa: PLC0415

    count = config.train.prompts_per_step
    prompts = setup.train.select([(step * count + j) % len(setup.train) for j in range(count)])
    settings = RolloutSettings.of_run(config, eos_token_ids=setup.eos_ids, pad_token_id=setup.pad_id,
                                      prompt_length=setup.prompt_length)
    return collect_rollouts(policy, prompts, setup.tokenizer, setup.reward_fn, settings, rng=jax.random.key(step))


# The update's hyperparameters the benches start from (`step_config`): GD2PO-SNR as the paper runs
# it, token-mean aggregation, clip 0.2 with dual clip 3, no KL, one epoch of one minibatch. The
# `gd2po_jax.config.RLConfig` fields (rl.num_generations is not read by the update: the batch's
# shape is) and the `StepConfig`'s own.
STEP_DEFAULTS = dict(
    algorithm="gd2po_snr", snr_tau=0.8, num_generations=4, reward_names=(), reward_weights=None, batch_norm="token",
    group_eps=1e-6, drop_zero_variance_groups=False, clip_low=0.2, clip_high=0.2, dual_clip=3.0,
    loss_agg_mode="token-mean", filtered_in_denominator=True, kl_coef=0.0, kl_estimator="k3", entropy_coef=0.0,
    ppo_epochs=1, num_minibatches=1, micro_batch_size=0, logit_chunk_size=128, compute_dtype="float32",
    logprob_temperature=1.0,
    # The update alone, on the batch's old log-probs, as measured before issue 36 (a run's default,
    # old_logprobs="recompute", adds a forward pass: bench_train measures it through the run config).
    old_logprobs="sampler", rollout_is_cap=0.0, shuffle_minibatches=True, micro_batch_max_tokens=0,
    query_reweighting=True, snr_eps=1e-8, halves_ranking="prompt", skip_zero_advantage_rows=False,
)


def step_config(**changes):
    """A `gd2po_jax.rl.train_step.StepConfig` of `STEP_DEFAULTS` with ``changes`` (field -> value:
    `gd2po_jax.config.RLConfig` fields or the step config's own;
    `StepConfig.with_changes`), for an update measured outside a run config (a run's is
    `StepConfig.from_config`)."""
    from gd2po_jax.rl.train_step import StepConfig  # noqa: PLC0415  (as in step_rollouts)

    return StepConfig.of(**STEP_DEFAULTS).with_changes(**changes)


# ----------------------------------------------------------------------------------------------
# The machine.
# ----------------------------------------------------------------------------------------------


def matmul_peak_gflops(size: int = 2048, repeats: int = 5, dtype=jnp.float32, device=None) -> float:
    """GFLOP/s (2 size^3 / seconds / 1e9) of the fastest of ``repeats`` ``[size, size] @ [size, size]``
    products in ``dtype`` (float32 accumulation) on ``device`` (default: JAX's), after 2 warm-ups: the
    machine's matmul peak at this moment (the 2-core CI machines drift by up to 2x over minutes, so
    compare only with rates measured in the same run)."""
    matmul = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    with jax.default_device(device) if device is not None else contextlib.nullcontext():
        a = jax.random.normal(jax.random.PRNGKey(0), (size, size), dtype)
        best, _ = best_and_median(time_calls(lambda: matmul(a, a), repeats, warmup=2))
    return 2 * size**3 / best / 1e9


def device_description() -> str:
    """``"<device kind> x<device count>"`` of JAX's devices, e.g. ``"cpu x2"``."""
    return f"{jax.devices()[0].device_kind} x{jax.device_count()}"


def device_peak_bytes(device=None) -> int | None:
    """The peak bytes in use on ``device`` (default: JAX's first) so far, from its
    ``memory_stats()``; None where it reports none (a CPU)."""
    stats = (device or jax.devices()[0]).memory_stats() or {}
    return int(stats["peak_bytes_in_use"]) if "peak_bytes_in_use" in stats else None
