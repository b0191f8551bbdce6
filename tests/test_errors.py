"""gd2po_jax/errors.py and the commands' one place that catches it (gd2po_jax.cli.user_errors)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import gd2po_jax
from gd2po_jax import cli
from gd2po_jax.errors import USER_ERROR_EXIT_CODE, UserError

INTERNAL = {"gd2po_jax.data.schema.FieldError", "gd2po_jax.rewards.scoring._TimedOut"}
"""Exceptions that never reach a command: caught and re-raised as a `UserError` naming the row/function."""


def package_exceptions() -> dict[str, type[BaseException]]:
    """'module.Class' -> class, for every exception class the package defines."""
    found = {}
    for module_info in pkgutil.walk_packages(gd2po_jax.__path__, "gd2po_jax."):
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_error_of_the_package_is_a_user_error():
    exceptions = package_exceptions()
    assert {"gd2po_jax.config.base.ConfigError", "gd2po_jax.runtime.run_dir.RunDirError"} <= set(exceptions)
    # Preempted ends a run on a signal (its own exit code, docs/preemption.md), not an error.
    others = sorted(name for name, cls in exceptions.items()
                    if not issubclass(cls, UserError) and name not in INTERNAL and not name.endswith(".Preempted"))
    assert others == [], f"derive these from gd2po_jax.errors.UserError (or list them as INTERNAL): {others}"


def test_user_errors_prints_one_line_and_exits_2(capsys):
    class Broken(UserError, ValueError):
        pass

    with pytest.raises(SystemExit) as stopped, cli.user_errors("train.py"):
        raise Broken("config.rl.snr_tau: must be in [0.0, 1.0],\n got 1.5")
    assert stopped.value.code == USER_ERROR_EXIT_CODE == 2
    assert capsys.readouterr().err == "train.py: config.rl.snr_tau: must be in [0.0, 1.0], got 1.5\n"


def test_user_errors_lets_a_bug_keep_its_traceback():
    with pytest.raises(KeyError), cli.user_errors("train.py"):
        raise KeyError("a bug")
