"""The suite's own scheduling (tests/conftest.py): the files of `SHARED_WORKER` form one xdist work unit."""

from __future__ import annotations

from tests import conftest
from tests.fakes import REPO


class FakeConfig:
    """What xdist's schedulers read of a pytest config: the --dist mode and two workers."""

    def __init__(self, dist: str):
        self.values = {"dist": dist, "tx": ["2*popen"]}

    def getvalue(self, name: str):
        return self.values[name]


def test_the_files_that_share_a_worker_exist():
    assert conftest.SHARED_WORKER
    for file, unit in conftest.SHARED_WORKER.items():
        assert (REPO / file).is_file(), file
        assert (REPO / unit).is_file(), unit
        assert unit not in conftest.SHARED_WORKER  # joins a unit of its own, not a chain


def test_loadfile_puts_the_shared_files_in_one_work_unit_and_others_in_their_own():
    scheduler = conftest.pytest_xdist_make_scheduler(FakeConfig("loadfile"), None)
    for file, unit in conftest.SHARED_WORKER.items():
        assert scheduler._split_scope(f"{file}::test_x") == unit
        assert scheduler._split_scope(f"{unit}::test_y[1-2]") == unit
    assert scheduler._split_scope("tests/rl/test_losses.py::test_z") == "tests/rl/test_losses.py"
    assert conftest.pytest_xdist_make_scheduler(FakeConfig("load"), None) is None  # xdist's own scheduler
