"""Hub ids for models (`gd2po_jax.runtime.hub`), resolved offline from a cache the test writes in the
Hugging Face hub's own layout (``models--org--name/refs/<revision>`` naming a snapshot directory)."""

from __future__ import annotations

import pathlib
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gd2po_jax.config import ConfigError
from gd2po_jax.models import Decoder, load_pretrained, save_pretrained
from gd2po_jax.tasks.setup import with_local_models
from gd2po_jax.runtime.hub import MODEL_FILES, HubId, resolve_model_dir
from tests.fakes import tiny_model_config, tiny_run_config


def write_cached_repo(cache: pathlib.Path, repo_id: str, files: pathlib.Path, *, revision: str = "main",
                      commit: str = "0" * 40, repo_type: str = "models") -> pathlib.Path:
    """Put the files of ``files`` in the hub cache ``cache`` as ``repo_id`` at ``revision`` (a ref
    naming snapshot ``commit``), as ``hf download`` leaves them; returns the snapshot directory."""
    repo = cache / f"{repo_type}--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(files, snapshot, dirs_exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return snapshot


@pytest.fixture
def offline_cache(tmp_path, monkeypatch) -> pathlib.Path:
    """An empty hub cache, with downloads off (HF_HUB_OFFLINE)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    save_pretrained(Decoder(tiny_model_config(), dtype=jnp.float32, rngs=nnx.Rngs(3)), out)
    (out / "pytorch_model.bin").write_bytes(b"pickled weights")  # never fetched: safetensors only
    return out


@pytest.mark.parametrize("text, parsed", [
    ("org/name", HubId("org/name")),
    ("Qwen/Qwen2.5-1.5B-Instruct@main", HubId("Qwen/Qwen2.5-1.5B-Instruct", "main")),
    ("org/name@0123abcd", HubId("org/name", "0123abcd")),
    ("/abs/path", None), ("./rel/dir", None), ("just-a-name", None), ("a/b/c", None), ("", None),
])
def test_hub_ids_are_told_from_paths(text, parsed):
    assert HubId.parse(text) == parsed


def test_fetch_commands_name_the_revision_and_the_repository_type():
    assert HubId("org/name").fetch_command() == "hf download org/name"
    assert HubId("org/data", "v1").fetch_command("dataset") == "hf download org/data --revision v1 --repo-type dataset"


def test_a_cached_hub_id_loads_the_same_model_as_its_directory(offline_cache, tiny_model_dir):
    snapshot = write_cached_repo(offline_cache, "org/tiny", tiny_model_dir)
    resolved = resolve_model_dir("org/tiny", "config.model.path")
    assert resolved == snapshot
    ids = np.array([[3, 4, 5, 6]])
    np.testing.assert_array_equal(np.asarray(load_pretrained("org/tiny")(ids)),
                                  np.asarray(load_pretrained(tiny_model_dir)(ids)))


def test_a_revision_picks_its_own_snapshot(offline_cache, tiny_model_dir):
    write_cached_repo(offline_cache, "org/tiny", tiny_model_dir, revision="main", commit="1" * 40)
    other = write_cached_repo(offline_cache, "org/tiny", tiny_model_dir, revision="v2", commit="2" * 40)
    assert resolve_model_dir("org/tiny@v2") == other
    assert resolve_model_dir("org/tiny@main").name == "1" * 40


def test_a_model_not_in_the_cache_offline_names_the_id_and_the_command(offline_cache):
    with pytest.raises(FileNotFoundError, match=r"^config\.model\.path: 'org/absent@v3' is not in the Hugging Face "
                                                r"cache .*; fetch it with: hf download org/absent --revision v3$"):
        resolve_model_dir("org/absent@v3", "config.model.path")


def test_a_local_directory_wins_over_a_hub_id_of_the_same_spelling(offline_cache, tiny_model_dir, tmp_path,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, tmp_path / "org" / "tiny")
    assert resolve_model_dir("org/tiny") == pathlib.Path("org/tiny")  # nothing in the cache: not looked up


def test_only_safetensors_weights_are_fetched(tiny_model_dir):
    fetched = {p.name for p in tiny_model_dir.iterdir()
               if any(pathlib.PurePath(p.name).match(pattern) for pattern in MODEL_FILES)}
    assert "model.safetensors" in fetched and "config.json" in fetched
    assert "pytorch_model.bin" not in fetched


def test_a_run_config_gets_local_directories_for_its_hub_ids(offline_cache, tiny_model_dir):
    snapshot = write_cached_repo(offline_cache, "org/tiny", tiny_model_dir)
    config = tiny_run_config(model__path="org/tiny", model__tokenizer_path="org/tiny")
    local = with_local_models(config)
    assert (local.model.path, local.model.tokenizer_path) == (str(snapshot), str(snapshot))
    assert config.model.path == "org/tiny"  # the run's config.json keeps what the user wrote
    with pytest.raises(ConfigError, match=r"^config\.model\.path: 'org/other' is not in the Hugging Face cache"):
        with_local_models(tiny_run_config(model__path="org/other"))


def test_a_mistyped_local_path_is_not_reported_as_a_hub_cache_miss(offline_cache, tiny_model_dir, tmp_path,
                                                                   monkeypatch):
    """Issue 63 finding 11: 'models/qwn' (for models/qwen) was "not in the Hugging Face cache"."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "qwen")
    with pytest.raises(FileNotFoundError, match=r"^config\.model\.path: 'models/qwn' does not exist; models/ has "
                                                r"'qwen' \(nor is it a model on the Hub: .*\); give an existing "
                                                r"directory$"):
        resolve_model_dir("models/qwn", "config.model.path")
    with pytest.raises(FileNotFoundError, match=r"'runs/x/policyy' does not exist; runs/x/ has 'policy';"):
        (tmp_path / "runs" / "x" / "policy").mkdir(parents=True)
        resolve_model_dir("runs/x/policyy", "config.model.path")
    # An id whose first part is no local directory is still the Hub's (the cache miss, with its command).
    with pytest.raises(FileNotFoundError, match=r"'org/absent' is not in the Hugging Face cache .*hf download"):
        resolve_model_dir("org/absent", "config.model.path")
