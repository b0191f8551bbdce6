"""The training loop: warm start, then rollouts -> rewards -> one jitted update per step.

``train_and_evaluate(config, workdir)`` is what ``python train.py`` runs. The workdir holds
everything a run needs to resume or be reproduced::

    config.json         the resolved config
    base_model/         the embedded default's tokenizer + tiny random Qwen2 (HF format)
    warm_start/         the supervised warm-start checkpoint (HF format), reused when present
                        (with config.sft.cache_dir it lives in CACHE_DIR/<key> instead, shared)
    warm_start_logs/    the SFT loss of the warm start, if this run trained it
    checkpoints/        Orbax checkpoints of the RL state and data position
    metrics.jsonl       one JSON object per RL step;  tensorboard/  the same as event files
    eval/               before_rl.json, after_rl.json (+ generations *.jsonl)
    policy/             the final policy in HF safetensors format
    results.json        validation metrics before and after RL
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import shutil
import time
import uuid
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from gd2po_jax import embedded
from gd2po_jax.checkpointing import Checkpointer
from gd2po_jax.config_validation import ConfigError, validate_config
from gd2po_jax.data.loaders import load_data
from gd2po_jax.evaluation.generation import evaluate, tool_calling_scorer, write_report
from gd2po_jax.metrics_logging import MetricsWriter
from gd2po_jax.models import load_pretrained, save_pretrained
from gd2po_jax.prompts import EpochSampler, PromptSet, build_prompt_set
from gd2po_jax.rewards.base import build_reward_function
from gd2po_jax.rollout import collect_rollouts
from gd2po_jax.sampling import bucket_length
from gd2po_jax.sft import build_sft_data, make_sft_step, sft_batches
from gd2po_jax.sharding import make_mesh
from gd2po_jax.tokenization import eos_token_ids, load_tokenizer
from gd2po_jax.train_step import (
    StepConfig,
    TrainState,
    completion_logprobs,
    jit_train_step,
    make_optimizer,
    make_train_step,
    merge_model,
)

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------
# Setup: data, model, tokenizer, rewards.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class RunSetup:
    """What a run is made of, resolved from the config (host objects; no training state)."""

    model_path: pathlib.Path
    tokenizer: Any
    eos_ids: list[int]
    pad_id: int
    reward_fn: Any
    train: PromptSet
    evals: dict[str, PromptSet]  # split name -> prompts (validation, test)
    sft_dataset: Any  # datasets.Dataset with a `target` column, or None
    prompt_length: int
    mesh: Any


def _load_split(path: str, config) -> Any:
    result = load_data(path, kind=config.data.kind, on_error=config.data.on_error)
    if result.num_skipped:
        logger.warning("%s: skipped %d malformed rows (config.data.on_error='skip')", path, result.num_skipped)
    return result.dataset


def load_splits(config, workdir: pathlib.Path) -> tuple[dict[str, Any], pathlib.Path]:
    """The datasets by split name, and the model directory (built for the embedded default)."""
    if config.task == "synthetic_tools":
        splits = dict(embedded.synthetic_splits(config.data.synthetic))
        model_path = config.model.path or embedded.build_base_model(
            workdir / "base_model", splits, config.model.tiny, config.data.synthetic.tokenizer_vocab_size
        )
    else:
        splits = {"train": _load_split(config.data.train, config)}
        for split in ("validation", "test"):
            if config.data[split]:
                splits[split] = _load_split(config.data[split], config)
        if not config.model.path:
            raise ValueError("config.model.path: the files task needs a Hugging Face model directory")
        model_path = config.model.path
    return splits, pathlib.Path(model_path)


def build_setup(config, workdir: pathlib.Path) -> RunSetup:
    """Data, tokenizer, reward function and mesh of a run; validates the config first."""
    try:
        mesh = make_mesh(data=config.mesh.data, fsdp=config.mesh.fsdp, tensor=config.mesh.tensor)
    except ValueError as err:
        raise ConfigError(f"config.mesh: {err}") from err
    validate_config(config, num_data_shards=mesh.shape["data"] * mesh.shape["fsdp"])
    splits, model_path = load_splits(config, workdir)
    tokenizer = load_tokenizer(config.model.tokenizer_path or model_path)
    eos_ids = eos_token_ids(tokenizer, model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    reward_fn = build_reward_function({
        "kind": config.rewards.kind, "names": tuple(config.rewards.names),
        "max_think_words": config.rewards.max_think_words,
        "conditional_length": config.rewards.conditional_length,
    })
    limit = config.data.max_prompt_tokens
    train = build_prompt_set(splits["train"], tokenizer, max_prompt_tokens=limit, where="training data")
    evals = {}
    for split in ("validation", "test"):
        if split in splits and len(splits[split]):
            dataset = splits[split]
            if config.eval.max_examples:
                dataset = dataset.select(range(min(config.eval.max_examples, len(dataset))))
            evals[split] = build_prompt_set(dataset, tokenizer, max_prompt_tokens=limit, where=f"{split} data")
    longest = max([train.max_tokens] + [p.max_tokens for p in evals.values()])
    sft_dataset = None
    if config.sft.enabled:
        sft_dataset = _load_split(config.sft.data, config) if config.sft.data else splits["train"]
    return RunSetup(
        model_path=model_path, tokenizer=tokenizer, eos_ids=eos_ids, pad_id=pad_id, reward_fn=reward_fn,
        train=train, evals=evals, sft_dataset=sft_dataset, prompt_length=bucket_length(longest), mesh=mesh,
    )


def step_config(config) -> StepConfig:
    """The static update hyperparameters from ``config.rl`` / ``config.train``."""
    rl = config.rl
    weights = tuple(float(w) for w in config.rewards.weights) or None
    return StepConfig(
        method=rl.algorithm, snr_tau=float(rl.snr_tau), reward_weights=weights, batch_norm=rl.batch_norm,
        group_eps=float(rl.group_eps), drop_zero_variance_groups=bool(rl.drop_zero_variance_groups),
        clip_low=float(rl.clip_low), clip_high=float(rl.clip_high),
        dual_clip=float(rl.dual_clip) if rl.dual_clip > 0 else None, loss_agg_mode=rl.loss_agg_mode,
        filtered_in_denominator=bool(rl.filtered_in_denominator), kl_coef=float(rl.kl_coef),
        kl_estimator=rl.kl_estimator, entropy_coef=float(rl.entropy_coef), ppo_epochs=int(rl.ppo_epochs),
        num_minibatches=int(rl.num_minibatches), micro_batch_size=int(rl.micro_batch_size),
        logit_chunk_size=int(config.train.logit_chunk_size), compute_dtype=config.model.dtype,
    )


def _place_on_mesh(tree, mesh):
    """Leaves not yet on ``mesh`` (step, RNG key, optimizer counters) replicated on it, so the state
    has the same shardings before and after an update (else step 2 compiles the update again)."""
    replicated = NamedSharding(mesh, PartitionSpec())

    def place(x):
        on_mesh = isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh
        return x if on_mesh else jax.device_put(x, replicated)

    return jax.tree.map(place, tree)


# ----------------------------------------------------------------------------------------------
# Supervised warm start.
# ----------------------------------------------------------------------------------------------


# The config parts a warm start depends on (besides sft.*, minus sft.cache_dir): the task and data
# (examples and, for the embedded task, the tokenizer), the model, and the SFT optimizer's settings.
WARM_START_FIELDS = ("task", "data", "model", "train.weight_decay", "train.grad_clip", "train.logit_chunk_size")


def warm_start_inputs(config) -> dict[str, Any]:
    """The config values that determine the warm start, as plain JSON values (dotted name -> value).

    RL fields (``rl.*``, ``train.seed``, ``train.learning_rate`` ...) are not among them: every RL
    run of a sweep starts from the same warm start.
    """
    inputs = {}
    for dotted in WARM_START_FIELDS:
        node = config
        for part in dotted.split("."):
            node = node[part]
        inputs[dotted] = node
    inputs["sft"] = {k: v for k, v in config.sft.items() if k != "cache_dir"}
    inputs["sft"].setdefault("seed", 0)
    return json.loads(json.dumps(inputs, sort_keys=True, default=_json_value))


def _json_value(value):
    if hasattr(value, "to_dict"):  # nested ConfigDict
        return value.to_dict()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"config value {value!r} of type {type(value).__name__} has no JSON form")


def warm_start_key(config) -> str:
    """A short hash (12 hex digits) of `warm_start_inputs`: the warm start's directory name in
    ``config.sft.cache_dir``."""
    text = json.dumps(warm_start_inputs(config), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def warm_start_dir(config, workdir: pathlib.Path) -> pathlib.Path:
    """Where the warm start of a run lives: ``<sft.cache_dir>/<warm_start_key>``, or
    ``workdir/warm_start`` when ``config.sft.cache_dir`` is empty."""
    cache_dir = config.sft.get("cache_dir", "")
    return pathlib.Path(cache_dir) / warm_start_key(config) if cache_dir else pathlib.Path(workdir) / "warm_start"


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested JSON objects as one level of dotted names."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else key))
    return out


def check_warm_start_inputs(warm_start_path: pathlib.Path, config) -> None:
    """Refuse to reuse a warm start trained from other inputs than ``config``'s.

    A warm start records its `warm_start_inputs` (``warm_start_inputs.json``). In
    ``WORKDIR/warm_start`` nothing else ties it to the config, so rerunning in the same workdir with,
    say, another ``data.synthetic.habit_fraction`` would silently start RL from the old warm start.
    A directory without the record (written by hand, or by an older version) is trusted.

    Raises:
      ConfigError: naming the fields whose values differ.
    """
    record = pathlib.Path(warm_start_path) / "warm_start_inputs.json"
    if not record.is_file():
        return
    recorded, current = _flat(json.loads(record.read_text())), _flat(warm_start_inputs(config))
    recorded.setdefault("sft.seed", 0)  # recorded before sft.seed existed: the seed was 0
    changed = sorted(name for name in recorded.keys() | current.keys() if recorded.get(name) != current.get(name))
    if changed:
        details = ", ".join(f"{name} (was {recorded.get(name)!r}, now {current.get(name)!r})" for name in changed[:5])
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise ConfigError(
            f"the warm start in {warm_start_path} was trained with other values of {details}{more}; "
            "use a new --workdir, delete that directory to retrain it, or set config.sft.cache_dir"
        )


def _publish_dir(staging: pathlib.Path, target: pathlib.Path) -> bool:
    """Rename the finished ``staging`` directory to ``target``; if another process got there first
    (``target`` exists), discard ``staging`` and keep theirs. Returns whether ours was published."""
    try:
        os.rename(staging, target)  # atomic; fails if target is a non-empty directory
        return True
    except OSError:
        if not (target / "config.json").is_file():
            raise
        shutil.rmtree(staging, ignore_errors=True)
        return False


def warm_start(config, setup: RunSetup, workdir: pathlib.Path, *, progress: bool = True) -> pathlib.Path:
    """The warm-start checkpoint directory (`warm_start_dir`): trained once, then reused.

    Several processes may train the same shared warm start at once (``config.sft.cache_dir``): each
    writes its own staging directory and renames it into place; the first rename wins and the others
    discard theirs, so readers only ever see a complete checkpoint. The SFT loss is logged to
    ``workdir/warm_start_logs`` of the run that trains it.
    """
    out_dir = warm_start_dir(config, workdir)
    if (out_dir / "config.json").is_file():
        check_warm_start_inputs(out_dir, config)
        logger.info("warm start: reusing %s", out_dir)
        return out_dir
    data = build_sft_data(setup.sft_dataset, setup.tokenizer, max_length=config.sft.max_length,
                          where=config.sft.data or "training data")
    model = load_pretrained(setup.model_path, dtype=jnp.float32, mesh=setup.mesh, remat=config.model.remat)
    graphdef, params = nnx.split(model, nnx.Param)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, config.sft.learning_rate, max(1, config.sft.num_steps // 10), max(1, config.sft.num_steps),
        end_value=config.sft.learning_rate * 0.1,
    )
    optimizer = make_optimizer(schedule, weight_decay=config.train.weight_decay, grad_clip=config.train.grad_clip)
    state = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(0))
    state = _place_on_mesh(state, setup.mesh)
    step_fn = jax.jit(make_sft_step(graphdef, optimizer, compute_dtype=config.model.dtype,
                                    chunk_size=config.train.logit_chunk_size), donate_argnums=(0,))
    order = sft_batches(len(data), config.sft.batch_size, config.sft.num_steps, config.sft.get("seed", 0))
    writer = MetricsWriter(pathlib.Path(workdir) / "warm_start_logs", tensorboard=False)
    bar = tqdm.tqdm(order, desc="warm start (SFT)", disable=not progress)
    for i, rows in enumerate(bar):
        state, metrics = step_fn(state, *(jnp.asarray(a[rows]) for a in (data.input_ids, data.attention_mask, data.loss_mask)))
        if i % 10 == 0 or i == len(order) - 1:
            record = writer.write(i + 1, jax.device_get(metrics))
            bar.set_postfix(loss=f"{record['sft/loss']:.3f}")
    writer.close()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    save_pretrained(nnx.merge(graphdef, state.params), staging, tokenizer=setup.tokenizer,
                    copy_files_from=setup.model_path)
    (staging / "warm_start_inputs.json").write_text(json.dumps(warm_start_inputs(config), indent=2, sort_keys=True))
    if not _publish_dir(staging, out_dir):
        logger.info("warm start: %s was written by another run meanwhile; using it", out_dir)
    return out_dir


def build_warm_start(config, workdir: str | pathlib.Path, *, progress: bool = True) -> pathlib.Path:
    """Only the warm start of a run (``train.py --warm_start_only``): validates the config, builds the
    data and base model in ``workdir``, trains or finds the warm start, and returns its directory.

    A sweep calls this once before its runs start in parallel, so that they share one warm start
    (``config.sft.cache_dir``) instead of each training it.
    """
    if not config.sft.enabled:
        raise ConfigError("config.sft.enabled: is False, so there is no warm start to build")
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    setup = build_setup(config, workdir)
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2, sort_keys=True))
    return warm_start(config, setup, workdir, progress=progress)


# ----------------------------------------------------------------------------------------------
# Evaluation.
# ----------------------------------------------------------------------------------------------


def _write_atomic(path: pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (a kill leaves no half file)."""
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(text)
    staging.replace(path)


