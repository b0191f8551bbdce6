"""The paper's helpfulness-safety runs (Alpaca prompts, two reward models, GD2PO official
hyperparameters of the ``safe-alignment/`` scripts).

    python train.py --config=configs/safety.py --workdir=runs/safety-snr \
        --config.model.path=/models/Qwen2.5-7B-Instruct --config.data.train=/data/alpaca/train.parquet \
        --config.rewards.reward_models.useful.path=/models/Qwen2.5-7B-SafeRLHF-RM \
        --config.rewards.reward_models.harmless.path=/models/Qwen2.5-7B-SafeRLHF-CM \
        --config.eval.sets=/data/safe_alignment --config.data.test=/data/alpaca/test.parquet
    python eval.py --workdir=runs/safety-snr --data=/data/safe_alignment

The algorithm is ``config.rl.algorithm`` (gdpo, gd2po_hard, gd2po_snr; the paper runs all three
with these values). No path has a default, and a run stops naming the empty field (and, for the
data, where it is published): ``config.model.path`` (the instruct policy), ``config.data.train`` (the
Alpaca prompt-only training parquet, ``safe-alignment/dataset/alpaca_prompt_only/train.parquet`` of
github.com/Qwen-Applications/GD2PO) and the two score models. Validation, greedy and scored by the
reward models before RL, every 10 steps and after RL, is on the sets of ``config.eval.sets``: the
directory of the three helpfulness-safety test sets (Alpaca, HH-RLHF, PKU-SafeRLHF, as the official
runs' ``data.val_files``; docs/safety.md), logged per set as ``eval/<set>/useful``, ``harmless`` and
``reward_sum``. Without it, on ``config.data.validation`` (the 512 Alpaca test prompts,
``test.parquet`` in the Alpaca folder) alone; with neither the run stops naming
``config.data.validation``. ``config.data.test`` is optional: the split that ``eval.py --workdir=RUN``
scores by default. ``eval.py --data=DIR`` scores the sets of a directory afterwards. docs/safety.md
lists the values and estimates the memory.
"""

import ml_collections
from ml_collections import config_dict

try:
    from configs import default
except ModuleNotFoundError:  # the repository's root is not on sys.path: load it by path
    from gd2po_jax.cli import sibling_config

    default = sibling_config(__file__, "default")

REWARD_NAMES = ("useful", "harmless")
PROMPTS_PER_STEP = 512
NUM_MINIBATCHES = 4  # PPO mini-batches of 128 prompts x G
NUM_STEPS = 100  # one epoch of the Alpaca training prompts


def reward_model(batch_size: int = 16) -> ml_collections.ConfigDict:
    """One score model's fields (gd2po_jax/config.py, RewardModelConfig); the path is required."""
    return ml_collections.ConfigDict(dict(
        path="",  # a local Hugging Face score-model directory; required
        negate=False,  # the official runs use both scores as they are (higher = more helpful / safer)
        normalize=config_dict.placeholder(bool),  # None: the checkpoint's do_normalize
        max_length=2048,  # tokens of the rendered conversation scored (the official reward_model_*.max_length)
        truncation="right",  # longer: cut on the right and scored, as the official verl worker does
        batch_size=batch_size,  # conversations per forward pass (divisible by the data-parallel devices)
        dtype="bfloat16",
        adapter="",  # a PEFT LoRA adapter trained on path (a LoRA-trained reward model; docs/lora.md); "": none
    ))


