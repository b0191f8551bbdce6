"""Test configuration shared by the whole suite.

Eight host CPU devices are simulated so that mesh/sharding paths are exercised on a laptop, and
XLA:CPU skips LLVM's optimizations and its MLIR fusion emitters (tests/xla_env.py says why). The
flags must be set before jax is first imported, hence here at the top of conftest. Three files that
run ``train.py`` processes share one xdist worker (`SHARED_WORKER`, at the end)."""

import os
import tempfile

from tests.xla_env import set_in_process_flags  # noqa: E402  (no jax import)

set_in_process_flags()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("GD2PO_JAX_COMPILATION_CACHE", "off")  # tests never write the user cache (runtime/compilation_cache.py)
# Runs the tests train sign their config.json with a key of the test session's, not the user's (runtime/trust.py).
os.environ.setdefault("GD2PO_JAX_TRUST_KEY", os.path.join(tempfile.mkdtemp(prefix="gd2po-trust-"), "trust_key"))

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


MAP_COUNT_LIMIT = pathlib.Path("/proc/sys/vm/max_map_count")
"""Linux's limit on a process's memory mappings (65,530 by default)."""


def memory_map_count() -> int | None:
    """The number of this process's memory mappings (Linux), or None where /proc has none."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return None


@pytest.fixture(autouse=True, scope="module")
def release_compiled_programs():
    """After each test module, drop JAX's compiled programs once the process holds half the kernel's
    limit of memory mappings. Every XLA:CPU executable keeps its code in a few mappings of its own
    (3 to 7 per program here), and a pytest worker compiles thousands of programs: past
    vm.max_map_count (65,530) the next compilation's mmap fails and XLA segfaults inside
    ``backend_compile_and_load`` (seen at 2026-12-03's bcb01dd, in whichever test compiled next).
    A training run compiles a fixed handful of programs and never comes near it."""
    yield
    count = memory_map_count()
    if count is not None and MAP_COUNT_LIMIT.is_file() and count > int(MAP_COUNT_LIMIT.read_text()) // 2:
        import gc  # noqa: PLC0415

        import jax  # noqa: PLC0415  (after the flags above are set)

        jax.clear_caches()
        gc.collect()


SHARED_WORKER = {"tests/runtime/test_distributed.py": "tests/jobs/test_train.py",
                 "tests/experiments/test_sweeps.py": "tests/jobs/test_train.py"}
"""Test files that run one after another on the same pytest-xdist worker (``--dist loadfile``, as
pyproject.toml's addopts): file -> the file whose work unit it joins. tests/runtime/test_distributed.py
runs three ``train.py`` processes at once; beside it on 2 cores (2026-12-06, Xeon model 167)
tests/jobs/test_train.py took 336-348 s instead of 197-207 s (its kill-and-resume tests 2.4x) and
tests/experiments/test_sweeps.py 167 s instead of 113-124 s."""


def pytest_xdist_make_scheduler(config, log):
    """`SHARED_WORKER`'s files in one work unit; any other ``--dist`` mode keeps xdist's scheduler."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # noqa: PLC0415  (only with xdist)

    class SharedWorkerScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return SHARED_WORKER.get(scope, scope)

    return SharedWorkerScheduling(config, log)
