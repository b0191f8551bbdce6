"""The paper's tool-calling runs (ToolRL RLLA data, GD2PO official hyperparameters) for one model.

    python train.py --config=configs/toolrl.py:qwen2.5-3b --workdir=runs/qwen2.5-3b-snr \
        --config.model.path=/models/Qwen2.5-3B-Instruct --config.data.train=/data/rlla_4k/train.parquet \
        --config.data.validation=/data/rlla_4k/test.parquet --config.data.test=/data/rlla_4k/test.parquet
    python train.py --config=configs/toolrl.py:qwen2.5-3b,correctness_length --config.rl.algorithm=gdpo ...

The config argument is ``MODEL[,SETTING]``: MODEL one of `MODELS`, SETTING one of the reward settings
of `gd2po_jax.rewards.tool_calling.SETTINGS` (default ``correctness_format_length``; it fills
``config.rewards.names``). The algorithm is ``config.rl.algorithm`` (grpo, gdpo, gd2po_hard,
gd2po_snr). Everything else is the official run scripts' value, most of it shared with configs/safety.py
(configs/paper_common.py); docs/paper.md ("What the config fixes") lists them, and gd2po_jax/config/
documents each field.

No path has a default; a run stops naming the empty field (and where the data set is published):
``config.model.path`` (a local Hugging Face directory of the instruct model, with its chat template),
``config.data.train`` (the RLLA 4K training parquet, ``dataset/rlla_4k/train.parquet`` of ToolRL,
github.com/qiancheng0/ToolRL) and ``config.data.validation`` (its 80-row ``test.parquet``, the official
validation file, evaluated before and after RL). ``config.data.test`` is optional: the split that
``eval.py --workdir=RUN`` scores by default (the official runs use test.parquet again).
"""

import ml_collections

try:
    from configs import paper_common
except ModuleNotFoundError:  # the repository's root is not on sys.path: load it by path
    from gd2po_jax.cli import sibling_config

    paper_common = sibling_config(__file__, "paper_common")
from gd2po_jax.rewards.tool_calling import SETTINGS

MODELS = {
    # name: (Hugging Face repository of the instruct model, rl.micro_batch_size in rollouts).
    # A micro-batch is split over every device; docs/paper.md ("Memory") sizes them for 8 x 80 GB.
    "qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B-Instruct", 64),
    "qwen2.5-3b": ("Qwen/Qwen2.5-3B-Instruct", 32),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", 16),
    "llama3.2-3b": ("meta-llama/Llama-3.2-3B-Instruct", 32),
}
DEFAULT_SETTING = "correctness_format_length"
STEPS_PER_EPOCH = 7  # about 4,000 RLLA training prompts / 512 per step, the last partial batch dropped (verl)
NUM_EPOCHS = 30  # train.num_steps = STEPS_PER_EPOCH x NUM_EPOCHS


def parse_arg(arg: str | None) -> tuple[str, str]:
    """(model, reward setting) of ``"MODEL[,SETTING]"``, with errors listing the choices."""
    if not arg:
        raise ValueError(f"configs/toolrl.py needs a model: --config=configs/toolrl.py:MODEL[,SETTING] "
                         f"with MODEL one of {sorted(MODELS)}")
    model, _, setting = arg.partition(",")
    setting = setting or DEFAULT_SETTING
    if model not in MODELS:
        raise ValueError(f"configs/toolrl.py:{arg}: unknown model {model!r}; choose one of {sorted(MODELS)}")
    if setting not in SETTINGS:
        raise ValueError(f"configs/toolrl.py:{arg}: unknown reward setting {setting!r}; "
                         f"choose one of {sorted(SETTINGS)}")
    return model, setting


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    model, setting = parse_arg(arg)
    _, micro_batch_size = MODELS[model]
    config = paper_common.paper_config()  # the files task, GD2PO-SNR with verl's update, 512 x 4 a step ...

    config.model.path = ""  # a local copy of MODELS[model][0]; required
    config.data.train = ""  # the RLLA 4K training parquet; required
    config.data.validation = ""  # the RLLA test parquet, the official validation file; required (eval.split)
    config.data.max_prompt_tokens = 2048  # longer prompts are an error naming the row

    config.rewards.names = SETTINGS[setting]  # the K rewards of the reward setting
    config.rewards.max_think_words = 512  # Lmax of the length reward
    config.rewards.conditional_length = False  # official: length is not conditioned on correctness
    config.rewards.num_workers = 4  # threads scoring rollouts in parallel
    config.rewards.score_groups = True  # score a group as soon as its rollouts are done, while the rest decode

    config.rl.micro_batch_size = micro_batch_size  # rollouts per forward / backward pass (MODELS)
    # verl's dynamic batches: ppo_max_token_len_per_gpu = 16384 tokens (verl's default; the scripts keep it).
    config.rl.micro_batch_max_tokens = 16384
    config.rl.snr_eps = 1e-8  # algorithm.gdpo_filter_ratio_conflict_eps=1e-8 of the official scripts

    config.sampling.temperature = 1.0  # of RL rollouts (validation is greedy); log-probs tempered at 1: the same

    config.train.num_steps = STEPS_PER_EPOCH * NUM_EPOCHS  # 30 epochs

    config.checkpoint.every_steps = 5  # save every this many RL steps

    config.eval.max_total_tokens = 4096  # API-Bank: prompt + response within vLLM's max_model_len, as official
    return config
