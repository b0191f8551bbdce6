"""The training loop: warm start, then prompts -> rollouts -> rewards -> one jitted update per step.

``train_and_evaluate(config, workdir)`` is what ``python train.py`` runs. Everything a run needs to
resume or be reproduced is in its workdir (`gd2po_jax.runtime.run_dir`): config.json, the warm start, Orbax
checkpoints, metrics.jsonl, evaluations before and after RL, the exported policy and results.json.
Rerunning in the same workdir resumes from the latest checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pathlib
import time
from collections.abc import Callable
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import nnx

from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.config.outputs import COMPLETIONS_SHOWN
from gd2po_jax.data.prompts import EpochSampler
from gd2po_jax.evaluation.during_training import eval_metrics, eval_target, evaluate_run, logged_before_rl
from gd2po_jax.models import load_pretrained, save_pretrained
from gd2po_jax.models.logprobs import logprob_temperature, merge_model, reference_logprobs_fn
from gd2po_jax.models.lora import (
    LORA_BASE_KEY,
    base_reference,
    check_base,
    lora_spec,
    merged_decoder,
    plain_graphdef,
    save_peft_adapter,
    split_lora,
)
from gd2po_jax.rewards.base import begin_step
from gd2po_jax.rewards.scoring import check_failures, failure_modes
from gd2po_jax.rl.advantages import MagnitudeWatch, advantage_method
from gd2po_jax.rl.dynamic_sampling import RefilledRollouts, collect_counted, warn_short_step
from gd2po_jax.rl.rollout import RolloutSettings, collect_rollouts, refill_applies
from gd2po_jax.rl.rollout_log import is_logged_step, remove_later_rollouts, save_step_rollouts
from gd2po_jax.rl.train_step import (
    StepConfig,
    count_skipped_steps,
    jit_train_step,
    make_train_step,
    run_step_config,
)
from gd2po_jax.runtime import distributed, preemption, run_dir
from gd2po_jax.runtime.checkpoints import Checkpoints, CorruptCheckpointError, check_finite
from gd2po_jax.runtime.metrics_logging import MetricsWriter, completions_table, reward_sum_metrics
from gd2po_jax.runtime.run_dir import RunDir
from gd2po_jax.runtime.sharding import mesh_of
from gd2po_jax.runtime.wandb_logging import WandbLogger
from gd2po_jax.sft.warm_start import warm_start
from gd2po_jax.tasks import task_named, task_of
from gd2po_jax.tasks.setup import RunSetup, build_setup, uses_warm_start
from gd2po_jax.training.optimizer import init_optimizer_state, make_optimizer
from gd2po_jax.training.records import TrainState

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------
# RL.
# ----------------------------------------------------------------------------------------------


def host_metrics(rollouts, timings: dict[str, float], reward_names: tuple[str, ...]) -> dict[str, float]:
    """The metrics of a step that only the host knows (the update's own come from `train_step`):
    truncation, the share of rollouts each reward abstained on (``reward_abstained/<name>``) and
    failed on (``reward_failed/<name>``, scored as the minimum with ``rewards.on_error='min'``),
    the reward functions' own (`gd2po_jax.rewards.base.reward_step_metrics`: a reward model's
    ``reward_truncated/<name>``, ``time/reward_model/<name>``), wall-clock time per phase
    (``time/*``), generated tokens and their rate."""
    metrics = {"truncation_rate": float(np.mean(rollouts.truncated))}
    metrics.update(rollouts.reward_metrics)
    metrics.update({f"reward_abstained/{name}": float(share) for name, share in zip(reward_names, rollouts.abstained)})
    metrics.update({f"reward_failed/{name}": float(share) for name, share in zip(reward_names, rollouts.failed)})
    metrics.update({f"time/{k}": v for k, v in timings.items()})
    total = sum(timings.values())
    metrics["tokens_per_second"] = rollouts.generated_tokens / max(total, 1e-9)
    metrics["generated_tokens"] = rollouts.generated_tokens
    return metrics


def warn_always_abstaining(reward_names: tuple[str, ...], abstained, step: int, warned: set[str]) -> list[str]:
    """Warn (once per reward, adding it to ``warned``) about each reward that abstained on every rollout
    of ``step`` (``abstained``: the share per reward, `host_metrics`' ``reward_abstained/<name>``): its
    ``reward/<name>`` then reads 0.0 and it moves no advantage, which looks like a real score. Returns
    the rewards warned about now."""
    now = [name for name, share in zip(reward_names, abstained) if share >= 1.0 and name not in warned]
    for name in now:
        logger.warning(
            "step %d: reward %r abstained on every rollout (it returned None or NaN for all of them): "
            "reward/%s reads 0.0 and it moves no advantage; check that it can score this data "
            "(reward_abstained/%s in metrics.jsonl; not warned again)",
            step,
            name,
            name,
            name,
        )
    warned.update(now)
    return now


def load_policy(config: RunConfig, setup: RunSetup, policy_path: pathlib.Path) -> tuple[Any, Any, Any]:
    """(graphdef, params, frozen) of the policy in ``policy_path``, on the mesh. Full fine-tuning:
    every parameter in the master dtype, frozen None. LoRA (``model.lora.rank`` > 0): params are
    fresh adapters (PEFT's init from ``train.seed``, in the master dtype) and frozen the base
    weights, in ``model.lora.base_dtype`` (`gd2po_jax.models.lora.split_lora`)."""
    spec = lora_spec(config)
    master = jnp.dtype(config.train.master_dtype)
    if spec is None:
        model = load_pretrained(
            policy_path, dtype=master, mesh=setup.mesh, remat=config.model.remat, attention=config.model.attention
        )
        return *nnx.split(model, nnx.Param), None
    model = load_pretrained(
        policy_path,
        dtype=jnp.dtype(config.model.lora.base_dtype or master),
        mesh=setup.mesh,
        remat=config.model.remat,
        attention=config.model.attention,
        lora=spec,
        lora_seed=config.train.seed,
    )
    return split_lora(model)


def init_state(config: RunConfig, setup: RunSetup, policy_path: pathlib.Path) -> tuple[Any, Any, TrainState, Any]:
    """(graphdef, optimizer, state at step 0, frozen): the policy's trained parameters from
    ``policy_path`` in the master dtype (with LoRA: fresh adapters; ``frozen`` the base weights,
    else None: `load_policy`), AdamW over them (linear warm-up over ``train.warmup_steps``, then
    constant), the RL seed's key, all placed on the mesh."""
    graphdef, params, frozen = load_policy(config, setup, policy_path)
    schedule = (
        optax.linear_schedule(0.0, config.train.learning_rate, config.train.warmup_steps)
        if config.train.warmup_steps
        else config.train.learning_rate
    )
    optimizer = make_optimizer(schedule, weight_decay=config.train.weight_decay, grad_clip=config.train.grad_clip)
    state = setup.place(
        TrainState(
            params,
            init_optimizer_state(optimizer, params),
            jnp.zeros((), jnp.int32),
            jax.random.PRNGKey(config.train.seed),
        )
    )
    return graphdef, optimizer, state, frozen


def resume(
    checkpoints: Checkpoints, state: TrainState, sampler: EpochSampler, base: dict[str, Any] | None = None
) -> tuple[TrainState, int]:
    """(state, step) of the newest intact checkpoint (`Checkpoints.restore_intact`: a damaged newer
    one is named in a warning and set aside), placed like ``state``, with ``sampler`` moved to its
    data position; ``(state, 0)`` when there is none. ``base``: a LoRA run's `base_reference`.

    Raises:
      CorruptCheckpointError: every checkpoint is damaged (naming each).
      ConfigError: a LoRA checkpoint of another base (`check_base`).
    """
    # A checkpoint whose data position is missing, mistyped or out of bounds is damaged: the previous one is used.
    restored = checkpoints.restore_intact(state, check_meta=lambda meta: sampler.check_state(meta.get("data")))
    if restored is None:
        return state, 0
    step, state, meta = restored
    check_base(meta, base, checkpoints.step_dir(step))
    sampler.restore(meta["data"])
    logger.info("resumed from step %d (%s)", step, checkpoints.step_dir(step))
    return state, step


def data_files(config: RunConfig) -> dict[str, Any]:
    """`run_dir.data_fingerprint` of the training data file the config names (``{"data.train": ...}``;
    empty for generated data or a Hub id): recorded in every checkpoint, checked on resume
    (`check_data_files`)."""
    field = task_named(config.task).split_field(config, "train")
    value: Any = config
    for name in field.split("."):
        value = getattr(value, name, None)
    fingerprint = run_dir.data_fingerprint(value) if isinstance(value, str) and value else None
    return {field: fingerprint} if fingerprint else {}


def check_data_files(config: RunConfig, checkpoints: Checkpoints) -> None:
    """Refuse to resume when the training data changed since the latest checkpoint (`run_dir.check_data_unchanged`:
    ``GD2PO_ALLOW_CHANGED_DATA=1`` overrides). A latest checkpoint whose metadata cannot be read is left
    to `Checkpoints.restore_intact`."""
    latest = checkpoints.latest_step()
    if latest is None:
        return
    try:
        recorded = checkpoints.metadata(latest).get(run_dir.DATA_FILES_KEY)
    except CorruptCheckpointError:
        return
    run_dir.check_data_unchanged(recorded, data_files(config), checkpoints.step_dir(latest))


def check_num_steps(config: RunConfig, checkpoints: Checkpoints) -> None:
    """A resumed run may extend ``train.num_steps`` but not go below its latest checkpoint.

    Raises:
      ConfigError: naming train.num_steps and the checkpoint.
    """
    latest = checkpoints.latest_step()
    if latest is not None and config.train.num_steps < latest:
        raise ConfigError(
            f"config.train.num_steps: {config.train.num_steps} is below step {latest}, which the run has "
            f"reached ({checkpoints.step_dir(latest)}); a resumed run cannot go back. Use a new --workdir, "
            "or evaluate an earlier checkpoint with eval.py --checkpoint_step"
        )


def train_and_evaluate(config: RunConfig, workdir: str | pathlib.Path, *, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the whole job of ``config``; returns the results also written to
    ``workdir/results.json``.

    The workdir is locked for the whole job (`run_dir.lock_workdir`: a second process stops at
    once), and a rerun whose config differs from the run's in more than `run_dir.RESUMABLE_FIELDS`
    is refused (`run_dir.check_resume_config`). On several hosts every process calls this
    (`gd2po_jax.runtime.distributed`): process 0 holds the lock, writes the workdir and reports.

    Raises:
      ConfigError: an invalid config, or one the run in ``workdir`` was not made with.
      WorkdirBusyError: another process works in ``workdir``.
      CorruptCheckpointError: no checkpoint of the run can be restored.
      NonFiniteError: the parameters became NaN or infinite (nothing is checkpointed or exported).
      WriteFailedError: a write failed (a full disk), naming the file; what was written before is intact.
      Preempted: a signal of ``train.preemption_signals`` arrived (`gd2po_jax.runtime.preemption`):
        in the RL loop after the step in flight is checkpointed, elsewhere at once.
    """
    workdir = run_dir.make_workdir(workdir)  # read-only storage: one line
    primary = distributed.is_primary()  # several processes: process 0 locks, writes and reports
    with run_dir.lock_workdir(workdir, "train.py") if primary else contextlib.nullcontext():
        with (
            preemption.PreemptionWatch(config.train.preemption_signals, config.train.preemption_grace_s) as watch,
            WandbLogger(config, workdir, primary=primary) as wandb_log,
        ):  # finished however the run ends
            return _train_and_evaluate(config, workdir, progress=progress and primary, watch=watch, wandb_log=wandb_log)


def _train_and_evaluate(
    config: RunConfig,
    workdir: pathlib.Path,
    *,
    progress: bool,
    watch: preemption.PreemptionWatch,
    wandb_log: WandbLogger,
) -> dict[str, Any]:
    run = _open_run(config, workdir, wandb_log)
    sampler = EpochSampler(len(run.setup.train), config.train.seed)
    rl = _rl_start(config, run, sampler, progress=progress)
    initial_policy: Callable[[], Any] | None
    ref_graphdef, ref_params, initial_policy = _reference_policy(config, rl)
    before = None
    if run.split is not None:
        before = (
            run_dir.read_json(run.files.eval_report("before_rl"))
            if rl.evaluated_before
            else evaluate_run(
                config, run.setup, initial_policy(), run.split, run.files.eval_dir, "before_rl", progress=progress
            )
        )
    rl.initial_params = initial_policy = None  # freed: only the KL reference (ref_params) stays

    writer = MetricsWriter(workdir, resume_step=rl.start if rl.start else None) if run.primary else None
    if writer and rl.start == 0 and (before_metrics := logged_before_rl(config, before)):
        wandb_log.log(writer.write(0, before_metrics))  # eval.sets: step 0, as verl's val_before_train
    if run.primary:
        remove_later_rollouts(run.files, rl.start)  # as metrics.jsonl: a resumed run redoes those steps
    loop = _rl_loop_parts(config, run.setup, rl, ref_graphdef, ref_params)
    state = _rl_loop(config, run, rl, loop, sampler, writer, wandb_log, watch, progress=progress)
    return _finish(config, run, rl, state, before, progress=progress)


@dataclasses.dataclass
class OpenRun:
    """A run's workdir opened for training: its files, its setup (tokenizer, data, rewards, mesh), the
    evaluation target and its checkpoints. ``primary``: this process writes the workdir."""

    files: RunDir
    primary: bool
    setup: RunSetup
    split: str | None
    checkpoints: Checkpoints


def _open_run(config: RunConfig, workdir: pathlib.Path, wandb_log: WandbLogger) -> OpenRun:
    """Clears what killed writes left, checks the config against the run's, builds the setup and
    writes config.json (process 0)."""
    files = RunDir(workdir)
    primary = distributed.is_primary()
    if primary:
        # What killed writes left; no one else writes here now.
        for directory in (workdir, files.eval_dir, files.rollouts):
            run_dir.remove_stale_staging(directory, all_stale=True)
    run_dir.check_resume_config(workdir, config)
    wandb_log.start()  # W&B (process 0): a new run, or the workdir's run resumed
    setup = build_setup(config, workdir)
    advantage_method(config.rl.algorithm)  # an aggregator of your own: imported and checked before compute
    split = eval_target(config, setup)  # the split, or "sets" (eval.sets); checked before the warm start
    checkpoints = Checkpoints(files.checkpoints, keep=config.checkpoint.keep)
    check_num_steps(config, checkpoints)
    check_data_files(config, checkpoints)  # before the warm start or any compute: the data changed under the run
    if primary:
        run_dir.write_config(workdir, config)
    return OpenRun(files, primary, setup, split, checkpoints)


@dataclasses.dataclass
class RLStart:
    """Where RL starts: ``start`` (0, or the step of the checkpoint resumed), the state there and how
    to rebuild the policy from it (``graphdef``, ``frozen``: LoRA's base weights, else None; ``base``:
    LoRA's `base_reference`), the optimizer, the warm start's path where it was needed, the policy
    before RL where it is needed (``initial_params``), and whether the before-RL evaluation exists."""

    start: int
    graphdef: Any
    optimizer: Any
    state: TrainState
    frozen: Any
    base: dict[str, Any] | None
    policy_path: pathlib.Path | None
    initial_params: Any
    evaluated_before: bool


def _rl_start(config: RunConfig, run: OpenRun, sampler: EpochSampler, *, progress: bool) -> RLStart:
    """The state RL starts from: the latest intact checkpoint (``sampler`` moved to its data position),
    else the warm start (built here when the run needs one) or ``model.path``."""
    setup = run.setup
    start, graphdef, optimizer, state, frozen, base = 0, None, None, None, None, None
    lora = config.model.lora.enabled

    def policy_before_rl() -> pathlib.Path:
        return (
            warm_start(config, setup, run.files.path, progress=progress)
            if uses_warm_start(config, setup)
            else setup.model_path
        )

    # LoRA: the base (the warm start, or model.path without SFT) is always needed: the checkpoints
    # hold only the adapters.
    policy_path = policy_before_rl() if lora else None
    if run.checkpoints.steps():
        # The checkpoint holds the whole state; the base model only gives its structure and
        # shardings, so resuming reads the warm start only if it needs the policy before RL (LoRA:
        # the state is the adapters', and the base they apply to is loaded, checked against the
        # checkpoint's record of it).
        graphdef, optimizer, state, frozen = init_state(config, setup, policy_path or setup.model_path)
        base = base_reference(cast(pathlib.Path, policy_path), frozen) if lora else None  # LoRA: a policy_path
        state, start = resume(run.checkpoints, state, sampler, base)
    evaluated_before = distributed.primary_decides(run.files.eval_report("before_rl").is_file())  # same everywhere
    initial_params = None  # the policy before RL: the warm start (or model.path without SFT)
    if start == 0 or (not lora and (config.rl.kl_coef or (run.split is not None and not evaluated_before))):
        if policy_path is None:
            policy_path = policy_before_rl()
        if start == 0:
            graphdef, optimizer, state, frozen = init_state(config, setup, policy_path)
            base = base_reference(policy_path, frozen) if lora else None
            initial_params = state.params
        else:
            _, initial_params, _ = load_policy(config, setup, policy_path)
    assert state is not None  # resumed from a checkpoint, or initialized at start 0
    return RLStart(start, graphdef, optimizer, state, frozen, base, policy_path, initial_params, evaluated_before)


def _reference_policy(config: RunConfig, rl: RLStart) -> tuple[Any, Any, Callable[[], Any]]:
    """(graphdef, params, policy before RL): the KL reference's graph and parameters (None without KL)
    and a function building the policy before RL (for its evaluation)."""
    if config.model.lora.enabled:
        # The policy before RL and the KL reference: the base without adapters, its own arrays (the
        # update does not donate them).
        ref_graphdef = plain_graphdef(nnx.merge(rl.graphdef, rl.state.params, rl.frozen))
        ref_params = rl.frozen if config.rl.kl_coef else None
        return ref_graphdef, ref_params, lambda: merge_model(ref_graphdef, rl.frozen, config.model.dtype)
    # A copy: the update donates the state's buffers.
    initial_params = rl.initial_params
    ref_params = (
        None if not config.rl.kl_coef else jax.tree.map(jnp.copy, initial_params) if rl.start == 0 else initial_params
    )
    return rl.graphdef, ref_params, lambda: merge_model(rl.graphdef, initial_params, config.model.dtype)


@dataclasses.dataclass
class RLLoopParts:
    """What each RL step uses: the jitted update and its config, the KL reference (params and its
    log-prob function; None without KL), the update's extra arguments (LoRA: the base), the
    checkpoints' extra metadata, the rollout settings, the sampling key, and how to build the policy
    from the state's parameters (``graphdef``, LoRA's ``frozen`` base, ``dtype``: `policy`)."""

    train_step: Callable[..., Any]
    step_config: StepConfig
    ref_params: Any
    ref_logp_fn: Callable[..., Any]
    step_args: tuple[Any, ...]
    checkpoint_meta: dict[str, Any]
    rollout_settings: RolloutSettings
    sample_key: jax.Array
    graphdef: Any
    frozen: Any
    dtype: str
    abstain_warned: set[str] = dataclasses.field(default_factory=set)  # `warn_always_abstaining`'s
    magnitude_watch: MagnitudeWatch = dataclasses.field(default_factory=MagnitudeWatch)

    def policy(self, params) -> Any:
        """The policy of ``params`` (a state's), in the compute dtype."""
        return merge_model(self.graphdef, params, self.dtype, self.frozen)


def _rl_loop_parts(config: RunConfig, setup: RunSetup, rl: RLStart, ref_graphdef, ref_params) -> RLLoopParts:
    state_shardings = jax.tree.map(lambda x: x.sharding, rl.state)
    step_config = run_step_config(
        config,
        setup.train.min_tokens,
        setup.prompt_length,
        reward_names=setup.reward_names,
        reward_weights=setup.reward_weights,
    )
    train_step = jit_train_step(make_train_step(rl.graphdef, rl.optimizer, step_config, setup.mesh), state_shardings)
    ref_logp_fn = reference_logprobs_fn(
        ref_graphdef,
        config.model.dtype,
        chunk_size=config.train.logit_chunk_size,
        temperature=logprob_temperature(config),
    )
    return RLLoopParts(
        train_step=train_step,
        step_config=step_config,
        ref_params=ref_params,
        ref_logp_fn=ref_logp_fn,
        step_args=() if rl.frozen is None else (rl.frozen,),  # LoRA: the base, the step's third argument
        checkpoint_meta={run_dir.DATA_FILES_KEY: data_files(config)}
        | ({} if rl.base is None else {LORA_BASE_KEY: rl.base}),
        rollout_settings=RolloutSettings.of_run(
            config, eos_token_ids=setup.eos_ids, pad_token_id=setup.pad_id, prompt_length=setup.prompt_length
        ),
        sample_key=jax.random.fold_in(jax.random.PRNGKey(config.train.seed), 1),
        graphdef=rl.graphdef,
        frozen=rl.frozen,
        dtype=config.model.dtype,
    )


def _rl_step(
    config: RunConfig,
    setup: RunSetup,
    loop: RLLoopParts,
    state: TrainState,
    prompts,
    step: int,
    draw: Callable[[int], Any] | None = None,
) -> tuple[TrainState, dict[str, float], Any]:
    """One RL step: rollouts of ``prompts`` by the policy of ``state``, their rewards, the KL reference's
    log-probs, the update. Returns (state, metrics, rollouts). With ``rl.dynamic_sampling`` on, ``prompts``
    are the first round's and ``draw(n)`` gives the sampler's next n prompts (`collect_counted`); the
    rollouts are then a `RefilledRollouts` (its ``prompts`` those of the final batch)."""
    t0 = time.perf_counter()
    reward_names = setup.reward_names  # the family's rewards, then rewards.functions'
    begin_step(setup.reward_fn, step, config.train.num_steps)  # TRL's trainer_state.global_step
    policy = loop.policy(state.params)

    def collect(prompt_set, rng, settings=loop.rollout_settings, refill=None):
        rollouts = collect_rollouts(
            policy, prompt_set, setup.tokenizer, setup.reward_fn, settings, rng=rng, refill=refill
        )
        check_failures(
            rollouts.failed,
            reward_names,
            config.rewards.max_failed_fraction,
            step=step + 1,
            first_error=rollouts.first_failure,
            modes=failure_modes(setup.reward_fn, config.rewards.on_error),
        )
        return rollouts

    rl = config.rl
    if rl.dynamic_sampling == "off" or draw is None:
        rollouts = collect(prompts, jax.random.fold_in(loop.sample_key, step))
    else:  # rounds until train.prompts_per_step groups count (docs/dynamic_sampling.md)
        round_settings = dataclasses.replace(loop.rollout_settings, micro_batch_max_tokens=0)  # laid out at the end
        in_engine = rl.dynamic_sampling_refill == "engine" and refill_applies(
            setup.reward_fn, round_settings, len(prompts), mesh_of(policy)
        )
        rollouts = collect_counted(
            prompts,
            draw,
            lambda prompt_set, rng: collect(prompt_set, rng, round_settings),
            rng=jax.random.fold_in(loop.sample_key, step),
            step_config=loop.step_config,
            mode=rl.dynamic_sampling,
            min_kept=rl.dynamic_sampling_min_kept,
            max_rounds=rl.dynamic_sampling_max_rounds,
            prompts_per_call=config.sampling.prompts_per_call,
            mask_truncated=rl.mask_truncated_completions,
            mesh=setup.mesh,
            settings=loop.rollout_settings,
            tokenizer=setup.tokenizer,
            reward_names=reward_names,
            collect_refilled=(lambda prompt_set, rng, refill: collect(prompt_set, rng, round_settings, refill))
            if in_engine
            else None,
        )
        warn_short_step(rollouts.sampling_metrics, step + 1, rl.dynamic_sampling_max_rounds)
    batch = rollouts.batch
    if config.rl.mask_truncated_completions:  # TRL's: a completion cut at max_new_tokens adds no loss token
        batch = batch.replace(response_mask=batch.response_mask & ~jnp.asarray(rollouts.truncated)[:, None])
    if loop.ref_params is not None:
        batch = batch.replace(
            ref_logp=loop.ref_logp_fn(loop.ref_params, batch.input_ids, batch.attention_mask, batch.old_logp.shape[1])
        )
    t1 = time.perf_counter()
    state, raw = loop.train_step(state, batch, *loop.step_args)
    raw = jax.device_get(raw)
    t2 = time.perf_counter()
    timings = {
        "rollout": rollouts.sampling_seconds,
        "rewards": rollouts.reward_seconds,
        "update": t2 - t1,
        "other": max(0.0, t1 - t0 - rollouts.sampling_seconds - rollouts.reward_seconds),
    }
    metrics = {name: float(value) for name, value in raw.items()} | host_metrics(rollouts, timings, reward_names)
    warn_always_abstaining(reward_names, rollouts.abstained, step + 1, loop.abstain_warned)
    metrics |= loop.magnitude_watch.check(step + 1, metrics)  # the GDPO guidance's >10x check, warned once
    on_device = rollouts.batch.valid  # [P]; a multi-host step's is not all on this host: its batches are full
    addressable = getattr(on_device, "is_fully_addressable", True)
    valid = np.asarray(on_device) if addressable else np.ones(on_device.shape, bool)
    metrics |= reward_sum_metrics(rollouts.rewards, valid, setup.reward_weights)  # the weighted total
    if isinstance(rollouts, RefilledRollouts):
        metrics |= rollouts.sampling_metrics
    return state, metrics, rollouts


def _rl_loop(
    config: RunConfig,
    run: OpenRun,
    rl: RLStart,
    loop: RLLoopParts,
    sampler: EpochSampler,
    writer: MetricsWriter | None,
    wandb_log: WandbLogger,
    watch: preemption.PreemptionWatch,
    *,
    progress: bool,
) -> TrainState:
    """Steps ``rl.start`` .. ``train.num_steps``: each logged, evaluated and checkpointed on its
    schedule; a preemption signal stops the run after the step in flight, checkpointed. Returns the
    final state (the writer and checkpoints closed)."""
    setup, state = run.setup, rl.state
    bar = tqdm.tqdm(
        range(rl.start, config.train.num_steps),
        desc=f"RL ({config.rl.algorithm})",
        initial=rl.start,
        total=config.train.num_steps,
        disable=not progress,
    )
    skipped_in_a_row = 0  # RL steps that skipped an update for a non-finite gradient
    watch.defer(True)  # a preemption signal now stops the run after the step in flight, checkpointed
    for step in bar:
        prompts = setup.train.select(sampler.next_batch(config.train.prompts_per_step))
        first = step == rl.start  # compiles the sampler and the update (or loads them from the cache)
        if first and progress:
            bar.write(f"RL step {step + 1}: compiling the sampler and the update (first step only) ...")
        started = time.perf_counter()
        state, metrics, rollouts = _rl_step(
            config, setup, loop, state, prompts, step, draw=lambda n: setup.train.select(sampler.next_batch(n))
        )
        if isinstance(rollouts, RefilledRollouts) and rollouts.prompts is not None:  # the final batch's prompts
            prompts = rollouts.prompts
        done = step + 1
        if first:
            metrics["time/first_step"] = time.perf_counter() - started
            if progress:
                bar.write(f"RL step {done}: {metrics['time/first_step']:.1f} s, compilation included")
        if progress and (first or is_logged_step(done, config.logging.completions_every, config.train.num_steps)):
            first_prompt = rollouts.rewards[0][:COMPLETIONS_SHOWN]  # [<= 3, K]: the first prompt's rollouts
            shown = completions_table(done, setup.reward_names, first_prompt, rollouts.responses[: len(first_prompt)])
            bar.write(shown)  # TRL's log_completions (config.logging.completions_every)
            if writer:
                writer.write_text(done, "completions", shown)
        _log_step(config, run, loop, state, done, prompts, rollouts, metrics, writer, wandb_log)
        skipped_in_a_row = count_skipped_steps(
            skipped_in_a_row, metrics["update/skipped_updates"], done, config.train.max_consecutive_skipped_steps
        )
        bar.set_postfix(
            {n: f"{metrics[f'reward/{n}']:.2f}" for n in setup.reward_names}
            | {"kept": f"{metrics['advantages/kept_fraction']:.2f}"}
        )
        stop = watch.stop_after_step()  # several processes: any one signalled stops all at this step
        if done % config.checkpoint.every_steps == 0 or done == config.train.num_steps or stop:
            run.checkpoints.save(done, state, {"step": done, "data": sampler.state(), **loop.checkpoint_meta})
        if stop:
            if writer:
                writer.close()  # metrics.jsonl and TensorBoard flushed
            run.checkpoints.close()
            raise watch.stopped(done, run.checkpoints.step_dir(done))
    watch.defer(False)  # the evaluation and the export stop at once (the rerun redoes them)
    if writer:
        writer.close()
    run.checkpoints.close()
    return state


def _log_step(
    config: RunConfig,
    run: OpenRun,
    loop: RLLoopParts,
    state: TrainState,
    done: int,
    prompts,
    rollouts,
    metrics: dict[str, float],
    writer: MetricsWriter | None,
    wandb_log: WandbLogger,
) -> None:
    """After step ``done``: its rollouts saved, the evaluation (into ``metrics``) and the metrics
    written, each on its schedule; a skipped update warned about."""
    setup = run.setup
    if is_logged_step(done, config.logging.rollouts_every, config.train.num_steps):  # all processes (a gather)
        save_step_rollouts(run.files, done, prompts, rollouts, setup.tokenizer, loop.step_config, setup.reward_names)
    if config.eval.every_steps and run.split and done % config.eval.every_steps == 0 and done < config.train.num_steps:
        summary = evaluate_run(
            config,
            setup,
            loop.policy(state.params),
            run.split,
            run.files.eval_dir,
            f"step_{done}",
            progress=False,
        )
        metrics.update(eval_metrics(summary))
    skipped = metrics["update/skipped_updates"]
    if writer and (done % config.train.log_every == 0 or done == config.train.num_steps or skipped):
        wandb_log.log(writer.write(done, metrics))
    if skipped:
        logger.warning("step %d: %d optimizer update(s) skipped for a non-finite gradient", done, skipped)


def _finish(
    config: RunConfig, run: OpenRun, rl: RLStart, state: TrainState, before: dict[str, Any] | None, *, progress: bool
) -> dict[str, Any]:
    """The evaluation after RL, the export of ``policy/`` (and LoRA's adapters), results.json."""
    setup, files, lora = run.setup, run.files, config.model.lora.enabled
    check_finite(state.params, f"the policy after RL step {config.train.num_steps}")  # not exported
    final = merge_model(rl.graphdef, state.params, config.model.dtype, rl.frozen)
    after = (
        evaluate_run(config, setup, final, run.split, files.eval_dir, "after_rl", progress=progress)
        if run.split
        else None
    )
    staging = run_dir.staging_name(files.policy)  # policy/ appears whole (eval.py may read it)
    # The master weights stored in config.export.dtype (default model.dtype: the policy as it computes,
    # `final`; float32 keeps a bf16-compute run's master precision). Several processes: each parameter
    # is gathered in turn and process 0 writes it. LoRA: the adapters merged into the base.
    export_dtype = jnp.dtype(config.export.resolved_dtype(config.model.dtype))
    save_pretrained(
        merged_decoder(merge_model(rl.graphdef, state.params, export_dtype, rl.frozen)),
        staging,
        dtype=export_dtype,
        tokenizer=setup.tokenizer,
        copy_files_from=setup.model_path,
    )
    if lora:  # and the adapters alone, in PEFT's format, on the run's base directory
        assert rl.base is not None
        adapter_staging = run_dir.staging_name(files.policy_adapter)
        save_peft_adapter(
            nnx.merge(rl.graphdef, state.params, rl.frozen),
            adapter_staging,
            rl.base["path"],
            dropout=config.model.lora.dropout,
        )
    results = {
        "algorithm": config.rl.algorithm,
        "steps": config.train.num_steps,
        "split": run.split,
        "before_rl": before,
        "after_rl": after,
    }
    if run.primary:
        run_dir.replace_dir(staging, files.policy)
        if lora:
            run_dir.replace_dir(adapter_staging, files.policy_adapter)
        run_dir.write_json(files.results, results)
    distributed.barrier("train.py: policy exported")  # the run is complete when every process returns
    if progress:
        print(task_of(config).results_table(config, results))
    return results
