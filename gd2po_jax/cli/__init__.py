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

May import: errors, config, runtime, models, data, rewards, training, tasks, rl, sft, evaluation, jobs, experiments.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import logging
import pathlib
import re
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Callable, NoReturn, cast

from absl import app, flags
from ml_collections import config_flags
from ml_collections.config_flags import tuple_parser

from gd2po_jax.config.rl import TRL_CONFIG_NAMES, TRL_FIELD_ALIASES
from gd2po_jax.errors import USER_ERROR_EXIT_CODE, UserError

if TYPE_CHECKING:
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec

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


def sibling_config(config_file: str, name: str):
    """The config module ``name`` (e.g. "default") in the directory of ``config_file`` (a config's
    ``__file__``), loaded by path: how configs/*.py find configs/default.py when the repository's
    root is not on sys.path (``gd2po-train --config=/path/to/configs/files.py`` from elsewhere)."""
    path = pathlib.Path(config_file).resolve().with_name(f"{name}.py")
    spec = cast("ModuleSpec", importlib.util.spec_from_file_location(f"gd2po_jax_config_{name}", path))  # a .py
    module = importlib.util.module_from_spec(spec)
    cast("Loader", spec.loader).exec_module(module)
    return module


def main_module_name() -> str:
    """The module name under which absl's ``--help`` lists the running program's flags: the script's
    path as run (``train.py``; a console script's path), ``sys.argv[0]``. A command's flags are
    defined in gd2po_jax/cli/<command>.py under this name (``module_name=``), so that ``--help``
    shows them as it did when the root scripts defined them."""
    return sys.argv[0]


def exit_user_error(program: str, message: str) -> NoReturn:
    """Print ``program: message`` on one line to standard error and exit with `USER_ERROR_EXIT_CODE`."""
    print(f"{program}: {message}", file=sys.stderr, flush=True)
    raise SystemExit(USER_ERROR_EXIT_CODE)


@contextlib.contextmanager
def user_errors(program: str) -> Iterator[None]:
    """Where every command catches the errors a user can fix (`gd2po_jax.errors.UserError`): one line,
    ``<program>: <message>``, and exit code 2. Other exceptions (bugs) keep their traceback."""
    try:
        yield
    except UserError as error:
        exit_user_error(program, one_line(error))


def one_line(error: BaseException) -> str:
    """``str(error)`` on one line (a user's exception message may hold newlines)."""
    return " ".join(part.strip() for part in str(error).splitlines() if part.strip()) or type(error).__name__


def _quoted(text: str) -> list[str]:
    return re.findall(r"[\"']([^\"'\s]+)[\"']", text)


def override_error_message(argv: Sequence[str], error: BaseException) -> str:
    """One line for an exception from applying ``--config.FIELD=VALUE`` overrides: the flag at fault
    (found by the field the error names) and ml_collections' "Did you mean" suggestion, if any."""
    text = str(error).replace("\\n", "\n")
    suggestion = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text)
    key = suggestion.group(2) if suggestion else next(iter(_quoted(text)), None)
    overrides = [arg for arg in argv[1:] if re.match(r"--\w+\.", arg)]
    culprit = next((arg for arg in overrides if key and key in re.split(r"[.=]", arg.split("=", 1)[0])), None)
    if culprit and key:
        parts = culprit.split("=", 1)[0].lstrip("-").split(".")
        parent = ".".join(parts[: parts.index(key)]) if key in parts[1:] else ".".join(parts[:-1])
        hint = f"; did you mean {suggestion.group(1)!r}?" if suggestion else ""
        if key in TRL_CONFIG_NAMES:  # TRL's name: its equal here, not the nearest spelling
            hint = f"; TRL's {key} is --config.{TRL_CONFIG_NAMES[key]} here"
        return f"{culprit}: {parent} has no field {key!r}{hint} (the fields are those of the --config file)"
    detail = " ".join(line.strip() for line in text.splitlines() if line.strip())
    where = f" ({', '.join(overrides)})" if overrides else ""
    return f"cannot apply the command line's config overrides{where}: {type(error).__name__}: {detail}"


