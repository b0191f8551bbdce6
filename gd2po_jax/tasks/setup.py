"""What a run is made of, resolved from its config: data, tokenizer, reward function, prompts, mesh.

`build_setup` is the first thing the trainer, the warm start and evaluation do with a config; it
looks up the run's task (`gd2po_jax.tasks.task_of`, which checks the task's fields) and validates
the config before anything is computed or written (except a task's base model, built in
``WORKDIR/base_model``).
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Any, cast

import jax
from jax.sharding import NamedSharding, PartitionSpec

from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.data.prompts import PromptSet, build_prompt_set
from gd2po_jax.data.tokenization import check_tokenizer, eos_token_ids, load_tokenizer, pad_token_id
from gd2po_jax.models.sampling import bucket_length
from gd2po_jax.rewards.base import CombinedReward, build_reward_function, reward_kinds, unknown_kind_message
from gd2po_jax.rewards.user_functions import check_call, load_function, run_reward_weights, trial_call, user_functions
from gd2po_jax.runtime import distributed
from gd2po_jax.runtime.hub import resolve_model_dir
from gd2po_jax.runtime.sharding import make_mesh
from gd2po_jax.tasks import task_of
from gd2po_jax.tasks.files import load_file

logger = logging.getLogger(__name__)

REWARD_MODEL_KINDS = ("reward_model",)
"""The reward kinds that read ``rewards.reward_models``."""


@dataclasses.dataclass
class RunSetup:
    """What a run is made of, resolved from the config (host objects; no training state)."""

    model_path: pathlib.Path
    tokenizer: Any
    eos_ids: list[int]
    pad_id: int
    reward_fn: Any
    reward_names: tuple[str, ...]  # the K reward columns: the family's (rewards.names), then rewards.functions'
    reward_weights: tuple[float, ...]  # w_k of each column; empty: all ones (`run_reward_weights`)
    train: PromptSet
    evals: dict[str, PromptSet]  # split name -> prompts (validation, test)
    sft_dataset: Any  # datasets.Dataset with a `target` column, or None (no warm start: `uses_warm_start`)
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


def uses_warm_start(config: RunConfig, setup: RunSetup) -> bool:
    """Whether RL starts from a supervised warm start: ``sft.enabled``, and with ``sft.only_with_targets``
    only when the SFT data has targets."""
    return config.sft.enabled and setup.sft_dataset is not None


def warm_start_data(config: RunConfig, train: Any) -> Any:
    """The SFT rows of a run's warm start: ``sft.data``'s, else the training split ``train``; None (no
    warm start) when ``sft.enabled`` is off, or with ``sft.only_with_targets`` when no row has a
    ``target``. One decision for `build_setup` (train.py) and a sweep (`plans_warm_start`)."""
    if not config.sft.enabled:
        return None
    dataset = load_file(config.sft.data, config, "sft.data") if config.sft.data else train
    if config.sft.only_with_targets and not any(dataset["target"]):
        return None
    return dataset


def plans_warm_start(config: RunConfig, workdir: pathlib.Path) -> bool:
    """Whether a run of ``config`` starts RL from a warm start, as `build_setup` decides it
    (`warm_start_data`), before anything else is built: the task's training split is loaded only when
    ``sft.only_with_targets`` needs it (``workdir``: where a task builds what its split needs)."""
    if not config.sft.enabled:
        return False
    if not config.sft.only_with_targets:
        return True
    if config.sft.data:
        return warm_start_data(config, None) is not None
    splits, _ = task_of(config).load_splits(config, workdir)
    return warm_start_data(config, splits["train"]) is not None


def _model_dir(path: str, field: str) -> pathlib.Path:
    """The local directory of ``path`` (itself, or a Hub id's snapshot: `resolve_model_dir`); else a
    `ConfigError` naming ``config.<field>``."""
    try:
        return resolve_model_dir(path, f"config.{field}")
    except FileNotFoundError as err:
        raise ConfigError(str(err)) from None


def with_local_models(config: RunConfig) -> RunConfig:
    """``config`` with every model path it gives (``model.path``, ``model.tokenizer_path``,
    ``rewards.reward_models.<name>.path``) as a local directory: a Hub id becomes its snapshot in
    the Hugging Face cache (downloaded unless ``HF_HUB_OFFLINE``), once per run. The run's
    config.json keeps what the user wrote.

    Raises:
      ConfigError: naming the field whose model cannot be had.
    """
    changes = {}
    for field in ("model.path", "model.tokenizer_path"):
        value = getattr(config.model, field.split(".")[1])
        if value:
            changes[field] = str(_model_dir(value, field))
    if config.rewards.kind in REWARD_MODEL_KINDS:
        for name, model in config.rewards.reward_models.items():
            if model.path:
                field = f"rewards.reward_models.{name}.path"
                changes[field] = str(_model_dir(model.path, field))
    return config.replace(changes) if changes else config


def _tool_calling_spec(config: RunConfig, **_) -> dict[str, Any]:
    rewards = config.rewards
    return {
        "kind": rewards.kind,
        "names": tuple(rewards.names),
        "max_think_words": rewards.max_think_words,
        "conditional_length": rewards.conditional_length,
    }


def _reward_model_spec(config: RunConfig, *, tokenizer, eos_ids: list[int], mesh) -> dict[str, Any]:
    rewards = config.rewards
    for name, model in rewards.reward_models.items():
        field = f"rewards.reward_models.{name}.path"
        if not model.path:
            raise ConfigError(
                f"config.{field}: empty; give the directory of the score model that scores "
                f"{name!r} (--config.{field}=DIR)"
            )
        _model_dir(model.path, field)  # local by now (`with_local_models`): checked, not fetched
    return {
        "kind": rewards.kind,
        "names": tuple(rewards.names),
        "reward_models": {name: model.to_dict() for name, model in rewards.reward_models.items()},
        "offload": rewards.offload,
        "policy_tokenizer": tokenizer,
        "policy_eos_ids": list(eos_ids),
        "mesh": mesh,
    }


_REWARD_SPECS = {"tool_calling": _tool_calling_spec, "reward_model": _reward_model_spec}
"""How each reward kind's `build_reward_function` spec is made from the config and the run."""


def reward_spec(config: RunConfig, *, tokenizer=None, eos_ids=(), mesh=None) -> dict[str, Any]:
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


def load_user_functions(config: RunConfig) -> tuple:
    """The functions of ``rewards.functions``, imported and built, after checking that ``rewards.kind``
    is a registered family: what can fail in the reward config before any data or model is touched.

    Raises:
      ConfigError: an unknown family (naming ``config.rewards.kind``), a function that cannot be used
        (`gd2po_jax.rewards.user_functions.RewardFunctionError`).
    """
    if config.rewards.kind and config.rewards.kind not in reward_kinds():
        raise ConfigError(unknown_kind_message(config.rewards.kind))
    return tuple(load_function(entry) for entry in config.rewards.function_entries())


def build_run_reward(config: RunConfig, *, tokenizer=None, eos_ids=(), mesh=None, functions=None):
    """The run's reward function: the family ``rewards.kind`` (if any) and each entry of
    ``rewards.functions``, combined side by side in that order (`CombinedReward`; one alone as itself).

    Args:
      functions: `load_user_functions`'s result, if the caller has it (else loaded here).

    Raises:
      ConfigError: see `load_user_functions`; a reward model's empty path, or a reward name given
        twice (naming where each comes from).
    """
    rewards = config.rewards
    functions = load_user_functions(config) if functions is None else functions
    parts = []
    if rewards.kind:
        parts.append(build_reward_function(reward_spec(config, tokenizer=tokenizer, eos_ids=eos_ids, mesh=mesh)))
    parts.extend(functions)
    if len(parts) == 1:
        return parts[0]
    try:
        return CombinedReward(tuple(parts))
    except ValueError as err:
        raise ConfigError(
            f"config.rewards.functions: {err}; give the entries distinct names (an entry's 'name')"
        ) from None


def check_user_functions(config: RunConfig, reward_fn, train: PromptSet) -> None:
    """Before compute: each function of ``rewards.functions`` can take its call with the data's
    columns, and a trial call on the first training rows returns one number per completion.

    Raises:
      RewardFunctionError: naming the entry, its file and the problem.
    """
    for fn in user_functions(reward_fn):
        check_call(fn, tuple(train.columns))
        trial_call(fn, train.texts, train.columns, on_error=config.rewards.on_error, timeout_s=config.rewards.timeout_s)
    if isinstance(reward_fn, CombinedReward):  # the trial calls fixed the components: names may be new
        try:
            CombinedReward(reward_fn.functions)
        except ValueError as err:
            raise ConfigError(f"config.rewards.functions: {err}; give the entries distinct names") from None


def eval_split(config: RunConfig, setup: RunSetup) -> str | None:
    """The split evaluated before and after RL: ``config.eval.split`` ("auto": validation, else test,
    else none), None for "none".

    Raises:
      ConfigError: when the data has no such split, naming ``config.eval.split`` and the splits it has.
    """
    split = config.eval.split
    if split == "auto":
        split = next((name for name in ("validation", "test") if name in setup.evals), "none")
    if split == "none":
        return None
    if split not in setup.evals:
        available = sorted(setup.evals) + ["none"]
        field = task_of(config).split_field(config, split)
        raise ConfigError(
            f"config.eval.split: the data has no {split!r} split (config.{field} gives it no rows); "
            f"choose one of {available} ('none': no evaluation during the run)"
        )
    return split


def data_where(config: RunConfig, task, split: str) -> str:
    """How errors name a split's rows: the field and the file that give them
    (``config.data.train=data/train.jsonl``), else ``<split> data`` (a generated split)."""
    field, value = task.split_field(config, split), cast(Any, config)
    for name in field.split("."):
        value = getattr(value, name, None)
    return f"config.{field}={value}" if isinstance(value, str) and value else f"{split} data"


def prepare(task, config: RunConfig, workdir: pathlib.Path) -> RunConfig:
    """`gd2po_jax.tasks.Task.prepare` on every process: process 0 builds what the task needs (the
    others wait), then each reads it and gets the config the run uses."""
    if distributed.is_primary():
        task.prepare(config, workdir)
    distributed.barrier(f"task {task.name!r} prepared")
    return task.prepare(config, workdir, progress=False)


def build_setup(config: RunConfig, workdir: pathlib.Path) -> RunSetup:
    """Data, tokenizer, reward function and mesh of a run; checks the config against the mesh first."""
    try:
        mesh = make_mesh(data=config.mesh.data, fsdp=config.mesh.fsdp, tensor=config.mesh.tensor)
    except ValueError as err:
        raise ConfigError(f"config.mesh: {err}") from err
    config.check_mesh(num_data_shards=mesh.shape["data"] * mesh.shape["fsdp"])
    task = task_of(config)
    functions = load_user_functions(config)  # errors before data, models or compute
    config = with_local_models(config)
    splits, model_path = task.load_splits(config, workdir)
    config = prepare(task, config, workdir)
    tokenizer = load_tokenizer(config.model.tokenizer_path or model_path)
    eos_ids = eos_token_ids(tokenizer, model_path)
    pad_id = pad_token_id(tokenizer, eos_ids)
    reward_fn = build_run_reward(config, tokenizer=tokenizer, eos_ids=eos_ids, mesh=mesh, functions=functions)
    splits = task.usable_rows(config, splits, reward_fn)
    limit, truncation = config.data.max_prompt_tokens, config.data.prompt_truncation
    template: dict[str, Any]  # build_prompt_set's keywords
    template = {"template_kwargs": config.data.template_kwargs, "tools_column": config.data.tools_column}
    train = build_prompt_set(
        splits["train"],
        tokenizer,
        max_prompt_tokens=limit,
        where=data_where(config, task, "train"),
        truncation=truncation,
        **template,
    )
    check_tokenizer(tokenizer, config.model.tokenizer_path or model_path, model_path, train.texts[0])
    check_user_functions(config, reward_fn, train)
    reward_weights = run_reward_weights(config, reward_fn)  # after the trial calls: components are columns
    evals: dict[str, PromptSet] = {}
    for split in ("validation", "test"):
        if split in splits and len(splits[split]):
            dataset = splits[split]
            if config.eval.max_examples:
                dataset = dataset.select(range(min(config.eval.max_examples, len(dataset))))
            evals[split] = build_prompt_set(
                dataset,
                tokenizer,
                max_prompt_tokens=limit,
                where=data_where(config, task, split),
                truncation=truncation,
                **template,
            )
    longest = max([train.max_tokens] + [p.max_tokens for p in evals.values()])
    sft_dataset = warm_start_data(config, splits["train"])
    if config.sft.enabled and sft_dataset is None:
        logger.info(
            "no warm start: %s has no row with a target (config.sft.only_with_targets); RL starts from %s",
            config.sft.data or config.data.train or "the training data",
            model_path,
        )
    return RunSetup(
        model_path=model_path,
        tokenizer=tokenizer,
        eos_ids=eos_ids,
        pad_id=pad_id,
        reward_fn=reward_fn,
        reward_names=tuple(reward_fn.names),
        reward_weights=reward_weights,
        train=train,
        evals=evals,
        sft_dataset=sft_dataset,
        prompt_length=bucket_length(longest),
        mesh=mesh,
    )