def get_config() -> ml_collections.ConfigDict:
    config = default.get_config()
    config.task = "files"

    config.model.path = ""  # a local copy of the instruct policy (Qwen2.5-7B-Instruct in the paper); required
    config.model.dtype = "bfloat16"  # compute; master weights and AdamW state in train.master_dtype
    config.model.remat = True  # gradient checkpointing

    config.data.train = ""  # the Alpaca prompt-only training parquet; required
    config.data.validation = ""  # the Alpaca test prompts (512): validated on when eval.sets is empty
    config.data.test = ""  # what `eval.py --workdir=RUN` scores by default (officially the validation file)
    config.data.max_prompt_tokens = 512
    config.data.prompt_truncation = "left"  # verl's data.truncation=left: keep a prompt's last 512 tokens

    config.rewards.kind = "reward_model"
    config.rewards.names = REWARD_NAMES  # useful: the SafeRLHF RM; harmless: the SafeRLHF CM (higher = safer)
    config.rewards.reward_models = ml_collections.ConfigDict({name: reward_model() for name in REWARD_NAMES})
    config.rewards.offload = False  # policy + both reward models fit 8 x 80 GB (docs/safety.md, "Memory")
    config.rewards.num_workers = 1  # the reward models score a step's rollouts in fixed batches
    config.rewards.timeout_s = 0.0  # no limit: a step's 2,048 conversations take what they take

    config.rl.algorithm = "gd2po_snr"  # gdpo | gd2po_hard | gd2po_snr
    config.rl.snr_tau = 0.8  # tau
    config.rl.num_generations = 4  # G
    config.rl.batch_norm = "token"  # official: token-weighted batch whitening
    config.rl.clip_low = config.rl.clip_high = 0.2  # eps_low, eps_high
    config.rl.dual_clip = 3.0  # c
    config.rl.loss_agg_mode = "token-mean"
    config.rl.kl_coef = 0.0  # beta: no KL
    config.rl.entropy_coef = 0.0  # no entropy bonus
    config.rl.ppo_epochs = 1
    config.rl.num_minibatches = NUM_MINIBATCHES  # mini-batches of 128 prompts x G: 4 updates per step
    config.rl.micro_batch_size = 16  # rollouts per forward / backward pass, over all devices
    config.rl.length_bucket = 0  # off: each length is a compiled branch of the update; not measured at this scale
    config.rl.tempered_logprobs = True  # log-probs of logits / 0.7, as the official runs compute them
    config.rl.shuffle_minibatches = False  # verl's actor.shuffle: false: mini-batches in order
    # verl's dynamic batches (actor.use_dynamic_bsz=True, ppo_max_token_len_per_gpu=2048 in the official
    # scripts): a token mean per micro-batch of at most 2048 tokens per GPU, 8 GPUs.
    config.rl.micro_batch_max_tokens = 2048
    config.rl.micro_batch_ranks = 8
    config.rl.snr_eps = 1e-6  # gdpo_filter_ratio_conflict_eps of the official safe-alignment config

    config.sampling.max_new_tokens = 1024  # longest response
    config.sampling.temperature = 0.7  # of RL rollouts (validation is greedy)
    config.sampling.top_p = 1.0  # off
    config.sampling.top_k = 0  # off
    config.sampling.prompts_per_call = 128  # sample a step in 4 chunks (docs/paper.md, "Memory")

    config.train.num_steps = NUM_STEPS
    config.train.prompts_per_step = PROMPTS_PER_STEP  # P
    config.train.learning_rate = 1e-6  # AdamW, constant
    config.train.warmup_steps = 0
    config.train.weight_decay = 0.01
    config.train.grad_clip = 1.0  # global gradient norm
    config.train.master_dtype = "float32"  # master weights and AdamW state (bf16 would lose lr-1e-6 updates)

    config.sft.enabled = False  # RL starts from the instruct model

    config.checkpoint.every_steps = 20  # save every this many RL steps
    config.checkpoint.keep = 2

    config.eval.sets = ""  # the three test sets' directory (alpaca, hh_rlhf, pku_saferlhf): validated on
    config.eval.split = "validation"  # without eval.sets: the Alpaca test prompts alone
    config.eval.max_examples = 0  # all 512
    config.eval.batch_size = 128  # prompts per generation batch
    config.eval.every_steps = 10  # greedy validation every 10 RL steps (and before and after RL)

    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, -1, 1  # parameters and batch over all devices
    return config