def run_eval(config, setup: RunSetup, model, split: str, out_dir: pathlib.Path, name: str,
             *, progress: bool = True) -> dict[str, float]:
    """Greedy evaluation on ``split``; writes ``out_dir/<name>.json`` and ``<name>.jsonl``."""
    summary, records = evaluate(
        model, setup.evals[split], setup.tokenizer, tool_calling_scorer(config.rewards.max_think_words),
        batch_size=config.eval.batch_size, max_new_tokens=config.sampling.max_new_tokens,
        eos_token_ids=setup.eos_ids, pad_token_id=setup.pad_id, prompt_length=setup.prompt_length,
        progress=progress, desc=f"eval {name}",
    )
    summary = {"split": split, **summary, "correct_acc": summary.get("correct"), "format_acc": summary.get("format")}
    write_report(out_dir, name, summary, records)
    return summary


# ----------------------------------------------------------------------------------------------
# RL.
# ----------------------------------------------------------------------------------------------


def _step_metrics(raw: dict[str, Any], reward_names, rollouts, timings: dict[str, float]) -> dict[str, Any]:
    metrics = {}
    for name, value in raw.items():
        if name.startswith("reward_index/"):
            name = f"reward/{reward_names[int(name.split('/')[1])]}"
        elif name.startswith("advantages/zero_std_fraction/"):
            name = f"advantages/zero_std_fraction/{reward_names[int(name.rsplit('/', 1)[1])]}"
        metrics[name] = float(value)
    metrics["truncation_rate"] = float(np.mean(rollouts.truncated))
    metrics.update({f"time/{k}": v for k, v in timings.items()})
    total = sum(timings.values())
    metrics["tokens_per_second"] = rollouts.generated_tokens / max(total, 1e-9)
    metrics["generated_tokens"] = rollouts.generated_tokens
    return metrics


