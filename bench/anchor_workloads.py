"""The head-to-head harness's two workloads on any Hugging Face checkpoint directory, as JSON.

The speed anchors (TRL, tunix; ``../shared/bench/anchors``) are measured on three workloads. This
script runs the project's side of each through the project's public API, so the harness can call it
instead of importing the project's internals (which move):

* **W (generate)**: ``--batch`` prompts of ``--prompt_len`` random ids in ``[2, vocab)`` (NumPy
  ``default_rng(0)``, as the harness draws them) -> exactly ``--new_tokens`` sampled tokens each
  (temperature 1, full vocabulary, no EOS). One warm-up call (compilation), then the median of
  ``--repeats`` whole `gd2po_jax.models.sampling.generate` calls. tokens/s = batch x new_tokens / median.
* **T (train)**: one GRPO update on ``--batch`` sequences of prompt_len + new_tokens random ids,
  all-ones masks, no KL, one epoch, one minibatch, "seq-mean-token-mean", clip 0.2,
  clip_by_global_norm(1) + AdamW (lr 1e-6, no weight decay); entropy computed for the metrics (TRL
  and tunix compute it too). The step computes the advantages itself, from random rewards of
  batch/2 prompts x 2 generations x 1 reward. Two warm-up updates, then the median of
  ``--train_repeats``. tokens/s = batch x (prompt_len + new_tokens) / median.
* **E (one whole RL step)**: the trainer's own step (`e2e_workload`) on ``--e_prompts`` prompts of
  ``--prompt_len`` random ids x ``--e_generations`` rollouts of exactly ``--new_tokens`` tokens
  (temperature 1, no EOS), the harness's two rewards on the decoded text as a user writes them
  (`e_digits`, `e_length`: TRL's signature, given as ``rewards.functions``), advantages and one
  update (configs/default.py's: GD2PO-SNR, old log-probs recomputed, token-mean, micro-batches of 8
  rollouts, those of rollouts without a gradient skipped; lr 1e-6, no weight decay), timed from the
  prompts to the host metrics; ``--e_warmup`` untimed steps, then the median of ``--e_steps``.
  tokens/s = generated tokens / median. ``--e_micro_batch_size=0``: one forward/backward over all
  rows; ``--e_set FIELD=VALUE``: any other field of configs/default.py (e.g. ``rl.algorithm=grpo``).
  The checkpoint needs a tokenizer (the harness's word-level one: ``make_models.py``).

Each workload also reports the XLA compilations after its warm-up (must be 0), the minor page faults
of each timed call, the process's CPU time over the wall time of each call (about the number of cores
kept busy: 2.0 on a 2-core machine whose cores never wait; XLA's pool threads count while they
spin), and a fp32 matmul peak (``--peak_size``^3, default 2048) measured just before
and after it: these 2-core machines drift by up to 2x over minutes, so only ratios measured in the
same run mean anything. ``--profile DIR`` traces one more call of each workload (jax.profiler;
bench/profiling.py) and prints each program's operation time by kind (``ynn_fusion``: XLA:CPU's
library products) and by source: the kind, output shape and JAX operation of each instruction,
read from the optimized HLO that XLA dumps into DIR/hlo (so that the decode's weight products,
``f32[3072,32] dot_general``, and its attention, ``f32[32,4,2,64] bkgs,bksd->bkgd/dot_general``, are
told apart).
``GD2PO_JAX_MALLOC=system`` runs it with glibc's default allocator
settings (gd2po_jax/runtime/host_memory.py), for comparison.

    python -m bench.anchor_workloads --hf_dir ../bench-models/small-qwen2 --json out.json
    python -m bench.anchor_workloads --hf_dir DIR --workloads=T --train_repeats=2   # one workload
    python -m bench.anchor_workloads --hf_dir DIR --workloads=E --new_tokens=1024   # E with long completions
    python -m bench.anchor_workloads --hf_dir DIR --workloads=E --e_set=rl.skip_zero_advantage_rows=False
    python -m bench.anchor_workloads --hf_dir DIR --profile /tmp/prof   # + where one call's time goes
    GD2PO_JAX_MALLOC=system python -m bench.anchor_workloads --hf_dir DIR --workloads=T   # glibc's defaults
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib
import resource
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from transformers import PreTrainedTokenizerFast

from bench import harness
from bench.profiling import HLO_DUMP, dump_optimized_hlo, profile_call, profile_lines
from gd2po_jax.cli import sibling_config
from gd2po_jax.config import RunConfig
from gd2po_jax.data.prompts import EpochSampler, PromptSet
from gd2po_jax.data.tokenization import pad_token_id
from gd2po_jax.jobs import train as trainer
from gd2po_jax.models import Decoder, load_pretrained
from gd2po_jax.models.logprobs import completion_logprobs, merge_model
from gd2po_jax.models.sampling import bucket_length, generate
from gd2po_jax.rewards.scoring import check_failures
from gd2po_jax.rl.rollout import RolloutSettings, collect_rollouts
from gd2po_jax.rl.train_step import jit_train_step, make_train_step, run_step_config
from gd2po_jax.runtime.sharding import make_mesh
from gd2po_jax.tasks.setup import RunSetup, build_run_reward
from gd2po_jax.training.optimizer import make_optimizer
from gd2po_jax.training.records import RolloutBatch, TrainState


def timed_calls(fn: Callable[[], object], repeats: int, warmup: int) -> dict:
    """Times ``repeats`` calls of ``fn`` (`harness.time_calls`: blocking on its result) after ``warmup``
    untimed ones.

    Returns {"median_s", "best_s", "times_s", "compiles_after_warmup", "page_faults", "cpu_per_wall"};
    page_faults: the process's minor page faults during each timed call (fresh memory the kernel had
    to map and zero: see gd2po_jax/runtime/host_memory.py); cpu_per_wall: the process's user + system CPU
    seconds per wall second of each timed call (the cores it kept busy).
    """
    usage = []  # (rusage before, rusage after) of each timed call

    def measured():
        before = resource.getrusage(resource.RUSAGE_SELF)
        result = jax.block_until_ready(fn())
        usage.append((before, resource.getrusage(resource.RUSAGE_SELF)))
        return result

    harness.time_calls(fn, repeats=0, warmup=warmup)  # the untimed warm-ups (compilation)
    with harness.CompileCounter() as compiles:
        times = harness.time_calls(measured, repeats)
    faults = [after.ru_minflt - before.ru_minflt for before, after in usage]
    cpu_per_wall = [((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) / seconds
                    for (before, after), seconds in zip(usage, times)]
    best, median = harness.best_and_median(times)
    return {"median_s": median, "best_s": best, "times_s": times, "compiles_after_warmup": compiles.count,
            "page_faults": faults, "cpu_per_wall": cpu_per_wall}


def generate_workload(model: Decoder, *, batch: int, prompt_len: int, new_tokens: int, repeats: int,
                      profile_dir: pathlib.Path | None = None) -> dict:
    """Workload W on ``model``: timings of whole generate calls and the generated tokens/s (and, with
    ``profile_dir``, the `profile_call` report of one more call)."""
    prompts = harness.random_prompts(model.config.vocab_size, batch, prompt_len)
    keys = iter(range(10**6))

    def call():
        out = generate(model, prompts, max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, top_k=0,
                       rng=jax.random.key(next(keys)))
        return out.tokens, out.lengths

    result = timed_calls(call, repeats, warmup=1)
    tokens, lengths = call()
    if tokens.shape != (batch, new_tokens) or int(np.min(lengths)) != new_tokens:
        raise RuntimeError(f"generate gave tokens {tokens.shape} with lengths down to {int(np.min(lengths))}; "
                           f"the workload needs exactly {new_tokens} new tokens per prompt")
    if profile_dir is not None:
        result["profile"] = profile_call(call, profile_dir, hlo_dir=profile_dir.parent / HLO_DUMP)
    return result | {"tokens": batch * new_tokens, "tokens_per_s": batch * new_tokens / result["median_s"]}


def update_batch(model: Decoder, *, batch: int, prompt_len: int, new_tokens: int, seed: int = 1) -> RolloutBatch:
    """Workload T's rollouts: random ids, all-ones masks, the policy's own log-probs as old log-probs,
    random rewards of batch/2 prompts x 2 generations x 1 reward."""
    rng = np.random.default_rng(seed)
    ids = jnp.asarray(rng.integers(2, model.config.vocab_size, size=(batch, prompt_len + new_tokens)), jnp.int32)
    mask = jnp.ones(ids.shape, bool)
    old_logp, _ = nnx.jit(lambda m, i, a: completion_logprobs(m, i, a, new_tokens))(model, ids, mask)
    return RolloutBatch(input_ids=ids, attention_mask=mask, response_mask=jnp.ones((batch, new_tokens), bool),
                        old_logp=old_logp, ref_logp=jnp.zeros_like(old_logp),
                        rewards=jnp.asarray(rng.uniform(size=(batch // 2, 2, 1)), jnp.float32),
                        valid=jnp.ones((batch // 2,), bool))


def update_workload(model: Decoder, *, batch: int, prompt_len: int, new_tokens: int, repeats: int,
                    profile_dir: pathlib.Path | None = None) -> dict:
    """Workload T on ``model``: timings of one jitted GRPO update and the trained tokens/s (and, with
    ``profile_dir``, the `profile_call` report of one more update)."""
    if batch % 2:
        raise ValueError(f"--batch must be even (prompts x 2 generations), got {batch}")
    rollouts = update_batch(model, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens)
    graphdef, params = nnx.split(model, nnx.Param)
    step_config = harness.step_config(algorithm="grpo", loss_agg_mode="seq-mean-token-mean", clip_low=0.2,
                                      clip_high=0.2, dual_clip=0.0, kl_coef=0.0, entropy_coef=0.0, log_entropy=True,
                                      ppo_epochs=1, num_minibatches=1, micro_batch_size=0, compute_dtype="float32")
    optimizer = make_optimizer(1e-6, weight_decay=0.0, grad_clip=1.0)
    step = jit_train_step(make_train_step(graphdef, optimizer, step_config))
    state = [TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(0))]

    def call():
        state[0], metrics = step(state[0], rollouts)
        return state[0].params, metrics

    result = timed_calls(call, repeats, warmup=2)
    if profile_dir is not None:
        result["profile"] = profile_call(call, profile_dir, hlo_dir=profile_dir.parent / HLO_DUMP)
    tokens = batch * (prompt_len + new_tokens)
    return result | {"tokens": tokens, "tokens_per_s": tokens / result["median_s"]}


# Workload E's rewards (the harness's ``common.reward_digits`` / ``reward_length``), written as a user
# writes reward functions for TRL and passes them to the project as ``rewards.functions``.
DEFAULT_CONFIG = pathlib.Path(__file__).resolve().parents[1] / "configs" / "default.py"
E_LENGTH_TARGET = 360
"""Characters; 64 decoded words of the harness's tokenizer are about 340-380 characters."""


