"""export.py (`gd2po_jax.cli.export`) and ``config.export``: a checkpoint of a run as a Hugging Face
model directory that transformers loads, in the dtype asked for; errors naming the flag or file."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from gd2po_jax.cli.export import ExportError, export_checkpoint
from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.run_dir import RunDir, WorkdirBusyError
from tests.fakes import REPO, subprocess_env, tiny_run_config
from tests.xla_env import xla_flags

STEPS = (1, 2, 3)  # the checkpoints of the run below; 2 is a middle one


# ----------------------------------------------------------------------------------------------
# config.export: validated, optional in an older config.json, resumable.
# ----------------------------------------------------------------------------------------------


def test_export_dtype_defaults_to_the_compute_dtype_and_is_validated():
    config = tiny_run_config()
    assert config.export.dtype == "" and config.export.resolved_dtype(config.model.dtype) == "float32"
    assert config.replace({"export.dtype": "bfloat16"}).export.resolved_dtype("float32") == "bfloat16"
    with pytest.raises(ConfigError, match=r"^config\.export\.dtype: must be one of \('float32', 'bfloat16'\)"):
        config.replace({"export.dtype": "float16"})


def write_run(workdir: pathlib.Path, config: RunConfig, *, without_export: bool = False) -> None:
    """A workdir with ``config`` in its config.json (``export`` left out, as runs made before it
    wrote it) and progress (metrics), so that a rerun resumes it."""
    values = config.to_dict()
    if without_export:
        del values["export"]
    workdir.mkdir(parents=True, exist_ok=True)
    RunDir(workdir).config.write_text(json.dumps(values, indent=2, sort_keys=True))
    RunDir(workdir).metrics.write_text('{"step": 1}\n')


def test_an_older_config_json_without_export_loads_and_resumes(tmp_path):
    config = tiny_run_config()
    write_run(tmp_path, config, without_export=True)
    loaded = run_dir.load_run_config(tmp_path)
    assert loaded == config and loaded.export.dtype == ""
    run_dir.check_resume_config(tmp_path, config)  # the same run
    # export.dtype is how the policy is stored, not what is trained: a rerun may change it.
    assert "export.dtype" in run_dir.RESUMABLE_FIELDS
    run_dir.check_resume_config(tmp_path, config.replace({"export.dtype": "bfloat16"}))
    with pytest.raises(ConfigError, match=r"config\.rl\.algorithm"):
        run_dir.check_resume_config(tmp_path, config.replace({"rl.algorithm": "gdpo"}))


# ----------------------------------------------------------------------------------------------
# Errors before anything is read: one line naming the flag or file.
# ----------------------------------------------------------------------------------------------


def test_a_workdir_without_config_json_is_named(tmp_path):
    with pytest.raises(ExportError, match=rf"^--workdir={tmp_path}: {tmp_path}/config\.json not found"):
        export_checkpoint(tmp_path, tmp_path / "out")


def test_a_non_empty_out_dir_is_refused(tmp_path):
    write_run(tmp_path / "run", tiny_run_config())
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match=rf"^--out={tmp_path / 'out'}: is not empty"):
        export_checkpoint(tmp_path / "run", tmp_path / "out")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    with pytest.raises(ExportError, match=r"^--dtype=float16: must be one of float32, bfloat16"):
        export_checkpoint(tmp_path / "run", tmp_path / "new", dtype="float16")


def test_a_busy_workdir_is_refused_naming_its_holder(tmp_path):
    """As eval.py: while train.py works in the workdir (it prunes the checkpoints), export stops at once."""
    write_run(tmp_path / "run", tiny_run_config())
    with run_dir.lock_workdir(tmp_path / "run", "train.py"):
        with pytest.raises(WorkdirBusyError, match=r"is in use by .*train\.py"):
            export_checkpoint(tmp_path / "run", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_run_without_checkpoints_is_named(tmp_path):
    write_run(tmp_path / "run", tiny_run_config())
    with pytest.raises(ExportError, match=r"^--workdir=.*: no checkpoint in .*/checkpoints$"):
        export_checkpoint(tmp_path / "run", tmp_path / "out")


# ----------------------------------------------------------------------------------------------
# A tiny run's checkpoints, exported.
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> pathlib.Path:
    """A tiny run (no warm start, no evaluation) with checkpoints at steps 1, 2 and 3."""
    from gd2po_jax.jobs.train import train_and_evaluate

    workdir = tmp_path_factory.mktemp("export") / "run"
    config = tiny_run_config(sft__enabled=False, train__num_steps=3, checkpoint__every_steps=1,
                             checkpoint__keep=len(STEPS), eval__split="none")
    train_and_evaluate(config, workdir, progress=False)
    return workdir


def checkpoint_logits(workdir: pathlib.Path, step: int, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The logits of checkpoint ``step``'s master weights, with the project's model (float32)."""
    from gd2po_jax.evaluation.policy import abstract_params
    from gd2po_jax.models.logprobs import merge_model
    from gd2po_jax.runtime.checkpoints import Checkpoints
    from gd2po_jax.runtime.sharding import make_mesh
    from tests.fakes import logits_of

    files = RunDir(workdir)
    graphdef, target = abstract_params(files.base_model, jnp.float32, make_mesh(data=1, fsdp=-1))
    with Checkpoints(files.checkpoints, create=False) as checkpoints:
        params = checkpoints.restore_params(step, target)
    return logits_of(merge_model(graphdef, params, jnp.float32), ids, mask)


