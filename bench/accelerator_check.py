"""One-shot accelerator check (issue 17): what the design card promises on GPU / TPU, in one command.

Five parts, each a function returning a dict for the JSON report; one failing part records its
error and the others still run, and the exit status is 1 if any check failed.

1. ``correctness``: logits of a random Qwen2.5-0.5B-shaped model on the device (fp32 at the highest
   matmul precision, fp32 at the default one, bf16) against the same computation on
   ``jax.devices("cpu")[0]`` in fp32; greedy sampler tokens equal to the forward pass's argmax
   (teacher-forced on the sampler's own prefix); one sharded RL update on the device (all devices,
   ``mesh.fsdp=-1``) against the unsharded update on the CPU.
2. ``speed``: memory bandwidth (a large on-device ``x + 1``) and a bf16 matmul rate; sampling
   throughput of 0.5B / 1.5B-shaped bf16 models at 512 prompt + 512 new tokens against the
   bandwidth bound of a decode step ((weights + KV cache bytes) / bandwidth); the GRPO update's MFU
   at the 1.5B shape with remat; peak device memory next to docs/paper.md's estimate.
3. ``compilation``: five steps of the trainer's loop (`collect_rollouts` + the jitted update) on
   configs/default.py's run; steps 3-5 must compile nothing; compile counts and seconds.
4. ``end_to_end``: ``python train.py`` with its defaults (fresh temp workdir), wall time and the
   before/after table.
5. ``engine``: the rollout engine's decode step against the bandwidth bound of the weights and the
   filled slots' KV cache, its compile time per program, and workload W-tail (engine vs static,
   `bench.rollout_engine`) on the device (bench/accelerator/engine.py).

On a device machine, from the repository root (docs/accelerator/README.md: the install lines and what
each check means)::

    pip install -r requirements.txt && pip install "jax[cuda12]==0.10.2"
    timeout 600 python -m bench.accelerator_check --out=docs/accelerator/report-$(date +%F)-h200.json

On this workplace's lent H200 (jax 0.11.2 preinstalled, no network) the commands are
``bash bench/accelerator/device_check.sh --parts=correctness,compilation,end_to_end`` and
``... --parts=speed`` (two calls: the four parts took about 570 s there on 2026-12-04), with the
wheels of bench/accelerator/fetch_wheels.sh carried.

The parts live in the package bench/accelerator/ (``common``: the shapes, the context, the models;
``correctness``, ``speed``, ``compilation``, ``end_to_end``: one part each; ``report``: running the
parts, the JSON and the table); this module is the command.

On a machine without an accelerator every part is skipped with its reason. ``--cpu-smoke`` runs a
miniature of every part on CPU (8 simulated devices; part 4 is ``train.py --config=configs/tiny.py``
shrunk further), in one to two minutes on 2 cores: tests/bench/test_accelerator_check.py runs it so
that the script cannot rot.

    python -m bench.accelerator_check --cpu-smoke --out=/tmp/report.json
    python -m bench.accelerator_check --parts=correctness,compilation
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
from collections.abc import Callable

# Before jax starts: the CPU smoke simulates 8 devices (as tests/conftest.py does) so that the
# sharded update runs on a real mesh; on a GPU, memory is allocated on demand rather than 75% up
# front, so that part 4's train.py subprocess gets the memory this process does not use.
if "--cpu-smoke" in sys.argv or "--cpu_smoke" in sys.argv:
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        flag = "--xla_force_host_platform_device_count=8"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
from absl import app, flags  # noqa: E402

from bench import harness  # noqa: E402
from bench.accelerator.common import Context, device_profile, smoke_profile  # noqa: E402
from bench.accelerator.compilation import part_compilation  # noqa: E402
from bench.accelerator.correctness import part_correctness  # noqa: E402
from bench.accelerator.end_to_end import part_end_to_end  # noqa: E402
from bench.accelerator.engine import part_engine  # noqa: E402
from bench.accelerator.report import environment, exit_code, jsonable, run_parts, summary_table  # noqa: E402
from bench.accelerator.speed import part_speed  # noqa: E402

PARTS = ("correctness", "speed", "engine", "compilation", "end_to_end")
PART_FUNCTIONS: dict[str, Callable[[Context], dict]] = {
    "correctness": part_correctness, "speed": part_speed, "compilation": part_compilation,
    "end_to_end": part_end_to_end, "engine": part_engine,
}

flags.DEFINE_bool("cpu_smoke", False, "Run a miniature of every part on CPU (seconds; for the tests).")
flags.DEFINE_alias("cpu-smoke", "cpu_smoke")
flags.DEFINE_list("parts", list(PARTS), f"Parts to run, a comma list of {', '.join(PARTS)}.")
flags.DEFINE_string("out", "", "Also write the JSON report to this path.")
flags.DEFINE_float("time_budget_s", 450.0, "Wall-clock budget: measurements that would start after it are "
                   "skipped (and recorded as such); part 4 gets what is left.")
flags.DEFINE_list("sampling_cases", ["qwen2.5-0.5b:64", "qwen2.5-0.5b:256", "qwen2.5-1.5b:256"],
                  "Sampling throughput cases MODEL:BATCH (device run; --cpu-smoke uses its own).")
flags.DEFINE_integer("step_layers", 4, "Layers of the 0.5B-wide model of the update parity check (the CPU "
                     "reference compiles and runs it; the full 24 layers are checked by the forward parity).")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    unknown = sorted(set(FLAGS.parts) - set(PARTS))
    if unknown:
        raise app.UsageError(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    compiles = harness.CompileCounter()
    smoke = FLAGS.cpu_smoke
    profile = smoke_profile() if smoke else device_profile(FLAGS.sampling_cases, FLAGS.step_layers)
    accelerator = jax.default_backend() != "cpu"
    ctx = Context(profile, jax.devices()[0], jax.devices("cpu")[0], time.perf_counter() + FLAGS.time_budget_s,
                  compiles) if smoke or accelerator else None
    functions = {name: PART_FUNCTIONS[name] for name in PARTS if name in FLAGS.parts}
    report = {"script": "bench/accelerator_check.py", "mode": profile.name, "environment": environment(),
              "time_budget_s": FLAGS.time_budget_s}

    def write(text: str) -> None:
        if FLAGS.out:  # written whole, then renamed: a kill never leaves half a file
            path = pathlib.Path(FLAGS.out)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_name(path.name + ".tmp").write_text(text + "\n")
            path.with_name(path.name + ".tmp").replace(path)

    def write_so_far(results: dict) -> None:  # marked incomplete until the last part has run
        write(json.dumps(jsonable(report | {"parts": results, "complete": False}), indent=1))

    report["parts"] = run_parts(functions, ctx, on_part=write_so_far)
    report["passed"] = exit_code(report) == 0
    report["complete"] = True
    report = jsonable(report)
    text = json.dumps(report, indent=1, sort_keys=False)
    write(text)
    print(text)
    print()
    print(summary_table(report))
    sys.exit(exit_code(report))


if __name__ == "__main__":
    app.run(main)
