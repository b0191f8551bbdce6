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
lists the values and estimates the memory; the settings shared with configs/toolrl.py are in
configs/paper_common.py.
"""

import ml_collections
from ml_collections import config_dict

try:
    from configs import paper_common
except ModuleNotFoundError:  # the repository's root is not on sys.path: load it by path
    from gd2po_jax.cli import sibling_config

    paper_common = sibling_config(__file__, "paper_common")

REWARD_NAMES = ("useful", "harmless")
NUM_STEPS = 100  # one epoch of the Alpaca training prompts


def reward_model(batch_size: int = 16) -> ml_collections.ConfigDict:
    """One score model's fields (gd2po_jax/config/rewards.py, RewardModelConfig); the path is required."""
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
    config = paper_common.paper_config()  # the files task, GD2PO-SNR with verl's update, 512 x 4 a step ...

    config.model.path = ""  # a local copy of the instruct policy (Qwen2.5-7B-Instruct in the paper); required
    config.data.train = ""  # the Alpaca prompt-only training parquet; required
    config.data.validation = ""  # the Alpaca test prompts (512): validated on when eval.sets is empty
    config.data.max_prompt_tokens = 512
    config.data.prompt_truncation = "left"  # verl's data.truncation=left: keep a prompt's last 512 tokens

    config.rewards.kind = "reward_model"
    config.rewards.names = REWARD_NAMES  # useful: the SafeRLHF RM; harmless: the SafeRLHF CM (higher = safer)
    config.rewards.reward_models = ml_collections.ConfigDict({name: reward_model() for name in REWARD_NAMES})
    config.rewards.offload = False  # policy + both reward models fit 8 x 80 GB (docs/safety.md, "Memory")
    config.rewards.num_workers = 1  # the reward models score a step's rollouts in fixed batches
    config.rewards.score_groups = True  # reward models score the whole step after the decode, whatever this says
    config.rewards.timeout_s = 0.0  # no limit: a step's 2,048 conversations take what they take

    config.rl.micro_batch_size = 16  # rollouts per forward / backward pass, over all devices
    # verl's dynamic batches: ppo_max_token_len_per_gpu=2048 in the official scripts.
    config.rl.micro_batch_max_tokens = 2048
    config.rl.snr_eps = 1e-6  # gdpo_filter_ratio_conflict_eps of the official safe-alignment config

    config.sampling.temperature = 0.7  # of RL rollouts (validation is greedy); log-probs of logits / 0.7

    config.train.num_steps = NUM_STEPS

    config.checkpoint.every_steps = 20  # save every this many RL steps

    config.eval.sets = ""  # the three test sets' directory (alpaca, hh_rlhf, pku_saferlhf): validated on
    return config
