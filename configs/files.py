"""Your own model, data and rewards: the starting point for a task of your own (docs/own_task.md).

    python /path/to/train.py --config=/path/to/configs/files.py --config.model.path=DIR_OR_HUB_ID \
      --config.data.train=prompts.jsonl --config.rewards.functions=my_rewards:brevity,my_rewards:digits

run from the directory that holds ``my_rewards.py`` (or give ``path/to/my_rewards.py:brevity``). Each
function is TRL's ``fn(prompts, completions, **kwargs) -> list[float | None]`` (every data column a
keyword argument) or the project's batch interface; each gives one reward column named after it,
weighted 1 (the config-file form ``{"fn": ..., "weight": ..., "options": {...}, "on_error": ...}`` sets
more). A reward family can join them: ``--config.rewards.kind=reward_model`` with
``rewards.names`` and a score model per name (configs/safety.py), or the ToolRL rules
(``kind=tool_calling``). Data: a JSONL, parquet or JSON file, a directory or glob of them, a
``save_to_disk`` folder or a Hub data set id; ``data.validation`` (optional) is evaluated greedily
before and after RL with your rewards.

The defaults are small, for a first run on a CPU with a small instruct model: 8 prompts x 4 rollouts
a step, completions of up to 128 tokens, 20 steps, GD2PO-SNR (tau 0.8). A supervised warm start runs
only if the data has a ``target`` column with values (``sft.only_with_targets``). Every 10 steps the
rollouts are saved to WORKDIR/rollouts/ with each reward, the advantage and whether GD2PO kept them.
Each field is documented in gd2po_jax/config/.
"""

import ml_collections

try:
    from configs import default
except ModuleNotFoundError:  # the repository's root is not on sys.path: load it by path
    from gd2po_jax.cli import sibling_config

    default = sibling_config(__file__, "default")


def get_config() -> ml_collections.ConfigDict:
    config = default.get_config()
    config.task = "files"

    config.model.path = ""  # a Hugging Face model directory or Hub id (org/name); required
    config.model.dtype = "float32"

    config.data.train = ""  # your prompts; required
    config.data.validation = ""  # optional: evaluated before and after RL
    config.data.test = ""  # optional: what eval.py scores by default
    config.data.max_prompt_tokens = 512  # a longer prompt is an error naming its row (prompt_truncation='left' cuts)
    config.data.chat_template_kwargs = ()  # e.g. enable_thinking=False for Qwen3
    config.data.tools_column = ""  # a column of tool schemas, passed to the chat template as tools=

    config.rewards.kind = ""  # no built-in family: the rewards are rewards.functions
    config.rewards.names = ()
    config.rewards.functions = ()  # module:callable or path/to/file.py:callable; required (or a family)
    config.rewards.on_error = "raise"  # a reward function that raises stops the run naming the rollout
    config.rewards.max_failed_fraction = 0.1

    config.rl.algorithm = "gd2po_snr"  # grpo | gdpo | gd2po_hard | gd2po_snr
    config.rl.snr_tau = 0.8
    config.rl.num_generations = 4  # G
    config.rl.micro_batch_size = 8
    config.rl.length_bucket = 16

    config.sampling.max_new_tokens = 128
    config.sampling.temperature = 1.0  # TRL's and verl's default

    config.train.num_steps = 20
    config.train.prompts_per_step = 8  # P; a step has P x G rollouts
    config.train.learning_rate = 1e-6  # TRL's GRPO default; tiny or random models need more (docs/own_task.md)

    config.sft.enabled = True
    config.sft.only_with_targets = True  # the warm start runs only if the data has targets
    config.sft.num_steps = 200
    config.sft.batch_size = 8
    config.sft.learning_rate = 1e-5
    config.sft.max_length = 1024

    config.checkpoint.every_steps = 10
    config.eval.split = "auto"  # validation if given, else test, else none
    config.eval.max_examples = 64
    config.eval.batch_size = 16

    config.logging.rollouts_every = 10  # WORKDIR/rollouts/step_N.jsonl: rewards, advantages, kept or filtered
    return config
