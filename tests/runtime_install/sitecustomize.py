"""Run by every Python subprocess the suite starts (`tests.fakes.subprocess_env` puts this folder
first on PYTHONPATH): hides torch, a test-only dependency (requirements-test.txt).

So ``train.py``, ``eval.py``, ``sweep.py`` and the bench scripts run as in an install from
requirements.txt, and the suite fails if runtime code comes to need torch. It also spares each
subprocess torch's import (1.4-1.8 s on a CI machine), which tensorboardX and transformers' auto
classes perform whenever torch is installed.

The path finder is replaced by one that does not find ``torch`` or its submodules, so ``import
torch`` raises ModuleNotFoundError and ``importlib.util.find_spec("torch")`` returns None, which is
how those libraries decide that torch is absent. (``sys.modules["torch"] = None`` would do the
same for imports, but libraries that look torch up in ``sys.modules``, scipy among them, then fail.)
"""

import importlib.machinery
import sys


class PathFinderWithoutTorch(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] == "torch":
            return None
        return super().find_spec(fullname, path, target)


sys.meta_path[:] = [PathFinderWithoutTorch if finder is importlib.machinery.PathFinder else finder
                    for finder in sys.meta_path]
