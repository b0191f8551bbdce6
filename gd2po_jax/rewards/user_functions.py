"""Reward functions of your own, named by import path in ``config.rewards.functions``.

An entry (`gd2po_jax.config.FunctionEntry`) names a callable as ``module:callable`` or
``path/to/file.py:callable`` (`gd2po_jax.runtime.imports`). A class is built with the entry's
``options``; a function gets them as keyword arguments of every call. Two call forms are accepted,
told apart by a ``names`` attribute:

TRL's form (no ``names``; one reward column named after the callable, or the entry's ``name``)::

    fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., log_extra=...,
       log_metric=..., **dataset_columns, **options) -> list[float | bool | None]
                                                         | list[dict[str, float | bool | None]]

  called exactly as TRL's ``GRPOTrainer`` calls it: per rollout, ``prompts[i]`` is the prompt as
  the data gave it (the text of a plain-text prompt; the chat messages of a conversational one)
  and ``completions[i]`` the decoded completion (text; ``[{"role": "assistant", "content": text}]``
  for a conversational prompt); ``completion_ids[i]`` its token ids (EOS included); every dataset
  column as a keyword argument holding one value per rollout (the row's own values; the loader's
  bookkeeping columns ``row``, ``prompt_text`` are left out, as TRL leaves out ``prompt``);
  ``trainer_state`` has ``global_step`` (RL steps done) and ``max_steps``; ``log_metric(name,
  value)`` adds ``reward_log/<name>`` (the step's mean) to metrics.jsonl; ``log_extra(column,
  values)`` adds a field per rollout to the rollout files (``logging.rollouts_every``). None or NaN
  abstains; a bool counts as 1.0 / 0.0, as in TRL. An ``async def`` function is awaited (on the
  scorer's one event loop, `gd2po_jax.rewards.scoring`).

  Components: a function that scores several criteria at once returns, per completion, a mapping of
  component name to value (``[{"correct": 1.0, "cites": 0.0}, ...]``; None for a whole rollout, or a
  component's None / NaN, abstains). Each component is a reward column named ``<name>/<component>``
  (``<name>``: the callable's, or the entry's ``name``), or as the entry's ``names`` mapping
  (component -> column) says, with its own weight (``rewards.weights``, or the entry's ``weight`` as a
  mapping component -> weight) and abstentions. The components are fixed by the first call (the trial
  call before compute; or the entry's ``names``): a later call with other keys is a
  `RewardOutputError` naming the function and the keys.

The project's batch interface (a ``names`` attribute: K columns with those names)::

    fn(prompts: list[str], responses: list[str], columns: dict[str, list], **options) -> [N, K]

  as `gd2po_jax.rewards.base.RewardFunction`.

Everything that can be checked before compute is (`load_function`, `check_call`, `trial_call`): a
module that does not import, a missing callable, a signature that cannot take the call, options
that clash with a data column, and, by a trial call on two training rows, a result of the wrong
length or a value that is not a number. Each error is a `RewardFunctionError` (a `ConfigError`,
one line from train.py) naming the entry, its file and what to do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gd2po_jax.config import ConfigError, FunctionEntry, RunConfig
from gd2po_jax.rewards.base import (
    RESPONSE_IDS,
    ROLLOUT_INDEX,
    CombinedReward,
    RewardOutputError,
    check_reward_output,
)
from gd2po_jax.rewards.scoring import RewardError, RewardTimeoutError, call_reward
from gd2po_jax.runtime.imports import ImportPathError, import_object, raised

TRL_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
"""The keyword arguments TRL's GRPOTrainer gives every reward function besides the data columns."""

HIDDEN_COLUMNS = ("prompt", "completion", "completion_ids", "row", "prompt_text", RESPONSE_IDS, ROLLOUT_INDEX)
"""Columns not passed as keyword arguments in TRL's form: TRL leaves out prompt, completion and
completion_ids; row and prompt_text are the loader's bookkeeping; the rollouts' own columns are
passed as ``completion_ids`` or not at all."""

logger = logging.getLogger(__name__)

