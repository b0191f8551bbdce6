"""bench/accelerator_check.py, run as ``python -m bench.accelerator_check``: its CPU smoke runs a
miniature of every part and passes, so that the script cannot rot while no device machine is lent; a
part that raises is recorded as an error, the other parts still run and the exit status is non-zero.
(Its compile counter is `bench.harness.CompileCounter`: tests/bench/test_harness.py.)"""

import json
import math
import subprocess
import sys

import jax
import pytest

from tests.fakes import REPO, bench_env, load_bench_script, subprocess_env
from tests.xla_env import SUBPROCESS_DEVICES as DEVICES

PARTS = ["correctness", "speed", "compilation", "end_to_end"]


@pytest.fixture(scope="module")
def check_module():
    """The script as a module (its absl flags are defined once in this process; nothing is parsed)."""
    return load_bench_script("accelerator_check")


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


def test_a_failing_part_is_recorded_and_the_others_still_run(check_module):
    def boom(ctx):
        raise RuntimeError("simulated failure")

    def passing(ctx):
        return {"checks": [check_module.check("fine", 1, 1, True)]}

    def failing(ctx):
        return {"checks": [check_module.check("too slow", 2.0, 1.0, False)]}

    ctx = check_module.Context(check_module.smoke_profile(), jax.devices()[0], jax.devices("cpu")[0], deadline=1e9)
    parts = check_module.run_parts({"first": boom, "second": passing, "third": failing}, ctx)
    assert [parts[n]["status"] for n in ("first", "second", "third")] == ["error", "passed", "failed"]
    assert parts["first"]["error"] == "RuntimeError: simulated failure" and "boom" in parts["first"]["traceback"]
    assert check_module.exit_code({"parts": parts}) == 1
    assert check_module.exit_code({"parts": {"second": parts["second"]}}) == 0


def test_without_an_accelerator_every_part_is_skipped_with_its_reason(check_module):
    parts = check_module.run_parts({"correctness": None, "speed": None}, None)
    assert all(p["status"] == "skipped" and "no accelerator" in p["reason"] for p in parts.values())
    assert check_module.exit_code({"parts": parts}) == 0  # skipped is not failed


def test_a_part_that_would_start_after_the_budget_is_skipped_and_each_part_is_reported(check_module):
    ran, so_far = [], []

    def part(name):
        def fn(ctx):
            ran.append(name)
            ctx.deadline = 0.0  # this part spends the budget
            return {"checks": [check_module.check("fine", 1, 1, True)]}
        return fn

    ctx = check_module.Context(check_module.smoke_profile(), jax.devices()[0], jax.devices("cpu")[0], deadline=1e12)
    parts = check_module.run_parts({"first": part("first"), "second": part("second")}, ctx,
                                   on_part=lambda results: so_far.append(list(results)))
    assert ran == ["first"] and so_far == [["first"], ["first", "second"]]
    assert parts["first"]["status"] == "passed"
    assert parts["second"] == {"status": "skipped", "reason": "time budget spent before it started; run "
                                                              "--parts=second alone"}
    assert check_module.exit_code({"parts": parts}) == 0


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


def test_part_4_reads_the_readme_table_it_is_compared_with(check_module, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("| validation | after warm start | after 40 RL steps |\n|---|---|---|\n"
                      "| Correct Acc | 0.227 | **0.406** |\n| ... one-call requests | 0.131 (11) | 0.405 (34) |\n"
                      "| Format Acc | 0.875 | 0.891 |\n| Truncation rate | 0.000 | 0.008 |\n")
    assert check_module.readme_default_table(readme) == {
        "correct_acc": {"before_rl": 0.227, "after_rl": 0.406},
        "format_acc": {"before_rl": 0.875, "after_rl": 0.891},
        "truncation_rate": {"before_rl": 0.0, "after_rl": 0.008}}
    readme.write_text("| Correct Acc | 0.227 | 0.406 |\n| Format Acc | 0.875 | n/a |\n")
    with pytest.raises(ValueError, match="Format Acc"):
        check_module.readme_default_table(readme)
    # The repository's README has the table (what a device run sets beside its own numbers).
    table = check_module.readme_default_table(REPO / "README.md")
    assert 0 <= table["correct_acc"]["before_rl"] < table["correct_acc"]["after_rl"] <= 1


def test_the_committed_device_reports_are_complete_runs_on_a_device():
    reports = sorted((REPO / "docs" / "accelerator").glob("report-*.json"))
    assert reports, "docs/accelerator has no device report"
    for path in reports:
        report = json.loads(path.read_text())
        assert report["mode"] == "device" and report["complete"] is True, path.name
        assert report["environment"]["backend"] == "gpu" and report["environment"]["dirty"] is False, path.name
        ran = {name: part for name, part in report["parts"].items() if part["status"] != "skipped"}
        assert ran and all(part["status"] == "passed" for part in ran.values()), path.name
