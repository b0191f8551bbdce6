# python train.py [--config=configs/*.py] [--workdir=DIR] ...: train a policy with GRPO / GDPO / GD2PO.
# The command is gd2po_jax/cli/train.py (its flags, main and --help text); an install runs the same
# code as the console script gd2po-train (docs/install.md).

from gd2po_jax.cli import train

if __name__ == "__main__":
    train.run()
