"""gd2po_jax/sft/warm_start.py: where the warm start lives, its cache key, the input check and the
race-free publish. (Training one is covered end to end by test_trainer.py.)"""

from __future__ import annotations

import json

import pytest

from configs.default import get_config as default_config
from gd2po_jax.config import ConfigError
from gd2po_jax.sft.warm_start import (
    build_warm_start,
    publish_dir,
    warm_start,
    warm_start_dir,
    warm_start_inputs,
    warm_start_key,
)
from tests.fakes import as_run_config, tiny_config, tiny_run_config


def test_the_default_config_keeps_its_warm_start_key():
    # Shared warm starts in existing cache directories are found by this key: a refactoring that
    # changes it for the same config silently retrains them.
    assert warm_start_key(as_run_config(default_config())) == "680cdfa91ee4"


def test_warm_start_key_depends_on_what_the_warm_start_is_made_of():
    key = warm_start_key(tiny_run_config())
    assert len(key) == 12
    # model.remat keeps the boolean it was before its policies (existing caches keep their keys)
    rematted = {warm_start_key(tiny_run_config(model__remat=policy)) for policy in ("full", "minimal", "dots")}
    assert len(rematted) == 1 and key not in rematted
    assert warm_start_inputs(tiny_run_config(model__remat="minimal"))["model"]["remat"] is True
    # RL settings, the RL seed and the cache location itself: the same warm start.
    for same in [{"rl__algorithm": "grpo"}, {"rl__snr_tau": 0.2}, {"train__seed": 3},
                 {"train__learning_rate": 0.5}, {"train__num_steps": 9}, {"sft__cache_dir": "/elsewhere"},
                 {"model__lora__rank": 8}, {"model__lora__alpha": 4.0},  # LoRA trains the warm start in RL
                 {"sft__length_bucket": 16},  # the batches' layout: float sums at most, as the mesh
                 {"model__attention": "xla"}]:  # how the layers compute, too
        assert warm_start_key(tiny_run_config(**same)) == key, same
    # Its data, model, SFT settings (its own seed included) and SFT optimizer: another one.
    for other in [{"sft__seed": 1}, {"sft__num_steps": 61}, {"data__synthetic__num_train": 65},
                  {"model__tiny__hidden_size": 32}, {"train__weight_decay": 0.0}, {"task": "files"}]:
        assert warm_start_key(tiny_run_config(**other)) != key, other
    config = tiny_config()
    del config.sft["seed"]  # a config.json older than sft.seed: the seed was 0
    assert warm_start_key(as_run_config(config)) == key


def test_warm_start_lives_in_the_workdir_or_under_its_key_in_the_cache(tmp_path):
    assert warm_start_dir(tiny_run_config(), tmp_path) == tmp_path / "warm_start"
    config = tiny_run_config(sft__cache_dir=str(tmp_path / "cache"))
    shared = tmp_path / "cache" / warm_start_key(config)
    assert warm_start_dir(config, tmp_path / "run") == shared
    shared.mkdir(parents=True)
    (shared / "config.json").write_text("{}")
    assert warm_start(config, None, tmp_path / "run", progress=False) == shared  # found: nothing trained
    assert not (tmp_path / "run").exists()


def test_a_workdir_warm_start_from_other_inputs_is_refused_naming_the_fields(tmp_path):
    run = tmp_path / "run"
    (run / "warm_start").mkdir(parents=True)
    (run / "warm_start" / "config.json").write_text("{}")
    assert warm_start(tiny_config(), None, run, progress=False) == run / "warm_start"  # no record: trusted
    (run / "warm_start" / "warm_start_inputs.json").write_text(json.dumps(warm_start_inputs(tiny_run_config())))
    assert warm_start(tiny_config(rl__algorithm="grpo"), None, run, progress=False) == run / "warm_start"
    with pytest.raises(ConfigError, match=r"data\.synthetic\.num_train \(was 64, now 65\), sft\.num_steps"):
        warm_start(tiny_config(data__synthetic__num_train=65, sft__num_steps=61), None, run, progress=False)


def test_a_record_older_than_sft_seed_matches_seed_zero(tmp_path):
    inputs = warm_start_inputs(tiny_run_config())
    del inputs["sft"]["seed"]
    (tmp_path / "warm_start").mkdir()
    (tmp_path / "warm_start" / "config.json").write_text("{}")
    (tmp_path / "warm_start" / "warm_start_inputs.json").write_text(json.dumps(inputs))
    assert warm_start(tiny_config(), None, tmp_path, progress=False) == tmp_path / "warm_start"
    with pytest.raises(ConfigError, match=r"sft\.seed \(was 0, now 1\)"):
        warm_start(tiny_config(sft__seed=1), None, tmp_path, progress=False)


def test_publishing_a_warm_start_keeps_the_first_of_two_racing_writers(tmp_path):
    target = tmp_path / "abc123"
    for name, label in [("abc123.tmp-1", "first"), ("abc123.tmp-2", "second")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(label)
    assert publish_dir(tmp_path / "abc123.tmp-1", target)
    assert not publish_dir(tmp_path / "abc123.tmp-2", target)  # lost the race: discarded
    assert (target / "config.json").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abc123"]


def test_warm_start_only_needs_sft():
    with pytest.raises(ConfigError, match=r"^config\.sft\.enabled"):
        build_warm_start(as_run_config(tiny_config(sft__enabled=False)), "/nonexistent", progress=False)


def test_a_killed_warm_start_save_leaves_nothing_behind_for_good(tmp_path):
    """The staging directory of a process that died mid-save is removed by the next warm start
    (here one that reuses the published warm start of the shared cache); a live one's is kept."""
    import os
    import subprocess
    import sys

    from gd2po_jax.runtime import run_dir

    config = as_run_config(tiny_config(sft__cache_dir=str(tmp_path / "cache")))
    published = warm_start_dir(config, tmp_path / "run")
    published.mkdir(parents=True)
    (published / "config.json").write_text("{}")
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    live = run_dir.staging_name(published)
    killed = live.with_name(live.name.replace(f"-{os.getpid()}-", f"-{dead}-"))
    for staging in (live, killed):
        staging.mkdir()
        (staging / "model.safetensors").write_bytes(b"half")
    assert warm_start(config, None, tmp_path / "run", progress=False) == published
    assert sorted(p.name for p in published.parent.iterdir()) == sorted([published.name, live.name])
