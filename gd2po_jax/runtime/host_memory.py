"""Host memory: XLA's buffers reuse freed memory instead of page-faulting fresh memory every run.

XLA:CPU allocates the buffers of every run of a compiled program with the C library's ``malloc``
and frees them when the run ends. glibc serves large requests with ``mmap`` and hands freed memory
back to the kernel (``munmap``, heap trimming), so the next run page-faults and the kernel zeroes
the same memory again. On the speed frame's GRPO update (29M parameters, 32 x 128 tokens,
bench/anchor_workloads.py workload T) that was about 585,000 page faults (2.4 GB) per update, a
fifth to a quarter of its time on a 2-core machine (docs/speed.md).

`retain_freed_memory` makes freed memory stay mapped for the next run:

- ``mallopt(M_MMAP_MAX, 0)``: large requests come from the heap, not from fresh ``mmap`` regions;
- ``mallopt(M_TRIM_THRESHOLD, -1)``: the heap is never trimmed (both documented in mallopt(3));
- JAX's ``jax_cpu_enable_async_dispatch = False``: a single-device CPU program runs on the thread
  that calls it, so its buffers come from that thread's (the main) heap. Dispatched asynchronously,
  XLA's worker thread allocates them from an arena of its own, which serves requests over 64 MB
  with ``mmap`` whatever the settings above. (Limiting glibc to one arena would also do it, but
  made compilation, whose threads allocate a lot, 20-35% slower.)

After the first run, a program's buffers come from memory freed by the previous run (0 page faults
per update instead of ~585,000). The price: the process keeps its peak heap until it exits (a
training process's footprint anyway), and Python waits for each CPU computation instead of
queueing the next one (measured: the embedded default's warm start and RL steps got faster, not
slower). Computations over several devices (a mesh of simulated CPU devices) are dispatched
asynchronously whatever the flag, so their buffers still page-fault.

``import gd2po_jax`` applies it, so every entry point (train.py, eval.py, sweep.py, bench/) and
library use gets it. It must come before JAX starts its backend (the flag is read when the CPU
client is made): import gd2po_jax before running any JAX computation; a later import says so in a
warning. ``import gd2po_jax`` does not import JAX itself: when JAX is not imported yet, the flag is
set right after its import (`after_import`), so a tool that never uses JAX (report.py) never loads it.
The allocator settings only act on glibc (Linux); elsewhere, or with
``GD2PO_JAX_MALLOC=system`` in the environment, nothing changes. On a GPU or TPU only the host's
own allocations are concerned (the flag is the CPU backend's).
"""

from __future__ import annotations

import ctypes
import importlib.abc
import logging
import os
import sys
from collections.abc import Callable
from types import ModuleType

ENV_VAR = "GD2PO_JAX_MALLOC"  # "system": leave the C library's allocator and JAX's dispatch alone

# glibc's <malloc.h> parameter numbers.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4

SETTINGS = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))


def _glibc() -> ctypes.CDLL | None:
    """The process's C library if it is glibc (it has ``gnu_get_libc_version`` and ``mallopt``)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (raises AttributeError on musl and others)
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def retain_freed_memory(environ=os.environ) -> bool:
    """Sets `SETTINGS` with ``mallopt`` and turns JAX's asynchronous CPU dispatch off (see the module
    docstring).

    Returns True if all of it was applied; False where nothing was changed (not glibc, or
    ``GD2PO_JAX_MALLOC=system``) or glibc refused a setting. Raises ValueError for any other value
    of ``GD2PO_JAX_MALLOC`` than "system" or empty (a mistyped opt-out must not pass unnoticed).
    """
    choice = environ.get(ENV_VAR, "").strip().lower()
    if choice == "system":
        return False
    if choice:
        raise ValueError(
            f"{ENV_VAR}={environ[ENV_VAR]!r}: set it to 'system' (glibc's malloc defaults and "
            "JAX's asynchronous CPU dispatch) or leave it unset or empty"
        )
    libc = _glibc()
    if libc is None:
        return False
    if _jax_backend_started():
        logging.getLogger(__name__).warning(
            "gd2po_jax was imported after JAX started its backend: XLA's CPU buffers may still page-fault "
            "fresh memory every run (gd2po_jax/runtime/host_memory.py). Import gd2po_jax before running any JAX "
            "computation."
        )
    after_import("jax", lambda jax: jax.config.update("jax_cpu_enable_async_dispatch", False))
    accepted = [libc.mallopt(param, value) == 1 for param, value in SETTINGS]  # every one, even after a refusal
    return all(accepted)


class _ThenCall(importlib.abc.Loader):
    """A module's own loader, then ``finished(module)`` once the module has run; every other
    attribute is the wrapped loader's (resource readers ...)."""

    def __init__(self, loader, finished: Callable[[ModuleType], None]):
        self._loader, self._finished = loader, finished

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._finished(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``name`` with the other finders and wraps its loader in `_ThenCall`. It stays on
    ``sys.meta_path`` until the module has run: a library that only looks the module up
    (``importlib.util.find_spec("jax")``, as datasets and transformers do to see what is installed)
    gets a spec it never loads, and the import that follows must still be caught."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]):
        self._name, self._then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self._name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                spec.loader = _ThenCall(spec.loader, self._finished)
                return spec
        return None

    def _finished(self, module: ModuleType) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self._then(module)


def after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """Call ``then(module)`` with the top-level module ``name``: now if it is imported, else right
    after its first import (before the importer gets it back)."""
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def _jax_backend_started() -> bool:
    """Whether JAX, if imported at all, has created its backends (without importing it here)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    started = getattr(bridge, "backends_are_initialized", None)
    return bool(started and started())
