"""Dynamic sampling with refill, measured: runs of train.py for seeds x algorithms x rl.dynamic_sampling
modes, then one JSON summary per run and a table (docs/dynamic_sampling.md).

    python -m bench.dynamic_sampling --workdir=runs/ds --seeds=0,1,2,3,4 \
        --algorithms=gd2po_hard,gd2po_snr --modes=off,kept --config=configs/tiny.py

Each run is ``train.py --config=CONFIG --config.train.seed=S --config.rl.algorithm=A
--config.rl.dynamic_sampling=M`` (plus ``--set`` overrides) in WORKDIR/<config>-<A>-<M>-s<S>; a run
already finished there is read, not run again. ``--config=tiny_safety``: the test suite's embedded
safety task shrunk to seconds per step (tests.fakes.tiny_safety_config, 6 RL steps).
``--warm_start_from=DIR`` copies a finished run's
base_model/ and warm_start/ into each new workdir (one warm start for all seeds: only RL's seed varies).
The summary per run: the training reward per step against the cumulative generated tokens (every
round's: ``dynamic_sampling/generated_tokens``, else ``generated_tokens``), the mean over the run of the
kept fraction, the gradient norm and the seconds per step (steps 2.., the first compiles), and the
validation before and after RL (results.json). Prints one JSON line per run, then a JSON object per
``algorithm/mode`` of means and SDs over seeds (`compare`), with each reward's sampled mean at the token
budget of the same seed's run without refill.

    python -m bench.dynamic_sampling --from_runs=runs/study_v2/two_rewards/ws0,runs/ds_refill

summarizes finished train.py workdirs made elsewhere (a sweep's runs), labelled by their config.json
(``rl.algorithm``, ``rl.dynamic_sampling``, ``train.seed``), with their ``eval/test.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_dir_name(config: str, algorithm: str, mode: str, seed: int) -> str:
    return f"{pathlib.Path(config).stem}-{algorithm}-{mode}-s{seed}"


def step_seconds(record: dict) -> float:
    """A step's wall-clock seconds: its ``time/*`` phases (not ``time/first_step``, their sum)."""
    return sum(v for k, v in record.items() if k.startswith("time/") and k != "time/first_step")


def summarize(workdir: pathlib.Path, reward_names: list[str] | None = None) -> dict:
    """The measurements of one finished run (module docstring)."""
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if "loss/grad_norm" in r]
    names = reward_names or sorted(k.split("/", 1)[1] for k in steps[0] if k.startswith("reward/"))
    tokens = np.cumsum([r.get("dynamic_sampling/generated_tokens", r.get("generated_tokens", 0.0)) for r in steps])
    timed = steps[1:] or steps
    sampled = {n: [r.get(f"dynamic_sampling/sampled_reward/{n}", r[f"reward/{n}"]) for r in steps] for n in names}
    results = json.loads((workdir / "results.json").read_text()) if (workdir / "results.json").exists() else {}
    return {
        "run": workdir.name,
        "steps": len(steps),
        "generated_tokens_cumulative": tokens.tolist(),
        "sampled_reward": sampled,
        "batch_reward": {n: [r[f"reward/{n}"] for r in steps] for n in names},
        "kept_fraction_mean": float(np.mean([r["advantages/kept_fraction"] for r in steps])),
        "grad_norm_mean": float(np.mean([r["loss/grad_norm"] for r in steps])),
        "seconds_per_step": float(np.mean([step_seconds(r) for r in timed])),
        "rounds_mean": float(np.mean([r.get("dynamic_sampling/rounds", 1.0) for r in steps])),
        "filler_groups_total": float(sum(r.get("dynamic_sampling/filler_groups", 0.0) for r in steps)),
        "before_rl": results.get("before_rl"),
        "after_rl": results.get("after_rl"),
    }


def reward_at_tokens(summary: dict, tokens: float) -> dict[str, float]:
    """Each reward's sampled mean at ``tokens`` cumulative generated tokens, interpolated linearly
    along the run's steps (the fair x-axis: a refill run spends more tokens per step); a budget past
    the run's last step takes its last value."""
    spent = np.asarray(summary["generated_tokens_cumulative"], dtype=float)
    return {n: float(np.interp(tokens, spent, v)) for n, v in summary["sampled_reward"].items()}