def e_digits(prompts, completions, **kwargs) -> list[float]:
    """The fraction of each decoded completion's characters that are digits."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def e_length(prompts, completions, **kwargs) -> list[float]:
    """``1 - |len(text) - E_LENGTH_TARGET| / E_LENGTH_TARGET`` of each completion, clipped to [0, 1]."""
    return [min(1.0, max(0.0, 1.0 - abs(len(text) - E_LENGTH_TARGET) / E_LENGTH_TARGET)) for text in completions]


def e2e_config(hf_dir: str, *, prompts: int, generations: int, new_tokens: int, steps: int,
               micro_batch_size: int | None = None, overrides: Mapping[str, Any] | None = None):
    """Workload E's `RunConfig`: configs/default.py with the checkpoint ``hf_dir``, G = ``generations``,
    ``prompts`` per step, exactly ``new_tokens`` sampled at temperature 1 (full vocabulary), the two
    reward functions and no family, lr 1e-6 without weight decay, no warm start, no evaluation; the
    update in the default's micro-batches (None), in micro-batches of ``micro_batch_size`` rows, or
    all rows at once (0; the same gradient either way, summed over micro-batches); then
    ``overrides`` (dotted config field -> value, e.g. ``{"rl.algorithm": "grpo"}``)."""
    config = sibling_config(str(DEFAULT_CONFIG), "default").get_config()
    config.model.path = str(hf_dir)
    config.rewards.kind, config.rewards.names = "", ()
    config.rewards.functions = ("bench.anchor_workloads:e_digits", "bench.anchor_workloads:e_length")
    config.rl.num_generations, config.rl.length_bucket = generations, 0
    config.sampling.update(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, top_k=0)
    config.train.update(num_steps=steps, prompts_per_step=prompts, learning_rate=1e-6, weight_decay=0.0, grad_clip=1.0)
    config.sft.enabled, config.eval.split = False, "none"
    changes = dict(overrides or {})
    if micro_batch_size is not None:
        changes["rl.micro_batch_size"] = micro_batch_size
    config.lock()  # an unknown field is an error, not a new one
    for field, value in changes.items():
        try:
            config.update_from_flattened_dict({field: value})
        except (KeyError, AttributeError) as err:
            raise ValueError(f"--e_set {field}: not a field of configs/default.py") from err
    return RunConfig.from_config_dict(config)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["rl.algorithm=grpo", "rl.skip_zero_advantage_rows=False"]`` -> {field: value}: a value is a
    Python literal where it reads as one, else the string."""
    overrides = {}
    for pair in pairs:
        field, sep, text = pair.partition("=")
        if not sep:
            raise ValueError(f"--e_set {pair!r}: expected FIELD=VALUE")
        try:
            overrides[field] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            overrides[field] = text
    return overrides


