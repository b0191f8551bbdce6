"""Where a call's time goes on XLA: the profiler tooling of the bench scripts' ``--profile``
(bench/anchor_workloads.py, bench/bench_sft.py).

`profile_call` traces one call (jax.profiler) and sums its XLA operations' time per compiled program,
by kind of operation (``ynn_fusion``: XLA:CPU's library products) and by source: the kind, output
shape and JAX operation of each instruction, read from the optimized HLO that XLA dumps
(`dump_optimized_hlo`, before JAX's first computation), so that e.g. the decode's weight products,
``f32[3072,32] dot_general``, and its attention, ``f32[32,4,2,64] bkgs,bksd->bkgd/dot_general``, are
told apart; `profile_lines` prints it. The trace and HLO readers are pure functions of their text.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import pathlib
import re
from collections.abc import Callable, Collection

import jax

CONTROL_FLOW = frozenset({"while", "conditional", "call"})  # HLO ops that run other ops


def xla_operations(trace_events: list[dict]):
    """The XLA operations of a Perfetto trace's events, as ``(program, op, kind, event)``.

    They are the complete ("X") events whose args name an ``hlo_op`` and its ``hlo_module``; the kind
    is the op's name without its ``.N`` suffix (``ynn_fusion.12`` -> ``ynn_fusion``).
    """
    for event in trace_events:
        args = event.get("args") or {}
        if event.get("ph") == "X" and "hlo_op" in args and "hlo_module" in args:
            yield args["hlo_module"], args["hlo_op"], re.sub(r"\.\d+$", "", args["hlo_op"]), event


def op_seconds(trace_events: list[dict], label: Callable[[str, str, str], str]) -> dict[str, dict[str, float]]:
    """{compiled program: {label: seconds}}, most first, of the `xla_operations`, each under
    ``label(program, op, kind)``. Durations (microseconds in the trace) are summed over threads.
    Control flow (``CONTROL_FLOW``: a while loop's event spans the operations of its body, which
    have events of their own) is left out, so that no time is counted twice."""
    seconds: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for module, op, kind, event in xla_operations(trace_events):
        if kind not in CONTROL_FLOW:
            seconds[module][label(module, op, kind)] += event.get("dur", 0) / 1e6
    return {module: dict(labels.most_common()) for module, labels in seconds.items()}


def op_seconds_by_kind(trace_events: list[dict]) -> dict[str, dict[str, float]]:
    """{compiled program: {kind of operation: seconds}} (`op_seconds`)."""
    return op_seconds(trace_events, lambda module, op, kind: kind)


def program_spans(trace_events: list[dict]) -> dict[str, float]:
    """{compiled program: seconds from its first operation's start to its last one's end} (the wall
    time of the program when the trace holds one run of it; compare with its operations' sum)."""
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    for module, _, _, event in xla_operations(trace_events):
        starts[module] = min(starts.get(module, event["ts"]), event["ts"])
        ends[module] = max(ends.get(module, event["ts"]), event["ts"] + event.get("dur", 0))
    return {module: (ends[module] - starts[module]) / 1e6 for module in starts}


_HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\([^=]*?\)|[a-z]\w*\[[\d,]*\])")
# Parts of an op_name path that only say where the op was called from (loops, calls, remat).
_CALL_PATH = frozenset({"while", "body", "cond", "closed_call", "checkpoint", "rematted_computation", "remat"})
_HLO_OP_NAME = re.compile(r'metadata=\{[^}]*?op_name="([^"]*)"')


def hlo_sources(hlo_text: str) -> dict[str, str]:
    """{instruction name: "SHAPE SOURCE"} of an optimized HLO module's text, SOURCE being the JAX
    operation its metadata names without the parts that say where it was called from (``jit(...)``,
    loops, calls, remat; ``transpose(jvp())``, the backward pass, stays): e.g. ``ynn_fusion.32`` ->
    ``"f32[3072,32] dot_general"``, ``ynn_fusion.92`` -> ``"f32[32,4,2,64] bkgs,bksd->bkgd/dot_general"``.
    An instruction without metadata keeps only its shape."""
    sources = {}
    for line in hlo_text.splitlines():
        head = _HLO_INSTRUCTION.match(line)
        if head is None:
            continue
        op_name = _HLO_OP_NAME.search(line)
        path = op_name[1].split("/") if op_name else []
        source = "/".join(part for part in path if part not in _CALL_PATH and not part.startswith("jit("))
        sources[head[1]] = f"{head[2]} {source}".strip()
    return sources


