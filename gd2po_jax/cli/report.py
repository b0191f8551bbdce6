"""Tables, significance tests and plots of sweeps (sweep.py), their run summaries, and studies.

    python report.py --sweep_dir=DIR [--out_dir=DIR/report]
    python report.py --sweep_dir=A,B,... --out_dir=OUT          # several sweeps (warm starts): blocks
    python report.py --sweep_dir=A,B,... --export_summaries=DIR  # DIR/<method>/sft<k>-seed<j>.json
    python report.py --summaries=DIR[,DIR...] --out_dir=OUT      # the report from committed summaries
    python report.py --study=FILE [--out_dir=DIR]                # hypotheses, Holm, verdicts

A sweep report writes summary.md and summary.csv (the final test metrics the run's task declares and
the area under the training curve of each of the run's reward columns, mean ± 95% CI over seeds --
blocks (sft.seed, train.seed) over several sweeps; p-values of a paired t-test of each method against
GDPO; which tau: gd2po_snr's thresholds against each other, Holm-corrected, the best marked; a warning
under 5 seeds), tau_tests.csv, learning_curves.png, diagnostics.png (conflict ratio, kept fraction),
conflicts.png (the reward pairs' conflicts per run) and tau.png (each test metric against the SNR
threshold). Unfinished runs are left out and listed. See gd2po_jax/experiments/sweep_report.py; run
summaries and studies: gd2po_jax/experiments/study.py and docs/sweeps.md.
"""

import pathlib

from absl import flags

from gd2po_jax import cli
from gd2po_jax.experiments import study
from gd2po_jax.experiments.sweep_report import ReportError, sweep_dirs, write_report, write_runs_report

FLAGS = flags.FLAGS


def define_flags() -> None:
    """report.py's flags (`cli.run` calls this before parsing the command line)."""
    main_module = cli.main_module_name()
    flags.DEFINE_string(
        "sweep_dir", "", "Directory written by sweep.py, or several, comma-separated.", module_name=main_module
    )
    flags.DEFINE_string(
        "summaries",
        "",
        "Directories of run summaries (--export_summaries), comma-separated: the report reads them instead of sweeps.",
        module_name=main_module,
    )
    flags.DEFINE_string(
        "export_summaries",
        "",
        "With --sweep_dir: write a small JSON per finished run to DIR/<method>/sft<k>-seed<j>.json (no report).",
        module_name=main_module,
    )
    flags.DEFINE_string(
        "study", "", "A study file (JSON): test its hypotheses on their summaries.", module_name=main_module
    )
    flags.DEFINE_string(
        "out_dir",
        "",
        "Where the report goes (default: SWEEP_DIR/report; the study file's directory for --study).",
        module_name=main_module,
    )


def _dirs(text: str) -> list[pathlib.Path]:
    return [pathlib.Path(part.strip()) for part in text.split(",") if part.strip()]


def check_flags(sweep_dir: str, summaries: str, export: str, study_file: str, out_dir: str) -> str:
    """Which job the flags ask for: ``export``, ``summaries``, ``study`` or ``sweep``.

    Raises:
      ReportError: naming the flags that do not go together or are missing.
    """
    inputs = [
        name
        for name, value in (("--sweep_dir", sweep_dir), ("--summaries", summaries), ("--study", study_file))
        if value
    ]
    if len(inputs) != 1:
        given = ", ".join(inputs) if inputs else "none"
        raise ReportError(f"give one of --sweep_dir, --summaries or --study (given: {given})")
    if export:
        if not sweep_dir:
            raise ReportError("--export_summaries: reads --sweep_dir (the sweeps whose finished runs it summarizes)")
        if out_dir:
            raise ReportError("--export_summaries writes summaries only; leave out --out_dir")
        return "export"
    if summaries:
        if not out_dir:
            raise ReportError("--summaries: give --out_dir (where the report goes)")
        return "summaries"
    return "study" if study_file else "sweep"


def main(argv):
    cli.start(argv)
    with cli.user_errors("report.py"):
        job = check_flags(FLAGS.sweep_dir, FLAGS.summaries, FLAGS.export_summaries, FLAGS.study, FLAGS.out_dir)
        if job == "export":
            out = pathlib.Path(FLAGS.export_summaries)
            done = study.export_summaries(sweep_dirs(FLAGS.sweep_dir), out)
            for path in done["written"]:
                print("written:", path)
            print(
                f"{len(done['written'])} run summaries written, {len(done['unchanged'])} unchanged in {out}; "
                f"{len(done['unfinished'])} unfinished runs left out"
            )
            return
        if job == "study":
            written = study.write_study(FLAGS.study, FLAGS.out_dir or None)
            print(written["markdown"].read_text())
            for result in written["results"]:
                print(study.verdict_line(result))
            print("written:", written["json"], written["markdown"])
            return
        if job == "summaries":
            dirs = _dirs(FLAGS.summaries)
            runs, _ = study.load_summaries(dirs)
            note = f"{len(runs)} runs from the summaries in " + ", ".join(f"`{d}`" for d in dirs) + "."
            title = "Report: " + ", ".join(d.name for d in dirs)
            written = write_runs_report(runs, pathlib.Path(FLAGS.out_dir), title=title, notes=[note])
        else:
            written = write_report(FLAGS.sweep_dir, FLAGS.out_dir or None)
    print(written["markdown"].read_text())
    print("written:", ", ".join(str(p) for p in [written["markdown"], written["csv"], *written["plots"]]))


def run() -> None:
    """``python report.py`` and the console script ``gd2po-report``."""
    cli.run(__doc__, define_flags, main)


if __name__ == "__main__":
    run()
