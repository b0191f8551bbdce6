"""What a run is made of, resolved from its config: data, tokenizer, reward function, prompts, mesh.

`build_setup` is the first thing the trainer, the warm start and evaluation do with a config; it
validates the config before anything is computed or written (except the embedded default's base
model, built in ``WORKDIR/base_model``).
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from gd2po_jax import distributed, embedded, safety_embedded
from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.data.loaders import DataFormatError, detect_kind, load_data
from gd2po_jax.models.pretrained import check_model_dir
from gd2po_jax.prompts import PromptSet, build_prompt_set
from gd2po_jax.rewards.base import build_reward_function, column_problems
from gd2po_jax.run_dir import RunDir
from gd2po_jax.sampling import bucket_length
from gd2po_jax.sharding import make_mesh
from gd2po_jax.tokenization import eos_token_ids, load_tokenizer, pad_token_id

logger = logging.getLogger(__name__)

PROMPT_ONLY_REWARD_KINDS = ("reward_model",)
"""Reward kinds that score without a ground truth: their verl parquet files may be prompt-only (no
``reward_model.ground_truth``, as the safety runs' Alpaca files)."""


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

    def place(self, tree: Any) -> Any:
        """``tree`` with the leaves not yet on the mesh (step, RNG key, optimizer counters) replicated
        on it, so that a state has the same shardings before and after an update (else step 2
        compiles the update again)."""
        replicated = NamedSharding(self.mesh, PartitionSpec())

        def place(x):
            on_mesh = isinstance(x.sharding, NamedSharding) and x.sharding.mesh == self.mesh
            return x if on_mesh else jax.device_put(x, replicated)

        return jax.tree.map(place, tree)


def _load_split(path: str, config, reward_fn=None) -> Any:
    """The dataset of one data file; with ``reward_fn``, only rows it can score (`_scorable_rows`).
    A verl parquet file may be prompt-only when the reward needs no ground truth
    (`PROMPT_ONLY_REWARD_KINDS`)."""
    options = {}
    if config.rewards.kind in PROMPT_ONLY_REWARD_KINDS and (
            config.data.kind == "verl" or config.data.kind == "auto" and detect_kind(path) == "verl"):
        options["require_ground_truth"] = False
    result = load_data(path, kind=config.data.kind, on_error=config.data.on_error, **options)
    if result.num_skipped:
        logger.warning("%s: skipped %d malformed rows (config.data.on_error='skip')", path, result.num_skipped)
    return result.dataset if reward_fn is None else _scorable_rows(result.dataset, path, reward_fn, config)


def _scorable_rows(dataset, path: str, reward_fn, config) -> Any:
    """``dataset`` checked against the reward function when it is loaded (`column_problems`: a ground
    truth it cannot parse, a missing one), not when a bad row is first sampled: such rows raise
    `DataFormatError` naming the file, the row and the column, or with ``data.on_error='skip'`` are
    left out (all of them left out: an error too)."""
    columns = {name: dataset[name] for name in dataset.column_names}
    problems = column_problems(reward_fn, columns)
    if not problems:
        return dataset
    rows = dataset["row"]
    errors = [DataFormatError(path, rows[i], column, problem) for i, column, problem in problems]
    bad = sorted({i for i, _, _ in problems})
    if len(bad) == len(dataset) and config.data.on_error == "skip":
        raise DataFormatError(path, None, None, f"no usable rows: the reward {config.rewards.kind!r} cannot "
                              f"score any of the {len(bad)} rows; first: {errors[0]}")
    if config.data.on_error == "raise":
        first = errors[0]
        others = f" ({len(bad) - 1} more rows like it)" if len(bad) > 1 else ""
        raise DataFormatError(path, first.row, first.field, f"{first.problem}{others}; the reward "
                              f"{config.rewards.kind!r} cannot score it (fix the data, or set "
                              "config.data.on_error='skip' to leave such rows out)")
    logger.warning("%s: skipped %d rows the reward cannot score (config.data.on_error='skip'); first: %s",
                   path, len(bad), errors[0])
    keep = sorted(set(range(len(dataset))) - set(bad))
    return dataset.select(keep)


def _model_dir(path: str, field: str) -> pathlib.Path:
    """``path`` once it is an existing local directory; else a `ConfigError` naming ``config.<field>``."""
    try:
        return check_model_dir(path, f"config.{field}")
    except FileNotFoundError as err:
        raise ConfigError(str(err)) from None


def load_splits(config, workdir: pathlib.Path, reward_fn=None) -> tuple[dict[str, Any], pathlib.Path]:
    """The datasets by split name, and the model directory (built for the embedded default). With
    ``reward_fn``, the files task's rows are checked against it when they are loaded."""
    if config.model.path:
        _model_dir(config.model.path, "model.path")
    if config.model.tokenizer_path:
        _model_dir(config.model.tokenizer_path, "model.tokenizer_path")
    if config.task == "synthetic_tools":
        splits = dict(embedded.synthetic_splits(config.data.synthetic))
        model_path = config.model.path
        if not model_path:  # several processes: process 0 builds it, the others read it
            model_path = RunDir(workdir).base_model
            if distributed.is_primary():
                embedded.build_base_model(model_path, splits, config.model.tiny,
                                          config.data.synthetic.tokenizer_vocab_size)
            distributed.barrier("base model built")
    elif config.task == "safety_embedded":  # its tokenizer is also the reward models' (built in base_model)
        splits = dict(safety_embedded.safety_splits(config.data.safety))
        base_model = RunDir(workdir).base_model
        if distributed.is_primary():
            safety_embedded.build_base_model(base_model, splits, config)
        distributed.barrier("base model built")
        model_path = config.model.path or base_model
    else:
        if not config.model.path:
            raise ValueError("config.model.path: the files task needs a Hugging Face model directory")
        splits = {"train": _load_split(config.data.train, config, reward_fn)}
        for split in ("validation", "test"):
            if getattr(config.data, split):
                splits[split] = _load_split(getattr(config.data, split), config, reward_fn)
        model_path = config.model.path
    return splits, pathlib.Path(model_path)


def _tool_calling_spec(config, **_) -> dict[str, Any]:
    rewards = config.rewards
    return {"kind": rewards.kind, "names": tuple(rewards.names), "max_think_words": rewards.max_think_words,
            "conditional_length": rewards.conditional_length}


def _reward_model_spec(config, *, tokenizer, eos_ids: list[int], mesh) -> dict[str, Any]:
    rewards = config.rewards
    for name, model in rewards.reward_models.items():
        field = f"rewards.reward_models.{name}.path"
        if not model.path:
            raise ConfigError(f"config.{field}: empty; give the directory of the score model that scores "
                              f"{name!r} (--config.{field}=DIR)")
        _model_dir(model.path, field)
    return {"kind": rewards.kind, "names": tuple(rewards.names),
            "reward_models": {name: model.to_dict() for name, model in rewards.reward_models.items()},
            "offload": rewards.offload, "policy_tokenizer": tokenizer, "policy_eos_ids": list(eos_ids), "mesh": mesh}


_REWARD_SPECS = {"tool_calling": _tool_calling_spec, "reward_model": _reward_model_spec}
"""How each reward kind's `build_reward_function` spec is made from the config and the run."""


def reward_spec(config, *, tokenizer=None, eos_ids=(), mesh=None) -> dict[str, Any]:
    """The `build_reward_function` spec of ``config.rewards``: the options of its kind from the config,
    and what the run gives the kinds that need it (a reward model: the policy's tokenizer and EOS ids,
    which decode responses, and the mesh its parameters are sharded over). A kind registered
    elsewhere gets ``names``.

    Raises:
      ConfigError: a reward model's path is empty or not a directory, naming its field.
    """
    make = _REWARD_SPECS.get(config.rewards.kind)
    if make is None:
        return {"kind": config.rewards.kind, "names": tuple(config.rewards.names)}
    return make(config, tokenizer=tokenizer, eos_ids=eos_ids, mesh=mesh)


def eval_split(config, setup: RunSetup) -> str | None:
    """The split evaluated before and after RL: ``config.eval.split``, None for "none".

    Raises:
      ConfigError: when the data has no such split, naming ``config.eval.split`` and the splits it has.
    """
    split = config.eval.split
    if split == "none":
        return None
    if split not in setup.evals:
        available = sorted(setup.evals) + ["none"]
        where = f"config.data.{split} is empty" if config.task == "files" else \
            f"data.{'safety' if config.task == 'safety_embedded' else 'synthetic'}.num_{split}=0"
        raise ConfigError(f"config.eval.split: the data has no {split!r} split ({where}); choose one of "
                          f"{available} ('none': no evaluation during the run)")
    return split


def build_setup(config: RunConfig, workdir: pathlib.Path) -> RunSetup:
    """Data, tokenizer, reward function and mesh of a run; checks the config against the mesh first."""
    try:
        mesh = make_mesh(data=config.mesh.data, fsdp=config.mesh.fsdp, tensor=config.mesh.tensor)
    except ValueError as err:
        raise ConfigError(f"config.mesh: {err}") from err
    config.check_mesh(num_data_shards=mesh.shape["data"] * mesh.shape["fsdp"])
    splits, model_path = load_splits(config, workdir)
    if config.task == "safety_embedded":  # its reward models: trained once (or found), then loaded as any
        if distributed.is_primary():  # several processes: process 0 trains them, the others read them
            safety_embedded.with_reward_models(config, workdir)
        distributed.barrier("reward models built")
        config = safety_embedded.with_reward_models(config, workdir, progress=False)
    tokenizer = load_tokenizer(config.model.tokenizer_path or model_path)
    eos_ids = eos_token_ids(tokenizer, model_path)
    pad_id = pad_token_id(tokenizer, eos_ids)
    reward_fn = build_reward_function(reward_spec(config, tokenizer=tokenizer, eos_ids=eos_ids, mesh=mesh))
    if config.task == "files":  # rows the reward could never score: found now, naming file and row
        splits = {split: _scorable_rows(dataset, getattr(config.data, split), reward_fn, config)
                  for split, dataset in splits.items()}
    limit, truncation = config.data.max_prompt_tokens, config.data.prompt_truncation
    train = build_prompt_set(splits["train"], tokenizer, max_prompt_tokens=limit, where="training data",
                             truncation=truncation)
    evals = {}
    for split in ("validation", "test"):
        if split in splits and len(splits[split]):
            dataset = splits[split]
            if config.eval.max_examples:
                dataset = dataset.select(range(min(config.eval.max_examples, len(dataset))))
            evals[split] = build_prompt_set(dataset, tokenizer, max_prompt_tokens=limit, where=f"{split} data",
                                            truncation=truncation)
    longest = max([train.max_tokens] + [p.max_tokens for p in evals.values()])
    sft_dataset = None
    if config.sft.enabled:
        sft_dataset = _load_split(config.sft.data, config) if config.sft.data else splits["train"]
    return RunSetup(
        model_path=model_path, tokenizer=tokenizer, eos_ids=eos_ids, pad_id=pad_id, reward_fn=reward_fn,
        train=train, evals=evals, sft_dataset=sft_dataset, prompt_length=bucket_length(longest), mesh=mesh,
    )