def dumped_hlo_sources(hlo_dir: pathlib.Path, programs: Collection[str] | None = None) -> dict[str, dict[str, str]]:
    """{program: `hlo_sources`} of the optimized modules XLA dumped into ``hlo_dir``
    (``--xla_dump_to``), only of ``programs`` when given; where a program was compiled more than
    once, its last module."""
    sources = {}
    for path in sorted(hlo_dir.glob("module_*.*after_optimizations.txt")):
        match = re.fullmatch(r"module_\d+\.(?P<program>.+?)\.\w*after_optimizations\.txt", path.name)
        if match and (programs is None or match["program"] in programs):
            sources[match["program"]] = hlo_sources(path.read_text())
    return sources


def op_seconds_by_source(trace_events: list[dict], sources: dict[str, dict[str, str]]) -> dict[str, dict[str, float]]:
    """{program: {"KIND SHAPE SOURCE": seconds}}, as `op_seconds_by_kind` but finer: each operation is
    also named by its output shape and the JAX operation it came from (``sources``:
    `dumped_hlo_sources`; "?" where the program's HLO is not there)."""
    return op_seconds(trace_events, lambda module, op, kind: f"{kind} {sources.get(module, {}).get(op, '?')}")


HLO_DUMP = "hlo"  # --profile DIR: XLA dumps the optimized HLO of every program into DIR/hlo


def dump_optimized_hlo(directory: pathlib.Path) -> None:
    """Has XLA write every program it compiles from now on, optimized, as text into ``directory``
    (``--xla_dump_to``; read when JAX starts its backend, so call it before any computation)."""
    from jax._src import xla_bridge  # noqa: PLC0415

    if xla_bridge.backends_are_initialized():
        raise RuntimeError("dump_optimized_hlo must run before JAX's first computation (XLA reads XLA_FLAGS then)")
    flags = f"--xla_dump_to={directory} --xla_dump_hlo_as_text"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()


def profile_call(fn: Callable[[], object], directory: pathlib.Path, top: int = 6,
                 hlo_dir: pathlib.Path | None = None, top_sources: int = 10) -> dict:
    """Traces one call of ``fn`` into ``directory``; {program: {"op_s", "span_s" (`program_spans`),
    "kinds" (the ``top`` kinds' seconds, most first), "sources" (the ``top_sources`` of
    `op_seconds_by_source` with the HLO dumped into ``hlo_dir``; empty without it)}} of its XLA
    operations (`op_seconds_by_kind`)."""
    with jax.profiler.trace(str(directory), create_perfetto_trace=True):
        jax.block_until_ready(fn())
    traces = sorted(directory.glob("**/*.trace.json.gz"), key=lambda path: path.stat().st_mtime)
    if not traces:
        raise RuntimeError(f"jax.profiler wrote no *.trace.json.gz under {directory}")
    with gzip.open(traces[-1], "rt") as handle:
        events = json.load(handle)["traceEvents"]
    by_kind, spans = op_seconds_by_kind(events), program_spans(events)
    by_source = {} if hlo_dir is None else op_seconds_by_source(events, dumped_hlo_sources(hlo_dir, set(by_kind)))
    return {module: {"op_s": sum(kinds.values()), "span_s": spans[module], "kinds": dict(list(kinds.items())[:top]),
                     "sources": dict(list(by_source.get(module, {}).items())[:top_sources])}
            for module, kinds in sorted(by_kind.items(), key=lambda item: -sum(item[1].values()))}


def profile_lines(name: str, profile: dict, min_share: float = 0.01) -> list[str]:
    """One printed line per program of a `profile_call` report that has at least ``min_share`` of
    all its programs' operation time (generate also runs a few tiny programs: seeds, reshapes)."""
    lines = []
    total = sum(entry["op_s"] for entry in profile.values())
    for module, entry in profile.items():
        if entry["op_s"] < min_share * total:
            continue
        shares = ", ".join(f"{kind} {seconds / entry['op_s']:.0%}" for kind, seconds in entry["kinds"].items())
        lines.append(f"{name} profile: {module} {entry['op_s'] * 1e3:,.0f} ms of operations in "
                     f"{entry['span_s'] * 1e3:,.0f} ms: {shares}")
        lines += [f"{name} profile:   {module} {seconds / entry['op_s']:4.0%} {seconds * 1e3:8,.1f} ms  {label}"
                  for label, seconds in entry.get("sources", {}).items() if seconds >= min_share * entry["op_s"]]
    return lines