LOG_METRIC_PREFIX = "reward_log/"
"""metrics.jsonl's prefix of what reward functions report with ``log_metric``."""


class RewardFunctionError(ConfigError):
    """A reward function of ``config.rewards.functions`` that cannot be used; the message names the
    entry (``config.rewards.functions[i]``), its callable and file, and what to do."""


@dataclasses.dataclass
class TrainerState:
    """What TRL's ``trainer_state`` argument offers a reward function: ``global_step``, the RL steps
    done before the rollouts being scored, and ``max_steps``, the run's ``train.num_steps``."""

    global_step: int = 0
    max_steps: int = 0
    epoch: float = 0.0


# ----------------------------------------------------------------------------------------------
# Finding the callable.
# ----------------------------------------------------------------------------------------------


def _entry_label(entry: FunctionEntry) -> str:
    return f"config.rewards.functions[{entry.index}] ({entry.fn!r})"


def resolve_callable(entry: FunctionEntry) -> tuple[Any, str]:
    """(the object ``entry.fn`` names, the file it comes from).

    Raises:
      RewardFunctionError: the module does not import, has no such attribute, or it is not callable.
    """
    try:
        target, source = import_object(entry.fn, _entry_label(entry))
    except ImportPathError as err:
        raise RewardFunctionError(str(err)) from None
    if not callable(target):
        raise RewardFunctionError(
            f"{_entry_label(entry)}: {entry.fn.rpartition(':')[2]!r} in {source} is a "
            f"{type(target).__name__}, not a function or class"
        )
    return target, source


# ----------------------------------------------------------------------------------------------
# Calling it.
# ----------------------------------------------------------------------------------------------


