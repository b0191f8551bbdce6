"""bench/accelerator_check.py, run as ``python -m bench.accelerator_check``: its CPU smoke runs a
miniature of every part and passes, so that the script cannot rot while no device machine is lent;
the device command runs it; the committed device reports are complete. (Its parts are the modules of
bench/accelerator/: the report's handling of a part that raises, fails or comes after the time budget
is in test_accelerator_report.py, part 4's README table in test_accelerator_end_to_end.py; its compile
counter is `bench.harness.CompileCounter`: tests/bench/test_harness.py.)"""

import json
import math
import subprocess
import sys

import pytest

from tests.fakes import REPO, bench_env, subprocess_env
from tests.xla_env import SUBPROCESS_DEVICES as DEVICES

PARTS = ["correctness", "speed", "engine", "compilation", "end_to_end"]


def positive(value, where: str) -> None:
    assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, f"{where} = {value!r}"


@pytest.mark.slow
def test_cpu_smoke_runs_every_part_and_passes(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "bench.accelerator_check", "--cpu-smoke", f"--out={out}"],
                          cwd=REPO, env=bench_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "cpu-smoke" and report["passed"] is True
    assert report["environment"]["backend"] == "cpu" and report["environment"]["device_count"] == DEVICES
    assert list(report["parts"]) == PARTS
    for name, part in report["parts"].items():
        assert part["status"] == "passed", (name, part.get("error"), part.get("traceback"))
        assert part["checks"] and all(c["passed"] for c in part["checks"]), name
        positive(part["seconds"], f"{name}.seconds")
    # The JSON is printed as written, then the table.
    assert json.loads(proc.stdout[: proc.stdout.index("\n\naccelerator check")]) == report
    assert f"accelerator check (cpu-smoke): cpu x{DEVICES}" in proc.stdout

    correctness = report["parts"]["correctness"]
    assert set(correctness["logits_rel_l2"]) == {"float32/highest", "float32/default", "bfloat16"}
    assert correctness["logits_rel_l2"]["float32/highest"] <= 1e-6  # the same device: the same numbers
    assert 0 < correctness["logits_rel_l2"]["bfloat16"] <= 5e-2
    for dtype, greedy in correctness["greedy"].items():
        assert greedy["tokens"] == 4 * 8 and greedy["unexplained_mismatches"] == 0, dtype
    assert correctness["update"]["mesh"] == {"data": 1, "fsdp": DEVICES, "tensor": 1}  # sharded vs one device

    speed = report["parts"]["speed"]
    positive(speed["bandwidth_bytes_per_s"], "bandwidth")
    positive(speed["matmul_bf16_flops_per_s"], "matmul rate")
    assert speed["skipped"] == [] and len(speed["sampling"]) == 1
    for case in speed["sampling"]:
        for key in ("prefill_tokens_per_s", "decode_tokens_per_s", "decode_step_ms", "bound_step_ms", "of_bound",
                    "compile_s"):
            positive(case[key], f"sampling.{key}")
        assert case["compiles"] >= 2 and case["timed_compiles"] == 0  # prefill + decode, compiled once
        for key in ("prefill_program", "decode_program", "estimate"):
            positive(case["memory_bytes"][key], f"sampling.memory_bytes.{key}")
        assert case["memory_bytes"]["device_peak_so_far"] is None and "no memory_stats" in case["memory_unavailable"]
    update = speed["update"]
    for key in ("step_s_best", "tokens_per_s", "flops", "of_measured_matmul_rate", "compile_s"):
        positive(update[key], f"update.{key}")
    positive(update["memory_bytes"]["program"], "update.memory_bytes.program")
    assert update["remat"] and update["timed_compiles"] == 0 and update["finite_metrics"]
    assert update["mfu"] is None and "'cpu'" in update["mfu_unavailable"]  # no peak FLOP/s for a CPU

    compilation = report["parts"]["compilation"]
    assert [s["step"] for s in compilation["steps"]] == [1, 2, 3, 4, 5]
    assert compilation["compiles_after_step_2"] == 0
    assert compilation["compiles_steps_1_2"] > 0  # the counter does see compilations
    positive(compilation["compile_s_steps_1_2"], "compile seconds")

    e2e = report["parts"]["end_to_end"]
    assert e2e["returncode"] == 0 and "--config=configs/tiny.py" in e2e["command"]
    positive(e2e["wall_s"], "end_to_end.wall_s")
    assert "before RL" in e2e["table"] and set(e2e["after_rl"]) >= {"correct_acc", "format_acc"}


def test_the_device_command_installs_the_wheels_and_writes_the_report_under_out(tmp_path):
    """bench/accelerator/device_check.sh's steps, with a wheel of our own and no time budget (every part
    skipped at once): the wheel lands on PYTHONPATH, the wheel check and the report are under $OUT, the
    table is printed. (Its real CPU dry run, `device_check.sh --cpu-smoke`, takes minutes: the docs.)"""
    from tests.bench.test_fetch_wheels import make_wheel

    (tmp_path / "whl").mkdir()
    make_wheel(tmp_path / "whl", "gd2po-carried-probe", "1.0")
    out = tmp_path / "out"
    env = subprocess_env(OUT=str(out), PYTHON=sys.executable, WHEELS=str(tmp_path / "whl"),
                         SITE=str(tmp_path / "site"), BUDGET_S="0")
    proc = subprocess.run(["bash", "bench/accelerator/device_check.sh", "--cpu-smoke"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list((tmp_path / "site").glob("gd2po_carried_probe-1.0.dist-info"))
    check = (out / "wheels_check.txt").read_text()
    assert "wheel gd2po-carried-probe 1.0" in check and "a wheel that wheels.txt does not list" in check
    report = json.loads((out / "accelerator_report.json").read_text())
    assert report["complete"] is True and report["mode"] == "cpu-smoke" and list(report["parts"]) == PARTS
    assert all(p["status"] == "skipped" and "time budget spent" in p["reason"] for p in report["parts"].values())
    assert f"accelerator check (cpu-smoke): cpu x{DEVICES}" in proc.stdout
    assert "[device_check] exit 0 after" in proc.stdout


def test_the_committed_device_reports_are_complete_runs_on_a_device():
    reports = sorted((REPO / "docs" / "accelerator").glob("report-*.json"))
    assert reports, "docs/accelerator has no device report"
    for path in reports:
        report = json.loads(path.read_text())
        assert report["mode"] == "device" and report["complete"] is True, path.name
        assert report["environment"]["backend"] == "gpu" and report["environment"]["dirty"] is False, path.name
        ran = {name: part for name, part in report["parts"].items() if part["status"] != "skipped"}
        assert ran and all(part["status"] == "passed" for part in ran.values()), path.name
