"""The package as pyproject.toml installs it: dependency ranges against the pinned requirements
files, the sub-packages it lists, the console scripts against the root scripts, and where the
``--config`` default is found. (.ci/check_install installs it and runs the console scripts.)"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gd2po_jax import cli
from tests.fakes import REPO, subprocess_env
from tests.xla_env import xla_flags

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
ROOT_SCRIPTS = {"train.py": "gd2po-train", "eval.py": "gd2po-eval", "sweep.py": "gd2po-sweep",
                "report.py": "gd2po-report", "export.py": "gd2po-export"}


def pins(path: pathlib.Path) -> dict[str, str]:
    """name -> version of the ``name==version`` lines of a requirements file (not those it includes
    with ``-r``)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        requirement = Requirement(line)
        (specifier,) = requirement.specifier  # one exact pin per line
        assert specifier.operator == "==", f"{path.name}: {line!r} is not an exact pin"
        out[canonicalize_name(requirement.name)] = specifier.version
    return out


def ranges(requirements: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in map(Requirement, requirements)}


@pytest.mark.parametrize("requirements_file, declared", [
    ("requirements.txt", PYPROJECT["project"]["dependencies"]),
    ("requirements-test.txt", PYPROJECT["project"]["optional-dependencies"]["test"]),
])
def test_every_pin_is_declared_and_lies_in_its_range(requirements_file, declared):
    """requirements*.txt pin the set CI installs; pyproject.toml declares the supported ranges: the same
    packages, every pin inside its range, and every range bounded above (a major version)."""
    pinned, supported = pins(REPO / requirements_file), ranges(declared)
    assert sorted(pinned) == sorted(supported), (
        f"only pinned in {requirements_file}: {sorted(set(pinned) - set(supported))}; "
        f"only declared in pyproject.toml: {sorted(set(supported) - set(pinned))}")
    outside = {name: f"{version} not in {supported[name].specifier}" for name, version in pinned.items()
               if not supported[name].specifier.contains(version, prereleases=True)}
    assert not outside
    unbounded = [str(r) for r in supported.values() if not any(s.operator == "<" for s in r.specifier)]
    assert not unbounded, f"no upper bound: {unbounded}"


def test_the_optional_extras_are_bounded_above():
    """Every extra (test, wandb) gives each package a range with an upper bound (a major version)."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {"test", "wandb"} <= set(extras)
    unbounded = [f"{extra}: {r}" for extra, requirements in extras.items() for r in ranges(requirements).values()
                 if not any(s.operator == "<" for s in r.specifier)]
    assert not unbounded, f"no upper bound: {unbounded}"


def test_jax_and_jaxlib_share_their_range():
    supported = ranges(PYPROJECT["project"]["dependencies"])
    assert supported["jax"].specifier == supported["jaxlib"].specifier


def test_every_sub_package_is_installed():
    """pyproject.toml lists the packages (configs/ is installed as gd2po_jax.configs): a new
    sub-package must be added there, or an install lacks it."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    on_disk = {".".join(path.parent.relative_to(REPO).parts) for path in (REPO / "gd2po_jax").rglob("__init__.py")}
    listed = set(setuptools["packages"])
    assert on_disk <= listed, f"not in pyproject.toml's packages: {sorted(on_disk - listed)}"
    mapped = setuptools["package-dir"]
    assert listed - on_disk == set(mapped) == {"gd2po_jax.configs"}
    assert (REPO / mapped["gd2po_jax.configs"] / "default.py").is_file()


def test_the_console_scripts_run_the_root_scripts_code():
    """Each root script calls ``gd2po_jax.cli.<command>.run``, the function its console script names;
    all the commands import into one process (their flags are defined when they start)."""
    scripts = PYPROJECT["project"]["scripts"]
    assert sorted(scripts) == sorted(ROOT_SCRIPTS.values())
    for script, console in ROOT_SCRIPTS.items():
        module_name, function = scripts[console].split(":")
        module = importlib.import_module(module_name)
        assert callable(getattr(module, function)) and callable(module.main) and callable(module.define_flags)
        tree = ast.parse((REPO / script).read_text())
        imports = {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        calls = {f"{n.func.value.id}.{n.func.attr}" for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)}
        command = module_name.rpartition(".")[2]
        assert imports == {module_name} and calls == {f"{command}.{function}"}, script


USER_CODE_IMPORTER = "gd2po_jax/runtime/imports.py"
"""The one module that puts directories on sys.path: that of a user's file named by path in the config
(``rewards.functions``, ``task``), and the working directory for ``module:name`` (as ``python -m``)."""


def test_nothing_edits_sys_path():
    """The package and its entry points import as an install does: no sys.path edits, except where the
    config names a user's own code (`USER_CODE_IMPORTER`), which never affects the package's imports."""
    files = [*(REPO / "gd2po_jax").rglob("*.py"), *(REPO / name for name in ROOT_SCRIPTS)]
    edits = re.compile(r"sys\.path\.(insert|append|extend|remove)|sys\.path\s*(\+?=|\[)")
    editing = [str(f.relative_to(REPO)) for f in files if edits.search(f.read_text())]
    assert editing == [USER_CODE_IMPORTER]


def test_pytest_reads_its_settings_from_pyproject():
    """A pytest.ini would take precedence over pyproject.toml's [tool.pytest.ini_options]."""
    assert not (REPO / "pytest.ini").exists()
    assert PYPROJECT["tool"]["pytest"]["ini_options"]["addopts"] == "-n 2 --dist loadfile -m 'not slow'"


def test_ci_runs_readme_s_test_command_and_the_slow_tests_it_leaves_out():
    readme_command = (REPO / "README.md").read_text().split("pip install -r requirements-test.txt && ")[1].split("\n")[0]
    assert readme_command == "python -m pytest -q"
    ci_lines = [line.split("#")[0].strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert ci_lines[-2:] == [readme_command, "python -m pytest -q -m slow"]


def test_the_config_default_is_the_working_directory_s_then_the_package_s(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    assert cli.default_config_file() == "configs/default.py"  # a checkout's root: as before
    monkeypatch.chdir(tmp_path)  # elsewhere: the repository's, next to the package
    assert cli.default_config_file() == str(REPO / "configs" / "default.py")
    installed = tmp_path / "site-packages" / "gd2po_jax"  # an install: the copy inside the package
    (installed / "configs").mkdir(parents=True)
    (installed / "configs" / "default.py").write_text("")
    monkeypatch.setattr(cli, "__file__", str(installed / "cli" / "__init__.py"))
    assert cli.default_config_file() == str(installed / "configs" / "default.py")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "default.py").write_text("")  # the working directory's comes first
    assert cli.default_config_file() == "configs/default.py"
    assert cli.default_config_file("configs/none.py") == "configs/none.py"  # not found: the error names it


def test_train_py_finds_its_default_config_from_another_directory(tmp_path):
    """``python /path/to/train.py`` run elsewhere loads the repository's configs/default.py: an invalid
    override is then reported, before anything is written."""
    proc = subprocess.run([sys.executable, str(REPO / "train.py"), "--workdir=run", "--config.rl.snr_tau=1.5"],
                          cwd=tmp_path, env=subprocess_env(XLA_FLAGS=xla_flags(1)), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "train.py: config.rl.snr_tau: must be in [0.0, 1.0], got 1.5"
    assert not (tmp_path / "run").exists()