def trl_aliases(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--<config>.rl.<TRL name>=`` of `TRL_FIELD_ALIASES` as the field it sets
    (``--config.rl.num_iterations=2`` -> ``--config.rl.ppo_epochs=2``)."""
    out = []
    for arg in argv:
        match = re.match(r"^(--\w+\.rl\.)(\w+)(=.*)?$", arg)
        if match and match.group(2) in TRL_FIELD_ALIASES:
            arg = match.group(1) + TRL_FIELD_ALIASES[match.group(2)] + (match.group(3) or "")
        out.append(arg)
    return out


def parse_flags(argv: Sequence[str]) -> list[str]:
    """absl's flag parsing (``app.run``'s ``flags_parser``), with one line instead of a traceback for
    a ``--config.FIELD=VALUE`` that names no field (``--config.rl.algoritm=gdpo``): ml_collections
    raises an AttributeError with a "Did you mean" suggestion, which absl does not catch."""
    program = pathlib.Path(argv[0]).name if argv else "gd2po"
    with _overrides_in_one_line(argv):
        try:
            remaining = flags.FLAGS(trl_aliases(argv))
        except flags.Error as error:  # what absl's own parser reports (a bad value, an unknown flag)
            exit_user_error(program, config_file_error(str(error)) or f"{one_line(error)} (--helpfull lists the flags)")
    for name in _CONFIG_FLAGS:  # a config file that does not load fails when its value is first read
        try:
            cast(Any, flags.FLAGS[name].value).to_dict()  # a ConfigDict: a config flag's value
        except OSError as error:
            message = " ".join(line.strip() for line in str(error).splitlines()[1:] if line.strip())
            exit_user_error(
                program,
                f"--{name}={config_flags.get_config_filename(flags.FLAGS[name])}: cannot load "
                f"the config file ({message})",
            )
        except KeyError:
            pass  # not defined by this command
    return remaining


def config_file_error(text: str) -> str | None:
    """One line for a config file whose ``get_config`` raised a TypeError or ValueError (a
    `gd2po_jax.errors.UserError` such as configs/resolved.py's errors in a run's config.json):
    ml_collections puts the whole traceback into the flag's error; this keeps the flag and the
    exception's own message. None for any other flag error."""
    flag, marker, trace = text.partition("Error whilst parsing config file:")
    lines = [line.strip() for line in trace.splitlines() if line.strip()]
    if not marker or not lines:
        return None
    last = re.sub(r"^[\w.]+(Error|Exception): ", "", lines[-1])  # "gd2po_jax.config.base.ConfigError: ..."
    where = flag.strip().removeprefix("flag ").rstrip(":")
    return f"{where}: {last}"


_CONFIG_FLAGS: list[str] = []
"""The config flags `define_config_flag` defined, checked after parsing."""


class _overrides_in_one_line:  # noqa: N801 - a context manager used as a statement
    """Turn an exception of ml_collections applying ``--config.FIELD=VALUE`` overrides into a one-line
    `SystemExit` (`override_error_message`); they are applied when the flag is defined (from sys.argv)
    and again when argv is parsed."""

    def __init__(self, argv: Sequence[str]):
        self.argv = list(argv)

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if isinstance(error, (AttributeError, KeyError, TypeError, ValueError, flags.Error)):
            program = pathlib.Path(self.argv[0]).name if self.argv else "gd2po"
            exit_user_error(program, override_error_message(self.argv, error))
        return False


def run(doc: str | None, define_flags: Callable[[], None], main: Callable[[list[str]], Any]) -> None:
    """Start a command: define its flags, then ``absl.app.run(main)`` (parses argv with `parse_flags`,
    exits with main's status). absl's ``--help`` prints the ``__main__`` module's docstring: a console
    script's wrapper (and a root script) has none, so it gets ``doc``, the command module's."""
    main_module = sys.modules.get("__main__")
    if main_module is not None and not main_module.__doc__:
        main_module.__doc__ = doc
    sys.argv[:] = trl_aliases(sys.argv)  # config_flags reads sys.argv when the flag is defined
    with _overrides_in_one_line(sys.argv):
        define_flags()
    app.run(main, flags_parser=parse_flags)


def define_config_flag(
    name: str = "config",
    default: str | None = "configs/default.py",
    help_string: str = "Training config file (configs/*.py[:ARG]).",
    **kwargs,
):
    """``config_flags.DEFINE_config_file`` (locked config), with tuple fields parsed by `ListParser`.

    Args:
      name, default, help_string: of the flag.
      **kwargs: passed on (``flag_values=``, ``sys_argv=`` ... for parsing an argv list in tests).

    Returns:
      The flag holder; after parsing, ``FLAGS.config`` is the ConfigDict with the overrides applied.
    """
    config_flags.register_flag_parser_for_type(tuple, ListParser())
    kwargs.setdefault("lock_config", True)
    if name not in _CONFIG_FLAGS:
        _CONFIG_FLAGS.append(name)
    return config_flags.DEFINE_config_file(name, default, help_string, **kwargs)


def default_workdir(config_flag) -> str:
    """``runs/<config file name>`` of a parsed ``--config`` flag (``runs/default`` for
    configs/default.py, ``runs/safety_embedded`` for configs/safety_embedded.py), so that two
    configs run with their default workdirs do not meet in one."""
    filename = config_flags.get_config_filename(config_flag).split(":", 1)[0]
    return str(pathlib.Path("runs") / pathlib.Path(filename).stem)


__all__ = [
    "DEFAULT_CONFIG_FILE",
    "ListParser",
    "default_config_file",
    "default_workdir",
    "define_config_flag",
    "main_module_name",
    "one_line",
    "override_error_message",
    "parse_flags",
    "parse_sequence",
    "run",
    "sibling_config",
    "start",
]