def e2e_workload(hf_dir: str, *, prompts: int, generations: int, prompt_len: int, new_tokens: int, steps: int,
                 warmup: int = 2, micro_batch_size: int | None = None, overrides: Mapping[str, Any] | None = None
                 ) -> dict:
    """Workload E on the checkpoint ``hf_dir``: ``warmup + steps`` RL steps, each the calls the trainer's
    loop makes (`gd2po_jax.jobs.train`; no evaluation, checkpoint or metrics file): the next prompts,
    `collect_rollouts` (sampling on device, decoding, the rewards on the host), the jitted update,
    its metrics on the host. The rollout / update split of each step, compilations per step and the
    peak RSS after each are reported; tokens/s = generated tokens / the median step."""
    config = e2e_config(hf_dir, prompts=prompts, generations=generations, new_tokens=new_tokens, steps=warmup + steps,
                        micro_batch_size=micro_batch_size, overrides=overrides)
    mesh = make_mesh(data=config.mesh.data, fsdp=config.mesh.fsdp, tensor=config.mesh.tensor)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(hf_dir))
    tokenizer.padding_side = "left"
    token_ids = harness.random_prompts(len(tokenizer), prompts, prompt_len, seed=2)
    texts = tokenizer.batch_decode(token_ids)
    eos_ids: list[int] = []  # no EOS: every rollout samples exactly new_tokens
    # Plain-text prompts, as a loader gives them (the reward functions receive prompt_text).
    prompt_set = PromptSet(texts=texts, token_ids=token_ids, columns={"prompt_text": texts})
    setup = RunSetup(model_path=pathlib.Path(hf_dir), tokenizer=tokenizer, eos_ids=eos_ids,
                     pad_id=pad_token_id(tokenizer, [0]), reward_fn=build_run_reward(config),
                     reward_names=("e_digits", "e_length"), reward_weights=(), train=prompt_set, evals={},
                     sft_dataset=None, prompt_length=bucket_length(prompt_len), mesh=mesh)
    sampler = EpochSampler(len(setup.train), config.train.seed)
    graphdef, optimizer, state, frozen = trainer.init_state(config, setup, setup.model_path)
    step_config = run_step_config(config, setup.train.min_tokens, setup.prompt_length,
                                  reward_names=setup.reward_names, reward_weights=setup.reward_weights)
    train_step = jit_train_step(make_train_step(graphdef, optimizer, step_config, setup.mesh),
                                jax.tree.map(lambda x: x.sharding, state))
    step_args = () if frozen is None else (frozen,)
    settings = RolloutSettings.of_run(config, eos_token_ids=eos_ids, pad_token_id=setup.pad_id,
                                      prompt_length=setup.prompt_length)
    sample_key = jax.random.fold_in(jax.random.PRNGKey(config.train.seed), 1)
    rows = []
    with harness.CompileCounter() as compiles:
        for step in range(warmup + steps):
            before = compiles.snapshot()
            t0 = time.perf_counter()
            rollouts = collect_rollouts(
                merge_model(graphdef, state.params, config.model.dtype, frozen),
                setup.train.select(sampler.next_batch(prompts)), tokenizer, setup.reward_fn, settings,
                rng=jax.random.fold_in(sample_key, step))
            check_failures(rollouts.failed, setup.reward_names, config.rewards.max_failed_fraction, step=step + 1,
                           first_error=rollouts.first_failure)
            t1 = time.perf_counter()
            state, raw = train_step(state, rollouts.batch, *step_args)
            raw = jax.device_get(raw)
            t2 = time.perf_counter()
            # The trainer's host-side metrics of a step (their cost is part of E; the values are not used).
            trainer.host_metrics(rollouts, {"rollout": rollouts.sampling_seconds, "rewards": rollouts.reward_seconds,
                                            "update": t2 - t1, "other": 0.0}, setup.reward_names)
            if rollouts.generated_tokens != prompts * generations * new_tokens:
                raise RuntimeError(f"step {step + 1} generated {rollouts.generated_tokens} tokens; workload E needs "
                                   f"exactly {new_tokens} per rollout")
            rows.append(dict(step_s=t2 - t0, rollout_s=t1 - t0, sampling_s=rollouts.sampling_seconds,
                             reward_s=rollouts.reward_seconds, update_s=t2 - t1, compiles=compiles.since(before)[0],
                             kept_fraction=float(raw["advantages/kept_fraction"]),
                             skipped_rows=float(raw["update/skipped_rows"]),
                             peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
    timed = rows[warmup:]
    median = statistics.median(r["step_s"] for r in timed)
    generated = prompts * generations * new_tokens
    return {"median_s": median, "times_s": [r["step_s"] for r in timed], "steps": rows,
            "rollout_median_s": statistics.median(r["rollout_s"] for r in timed),
            "update_median_s": statistics.median(r["update_s"] for r in timed),
            "skipped_rows_median": statistics.median(r["skipped_rows"] for r in timed),
            "config": {"algorithm": config.rl.algorithm, "old_logprobs": config.rl.old_logprobs,
                       "micro_batch_size": config.rl.micro_batch_size,
                       "skip_zero_advantage_rows": config.rl.skip_zero_advantage_rows},
            "compiles_after_warmup": sum(r["compiles"] for r in timed),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in rows),
            "tokens": generated, "tokens_per_s": generated / median, "per_token_ms": median / generated * 1e3}


WORKLOADS = {"W": generate_workload, "T": update_workload, "E": e2e_workload}


def run(hf_dir: str, workloads: str, *, batch: int, prompt_len: int, new_tokens: int, repeats: int,
        train_repeats: int, peak_size: int = 2048, profile: str = "", e_prompts: int = 16, e_generations: int = 4,
        e_steps: int = 5, e_warmup: int = 2, e_micro_batch_size: int | None = None,
        e_overrides: Mapping[str, Any] | None = None) -> dict:
    """The report of the chosen ``workloads`` ("W", "T", "E", comma-separated) on the checkpoint
    ``hf_dir``; with ``profile`` (a directory), W and T also trace one more call into
    ``profile``/<workload>."""
    names = [w.strip() for w in workloads.split(",") if w.strip()]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown or not names:
        raise ValueError(f"--workloads: unknown {unknown or names}; choose from {sorted(WORKLOADS)} (comma-separated)")
    model = load_pretrained(hf_dir, dtype=jnp.float32)
    config = model.config
    report = {
        "framework": "gd2po-jax", "hf_dir": str(hf_dir), "jax": jax.__version__,
        "device": harness.device_description(),
        "model": {"model_type": config.model_type, "params": config.num_params(), "vocab_size": config.vocab_size,
                  "hidden_size": config.hidden_size, "num_layers": config.num_layers},
        "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens, "workloads": {},
    }
    for name in names:
        peak_before = harness.matmul_peak_gflops(size=peak_size)
        repeat = repeats if name == "W" else train_repeats
        profile_dir = pathlib.Path(profile) / name if profile else None
        if name == "E":
            repeat = e_steps
            result = e2e_workload(hf_dir, prompts=e_prompts, generations=e_generations, prompt_len=prompt_len,
                                  new_tokens=new_tokens, steps=e_steps, warmup=e_warmup,
                                  micro_batch_size=e_micro_batch_size, overrides=e_overrides)
            print(f"E: step {result['median_s']:.2f} s (rollout {result['rollout_median_s']:.2f} s + update "
                  f"{result['update_median_s']:.2f} s; rows skipped {result['skipped_rows_median']:.0%}), "
                  f"{result['per_token_ms']:.3f} ms per generated token, "
                  f"peak RSS {result['peak_rss_mb']:,.0f} MiB", flush=True)
        else:
            result = WORKLOADS[name](model, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
                                     repeats=repeat, profile_dir=profile_dir)
        result |= {"matmul_peak_gflops": [peak_before, harness.matmul_peak_gflops(size=peak_size)]}
        report["workloads"][name] = result
        calls = "" if name == "E" else (
            f", page faults a call {statistics.median(result['page_faults']):,.0f}, CPU/wall "
            f"{statistics.median(result['cpu_per_wall']):.2f}")
        print(f"{name}: {result['tokens_per_s']:,.0f} tokens/s (median {result['median_s'] * 1e3:.1f} ms of "
              f"{repeat}), compilations after warm-up {result['compiles_after_warmup']}{calls}, "
              f"matmul peak {result['matmul_peak_gflops'][0]:.0f} -> {result['matmul_peak_gflops'][1]:.0f} GFLOP/s",
              flush=True)
        for line in profile_lines(name, result.get("profile", {})):
            print(line, flush=True)
    return report


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf_dir", required=True,
                        help="a Hugging Face checkpoint directory (config.json + safetensors)")
    parser.add_argument("--workloads", default="W,T", help="W, T, E, comma-separated")
    parser.add_argument("--batch", type=int, default=32, help="prompts (W) / sequences (T)")
    parser.add_argument("--prompt_len", type=int, default=64)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed generate calls (W)")
    parser.add_argument("--train_repeats", type=int, default=5, help="timed updates (T)")
    parser.add_argument("--e_prompts", type=int, default=16, help="prompts per RL step (E)")
    parser.add_argument("--e_generations", type=int, default=4, help="rollouts per prompt (E)")
    parser.add_argument("--e_steps", type=int, default=5, help="timed RL steps (E)")
    parser.add_argument("--e_warmup", type=int, default=2, help="untimed RL steps first (E)")
    parser.add_argument("--e_micro_batch_size", type=int, default=None,
                        help="rows per forward/backward of E's update; 0: all at once; default: configs/default.py's")
    parser.add_argument("--e_set", action="append", default=[], metavar="FIELD=VALUE",
                        help="E: a field of configs/default.py, e.g. rl.algorithm=grpo (repeatable)")
    parser.add_argument("--peak_size", type=int, default=2048, help="matrix size of the matmul-peak probe")
    parser.add_argument("--json", default="", help="also write the report to this file")
    parser.add_argument("--profile", default="", help="trace one more call of each workload into this directory "
                                                      "and report where its operations' time goes, by kind and by "
                                                      "source (XLA also dumps every program's optimized HLO into "
                                                      "its hlo/ folder: tens of MB)")
    args = parser.parse_args(argv)
    if args.profile:
        dump_optimized_hlo(pathlib.Path(args.profile) / HLO_DUMP)
    report = run(args.hf_dir, args.workloads, batch=args.batch, prompt_len=args.prompt_len,
                 new_tokens=args.new_tokens, repeats=args.repeats, train_repeats=args.train_repeats,
                 peak_size=args.peak_size, profile=args.profile, e_prompts=args.e_prompts,
                 e_generations=args.e_generations, e_steps=args.e_steps, e_warmup=args.e_warmup,
                 e_micro_batch_size=args.e_micro_batch_size, e_overrides=parse_overrides(args.e_set))
    text = json.dumps(report, indent=2)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
