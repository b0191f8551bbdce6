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

DATA_DIR_VARIABLE = "GD2PO_JAX_DATA_DIR"
"""The environment variable naming a directory of the real public data sets, laid out as
tests/fixture_data.py writes its tiny ones: rlla_4k/{test.parquet,rlla_sft.json} (ToolRL's RLLA 4K,
github.com/qiancheng0/ToolRL), api_bank/level-{1,2,3}-api_processed.json (tool-calling/API_Bank of
github.com/Qwen-Applications/GD2PO) and safe_alignment/{alpaca,hh_rlhf,pku_saferlhf}_test.parquet
(safe-alignment/dataset of the GD2PO repository, renamed). .ci/run sets it."""


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
    """The directory of real public data that ``GD2PO_JAX_DATA_DIR`` names. Unset: the test is skipped,
    saying so (the same code paths run on the tiny data sets of `tests.fakes.data_files` in other
    tests); set to a directory that does not exist: the test fails."""
    value = os.environ.get(DATA_DIR_VARIABLE, "")
    if not value:
        pytest.skip(f"{DATA_DIR_VARIABLE} is not set: set it to a directory of the real public data sets "
                    "(rlla_4k/, api_bank/, safe_alignment/; see tests/conftest.py) to run this test on them")
    path = pathlib.Path(value)
    if not path.is_dir():
        pytest.fail(f"{DATA_DIR_VARIABLE}={value}: no such directory (unset it to skip the tests on real data)")
    return path


# Hypothesis: deterministic examples in CI (a failure there reproduces locally with CI=true).
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
_hypothesis_settings.register_profile("dev", deadline=None)
_hypothesis_settings.load_profile("ci" if os.environ.get("CI") else "dev")
