"""Tables, significance tests and plots of a sweep (sweep.py) directory.

    python report.py --sweep_dir=DIR [--out_dir=DIR/report]

Writes summary.md and summary.csv (the final test metrics the run's task declares and the area
under the training curve of each of the run's reward columns, mean ± 95% CI over seeds; p-values of a
paired t-test of each method against GDPO; which tau: gd2po_snr's thresholds against each other,
Holm-corrected, the best marked; a warning under 5 seeds), tau_tests.csv, learning_curves.png,
diagnostics.png (conflict ratio, kept fraction), conflicts.png (the reward pairs' conflicts per run)
and tau.png (each test metric against the SNR threshold). Unfinished runs are left out and listed. See
gd2po_jax/experiments/sweep_report.py.
"""

from absl import flags

from gd2po_jax import cli
from gd2po_jax.experiments.sweep_report import write_report

FLAGS = flags.FLAGS


def define_flags() -> None:
    """report.py's flags (`cli.run` calls this before parsing the command line)."""
    main_module = cli.main_module_name()
    flags.DEFINE_string("sweep_dir", None, "Directory written by sweep.py.", required=True, module_name=main_module)
    flags.DEFINE_string("out_dir", "", "Where the report goes (default: SWEEP_DIR/report).", module_name=main_module)


def main(argv):
    cli.start(argv)
    with cli.user_errors("report.py"):
        written = write_report(FLAGS.sweep_dir, FLAGS.out_dir or None)
    print(written["markdown"].read_text())
    print("written:", ", ".join(str(p) for p in [written["markdown"], written["csv"], *written["plots"]]))


def run() -> None:
    """``python report.py`` and the console script ``gd2po-report``."""
    cli.run(__doc__, define_flags, main)


if __name__ == "__main__":
    run()
