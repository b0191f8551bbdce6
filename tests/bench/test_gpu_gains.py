"""bench/gpu_gains.py (issue 59's device call) on the CPU, and the update's FLOP counts
(bench/accelerator/speed.py's `update_flops`: MFU both ways)."""

import json
import subprocess
import sys

import pytest

from bench import gpu_gains
from bench.accelerator.common import MODELS
from bench.accelerator.speed import update_flops
from tests.fakes import REPO, bench_env


def test_update_flops_count_causal_attention_once_and_remat_in_the_hardware_flops():
    config = MODELS["qwen2.5-1.5b"]
    rows, seq, completion = 64, 1024, 512
    d, f, hd, layers = config.hidden_size, config.intermediate_size, config.head_dim, config.num_layers
    weights = 2 * rows * seq * layers * (d * hd * (2 * config.num_heads + 2 * config.num_kv_heads) + 3 * d * f)
    head = 2 * rows * completion * d * config.vocab_size
    causal = 2 * layers * rows * seq * (seq + 1) * config.num_heads * hd  # two products over S(S+1)/2 pairs
    full = update_flops(config, rows, seq, completion, remat="full", attention="plain")
    assert full["model"] == pytest.approx(3 * (weights + head + causal))
    # full remat: the layers' forward again; the head's logits again; attention over all S x S pairs
    full_pairs = 2 * causal * seq / (seq + 1)
    assert full["hardware"] == pytest.approx(4 * weights + 4 * head + 4 * full_pairs)
    for remat in ("none", "minimal", "dots"):
        for attention in ("plain", "xla", "cudnn"):
            flops = update_flops(config, rows, seq, completion, remat=remat, attention=attention)
            assert flops["model"] == full["model"]
    minimal = update_flops(config, rows, seq, completion, remat="minimal", attention="cudnn")
    assert minimal["hardware"] == pytest.approx(3 * weights + 4 * head + 4 * causal)  # no weight product again
    none = update_flops(config, rows, seq, completion, remat="none", attention="cudnn")
    assert none["hardware"] == pytest.approx(3 * weights + 4 * head + 3 * causal)
    assert none["model"] < none["hardware"] < minimal["hardware"] < full["hardware"]


def test_gpu_gains_writes_each_part_and_skips_what_the_budget_cannot_cover(tmp_path):
    path = tmp_path / "gains.json"
    report = gpu_gains.run(gpu_gains.CPU_SMOKE, 120.0, path, parts=("copy", "matmul", "attention"))
    assert json.loads(path.read_text()) == json.loads(json.dumps(report))
    assert report["complete"] and not report["skipped"] and list(report["parts"]) == ["copy", "matmul", "attention"]
    assert report["parts"]["copy"]["bytes_per_s"] > 0 and report["parts"]["matmul"]["bf16_flops_per_s"] > 0
    attention = report["parts"]["attention"]
    assert attention["flash_implementation"] == "xla"  # a CPU: no cuDNN
    assert attention["plain"]["best_s"] > 0 and attention["flash"]["best_s"] > 0
    assert attention["max_grad_diff_relative"] < 2**-5  # the same gradients, to bf16 rounding
    spent = gpu_gains.run(gpu_gains.CPU_SMOKE, 0.0, path, parts=("copy", "U0"))
    assert not spent["parts"] and not spent["complete"]
    assert spent["skipped"] == ["copy: the time budget is spent", "U0: the time budget is spent"]
    assert json.loads(path.read_text())["skipped"] == spent["skipped"]


def test_an_update_whose_policy_does_not_fit_runs_with_full_remat_instead(monkeypatch, tmp_path):
    """U2's policy over the device's memory: U2 and U3 run with full remat, and say what did not fit."""
    calls = []

    def fake_update(shapes, device, attention, remat, head_grad, matmul_rate, deadline):
        calls.append((attention, remat, head_grad))
        if remat == "minimal":
            return {"fits": False, "remat": remat, "program_bytes": 2, "device_bytes_limit": 1, "compile_s": 0.5}
        return {"fits": True, "remat": remat, "logits_grad": head_grad}

    monkeypatch.setattr(gpu_gains, "update_part", fake_update)
    report = gpu_gains.run(gpu_gains.CPU_SMOKE, 60.0, tmp_path / "gains.json", parts=("U1", "U2", "U3"))
    assert calls == [("auto", "full", "float32"), ("auto", "minimal", "float32"), ("auto", "full", "float32"),
                     ("auto", "full", "auto")]
    u2, u3 = report["parts"]["U2"], report["parts"]["U3"]
    assert u2["remat"] == "full" and u2["instead_of"] == {"minimal": {"program_bytes": 2, "device_bytes_limit": 1,
                                                                       "compile_s": 0.5}}
    assert u3["remat"] == "full" and "instead_of" not in u3 and report["complete"]


@pytest.mark.slow
def test_gpu_gains_cpu_smoke_runs_every_part(tmp_path):
    path = tmp_path / "gains.json"
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_gains", "--cpu-smoke", f"--json={path}"], cwd=REPO,
                          env=bench_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(path.read_text())
    assert report["complete"] and list(report["parts"]) == list(gpu_gains.PARTS), report["skipped"]
    updates = [report["parts"][name] for name in ("U0", "U1", "U2", "U3")]
    assert [(u["attention"], u["remat"], u["logits_grad"]) for u in updates] == [
        ("plain", "full", "float32"), ("plain", "full", "float32"),  # auto is the plain path on a CPU
        ("plain", "minimal", "float32"), ("plain", "minimal", "auto")]
    for u in updates:
        assert u["finite_metrics"] and u["steps_timed"] >= 1 and u["step_s_best"] > 0 and u["program_bytes"] > 0
        assert u["mfu_model"] is None and u["flops_model"] < u["flops_hardware"]  # no peak FLOP/s for a CPU
        assert u["f32_score_shapes_in_hlo"] > 0  # the plain path's scores (cuDNN's program has none)
    assert updates[2]["flops_hardware"] < updates[0]["flops_hardware"]  # minimal recomputes no weight product
