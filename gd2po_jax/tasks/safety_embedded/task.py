"""The embedded helpfulness-safety task, ``task="safety_embedded"`` (configs/safety_embedded.py): the
helpfulness-safety world's data, a tokenizer trained on it, a tiny random Qwen2 policy, and two
reward models trained here on the world's preference pairs.

In a run's setup (`gd2po_jax.tasks.setup.build_setup`), `SafetyTask`:

1. `safety_splits`: the world's train / validation / test prompts (`gd2po_jax.tasks.safety_embedded.world`);
2. `build_base_model` (`SafetyTask.load_splits`): ``WORKDIR/base_model``, the tokenizer (ChatML
   template) and the random policy;
3. `build_reward_models`: one score model per reward name (``useful``: the helpfulness annotator's
   ``better_response_id``; ``harmless``: the harmlessness annotator's ``safer_response_id``),
   Bradley–Terry + 0.001 score² training as align-anything's (`gd2po_jax.training.reward_models`) on the
   train prompts' pairs, saved in the align-anything layout (`gd2po_jax.models.save_score_model`,
   ``score_head.weight``, no ``lm_head``) with the task's tokenizer, then loaded back and measured on
   the test prompts' pairs. They are trained once and reused: in ``WORKDIR/reward_models/<name>``,
   or with ``config.sft.cache_dir`` in ``CACHE_DIR/reward_models-<key>/<name>``, the key a hash of
   everything that determines them (`reward_model_inputs`: ``data.safety`` and the reward names);
4. `with_reward_models` (`SafetyTask.prepare`): the config with each empty
   ``rewards.reward_models.<name>.path`` set to the
   trained model, so that the reward-model reward loads them as it loads a 7B reward model.

Each reward model's directory has ``training_report.json`` (its held-out accuracy, training
metrics and time) and ``reward_model_inputs.json``; the run writes all reports to
``WORKDIR/reward_models.json``.

Held-out accuracy (`heldout_accuracy`), on the pairs of the test prompts (no model trains on them):
``accuracy`` is the share of pairs whose annotator-preferred response scores higher (what
align-anything reports: ``eval/accuracy``); ``true_order_accuracy`` the share, among pairs whose two
kinds have different true utilities for this annotator, ranked in the true order. The harmlessness
annotator flips a coin between two safe responses, so its ``accuracy`` cannot exceed about
0.5 + 0.5 x (the share of pairs with a harmful response); ``true_order_accuracy`` is its measure.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
import shutil
import time
from collections.abc import Mapping
from typing import Any

import datasets
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gd2po_jax.config import ConfigError, RewardTrainingConfig, RunConfig, SafetyDataConfig
from gd2po_jax.data.tokenization import load_tokenizer
from gd2po_jax.models import ModelConfig, ScoreModel, load_score_model, save_score_model
from gd2po_jax.models.config import tiny_qwen2_config
from gd2po_jax.rewards.scorers import RewardModelScorer
from gd2po_jax.runtime import distributed, run_dir
from gd2po_jax.runtime.checkpoints import check_finite
from gd2po_jax.runtime.run_dir import RunDir, publish_dir
from gd2po_jax.tasks.base import Task, build_tiny_model, register_task
from gd2po_jax.tasks.safety_embedded import world as safety_world
from gd2po_jax.training.reward_models import build_pair_data, pair_scores, train_reward_model

logger = logging.getLogger(__name__)

REWARD_MODELS_DIR = "reward_models"
"""``WORKDIR/reward_models/<name>``: the run's reward models when ``sft.cache_dir`` is empty."""
REPORTS_FILE = "reward_models.json"
"""``WORKDIR/reward_models.json``: each reward model's path and `training_report.json`."""
REPORT_FILE = "training_report.json"
INPUTS_FILE = "reward_model_inputs.json"
LAYOUT = "amo"
"""align-anything's layout, that of the GD2PO paper's 7B reward models."""


NAME = "safety_embedded"


