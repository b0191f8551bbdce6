"""The reward-function interface the trainer calls, and a registry to build rewards from configs.

A reward function scores a batch of N responses with K rewards at once:

    fn(prompts: list[str], responses: list[str], columns: dict[str, list]) -> np.ndarray [N, K]
    fn.names -> tuple of K column names, e.g. ("correctness", "format", "length")

`prompts[i]` is the rendered prompt of response i, `responses[i]` the decoded response, and
`columns` holds the dataset columns of the rows the responses answer (`columns["ground_truth"][i]`
and so on), repeated per response. Rule-based rewards and reward models implement the same
interface, so the train step never knows where a reward came from. Reward functions run on the
host in plain Python / NumPy, never inside jit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class RewardFunction(Protocol):
    """Scores N responses with K named rewards; returns a float array of shape [N, K]."""

    names: tuple[str, ...]

    def __call__(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        columns: Mapping[str, Sequence[Any]],
    ) -> np.ndarray: ...


def check_reward_output(fn: RewardFunction, rewards: Any, num_responses: int) -> np.ndarray:
    """`rewards` as a float32 [N, K] array after checking shape and finiteness.

    Raises:
      ValueError: naming the reward function and what is wrong with its output.
    """
    names = tuple(fn.names)
    arr = np.asarray(rewards, dtype=np.float32)
    if arr.shape != (num_responses, len(names)):
        raise ValueError(
            f"reward function {type(fn).__name__} with names {names} returned shape {arr.shape}, "
            f"expected ({num_responses}, {len(names)})"
        )
    if not np.all(np.isfinite(arr)):
        bad = sorted({names[k] for k in np.argwhere(~np.isfinite(arr))[:, 1]})
        raise ValueError(f"reward function {type(fn).__name__} returned non-finite values in {bad}")
    return arr


@dataclasses.dataclass(frozen=True)
class CombinedReward:
    """Several reward functions side by side: columns of each, concatenated in order."""

    functions: tuple[RewardFunction, ...]

    def __post_init__(self):
        object.__setattr__(self, "functions", tuple(self.functions))
        if not self.functions:
            raise ValueError("CombinedReward needs at least one reward function")
        names = self.names
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(
                f"reward names must be unique across functions; repeated: {duplicates}"
            )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for fn in self.functions for n in fn.names)

    def __call__(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        columns: Mapping[str, Sequence[Any]],
    ) -> np.ndarray:
        """Rewards [N, sum of K] from every function, checked and concatenated."""
        parts = [
            check_reward_output(fn, fn(prompts, responses, columns), len(responses))
            for fn in self.functions
        ]
        return np.concatenate(parts, axis=1)


_REWARD_KINDS: dict[str, Callable[..., RewardFunction]] = {}


def register_reward_kind(kind: str) -> Callable[[Callable[..., RewardFunction]], Any]:
    """Class/function decorator: make `build_reward_function({"kind": kind, ...})` call it."""

    def register(factory: Callable[..., RewardFunction]) -> Callable[..., RewardFunction]:
        if kind in _REWARD_KINDS and _REWARD_KINDS[kind] is not factory:
            raise ValueError(f"reward kind {kind!r} is already registered")
        _REWARD_KINDS[kind] = factory
        return factory

    return register


def reward_kinds() -> tuple[str, ...]:
    """The registered reward kinds, sorted."""
    return tuple(sorted(_REWARD_KINDS))


def build_reward_function(spec: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> RewardFunction:
    """A reward function from a config-like spec.

    Args:
      spec: a mapping `{"kind": <registered kind>, **options}` — for example
        `{"kind": "tool_calling", "names": ["correctness", "length"], "conditional_length": True}`
        — or a list of such mappings, combined side by side (`CombinedReward`).

    Raises:
      ValueError: for an unknown kind or options the factory rejects, naming the spec.
    """
    if not isinstance(spec, Mapping):
        return CombinedReward(tuple(build_reward_function(s) for s in spec))
    options = dict(spec)
    kind = options.pop("kind", None)
    if kind not in _REWARD_KINDS:
        raise ValueError(f"unknown reward kind {kind!r} in {dict(spec)}; known: {reward_kinds()}")
    try:
        return _REWARD_KINDS[kind](**options)
    except TypeError as err:
        raise ValueError(f"bad options for reward kind {kind!r} in {dict(spec)}: {err}") from err
