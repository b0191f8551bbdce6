"""gd2po_jax/models/pretrained.py: a model directory that cannot be loaded is one line naming the file
(issue 63, finding 7), and so is a directory no tokenizer loads from."""

from __future__ import annotations

import json
import shutil

import pytest

from gd2po_jax.cli import one_line
from gd2po_jax.data.tokenization import TokenizerLoadError, load_tokenizer
from gd2po_jax.errors import UserError
from gd2po_jax.models.pretrained import ModelDirError, load_pretrained
from tests.fakes import tiny_policy


def _break(model_dir, how: str) -> str:
    """Damage a copy of a model directory as ``how`` says; returns the file the error must name."""
    weights, config = model_dir / "model.safetensors", model_dir / "config.json"
    if how == "no safetensors":
        weights.unlink()
        return str(model_dir)
    if how == "truncated safetensors":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        return str(weights)
    values = json.loads(config.read_text())
    if how == "shape mismatch":
        values["intermediate_size"] *= 2
        config.write_text(json.dumps(values))
        return str(weights)
    if how == "broken config.json":
        config.write_text(json.dumps(values)[:-20])
        return str(config)
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["no safetensors", "truncated safetensors", "shape mismatch", "broken config.json"])
def test_every_model_directory_fault_is_one_line_naming_the_file(tmp_path, how):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_policy(), model_dir)
    named = _break(model_dir, how)
    with pytest.raises(ModelDirError) as refused:
        load_pretrained(model_dir)
    assert isinstance(refused.value, UserError)  # the commands print one line, exit code 2
    line = one_line(refused.value)
    assert line == str(refused.value) and named in line and "copy or save it again" in line
    assert refused.value.__cause__ is None and refused.value.__suppress_context__  # no chained tracebacks


def test_a_directory_without_a_loadable_tokenizer_is_one_line(tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_policy(), model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        (model_dir / name).unlink(missing_ok=True)
    (model_dir / "config.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match=rf"^{model_dir}: cannot load a tokenizer from it \(") as refused:
        load_tokenizer(model_dir)
    assert "\n" not in str(refused.value) and refused.value.__cause__ is None