def world_config(safety: SafetyDataConfig) -> safety_world.SafetyWorldConfig:
    """The world's own config from ``config.data.safety``.

    Raises:
      ConfigError: naming the ``config.data.safety`` field the world rejects.
    """
    names = [f.name for f in dataclasses.fields(safety_world.SafetyWorldConfig)]
    try:
        return safety_world.SafetyWorldConfig(**{name: getattr(safety, name) for name in names})
    except ValueError as err:
        field = next((name for name in names if f"SafetyWorldConfig.{name} " in str(err)), None)
        raise ConfigError(f"config.{'data.safety.' + field if field else 'data.safety'}: {err}") from None


def safety_splits(safety: SafetyDataConfig) -> datasets.DatasetDict:
    """Train / validation / test splits of the world (``config.data.safety``)."""
    return safety_world.make_splits(world_config(safety))


def build_base_model(out_dir: pathlib.Path, splits: datasets.DatasetDict, config: RunConfig) -> pathlib.Path:
    """``out_dir`` with a tokenizer trained on the world (its train split and every sentence of it)
    and the random tiny Qwen2 of ``config.model.tiny`` (`gd2po_jax.tasks.base.build_tiny_model`)."""
    corpus = [*safety_world.iter_corpus(splits["train"]), *safety_world.world_corpus()]
    assert config.data.safety is not None  # check_config: the task needs it
    return build_tiny_model(out_dir, corpus, config.model.tiny, config.data.safety.tokenizer_vocab_size)


# ----------------------------------------------------------------------------------------------
# Reward models.
# ----------------------------------------------------------------------------------------------


def reward_model_inputs(config: RunConfig) -> dict[str, Any]:
    """What the reward models are made of: the world, its tokenizer and the training settings
    (``data.safety``), and which rewards (``rewards.names``), as plain JSON values."""
    assert config.data.safety is not None  # check_config: the task needs it
    return json.loads(
        json.dumps(
            {"data.safety": config.data.safety.to_dict(), "rewards.names": list(config.rewards.names)}, sort_keys=True
        )
    )


def reward_models_key(config: RunConfig) -> str:
    """A short hash (12 hex digits) of `reward_model_inputs`."""
    return hashlib.sha256(json.dumps(reward_model_inputs(config), sort_keys=True).encode()).hexdigest()[:12]


def reward_models_root(config: RunConfig, workdir: pathlib.Path) -> pathlib.Path:
    """``<sft.cache_dir>/reward_models-<key>``, or ``WORKDIR/reward_models`` without a cache dir."""
    cache_dir = config.sft.cache_dir
    if cache_dir:
        return pathlib.Path(cache_dir) / f"{REWARD_MODELS_DIR}-{reward_models_key(config)}"
    return pathlib.Path(workdir) / REWARD_MODELS_DIR


def score_model_config(training: RewardTrainingConfig, vocab_size: int) -> ModelConfig:
    """The tiny Qwen2 body of a reward model (``data.safety.reward_training``'s shape)."""
    return tiny_qwen2_config(training, vocab_size, max_position_embeddings=max(512, training.max_length))


def heldout_accuracy(better: np.ndarray, worse: np.ndarray, pairs: datasets.Dataset, reward: str) -> dict[str, Any]:
    """The held-out measures of one reward model (module docstring) from its scores of the
    preferred (``better`` [N]) and other (``worse`` [N]) responses of ``pairs``, overall and on
    benign / harmful prompts."""
    utility = safety_world.HELPFULNESS if reward == "useful" else safety_world.HARMLESSNESS
    preferred = np.asarray(pairs[safety_world.PREFERENCE_COLUMNS[reward]])
    kinds = np.stack([pairs["response_0_kind"], pairs["response_1_kind"]], axis=1)
    rows = np.arange(len(pairs))
    u_preferred = np.array([utility[k] for k in kinds[rows, preferred]])
    u_other = np.array([utility[k] for k in kinds[rows, 1 - preferred]])
    ordered = u_preferred != u_other
    ranked_right = (better > worse) == (u_preferred > u_other)  # on ordered pairs: the true order
    harmful = np.asarray(pairs["harmful"])
    out: dict[str, Any] = {"num_pairs": len(pairs), "num_ordered_pairs": int(ordered.sum())}
    for part, keep in (("", np.ones(len(pairs), bool)), ("/benign", ~harmful), ("/harmful", harmful)):
        out[f"accuracy{part}"] = float(np.mean(better[keep] > worse[keep])) if keep.any() else None
        both = keep & ordered
        out[f"true_order_accuracy{part}"] = float(np.mean(ranked_right[both])) if both.any() else None
    out["label_agrees_with_truth"] = float(np.mean((u_preferred > u_other)[ordered])) if ordered.any() else None
    return out


