"""Issue 62's "Done when", as a user runs it: a task of TRL-form reward functions and a data set without a
``target`` column (tests/own_task_helpers.py) swept over 2 thresholds x 2 seeds with sweep.py (no warm start,
as train.py decides), the report with its PNGs, eval.py --data on a JSONL file scored by the run's own
functions, and export.py of a run. Each a subprocess, from the user's directory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from PIL import Image

from tests.fakes import REPO, subprocess_env
from tests.own_task_helpers import override_flags, write_user_dir
from tests.xla_env import xla_flags

pytestmark = pytest.mark.slow


def _run(cwd, *args, timeout=1800) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=subprocess_env(XLA_FLAGS=xla_flags(1)),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def test_sweep_report_eval_data_and_export_of_a_trl_form_task_without_targets(tmp_path):
    user = write_user_dir(tmp_path / "user")
    sweep_dir = user / "sweep"
    sweep = _run(user, REPO / "sweep.py", f"--config={REPO / 'configs' / 'files.py'}", f"--sweep_dir={sweep_dir}",
                 "--algorithms=gd2po_snr", "--snr_taus=0.3,0.8", "--seeds=0,1",
                 *override_flags(user, **{"rl.mask_truncated_completions": True}))
    assert "sweep: no warm start: config.sft.only_with_targets" in sweep.stdout
    assert "sweep: 4 finished" in sweep.stdout
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert record["warm_start"]["enabled"] is False and not (sweep_dir / "warm_starts").exists()

    report = sweep_dir / "report"
    markdown = (report / "summary.md").read_text()
    assert "| method | seeds | brevity | digits | sum | AUC brevity | AUC digits |" in markdown
    assert "## Which tau" in markdown and "fewer than 5 seeds" in markdown
    pngs = sorted(p.name for p in report.glob("*.png"))
    assert {"learning_curves.png", "diagnostics.png", "tau.png"} <= set(pngs)
    for name in pngs:
        with Image.open(report / name) as image:
            image.verify()

    run = sweep_dir / "runs" / "gd2po_snr-tau0.3" / "seed0"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {"reward/brevity", "reward/digits", "reward_sum/mean", "reward_sum/std"} <= set(metrics[-1])
    assert "time/first_step" in metrics[0]
    evaluated = _run(user, REPO / "eval.py", f"--workdir={run}", f"--data={user / 'val.jsonl'}", "--trust_workdir_code")
    result = json.loads((run / "eval" / "data-val.json").read_text())
    assert result["reward_names"] == ["brevity", "digits"] and result["num_examples"] == 4
    assert "digits" in evaluated.stdout and "Correct Acc" not in evaluated.stdout

    _run(user, REPO / "export.py", f"--workdir={run}", f"--out={user / 'exported'}", "--trust_workdir_code")
    assert (user / "exported" / "model.safetensors").is_file()
