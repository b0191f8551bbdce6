# python eval.py --workdir=DIR [--split=test|validation] ... | --model_path=HF_DIR --data=...: evaluate a
# trained policy or a Hugging Face model, greedily. The command is gd2po_jax/cli/eval.py (its flags,
# main and --help text); an install runs the same code as the console script gd2po-eval (docs/install.md).

from gd2po_jax.cli import eval

if __name__ == "__main__":
    eval.run()
