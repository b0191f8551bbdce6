"""Evaluate a trained policy or a Hugging Face model, greedily.

    python eval.py --workdir=DIR [--split=test|validation] [--checkpoint-step=N]
    python eval.py --workdir=DIR --data=api_bank [--max-examples=N] [--max-new-tokens=4096]
    python eval.py --model-path=HF_DIR --data=api_bank [--workdir=OUT]

Reports go to DIR/eval/<split>.json or DIR/eval/api_bank.json, with the generations in the .jsonl
next to them, and a table is printed. Without --workdir, --model-path reports go to
runs/eval/<model directory name>. See gd2po_jax/evaluation/run.py.
"""

import dataclasses

from absl import app, flags

from gd2po_jax import cli
from gd2po_jax.evaluation.run import DEFAULT_API_BANK_DIR, EvalError, EvalOptions, run

_DEFAULTS = EvalOptions()
flags.DEFINE_string("workdir", "", "Training run directory (holds config.json); where eval/ reports go.")
flags.DEFINE_enum("split", "test", ["test", "validation"], "Split of the run's data to evaluate.")
flags.DEFINE_integer("checkpoint-step", None, "Checkpoint to restore (default: the latest).")
flags.DEFINE_string("data", "", "'api_bank' (the --api-bank-dir directory) or a path to an API-Bank "
                    "directory or level-N file; empty: evaluate --split.")
flags.DEFINE_string("api-bank-dir", str(DEFAULT_API_BANK_DIR), "What --data=api_bank refers to.")
flags.DEFINE_string("model-path", "", "A Hugging Face model directory to evaluate instead of a training run.")
flags.DEFINE_enum("dtype", _DEFAULTS.dtype, ["bfloat16", "float32"], "Parameter dtype for --model-path.")
flags.DEFINE_integer("max-new-tokens", None, "Generation budget (default: the run's sampling.max_new_tokens; "
                     "4096 for API-Bank).")
flags.DEFINE_integer("batch-size", None, "Prompts per generation batch (default: the run's eval.batch_size; "
                     "32 with --model-path).")
flags.DEFINE_integer("max-examples", 0, "Evaluate only the first N examples (per level for API-Bank); 0: all.")
flags.DEFINE_integer("max-think-words", _DEFAULTS.max_think_words, "API-Bank length metric: think words for 1.0.")
flags.DEFINE_integer("max-prompt-tokens", _DEFAULTS.max_prompt_tokens, "API-Bank prompts longer than this fail.")
FLAGS = flags.FLAGS


def options_from_flags() -> EvalOptions:
    """`EvalOptions` from the command line (flag ``a-b`` is field ``a_b``)."""
    fields = [f.name for f in dataclasses.fields(EvalOptions) if f.name != "progress"]
    return EvalOptions(**{name: FLAGS[name.replace("_", "-")].value for name in fields})


def main(argv):
    cli.start(argv)
    try:
        run(options_from_flags())
    except EvalError as err:
        raise SystemExit(f"eval.py: {err}") from None


if __name__ == "__main__":
    app.run(main)