def _is_async(fn: Any) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _callable_name(fn: Any) -> str:
    """TRL's display name of a reward function: a function's ``__name__`` (through functools.partial), else
    the class name of a callable instance."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


class UserRewardFunction:
    """A reward function of ``config.rewards.functions`` behind the project's batch interface
    (`gd2po_jax.rewards.base.RewardFunction`); see the module docstring for the two call forms.

    Attributes:
      names: its reward columns (a property: a TRL-form function's components are fixed by its first
        call).
      label: how errors name it (the entry, the callable, the file).
      on_error: the entry's failure policy (None: ``rewards.on_error``).
      min_values: what on_error=min scores a failed rollout with (None: not declared).
      timeout_s: the entry's limit per call, in seconds (None: only the step's, ``rewards.timeout_s``).
      components: a TRL-form function's components, in column order; () when it returns one value per
        completion; None until its first call says which.
    """

    def __init__(self, entry: FunctionEntry, fn: Any, source: str):
        self.entry, self.fn, self.source = entry, fn, source
        self.trl_form = not hasattr(fn, "names")
        self.label = f"{entry.fn} ({_entry_label(entry).split(' ')[0]}, {source})"
        self.components: tuple[str, ...] | None = None
        if self.trl_form:
            self.base_name = entry.name or _callable_name(fn)
            if entry.names is not None:
                self.components = tuple(entry.names)
        else:
            own = tuple(str(n) for n in fn.names)
            if entry.name is not None and len(own) != 1:
                raise RewardFunctionError(
                    f"{_entry_label(entry)}.name: {entry.fn} gives {len(own)} rewards "
                    f"{own}; 'name' renames one only (rename them in its names, or give the entry's names)"
                )
            if not own:
                raise RewardFunctionError(f"{_entry_label(entry)}: {entry.fn}'s names attribute is empty")
            if entry.names is not None and tuple(entry.names) != own:
                raise RewardFunctionError(
                    f"{_entry_label(entry)}.names: renames {list(entry.names)}, but {entry.fn} gives the rewards "
                    f"{list(own)}; map each of them, in order"
                )
            self._batch_names = (entry.name,) if entry.name is not None else own
        self.on_error = entry.on_error
        self.timeout_s = entry.timeout_s
        self.is_async = _is_async(fn)
        self.state = TrainerState()
        self._lock = threading.Lock()
        self._metric_values: dict[str, list[float]] = {}
        self._extras: dict[str, dict[int, Any]] = {}

    @property
    def names(self) -> tuple[str, ...]:
        """Its reward columns: the batch interface's ``names`` (or the entry's renaming); a TRL-form
        function's name, or one column per component (``<name>/<component>``, or the entry's ``names``)."""
        entry = self.entry
        if not self.trl_form:
            return tuple(entry.names.values()) if entry.names is not None else self._batch_names
        if not self.components:
            return (self.base_name,)
        if entry.names is not None:
            return tuple(entry.names[c] for c in self.components)
        return tuple(f"{self.base_name}/{c}" for c in self.components)

    @property
    def min_values(self) -> tuple[float, ...] | None:
        """What on_error=min scores each column of a failed rollout with: the entry's ``min_value``, else
        the function's own ``min_values``; None when neither is given."""
        if self.entry.min_value is not None:
            return (self.entry.min_value,) * len(self.names)
        declared = getattr(self.fn, "min_values", None)
        return None if declared is None else tuple(float(v) for v in declared)

    def column_weights(self) -> dict[str, float]:
        """w_k of each of its columns, from the entry's ``weight`` (a number for all, or a mapping
        component (or column) -> weight, 1 for those it leaves out; None: 1).

        Raises:
          RewardFunctionError: a mapping that names neither a component nor a column of it.
        """
        weight = self.entry.weight
        if not isinstance(weight, Mapping):
            return {name: 1.0 if weight is None else float(weight) for name in self.names}
        keys = self.components if self.trl_form and self.components else self.names
        unknown = sorted(set(weight) - set(keys) - set(self.names))
        if unknown:
            raise RewardFunctionError(
                f"{_entry_label(self.entry)}.weight: {unknown} {'is' if len(unknown) == 1 else 'are'} not among its "
                f"rewards {list(keys)}; give a weight per component (or one number for all)"
            )
        return {name: float(weight.get(key, weight.get(name, 1.0))) for key, name in zip(keys, self.names)}

    def __repr__(self) -> str:
        return f"UserRewardFunction({self.label})"

    # -- the run's hooks (`gd2po_jax.rewards.base.begin_step`, `reward_step_metrics`, `reward_step_extras`)

    def begin_step(self, step: int, num_steps: int) -> None:
        """Before the rollouts of RL step ``step`` (0-based: steps done) are scored."""
        self.state = TrainerState(global_step=int(step), max_steps=int(num_steps))

    def step_metrics(self) -> dict[str, float]:
        """The means of what the function reported with ``log_metric`` since the last call."""
        with self._lock:
            values, self._metric_values = self._metric_values, {}
        return {LOG_METRIC_PREFIX + name: float(np.mean(v)) for name, v in values.items() if v}

    def step_extras(self) -> dict[str, dict[int, Any]]:
        """What the function gave with ``log_extra`` since the last call: column -> {rollout: value}."""
        with self._lock:
            extras, self._extras = self._extras, {}
        return extras

    # -- the call

    def trl_kwargs(
        self, prompts: Sequence[str], responses: Sequence[str], columns: Mapping[str, Sequence[Any]]
    ) -> dict[str, Any]:
        """The keyword arguments of a TRL-form call on N rollouts (see the module docstring)."""
        n = len(responses)
        prompt_texts = columns.get("prompt_text") or [None] * n
        messages = columns.get("prompt") or [None] * n
        trl_prompts, completions = [], []
        for i in range(n):
            conversational = prompt_texts[i] is None and messages[i] is not None
            trl_prompts.append(
                [dict(m) for m in messages[i]]
                if conversational
                else (prompt_texts[i] if prompt_texts[i] is not None else prompts[i])
            )
            completions.append([{"role": "assistant", "content": responses[i]}] if conversational else responses[i])
        rollouts = list(columns.get(ROLLOUT_INDEX) or range(n))
        kwargs: dict[str, Any] = {name: list(values) for name, values in columns.items() if name not in HIDDEN_COLUMNS}
        kwargs.update(
            prompts=trl_prompts,
            completions=completions,
            completion_ids=[list(ids) for ids in columns.get(RESPONSE_IDS) or [[] for _ in range(n)]],
            trainer_state=self.state,
            log_extra=functools.partial(self._log_extra, rollouts),
            log_metric=self._log_metric,
        )
        kwargs.update(self.entry.options)
        return kwargs

    def _log_extra(self, rollouts: list[int], column: str, values: Sequence[Any]) -> None:
        values = list(values)
        if len(values) != len(rollouts):
            raise ValueError(f"log_extra({column!r}, values): {len(values)} values for {len(rollouts)} completions")
        with self._lock:
            self._extras.setdefault(str(column), {}).update(zip(rollouts, values))

    def _log_metric(self, name: str, value: float) -> None:
        with self._lock:
            self._metric_values.setdefault(str(name), []).append(float(value))

    def _run(self, *args, **kwargs):
        result = self.fn(*args, **kwargs)
        if self.is_async or inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        return result

    def __call__(
        self, prompts: Sequence[str], responses: Sequence[str], columns: Mapping[str, Sequence[Any]]
    ) -> np.ndarray:
        """[N, K] rewards (NaN: abstained), checked: the wrong length or a value that is not a number is
        a `RewardOutputError` naming this function."""
        if not self.trl_form:
            return check_reward_output(
                self, self._run(prompts, responses, columns, **self.entry.options), len(responses)
            )
        return self._trl_values(self._run(**self.trl_kwargs(prompts, responses, columns)), len(responses))

    async def acall(
        self, prompts: Sequence[str], responses: Sequence[str], columns: Mapping[str, Sequence[Any]]
    ) -> np.ndarray:
        """`__call__` on a running event loop (the scorer's): an async function's coroutine is awaited there."""
        if not self.trl_form:
            result = self.fn(prompts, responses, columns, **self.entry.options)
            result = await result if inspect.isawaitable(result) else result
            return check_reward_output(self, result, len(responses))
        result = self.fn(**self.trl_kwargs(prompts, responses, columns))
        return self._trl_values(await result if inspect.isawaitable(result) else result, len(responses))

    def _trl_values(self, values: Any, n: int) -> np.ndarray:
        """A TRL-form result as checked [N, K] rewards: one value (or bool, or None) per completion, or one
        mapping of components per completion (fixing the components on the first call)."""
        if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, (Sequence, np.ndarray)):
            raise RewardOutputError(
                self.label,
                f"returned {type(values).__name__} {values!r:.80}; a reward function "
                "returns a list with one float (or None) per completion",
            )
        values = list(values)
        if len(values) != n:
            raise RewardOutputError(
                self.label,
                f"returned {len(values)} rewards for {n} completions; return one "
                "float (or None to abstain) per completion, in order",
            )
        mapping = next((v for v in values if isinstance(v, Mapping)), None)
        components = self._fix_components(None if mapping is None else tuple(str(k) for k in mapping), values)
        if not components:
            return check_reward_output(self, [[_as_number(v)] for v in values], n)
        rows = []
        for i, value in enumerate(values):
            if value is None:
                rows.append([None] * len(components))
            elif not isinstance(value, Mapping) or set(map(str, value)) != set(components):
                got = f"components {sorted(map(str, value))}" if isinstance(value, Mapping) else repr(value)
                raise RewardOutputError(
                    self.label,
                    f"returned {got:.120} where its first call gave the components {list(components)}; return the "
                    "same components for every completion (None or NaN abstains)",
                    rollout=i,
                )
            else:
                by_name = {str(k): v for k, v in value.items()}
                rows.append([_as_number(by_name[c]) for c in components])
        return check_reward_output(self, rows, n)

    def _fix_components(self, returned: tuple[str, ...] | None, values: list[Any]) -> tuple[str, ...]:
        """The components, fixed by the first call that says which: ``returned`` (a mapping's keys), or
        () when it returned numbers (a result of Nones alone says nothing).

        Raises:
          RewardOutputError: a call returned numbers where the components are fixed, or the reverse.
        """
        with self._lock:
            if self.components is None and (returned is not None or any(v is not None for v in values)):
                if returned is not None and not returned:
                    raise RewardOutputError(self.label, "returned an empty mapping; give at least one component")
                self.components = returned or ()
            fixed = self.components
        if fixed and returned is None and any(v is not None for v in values):
            raise RewardOutputError(
                self.label,
                f"returned one value per completion where its first call gave the components {list(fixed)}; "
                "return the same components on every call",
            )
        if fixed == () and returned is not None:
            raise RewardOutputError(
                self.label,
                f"returned the components {list(returned)} where its first call gave one value per completion; "
                "a function returns the same kind of result on every call",
            )
        return fixed or ()


