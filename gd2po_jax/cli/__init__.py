"""The command line: what the entry points share (the ``--config`` flag, argument checks, logging
setup, how a command starts), and one module per command: `gd2po_jax.cli.train`, ``eval``,
``sweep``, ``report`` and ``export`` hold each command's flags and ``main``. The scripts at the
repository's root (``python train.py`` ...) and the console scripts of an install (``gd2po-train``
...: pyproject.toml) both call a module's ``run``.

Flags are defined when a command starts (``run``), not when its module is imported, so that every
module of the package imports into one process (the commands share flag names such as
``--workdir``).

``--config=FILE[:ARG]`` names a configs/*.py file and ``--config.SECTION.FIELD=VALUE`` overrides one
of its fields (ml_collections' config flags). A tuple-valued field takes a comma-separated list::

    --config.rewards.names=correctness,length          # ('correctness', 'length')
    --config.rewards.weights=1,0.5                     # (1, 0.5)
    --config.rewards.weights=                          # () (empty)
    --config.rewards.names=correctness --config.rewards.names=length    # repeated: appended

and, as before, a Python literal (``"('correctness', 'length')"``, ``[1, 0.5]``), which is how to
pass an element that contains a comma.
"""

from __future__ import annotations

import ast
import logging
import pathlib
import sys
from typing import Any, Callable

from absl import app
from ml_collections import config_flags
from ml_collections.config_flags import tuple_parser

_NOISY_LOGGERS = ("absl", "jax", "orbax", "datasets", "httpx", "urllib3")
_SCALARS = (str, int, float, bool, type(None))


def start(argv) -> None:
    """Reject positional arguments and log INFO from our modules, WARNING from the libraries."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _element(text: str) -> Any:
    """One element of a comma-separated list: a Python number, bool or quoted string if it reads as
    one, else the text itself (``correctness`` -> 'correctness', ``0.5`` -> 0.5)."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return value if isinstance(value, _SCALARS) else text


def parse_sequence(text: str) -> tuple:
    """The tuple a command-line value stands for.

    A Python literal keeps its meaning (``"('a', 'b')"``, ``[1, 2]``, ``'a'``, ``1.5``); otherwise
    the text is a comma-separated list, optionally in brackets, whose bare words are strings
    (``a,b``, ``(a, b)``, ``a,`` -> ('a', 'b'), ('a', 'b'), ('a',)). An empty value is ().

    Raises:
      ValueError: for an empty element in the middle of a list (``a,,b``).
    """
    stripped = text.strip()
    if not stripped:
        return ()
    try:
        value = ast.literal_eval(stripped)
    except (ValueError, SyntaxError):
        pass
    else:
        return tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if stripped[:1] + stripped[-1:] in ("()", "[]"):
        stripped = stripped[1:-1]
    parts = [part.strip() for part in stripped.split(",")]
    if len(parts) > 1 and not parts[-1]:
        parts.pop()  # a trailing comma, as in Python: "a," is ('a',)
    if not all(parts):
        raise ValueError(f"{text!r} has an empty element; write a comma-separated list such as a,b")
    return tuple(_element(part) for part in parts)


class ListParser(tuple_parser.TupleParser):
    """ml_collections' parser of tuple-valued config fields, reading ``a,b`` as ('a', 'b') (its own
    reads it as the one string 'a,b'); see `parse_sequence`."""

    def parse(self, argument):
        return parse_sequence(argument) if isinstance(argument, str) else super().parse(argument)


DEFAULT_CONFIG_FILE = "configs/default.py"  # the --config default of train.py and sweep.py


def default_config_file(relative: str = DEFAULT_CONFIG_FILE) -> str:
    """The ``--config`` default: ``relative`` (configs/default.py) where the working directory has it
    (a checkout's root: as before), else the copy installed with the package (pyproject.toml installs
    the repository's configs/ as gd2po_jax/configs), else the repository's configs/ next to the
    package (a checkout or an editable install, run from another directory), else ``relative``
    itself (loading it then fails, naming it). So ``gd2po-train --workdir=DIR`` runs the embedded
    default from any directory."""
    if pathlib.Path(relative).is_file():
        return relative
    name = pathlib.PurePath(relative).name
    package = pathlib.Path(__file__).resolve().parents[1]  # gd2po_jax/
    for candidate in (package / "configs" / name, package.parent / "configs" / name):
        if candidate.is_file():
            return str(candidate)
    return relative


def main_module_name() -> str:
    """The module name under which absl's ``--help`` lists the running program's flags: the script's
    path as run (``train.py``; a console script's path), ``sys.argv[0]``. A command's flags are
    defined in gd2po_jax/cli/<command>.py under this name (``module_name=``), so that ``--help``
    shows them as it did when the root scripts defined them."""
    return sys.argv[0]


def run(doc: str | None, define_flags: Callable[[], None], main: Callable[[list[str]], Any]) -> None:
    """Start a command: define its flags, then ``absl.app.run(main)`` (parses argv, exits with main's
    status). absl's ``--help`` prints the ``__main__`` module's docstring: a console script's
    wrapper (and a root script) has none, so it gets ``doc``, the command module's."""
    main_module = sys.modules.get("__main__")
    if main_module is not None and not main_module.__doc__:
        main_module.__doc__ = doc
    define_flags()
    app.run(main)


def define_config_flag(name: str = "config", default: str | None = "configs/default.py",
                       help_string: str = "Training config file (configs/*.py[:ARG]).", **kwargs):
    """``config_flags.DEFINE_config_file`` (locked config), with tuple fields parsed by `ListParser`.

    Args:
      name, default, help_string: of the flag.
      **kwargs: passed on (``flag_values=``, ``sys_argv=`` ... for parsing an argv list in tests).

    Returns:
      The flag holder; after parsing, ``FLAGS.config`` is the ConfigDict with the overrides applied.
    """
    config_flags.register_flag_parser_for_type(tuple, ListParser())
    kwargs.setdefault("lock_config", True)
    return config_flags.DEFINE_config_file(name, default, help_string, **kwargs)


def default_workdir(config_flag) -> str:
    """``runs/<config file name>`` of a parsed ``--config`` flag (``runs/default`` for
    configs/default.py, ``runs/safety_embedded`` for configs/safety_embedded.py), so that two
    configs run with their default workdirs do not meet in one."""
    filename = config_flags.get_config_filename(config_flag).split(":", 1)[0]
    return str(pathlib.Path("runs") / pathlib.Path(filename).stem)


__all__ = ["DEFAULT_CONFIG_FILE", "ListParser", "default_config_file", "default_workdir", "define_config_flag",
           "main_module_name", "parse_sequence", "run", "start"]
