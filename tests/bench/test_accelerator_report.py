"""bench/accelerator/report.py: one failing part of the accelerator check is recorded and the others
still run; without an accelerator every part is skipped with its reason; a part that would start after
the time budget is skipped and the report is written after each part; the exit status."""

import jax

from bench import harness
from bench.accelerator import common, report


def test_a_failing_part_is_recorded_and_the_others_still_run():
    def boom(ctx):
        raise RuntimeError("simulated failure")

    def passing(ctx):
        return {"checks": [common.check("fine", 1, 1, True)]}

    def failing(ctx):
        return {"checks": [common.check("too slow", 2.0, 1.0, False)]}

    ctx = common.Context(common.smoke_profile(), jax.devices()[0], jax.devices("cpu")[0], deadline=1e9)
    parts = report.run_parts({"first": boom, "second": passing, "third": failing}, ctx)
    assert [parts[n]["status"] for n in ("first", "second", "third")] == ["error", "passed", "failed"]
    assert parts["first"]["error"] == "RuntimeError: simulated failure" and "boom" in parts["first"]["traceback"]
    assert report.exit_code({"parts": parts}) == 1
    assert report.exit_code({"parts": {"second": parts["second"]}}) == 0


def test_without_an_accelerator_every_part_is_skipped_with_its_reason():
    parts = report.run_parts({"correctness": None, "speed": None}, None)
    assert all(p["status"] == "skipped" and "no accelerator" in p["reason"] for p in parts.values())
    assert report.exit_code({"parts": parts}) == 0  # skipped is not failed


def test_a_part_that_would_start_after_the_budget_is_skipped_and_each_part_is_reported():
    ran, so_far = [], []

    def part(name):
        def fn(ctx):
            ran.append(name)
            ctx.deadline = 0.0  # this part spends the budget
            return {"checks": [common.check("fine", 1, 1, True)]}
        return fn

    ctx = common.Context(common.smoke_profile(), jax.devices()[0], jax.devices("cpu")[0], deadline=1e12)
    parts = report.run_parts({"first": part("first"), "second": part("second")}, ctx,
                                   on_part=lambda results: so_far.append(list(results)))
    assert ran == ["first"] and so_far == [["first"], ["first", "second"]]
    assert parts["first"]["status"] == "passed"
    assert parts["second"] == {"status": "skipped", "reason": "time budget spent before it started; run "
                                                              "--parts=second alone"}
    assert report.exit_code({"parts": parts}) == 0


def test_a_part_is_reported_with_the_compilations_of_the_context_counter():
    def compiling(ctx):
        jax.block_until_ready(jax.jit(lambda x: x * 3 + 1)(jax.numpy.arange(7)))  # a program of its own
        return {"checks": [common.check("fine", 1, 1, True)]}

    with harness.CompileCounter() as compiles:
        ctx = common.Context(common.smoke_profile(), jax.devices()[0], jax.devices("cpu")[0], deadline=1e12,
                             compiles=compiles)
        part = report.run_part(compiling, ctx)
    assert part["status"] == "passed" and part["compiles"] >= 1 and part["compile_s"] > 0
    assert "compiles" not in report.run_part(compiling, common.Context(ctx.profile, ctx.device, ctx.cpu, 1e12))