def numbers_stats(runs: list[dict], field: str, stats) -> dict:
    """``stats`` over the runs of each number in their ``field`` dict (results.json's ``after_rl``,
    eval/test.json); {} unless every run has it."""
    if not all(r.get(field) for r in runs):
        return {}
    return {k: stats([r[field][k] for r in runs]) for k, v in runs[0][field].items() if isinstance(v, (int, float))}


def compare(summaries: list[dict]) -> dict[str, dict]:
    """Per ``algorithm/mode``, means (and SDs) over the seeds of the run summaries (each with
    ``algorithm``, ``mode``, ``seed``): tokens, rounds, kept fraction, gradient norm, seconds per step,
    the final sampled reward, and the sampled reward at the token budget of the same seed's run
    without refill (``mode`` off of the same algorithm, where there is one)."""
    by_arm: dict[str, list[dict]] = {}
    for summary in summaries:
        by_arm.setdefault(f"{summary['algorithm']}/{summary['mode']}", []).append(summary)
    off = {(s["algorithm"], s["seed"]): s for s in summaries if s["mode"] == "off"}
    table = {}
    for arm, runs in sorted(by_arm.items()):
        names = list(runs[0]["sampled_reward"])

        def stats(values):
            values = np.asarray(values, dtype=float)
            return {"mean": float(values.mean()), "sd": float(values.std(ddof=1)) if len(values) > 1 else 0.0}

        budgets = [(r, off[(r["algorithm"], r["seed"])]) for r in runs if (r["algorithm"], r["seed"]) in off]
        table[arm] = {
            "seeds": sorted(r["seed"] for r in runs),
            "generated_tokens": stats([r["generated_tokens_cumulative"][-1] for r in runs]),
            "rounds": stats([r["rounds_mean"] for r in runs]),
            "kept_fraction": stats([r["kept_fraction_mean"] for r in runs]),
            "grad_norm": stats([r["grad_norm_mean"] for r in runs]),
            "seconds_per_step": stats([r["seconds_per_step"] for r in runs]),
            "final_sampled_reward": {n: stats([r["sampled_reward"][n][-1] for r in runs]) for n in names},
            "sampled_reward_at_off_tokens": {
                n: stats([reward_at_tokens(r, o["generated_tokens_cumulative"][-1])[n] for r, o in budgets])
                for n in names
            } if budgets else None,
            "after_rl": numbers_stats(runs, "after_rl", stats),
            "test": numbers_stats(runs, "test", stats),
        }  # fmt: skip
    return table


def _cell(stat: dict | None, digits: int = 3) -> str:
    return "-" if stat is None else f"{stat['mean']:.{digits}f} ± {stat['sd']:.{digits}f}"


def markdown_table(table: dict[str, dict], test_keys: list[str] | None = None) -> str:
    """`compare`'s table as markdown: one row per algorithm/mode (docs/dynamic_sampling.md); the test
    columns ``test_keys`` (default: every number of eval/test.json)."""
    names = sorted({n for arm in table.values() for n in arm["final_sampled_reward"]})
    tests = test_keys or sorted({k for arm in table.values() for k in arm["test"]})
    header = ["arm", "seeds", "tokens", "rounds/step", "kept fraction", "grad norm", "s/step"]
    header += [f"{n}, last step" for n in names] + [f"{n} at off's tokens" for n in names]
    header += [f"test {k}" for k in tests]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for arm, row in table.items():
        at_off = row["sampled_reward_at_off_tokens"] or {}
        cells = [
            arm,
            str(len(row["seeds"])),
            _cell(row["generated_tokens"], 0),
            _cell(row["rounds"], 2),
            _cell(row["kept_fraction"]),
            _cell(row["grad_norm"]),
            _cell(row["seconds_per_step"], 2),
        ]
        cells += [_cell(row["final_sampled_reward"].get(n)) for n in names]
        cells += [_cell(at_off.get(n)) for n in names]
        cells += [_cell(row["test"].get(k)) for k in tests]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_dirs(roots: list[pathlib.Path]) -> list[pathlib.Path]:
    """Every finished train.py workdir (config.json, metrics.jsonl and results.json) under ``roots``."""
    found = {p.parent for root in roots for p in root.rglob("results.json")}
    return sorted(d for d in found if (d / "config.json").is_file() and (d / "metrics.jsonl").is_file())


