"""The ``files`` fixture of the loader tests (tests/data/test_loaders.py, tests/data/formats/)."""

import pathlib

import pytest

from tests.data.loader_files import EXPECTED, Expected
from tests.fakes import data_files


@pytest.fixture(params=["tiny", "real"])
def files(request) -> tuple[pathlib.Path, Expected]:
    """(a data directory, what its files hold): the tiny files, or the real ones (``data_dir``)."""
    directory = data_files() if request.param == "tiny" else request.getfixturevalue("data_dir")
    return directory, EXPECTED[request.param]