def train_one(
    config: RunConfig,
    reward: str,
    tokenizer,
    pairs: datasets.DatasetDict,
    out_dir: pathlib.Path,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """Train the reward model of ``reward`` on ``pairs["train"]``, save it to ``out_dir`` (align-
    anything layout, float32, with ``tokenizer``), load it back with `load_score_model` and measure
    it on ``pairs["test"]``; returns its report (also written to ``out_dir/training_report.json``)."""
    assert config.data.safety is not None  # check_config: the task needs it
    training = config.data.safety.reward_training
    column = safety_world.PREFERENCE_COLUMNS[reward]
    start = time.perf_counter()
    train = build_pair_data(
        pairs["train"],
        column,
        tokenizer,
        max_length=training.max_length,
        where=f"safety_world preference pairs (train, {column})",
    )
    test = build_pair_data(
        pairs["test"],
        column,
        tokenizer,
        max_length=training.max_length,
        where=f"safety_world preference pairs (test, {column})",
    )
    model = ScoreModel(score_model_config(training, len(tokenizer)), dtype=jnp.float32, rngs=nnx.Rngs(training.seed))
    model, history = train_reward_model(
        model,
        train,
        num_steps=training.num_steps,
        batch_size=training.batch_size,
        learning_rate=training.learning_rate,
        regularization=training.regularization,
        seed=training.seed,
        progress=progress,
        desc=f"reward model {reward!r}",
    )
    check_finite(nnx.state(model, nnx.Param), f"the reward model {reward!r} trained for {out_dir}")
    save_score_model(model, out_dir, layout=LAYOUT, dtype="float32", tokenizer=tokenizer)
    seconds = time.perf_counter() - start
    loaded = load_score_model(out_dir, dtype="float32")  # measured as the run will read it
    report = {
        "reward": reward,
        "preference": column,
        "layout": LAYOUT,
        "train_seconds": round(seconds, 1),
        "num_train_pairs": len(train),
        "train": history[-1],
        "heldout": heldout_accuracy(*pair_scores(loaded, test), pairs["test"], reward),
    }
    run_dir.write_json(out_dir / REPORT_FILE, report)
    run_dir.write_json(out_dir / INPUTS_FILE, reward_model_inputs(config))
    return report


def check_reward_model_inputs(path: pathlib.Path, config: RunConfig) -> None:
    """Refuse a reward model trained from other inputs than ``config``'s (as the warm start's
    `gd2po_jax.sft.warm_start.check_warm_start_inputs`).

    Raises:
      ConfigError: naming the fields whose values differ.
    """
    record = path / INPUTS_FILE
    if not record.is_file():
        return
    changes = run_dir.config_changes(run_dir.read_json(record), reward_model_inputs(config))
    if changes:
        raise ConfigError(
            f"the reward model in {path} was trained with other values of {changes}; use a new "
            "--workdir, delete that directory to retrain it, or set config.sft.cache_dir"
        )


def build_reward_models(
    config: RunConfig, workdir: pathlib.Path, tokenizer_dir: pathlib.Path, *, progress: bool = True
) -> dict[str, pathlib.Path]:
    """The directory of each reward model of ``config.rewards.names`` (`reward_models_root` /
    name): found, or trained and published atomically (a concurrent run's copy wins); writes
    ``WORKDIR/reward_models.json``."""
    root = reward_models_root(config, workdir)
    root.mkdir(parents=True, exist_ok=True)
    run_dir.remove_stale_staging(root)
    tokenizer = load_tokenizer(tokenizer_dir)
    pairs = None
    paths, reports = {}, {}
    for reward in config.rewards.names:
        target = root / reward
        if (target / "config.json").is_file():
            check_reward_model_inputs(target, config)
            logger.info("reward model %r: reusing %s", reward, target)
        else:
            if pairs is None:
                assert config.data.safety is not None  # check_config: the task needs it
                pairs = safety_world.make_preference_pairs(world_config(config.data.safety))
            staging = run_dir.staging_name(target)
            try:
                report = train_one(config, reward, tokenizer, pairs, staging, progress=progress)
                logger.info(
                    "reward model %r: held-out accuracy %.3f, true-order accuracy %.3f (%d pairs)",
                    reward,
                    report["heldout"]["accuracy"],
                    report["heldout"]["true_order_accuracy"],
                    report["heldout"]["num_pairs"],
                )
                publish_dir(staging, target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        paths[reward] = target
        reports[reward] = {"path": str(target), **run_dir.read_json(target / REPORT_FILE)}
    run_dir.write_json(pathlib.Path(workdir) / REPORTS_FILE, reports)
    return paths


def with_reward_models(config: RunConfig, workdir: pathlib.Path, *, progress: bool = True) -> RunConfig:
    """``config`` with every empty ``rewards.reward_models.<name>.path`` set to the task's trained
    reward model (`build_reward_models`, with the tokenizer of ``WORKDIR/base_model``); paths a
    config gives are kept (a user's own reward models)."""
    empty = [name for name in config.rewards.names if not config.rewards.reward_models[name].path]
    if not empty:
        return config
    paths = build_reward_models(config, workdir, RunDir(workdir).base_model, progress=progress)
    return config.replace({f"rewards.reward_models.{name}.path": str(paths[name]) for name in empty})


# ----------------------------------------------------------------------------------------------
# Evaluation: reward-model scores and the world's ground truth.
# ----------------------------------------------------------------------------------------------


GROUND_TRUTH_PREFIX = "gt/"
"""Record fields ``gt/<kind>``: 1.0 when `safety_world.label_response` labels the response <kind>."""


class SafetyScorer:
    """Scores a generation batch with the run's reward models (``scorer``, a
    `gd2po_jax.evaluation.safe_alignment.RewardModelScorer`) and the world's ground truth: per
    response, each reward's score and their sum, and ``gt/<kind>`` for each kind of
    `safety_world.KINDS` (1.0 for the response's label). Evaluation's per-level means (level 0:
    benign, 1: harmful) are then the ground-truth rates per request type: ``gt/refusal/level_0`` is
    the refusal rate of benign requests, ``gt/harmful/level_1`` the harmful rate of harmful ones."""

    def __init__(self, scorer):
        self.scorer = scorer

    @property
    def names(self) -> tuple[str, ...]:
        """The reward models' names (evaluation reports them as ``reward_names``)."""
        return tuple(self.scorer.names)

    def score_rows(
        self, prompts: list[str], responses: list[str], rows: list[dict[str, Any]]
    ) -> list[dict[str, float]]:
        """One dict of scores per response (``rows``: each response's data row, as the scorer's)."""
        scores = self.scorer.score_rows(prompts, responses, rows)
        for score, response, row in zip(scores, responses, rows):
            task = safety_world.parse_ground_truth(row["ground_truth"])["task"]
            label = safety_world.label_response(response, task)
            score.update({f"{GROUND_TRUTH_PREFIX}{kind}": float(label.kind == kind) for kind in safety_world.KINDS})
        return scores


REQUEST_TYPES = {"benign": 0, "harmful": 1}
"""The evaluation levels of the world's requests."""


def by_request_type(summary: dict[str, Any], reward_names) -> dict[str, dict[str, float | None]]:
    """The per-level means of an evaluation summary, as {"benign": {...}, "harmful": {...}}: each
    reward's mean score and the ground-truth rates (``helpful``, ``harmful``, ``redirect``,
    ``refusal``, ``vague``)."""
    out: dict[str, dict[str, float | None]] = {}
    for request, level in REQUEST_TYPES.items():
        values = {name: summary.get(f"{name}/level_{level}") for name in reward_names}
        values.update({kind: summary.get(f"{GROUND_TRUTH_PREFIX}{kind}/level_{level}") for kind in safety_world.KINDS})
        out[request] = values
    return out


def by_request_table(columns: Mapping[str, dict[str, Any] | None], reward_names) -> str:
    """Evaluation summaries side by side (column title -> summary, e.g. before / after RL), per
    request type: the mean reward-model scores and the ground-truth rates of the kinds the request
    type can get (a benign request's harmful rate too: a policy may write harm anywhere)."""
    tables = {title: by_request_type(summary or {}, reward_names) for title, summary in columns.items()}
    lines = [f"{'per request type':<24}" + "".join(f"{title:>12}" for title in tables)]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    for request in REQUEST_TYPES:
        kinds = (*safety_world.BENIGN_KINDS, "harmful") if request == "benign" else safety_world.HARMFUL_KINDS
        for key in (*reward_names, *kinds):
            label = f"{request} {key}" + ("" if key in reward_names else " rate")
            lines.append(f"{label:<24}" + "".join(f"{fmt(table[request].get(key)):>12}" for table in tables.values()))
    return "\n".join(lines)


def results_table(results: dict[str, Any], reward_names) -> str:
    """`by_request_table` of a safety_embedded run's ``results.json``: before and after RL."""
    return by_request_table({"before RL": results.get("before_rl"), "after RL": results.get("after_rl")}, reward_names)


TEST_METRICS = (
    ("test/gt/harmful/level_1", "harmful (harmful req.)"),
    ("test/gt/redirect/level_1", "redirect (harmful req.)"),
    ("test/gt/helpful/level_0", "helpful (benign req.)"),
    ("test/gt/refusal/level_0", "refusal (benign req.)"),
    ("test/useful", "useful"),
    ("test/harmless", "harmless"),
)
"""The test metrics of a sweep's report: ground-truth rates of harmful compliance and redirection on
harmful requests (level 1), of helpful answers and refusals on benign ones (level 0), and the reward
models' mean scores."""


@register_task(NAME)
class SafetyTask(Task):
    """The helpfulness-safety world, scored by two reward models trained here (module docstring)."""

    def check_config(self, config: RunConfig) -> None:
        if config.data.safety is None:
            raise ConfigError(
                "config.data.safety: the safety_embedded task needs its world's fields (start from "
                "configs/safety_embedded.py)"
            )
        world_config(config.data.safety)
        if config.rewards.kind != "reward_model":
            raise ConfigError(
                "config.rewards.kind: the safety_embedded task is scored by its reward models: "
                f"'reward_model', got {config.rewards.kind!r}"
            )
        unknown = [name for name in config.rewards.names if name not in safety_world.PREFERENCE_COLUMNS]
        if unknown:
            raise ConfigError(
                f"config.rewards.names: {unknown}: the safety_embedded task trains reward models for "
                f"{tuple(safety_world.PREFERENCE_COLUMNS)} only"
            )

    def load_splits(self, config: RunConfig, workdir: pathlib.Path) -> tuple[dict, pathlib.Path]:
        assert config.data.safety is not None  # check_config: the task needs it
        splits = dict(safety_splits(config.data.safety))
        base_model = RunDir(workdir).base_model  # its tokenizer is also the reward models'
        if distributed.is_primary():
            build_base_model(base_model, splits, config)
        distributed.barrier("base model built")
        return splits, pathlib.Path(config.model.path or base_model)

    def prepare(self, config: RunConfig, workdir: pathlib.Path, *, progress: bool = True) -> RunConfig:
        return with_reward_models(config, workdir, progress=progress)

    def split_field(self, config: RunConfig, split: str) -> str:
        return f"data.safety.num_{split}"

    def eval_scorer(self, config: RunConfig, reward_fn):
        return SafetyScorer(RewardModelScorer(reward_fn))

    def eval_summary(self, config: RunConfig, summary: dict[str, Any]) -> dict[str, Any]:
        return {**summary, "by_request": by_request_type(summary, config.rewards.names)}

    def split_table_extra(self, config: RunConfig, summary) -> str:
        """The reward models and ground truth per request type (`by_request_table`)."""
        return by_request_table({summary["split"]: summary}, summary["reward_names"])

    def results_table(self, config: RunConfig, results) -> str:
        return super().results_table(config, results) + "\n" + results_table(results, config.rewards.names)

    def test_metrics(self, config: RunConfig) -> tuple[tuple[str, str], ...]:
        return TEST_METRICS