def summarize_existing(workdir: pathlib.Path) -> dict:
    """`summarize` of a workdir made elsewhere (a sweep's run), labelled from its config.json, with its
    test evaluation (eval/test.json) when it has one."""
    config = json.loads((workdir / "config.json").read_text())
    test_file = workdir / "eval" / "test.json"
    test = json.loads(test_file.read_text()) if test_file.is_file() else None
    return summarize(workdir) | {
        "algorithm": config["rl"]["algorithm"], "mode": config["rl"].get("dynamic_sampling", "off"),
        "seed": config["train"]["seed"], "run": str(workdir), "test": test,
    }  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="")
    parser.add_argument("--config", default="configs/tiny.py")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--algorithms", default="gd2po_hard,gd2po_snr")
    parser.add_argument("--modes", default="off,kept")
    parser.add_argument("--warm_start_from", default="")
    parser.add_argument("--set", action="append", default=[], help="extra --config.X=V overrides (repeatable)")
    parser.add_argument("--summarize_only", action="store_true")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown too, after the JSON")
    parser.add_argument("--test_keys", default="", help="with --markdown: the eval/test.json columns (default: all)")
    parser.add_argument(
        "--from_runs", default="", help="comma-separated directories: summarize the finished train.py workdirs "
        "under them (e.g. sweeps' runs, labelled by their config.json) instead of running; --workdir is unused"
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.from_runs:
        wanted = set(args.algorithms.split(","))
        summaries = [summarize_existing(d) for d in run_dirs([pathlib.Path(r) for r in args.from_runs.split(",")])]
        summaries = [s for s in summaries if s["algorithm"] in wanted]  # --algorithms: the arms to compare
        for summary in summaries:
            print(json.dumps(summary), flush=True)
        print(json.dumps(compare(summaries)), flush=True)
        if args.markdown:
            print(markdown_table(compare(summaries), args.test_keys.split(",") if args.test_keys else None))
        return 0
    if not args.workdir:
        parser.error("--workdir is required (or --from_runs)")
    root = pathlib.Path(args.workdir)
    root.mkdir(parents=True, exist_ok=True)
    if args.config == "tiny_safety":  # the test suite's shrunk embedded safety task, 6 RL steps
        args.config = str(root / "tiny_safety.py")
        pathlib.Path(args.config).write_text(
            f"import sys\nsys.path.insert(0, {str(REPO)!r})\nfrom tests.fakes import tiny_safety_config\n\n\n"
            "def get_config():\n    return tiny_safety_config(train__num_steps=6)\n"
        )
    summaries = []
    for algorithm in args.algorithms.split(","):
        for mode in args.modes.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                workdir = root / run_dir_name(args.config, algorithm, mode, seed)
                if not (workdir / "results.json").exists() and not args.summarize_only:
                    if args.warm_start_from and not (workdir / "warm_start").exists():
                        workdir.mkdir(parents=True, exist_ok=True)
                        for name in ("base_model", "warm_start"):
                            shutil.copytree(pathlib.Path(args.warm_start_from) / name, workdir / name)
                    command = [
                        sys.executable, str(REPO / "train.py"), f"--config={args.config}", f"--workdir={workdir}",
                        f"--config.train.seed={seed}", f"--config.rl.algorithm={algorithm}",
                        f"--config.rl.dynamic_sampling={mode}", *(f"--config.{s}" for s in args.set),
                    ]  # fmt: skip
                    with (root / f"{workdir.name}.log").open("w") as log:
                        subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True)
                if (workdir / "metrics.jsonl").exists():
                    summary = summarize(workdir) | {"algorithm": algorithm, "mode": mode, "seed": seed}
                    summaries.append(summary)
                    print(json.dumps(summary), flush=True)
    print(json.dumps(compare(summaries)), flush=True)
    if args.markdown:
        print(markdown_table(compare(summaries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
