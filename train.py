"""Train a policy with GRPO / GDPO / GD2PO.

    python train.py                                         # the embedded default, ./runs/default
    python train.py --config=configs/default.py --workdir=DIR --config.rl.algorithm=gd2po_hard

Rerunning the same command resumes from the latest checkpoint in the workdir.
"""

import logging

from absl import app, flags
from ml_collections import config_flags

from gd2po_jax.trainer import train_and_evaluate

config_flags.DEFINE_config_file("config", "configs/default.py", "Training config file.", lock_config=True)
flags.DEFINE_string("workdir", "runs/default", "Directory for checkpoints, metrics and results.")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "jax", "orbax", "datasets", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)
