"""The embedded default: a synthetic tool-calling task, a tiny Qwen2 model, SFT warm start, then
GD2PO-SNR with the three ToolRL rewards. Runs end to end on a 2-core CPU in minutes.

    python train.py                                   # this config, workdir ./runs/default
    python train.py --config=configs/default.py --workdir=DIR --config.rl.algorithm=gdpo

Each field is documented beside it in gd2po_jax/config/ (the typed config these values become; the
dataclass defaults are these values); how the values of the embedded default were chosen, and what
they gave, is in docs/embedded_task.md.
"""

import ml_collections

from gd2po_jax.config.versions import CONFIG_VERSION


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.config_version = CONFIG_VERSION  # the config format's version, written into config.json

    config.task = "synthetic_tools"  # synthetic_tools (generated, data.synthetic) | files (data.train ...)

    config.model = ml_collections.ConfigDict()
    config.model.path = ""  # a local Hugging Face directory; empty: the tiny random Qwen2 of model.tiny
    config.model.tokenizer_path = ""  # empty: model.path
    config.model.dtype = "float32"  # compute dtype of sampling and the forward pass
    config.model.remat = "none"  # gradient checkpointing of the decoder layers: none | full | minimal | dots
    config.model.attention = "auto"  # training attention: auto | plain | xla | cudnn (auto: cuDNN on a GPU in bf16)
    # LoRA (docs/lora.md): rank 0 = full fine-tuning; else adapters of this rank on the targets, only they train.
    config.model.lora = ml_collections.ConfigDict(
        dict(rank=0, alpha=16.0, dropout=0.0, targets=("q", "k", "v", "o", "gate", "up", "down"), base_dtype="")
    )
    # The embedded model's shape (built in WORKDIR/base_model when model.path is empty).
    config.model.tiny = ml_collections.ConfigDict(
        dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4,
             num_kv_heads=4, head_dim=32, seed=0)
    )

    config.data = ml_collections.ConfigDict()
    config.data.train = ""  # files task: a verl parquet, ToolRL JSON, API-Bank JSON or JSONL file
    config.data.validation = ""  # optional, same formats
    config.data.test = ""  # optional, same formats
    config.data.kind = "auto"  # auto | verl | toolrl_sft | api_bank | jsonl
    config.data.on_error = "raise"  # raise | skip (malformed rows are counted and reported)
    config.data.max_prompt_tokens = 1024  # longer prompts are an error naming the row
    config.data.chat_template_kwargs = ()  # NAME=VALUE arguments of the chat template, e.g. enable_thinking=False
    config.data.tools_column = ""  # a column of tool schemas passed to the chat template as tools=
    # The synthetic task (gd2po_jax.tasks.synthetic_tools.data.SyntheticToolsConfig, plus the size of the
    # tokenizer trained on it); fields left out take that class's defaults.
    config.data.synthetic = ml_collections.ConfigDict(
        dict(seed=0, num_train=2000, num_validation=128, num_test=256, num_candidates=2, mistake_rate=0.2,
             habit_fraction=0.5, habit_rate=0.7, min_think_words=4, max_think_words=36, tokenizer_vocab_size=2048)
    )

    config.rewards = ml_collections.ConfigDict()
    config.rewards.kind = "tool_calling"  # the registered reward family; empty: none (only rewards.functions)
    config.rewards.names = ("correctness", "format", "length")  # the family's rewards, in order
    # Reward functions of your own, after the family's columns: module:callable or path/file.py:callable
    # (TRL's fn(prompts, completions, **kwargs) or gd2po_jax.rewards.base.RewardFunction); docs/own_task.md.
    config.rewards.functions = ()
    config.rewards.max_think_words = 32  # Lmax of the length reward
    config.rewards.conditional_length = True  # the length reward counts only for a correct call (GDPO paper)
    config.rewards.weights = ()  # w_k, one per reward; empty: all ones (official)
    config.rewards.on_error = "raise"  # raise | min (score a failing rollout as the minimum)
    config.rewards.num_workers = 1  # threads scoring rollouts in parallel
    config.rewards.score_groups = True  # score a group as soon as its rollouts are done, while the rest decode
    config.rewards.timeout_s = 600.0  # a step's scoring may take this long; later calls fail; 0: no limit
    config.rewards.max_failed_fraction = 0.1  # on_error=min: stop when a reward fails on more of a step
    # kind reward_model only (configs/safety.py): a score model per reward name, and whether they wait
    # in host memory between steps.
    config.rewards.reward_models = ml_collections.ConfigDict()
    config.rewards.offload = False

    config.rl = ml_collections.ConfigDict()
    config.rl.algorithm = "gd2po_snr"  # grpo | gdpo | gd2po_hard | gd2po_snr
    config.rl.snr_tau = 0.8  # tau, the SNR threshold of gd2po_snr
    config.rl.num_generations = 4  # G, rollouts per prompt
    config.rl.batch_norm = "token"  # token (official) | sequence (TRL) | none
    config.rl.group_eps = 1e-6  # added to the group std
    config.rl.drop_zero_variance_groups = False  # DAPO's filter of groups with equal rewards
    config.rl.clip_low = 0.2  # eps_low
    config.rl.clip_high = 0.2  # eps_high
    config.rl.dual_clip = 3.0  # c; <= 0 disables dual clipping
    config.rl.loss_agg_mode = "token-mean"  # how token losses become one number (verl's names)
    config.rl.filtered_in_denominator = True  # official: filtered rollouts stay in the token mean
    config.rl.kl_coef = 0.0  # beta, KL penalty to the starting policy
    config.rl.kl_estimator = "k3"  # k1 | k3
    config.rl.entropy_coef = 0.0  # entropy bonus
    config.rl.ppo_epochs = 1  # passes over each step's rollouts
    config.rl.num_minibatches = 1  # optimizer updates per pass
    config.rl.micro_batch_size = 8  # rollouts per forward / backward pass; 0: the whole minibatch
    config.rl.length_bucket = 0  # > 0: micro-batches cut left padding in steps of this many tokens (a branch each)
    config.rl.tempered_logprobs = False  # True: log-probs at sampling.temperature (verl); False: at 1
    config.rl.old_logprobs = "recompute"  # recompute: the policy's forward before the update (verl) | sampler
    config.rl.rollout_is_cap = 0.0  # > 0: verl's truncated importance sampling of sampler vs recomputed; 0: off
    config.rl.shuffle_minibatches = True  # reshuffle before each epoch; False: minibatches in order (verl)
    config.rl.micro_batch_max_tokens = 0  # > 0: verl's per-micro-batch loss weighting with this token budget
    config.rl.micro_batch_ranks = 1  # verl's data-parallel ranks, each cutting its share by the budget
    config.rl.query_reweighting = True  # GD2PO's kappa; False: every prompt weight 1 ("filtering alone")
    config.rl.snr_eps = 1e-8  # added to the SNR denominator
    config.rl.halves_ranking = "prompt"  # low/high_conflict_half rank per prompt | batch
    config.rl.skip_zero_advantage_rows = True  # micro-batches of rollouts with A = 0 only are not computed
    config.rl.scale_rewards = "group"  # TRL's: the group norm divides by the group std | batch std | none
    config.rl.mask_truncated_completions = False  # TRL's: True: completions cut at max_new_tokens add no loss
    config.rl.dynamic_sampling = "off"  # off | signal | kept: refill the batch with groups that count (DAPO's)
    config.rl.dynamic_sampling_min_kept = 2  # kept: rollouts of a group kept with a signal for it to count
    config.rl.dynamic_sampling_max_rounds = 4  # rounds of sampling per step at most; then filler groups
    config.rl.dynamic_sampling_refill = "engine"  # engine: a new prompt per dropped group, mid-decode | rounds

    config.sampling = ml_collections.ConfigDict()
    config.sampling.max_new_tokens = 96  # longest response (also evaluation's budget)
    config.sampling.temperature = 0.5  # of RL rollouts (evaluation is greedy)
    config.sampling.top_p = 1.0  # 1: off
    config.sampling.top_k = 0  # 0: off
    config.sampling.prompts_per_call = 0  # > 0: sample a step in chunks of this many prompts
    config.sampling.engine = True  # rows flow through the rollout engine's slots (False: lock-step batch)
    config.sampling.engine_slots = 0  # rows decoded at once; 0: every row of a sampler call
    config.sampling.engine_chunk = 16  # decode steps between the host's looks (admit rows, free slots)
    config.sampling.engine_layers = "auto"  # decode step's layers: scan, loop, auto (scan on GPU/TPU)

    config.train = ml_collections.ConfigDict()
    config.train.num_steps = 40  # RL steps
    config.train.prompts_per_step = 16  # P; a step has P x G rollouts
    config.train.seed = 0  # prompt order, sampling and RL state (not the warm start)
    config.train.learning_rate = 3e-4  # AdamW
    config.train.warmup_steps = 0  # linear warmup; 0: constant
    config.train.weight_decay = 0.01  # AdamW (also the warm start's)
    config.train.grad_clip = 1.0  # global gradient norm (also the warm start's)
    config.train.master_dtype = "float32"  # optimizer state and master weights
    config.train.logit_chunk_size = 128  # response tokens per chunk of the log-prob computation
    config.train.log_every = 1  # metrics every this many steps
    config.train.max_consecutive_skipped_steps = 5  # stop after this many steps skipping a non-finite update
    # A preemption notice (docs/preemption.md): finish the step, checkpoint it, exit 128 + signal
    config.train.preemption_signals = ("SIGTERM", "SIGUSR1")  # SIGUSR1: SLURM's --signal=USR1@120
    config.train.preemption_grace_s = 25.0  # at most this long after the signal (under a spot VM's 30 s)

    # Supervised warm start on the data's `target` column, trained once and reused: in
    # WORKDIR/warm_start, or with sft.cache_dir in CACHE_DIR/<hash of its inputs> (see sweep.py).
    config.sft = ml_collections.ConfigDict()
    config.sft.enabled = True  # False: RL starts from model.path
    config.sft.data = ""  # a file with targets; empty: the training data's
    config.sft.num_steps = 1000  # SFT steps
    config.sft.batch_size = 16  # examples per SFT step
    config.sft.learning_rate = 5e-3  # peak; 10% warmup, cosine decay to 10%
    config.sft.max_length = 512  # longest example (prompt + target), in tokens
    config.sft.seed = 0  # order of the SFT examples (not train.seed: RL seeds share the warm start)
    config.sft.cache_dir = ""  # shared warm starts; empty: WORKDIR/warm_start
    config.sft.only_with_targets = False  # True: skip the warm start when the data has no targets
    config.sft.length_bucket = 16  # batches cut to 16-token prompt windows (3 here: 160, 176, 192); 0: off

    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.every_steps = 10  # save every this many RL steps
    config.checkpoint.keep = 2  # the latest checkpoints kept

    config.eval = ml_collections.ConfigDict()
    config.eval.split = "validation"  # evaluated before and after RL: validation | test | none
    config.eval.max_examples = 128  # the first N examples; 0: all
    config.eval.batch_size = 64  # prompts per generation batch
    config.eval.every_steps = 0  # 0: only before and after RL
    config.eval.sets = ""  # a directory of helpfulness-safety parquet sets evaluated instead of the split
    config.eval.max_total_tokens = 0  # API-Bank (eval.py): prompt + response tokens at most; 0: no cap

    # Devices per mesh axis; -1: all remaining. The batch is split over data x fsdp.
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))

    # The policy exported in Hugging Face format (WORKDIR/policy; export.py): "" = model.dtype | float32 | bfloat16.
    config.export = ml_collections.ConfigDict(dict(dtype=""))

    # What a run records besides metrics.jsonl and TensorBoard: the rollouts of every Nth step
    # (WORKDIR/rollouts/step_N.jsonl; 0: never) and Weights & Biases (pip install wandb).
    config.logging = ml_collections.ConfigDict()
    config.logging.rollouts_every = 0
    # mode: online | offline | disabled | "" (the WANDB_MODE variable, else online)
    config.logging.wandb = ml_collections.ConfigDict(dict(enabled=False, project="gd2po-jax", name="", entity="",
                                                          mode=""))
    config.logging.completions_every = 10  # a few rollouts' completions in the console and TensorBoard; 0: never
    # JAX's persistent compilation cache: user (~/.cache/gd2po_jax/jax_cache) | off | a directory
    # (GD2PO_JAX_COMPILATION_CACHE=off|DIR overrides it): a rerun or a sweep's next run skips compiling.
    config.logging.compilation_cache = "user"

    # Several hosts, one process each (docs/multihost.md): process 0's HOST:PORT ("auto": detected on
    # TPU pods / SLURM; empty: one process), the number of processes and this one's index.
    config.distributed = ml_collections.ConfigDict(dict(
        coordinator_address="", num_processes=0, process_id=-1, initialization_timeout_s=300,
        heartbeat_timeout_s=100))
    return config
