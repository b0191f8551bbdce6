"""gd2po_jax/runtime/compilation_cache.py: where JAX's persistent compilation cache goes (on by default in
the user's cache directory, off by a config field or an environment variable, JAX's own variable first),
and that a run is byte for byte the same with and without it (the first run fills it, the second reads it)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from gd2po_jax.runtime import compilation_cache
from gd2po_jax.runtime.compilation_cache import cache_dir, user_cache_dir
from tests.fakes import REPO, subprocess_env


def test_the_user_cache_directory_by_default_off_or_another_by_field_or_variable(tmp_path):
    home = {"HOME": "/home/u"}
    assert user_cache_dir({"XDG_CACHE_HOME": "/c"}) == pathlib.Path("/c/gd2po_jax/jax_cache")
    assert cache_dir("user", {"XDG_CACHE_HOME": "/c"}) == pathlib.Path("/c/gd2po_jax/jax_cache")
    assert cache_dir("user", home) == pathlib.Path.home() / ".cache" / "gd2po_jax" / "jax_cache"
    assert cache_dir("off", {}) is None and cache_dir("OFF", {}) is None
    assert cache_dir(str(tmp_path), {}) == tmp_path
    assert cache_dir("user", {"GD2PO_JAX_COMPILATION_CACHE": "off"}) is None  # the variable first
    assert cache_dir("off", {"GD2PO_JAX_COMPILATION_CACHE": str(tmp_path)}) == tmp_path
    assert cache_dir("user", {"JAX_COMPILATION_CACHE_DIR": "/x"}) is None  # JAX's own: left to JAX


def test_the_test_suite_writes_no_cache_to_the_users_home():
    import os

    assert os.environ["GD2PO_JAX_COMPILATION_CACHE"] == "off"  # tests/conftest.py
    assert subprocess_env()["GD2PO_JAX_COMPILATION_CACHE"] == "off"  # train.py subprocesses too


def test_enable_points_jax_at_the_directory_and_off_turns_it_off(tmp_path, monkeypatch):
    import jax

    monkeypatch.delenv("GD2PO_JAX_COMPILATION_CACHE")
    before = jax.config.jax_compilation_cache_dir
    try:
        assert compilation_cache.enable(str(tmp_path / "c")) == tmp_path / "c"
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "c")
        assert compilation_cache.enable("off") is None and jax.config.jax_compilation_cache_dir is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        compilation_cache._reset()


def test_jax_own_threshold_variable_is_left_to_jax(tmp_path, monkeypatch):
    import jax

    monkeypatch.delenv("GD2PO_JAX_COMPILATION_CACHE")
    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    try:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        compilation_cache.enable(str(tmp_path / "c"))
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0  # the variable's, not ours
        monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
        compilation_cache.enable(str(tmp_path / "c"))
        assert jax.config.jax_persistent_cache_min_compile_time_secs == compilation_cache.MIN_COMPILE_SECONDS
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
        compilation_cache._reset()


def _train(workdir: pathlib.Path, cache: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(REPO / "train.py"), f"--config={REPO / 'configs' / 'tiny.py'}",
                           f"--workdir={workdir}", "--config.train.num_steps=2", "--config.sft.num_steps=2",
                           "--config.eval.split=none"], cwd=workdir.parent, capture_output=True, text=True,
                          env=subprocess_env(GD2PO_JAX_COMPILATION_CACHE=cache,
                                             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0"), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _results(workdir: pathlib.Path) -> tuple[list[dict], dict[str, bytes]]:
    metrics = [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "tokens_per_second"))}
               for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    policy = {p.name: p.read_bytes() for p in sorted((workdir / "policy").iterdir()) if p.is_file()}
    return metrics, policy


@pytest.mark.slow
def test_a_run_is_the_same_with_and_without_the_cache(tmp_path):
    """The cache filled by a run that compiled everything itself (as a run without a cache does: writing
    the cache does not change what is compiled), then read by a second run that compiles nothing it
    found there: the metrics (but wall-clock times) and the exported policy are byte-identical. Every
    program is cached (threshold 0 s): with the default 0.2 s, a program near it is written by one run
    and not the other, as the machine's load decides. (How much faster the second compile is:
    docs/own_task.md.)"""
    cache = tmp_path / "jax_cache"
    first = _train(tmp_path / "fill", str(cache))
    written = {p.name for p in cache.iterdir()}
    assert written  # the first run wrote its programs
    second = _train(tmp_path / "read", str(cache))
    assert {p.name for p in cache.iterdir()} == written  # the second found every program there
    assert "compilation included" in first.stdout and "compilation included" in second.stdout
    assert _results(tmp_path / "read") == _results(tmp_path / "fill")


def test_the_cache_and_the_completions_shown_may_change_on_a_rerun():
    """Neither changes what a run computes: a resume may change them (RESUMABLE_FIELDS)."""
    from gd2po_jax.runtime import run_dir

    assert {"logging.compilation_cache", "logging.completions_every"} <= set(run_dir.RESUMABLE_FIELDS)
