"""Evaluate a trained policy or a Hugging Face model, greedily.

    python eval.py --workdir=DIR [--split=test|validation] [--checkpoint_step=N]
    python eval.py --workdir=DIR --data=api_bank [--max_examples=N] [--max_new_tokens=4096]
    python eval.py --model_path=HF_DIR --data=api_bank [--workdir=OUT]
    python eval.py --workdir=DIR --data=safe_alignment [--max_examples=N] [--model_path=HF_DIR]
    python eval.py --workdir=DIR --habits [--split=test]

Reports go to DIR/eval/<split>.json, DIR/eval/api_bank.json or DIR/eval/safe_alignment.json, with the
generations in the .jsonl next to them, and a table is printed. --data=safe_alignment (or a directory
of verl parquet sets, or one such file) scores greedy responses with the reward models of the run in
--workdir (configs/safety.py; docs/safety.md says how the averages are computed). Without
--workdir, --model_path reports go to runs/eval/<model directory name>. --habits generates nothing:
it prints the habit breakdown of the saved generations of a synthetic_tools run,
eval/before_rl.jsonl and eval/after_rl.jsonl (written by train.py), or with --split those of
eval.py --split (eval/<split>.jsonl). See gd2po_jax/evaluation/run.py. On several hosts, every
host runs the same command with --config.distributed.coordinator_address=HOST:PORT
--config.distributed.num_processes=N --config.distributed.process_id=I (docs/multihost.md).
"""

import dataclasses

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from gd2po_jax import cli
from gd2po_jax.config import ConfigError, DistributedConfig
from gd2po_jax.evaluation.run import DEFAULT_API_BANK_DIR, EvalError, EvalOptions, run
from gd2po_jax.runtime import distributed
from gd2po_jax.runtime.workdir import RunDirError

_DEFAULTS = EvalOptions()
# Only --config.distributed.* (the run's own config comes from WORKDIR/config.json): several hosts
# evaluate together as they train (docs/multihost.md).
config_flags.DEFINE_config_dict(
    "config", ml_collections.ConfigDict({"distributed": DistributedConfig().to_dict()}),
    "Only config.distributed: --config.distributed.coordinator_address=HOST:PORT ... on several hosts.")
flags.DEFINE_string("workdir", "", "Training run directory (holds config.json); where eval/ reports go.")
flags.DEFINE_enum("split", "test", ["test", "validation"], "Split of the run's data to evaluate.")
flags.DEFINE_integer("checkpoint_step", None, "Checkpoint to restore (default: the latest).")
flags.DEFINE_string("data", "", "'api_bank' (the --api_bank_dir directory) or a path to an API-Bank "
                    "directory or level-N file; 'safe_alignment' (../shared/data/safe_alignment) or a "
                    "directory of verl parquet sets or one such file, scored by the run's reward models; "
                    "empty: evaluate --split.")
flags.DEFINE_string("api_bank_dir", str(DEFAULT_API_BANK_DIR), "What --data=api_bank refers to.")
flags.DEFINE_string("model_path", "", "A Hugging Face model directory to evaluate instead of a training run.")
flags.DEFINE_enum("dtype", _DEFAULTS.dtype, ["bfloat16", "float32"], "Parameter dtype for --model_path.")
flags.DEFINE_integer("max_new_tokens", None, "Generation budget (default: the run's sampling.max_new_tokens; "
                     "4096 for API-Bank).")
flags.DEFINE_integer("batch_size", None, "Prompts per generation batch (default: the run's eval.batch_size; "
                     "32 with --model_path).")
flags.DEFINE_integer("max_examples", 0, "Evaluate only the first N examples (per level for API-Bank, per set "
                     "for safe_alignment); 0: all.")
flags.DEFINE_integer("max_think_words", _DEFAULTS.max_think_words, "API-Bank length metric: think words for 1.0.")
flags.DEFINE_integer("max_prompt_tokens", _DEFAULTS.max_prompt_tokens, "API-Bank prompts longer than this fail.")
flags.DEFINE_bool("habits", False, "Print the habit breakdown of the run's saved generations instead of "
                  "evaluating: before and after RL, or of --split if given (synthetic_tools task).")
FLAGS = flags.FLAGS


HABITS_BEFORE_AND_AFTER_RL = ("before_rl", "after_rl")  # the evaluations train.py saves


def options_from_flags() -> EvalOptions:
    """`EvalOptions` from the command line (one flag per field; ``--habits`` names the evaluations
    to read: ``--split``'s if given, else train.py's before and after RL)."""
    values = {f.name: FLAGS[f.name].value for f in dataclasses.fields(EvalOptions) if f.name != "progress"}
    if FLAGS.habits:
        values["habits"] = (FLAGS.split,) if FLAGS["split"].present else HABITS_BEFORE_AND_AFTER_RL
    else:
        values["habits"] = ()
    return EvalOptions(**values)


def main(argv):
    cli.start(argv)
    with distributed.stop_all_on_error():  # several processes: one's error stops them all
        try:
            # Before any other use of JAX.
            distributed.initialize(DistributedConfig.from_dict(FLAGS.config.distributed.to_dict()))
            run(options_from_flags())
        except (EvalError, RunDirError, ConfigError, distributed.DistributedError) as err:
            # a bad flag or file, a busy workdir, a damaged checkpoint, processes that did not join
            raise SystemExit(f"eval.py: {err}") from None


if __name__ == "__main__":
    app.run(main)
