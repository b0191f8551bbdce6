"""The embedded default task, ``task="synthetic_tools"``: the synthetic tool-calling world
(`gd2po_jax.tasks.synthetic_tools.data`), a tokenizer trained on it and a tiny random Qwen2 in
Hugging Face format built in ``WORKDIR/base_model`` (unless ``model.path`` names a model), so the
default run takes the code paths of a real one."""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import datasets

from gd2po_jax.config import ConfigError, RunConfig, SyntheticDataConfig
from gd2po_jax.runtime import distributed
from gd2po_jax.runtime.run_dir import RunDir
from gd2po_jax.tasks.base import Task, build_tiny_model, register_task
from gd2po_jax.tasks.synthetic_tools import data as synthetic_tools
from gd2po_jax.tasks.synthetic_tools import habits
from gd2po_jax.tasks.synthetic_tools.data import SyntheticToolsConfig

NAME = "synthetic_tools"


def world_config(section: SyntheticDataConfig) -> SyntheticToolsConfig:
    """The task's own config from ``config.data.synthetic``: the fields set there, the task's
    defaults for the rest.

    Raises:
      ConfigError: naming the ``config.data.synthetic`` field the task rejects.
    """
    names = [f.name for f in dataclasses.fields(SyntheticToolsConfig)]
    values = {name: getattr(section, name) for name in names if getattr(section, name) is not None}
    try:
        return SyntheticToolsConfig(**values)
    except ValueError as err:
        message = str(err)
        found = {name: re.search(rf"\b{name}\b", message) for name in names}
        named = sorted((match.start(), name) for name, match in found.items() if match)
        field = f"data.synthetic.{named[0][1]}" if named else "data.synthetic"
        raise ConfigError(f"config.{field}: {message}") from None


def synthetic_splits(section: SyntheticDataConfig) -> datasets.DatasetDict:
    """Train / validation / test splits of the synthetic tool-calling task (``config.data.synthetic``)."""
    return synthetic_tools.make_splits(world_config(section))


def tokenizer_corpus(splits) -> list[str]:
    """The texts the task's tokenizer is trained on: the train split's and every tool's."""
    return [*synthetic_tools.iter_corpus(splits["train"]), *synthetic_tools.tool_corpus()]


@register_task(NAME)
class SyntheticToolsTask(Task):
    """Generated tool-calling requests scored by the ToolRL rules; the base model is ``model.path``
    or, when that is empty, a tiny random Qwen2 built in ``WORKDIR/base_model`` (``model.tiny``)."""

    def check_config(self, config: RunConfig) -> None:
        world_config(config.data.synthetic)

    def load_splits(self, config: RunConfig, workdir: pathlib.Path) -> tuple[dict, pathlib.Path]:
        splits = dict(synthetic_splits(config.data.synthetic))
        model_path: str | pathlib.Path = config.model.path
        if not model_path:  # several processes: process 0 builds it, the others read it
            model_path = RunDir(workdir).base_model
            if distributed.is_primary():
                build_tiny_model(
                    model_path, tokenizer_corpus(splits), config.model.tiny, config.data.synthetic.tokenizer_vocab_size
                )
            distributed.barrier("base model built")
        return splits, pathlib.Path(model_path)

    def split_field(self, config: RunConfig, split: str) -> str:
        return f"data.synthetic.num_{split}"

    def has_split(self, config: RunConfig, split: str) -> bool:
        return getattr(world_config(config.data.synthetic), f"num_{split}") > 0

    def habit_breakdown(
        self, config: RunConfig, names: Sequence[str], generations: Callable[[str], Iterable[Mapping[str, Any]]]
    ) -> dict[str, Any]:
        """`habits.habits_of_evaluations`, with the habit tools of ``config.data.synthetic``."""
        return habits.habits_of_evaluations(world_config(config.data.synthetic), names, generations)

    def habit_table(self, config: RunConfig, breakdown: Mapping[str, Any]) -> str:
        return habits.habits_table(dict(breakdown))
