"""Evaluate a trained policy or a Hugging Face model, greedily.

    python eval.py --workdir=DIR [--split=test|validation] [--checkpoint_step=N]
    python eval.py --workdir=DIR --data=API_BANK_DIR [--max_examples=N] [--max_new_tokens=N] [--max_total_tokens=N]
    python eval.py --model_path=HF_DIR --data=API_BANK_DIR [--workdir=OUT]
    python eval.py --workdir=DIR --data=SAFETY_SETS_DIR [--max_examples=N] [--model_path=HF_DIR]
    python eval.py --workdir=DIR --data=val.jsonl [--max_examples=N]   # your own data, the run's rewards
    python eval.py --workdir=DIR --habits [--split=test]
    python eval.py --workdir=DIR --trust_workdir_code ...   # DIR/config.json names code of your own

Reports go to DIR/eval/<split>.json, DIR/eval/api_bank.json or DIR/eval/safe_alignment.json, with the
generations in the .jsonl next to them, and a table is printed. --data=DIR of verl parquet sets (or
one such file) scores greedy responses with the reward models of the run in
--workdir (configs/safety.py; docs/safety.md says how the averages are computed). Any other --data
(a JSONL, parquet or JSON file, a directory or glob of them, a save_to_disk folder, a Hub id: what
the run's config.data.* fields take) is your own data, scored as the run's splits are (its reward
functions: each reward and their sum) -> DIR/eval/data-<name>.json. Without
--workdir, --model_path reports go to runs/eval/<model directory name>. --habits generates nothing:
it prints the habit breakdown of the saved generations of a synthetic_tools run,
eval/before_rl.jsonl and eval/after_rl.jsonl (written by train.py), or with --split those of
eval.py --split (eval/<split>.jsonl). See gd2po_jax/evaluation/command.py. On several hosts, every
host runs the same command with --config.distributed.coordinator_address=HOST:PORT
--config.distributed.num_processes=N --config.distributed.process_id=I (docs/multihost.md).
"""

import contextlib
import dataclasses
from typing import Any

import ml_collections
from absl import flags
from ml_collections import config_flags

from gd2po_jax import cli
from gd2po_jax.config import DistributedConfig
from gd2po_jax.evaluation import command as evaluation
from gd2po_jax.evaluation.command import EvalOptions
from gd2po_jax.runtime import distributed, run_dir

_DEFAULTS = EvalOptions()
FLAGS = flags.FLAGS


