"""Test configuration shared by the whole suite.

Eight host CPU devices are simulated so that mesh/sharding paths are exercised on a laptop, and
XLA:CPU skips LLVM's optimizations (tests/xla_env.py says why). The flags must be set before jax is
first imported, hence here at the top of conftest.
"""

import os

from tests.xla_env import set_in_process_flags  # noqa: E402  (no jax import)

set_in_process_flags()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pathlib  # noqa: E402

import pytest  # noqa: E402

from tests.fakes import SHARED as SHARED_DIR  # noqa: E402


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    """Path of the read-only ../shared folder (spec, reference vectors, data)."""
    if not SHARED_DIR.is_dir():
        pytest.fail(f"../shared not found at {SHARED_DIR}: tests need the reference vectors and data")
    return SHARED_DIR


# Hypothesis: deterministic examples in CI (a failure there reproduces locally with CI=true).
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
_hypothesis_settings.register_profile("dev", deadline=None)
_hypothesis_settings.load_profile("ci" if os.environ.get("CI") else "dev")
