"""Objects of your own, named by import path in the config (``rewards.functions``, ``task``).

A path is ``module:attribute`` (a module importable from the working directory, as with
``python -m``, or from ``sys.path``) or ``path/to/file.py:attribute`` (the file is imported once per
process, and its directory joins ``sys.path`` so that it may import its neighbours); a dotted
attribute (``module:Class.method``) is looked up part by part. Every failure is an `ImportPathError`
(a `ConfigError`: one line from the entry points) that names the config entry, the file and what to do.

Code named by a config the user did not give (a workdir's ``config.json`` read by eval.py or export.py)
is imported only when the user trusts it: within `importing_only`, `import_object` refuses every
other path (`UntrustedCodeError`), as transformers refuses a model config's code without
``trust_remote_code=True``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import pathlib
import sys
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec

from gd2po_jax.config import ConfigError

USER_MODULE_PREFIX = "gd2po_user."
"""The ``sys.modules`` names of files imported by path."""


class ImportPathError(ConfigError):
    """An import path in the config that cannot be followed; the message starts with the entry."""


class UntrustedCodeError(ImportPathError):
    """Code named by a config the user did not give, refused (`importing_only`); the message names
    it and the flag that trusts it."""


_TRUST: list[tuple[frozenset[str], str, str]] = []
"""The `importing_only` scopes in force: (the paths allowed, where the config came from, how to trust it)."""


@contextlib.contextmanager
def importing_only(allowed: Collection[str], source: str, how_to_trust: str) -> Iterator[None]:
    """Within: `import_object` imports only the import paths in ``allowed`` and refuses any other
    with an `UntrustedCodeError` naming it, ``source`` (the file that names it) and ``how_to_trust``
    (e.g. "pass --trust_workdir_code"). Nothing is imported or run for a refused path."""
    _TRUST.append((frozenset(p.strip() for p in allowed), source, how_to_trust))
    try:
        yield
    finally:
        _TRUST.pop()


def untrusted_message(paths: Collection[str], source: str, how_to_trust: str) -> str:
    """The one line that refuses to import ``paths`` named in ``source``."""
    return (
        f"{source} names code that would be imported and run: {', '.join(paths)}; not importing it: "
        f"{how_to_trust} if you trust {source} (it runs with your permissions)"
    )


def _check_trusted(path: str, label: str) -> None:
    for allowed, source, how_to_trust in _TRUST:
        if path.strip() not in allowed:
            raise UntrustedCodeError(f"{label}: {untrusted_message([path.strip()], source, how_to_trust)}")


def is_import_path(text: str) -> bool:
    """Whether ``text`` looks like ``module:attribute`` or ``path/to/file.py:attribute``."""
    location, colon, attribute = text.rpartition(":")
    return bool(colon and location.strip() and attribute.strip())


def raised(err: BaseException) -> str:
    """``Type: first line of the message (file, line N)``: an exception raised in user code, in one line."""
    frames = inspect.getinnerframes(err.__traceback__) if err.__traceback__ else []
    where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    message = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {message}{where}" if message else f"{type(err).__name__}{where}"


def _import_file(path: pathlib.Path, label: str):
    path = path.resolve()
    name = USER_MODULE_PREFIX + "_".join(path.with_suffix("").parts[-3:]).replace("-", "_").replace(".", "_")
    if name in sys.modules:
        return sys.modules[name]
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    # (None for a file of no known suffix: module_from_spec raises then, as it always did)
    spec = cast("ModuleSpec", importlib.util.spec_from_file_location(name, path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        cast("Loader", spec.loader).exec_module(module)
    except BaseException as err:  # noqa: BLE001 - any failure of the user's module is reported
        del sys.modules[name]
        raise ImportPathError(f"{label}: importing {path} raised {raised(err)}; fix the file") from None
    return module


def _import_module(module_name: str, attribute: str, label: str):
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # as `python -m` and `python script.py` from the working directory
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and (module_name == err.name or module_name.startswith(err.name + ".")):
            raise ImportPathError(
                f"{label}: cannot import module {module_name!r} (no {err.name.replace('.', '/')}.py in {cwd} or on "
                f"sys.path); run from the directory that holds it, or give the file's path: "
                f"path/to/{module_name.replace('.', '/')}.py:{attribute}"
            ) from None
        raise ImportPathError(
            f"{label}: importing module {module_name!r} raised {raised(err)}; install what it "
            "imports, or fix the module"
        ) from None
    except BaseException as err:  # noqa: BLE001
        raise ImportPathError(
            f"{label}: importing module {module_name!r} raised {raised(err)}; fix the module"
        ) from None


def module_file(module) -> str:
    """The file a module was imported from (its name when it has none)."""
    return getattr(module, "__file__", None) or module.__name__


def import_object(path: str, label: str) -> tuple[Any, str]:
    """(the object ``path`` names, the file it comes from).

    Args:
      path: ``module:attribute`` or ``path/to/file.py:attribute``.
      label: how errors name the entry, e.g. ``config.rewards.functions[0] ('my_rewards:brevity')``.

    Raises:
      UntrustedCodeError: within `importing_only`, a path it does not allow (nothing is imported).
      ImportPathError: not an import path, a file that does not exist, a module that does not import
        (naming the exception and its line), or no such attribute (naming what the module defines).
    """
    if not is_import_path(path):
        raise ImportPathError(f"{label}: {path!r} is not module:attribute or path/to/file.py:attribute")
    _check_trusted(path, label)
    location, _, attribute = path.rpartition(":")
    location, attribute = location.strip(), attribute.strip()
    if location.endswith(".py") or "/" in location or os.sep in location:
        file = pathlib.Path(location).expanduser()
        if not file.is_file():
            raise ImportPathError(
                f"{label}: no file {file.resolve()}; give an existing path/to/file.py:{attribute}, "
                f"or module:{attribute}"
            )
        module = _import_file(file, label)
    else:
        module = _import_module(location, attribute, label)
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            defined = sorted(
                n
                for n, v in vars(module).items()
                if not n.startswith("_")
                and (inspect.isfunction(v) or inspect.isclass(v))
                and getattr(v, "__module__", None) == module.__name__
            )
            raise ImportPathError(
                f"{label}: {module_file(module)} has no {attribute!r}; it defines "
                f"{', '.join(defined) or 'no functions or classes'}"
            )
        target = getattr(target, part)
    return target, module_file(module)
