"""The reward-function interface the trainer calls, and a registry to build rewards from configs.

A reward function scores a batch of N responses with K rewards at once:

    fn(prompts: list[str], responses: list[str], columns: dict[str, list]) -> np.ndarray [N, K]
    fn.names -> tuple of K column names, e.g. ("correctness", "format", "length")

`prompts[i]` is the rendered prompt of response i, `responses[i]` the decoded response (special
tokens dropped), and `columns` holds the dataset columns of the rows the responses answer
(`columns["prompt"][i]`, the chat messages; `columns["ground_truth"][i]` and so on), repeated per
response. Sampled rollouts add `columns[RESPONSE_IDS][i]`: the policy's token ids of response i, EOS
included (a reward model re-renders them with its own tokenizer). Rule-based rewards and reward
models implement the same interface, so the train step never knows where a reward came from.
Reward functions run on the host in plain Python / NumPy, never inside jit. Rollouts also add
`ROLLOUT_INDEX`, each rollout's index in the step. Functions of your own (TRL's signature too) are
named in ``config.rewards.functions`` (`gd2po_jax.rewards.user_functions`).

Abstaining: a function that cannot score response i with reward k (a reward model without an
opinion, a checker that does not apply to this row) returns NaN or None there. The reward is then
missing for that rollout: it moves no statistic of the advantages (`gd2po_jax.rl.advantages`) and
the trainer logs the share of rollouts each reward abstained on. Abstaining is not failing: an
exception is a crash, handled by `config.rewards.on_error` (`gd2po_jax.rewards.scoring`), and an
output that is neither a finite number nor an abstention (+-inf, a string such as "2.5", a bool)
is a bug in the reward function, rejected by `check_reward_output` with an error naming the
reward, the rollout and the value.

Checking the data: a reward function may also define

    fn.check_columns(columns: dict[str, list]) -> iterable of (row, column, problem)

naming the dataset rows it could never score (a ground truth it cannot parse, a missing one);
`column_problems` asks it (and every function of a `CombinedReward`), so that the run setup
rejects such rows when the data is loaded, naming the file and the row, instead of when the row
is first sampled.

Per-step metrics: a reward function may also define

    fn.step_metrics() -> dict[str, float]

the metrics it gathered since the last call (a reward model's truncated share and scoring time),
which it then forgets; `reward_step_metrics` collects them (from every function of a
`CombinedReward`) once per step, and the trainer writes them to metrics.jsonl with the step's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

# The columns rollouts add (`RESPONSE_IDS`, `ROLLOUT_INDEX`) are named with the data's columns, which
# refuse a data column of either name; re-exported here, where reward functions and rollouts import them.
from gd2po_jax.data.columns import RESPONSE_IDS as RESPONSE_IDS
from gd2po_jax.data.columns import ROLLOUT_INDEX as ROLLOUT_INDEX
from gd2po_jax.errors import UserError


@runtime_checkable
class RewardFunction(Protocol):
    """Scores N responses with K named rewards; returns [N, K] numbers (NaN / None: abstained)."""

    if TYPE_CHECKING:  # read only: an attribute or a property (`CombinedReward.names`) does

        @property
        def names(self) -> tuple[str, ...]: ...
    else:
        names: tuple[str, ...]

    def __call__(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        columns: Mapping[str, Sequence[Any]],
    ) -> np.ndarray: ...


class RewardOutputError(UserError, ValueError):
    """A reward function returned something that is neither a finite number nor an abstention.

    Attributes:
      function: the reward function's type name.
      reward: the reward (column) name, when the problem is one value.
      rollout: the 0-based index of the rollout in the scored batch, when the problem is one value.
      problem: what is wrong.
    """

    def __init__(self, function: str, problem: str, *, reward: str | None = None, rollout: int | None = None):
        self.function, self.problem, self.reward, self.rollout = function, problem, reward, rollout
        where = [f"reward function {function}"]
        if reward is not None:
            where.append(f"reward {reward!r}")
        if rollout is not None:
            where.append(f"rollout {rollout}")
        super().__init__(", ".join(where) + f": {problem}")

    def shifted(self, offset: int) -> RewardOutputError:
        """The same error for a batch that starts at rollout `offset` of a larger one."""
        rollout = None if self.rollout is None else self.rollout + offset
        return RewardOutputError(self.function, self.problem, reward=self.reward, rollout=rollout)


def _reward_value(value: Any) -> float | None:
    """`value` as a float (None and NaN: an abstention, NaN); None when it is not a number."""
    if value is None:
        return float("nan")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    return float(value)


def check_reward_output(fn: RewardFunction, rewards: Any, num_responses: int) -> np.ndarray:
    """`rewards` as a float32 [N, K] array, NaN where the function abstained.

    Accepts an array or nested sequence of shape [N, K] = [num_responses, len(fn.names)] whose
    values are numbers (Python or NumPy ints and floats), NaN or None (both: abstained).

    Raises:
      RewardOutputError: for a wrong shape, or a value that is +-inf (also after the cast to
        float32) or not a number (a string, a bool, an object), naming the function, the reward,
        the rollout (0-based row of this batch) and the value.
    """
    names = tuple(fn.names)
    function = function_label(fn)
    try:  # an array (NumPy, JAX) keeps its dtype; nested lists are read value by value
        array_like = hasattr(rewards, "__array__") and not isinstance(rewards, (list, tuple))
        values = np.asarray(rewards) if array_like else np.asarray(rewards, dtype=object)
    except ValueError as err:  # ragged nesting
        raise RewardOutputError(
            function, f"returned {type(rewards).__name__} that is not an [N, K] array ({err})"
        ) from None
    numeric = values.dtype.kind in "fiu"
    if values.shape != (num_responses, len(names)):
        raise RewardOutputError(
            function,
            f"returned shape {values.shape} for rewards {names}, expected "
            f"({num_responses}, {len(names)}) = (responses, rewards)",
        )
    out = np.empty(values.shape, np.float32)
    with np.errstate(over="ignore"):  # values beyond float32 become inf, rejected below
        if numeric:
            out[...] = values
        else:
            for (i, k), value in np.ndenumerate(values):
                number = _reward_value(value)
                if number is None:
                    raise RewardOutputError(
                        function,
                        f"returned {value!r} ({type(value).__name__}); a reward is a "
                        "finite number, or None / NaN to abstain",
                        reward=names[k],
                        rollout=i,
                    )
                out[i, k] = number
    if np.isinf(out).any():
        i, k = (int(x) for x in np.argwhere(np.isinf(out))[0])
        raise RewardOutputError(
            function,
            f"returned {values[i, k]!r}, not finite in float32; a reward is a finite number, or None / NaN to abstain",
            reward=names[k],
            rollout=i,
        )
    return out


def function_label(fn: Any) -> str:
    """How messages name a reward function: its ``label`` (a function of ``config.rewards.functions``:
    the entry, the callable and its file), else its type's name."""
    return str(getattr(fn, "label", None) or type(fn).__name__)


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
            owners = {n: [function_label(fn) for fn in self.functions if n in fn.names] for n in duplicates}
            raise ValueError(
                f"reward names must be unique across functions; repeated: {duplicates} "
                f"({'; '.join(f'{n!r} from ' + ', '.join(o) for n, o in owners.items())})"
            )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for fn in self.functions for n in fn.names)

    @property
    def min_values(self) -> tuple[float, ...] | None:
        """Every function's ``min_values`` in column order; None unless all declare them (what
        `config.rewards.on_error='min'` scores a crashed rollout with)."""
        parts: list[Any] = [getattr(fn, "min_values", None) for fn in self.functions]
        if any(part is None for part in parts):
            return None
        return tuple(float(v) for part in parts for v in part)

    def __call__(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        columns: Mapping[str, Sequence[Any]],
    ) -> np.ndarray:
        """Rewards [N, sum of K] from every function, checked and concatenated (NaN: abstained)."""
        parts = [check_reward_output(fn, fn(prompts, responses, columns), len(responses)) for fn in self.functions]
        return np.concatenate(parts, axis=1)


