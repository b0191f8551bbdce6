# python export.py --workdir=DIR [--step=N] [--dtype=float32|bfloat16] --out=HF_DIR: a checkpoint of a run as
# a Hugging Face model directory. The command is gd2po_jax/cli/export.py (its flags, main and --help text);
# an install runs the same code as the console script gd2po-export (docs/install.md).

from gd2po_jax.cli import export

if __name__ == "__main__":
    export.run()
