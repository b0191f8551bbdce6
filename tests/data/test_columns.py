"""gd2po_jax/data/columns.py: the schema's column names are these, the rewards name the rollout columns
with them, and the data layer imports nothing from the rewards above it."""

import ast
import pathlib

import gd2po_jax.data
from gd2po_jax.data import columns
from gd2po_jax.data.schema import FEATURES
from gd2po_jax.rewards import base


def test_the_schema_columns_are_these_names():
    assert list(FEATURES) == [columns.PROMPT, columns.GROUND_TRUTH, columns.TARGET, columns.LEVEL, columns.SOURCE,
                              columns.ROW, columns.PROMPT_TEXT, columns.EXTRA_COLUMNS]
    assert columns.PROMPT_ALIAS not in FEATURES
    assert set(columns.RESERVED_COLUMNS) <= set(FEATURES) | {columns.RESPONSE_IDS, columns.ROLLOUT_INDEX}


def test_the_rewards_take_the_rollout_columns_from_the_data():
    assert (base.RESPONSE_IDS, base.ROLLOUT_INDEX) == (columns.RESPONSE_IDS, columns.ROLLOUT_INDEX)


def test_the_data_imports_nothing_from_the_rewards():
    offenders = []
    for path in sorted(pathlib.Path(gd2po_jax.data.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            offenders += [f"{path.name}:{node.lineno} {name}" for name in names if name.startswith("gd2po_jax.rewards")]
    assert not offenders