def _as_number(value: Any) -> Any:
    """A bool as 1.0 / 0.0 (TRL accepts them); any other value as it is (checked by `check_reward_output`)."""
    return float(value) if isinstance(value, (bool, np.bool_)) else value


async def _await(awaitable):
    return await awaitable


def load_function(entry: FunctionEntry) -> UserRewardFunction:
    """The reward function of ``entry``: imported, built (a class with the entry's options) and wrapped.

    Raises:
      RewardFunctionError: see `resolve_callable`; a class whose construction fails.
    """
    target, source = resolve_callable(entry)
    if inspect.isclass(target):
        try:
            target = target(**entry.options)
        except Exception as err:  # noqa: BLE001
            raise RewardFunctionError(
                f"{_entry_label(entry)}: building {entry.fn}(**options) from {source} "
                f"raised {raised(err)}; check the entry's options"
            ) from None
        entry = dataclasses.replace(entry, options={})
    return UserRewardFunction(entry, target, source)


# ----------------------------------------------------------------------------------------------
# Checks before compute.
# ----------------------------------------------------------------------------------------------


def _signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: its call decides
        return None


def check_call(function: UserRewardFunction, columns: Sequence[str]) -> None:
    """Whether ``function`` can take the call it will get, given the data's column names.

    Raises:
      RewardFunctionError: naming the entry, the file, the parameter at fault and what to do.
    """
    entry, label = function.entry, f"{_entry_label(function.entry)} in {function.source}"
    clash = sorted(set(entry.options) & (set(columns) - set(HIDDEN_COLUMNS) | set(TRL_ARGUMENTS)))
    if function.trl_form and clash:
        raise RewardFunctionError(
            f"{label}: options {clash} have the names of the call's own arguments or data columns; rename the options"
        )
    signature = _signature(function.fn)
    if signature is None:
        return
    if function.trl_form:
        names = set(TRL_ARGUMENTS) | {c for c in columns if c not in HIDDEN_COLUMNS} | set(entry.options)
        call = (
            "TRL's call fn(prompts=, completions=, completion_ids=, trainer_state=, log_extra=, log_metric=, "
            "**dataset columns)"
        )
        try:
            signature.bind(**{name: None for name in names})
        except TypeError as err:
            accepts_kwargs = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
            advice = (
                "give its other parameters defaults"
                if accepts_kwargs
                else "add **kwargs to its parameters (TRL passes every data column as a keyword argument)"
            )
            raise RewardFunctionError(
                f"{label}: {_callable_name(function.fn)}{signature} cannot take {call}: {err}; {advice}"
            ) from None
    else:
        try:
            signature.bind([], [], {}, **entry.options)
        except TypeError as err:
            raise RewardFunctionError(
                f"{label}: {_callable_name(function.fn)}{signature} cannot take the batch "
                f"call fn(prompts, responses, columns, **options): {err}"
            ) from None


