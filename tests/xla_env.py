"""The XLA flags of the processes the suite runs, in a module that does not import jax, so that
tests/conftest.py can set them before jax starts.

- pytest's own processes simulate 8 CPU devices (`IN_PROCESS_DEVICES`), so that 2-D meshes and
  8-way sharding run on a CPU, and compile without LLVM's optimizations
  (``--xla_backend_optimization_level=0``): their tests are mostly compilation of tiny programs,
  which this halves (a train step of the 2-layer test model 7.0 s to 3.1 s, sampling's two programs
  11.3 s to 4.7 s; tests/rl/test_train_step.py 768 s to 313 s in the suite). The HLO passes (fusion,
  layouts, the SPMD partitioner) run as in production, so the tests check the same programs.
  They also emit the fused loops with XLA:CPU's elemental emitter instead of its MLIR fusion
  emitters (`NO_FUSION_EMITTERS`), which compile the same HLO fusions in less than half the time:
  the test model's update 2.4 s to 1.1 s and, micro-batched, 3.0 s to 1.2 s (`.lower().compile()`;
  optimized, 4.1 s to 3.6 s); tests/rl/test_train_step.py's 13 ``verl or sharded or fully_filtered
  or micro_batches`` tests 160 s to 90 s alone, the file 411 s to 212 s in the suite (2026-12-06,
  Xeon model 167). Not for the ``train.py`` subprocesses: at full optimization the fusion emitters'
  code runs faster (the default's warm-start step 150 ms against 176 ms, `bench.bench_sft`), and
  tests/jobs/test_train.py took as long either way (188 s, 187 s).
- The ``train.py`` / ``eval.py`` / bench subprocesses simulate 2 devices (`SUBPROCESS_DEVICES`,
  the cores of a CI machine) with optimized code: their time is spent running steps, and simulated
  devices beyond the cores multiply it when the run has the machine to itself (configs/tiny.py's
  whole run on 1, 2, 4, 8 devices: 69, 68, 95, 139 s; unoptimized on 2: 81 s); in the full suite,
  where two workers share the cores, the subprocess tests took about as long as with 8.
- The bench scripts' subprocesses (tests/bench) compile unoptimized and without the fusion
  emitters, as pytest's own processes do:
  their runs are a step or two of tiny programs, so compiling is their time, and their tests check
  what the scripts print, not how fast (tests/bench/test_bench_scripts.py and
  test_accelerator_check.py together 117 s to 85 s; the accelerator check's CPU smoke alone 56 s to
  48 s, 79 s to 59 s of CPU time).
"""

from __future__ import annotations

import os

IN_PROCESS_DEVICES = 8
SUBPROCESS_DEVICES = 2
UNOPTIMIZED = "--xla_backend_optimization_level=0"
NO_FUSION_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
_DEVICE_COUNT = "--xla_force_host_platform_device_count"


def xla_flags(num_devices: int = SUBPROCESS_DEVICES, optimized: bool = True) -> str:
    """XLA_FLAGS for a subprocess with ``num_devices`` simulated CPU devices, optimized code unless
    ``optimized`` is False (a subprocess that mostly compiles: the bench scripts' short runs)."""
    flags = f"{_DEVICE_COUNT}={num_devices}"
    return flags if optimized else f"{flags} {UNOPTIMIZED} {NO_FUSION_EMITTERS}"


def set_in_process_flags(environ=os.environ) -> None:
    """Adds pytest's flags (`IN_PROCESS_DEVICES` devices unless a count is already set, unoptimized
    code) to ``environ``'s XLA_FLAGS, keeping the user's own."""
    flags = environ.get("XLA_FLAGS", "").split()
    if not any(f.startswith(_DEVICE_COUNT + "=") for f in flags):
        flags.append(f"{_DEVICE_COUNT}={IN_PROCESS_DEVICES}")
    for flag in (UNOPTIMIZED, NO_FUSION_EMITTERS):
        if not any(f.startswith(flag.split("=")[0] + "=") for f in flags):
            flags.append(flag)
    environ["XLA_FLAGS"] = " ".join(flags)
