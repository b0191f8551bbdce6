# python sweep.py --sweep_dir=DIR [--config=...] [--algorithms=...] [--snr_taus=...] [--seeds=...]: a grid of
# training runs, each evaluated on the test split. The command is gd2po_jax/cli/sweep.py (its flags, main
# and --help text); an install runs the same code as the console script gd2po-sweep (docs/install.md).

from gd2po_jax.cli import sweep

if __name__ == "__main__":
    sweep.run()
