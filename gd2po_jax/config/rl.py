"""``config.rl`` (`RLConfig`): the advantage method and the policy loss (docs/algorithm.md; the paper's
symbols G, tau, eps_low ... are those of docs/algorithm.md#notation).

May import: gd2po_jax.config.base.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from gd2po_jax.config.base import _flag, _in_range, _int_at_least, _number, _one_of, _require, _Section

ALGORITHMS = ("grpo", "gdpo", "gd2po_hard", "gd2po_snr", "low_conflict_half", "high_conflict_half")
"""The built-in values of ``config.rl.algorithm``: the names `gd2po_jax.rl.advantages` registers
(tests/rl/test_advantages.py holds them equal: this layer cannot import that one)."""
SNR_HALF_ALGORITHMS = ("low_conflict_half", "high_conflict_half")
"""The paper's ablation of the SNR ranking (no official code)."""
BATCH_NORMS = ("token", "sequence", "none")
"""The values of ``config.rl.batch_norm`` (`gd2po_jax.rl.advantages`)."""
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
"""The values of ``config.rl.loss_agg_mode`` (verl's names; `gd2po_jax.rl.losses.aggregate_loss`)."""
SCALE_REWARDS = ("group", "batch", "none")
"""The values of ``config.rl.scale_rewards``, TRL's: the divisor of the group normalization (the group's
std, the batch's std, none: only the group mean is subtracted, Dr. GRPO / verl's
``norm_adv_by_std_in_grpo=False``); `gd2po_jax.rl.advantages.group_normalize`."""
TRL_LOSS_TYPES = {"dapo": "token-mean", "grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm"}
"""TRL's ``loss_type`` names accepted as ``rl.loss_agg_mode`` (or ``rl.loss_type``): the verl mode each
equals. dapo: one token mean over the whole minibatch; grpo: each sequence's token mean, then their
mean; dr_grpo: token sums over rows x ``max_completion_length`` (docs/own_task.md#trl-and-verl-names)."""
TRL_LOSS_TYPES_NEAREST = {
    "bnpo": "token-mean",
    "cispo": "token-mean",
    "sapo": "token-mean",
    "luspo": "seq-mean-token-mean",
    "vespo": "token-mean",
}
"""TRL ``loss_type`` names with no equal here, and the nearest verl mode (named in the error): bnpo's
token mean is over each process's micro-batch, not the minibatch; cispo, sapo, luspo and vespo change
the objective itself (clipped IS weights, soft gates, ...), not only how tokens are averaged."""
TRL_FIELD_ALIASES = {"num_iterations": "ppo_epochs", "loss_type": "loss_agg_mode"}
"""TRL's ``GRPOConfig`` names accepted as fields of ``config.rl`` (in a config file, config.json or
``--config.rl.<name>=``): the field each sets."""
TRL_CONFIG_NAMES = {
    "beta": "rl.kl_coef",
    "epsilon": "rl.clip_low",
    "epsilon_high": "rl.clip_high",
    "num_iterations": "rl.ppo_epochs",
    "loss_type": "rl.loss_agg_mode",
    "scale_rewards": "rl.scale_rewards",
    "mask_truncated_completions": "rl.mask_truncated_completions",
    "num_generations": "rl.num_generations",
    "max_completion_length": "sampling.max_new_tokens",
    "max_prompt_length": "data.max_prompt_tokens",
    "temperature": "sampling.temperature",
    "top_p": "sampling.top_p",
    "learning_rate": "train.learning_rate",
    "max_steps": "train.num_steps",
    "max_grad_norm": "train.grad_clip",
    "seed": "train.seed",
    "reward_funcs": "rewards.functions",
    "reward_weights": "rewards.weights",
    "log_completions": "logging.completions_every",
}
"""TRL ``GRPOConfig`` / ``GRPOTrainer`` names -> the config field that means the same (docs/own_task.md's
table), for the "did you mean" of a ``--config.<section>.<TRL name>`` that is no field."""
KL_ESTIMATORS = ("k1", "k3")
"""The values of ``config.rl.kl_estimator`` (`gd2po_jax.rl.losses`)."""
OLD_LOGPROBS = ("recompute", "sampler")
"""The values of ``config.rl.old_logprobs``: where the update's old log-probs come from
(`gd2po_jax.rl.train_step`)."""
DYNAMIC_SAMPLING_REFILLS = ("engine", "rounds")
"""The values of ``config.rl.dynamic_sampling_refill``: where dynamic sampling draws its new prompts
(`gd2po_jax.rl.dynamic_sampling`)."""
DYNAMIC_SAMPLING_MODES = ("off", "signal", "kept")
"""The values of ``config.rl.dynamic_sampling`` (`gd2po_jax.rl.dynamic_sampling`): off | a prompt group counts
when a reward varies in it (signal) | when enough of its rollouts carry a signal and are kept (kept)."""
HALVES_RANKINGS = ("prompt", "batch")
"""The values of ``config.rl.halves_ranking``: over what the SNR halves rank rollouts
(`gd2po_jax.rl.advantages.snr_halves`)."""


