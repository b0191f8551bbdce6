"""What the paper's runs on real models share: configs/toolrl.py (the tool-calling runs) and
configs/safety.py (the helpfulness-safety runs) both start from `paper_config`, the official
GD2PO hyperparameters that the two sets of run scripts have in common, then set their own (the data,
the rewards, the micro-batches, the sampling temperature, the number of steps ...).

Fields: gd2po_jax/config/ (each documented beside it); docs/paper.md ("What the config fixes") lists
the values.
"""

import ml_collections

try:
    from configs import default
except ModuleNotFoundError:  # the repository's root is not on sys.path: load it by path
    from gd2po_jax.cli import sibling_config

    default = sibling_config(__file__, "default")

PROMPTS_PER_STEP = 512
NUM_MINIBATCHES = 4  # PPO mini-batches of 128 prompts x G


def paper_config() -> ml_collections.ConfigDict:
    """configs/default.py with the settings the official tool-calling and helpfulness-safety runs share:
    the files task on a bfloat16 instruct model (no path: required), GD2PO-SNR with verl's update (old
    log-probs recomputed, tempered, mini-batches in order, dynamic micro-batches over 8 GPUs), 512 prompts
    x 4 rollouts a step, AdamW at a constant 1e-6 in float32, no warm start."""
    config = default.get_config()
    config.task = "files"

    config.model.path = ""  # a local copy of the instruct policy; required
    config.model.dtype = "bfloat16"  # compute; master weights and AdamW state in train.master_dtype
    config.model.remat = "full"  # gradient checkpointing: none | full | minimal | dots (docs/speed.md)

    config.data.train = ""  # the training parquet; required
    config.data.validation = ""  # the official validation file (see each config)
    config.data.test = ""  # what `eval.py --workdir=RUN` scores by default (officially the validation file)

    config.rl.algorithm = "gd2po_snr"  # grpo | gdpo | gd2po_hard | gd2po_snr
    config.rl.snr_tau = 0.8  # tau
    config.rl.num_generations = 4  # G
    config.rl.batch_norm = "token"  # official: token-weighted batch whitening
    config.rl.clip_low = config.rl.clip_high = 0.2  # eps_low, eps_high
    config.rl.dual_clip = 3.0  # c
    config.rl.loss_agg_mode = "token-mean"
    config.rl.kl_coef = 0.0  # beta: no KL
    config.rl.entropy_coef = 0.0  # no entropy bonus
    config.rl.ppo_epochs = 1  # one pass over each step's rollouts
    config.rl.num_minibatches = NUM_MINIBATCHES  # mini-batches of 128 prompts x G: 4 updates per step
    config.rl.length_bucket = 0  # off: each length is a compiled branch of the update; not measured at this scale
    config.rl.tempered_logprobs = True  # verl: log-probs at the rollout temperature
    config.rl.old_logprobs = "recompute"  # verl recomputes the old log-probs with the actor before the update
    config.rl.shuffle_minibatches = False  # verl's actor.shuffle: false: mini-batches in order
    # verl's dynamic batches (actor.use_dynamic_bsz=True in the official scripts): a token mean per
    # micro-batch of at most rl.micro_batch_max_tokens (each config's) tokens per GPU, 8 GPUs.
    config.rl.micro_batch_ranks = 8

    config.sampling.max_new_tokens = 1024  # longest response
    config.sampling.top_p = 1.0  # off
    config.sampling.top_k = 0  # off
    # Sample a step in chunks of this many prompts: a quarter of the KV cache and prefill memory of
    # sampling all 512 at once (docs/paper.md, "Memory").
    config.sampling.prompts_per_call = 128
    config.sampling.engine = True  # the rollout engine: 512 slots per call, refilled as rows finish

    config.train.prompts_per_step = PROMPTS_PER_STEP  # P
    config.train.learning_rate = 1e-6  # AdamW, constant
    config.train.warmup_steps = 0
    config.train.weight_decay = 0.01
    config.train.grad_clip = 1.0  # global gradient norm
    config.train.master_dtype = "float32"  # master weights and AdamW state (bf16 would lose lr-1e-6 updates)
    config.train.max_consecutive_skipped_steps = 5  # verl skips a non-finite update; stop if it persists

    config.sft.enabled = False  # RL starts from the instruct model, as in the paper

    config.checkpoint.keep = 2  # the latest checkpoints kept

    config.eval.split = "validation"  # evaluated before and after RL, and every eval.every_steps
    config.eval.max_examples = 0  # all of the validation prompts
    config.eval.batch_size = 128  # prompts per generation batch
    config.eval.every_steps = 10  # greedy validation every 10 RL steps

    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, -1, 1  # parameters and batch over all devices
    return config
