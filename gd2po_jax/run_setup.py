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

from gd2po_jax import embedded
from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.data.loaders import load_data
from gd2po_jax.prompts import PromptSet, build_prompt_set
from gd2po_jax.rewards.base import build_reward_function
from gd2po_jax.run_dir import RunDir
from gd2po_jax.sampling import bucket_length
from gd2po_jax.sharding import make_mesh
from gd2po_jax.tokenization import eos_token_ids, load_tokenizer, pad_token_id

logger = logging.getLogger(__name__)


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
            RunDir(workdir).base_model, splits, config.model.tiny, config.data.synthetic.tokenizer_vocab_size
        )
    else:
        splits = {"train": _load_split(config.data.train, config)}
        for split in ("validation", "test"):
            if getattr(config.data, split):
                splits[split] = _load_split(getattr(config.data, split), config)
        if not config.model.path:
            raise ValueError("config.model.path: the files task needs a Hugging Face model directory")
        model_path = config.model.path
    return splits, pathlib.Path(model_path)


def build_setup(config: RunConfig, workdir: pathlib.Path) -> RunSetup:
    """Data, tokenizer, reward function and mesh of a run; checks the config against the mesh first."""
    try:
        mesh = make_mesh(data=config.mesh.data, fsdp=config.mesh.fsdp, tensor=config.mesh.tensor)
    except ValueError as err:
        raise ConfigError(f"config.mesh: {err}") from err
    config.check_mesh(num_data_shards=mesh.shape["data"] * mesh.shape["fsdp"])
    splits, model_path = load_splits(config, workdir)
    tokenizer = load_tokenizer(config.model.tokenizer_path or model_path)
    eos_ids = eos_token_ids(tokenizer, model_path)
    pad_id = pad_token_id(tokenizer, eos_ids)
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