def column_problems(fn: RewardFunction, columns: Mapping[str, Sequence[Any]]) -> list[tuple[int, str, str]]:
    """(row index, column, problem) of each dataset row ``fn`` could never score, sorted by row,
    from the optional ``check_columns`` of ``fn`` (or of each function of a `CombinedReward`);
    empty when no function checks its columns.

    Args:
      columns: the dataset's columns (``ground_truth`` ...), N values each.
    """
    functions = fn.functions if isinstance(fn, CombinedReward) else (fn,)
    problems: list[tuple[int, str, str]] = []
    for function in functions:
        check = getattr(function, "check_columns", None)
        if check is not None:
            problems.extend((int(i), str(column), str(problem)) for i, column, problem in check(columns))
    return sorted(problems)


def reward_step_metrics(fn: RewardFunction) -> dict[str, float]:
    """The metrics ``fn`` (or each function of a `CombinedReward`) gathered since the last call, from
    its optional ``step_metrics``; empty when no function keeps any. Each function forgets them."""
    functions = fn.functions if isinstance(fn, CombinedReward) else (fn,)
    metrics: dict[str, float] = {}
    for function in functions:
        step_metrics = getattr(function, "step_metrics", None)
        if step_metrics is not None:
            metrics.update({str(name): float(value) for name, value in step_metrics().items()})
    return metrics


def reward_step_extras(fn: RewardFunction) -> dict[str, dict[int, Any]]:
    """What ``fn`` (or each function of a `CombinedReward`) reported per rollout since the last call,
    from its optional ``step_extras`` (TRL's ``log_extra``): column -> {rollout index: value}."""
    functions = fn.functions if isinstance(fn, CombinedReward) else (fn,)
    extras: dict[str, dict[int, Any]] = {}
    for function in functions:
        step_extras = getattr(function, "step_extras", None)
        if step_extras is not None:
            for column, values in step_extras().items():
                extras.setdefault(str(column), {}).update(values)
    return extras


def begin_step(fn: RewardFunction, step: int, num_steps: int) -> None:
    """Tell ``fn`` (or each function of a `CombinedReward`, through its optional ``begin_step``) that
    the rollouts of RL step ``step`` (0-based: the steps done) of ``num_steps`` are scored next."""
    functions = fn.functions if isinstance(fn, CombinedReward) else (fn,)
    for function in functions:
        hook = getattr(function, "begin_step", None)
        if hook is not None:
            hook(step, num_steps)


def scores_on_devices(fn: RewardFunction) -> bool:
    """Whether ``fn`` (or a function of a `CombinedReward`) scores with device programs over the
    run's mesh (reward models declare ``scores_on_devices = True``). With several processes each
    process then scores every rollout, feeding such a program the same rows as the others
    (`gd2po_jax.rl.rollout.collect_rollouts`); host-only rewards score each process's own rows."""
    functions = fn.functions if isinstance(fn, CombinedReward) else (fn,)
    return any(getattr(function, "scores_on_devices", False) for function in functions)


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


def unknown_kind_message(kind: str) -> str:
    """The error for ``config.rewards.kind`` naming no registered family."""
    return (
        f"config.rewards.kind: {kind!r} is not a registered reward family; registered: "
        f"{', '.join(reward_kinds())} (or empty: none). Reward functions of your own go in "
        "config.rewards.functions (module:callable or path/to/file.py:callable; docs/own_task.md)"
    )