@dataclasses.dataclass(frozen=True)
class RLConfig(_Section):
    """``config.rl``: the advantage method and the policy loss (docs/algorithm.md); where the update
    differs from the official code: docs/algorithm.md#where-we-differ-from-the-official-code."""

    _path: ClassVar[str] = "rl"

    # Advantages.
    algorithm: str
    """grpo | gdpo | gd2po_hard | gd2po_snr, or the paper's SNR-ranking ablation low_conflict_half |
    high_conflict_half (`gd2po_jax.rl.advantages.METHODS`); or an aggregator of your own,
    ``module:callable`` or ``path/to/file.py:callable`` with the built-in methods' signature
    (docs/algorithm.md#your-own-aggregator)."""
    snr_tau: float
    """tau, the SNR threshold of GD2PO-SNR, in [0, 1] (0: GDPO, 1: GD2PO-Hard)."""
    num_generations: int
    """G, rollouts sampled per prompt (>= 2: a group needs a spread)."""
    batch_norm: str
    """How GDPO / GD2PO normalize over the batch: token (official) | sequence (TRL) | none."""
    group_eps: float
    """eps_group, added to the group std."""
    drop_zero_variance_groups: bool
    """Also drop groups whose rewards are all equal (DAPO's filter)."""

    # The loss.
    clip_low: float
    """eps_low: the importance ratio is clipped to [1 - eps_low, 1 + eps_high]."""
    clip_high: float
    """eps_high (see ``clip_low``)."""
    dual_clip: float
    """c, the dual-clip bound of negative-advantage losses; <= 0 disables it."""
    loss_agg_mode: str
    """How token losses become one number (verl's names, `LOSS_AGG_MODES`)."""
    filtered_in_denominator: bool
    """Rollouts that GD2PO filters out (advantage 0) stay in the token-mean denominator (official)."""
    kl_coef: float
    """beta, the coefficient of the KL penalty to the starting policy (0: none, and no reference forward
    pass)."""
    kl_estimator: str
    """k1 | k3, the KL estimator."""
    entropy_coef: float
    """Coefficient of the entropy bonus."""

    # The update's batches.
    ppo_epochs: int
    """Passes over each step's rollouts."""
    num_minibatches: int
    """Optimizer updates per pass; they split the step's P x G rollouts."""
    micro_batch_size: int
    """Rollouts per forward / backward pass, accumulated into one minibatch update; 0: the whole minibatch
    at once."""
    tempered_logprobs: bool = False
    """The old, new and reference log-probs are those of the policy at the sampling temperature,
    ``softmax(logits / sampling.temperature)``, as verl computes them; False: of the temperature-1 policy
    (the raw logits). The same at temperature 1."""
    length_bucket: int = 0
    """> 0: the update cuts left padding in steps of this many tokens. Each minibatch's rollouts are sorted
    by prompt length before they split into micro-batches (``micro_batch_size``), and each micro-batch runs
    at the shortest multiple of ``length_bucket`` that holds its longest prompt (exact: the cut slots are
    masked out). The update is compiled once, with a branch per length from the training data's shortest
    prompt up to the padded length (`gd2po_jax.rl.train_step.prompt_window_lengths`); the metrics
    ``update/prompt_padding`` and ``update/padding`` say what share of the update's token slots is left
    padding (and padding after the response). 0: every micro-batch at the padded length."""
    old_logprobs: str = "recompute"
    """Where the update's old log-probs (of the ratio rho) come from: recompute (verl) runs the training
    policy's forward pass over the step's rollouts before the update, inside the jitted step, with the
    update's dtype, micro-batches and log-prob temperature; sampler takes the sampler's own (from its KV
    cache). With recompute the first minibatch's ratios are 1, and the step logs
    ``rollout/logprob_diff_mean`` and ``_max`` (|sampler - recomputed| over response tokens)."""
    rollout_is_cap: float = 0.0
    """> 0: verl's truncated importance sampling (``actor.tis_imp_ratio_cap``): the policy-gradient loss of
    each token is multiplied by ``min(exp(recomputed - sampler), cap)``, correcting what remains of the
    sampler / trainer mismatch; needs old_logprobs=recompute. 0: off (the official runs have no such
    correction)."""
    shuffle_minibatches: bool = True
    """Reshuffle the rollouts before each epoch splits them into minibatches; False: split them in order,
    as verl (``actor.shuffle: false``)."""
    micro_batch_max_tokens: int = 0
    """> 0: weight the loss per micro-batch as verl's dynamic batches do (``actor.use_dynamic_bsz`` with
    ``ppo_max_token_len_per_gpu`` = this): each minibatch is cut into micro-batches of about this many
    tokens (prompt + response) per rank, each micro-batch's loss is its own token mean, weighted by its
    share of the minibatch's rows (`gd2po_jax.rl.micro_batches`). Needs loss_agg_mode=token-mean and
    shuffle_minibatches=False; the micro-batches the update computes in stay ``micro_batch_size`` rows.
    0: one token mean over the whole minibatch."""
    micro_batch_ranks: int = 1
    """With micro_batch_max_tokens: verl's data-parallel ranks (GPUs), which each take their share of a
    minibatch (dealt by token count, verl's ``trainer.balance_batch``) and cut it by the budget on their
    own."""
    query_reweighting: bool = True
    """GD2PO scales each prompt's summed advantage by kappa, its kept fraction, before the batch step;
    False: weight 1 for every prompt, the paper's "filtering alone" ablation."""
    snr_eps: float = 1e-8
    """Added to the SNR denominator, sum_k |T_k| + snr_eps (the official
    ``algorithm.gdpo_filter_ratio_conflict_eps``: 1e-8 in the tool-calling runs, 1e-6 in the
    helpfulness-safety ones). The sign test keeps 1e-8."""
    halves_ranking: str = "prompt"
    """low_conflict_half / high_conflict_half rank the rollouts of each prompt (prompt) or of the whole
    batch (batch)."""
    skip_zero_advantage_rows: bool = True
    """Rollouts whose advantage is 0 (those GD2PO filters out, groups of equal rewards) add nothing to the
    gradient when kl_coef and entropy_coef are 0: the update sorts them after the others in each minibatch
    and does not compute a micro-batch that holds only such rollouts (`gd2po_jax.rl.train_step`). The
    gradient is the same, up to the order of float sums; the ``loss/*`` metrics are over the rollouts with
    a gradient; ``update/skipped_rows`` is the share not computed. Needs micro-batches (``micro_batch_size``
    below the minibatch) to skip part of one."""
    scale_rewards: str = "group"
    """TRL's ``scale_rewards``: what the group normalization divides by: group (the group's std, official
    and TRL's default) | batch (the std of the whole batch's values) | none (only the group mean is
    subtracted: Dr. GRPO, verl's ``norm_adv_by_std_in_grpo=False``). GRPO's summed reward as TRL; GDPO /
    GD2PO's per-reward step (where TRL always divides by the group std)."""
    mask_truncated_completions: bool = False
    """TRL's ``mask_truncated_completions``: a completion cut at ``sampling.max_new_tokens`` (no EOS)
    adds no token to the loss; its reward still counts in its group's statistics."""
    dynamic_sampling: str = "off"
    """Dynamic sampling with refill (DAPO's, decided from several rewards; docs/dynamic_sampling.md): the
    step samples prompt groups, in rounds of prompts drawn from the data in order, until
    ``train.prompts_per_step`` of them count, and updates on those. off: every group counts (one round, as
    without it) | signal: a group counts when at least one reward (of weight != 0) varies in it, beyond
    a tolerance relative to that reward's values (`gd2po_jax.rl.dynamic_sampling.reward_varies`) |
    kept: when at least ``dynamic_sampling_min_kept`` of its rollouts carry a signal and are kept by the
    method's filter (a group whose rollouts all conflict, or all tie, is replaced). Counted groups
    beyond the batch are dropped."""
    dynamic_sampling_min_kept: int = 2
    """With dynamic_sampling=kept: the kept rollouts with a signal a group needs to count (1 .. G)."""
    dynamic_sampling_max_rounds: int = 4
    """With dynamic_sampling on: at most this many rounds of sampling per step (the first included); when
    they run out the step updates on the groups it counted, the rest of the batch filler (``valid`` False:
    no statistic, no loss), and says so (``dynamic_sampling/filler_groups``, a warning). Refilled inside
    the engine: at most this many times ``train.prompts_per_step`` prompts per step."""
    dynamic_sampling_refill: str = "engine"
    """With dynamic_sampling on, where the new prompts are sampled: engine (each group that does not
    count is replaced by the next prompt while the rollout engine decodes the rest: one run, no
    surplus; where it applies: the engine samples on one device in one process, groups are scored as
    they complete, one sampler call per step; rounds elsewhere) | rounds (rounds of prompts, each
    sampled whole after the last)."""

    def __post_init__(self):
        if isinstance(self.algorithm, str) and ":" in self.algorithm:  # an aggregator of your own
            location, _, attribute = self.algorithm.rpartition(":")
            _require(
                bool(location.strip() and attribute.strip()),
                "rl.algorithm",
                f"{self.algorithm!r} is not module:callable or path/to/file.py:callable (an aggregator of your own)",
            )
        else:
            _one_of(self.algorithm, "rl.algorithm", ALGORITHMS)
        _in_range(self.snr_tau, "rl.snr_tau", 0.0, 1.0)
        _int_at_least(self.num_generations, "rl.num_generations", minimum=2)
        _one_of(self.batch_norm, "rl.batch_norm", BATCH_NORMS)
        _number(self.group_eps, "rl.group_eps")
        _require(self.group_eps >= 0, "rl.group_eps", f"must be >= 0, got {self.group_eps}")
        _flag(self.drop_zero_variance_groups, "rl.drop_zero_variance_groups")
        _in_range(self.clip_low, "rl.clip_low", 0.0, 1.0)
        _in_range(self.clip_high, "rl.clip_high", 0.0, 10.0)
        _number(self.dual_clip, "rl.dual_clip")
        _require(
            self.dual_clip <= 0 or self.dual_clip > 1,
            "rl.dual_clip",
            f"must be > 1 (or <= 0 to disable), got {self.dual_clip}",
        )
        _one_of(self.loss_agg_mode, "rl.loss_agg_mode", LOSS_AGG_MODES)
        _flag(self.filtered_in_denominator, "rl.filtered_in_denominator")
        _number(self.kl_coef, "rl.kl_coef")
        _require(self.kl_coef >= 0, "rl.kl_coef", f"must be >= 0, got {self.kl_coef}")
        _one_of(self.kl_estimator, "rl.kl_estimator", KL_ESTIMATORS)
        _number(self.entropy_coef, "rl.entropy_coef")
        _int_at_least(self.ppo_epochs, "rl.ppo_epochs")
        _int_at_least(self.num_minibatches, "rl.num_minibatches")
        _int_at_least(self.micro_batch_size, "rl.micro_batch_size", minimum=0)
        _flag(self.tempered_logprobs, "rl.tempered_logprobs")
        _int_at_least(self.length_bucket, "rl.length_bucket", minimum=0)
        _one_of(self.old_logprobs, "rl.old_logprobs", OLD_LOGPROBS)
        _number(self.rollout_is_cap, "rl.rollout_is_cap")
        _require(self.rollout_is_cap >= 0, "rl.rollout_is_cap", f"must be >= 0 (0: off), got {self.rollout_is_cap}")
        _require(
            not self.rollout_is_cap or self.old_logprobs == "recompute",
            "rl.rollout_is_cap",
            "corrects the sampler's log-probs towards the recomputed ones: it needs rl.old_logprobs='recompute'",
        )
        _flag(self.shuffle_minibatches, "rl.shuffle_minibatches")
        _int_at_least(self.micro_batch_max_tokens, "rl.micro_batch_max_tokens", minimum=0)
        _int_at_least(self.micro_batch_ranks, "rl.micro_batch_ranks")
        if self.micro_batch_max_tokens:
            _require(
                not self.shuffle_minibatches,
                "rl.micro_batch_max_tokens",
                "verl's micro-batches are cut from minibatches taken in order: set rl.shuffle_minibatches=False",
            )
            _require(
                self.loss_agg_mode == "token-mean",
                "rl.micro_batch_max_tokens",
                f"verl's per-micro-batch weighting is implemented for rl.loss_agg_mode='token-mean', got "
                f"{self.loss_agg_mode!r} (the sequence modes weight micro-batches by their rows already)",
            )
        _flag(self.query_reweighting, "rl.query_reweighting")
        _number(self.snr_eps, "rl.snr_eps")
        _require(self.snr_eps > 0, "rl.snr_eps", f"must be > 0, got {self.snr_eps}")
        _one_of(self.halves_ranking, "rl.halves_ranking", HALVES_RANKINGS)
        _one_of(self.scale_rewards, "rl.scale_rewards", SCALE_REWARDS)
        _flag(self.mask_truncated_completions, "rl.mask_truncated_completions")
        _flag(self.skip_zero_advantage_rows, "rl.skip_zero_advantage_rows")
        _one_of(self.dynamic_sampling, "rl.dynamic_sampling", DYNAMIC_SAMPLING_MODES)
        _int_at_least(self.dynamic_sampling_min_kept, "rl.dynamic_sampling_min_kept")
        _require(
            not isinstance(self.num_generations, int) or self.dynamic_sampling_min_kept <= self.num_generations,
            "rl.dynamic_sampling_min_kept",
            f"must be at most rl.num_generations={self.num_generations} (the rollouts of a group), "
            f"got {self.dynamic_sampling_min_kept}",
        )
        _int_at_least(self.dynamic_sampling_max_rounds, "rl.dynamic_sampling_max_rounds")
        _one_of(self.dynamic_sampling_refill, "rl.dynamic_sampling_refill", DYNAMIC_SAMPLING_REFILLS)

    @classmethod
    def from_dict(cls, values, path: str | None = None):
        """`_Section.from_dict` after TRL's names (`trl_names`)."""
        return super().from_dict(trl_names(values), path)


