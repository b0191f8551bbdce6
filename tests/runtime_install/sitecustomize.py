"""Run by every Python subprocess the suite starts (`tests.fakes.subprocess_env` puts this folder
first on PYTHONPATH): hides the modules that only the test requirements install, so that
``train.py``, ``eval.py``, ``sweep.py`` and the bench scripts run as in a venv of requirements.txt alone.

The hidden top-level names come from ``GD2PO_JAX_HIDDEN_MODULES`` (comma-separated), which
`tests.fakes.subprocess_env` computes once from the installed packages' metadata
(`tests.runtime_closure.modules_only_for_tests`: torch, pytest, peft, jinja2 before it was a requirement,
...). The suite then fails if runtime code comes to need one of them, and each subprocess is spared
torch's import (1.4-1.8 s on a CI machine), which tensorboardX and transformers' auto classes perform
whenever torch is installed.

The path finder is replaced by one that does not find those modules or their submodules, so ``import
torch`` raises ModuleNotFoundError and ``importlib.util.find_spec("torch")`` returns None, which is
how libraries decide that a package is absent. (``sys.modules["torch"] = None`` would do the same for
imports, but libraries that look torch up in ``sys.modules``, scipy among them, then fail.)
"""

import importlib.machinery
import os
import sys

HIDDEN = frozenset(filter(None, os.environ.get("GD2PO_JAX_HIDDEN_MODULES", "torch").split(",")))


class PathFinderWithoutTestOnlyModules(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] in HIDDEN:
            return None
        return super().find_spec(fullname, path, target)


sys.meta_path[:] = [PathFinderWithoutTestOnlyModules if finder is importlib.machinery.PathFinder else finder
                    for finder in sys.meta_path]
