"""The paper's tool-calling runs (ToolRL RLLA data, GD2PO official hyperparameters) for one model.

    python train.py --config=configs/toolrl.py:qwen2.5-3b --workdir=runs/qwen2.5-3b-snr \
        --config.model.path=/models/Qwen2.5-3B-Instruct --config.data.train=/data/rlla_4k/train.parquet
    python train.py --config=configs/toolrl.py:qwen2.5-3b,correctness_length --config.rl.algorithm=gdpo ...

The config argument is ``MODEL[,SETTING]``: MODEL one of `MODELS`, SETTING one of the reward settings
of `gd2po_jax.rewards.tool_calling.SETTINGS` (default ``correctness_format_length``; it fills
``config.rewards.names``). The algorithm is ``config.rl.algorithm`` (grpo, gdpo, gd2po_hard,
gd2po_snr). Everything else is the official run script's value (spec section 5):

  G = 4 rollouts, 512 prompts per step in 4 mini-batches of 128 prompts, AdamW lr 1e-6 (constant),
  weight decay 0.01, grad clip 1.0, clip 0.2 / 0.2, dual clip 3, token-mean, no KL, no entropy,
  temperature 1 for rollouts, greedy validation on rlla_4k/test.parquet every 10 steps,
  prompts up to 2048 tokens, responses up to 1024, length reward Lmax 512, SNR tau 0.8,
  a checkpoint every 5 steps, 30 epochs, remat (gradient checkpointing), bf16 compute with fp32
  master weights and AdamW state, parameters and batch sharded over all devices (fsdp).

``config.model.path`` (a local Hugging Face directory of the instruct model, with its chat template)
has no default: the files task fails naming that field. ``config.data.train`` defaults to the
80-row RLLA test split in ../shared, which is only good for a smoke run; pass the 4k training parquet.
"""

import pathlib

import ml_collections

from configs import default
from gd2po_jax.rewards.tool_calling import SETTINGS

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"
RLLA_TEST = str(SHARED_DATA / "rlla_4k" / "test.parquet")
"""The official validation file (also the test split, and the smoke default of data.train)."""

MODELS = {
    # name: (Hugging Face repository of the instruct model, micro_batch_size in rollouts).
    # A micro-batch is split over every device; these sizes leave room for the activations of
    # 3072-token sequences with remat on 8 x 80 GB (see README.md, "Reproducing the paper's table").
    "qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B-Instruct", 64),
    "qwen2.5-3b": ("Qwen/Qwen2.5-3B-Instruct", 32),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", 16),
    "llama3.2-3b": ("meta-llama/Llama-3.2-3B-Instruct", 32),
}
DEFAULT_SETTING = "correctness_format_length"
PROMPTS_PER_STEP = 512
NUM_MINIBATCHES = 4
STEPS_PER_EPOCH = 7  # about 4,000 RLLA training prompts / 512 per step, the last partial batch dropped (verl)
NUM_EPOCHS = 30


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
    config = default.get_config()
    config.task = "files"

    config.model.path = ""  # a local copy of MODELS[model][0]; required
    config.model.dtype = "bfloat16"
    config.model.remat = True

    config.data.train = RLLA_TEST
    config.data.validation = RLLA_TEST
    config.data.test = RLLA_TEST  # the same file: what `eval.py --workdir=RUN` scores by default
    config.data.max_prompt_tokens = 2048

    config.rewards.names = SETTINGS[setting]
    config.rewards.max_think_words = 512
    config.rewards.conditional_length = False
    config.rewards.num_workers = 4

    config.rl.algorithm = "gd2po_snr"
    config.rl.snr_tau = 0.8
    config.rl.num_generations = 4
    config.rl.batch_norm = "token"
    config.rl.clip_low = config.rl.clip_high = 0.2
    config.rl.dual_clip = 3.0
    config.rl.loss_agg_mode = "token-mean"
    config.rl.kl_coef = 0.0
    config.rl.entropy_coef = 0.0
    config.rl.ppo_epochs = 1
    config.rl.num_minibatches = NUM_MINIBATCHES
    config.rl.micro_batch_size = micro_batch_size

    config.sampling.max_new_tokens = 1024
    config.sampling.temperature = 1.0
    config.sampling.top_p = 1.0
    config.sampling.top_k = 0
    # Sample a step in chunks of 128 prompts (x 4 rollouts): a quarter of the KV cache and prefill
    # memory of sampling all 512 prompts at once (see README, memory).
    config.sampling.prompts_per_call = 128

    config.train.num_steps = STEPS_PER_EPOCH * NUM_EPOCHS
    config.train.prompts_per_step = PROMPTS_PER_STEP
    config.train.learning_rate = 1e-6
    config.train.warmup_steps = 0
    config.train.weight_decay = 0.01
    config.train.grad_clip = 1.0
    config.train.master_dtype = "float32"

    config.sft.enabled = False  # RL starts from the instruct model, as in the paper

    config.checkpoint.every_steps = 5
    config.checkpoint.keep = 2

    config.eval.split = "validation"
    config.eval.max_examples = 0  # all 80 validation prompts
    config.eval.batch_size = 128
    config.eval.every_steps = 10

    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, -1, 1
    return config