def transformers_logits(model_dir: pathlib.Path, ids: np.ndarray, mask: np.ndarray, dtype=None) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    from tests.fakes import hf_logits

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype or torch.float32).eval()
    return hf_logits(model, ids, mask)


def token_batch(vocab_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded ``(ids, mask)`` [3, 10] of tokens of the run's vocabulary."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, size=(3, 10))
    mask = np.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :7] = 0
    return ids * mask, mask


def safetensors_bytes(model_dir: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))


@pytest.mark.slow
def test_a_middle_checkpoint_loads_in_transformers_with_its_logits(run, tmp_path):
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    out = tmp_path / "step2"
    exported = export_checkpoint(run, out, step=2)
    assert (exported.step, exported.dtype, exported.out) == (2, "float32", out)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(exported.files)
    assert not [p for p in out.parent.iterdir() if ".tmp-" in p.name]  # staged, then renamed
    hf_config = json.loads((out / "config.json").read_text())
    ids, mask = token_batch(hf_config["vocab_size"])

    expected = checkpoint_logits(run, 2, ids, mask)
    got = transformers_logits(out, ids, mask)
    keep = mask.astype(bool)  # padded positions are not compared
    np.testing.assert_allclose(got[keep], expected[keep], atol=1e-5, rtol=0)
    # The middle checkpoint, not the run's final policy (policy/, step 3).
    ours, final = load_file(out / "model.safetensors"), load_file(run / "policy" / "model.safetensors")
    assert not all(np.array_equal(ours[name], final[name]) for name in final)
    # The run's tokenizer, with the chat template the run prompted with.
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


@pytest.mark.slow
def test_the_latest_checkpoint_is_the_default_and_equals_the_run_s_export(run, tmp_path):
    """Without --step, the latest checkpoint: the weights train.py exported at the end (float32, the
    tiny config's model.dtype: config.export.dtype's default)."""
    from safetensors.numpy import load_file

    exported = export_checkpoint(run, tmp_path / "latest")
    assert (exported.step, exported.dtype) == (STEPS[-1], "float32")
    ours = load_file(tmp_path / "latest" / "model.safetensors")
    trainers = load_file(run / "policy" / "model.safetensors")
    assert sorted(ours) == sorted(trainers)
    for name, value in trainers.items():
        assert value.dtype == np.float32 and np.array_equal(ours[name], value), name


@pytest.mark.slow
def test_a_bfloat16_export_is_half_the_size_and_loads(run, tmp_path):
    import torch

    fp32 = export_checkpoint(run, tmp_path / "fp32", step=2, dtype="float32")
    bf16 = export_checkpoint(run, tmp_path / "bf16", step=2, dtype="bfloat16")
    assert bf16.dtype == "bfloat16"
    ratio = safetensors_bytes(bf16.out) / safetensors_bytes(fp32.out)
    assert abs(ratio - 0.5) < 0.02, ratio  # the headers (tensor names) are the same size in both
    hf_config = json.loads((bf16.out / "config.json").read_text())
    assert hf_config.get("dtype", hf_config.get("torch_dtype")) == "bfloat16"
    ids, mask = token_batch(hf_config["vocab_size"])
    keep = mask.astype(bool)
    got = transformers_logits(bf16.out, ids, mask, dtype=torch.bfloat16)
    expected = transformers_logits(fp32.out, ids, mask)
    assert np.abs(got[keep] - expected[keep]).max() < 0.1  # bfloat16 weights: close, not equal


