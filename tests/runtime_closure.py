"""What an install of requirements.txt alone provides: the distributions it names with everything they
declare (unconditional requirements and those whose environment markers hold here; extras are not
installed by a plain requirement), read from the installed packages' metadata, and the top-level
modules those distributions put on the path.

Used by tests/test_requirements.py (every third-party import of the package is provided) and by
tests/runtime_install/sitecustomize.py (a subprocess of the suite cannot import what a user's venv
would not have: torch, pytest, peft, ...).
"""

from __future__ import annotations

import functools
import importlib.metadata
import pathlib

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parent.parent

# Every venv that `python3 -m venv` makes has these, whatever requirements.txt says.
VENV_BASE = ("pip", "setuptools")


def requirement_names(path: pathlib.Path) -> list[str]:
    """The canonical names of the distributions ``path`` requires, following ``-r other.txt`` lines."""
    names = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith(("-r ", "--requirement ")):
            names += requirement_names(path.parent / line.split(None, 1)[1])
        elif not line.startswith("-"):
            names.append(canonicalize_name(Requirement(line).name))
    return names


def _declared_requirements(name: str) -> list[str]:
    """The canonical names ``name``'s installed metadata requires without an extra, markers evaluated."""
    try:
        declared = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    out = []
    for text in declared:
        requirement = Requirement(text)
        if requirement.marker is not None:
            try:
                if not requirement.marker.evaluate({"extra": ""}):
                    continue
            except UndefinedEnvironmentName:
                continue
        out.append(canonicalize_name(requirement.name))
    return out


@functools.cache
def closure(requirements_file: str = "requirements.txt") -> frozenset[str]:
    """The canonical names of every distribution an install of ``requirements_file`` brings in."""
    seen: set[str] = set()
    todo = [*requirement_names(REPO / requirements_file), *VENV_BASE]
    while todo:
        name = canonicalize_name(todo.pop())
        if name not in seen:
            seen.add(name)
            todo += _declared_requirements(name)
    return frozenset(seen)


@functools.cache
def module_distributions() -> dict[str, frozenset[str]]:
    """top-level module name -> the canonical names of the installed distributions that provide it."""
    return {module: frozenset(map(canonicalize_name, dists))
            for module, dists in importlib.metadata.packages_distributions().items()}


def provided(module: str, requirements_file: str = "requirements.txt") -> bool:
    """Whether an install of ``requirements_file`` provides the top-level module ``module``."""
    return bool(module_distributions().get(module, frozenset()) & closure(requirements_file))


def modules_only_for_tests() -> list[str]:
    """Top-level modules that requirements-test.txt installs and requirements.txt does not provide."""
    runtime = closure("requirements.txt")
    test_only = closure("requirements-test.txt") - runtime
    return sorted(module for module, dists in module_distributions().items()
                  if dists & test_only and not dists & runtime)
