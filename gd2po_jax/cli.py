"""What train.py and eval.py share: argument checks and logging setup."""

import logging

from absl import app

_NOISY_LOGGERS = ("absl", "jax", "orbax", "datasets", "httpx", "urllib3")


def start(argv) -> None:
    """Reject positional arguments and log INFO from our modules, WARNING from the libraries."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
