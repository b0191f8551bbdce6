"""bench/profiling.py, the profiler tooling of the bench scripts' ``--profile`` (anchor_workloads,
bench_sft): a trace's XLA operations summed by program and kind, the program spans, the printed lines,
and the operations named by their source in the dumped optimized HLO. (A real trace and HLO dump:
test_bench_scripts.py's anchor_workloads --profile run.)"""

from bench import profiling


def trace_op(module: str, name: str, dur: float, start: float = 0, ph: str = "X") -> dict:
    """A Perfetto trace event of XLA operation ``name`` of program ``module`` (times in microseconds)."""
    return {"ph": ph, "ts": start, "dur": dur, "args": {"hlo_module": module, "hlo_op": name}}


def test_operation_time_is_summed_by_program_and_kind():
    events = [trace_op("jit_a", "ynn_fusion.3", 2_000_000),
              trace_op("jit_a", "ynn_fusion", 500_000, start=1_000_000),  # beside the first (other thread)
              trace_op("jit_a", "copy.12", 250, start=2_000_000),
              trace_op("jit_b", "ynn_fusion.3", 1_000, start=7_000_000),
              trace_op("jit_a", "ynn_fusion.9", 9, start=9_000_000, ph="i"),  # not a complete event
              trace_op("jit_a", "while.4", 2_000_250),  # spans its body's operations: not counted again
              {"ph": "X", "ts": 0, "name": "PjitFunction(a)", "dur": 5_000_000},  # Python side: no hlo_op
              {"ph": "X", "ts": 0, "dur": 7, "args": {"hlo_op": "copy"}}]  # no module: not counted
    assert profiling.op_seconds_by_kind(events) == {"jit_a": {"ynn_fusion": 2.5, "copy": 0.00025},
                                                    "jit_b": {"ynn_fusion": 0.001}}
    assert profiling.program_spans(events) == {"jit_a": 2.00025, "jit_b": 0.001}
    profile = {"jit_a": {"op_s": 2.0, "span_s": 1.5, "kinds": {"ynn_fusion": 1.5, "copy": 0.5},
                         "sources": {"ynn_fusion f32[8,2] dot_general": 1.5, "copy ?": 0.5, "add f32[2] add": 0.001}},
               "jit_seed": {"op_s": 0.001, "span_s": 0.001, "kinds": {"copy": 0.001}}}  # < 1%: not printed
    assert profiling.profile_lines("T", profile) == [
        "T profile: jit_a 2,000 ms of operations in 1,500 ms: ynn_fusion 75%, copy 25%",
        "T profile:   jit_a  75%  1,500.0 ms  ynn_fusion f32[8,2] dot_general",
        "T profile:   jit_a  25%    500.0 ms  copy ?"]  # the add (< 1%) is left out


def test_operations_are_named_by_their_hlo_source(tmp_path):
    hlo = """HloModule jit__decode, entry_computation_layout={()->f32[8,2]{1,0}}

%fused_computation.3 (param_0.1: f32[8,4]) -> f32[8,2] {
  %param_0.1 = f32[8,4]{1,0} parameter(0)
  ROOT %dot.1 = f32[8,2]{1,0} dot(%param_0.1, %param_0.1), lhs_contracting_dims={1}, metadata={op_name="jit(_decode)/while/body/dot_general"}
}

ENTRY %main.9 () -> f32[8,2] {
  %ynn_fusion.3 = f32[8,2]{1,0} fusion(%constant.1), kind=kCustom, calls=%fused_computation.3, metadata={op_name="jit(_decode)/while/body/bkgd,bkds->bkgs/dot_general" stack_frame_id=7}, backend_config={}
  %tuple.2 = (f32[8,2]{1,0}, s32[]) tuple(%ynn_fusion.3, %constant.4)
  %ynn_fusion.5 = f32[4,8]{1,0} fusion(%constant.1), kind=kCustom, calls=%fused_computation.3, metadata={op_name="jit(step)/closed_call/while/body/closed_call/transpose(jvp())/checkpoint/rematted_computation/bth,hv->btv/dot_general"}
  ROOT %wrapped_copy = f32[8,2]{1,0} fusion(%ynn_fusion.3), kind=kLoop, calls=%wrapped_copy_computation
}
"""
    sources = profiling.hlo_sources(hlo)
    assert sources["ynn_fusion.3"] == "f32[8,2] bkgd,bkds->bkgs/dot_general"
    assert sources["dot.1"] == "f32[8,2] dot_general"
    assert sources["tuple.2"] == "(f32[8,2]{1,0}, s32[])"
    assert sources["ynn_fusion.5"] == "f32[4,8] transpose(jvp())/bth,hv->btv/dot_general"  # calls, loops, remat dropped
    assert sources["wrapped_copy"] == "f32[8,2]"  # no metadata: the shape only
    (tmp_path / "module_0001.jit__decode.cpu_after_optimizations.txt").write_text(hlo)
    (tmp_path / "module_0001.jit__decode.cpu_after_optimizations-buffer-assignment.txt").write_text("not HLO")
    (tmp_path / "module_0002.jit_other.cpu_after_optimizations.txt").write_text(hlo.replace("jit__decode", "jit_other"))
    programs = profiling.dumped_hlo_sources(tmp_path, ["jit__decode"])  # only the programs asked for
    assert list(programs) == ["jit__decode"] and programs["jit__decode"] == sources
    assert sorted(profiling.dumped_hlo_sources(tmp_path)) == ["jit__decode", "jit_other"]

    events = [trace_op("jit__decode", "ynn_fusion.3", 3_000), trace_op("jit__decode", "ynn_fusion.3", 1_000),
              trace_op("jit__decode", "wrapped_copy", 500),
              trace_op("jit__decode", "while.1", 9_000),  # control flow: left out
              trace_op("jit_other", "copy.1", 250)]  # no HLO of this program read: "?"
    assert profiling.op_seconds_by_source(events, programs) == {
        "jit__decode": {"ynn_fusion f32[8,2] bkgd,bkds->bkgs/dot_general": 0.004, "wrapped_copy f32[8,2]": 0.0005},
        "jit_other": {"copy ?": 0.00025}}