def train_and_evaluate(config, workdir: str | pathlib.Path, *, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the whole job; returns the results also written to ``workdir/results.json``."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    setup = build_setup(config, workdir)
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2, sort_keys=True))

    policy_path = warm_start(config, setup, workdir, progress=progress) if config.sft.enabled else setup.model_path
    model = load_pretrained(policy_path, dtype=jnp.dtype(config.train.master_dtype), mesh=setup.mesh,
                            remat=config.model.remat)
    graphdef, params = nnx.split(model, nnx.Param)
    schedule = optax.linear_schedule(0.0, config.train.learning_rate, config.train.warmup_steps) \
        if config.train.warmup_steps else config.train.learning_rate
    optimizer = make_optimizer(schedule, weight_decay=config.train.weight_decay, grad_clip=config.train.grad_clip)
    state = TrainState(params, jax.jit(optimizer.init)(params), jnp.zeros((), jnp.int32),
                       jax.random.PRNGKey(config.train.seed))
    state = _place_on_mesh(state, setup.mesh)
    state_shardings = jax.tree.map(lambda x: x.sharding, state)
    ref_params = jax.tree.map(jnp.copy, params) if config.rl.kl_coef else None

    eval_dir = workdir / "eval"
    split = config.eval.split if config.eval.split in setup.evals else None
    checkpointer = Checkpointer(workdir / "checkpoints", keep=config.checkpoint.keep)
    sampler = EpochSampler(len(setup.train), config.train.seed)
    start = 0
    if checkpointer.latest_step() is not None:
        state, meta = checkpointer.restore(None, state)
        sampler.restore(meta["data"])
        start = int(meta["step"])
        logger.info("resumed from step %d", start)

    before = None
    if split is not None:
        saved = eval_dir / "before_rl.json"
        before = json.loads(saved.read_text()) if saved.is_file() else run_eval(
            config, setup, merge_model(graphdef, state.params, config.model.dtype), split, eval_dir,
            "before_rl", progress=progress)

    writer = MetricsWriter(workdir, resume_step=start if start else None)
    train_step = jit_train_step(make_train_step(graphdef, optimizer, step_config(config), setup.mesh),
                                state_shardings)
    ref_logp_fn = jax.jit(lambda p, ids, mask, m: completion_logprobs(
        merge_model(graphdef, p, config.model.dtype), ids, mask, m,
        chunk_size=config.train.logit_chunk_size)[0], static_argnums=(3,))
    sample_key = jax.random.fold_in(jax.random.PRNGKey(config.train.seed), 1)
    reward_names = tuple(config.rewards.names)
    bar = tqdm.tqdm(range(start, config.train.num_steps), desc=f"RL ({config.rl.algorithm})",
                    initial=start, total=config.train.num_steps, disable=not progress)
    for step in bar:
        t0 = time.perf_counter()
        prompts = setup.train.select(sampler.next_batch(config.train.prompts_per_step))
        policy = merge_model(graphdef, state.params, config.model.dtype)
        rollouts = collect_rollouts(
            policy, prompts, setup.tokenizer, setup.reward_fn, num_generations=config.rl.num_generations,
            sampling=config.sampling, eos_token_ids=setup.eos_ids, pad_token_id=setup.pad_id,
            prompt_length=setup.prompt_length, rng=jax.random.fold_in(sample_key, step),
            on_error=config.rewards.on_error, num_workers=config.rewards.num_workers,
            prompts_per_call=config.sampling.get("prompts_per_call", 0),
        )
        batch = rollouts.batch
        if ref_params is not None:
            batch = batch.replace(ref_logp=ref_logp_fn(ref_params, batch.input_ids, batch.attention_mask,
                                                       batch.old_logp.shape[1]))
        t1 = time.perf_counter()
        state, raw = train_step(state, batch)
        raw = jax.device_get(raw)
        t2 = time.perf_counter()
        timings = {"rollout": rollouts.sampling_seconds, "rewards": rollouts.reward_seconds,
                   "update": t2 - t1, "other": max(0.0, t1 - t0 - rollouts.sampling_seconds - rollouts.reward_seconds)}
        metrics = _step_metrics(raw, reward_names, rollouts, timings)
        done = step + 1
        if config.eval.every_steps and split and done % config.eval.every_steps == 0 and done < config.train.num_steps:
            summary = run_eval(config, setup, merge_model(graphdef, state.params, config.model.dtype), split,
                               eval_dir, f"step_{done}", progress=False)
            metrics.update({f"eval/{k}": v for k, v in summary.items() if isinstance(v, (int, float))})
        if done % config.train.log_every == 0 or done == config.train.num_steps:
            writer.write(done, metrics)
        bar.set_postfix({n: f"{metrics[f'reward/{n}']:.2f}" for n in reward_names}
                        | {"kept": f"{metrics['advantages/kept_fraction']:.2f}"})
        if done % config.checkpoint.every_steps == 0 or done == config.train.num_steps:
            checkpointer.save(done, state, {"step": done, "data": sampler.state()})
    writer.close()
    checkpointer.close()

    final = merge_model(graphdef, state.params, config.model.dtype)
    after = run_eval(config, setup, final, split, eval_dir, "after_rl", progress=progress) if split else None
    save_pretrained(final, workdir / "policy", tokenizer=setup.tokenizer, copy_files_from=setup.model_path)
    results = {"algorithm": config.rl.algorithm, "steps": config.train.num_steps, "split": split,
               "before_rl": before, "after_rl": after}
    _write_atomic(workdir / "results.json", json.dumps(results, indent=2, sort_keys=True))
    if progress:
        print(results_table(results))
    return results


def results_table(results: dict[str, Any]) -> str:
    """A small before/after table of the headline validation metrics."""
    rows = [("Correct Acc", "correct_acc"), ("Correctness", "correctness"), ("Format Acc", "format_acc"),
            ("Length", "length"), ("Truncation", "truncation_rate")]
    before, after = results.get("before_rl") or {}, results.get("after_rl") or {}
    lines = [f"{results['split'] or 'no eval split'} ({results['algorithm']}, {results['steps']} RL steps)",
             f"{'metric':<14}{'before RL':>12}{'after RL':>12}"]
    for label, key in rows:
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"{label:<14}{fmt(before.get(key)):>12}{fmt(after.get(key)):>12}")
    return "\n".join(lines)
