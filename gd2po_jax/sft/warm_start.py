"""The supervised warm start: SFT of the base model on the data's targets, trained once and reused.

Its directory (`warm_start_dir`) is ``WORKDIR/warm_start``, or, with ``config.sft.cache_dir``,
``CACHE_DIR/<warm_start_key>``: a hash of the config values the warm start is made of
(`warm_start_inputs`), so that every run with the same data, model and SFT settings (all RL runs of a
sweep) shares one. A warm start records those inputs (``warm_start_inputs.json``) and is refused
when a run's differ (`check_warm_start_inputs`). It is written to a staging directory unique to the
process (`run_dir.staging_name`) and renamed into place (`publish_dir`), so readers only ever see a
complete one; staging directories of killed processes are removed by the next warm start
(`run_dir.remove_stale_staging`). Parameters that are not finite are never saved.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import pathlib
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import optax
import tqdm
from flax import nnx

from gd2po_jax.config import ConfigError, RunConfig, remat_policy_name
from gd2po_jax.models import load_pretrained, save_pretrained
from gd2po_jax.runtime import distributed, run_dir
from gd2po_jax.runtime.checkpoints import check_finite
from gd2po_jax.runtime.metrics_logging import MetricsWriter
from gd2po_jax.runtime.run_dir import RunDir, publish_dir
from gd2po_jax.sft.step import batch_window, build_sft_data, make_sft_step, padding_share
from gd2po_jax.tasks.setup import RunSetup, build_setup
from gd2po_jax.training.batches import sft_batches
from gd2po_jax.training.optimizer import init_optimizer_state, make_optimizer
from gd2po_jax.training.records import TrainState

logger = logging.getLogger(__name__)

# The config parts a warm start depends on (besides sft.*, minus sft.cache_dir): the task and data
# (examples and, for the embedded task, the tokenizer), the model, and the SFT optimizer's settings.
WARM_START_FIELDS = ("task", "data", "model", "train.weight_decay", "train.grad_clip", "train.logit_chunk_size")
INPUTS_FILE = "warm_start_inputs.json"
KEY_FIELDS_IF_SET = {"data.chat_template_kwargs": [], "data.tools_column": ""}
"""Fields of WARM_START_FIELDS' sections added after warm starts were first cached, and the value that
means "not set": left out of the key when not set, so that existing caches keep their keys. (sft's
only_with_targets decides whether there is a warm start, not what it is: never in the key.)"""


def warm_start_inputs(config: RunConfig) -> dict[str, Any]:
    """The config values that determine the warm start, as plain JSON values (dotted name -> value).

    RL fields (``rl.*``, ``train.seed``, ``train.learning_rate`` ...) are not among them: every RL
    run of a sweep starts from the same warm start. ``config`` may also be the ConfigDict the
    `RunConfig` is made from: both give the same `to_dict`.
    """
    values = config.to_dict()
    inputs = {}
    for dotted in WARM_START_FIELDS:
        node: Any = values
        for part in dotted.split("."):
            node = node[part]
        inputs[dotted] = node
    for dotted, absent in KEY_FIELDS_IF_SET.items():  # fields added later: in the key only when set
        section, name = dotted.split(".")
        node = inputs[section] if section in inputs else None
        if isinstance(node, dict) and name in node and json.loads(json.dumps(node[name])) == absent:
            del node[name]
    # model.lora is how RL trains the warm-started model (LoRA or full), not what the warm start is: its
    # key, and every existing cache's, stays without it.
    inputs["model"].pop("lora", None)
    # model.attention and model.remat's policy are how the layers compute (float sums at most): the key
    # keeps remat as the boolean it was before the policies (any policy but none: true), so every
    # existing cache keeps its key, and leaves attention out.
    inputs["model"].pop("attention", None)
    if "remat" in inputs["model"]:
        inputs["model"]["remat"] = remat_policy_name(inputs["model"]["remat"]) not in ("none", None)
    # sft.length_bucket is how the batches are laid out (like the mesh, it changes float sums at most).
    not_inputs = ("cache_dir", "only_with_targets", "length_bucket")
    inputs["sft"] = {k: v for k, v in values["sft"].items() if k not in not_inputs}
    inputs["sft"].setdefault("seed", 0)  # a config.json older than sft.seed: the seed was 0
    return json.loads(json.dumps(inputs, sort_keys=True))  # tuples become lists


def warm_start_key(config: RunConfig) -> str:
    """A short hash (12 hex digits) of `warm_start_inputs`: the warm start's directory name in
    ``config.sft.cache_dir``."""
    text = json.dumps(warm_start_inputs(config), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def warm_start_dir(config: RunConfig, workdir: pathlib.Path) -> pathlib.Path:
    """Where the warm start of a run lives: ``<sft.cache_dir>/<warm_start_key>``, or
    ``workdir/warm_start`` when ``config.sft.cache_dir`` is empty."""
    cache_dir = config.sft.cache_dir
    return pathlib.Path(cache_dir) / warm_start_key(config) if cache_dir else RunDir(workdir).warm_start


def check_warm_start_inputs(warm_start_path: pathlib.Path, config: RunConfig) -> None:
    """Refuse to reuse a warm start trained from other inputs than ``config``'s.

    A warm start records its `warm_start_inputs` (``warm_start_inputs.json``). In
    ``WORKDIR/warm_start`` nothing else ties it to the config, so rerunning in the same workdir with,
    say, another ``data.synthetic.habit_fraction`` would silently start RL from the old warm start.
    A directory without the record (written by hand, or by an older version) is trusted.

    Raises:
      ConfigError: naming the fields whose values differ.
    """
    record = pathlib.Path(warm_start_path) / INPUTS_FILE
    if not record.is_file():
        return
    recorded = run_dir.read_json(record)
    recorded["sft"].setdefault("seed", 0)  # recorded before sft.seed existed: the seed was 0
    changes = run_dir.config_changes(recorded, warm_start_inputs(config))
    if changes:
        raise ConfigError(
            f"the warm start in {warm_start_path} was trained with other values of {changes}; "
            "use a new --workdir, delete that directory to retrain it, or set config.sft.cache_dir"
        )


def train_warm_start(
    config: RunConfig, setup: RunSetup, logs_dir: pathlib.Path, *, progress: bool = True
) -> tuple[Any, Any]:
    """SFT of ``setup.model_path`` on ``setup.sft_dataset``'s targets for ``config.sft.num_steps``;
    logs the loss to ``logs_dir``. Returns (graphdef, trained params)."""
    data = build_sft_data(
        setup.sft_dataset,
        setup.tokenizer,
        max_length=config.sft.max_length,
        where=config.sft.data or "training data",
        template_kwargs=config.data.template_kwargs,
        tools_column=config.data.tools_column,
        length_bucket=config.sft.length_bucket,
    )
    model = load_pretrained(
        setup.model_path, dtype=jnp.float32, mesh=setup.mesh, remat=config.model.remat, attention=config.model.attention
    )
    graphdef, params = nnx.split(model, nnx.Param)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0,
        config.sft.learning_rate,
        max(1, config.sft.num_steps // 10),
        max(1, config.sft.num_steps),
        end_value=config.sft.learning_rate * 0.1,
    )
    optimizer = make_optimizer(schedule, weight_decay=config.train.weight_decay, grad_clip=config.train.grad_clip)
    state = setup.place(
        TrainState(params, init_optimizer_state(optimizer, params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(0))
    )
    step_fn = jax.jit(
        make_sft_step(graphdef, optimizer, compute_dtype=config.model.dtype, chunk_size=config.train.logit_chunk_size),
        donate_argnums=(0,),
    )
    order = sft_batches(len(data), config.sft.batch_size, config.sft.num_steps, config.sft.seed)
    writer = MetricsWriter(logs_dir, tensorboard=False) if distributed.is_primary() else None
    bar = tqdm.tqdm(order, desc="warm start (SFT)", disable=not progress)
    for i, rows in enumerate(bar):
        # The batch's prompt window (the same on every process: it is the whole batch's), then each
        # process builds the rows of the batch its devices hold.
        first = data.prompt_length - batch_window(data, rows)
        batch = distributed.batch_rows(
            lambda local: (
                data.input_ids[rows[local], first:],
                data.attention_mask[rows[local], first:],
                data.loss_mask[rows[local]],
            ),
            len(rows),
            setup.mesh,
        )
        state, metrics = step_fn(state, *batch)
        if writer and (i % 10 == 0 or i == len(order) - 1):
            record = writer.write(i + 1, {**jax.device_get(metrics), "sft/padding": padding_share(data, rows, first)})
            bar.set_postfix(loss=f"{record['sft/loss']:.3f}")
    if writer:
        writer.close()
    return graphdef, state.params


def warm_start(config: RunConfig, setup: RunSetup, workdir: pathlib.Path, *, progress: bool = True) -> pathlib.Path:
    """The warm-start checkpoint directory (`warm_start_dir`): trained once, then reused.

    Several processes may train the same shared warm start at once (``config.sft.cache_dir``): each
    writes its own staging directory and renames it into place; the first rename wins and the others
    discard theirs, so readers only ever see a complete checkpoint. The SFT loss is logged to
    ``workdir/warm_start_logs`` of the run that trains it.
    """
    out_dir = warm_start_dir(config, workdir)
    primary = distributed.is_primary()  # several processes train it together; process 0 writes it
    if primary:
        run_dir.remove_stale_staging(out_dir.parent)  # of killed processes (a shared cache: only those)
    if distributed.primary_decides((out_dir / "config.json").is_file()):
        check_warm_start_inputs(out_dir, config)
        logger.info("warm start: reusing %s", out_dir)
        return out_dir
    graphdef, params = train_warm_start(config, setup, RunDir(workdir).warm_start_logs, progress=progress)
    check_finite(params, f"the warm start trained for {out_dir}")
    if not primary:  # take part in gathering each parameter (writes nothing), wait until it is published
        save_pretrained(nnx.merge(graphdef, params), out_dir)
        distributed.barrier("warm start: published")
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = run_dir.staging_name(out_dir)
    try:
        save_pretrained(
            nnx.merge(graphdef, params), staging, tokenizer=setup.tokenizer, copy_files_from=setup.model_path
        )
        (staging / INPUTS_FILE).write_text(json.dumps(warm_start_inputs(config), indent=2, sort_keys=True))
        if not publish_dir(staging, out_dir):
            logger.info("warm start: %s was written by another run meanwhile; using it", out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone after a rename; an exception's leftovers
    distributed.barrier("warm start: published")
    return out_dir


def build_warm_start(config: RunConfig, workdir: str | pathlib.Path, *, progress: bool = True) -> pathlib.Path:
    """Only the warm start of a run (``train.py --warm_start_only``): builds the data and base model
    in ``workdir``, trains or finds the warm start, and returns its directory.

    A sweep calls this once before its runs start in parallel, so that they share one warm start
    (``config.sft.cache_dir``) instead of each training it.
    """
    if not config.sft.enabled:
        raise ConfigError("config.sft.enabled: is False, so there is no warm start to build")
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    primary = distributed.is_primary()  # several processes: process 0 locks and writes
    with run_dir.lock_workdir(workdir, "train.py --warm_start_only") if primary else contextlib.nullcontext():
        if primary:
            run_dir.remove_stale_staging(workdir, all_stale=True)
        run_dir.check_resume_config(workdir, config)
        setup = build_setup(config, workdir)
        if setup.sft_dataset is None:
            raise ConfigError(
                "config.sft.only_with_targets: the SFT data has no row with a target, so there is no "
                "warm start to build (--config.sft.enabled=False runs RL from config.model.path)"
            )
        if primary:
            run_dir.write_config(workdir, config)
        return warm_start(config, setup, workdir, progress=progress and primary)
