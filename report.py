# python report.py --sweep_dir=DIR [--out_dir=DIR/report]: tables, significance tests and plots of a sweep.
# The command is gd2po_jax/cli/report.py (its flags, main and --help text; it imports no JAX); an install
# runs the same code as the console script gd2po-report (docs/install.md).

from gd2po_jax.cli import report

if __name__ == "__main__":
    report.run()
