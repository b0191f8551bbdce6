"""Train a policy with GRPO / GDPO / GD2PO.

    python train.py                                         # the embedded default, ./runs/default
    python train.py --config=configs/safety_embedded.py     # the embedded safety task, ./runs/safety_embedded
    python train.py --config=configs/default.py --workdir=DIR --config.rl.algorithm=gd2po_hard
    python train.py --config=configs/resolved.py:DIR/config.json --workdir=NEW_DIR  # rerun a run's config

Rerunning the same command resumes from the latest intact checkpoint in the workdir (a rerun with
another config is refused, naming the fields: see gd2po_jax/runtime/run_dir.py's RESUMABLE_FIELDS); a
second process on a busy workdir stops at once, naming the holder of WORKDIR/.lock. With
--warm_start_only it builds the supervised warm start (WORKDIR/warm_start, or the shared one in
config.sft.cache_dir) and stops; sweep.py does this once before its runs.

On several hosts, every host runs the same command with the same --workdir (shared storage) and
--config.distributed.coordinator_address=HOST:PORT --config.distributed.num_processes=N
--config.distributed.process_id=I (docs/multihost.md).
"""

import sys

import jax
from absl import flags

from gd2po_jax import cli
from gd2po_jax.config import RunConfig
from gd2po_jax.jobs.train import train_and_evaluate
from gd2po_jax.runtime import compilation_cache, distributed, preemption
from gd2po_jax.sft.warm_start import build_warm_start

FLAGS = flags.FLAGS


def define_flags() -> None:
    """train.py's flags (`cli.run` calls this before parsing the command line)."""
    main_module = cli.main_module_name()
    cli.define_config_flag("config", cli.default_config_file(), "Training config file (configs/*.py[:ARG]).")
    flags.DEFINE_string(
        "workdir",
        "",
        "Directory for checkpoints, metrics and results; default runs/<config file "
        "name> (runs/default for configs/default.py).",
        module_name=main_module,
    )
    flags.DEFINE_bool("warm_start_only", False, "Only build the SFT warm start, then stop.", module_name=main_module)


def main(argv):
    cli.start(argv)
    workdir = FLAGS.workdir or cli.default_workdir(FLAGS["config"])
    preempted = None
    # Several processes: one's error stops them all. A user's error: one line naming the field, file (and
    # its free space), row, reward function, arrays or processes (gd2po_jax.errors.UserError), exit code 2.
    with distributed.stop_all_on_error(), cli.user_errors("train.py"):
        try:
            config = RunConfig.from_config_dict(FLAGS.config)  # the one typed config from here on
            distributed.initialize(config.distributed)  # before any other use of JAX
            compilation_cache.enable(config.logging.compilation_cache)  # a rerun skips compiling
            if FLAGS.warm_start_only:
                path = build_warm_start(config, workdir)
                if distributed.is_primary():
                    print(f"warm start: {path}")
            else:
                train_and_evaluate(config, workdir)
        except preemption.Preempted as stop:
            if stop.step is None and jax.process_count() > 1:
                raise SystemExit(f"train.py: {stop}") from None  # this process alone: the others stop too
            preempted = stop  # every process saved the same step: each ends cleanly
    if preempted is not None:  # docs/preemption.md: exit code 128 + the signal's number (143: SIGTERM)
        print(f"train.py: {preempted}", file=sys.stderr)
        raise SystemExit(preempted.exit_code)


def run() -> None:
    """``python train.py`` and the console script ``gd2po-train``."""
    cli.run(__doc__, define_flags, main)


if __name__ == "__main__":
    run()