def trial_call(
    function: UserRewardFunction,
    prompts: Sequence[str],
    columns: Mapping[str, Sequence[Any]],
    *,
    on_error: str,
    timeout_s: float = 0.0,
    num_rows: int = 2,
) -> None:
    """Call ``function`` on the first ``num_rows`` training rows before compute, with each row's
    ``target`` (or an empty completion) as the completion, so that a result of the wrong length or
    a value that is not a number stops the run now, not after the model is loaded. The call is made
    as the step's scoring makes it, under the same deadlines (``timeout_s``: ``rewards.timeout_s``;
    the entry's own ``timeout_s``); it fixes a TRL-form function's components.

    A function that raises (or gives no result in time) stops the run only when its failures would
    (``on_error`` 'raise'): an empty completion can be sampled too. on_error='min' for a function with
    no minimum stops it whatever the call gives.

    Raises:
      RewardFunctionError: naming the entry, the file and the problem.
    """
    label = f"{_entry_label(function.entry)} in {function.source}"
    policy = function.on_error or on_error
    if policy == "min" and function.min_values is None:
        where = "its on_error" if function.on_error else "config.rewards.on_error"
        raise RewardFunctionError(
            f"{label}: {where}='min' scores a failed rollout with the function's minimum, and it declares none: "
            "give the entry a min_value ({'fn': ..., 'on_error': 'min', 'min_value': 0.0}), or use on_error "
            "'abstain' (failed rollouts left unscored) or 'raise'"
        )
    n = min(num_rows, len(prompts))
    if not n:
        return
    rows = {name: list(values[:n]) for name, values in columns.items()}
    targets = rows.get("target") or [None] * n
    responses = [t if isinstance(t, str) else "" for t in targets]
    rows.setdefault(RESPONSE_IDS, [[] for _ in range(n)])
    rows[ROLLOUT_INDEX] = list(range(n))
    trial = f"a trial call with the first {n} training rows (completions: their targets, or empty)"
    try:
        call_reward(function, list(prompts[:n]), responses, rows, timeout_s=timeout_s)
    except RewardOutputError as err:
        raise RewardFunctionError(f"{label}: on a trial call with the first {n} training rows: {err.problem}") from None
    except RewardTimeoutError:
        own = function.timeout_s
        limit = (
            f"its timeout_s={own:g} s"
            if own and (not timeout_s or own < timeout_s)
            else f"config.rewards.timeout_s={timeout_s:g} s"
        )
        message = f"{label}: {trial} gave no result within {limit} (the call is abandoned)"
        if policy == "raise":
            raise RewardFunctionError(
                f"{message}; fix the function (does it wait on something that never comes?), or raise the timeout"
            ) from None
        logger.warning("%s; its rollouts fail (on_error=%r) while it hangs", message, policy)
    except RewardError as err:  # a BaseException that is not an Exception: SystemExit, KeyboardInterrupt ...
        raise RewardFunctionError(f"{label}: {trial}: {err}") from None
    except Exception as err:  # noqa: BLE001
        if policy == "raise":
            raise RewardFunctionError(
                f"{label}: {trial} raised {raised(err)}; fix the function, or set the entry's on_error "
                "('abstain', or 'min' with a min_value)"
            ) from None
    finally:
        function.step_metrics()
        function.step_extras()


