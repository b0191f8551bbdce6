"""Part 4 of the accelerator check: the embedded default end to end (``python train.py`` in a fresh
temporary workdir), its wall time and before/after table beside the README's CPU numbers."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from bench.accelerator.common import REPO, Context, check
from gd2po_jax.tasks.base import results_table

# The README's validation table of the embedded default (its CPU run), read when part 4 reports:
# metric key -> the row's label at the start of a table row.
README_ROWS = {"correct_acc": "Correct Acc", "format_acc": "Format Acc", "truncation_rate": "Truncation rate"}


def readme_default_table(readme: pathlib.Path) -> dict[str, dict[str, float]]:
    """{metric: {"before_rl", "after_rl"}} from the README's table rows ``| label | before | after |``
    (bold marks dropped), so that part 4 sets the device's run beside the README's current numbers.

    Raises:
      ValueError: naming the README and the row that is missing or not two numbers.
    """
    rows = {}
    for line in readme.read_text().splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if len(cells) == 3:
            rows.setdefault(cells[0], cells[1:])
    table = {}
    for key, label in README_ROWS.items():
        try:
            before, after = (float(c) for c in rows[label])
        except (KeyError, ValueError):
            raise ValueError(f"{readme}: no table row '| {label} | <before> | <after> |' with two numbers "
                             f"(found {rows.get(label)!r})") from None
        table[key] = {"before_rl": before, "after_rl": after}
    return table


def part_end_to_end(ctx: Context) -> dict:
    profile = ctx.profile
    timeout = ctx.remaining() - 5
    if timeout < profile.min_part4_s:
        return {"status": "skipped", "reason": f"time budget spent ({max(timeout, 0):.0f} s left); run "
                "--parts=end_to_end alone"}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    with tempfile.TemporaryDirectory(prefix="accelerator_check_train_") as workdir:
        command = [sys.executable, "train.py", f"--workdir={workdir}", *profile.train_args]
        start = time.perf_counter()
        try:
            proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            tail = (err.stdout or b"")[-2000:]
            raise RuntimeError(f"{' '.join(command[1:])} did not finish in {timeout:.0f} s; output tail:\n"
                               f"{tail.decode(errors='replace') if isinstance(tail, bytes) else tail}") from None
        wall = time.perf_counter() - start
        results_path = pathlib.Path(workdir) / "results.json"
        results = json.loads(results_path.read_text()) if results_path.is_file() else None
    result = {"command": " ".join(["python", *command[1:]]).replace(workdir, "TMP"), "returncode": proc.returncode,
              "wall_s": wall}
    checks = [check("train.py exit status", proc.returncode, 0, proc.returncode == 0)]
    if proc.returncode != 0:
        result["output_tail"] = (proc.stdout + proc.stderr)[-3000:]
    checks.append(check("results.json written", results is not None, True, results is not None))
    if results is not None:
        before, after = results.get("before_rl") or {}, results.get("after_rl") or {}
        keys = ("correct_acc", "correctness", "format_acc", "length", "truncation_rate")
        result["table"] = results_table(results)
        result["before_rl"] = {k: before.get(k) for k in keys}
        result["after_rl"] = {k: after.get(k) for k in keys}
        finite = all(isinstance(v, (int, float)) and math.isfinite(v)
                     for v in [*result["before_rl"].values(), *result["after_rl"].values()])
        checks.append(check("before/after metrics finite", finite, True, finite))
        if profile.name == "device":
            result["readme_cpu"] = readme_default_table(REPO / "README.md")
    return result | {"checks": checks}
