"""Run a grid of training runs (algorithms x SNR thresholds x seeds) and evaluate each on the test split.

    python sweep.py --config=configs/default.py --sweep_dir=DIR \\
        --algorithms=grpo,gdpo,gd2po_hard,gd2po_snr --snr_taus=0.2,0.5,0.8 --seeds=0,1,2,3,4 \\
        [--parallel=N] [--config.train.num_steps=100 ...]

Each run is ``train.py`` in DIR/runs/<method>/seed<k> from its resolved config (the config file,
the ``--config.*`` overrides given here and its own algorithm, threshold (GD2PO-SNR only) and seed),
written to the run's config.json first, then ``eval.py --split=test``; command.txt and log.txt of
each run are in its workdir. All runs start RL from one SFT warm start, trained once first
(config.sft.cache_dir, default DIR/warm_starts), unless train.py would run without one: with
config.sft.only_with_targets (configs/files.py) and no row with a target the runs start from the
model (``--config.sft.enabled=False`` turns the warm start off for any config). ``--parallel=N``
runs N at once, one GPU each (default: one per visible GPU; 1 on CPU). Rerun the same command to
resume: finished runs are skipped, and a run whose config.json differs from its config now is
refused. The exit status is non-zero if a run failed; the failures and their logs are listed at
the end. When every run has finished, the report (report.py) is written to DIR/report. See
gd2po_jax/experiments/sweeps.py.
"""

import signal
import sys

from absl import flags
from ml_collections import config_flags

from gd2po_jax import cli
from gd2po_jax.config import RunConfig
from gd2po_jax.experiments import sweeps

FLAGS = flags.FLAGS


def define_flags() -> None:
    """sweep.py's flags (`cli.run` calls this before parsing the command line)."""
    main_module = cli.main_module_name()
    cli.define_config_flag("config", cli.default_config_file(), "Training config file of every run.")
    flags.DEFINE_string(
        "sweep_dir", None, "Directory of the sweep (runs, sweep.json, report).", required=True, module_name=main_module
    )
    flags.DEFINE_list(
        "algorithms", "grpo,gdpo,gd2po_hard,gd2po_snr", "Algorithms (config.rl.algorithm).", module_name=main_module
    )
    flags.DEFINE_list("snr_taus", "0.2,0.5,0.8", "Thresholds config.rl.snr_tau of gd2po_snr.", module_name=main_module)
    flags.DEFINE_list("seeds", "0,1,2,3,4", "Seeds config.train.seed of every method.", module_name=main_module)
    flags.DEFINE_integer(
        "parallel", 0, "Runs at once, one GPU each; 0: one per visible GPU, 1 on CPU.", module_name=main_module
    )


def _stop(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv):
    cli.start(argv)
    with cli.user_errors("sweep.py"):
        sweep = sweeps.plan_sweep(
            FLAGS.sweep_dir,
            config=RunConfig.from_config_dict(FLAGS.config),
            config_file=config_flags.get_config_filename(FLAGS["config"]),
            overrides=config_flags.get_override_values(FLAGS["config"]),
            algorithms=FLAGS.algorithms,
            snr_taus=FLAGS.snr_taus,
            seeds=FLAGS.seeds,
            parallel=FLAGS.parallel,
        )
    signal.signal(signal.SIGTERM, _stop)
    print(
        f"sweep: {len(sweep.specs)} runs in {sweep.sweep_dir / 'runs'}, "
        f"{len(sweep.devices)} at a time on {', '.join(d or 'cpu' for d in sweep.devices)}"
    )
    if sweep.config.sft.enabled and not sweep.warm_start:
        print(f"sweep: no warm start: {sweeps.NO_TARGETS}")
    try:
        outcomes = sweeps.run_sweep(sweep)
    except KeyboardInterrupt:
        print(f"sweep: interrupted; rerun the same command to resume ({sweep.sweep_dir / 'sweep.json'})")
        sys.exit(130)
    lines, status = sweeps.summary_lines(outcomes)
    print("\n".join(lines))
    if status == 0:
        from gd2po_jax.experiments import sweep_report as report

        written = report.write_report(sweep.sweep_dir)
        print(f"report: {written['markdown']}")
    sys.exit(status)


def run() -> None:
    """``python sweep.py`` and the console script ``gd2po-sweep``."""
    cli.run(__doc__, define_flags, main)


if __name__ == "__main__":
    run()