def user_functions(reward_fn) -> tuple[UserRewardFunction, ...]:
    """The functions of ``config.rewards.functions`` in the run's reward function."""
    functions = reward_fn.functions if isinstance(reward_fn, CombinedReward) else (reward_fn,)
    return tuple(fn for fn in functions if isinstance(fn, UserRewardFunction))


def run_reward_weights(config: RunConfig, reward_fn) -> tuple[float, ...]:
    """w_k of each of the run's K reward columns: ``rewards.weights`` when given, else each function
    entry's ``weight`` (default 1) and 1 for the family's rewards; () when all are 1 (the official
    unweighted sum, computed as such).

    Raises:
      ConfigError: ``rewards.weights`` has not one entry per column (naming the columns).
    """
    names = tuple(reward_fn.names)
    if config.rewards.weights:
        if len(config.rewards.weights) != len(names):
            raise ConfigError(
                f"config.rewards.weights: {len(config.rewards.weights)} weights for the run's "
                f"{len(names)} reward columns {names} (the family's, then rewards.functions')"
            )
        return tuple(float(w) for w in config.rewards.weights)
    weights = {}
    for fn in user_functions(reward_fn):
        weights.update(fn.column_weights())
    per_column = tuple(weights.get(name, 1.0) for name in names)
    return () if all(w == 1.0 for w in per_column) else per_column