@pytest.mark.slow
def test_export_py_names_the_steps_that_exist(run, tmp_path):
    """``python export.py --step=N`` of a step that was not saved: one line naming the steps that were."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "export.py", f"--workdir={run}", "--step=7", f"--out={out}"], cwd=REPO,
                          env=subprocess_env(XLA_FLAGS=xla_flags(1)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"export.py: --step=7: no such checkpoint in {run / 'checkpoints'}; available steps: 1, 2, 3")
    assert not out.exists()


@pytest.mark.slow
def test_an_export_never_imports_the_runs_reward_functions(run, tmp_path):
    """Finding 1 of issue 63: export.py imported (and ran) the reward functions config.json names."""
    import shutil

    from tests.runtime.test_imports import PAYLOAD

    marker, payload = tmp_path / "marker", tmp_path / "crafted" / "evil.py"
    payload.parent.mkdir()
    payload.write_text(PAYLOAD.format(marker=str(marker)))
    crafted = tmp_path / "run"
    shutil.copytree(run, crafted)
    values = json.loads(RunDir(crafted).config.read_text())
    values["rewards"]["functions"] = [f"{payload}:f"]
    RunDir(crafted).config.write_text(json.dumps(values))
    exported = export_checkpoint(crafted, tmp_path / "out")
    assert exported.step == STEPS[-1] and "model.safetensors" in exported.files
    assert not marker.exists()
    # A task of the run's own is code too: imported only with --trust_workdir_code.
    values["task"] = f"{payload}:f"
    RunDir(crafted).config.write_text(json.dumps(values))
    with pytest.raises(run_dir.UntrustedCodeError, match=r"config\.task \(.*evil\.py:f\); not importing it: pass "
                                                          r"--trust_workdir_code if you trust"):
        export_checkpoint(crafted, tmp_path / "out2")
    assert not marker.exists() and not (tmp_path / "out2").exists()


def tree_snapshot(directory: pathlib.Path) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime_ns) of everything under ``directory``."""
    return {str(p.relative_to(directory)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in directory.rglob("*")}


@pytest.mark.slow
def test_a_finished_run_on_read_only_storage_exports_and_evaluates(run, tmp_path, monkeypatch):
    """Finding 8 of issue 63: export.py and eval.py created DIR/.lock, so a run on read-only storage could
    be neither. As root chmod does not stop writes: os.access (what a read-only mount answers, EROFS, also
    for root) is then made to say so, and the test checks that nothing in the run changed."""
    import os
    import shutil
    import stat

    from gd2po_jax.evaluation import command as eval_command
    from gd2po_jax.evaluation.command import EvalOptions

    frozen = tmp_path / "frozen"
    shutil.copytree(run, frozen)
    before = tree_snapshot(frozen)
    for path in [frozen, *frozen.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    if os.access(frozen, os.W_OK):  # root: simulate the read-only mount
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: (
            False if mode & os.W_OK and str(p).startswith(str(frozen)) else real_access(p, mode, **kw)))
    try:
        assert run_dir.is_read_only(frozen)
        exported = export_checkpoint(frozen, tmp_path / "out", step=2)
        assert exported.step == 2 and "model.safetensors" in exported.files
        monkeypatch.chdir(tmp_path)
        summary = eval_command.run(EvalOptions(workdir=str(frozen), split="test", max_examples=4, progress=False))
        assert summary["num_examples"] == 4
        reports = tmp_path / "runs" / "eval" / "frozen" / "eval"
        assert (reports / "test.json").is_file() and (reports / "test.jsonl").is_file()
        assert tree_snapshot(frozen) == before  # nothing written, no lock file
    finally:
        for path in [frozen, *frozen.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | stat.S_IWUSR)
