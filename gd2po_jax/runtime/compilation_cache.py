"""JAX's persistent compilation cache, on by default (``config.logging.compilation_cache``).

The first step of a run compiles the rollout and update programs (10-40 s on a small model); with the
cache, a rerun of the same config (a resume, a sweep's next seed, the same command tomorrow) reads the
compiled programs from disk instead. Where it lives (`cache_dir`), first match wins:

  ``JAX_COMPILATION_CACHE_DIR``        JAX's own variable (sweep.py sets it to DIR/xla_cache): JAX reads
                                       it itself, nothing is changed here
  ``GD2PO_JAX_COMPILATION_CACHE``      ``off`` (or 0, false, none), or a directory
  ``config.logging.compilation_cache`` ``user``: ``$XDG_CACHE_HOME/gd2po_jax/jax_cache`` (default
                                       ``~/.cache/gd2po_jax/jax_cache``), ``off``, or a directory

A cached program is the program XLA compiled for the same computation, options and devices, so
results are the same with and without it (tests/runtime/test_compilation_cache.py compares two runs
byte for byte). The test suite sets ``GD2PO_JAX_COMPILATION_CACHE=off`` (tests/conftest.py) so that it
never writes to the user's home.
"""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Mapping

logger = logging.getLogger(__name__)

ENV = "GD2PO_JAX_COMPILATION_CACHE"
"""The environment variable that overrides ``config.logging.compilation_cache``: off, or a directory."""
JAX_ENV = "JAX_COMPILATION_CACHE_DIR"
"""JAX's own variable: when set, JAX uses it and `enable` leaves JAX alone."""
OFF = ("off", "0", "false", "none", "no")
MIN_COMPILE_SECONDS = 0.2
"""Programs that compile faster than this are not cached (JAX's default: 1 s; the step's small
programs add up), unless JAX's own ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` says otherwise."""
JAX_MIN_COMPILE_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
"""JAX's own variable for the threshold: when set, JAX reads it and `enable` leaves it alone."""


def user_cache_dir(env: Mapping[str, str] | None = None) -> pathlib.Path:
    """``$XDG_CACHE_HOME/gd2po_jax/jax_cache``, default ``~/.cache/gd2po_jax/jax_cache``."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
    return pathlib.Path(base) / "gd2po_jax" / "jax_cache"


def cache_dir(setting: str, env: Mapping[str, str] | None = None) -> pathlib.Path | None:
    """The directory this process's compilation cache goes to (None: off, or JAX's own variable set),
    from ``setting`` (``config.logging.compilation_cache``) and the environment (module docstring)."""
    env = os.environ if env is None else env
    if env.get(JAX_ENV):
        return None
    value = env.get(ENV) or setting
    if value.strip().lower() in OFF:
        return None
    if value.strip().lower() == "user":
        return user_cache_dir(env)
    return pathlib.Path(value).expanduser()


def enable(setting: str) -> pathlib.Path | None:
    """Point JAX's persistent compilation cache at `cache_dir` (or turn it off); returns the directory.
    Call before the first compilation of a run; a later call with another directory takes effect for
    the programs compiled after it."""
    import jax

    directory = cache_dir(setting)
    if directory is None and os.environ.get(JAX_ENV):
        return pathlib.Path(os.environ[JAX_ENV])
    current = getattr(jax.config, "jax_compilation_cache_dir", None)
    wanted = None if directory is None else str(directory)
    if current != wanted:
        jax.config.update("jax_compilation_cache_dir", wanted)
        _reset()
    if directory is not None:
        if not os.environ.get(JAX_MIN_COMPILE_ENV):
            jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
        logger.info("JAX compilation cache: %s (config.logging.compilation_cache, %s=off turns it off)", directory, ENV)
    return directory


def _reset() -> None:
    """Let JAX open the cache again at its new directory (it opens it once, at the first compilation)."""
    try:
        from jax._src import compilation_cache

        compilation_cache.reset_cache()
    except (ImportError, AttributeError):  # another JAX: the directory applies from the next process on
        pass
