"""Train a policy with GRPO / GDPO / GD2PO.

    python train.py                                         # the embedded default, ./runs/default
    python train.py --config=configs/default.py --workdir=DIR --config.rl.algorithm=gd2po_hard

Rerunning the same command resumes from the latest checkpoint in the workdir.
"""

from absl import app, flags
from ml_collections import config_flags

from gd2po_jax import cli
from gd2po_jax.config_validation import ConfigError
from gd2po_jax.trainer import train_and_evaluate

config_flags.DEFINE_config_file("config", "configs/default.py", "Training config file.", lock_config=True)
flags.DEFINE_string("workdir", "runs/default", "Directory for checkpoints, metrics and results.")
FLAGS = flags.FLAGS


def main(argv):
    cli.start(argv)
    try:
        train_and_evaluate(FLAGS.config, FLAGS.workdir)
    except ConfigError as err:
        raise SystemExit(f"train.py: {err}") from None


if __name__ == "__main__":
    app.run(main)
