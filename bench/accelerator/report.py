"""The accelerator check's report: each part run in turn with its status, seconds and compiles
(one failing part does not stop the others), the exit status, the environment, strict JSON and the
short human table printed after it."""

from __future__ import annotations

import datetime
import gc
import importlib.metadata
import math
import subprocess
import sys
import time
import traceback
from collections.abc import Callable

import jax
import numpy as np

from bench.accelerator.common import REPO, Context, peak_flops


def run_part(fn: Callable[[Context], dict], ctx: Context) -> dict:
    """``fn(ctx)`` with its status ("passed" | "failed" | "error" | "skipped"), seconds and compiles;
    an exception becomes status "error" with its traceback, and the next part still runs."""
    compiles = ctx.compiles
    before, start = (compiles.snapshot() if compiles else (0, 0.0)), time.perf_counter()
    try:
        result = dict(fn(ctx))
    except Exception as err:  # noqa: BLE001 - one failing part must not stop the others
        result = {"status": "error", "error": f"{type(err).__name__}: {err}",
                  "traceback": traceback.format_exc()[-4000:]}
    if "status" not in result:
        result["status"] = "passed" if all(c["passed"] for c in result.get("checks", [])) else "failed"
    result["seconds"] = time.perf_counter() - start
    if compiles is not None:
        result["compiles"], result["compile_s"] = compiles.since(before)
    gc.collect()
    return result


def run_parts(functions: dict[str, Callable[[Context], dict]], ctx: Context | None,
              on_part: Callable[[dict], None] | None = None) -> dict:
    """{part name: result} of each function in turn (every part is skipped, with the reason, when
    ``ctx`` is None: no accelerator; a part that would start after the time budget is skipped, saying
    so). ``on_part(results so far)`` runs after each part (main writes the report so far: a run killed
    by an outer time limit keeps the parts it finished)."""
    if ctx is None:
        reason = (f"no accelerator: jax's default backend is {jax.default_backend()!r}. The numbers wait for a "
                  "device machine; --cpu-smoke runs a miniature of every part on CPU")
        return {name: {"status": "skipped", "reason": reason} for name in functions}
    results = {}
    for name, fn in functions.items():
        if ctx.remaining() <= 0:
            results[name] = {"status": "skipped", "reason": f"time budget spent before it started; run "
                             f"--parts={name} alone"}
        else:
            print(f"[accelerator_check] {name} ...", file=sys.stderr, flush=True)
            results[name] = run_part(fn, ctx)
            print(f"[accelerator_check] {name}: {results[name]['status']} in {results[name]['seconds']:.1f} s",
                  file=sys.stderr, flush=True)
        if on_part is not None:
            on_part(results)
    return results


def exit_code(report: dict) -> int:
    """1 if any part failed or raised, else 0 (skipped parts are not failures)."""
    return int(any(part["status"] in ("failed", "error") for part in report["parts"].values()))


def environment() -> dict:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    device = jax.devices()[0]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "python": sys.version.split()[0], "jax": jax.__version__, "jaxlib": importlib.metadata.version("jaxlib"),
        "backend": jax.default_backend(), "device_kind": device.device_kind, "device_count": jax.device_count(),
        "peak_bf16_flops": peak_flops(device.device_kind),
    }


def jsonable(value):
    """``value`` with numpy scalars as Python numbers and non-finite floats as None (strict JSON)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    return value


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f}"


def summary_table(report: dict) -> str:
    """The short human table printed after the JSON."""
    env = report["environment"]
    lines = [f"accelerator check ({report['mode']}): {env['device_kind']} x{env['device_count']}, jax {env['jax']}, "
             f"commit {env['commit']}",
             f"{'part':<13}{'status':<9}{'seconds':>8}{'compiles':>10}  failed checks / reason"]
    for name, part in report["parts"].items():
        failed = [c["name"] for c in part.get("checks", []) if not c["passed"]]
        note = part.get("reason") or part.get("error") or "; ".join(failed)
        lines.append(f"{name:<13}{part['status']:<9}{part.get('seconds', 0):>8.1f}{part.get('compiles', 0):>10}  "
                     f"{note[:100]}")
    correctness = report["parts"].get("correctness", {})
    if "logits_rel_l2" in correctness:
        errors = ", ".join(f"{k} {v:.1e}" for k, v in correctness["logits_rel_l2"].items())
        greedy = ", ".join(f"{k} {g['matches']}/{g['tokens']}" for k, g in correctness["greedy"].items())
        lines.append(f"correctness: logits rel L2 {errors}; greedy = argmax {greedy}; update rel L2 "
                     f"{correctness['update']['update_rel_l2']:.1e}")
    speed = report["parts"].get("speed", {})
    if "bandwidth_bytes_per_s" in speed:
        lines.append(f"speed: bandwidth {speed['bandwidth_bytes_per_s'] / 1e9:,.0f} GB/s, bf16 matmul "
                     f"{speed['matmul_bf16_flops_per_s'] / 1e12:,.1f} TFLOP/s")
        lines.append(f"  {'sampling':<14}{'batch':>6}{'prefill tok/s':>15}{'decode tok/s':>14}{'step ms':>9}"
                     f"{'bound ms':>9}{'of bound':>9}{'prog MiB':>10}{'est MiB':>9}")
        for c in speed["sampling"]:
            program = max(v or 0 for k, v in c["memory_bytes"].items() if k.endswith("_program"))
            lines.append(f"  {c['model']:<14}{c['batch']:>6}{c['prefill_tokens_per_s']:>15,.0f}"
                         f"{c['decode_tokens_per_s']:>14,.0f}{c['decode_step_ms']:>9.2f}{c['bound_step_ms']:>9.2f}"
                         f"{c['of_bound']:>9.0%}{_mib(program):>10}{_mib(c['memory_bytes']['estimate']):>9}")
        u = speed.get("update")
        if u:
            mfu = "-" if u["mfu"] is None else f"{u['mfu']:.1%}"
            if u.get("mfu_hardware") is not None:  # reports before issue 59 have the model FLOPs' alone
                mfu += f" (hardware FLOPs {u['mfu_hardware']:.1%})"
            lines.append(f"  update {u['model']} ({u['rows']} x {u['seq']} tokens, remat, bf16"
                         f"{', ' + u['attention'] + ' attention' if 'attention' in u else ''}): "
                         f"{u['step_s_best']:.2f} s, "
                         f"{u['tokens_per_s']:,.0f} tokens/s, MFU {mfu} ({u['of_measured_matmul_rate']:.1%} of the "
                         f"measured matmul rate), program {_mib(u['memory_bytes']['program'])} MiB, device peak "
                         f"{_mib(u['memory_bytes']['device_peak_so_far'])} MiB, estimate "
                         f"{_mib(u['memory_bytes']['estimate'])} MiB")
    compilation = report["parts"].get("compilation", {})
    if "compiles_after_step_2" in compilation:
        lines.append(f"compilation: {compilation['compiles_steps_1_2']} compiles in steps 1-2 "
                     f"({compilation['compile_s_steps_1_2']:.1f} s), {compilation['compiles_after_step_2']} after; "
                     f"first step {compilation['first_step_s']:.1f} s, then {compilation['steady_step_s']:.2f} s")
    e2e = report["parts"].get("end_to_end", {})
    if "wall_s" in e2e:
        lines.append(f"end to end: {e2e['command']} in {e2e['wall_s']:.0f} s")
        lines.extend("  " + line for line in e2e.get("table", "").splitlines())
    return "\n".join(lines)