def define_flags() -> None:
    """eval.py's flags (`cli.run` calls this before parsing the command line)."""
    main_module = cli.main_module_name()
    # Only --config.distributed.* (the run's own config comes from WORKDIR/config.json): several hosts
    # evaluate together as they train (docs/multihost.md).
    config = config_flags.DEFINE_config_dict(
        "config",
        ml_collections.ConfigDict({"distributed": DistributedConfig().to_dict()}),
        "Only config.distributed: --config.distributed.coordinator_address=HOST:PORT ... on several hosts.",
    )
    FLAGS.register_key_flag_for_module(main_module, FLAGS[config.name])  # listed by --help, as before
    flags.DEFINE_string(
        "workdir", "", "Training run directory (holds config.json); where eval/ reports go.", module_name=main_module
    )
    flags.DEFINE_enum(
        "split", "test", ["test", "validation"], "Split of the run's data to evaluate.", module_name=main_module
    )
    flags.DEFINE_integer(
        "checkpoint_step", None, "Checkpoint to restore (default: the latest).", module_name=main_module
    )
    flags.DEFINE_string(
        "data",
        "",
        "A path to an API-Bank directory or level-N file ('api_bank': the "
        "--api_bank_dir directory), or to a directory of verl parquet sets or one such file, "
        "scored by the run's reward models (the helpfulness-safety sets), or any data of your own "
        "the run's loaders read (JSONL, parquet, a folder, a Hub id), scored by the run's rewards; "
        "empty: evaluate --split.",
        module_name=main_module,
    )
    flags.DEFINE_string(
        "api_bank_dir",
        "",
        "What --data=api_bank refers to (no default: an API-Bank directory).",
        module_name=main_module,
    )
    flags.DEFINE_string(
        "model_path",
        "",
        "A Hugging Face model directory to evaluate instead of a training run.",
        module_name=main_module,
    )
    flags.DEFINE_enum(
        "dtype", _DEFAULTS.dtype, ["bfloat16", "float32"], "Parameter dtype for --model_path.", module_name=main_module
    )
    flags.DEFINE_integer(
        "max_new_tokens",
        None,
        "Generation budget (default: the run's sampling.max_new_tokens; 4096 for API-Bank).",
        module_name=main_module,
    )
    flags.DEFINE_integer(
        "max_total_tokens",
        None,
        "API-Bank: prompt + response tokens at most, as vLLM's "
        "max_model_len (default: the run's eval.max_total_tokens; 4096 with --model_path); "
        "0: no cap.",
        module_name=main_module,
    )
    flags.DEFINE_integer(
        "batch_size",
        None,
        "Prompts per generation batch (default: the run's eval.batch_size; 32 with --model_path).",
        module_name=main_module,
    )
    flags.DEFINE_integer(
        "max_examples",
        0,
        "Evaluate only the first N examples (per level for API-Bank, per set for safe_alignment); 0: all.",
        module_name=main_module,
    )
    flags.DEFINE_integer(
        "max_think_words",
        _DEFAULTS.max_think_words,
        "API-Bank length metric: think words for 1.0.",
        module_name=main_module,
    )
    flags.DEFINE_integer(
        "max_prompt_tokens",
        _DEFAULTS.max_prompt_tokens,
        "API-Bank prompts longer than this fail.",
        module_name=main_module,
    )
    flags.DEFINE_bool(
        "trust_workdir_code",
        False,
        "Import the code that --workdir's config.json names (its reward functions, a task of its own): "
        "only for a workdir you trust; without it (or --reward_functions) such a run is refused.",
        module_name=main_module,
    )
    flags.DEFINE_list(
        "reward_functions",
        [],
        "The run's config.rewards.functions paths given again (module:fn or path/file.py:fn): "
        "these are imported without --trust_workdir_code.",
        module_name=main_module,
    )
    flags.DEFINE_bool(
        "habits",
        False,
        "Print the habit breakdown of the run's saved generations instead of "
        "evaluating: before and after RL, or of --split if given (synthetic_tools task).",
        module_name=main_module,
    )


HABITS_BEFORE_AND_AFTER_RL = ("before_rl", "after_rl")  # the evaluations train.py saves


def options_from_flags() -> EvalOptions:
    """`EvalOptions` from the command line (one flag per field; ``--habits`` names the evaluations
    to read: ``--split``'s if given, else train.py's before and after RL)."""
    values: dict[str, Any] = {
        f.name: FLAGS[f.name].value for f in dataclasses.fields(EvalOptions) if f.name != "progress"
    }
    if FLAGS.habits:
        values["habits"] = (FLAGS.split,) if FLAGS["split"].present else HABITS_BEFORE_AND_AFTER_RL
    else:
        values["habits"] = ()
    return EvalOptions(**values)


def main(argv):
    cli.start(argv)
    # Several processes: one's error stops them all. A bad flag or file, a busy workdir, a damaged
    # checkpoint, a malformed data row, a failing reward function: one line (gd2po_jax.errors.UserError).
    with distributed.stop_all_on_error(), cli.user_errors("eval.py"):
        # Before any other use of JAX.
        distributed.initialize(DistributedConfig.from_dict(FLAGS.config.distributed.to_dict()))
        options = options_from_flags()
        # A workdir's config.json runs no code unless the user trusts it (docs/reliability.md).
        trust, given, rewards = FLAGS.trust_workdir_code, FLAGS.reward_functions, not options.habits  # habits: none
        trusted = (
            run_dir.trusting_code_of(options.workdir, trust=trust, given=given, rewards=rewards)
            if options.workdir
            else None
        )
        with trusted or contextlib.nullcontext():
            evaluation.run(options)


def run() -> None:
    """``python eval.py`` and the console script ``gd2po-eval``."""
    cli.run(__doc__, define_flags, main)


if __name__ == "__main__":
    run()