def trl_names(values):
    """``config.rl``'s mapping with TRL's names as ours: a `TRL_FIELD_ALIASES` field as the field it
    sets (``num_iterations`` -> ``ppo_epochs``), a `TRL_LOSS_TYPES` ``loss_agg_mode`` as the verl mode it
    equals (``dapo`` -> ``token-mean``). A mapping that is not one is returned as it is.

    Raises:
      ConfigError: a TRL loss type with no equal here, naming the nearest (`TRL_LOSS_TYPES_NEAREST`).
    """
    if not isinstance(values, dict):
        return values
    values = dict(values)
    for alias, field in TRL_FIELD_ALIASES.items():
        if alias in values:  # TRL's name, given on purpose: it sets the field (over the config file's value)
            value = values.pop(alias)
            if value is not None:
                values[field] = value
    mode = values.get("loss_agg_mode")
    if isinstance(mode, str) and mode in TRL_LOSS_TYPES:
        values["loss_agg_mode"] = TRL_LOSS_TYPES[mode]
    elif isinstance(mode, str) and mode in TRL_LOSS_TYPES_NEAREST:
        _require(
            False,
            "rl.loss_agg_mode",
            f"TRL's loss_type {mode!r} has no equal here; the nearest is {TRL_LOSS_TYPES_NEAREST[mode]!r} "
            f"(TRL's equals: {', '.join(f'{k}={v}' for k, v in TRL_LOSS_TYPES.items())}; "
            "docs/own_task.md#trl-and-verl-names)",
        )
    return values
