"""The jitted RL update (`gd2po_jax.rl.train_step`) on a tiny random Qwen2 and real sampler output.

Every test builds its batch the way the trainer does: `gd2po_jax.models.sampling.generate` samples G
completions per prompt (with EOS, so response lengths differ) and `gd2po_jax.rl.rollout.rollout_batch`
turns them into a `RolloutBatch`; only the reward tensor is made up.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from bench.harness import step_config
from configs import default as default_config
from configs import toolrl as toolrl_config
from gd2po_jax.config import RunConfig, check_batch_layout
from gd2po_jax.models import Decoder, load_pretrained, save_pretrained
from gd2po_jax.models.decoder import LoRASpec
from gd2po_jax.models.logprobs import completion_logprobs, logprob_temperature, merge_model
from gd2po_jax.models.lora import adapters_of, split_lora
from gd2po_jax.models.sampling import generate
from gd2po_jax.rl.losses import LOSS_AGG_MODES
from gd2po_jax.rl.micro_batches import verl_update_layout
from gd2po_jax.rl.rollout import rollout_batch
from gd2po_jax.rl.train_step import (
    StepConfig,
    count_skipped_steps,
    jit_train_step,
    make_train_step,
    prompt_window_lengths,
    run_step_config,
    step_advantages,
)
from gd2po_jax.runtime.sharding import batch_sharding, make_mesh
from gd2po_jax.training.optimizer import make_optimizer
from gd2po_jax.training.records import RolloutBatch, TrainState
from tests.fakes import tiny_model_config
from tests.tolerances import ulps

P, G, K = 4, 4, 3  # prompts, rollouts per prompt, rewards: B = 16 rows (divides 8 devices)
NAMES = ("correctness", "format", "length")  # of the K rewards, for the metrics
MAX_NEW = 8
PROMPT_LEN = 16
EOS = 1
MODEL_CONFIG = tiny_model_config(tie_word_embeddings=True)


def new_model() -> Decoder:
    return Decoder(MODEL_CONFIG, rngs=nnx.Rngs(0))


def sample_batch(model: Decoder, seed: int, rewards: np.ndarray | None = None,
                 logprob_temperature: float = 1.0) -> RolloutBatch:
    """P random prompts (lengths 3..12), G sampled completions each, random [P, G, K] rewards."""
    rs = np.random.RandomState(seed)
    prompts = [list(rs.randint(2, MODEL_CONFIG.vocab_size, rs.randint(3, 13))) for _ in range(P)]
    out = generate(model, prompts, max_new_tokens=MAX_NEW, eos_token_ids=(EOS,), pad_token_id=0,
                   rng=jax.random.key(seed), num_samples=G, prompt_length=PROMPT_LEN,
                   logprob_temperature=logprob_temperature)
    if rewards is None:
        rewards = rs.uniform(-1.0, 1.0, (P, G, K)).astype(np.float32)
    return rollout_batch(out, jnp.asarray(rewards), jnp.ones((P,), bool))


def new_state(params, optimizer, seed: int = 0) -> TrainState:
    """A fresh state on copies of ``params`` (the step donates its state)."""
    params = jax.tree.map(jnp.copy, params)
    return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(seed))


def flat(params) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(params)])


@pytest.fixture(scope="module")
def setup():
    """(graphdef, initial params, a sampled batch with varied response lengths)."""
    model = new_model()
    batch = sample_batch(model, seed=0)
    lengths = np.asarray(batch.response_mask.sum(-1))
    assert len(set(lengths.tolist())) > 1, "the fixture batch should have responses of different lengths"
    graphdef, params = nnx.split(model, nnx.Param)
    return graphdef, params, batch


_COMPILED: dict = {}


def optimizer_of(name: tuple):
    """("adamw", lr, weight_decay) or ("sgd", lr)."""
    return make_optimizer(name[1], weight_decay=name[2]) if name[0] == "adamw" else optax.sgd(name[1])


def jitted_step(graphdef, config: StepConfig, optimizer_name: tuple):
    """The jitted update for (config, optimizer), compiled once per module (tests share them)."""
    key = (config, optimizer_name)
    if key not in _COMPILED:
        _COMPILED[key] = jit_train_step(make_train_step(graphdef, optimizer_of(optimizer_name), config))
    return _COMPILED[key]


def run_step(setup, config: StepConfig, batch=None, optimizer=("adamw", 1e-3, 0.0)):
    """(new params, metrics, new state) of one jitted update from the fixture's parameters."""
    graphdef, params, fixture_batch = setup
    state = new_state(params, optimizer_of(optimizer))
    state, metrics = jitted_step(graphdef, config, optimizer)(state, fixture_batch if batch is None else batch)
    return state.params, jax.device_get(metrics), state


# ----------------------------------------------------------------------------------------------
# One update.
# ----------------------------------------------------------------------------------------------


def test_one_update_changes_params_with_finite_metrics_and_unit_ratio(setup):
    _, params, batch = setup
    before = flat(params)
    new_params, metrics, state = run_step(setup, step_config(reward_names=NAMES))
    after = flat(new_params)
    assert np.all(np.isfinite(after))
    assert np.abs(after - before).max() > 1e-4  # Adam's first step moves weights by ~lr
    assert int(state.step) == 1
    for name, value in metrics.items():
        assert np.isfinite(value), name
    # old_logp comes from the sampler: the update's first forward pass reproduces it.
    assert metrics["loss/ratio_min"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["loss/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["loss/clip_fraction"] == 0.0
    assert abs(metrics["loss/approx_kl"]) < 1e-6
    # Bookkeeping agrees with the batch.
    mask = np.asarray(batch.response_mask)
    assert metrics["loss/tokens"] == mask.sum()
    assert metrics["response_length"] == pytest.approx(mask.sum(-1).mean())
    rewards = np.asarray(batch.rewards)
    for k, name in enumerate(NAMES):  # the step names its metrics as metrics.jsonl does
        assert metrics[f"reward/{name}"] == pytest.approx(rewards[..., k].mean(), abs=1e-6)
        assert metrics[f"advantages/zero_std_fraction/{name}"] == 0.0  # uniform random rewards
    assert metrics["advantages/kept_fraction"] <= 1.0
    assert metrics["loss/grad_norm"] > 0
    assert metrics["loss/entropy"] > 0


def test_minibatches_and_epochs_each_take_an_optimizer_step(setup):
    _, metrics, state = run_step(setup, step_config(ppo_epochs=2, num_minibatches=2))
    adam_count = [x for x in jax.tree.leaves(state.opt_state) if np.shape(x) == ()][0]
    assert int(adam_count) == 4  # 2 epochs x 2 minibatches
    assert int(state.step) == 1  # one rollout batch
    # Later minibatches see updated parameters: their ratios leave 1.
    assert metrics["loss/ratio_max"] - metrics["loss/ratio_min"] > 1e-3


def test_layout_errors_name_the_config_field():
    with pytest.raises(ValueError, match=r"^rl\.num_minibatches: 3 does not divide the 16 rollouts"):
        check_batch_layout(16, num_minibatches=3, micro_batch_size=0)
    with pytest.raises(ValueError, match=r"^rl\.micro_batch_size: 3 does not divide the minibatch of 8"):
        check_batch_layout(16, num_minibatches=2, micro_batch_size=3)
    with pytest.raises(ValueError, match=r"^train\.prompts_per_step: the 12 rollouts .* over 8 data-parallel"):
        check_batch_layout(12, num_minibatches=1, micro_batch_size=0, num_data_shards=8)
    with pytest.raises(ValueError, match=r"^rl\.micro_batch_size: micro-batches of 2 rollouts .* over 4"):
        check_batch_layout(16, num_minibatches=2, micro_batch_size=2, num_data_shards=4)
    assert check_batch_layout(16, num_minibatches=2, micro_batch_size=4) == (8, 4)
    assert check_batch_layout(16, num_minibatches=2, micro_batch_size=0, num_data_shards=8) == (8, 8)


# ----------------------------------------------------------------------------------------------
# A non-finite gradient skips the update.
# ----------------------------------------------------------------------------------------------


def poisoned(batch: RolloutBatch) -> RolloutBatch:
    """The batch with one NaN old log-prob on a response token of row 0: that row's loss, hence the
    gradient of every minibatch holding it, is NaN."""
    assert bool(batch.response_mask[0, 0])
    return batch.replace(old_logp=batch.old_logp.at[0, 0].set(jnp.nan))


def test_a_non_finite_gradient_leaves_params_and_optimizer_state_unchanged(setup):
    _, params, batch = setup
    optimizer = ("adamw", 1e-3, 0.0)
    fresh = new_state(params, optimizer_of(optimizer))
    new_params, metrics, state = run_step(setup, step_config(), batch=poisoned(batch), optimizer=optimizer)
    assert metrics["update/skipped_updates"] == 1
    assert not np.isfinite(metrics["loss/grad_norm"])
    np.testing.assert_array_equal(flat(new_params), flat(params))
    for got, want in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(fresh.opt_state)):
        np.testing.assert_array_equal(got, want)  # Adam's count and moments too
    assert int(state.step) == 1  # the rollout batch is consumed all the same
    # Without the guard the same batch turns the parameters into NaN for good.
    unguarded, _, _ = run_step(setup, step_config(skip_nonfinite_updates=False), batch=poisoned(batch),
                               optimizer=optimizer)
    assert np.isnan(flat(unguarded)).any()


def test_only_the_minibatches_with_a_non_finite_gradient_are_skipped(setup):
    _, params, batch = setup
    # 2 epochs x 2 minibatches: the poisoned row lands in one minibatch of each epoch.
    new_params, metrics, state = run_step(setup, step_config(ppo_epochs=2, num_minibatches=2), batch=poisoned(batch))
    assert metrics["update/skipped_updates"] == 2
    adam_count = [x for x in jax.tree.leaves(state.opt_state) if np.shape(x) == ()][0]
    assert int(adam_count) == 2  # 4 updates, 2 applied
    after = flat(new_params)
    assert np.all(np.isfinite(after)) and np.abs(after - flat(params)).max() > 1e-4


def test_a_finite_step_is_the_update_without_the_guard(setup):
    # The guard selects the update it computed: bitwise the unguarded step's parameters, state and metrics.
    optimizer = ("adamw", 1e-3, 0.0)
    guarded, guarded_metrics, guarded_state = run_step(setup, step_config(), optimizer=optimizer)
    plain, plain_metrics, plain_state = run_step(setup, step_config(skip_nonfinite_updates=False), optimizer=optimizer)
    assert guarded_metrics.pop("update/skipped_updates") == 0
    assert plain_metrics.pop("update/skipped_updates") == 0
    np.testing.assert_array_equal(flat(guarded), flat(plain))
    for got, want in zip(jax.tree.leaves(guarded_state.opt_state), jax.tree.leaves(plain_state.opt_state)):
        np.testing.assert_array_equal(got, want)
    assert guarded_metrics == plain_metrics


def test_consecutive_skipped_steps_stop_the_run_naming_the_field():
    consecutive = 0
    for step, skipped in enumerate([1, 0, 2, 1], start=1):  # a finite step resets the count
        consecutive = count_skipped_steps(consecutive, skipped, step, limit=3)
    assert consecutive == 2
    with pytest.raises(RuntimeError, match=r"^train\.max_consecutive_skipped_steps=3: the gradient was not "
                                           r"finite \(inf or NaN\) in 3 consecutive RL steps, up to step 5"):
        count_skipped_steps(consecutive, 1.0, 5, limit=3)


# ----------------------------------------------------------------------------------------------
# Log-probs at the rollout temperature (verl).
# ----------------------------------------------------------------------------------------------


def test_tempered_logprobs_give_unit_ratio_when_the_sampler_used_the_same_temperature(setup):
    _, _, plain = setup  # old log-probs at temperature 1
    # The fixture's tokens, with the sampler's old log-probs at T = 0.5 (a rollout temperature).
    tempered = sample_batch(new_model(), seed=0, logprob_temperature=0.5)
    np.testing.assert_array_equal(tempered.input_ids, plain.input_ids)
    _, metrics, _ = run_step(setup, step_config(logprob_temperature=0.5), batch=tempered)
    assert metrics["loss/ratio_min"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["loss/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    # Old log-probs at another temperature than the update's: the ratios start far from 1.
    _, metrics, _ = run_step(setup, step_config(logprob_temperature=0.5), batch=plain)
    assert metrics["loss/ratio_max"] - metrics["loss/ratio_min"] > 0.1


def test_logprob_temperature_from_the_run_config():
    config = default_config.get_config()
    config.sampling.temperature = 0.7
    typed = RunConfig.from_config_dict(config)
    assert logprob_temperature(typed) == 1.0 and StepConfig.from_config(typed).logprob_temperature == 1.0
    config.rl.tempered_logprobs = True
    typed = RunConfig.from_config_dict(config)
    assert logprob_temperature(typed) == 0.7 and StepConfig.from_config(typed).logprob_temperature == 0.7
    del config.rl["tempered_logprobs"]  # a config older than the field: its default, off
    assert logprob_temperature(RunConfig.from_config_dict(config)) == 1.0


# ----------------------------------------------------------------------------------------------
# The step's hyperparameters from a run config.
# ----------------------------------------------------------------------------------------------


def test_step_config_from_config_reads_every_field_of_the_run_config():
    config = default_config.get_config()
    config.rewards.weights = [1, 0.5, 2]  # ints and a list, as a config file may write them
    config.rl.dual_clip = 3  # an int
    config.rl.micro_batch_size = 4
    config.model.dtype = "bfloat16"
    typed = RunConfig.from_config_dict(config)
    step = StepConfig.from_config(typed)
    assert step.rl == typed.rl  # the run config's rl section, as it is
    assert step.reward_names == ("correctness", "format", "length")
    assert step.reward_weights == (1.0, 0.5, 2.0) and isinstance(step.reward_weights[0], float)
    assert step.rl.dual_clip == 3.0 and isinstance(step.rl.dual_clip, float)  # held as its field's type
    assert step.dual_clip_bound == 3.0
    assert (step.rl.micro_batch_size, step.compute_dtype) == (4, "bfloat16")
    assert step.logit_chunk_size == typed.train.logit_chunk_size and step.lora_dropout == 0.0
    assert (step.rl.old_logprobs, step.rl.shuffle_minibatches, step.rl.micro_batch_max_tokens) == ("recompute", True, 0)
    assert step.rl.skip_zero_advantage_rows and step.skips_rows
    official = StepConfig.from_config(RunConfig.from_config_dict(toolrl_config.get_config("qwen2.5-3b")))
    assert (official.rl.old_logprobs, official.rl.shuffle_minibatches, official.rl.micro_batch_max_tokens) == \
        ("recompute", False, 16384)
    assert hash(step) == hash(StepConfig.from_config(typed))  # hashable: part of the program
    assert StepConfig.from_config(typed, ppo_epochs=3).rl.ppo_epochs == 3
    changed = StepConfig.from_config(typed, algorithm="grpo", kl_coef=0.1, prompt_windows=[8, 12])
    assert (changed.rl.algorithm, changed.rl.kl_coef, changed.prompt_windows) == ("grpo", 0.1, (8, 12))
    assert not changed.skips_rows  # the KL term gives every row a gradient
    assert changed.with_changes(algorithm="gdpo", log_entropy=False).rl == dataclasses.replace(changed.rl,
                                                                                           algorithm="gdpo")
    with pytest.raises(ValueError, match=r"^config\.rl\.algorithm"):
        step.with_changes(algorithm="ppo")
    with pytest.raises(TypeError):
        step.with_changes(no_such_field=1)


def test_run_step_config_refuses_a_token_budget_below_a_padded_rollout():
    config = RunConfig.from_config_dict(toolrl_config.get_config("qwen2.5-3b"))  # 16384 tokens, 1024 new
    assert run_step_config(config, 100, 2048).rl.micro_batch_max_tokens == 16384
    small = config.replace({"rl.micro_batch_max_tokens": 3000})
    with pytest.raises(ValueError, match=r"^rl\.micro_batch_max_tokens: 3000 tokens cannot hold one padded rollout "
                                         r"of 3072 tokens"):
        run_step_config(small, 100, 2048)


def test_step_config_reads_the_configs_spelling_of_off():
    config = default_config.get_config()
    config.rl.dual_clip = 0.0  # <= 0 disables dual clipping
    config.rewards.weights = ()  # empty: all ones
    step = StepConfig.from_config(RunConfig.from_config_dict(config))
    assert step.rl.dual_clip == 0.0 and step.dual_clip_bound is None and step.reward_weights is None


# ----------------------------------------------------------------------------------------------
# One program, compiled once.
# ----------------------------------------------------------------------------------------------


def test_step_lowers_to_one_program_containing_the_advantages(setup):
    graphdef, params, batch = setup
    optimizer = make_optimizer(1e-3)
    state = new_state(params, optimizer)
    tau = 0.637  # a constant that appears nowhere else in the update

    def lowered_text(method):
        step = make_train_step(graphdef, optimizer, step_config(algorithm=method, snr_tau=tau))
        return jax.jit(step).lower(state, batch).as_text()

    text = lowered_text("gd2po_snr")
    assert text.count("func.func public @main") == 1
    assert "6.370000e-01" in text  # |SNR| < tau: the GD2PO-SNR filter is inside the program
    assert "stablehlo.sort" in text  # the median SNR of the diagnostics
    assert "stablehlo.while" in text  # the epoch / minibatch / micro-batch scans
    assert "6.370000e-01" not in lowered_text("gdpo")  # GDPO has no threshold: the constant is tau's
    # The raw [P, G, K] rewards are an argument of the program: advantages are not computed outside.
    signature = next(line for line in text.splitlines() if "func.func public @main" in line)
    assert f"tensor<{P}x{G}x{K}xf32>" in signature


def test_no_recompilation_over_steps_with_new_data(setup):
    graphdef, params, _ = setup
    optimizer = ("adamw", 1e-3, 0.0)
    state = new_state(params, optimizer_of(optimizer))
    step = jitted_step(graphdef, step_config(), optimizer)
    model = new_model()
    for i in range(4):
        batch = sample_batch(model, seed=100 + i)
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        assert step._cache_size() == 1, f"recompiled at step {i + 1}"
        nnx.update(model, state.params)  # sample the next batch from the updated policy
    assert int(state.step) == 4


# ----------------------------------------------------------------------------------------------
# Exact gradient accumulation.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_give_the_same_update(setup, mode):
    # Plain SGD: the parameter change is the gradient itself, so any accumulation error shows.
    optimizer = ("sgd", 1.0)
    _, params, _ = setup
    base = flat(params)
    deltas, losses = [], []
    for micro in (0, 2):  # the whole minibatch of 8 rows at once, or 4 micro-batches of 2
        config = step_config(loss_agg_mode=mode, num_minibatches=2, micro_batch_size=micro)
        new_params, metrics, _ = run_step(setup, config, optimizer=optimizer)
        deltas.append(flat(new_params) - base)
        losses.append(metrics["loss/loss"])
    assert np.abs(deltas[0]).max() > 1e-3
    # A delta is the difference of two parameters of magnitude ~1: its rounding is that of the
    # parameters (an ulp of 1 is 1.2e-7), not of the (small) delta itself.
    np.testing.assert_allclose(deltas[1], deltas[0], rtol=1e-4, atol=ulps(base, 4))
    # The loss is a mean of per-token terms of magnitude ~1 (advantage x ratio) that cancel.
    assert losses[1] == pytest.approx(losses[0], rel=1e-5, abs=ulps(1.0, 8))


# ----------------------------------------------------------------------------------------------
# Prompt windows (rl.length_bucket): micro-batches cut their left padding.
# ----------------------------------------------------------------------------------------------


def expected_padding(batch: RolloutBatch, windows: tuple[int, ...], micro_rows: int) -> tuple[float, float]:
    """(update/prompt_padding, update/padding) of one minibatch by hand: rows sorted by prompt length,
    micro-batches of ``micro_rows``, each at the shortest window (or PROMPT_LEN) holding its longest."""
    prompt = np.sort(np.asarray(batch.attention_mask[:, :PROMPT_LEN]).sum(-1))
    response = np.asarray(batch.response_mask).sum(-1)
    slots = prompt_pads = 0
    for start in range(0, len(prompt), micro_rows):
        chunk = prompt[start:start + micro_rows]
        window = min([w for w in windows if w >= chunk.max()] + [PROMPT_LEN])
        slots += len(chunk) * (window + MAX_NEW)
        prompt_pads += int(np.sum(window - chunk))
    completion_pads = len(prompt) * MAX_NEW - int(response.sum())
    return prompt_pads / slots, (prompt_pads + completion_pads) / slots


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_prompt_windows_give_the_same_update_on_fewer_slots(setup, mode):
    optimizer = ("sgd", 1.0)
    _, params, batch = setup
    lengths = np.asarray(batch.attention_mask[:, :PROMPT_LEN]).sum(-1)
    assert lengths.max() < 12 < PROMPT_LEN and lengths.min() <= 8, "the fixture should leave windows to cut"
    base = flat(params)
    plain = step_config(loss_agg_mode=mode, micro_batch_size=4)
    windowed = step_config(loss_agg_mode=mode, micro_batch_size=4, prompt_windows=(4, 8, 12))
    (plain_params, plain_metrics, _), (windowed_params, windowed_metrics, _) = (
        run_step(setup, config, optimizer=optimizer) for config in (plain, windowed))
    np.testing.assert_allclose(flat(windowed_params) - base, flat(plain_params) - base, rtol=1e-4, atol=ulps(base, 4))
    for name in ("loss/loss", "loss/pg_loss", "loss/entropy", "loss/ratio_mean", "loss/tokens"):
        assert windowed_metrics[name] == pytest.approx(plain_metrics[name], rel=1e-5, abs=ulps(1.0, 8)), name
    # The padding metrics, by hand: every row at PROMPT_LEN without windows; sorted micro-batches of 4 at
    # the windows with them.
    for config, metrics in ((plain, plain_metrics), (windowed, windowed_metrics)):
        prompt_padding, padding = expected_padding(batch, config.prompt_windows, 4)
        assert metrics["update/prompt_padding"] == pytest.approx(prompt_padding, rel=1e-6)
        assert metrics["update/padding"] == pytest.approx(padding, rel=1e-6)
    assert windowed_metrics["update/prompt_padding"] < 0.6 * plain_metrics["update/prompt_padding"]


def test_prompt_windows_with_minibatches_and_epochs_match_the_plain_update(setup):
    """Sorting happens inside each shuffled minibatch: the minibatches (hence the optimizer steps)
    stay those of the plain update."""
    optimizer = ("adamw", 1e-3, 0.0)
    _, params, batch = setup
    plain = step_config(num_minibatches=2, ppo_epochs=2, micro_batch_size=2)
    windowed = step_config(num_minibatches=2, ppo_epochs=2, micro_batch_size=2, prompt_windows=(6, 10))
    (plain_params, plain_metrics, _), (windowed_params, windowed_metrics, _) = (
        run_step(setup, config, optimizer=optimizer) for config in (plain, windowed))
    # Four Adam steps: reassociated gradient sums (other micro-batches) move an entry near Adam's
    # epsilon by up to ~1e-5, as on the mesh (test_sharded_step_equals_single_device_and_compiles_once).
    np.testing.assert_allclose(flat(windowed_params), flat(plain_params), atol=1e-5, rtol=0)
    assert windowed_metrics["loss/loss"] == pytest.approx(plain_metrics["loss/loss"], rel=1e-5, abs=1e-7)
    assert windowed_metrics["update/prompt_padding"] < plain_metrics["update/prompt_padding"]


def test_a_window_shorter_than_a_prompt_is_never_chosen(setup):
    """Windows shorter than every prompt are compiled but never run: every micro-batch runs at the
    padded length (the padding metric says so), and the update is the plain one (its rows sorted
    into other micro-batches, so equal up to the summation order)."""
    optimizer = ("sgd", 1.0)
    _, params, batch = setup
    plain, padded = step_config(micro_batch_size=4), step_config(micro_batch_size=4, prompt_windows=(1, 2))
    assert int(np.asarray(batch.attention_mask[:, :PROMPT_LEN]).sum(-1).min()) > 2
    (plain_params, plain_metrics, _), (padded_params, padded_metrics, _) = (
        run_step(setup, config, optimizer=optimizer) for config in (plain, padded))
    base = flat(params)
    np.testing.assert_allclose(flat(padded_params) - base, flat(plain_params) - base, rtol=1e-4, atol=ulps(base, 4))
    assert padded_metrics["update/prompt_padding"] == plain_metrics["update/prompt_padding"]


def test_prompt_window_lengths():
    assert prompt_window_lengths(16, 108, 192) == (112, 128, 144, 160, 176)
    assert prompt_window_lengths(16, 112, 192) == (112, 128, 144, 160, 176)
    assert prompt_window_lengths(8, 180, 192) == (184,)
    assert prompt_window_lengths(16, 190, 192) == ()
    assert prompt_window_lengths(0, 3, 192) == ()
    with pytest.raises(ValueError, match=r"^rl.length_bucket: 4 tokens make 46 prompt lengths"):
        prompt_window_lengths(4, 5, 192)


# ----------------------------------------------------------------------------------------------
# The advantage filter reaches the loss; KL to a reference.
# ----------------------------------------------------------------------------------------------


def all_conflicting_rewards() -> np.ndarray:
    """[P, G, 2]: reward 1 rises and reward 2 falls over the group, with different spacings, so
    every rollout has one positive and one negative group advantage but a non-zero sum."""
    up = np.array([0.0, 1.0, 2.0, 3.0])
    down = np.array([3.0, 2.9, 0.1, 0.0])
    rows = []
    for p in range(P):
        order = np.random.RandomState(p).permutation(G)
        rows.append(np.stack([up[order], down[order]], axis=-1))
    return np.asarray(rows, np.float32)


def test_fully_filtered_batch_gives_no_policy_gradient(setup):
    graphdef, params, _ = setup
    batch = sample_batch(new_model(), seed=0, rewards=all_conflicting_rewards())
    before = flat(params)

    hard, metrics, _ = run_step(setup, step_config(algorithm="gd2po_hard"), batch=batch)
    assert metrics["advantages/conflict_ratio"] == 1.0
    assert metrics["advantages/kept_fraction"] == 0.0
    assert metrics["loss/grad_norm"] == 0.0
    np.testing.assert_array_equal(flat(hard), before)  # lr > 0, no weight decay: nothing moves

    # With weight decay the only change is the decay itself: p <- p - lr * wd * p.
    lr, wd = 1e-2, 0.1
    decayed, _, _ = run_step(setup, step_config(algorithm="gd2po_hard"), batch=batch, optimizer=("adamw", lr, wd))
    np.testing.assert_allclose(flat(decayed), before * (1 - lr * wd), rtol=1e-6, atol=1e-9)

    # GDPO keeps the same rollouts and learns from them; SNR with a low threshold keeps some.
    gdpo, metrics, _ = run_step(setup, step_config(algorithm="gdpo"), batch=batch)
    assert metrics["advantages/kept_fraction"] == 1.0
    assert np.abs(flat(gdpo) - before).max() > 1e-4
    snr, metrics, _ = run_step(setup, step_config(algorithm="gd2po_snr", snr_tau=0.2), batch=batch)
    assert 0.0 < metrics["advantages/kept_fraction"] < 1.0
    assert np.abs(flat(snr) - before).max() > 1e-4


def row_advantages(batch: RolloutBatch, config: StepConfig) -> np.ndarray:
    """[B] the advantages the step computes for the batch's rows."""
    lengths = jnp.sum(batch.response_mask, -1).reshape(P, G)
    return np.asarray(step_advantages(batch.rewards, lengths, batch.valid, config).advantages).reshape(-1)


def zero_advantage_rows_skipped(batch: RolloutBatch, config: StepConfig, micro_rows: int) -> tuple[float, float]:
    """(update/skipped_rows, loss/tokens) by hand: the rows with a non-zero advantage come first,
    every micro-batch after the last of them is skipped, and the loss metrics count their tokens."""
    active = row_advantages(batch, config) != 0
    computed = -(-int(active.sum()) // micro_rows) * micro_rows
    return (active.size - computed) / active.size, float(np.asarray(batch.response_mask)[active].sum())


@pytest.mark.parametrize("micro", [2, 4])
def test_rows_without_a_gradient_are_skipped_and_the_update_is_the_same(setup, micro):
    """rl.skip_zero_advantage_rows: GD2PO-SNR keeps half of the rollouts of the all-conflicting batch;
    the filtered half (A = 0) fills micro-batches that are not computed, and the gradient (plain SGD:
    the parameter change) is that of the update computing every row."""
    _, params, _ = setup
    batch = sample_batch(new_model(), seed=0, rewards=all_conflicting_rewards())
    base = flat(params)
    runs = {}
    for skip in (False, True):
        config = step_config(algorithm="gd2po_snr", snr_tau=0.2, micro_batch_size=micro, skip_zero_advantage_rows=skip)
        new_params, metrics, _ = run_step(setup, config, batch=batch, optimizer=("sgd", 1.0))
        runs[skip] = (flat(new_params) - base, metrics)
    (every_delta, every_metrics), (skip_delta, skip_metrics) = runs[False], runs[True]
    assert skip_metrics["advantages/kept_fraction"] == 0.5
    assert np.abs(every_delta).max() > 1e-3
    np.testing.assert_allclose(skip_delta, every_delta, rtol=1e-4, atol=ulps(base, 4))
    skipped, tokens = zero_advantage_rows_skipped(batch, config, micro)
    assert skipped >= 0.25  # at least a quarter of the rows never ran
    assert skip_metrics["update/skipped_rows"] == pytest.approx(skipped)
    assert every_metrics["update/skipped_rows"] == 0.0
    # The loss metrics are over the rows with a gradient; the loss itself (their numerator) is the same.
    assert skip_metrics["loss/tokens"] == tokens < every_metrics["loss/tokens"]
    assert skip_metrics["loss/grad_norm"] == pytest.approx(every_metrics["loss/grad_norm"], rel=1e-5)


def test_skipping_leaves_an_update_where_every_row_has_a_gradient_unchanged(setup):
    """No row with A = 0: the stable sort keeps the order and nothing is skipped, so the update is
    the same (rounding aside: the micro-batch's program sits in a conditional, fused otherwise); a
    KL term gives every row a gradient, so nothing is skipped either. Plain SGD, as in
    `test_micro_batches_give_the_same_update`: Adam's first step is lr * g / (|g| + eps), which turns
    an ulp of a gradient entry near eps into a visible change of its parameter."""
    optimizer = ("sgd", 1.0)
    base = flat(setup[1])
    plain = step_config(algorithm="gdpo", micro_batch_size=4)
    skipping = step_config(algorithm="gdpo", micro_batch_size=4, skip_zero_advantage_rows=True)
    (plain_params, plain_metrics, _), (skip_params, skip_metrics, _) = (run_step(setup, c, optimizer=optimizer)
                                                                        for c in (plain, skipping))
    assert plain_metrics["advantages/kept_fraction"] == 1.0
    plain_delta, skip_delta = flat(plain_params) - base, flat(skip_params) - base
    assert np.abs(plain_delta).max() > 1e-3
    np.testing.assert_allclose(skip_delta, plain_delta, rtol=1e-4, atol=ulps(base, 4))
    assert skip_metrics["update/skipped_rows"] == 0.0 and skip_metrics["loss/tokens"] == plain_metrics["loss/tokens"]
    batch = sample_batch(new_model(), seed=0, rewards=all_conflicting_rewards())
    with_kl = step_config(algorithm="gd2po_hard", micro_batch_size=4, kl_coef=0.1, skip_zero_advantage_rows=True)
    _, metrics, _ = run_step(setup, with_kl, batch=batch.replace(ref_logp=batch.old_logp - 0.1))
    assert metrics["advantages/kept_fraction"] == 0.0
    assert metrics["update/skipped_rows"] == 0.0 and metrics["loss/grad_norm"] > 0


def test_a_fully_filtered_batch_computes_no_micro_batch(setup):
    _, params, _ = setup
    batch = sample_batch(new_model(), seed=0, rewards=all_conflicting_rewards())
    for micro in (0, 4):
        config = step_config(algorithm="gd2po_hard", micro_batch_size=micro, skip_zero_advantage_rows=True)
        new_params, metrics, _ = run_step(setup, config, batch=batch)
        assert metrics["update/skipped_rows"] == 1.0
        assert metrics["loss/grad_norm"] == 0.0 and metrics["loss/tokens"] == 0.0
        assert metrics["update/padding"] == metrics["update/prompt_padding"] == 0.0  # no slot computed
        np.testing.assert_array_equal(flat(new_params), flat(params))


def test_snr_halves_train_on_half_of_every_group(setup):
    """The paper's Table 6 arms through the jitted update: on a batch where every rollout
    conflicts (Hard keeps none), each half keeps 2 of every prompt's 4 rollouts, learns from them,
    and the two halves (complementary) move the parameters differently."""
    graphdef, params, _ = setup
    batch = sample_batch(new_model(), seed=0, rewards=all_conflicting_rewards())
    before = flat(params)
    moved = {}
    for method in ("low_conflict_half", "high_conflict_half"):
        new_params, metrics, _ = run_step(setup, step_config(algorithm=method), batch=batch)
        assert metrics["advantages/conflict_ratio"] == 1.0
        assert metrics["advantages/kept_fraction"] == 0.5
        assert metrics["advantages/query_weight_min"] == metrics["advantages/query_weight_max"] == 0.5
        assert metrics["advantages/dropped_ratio"] == 0.5
        assert metrics["advantages/abs_advantage_mean"] > 0
        moved[method] = flat(new_params) - before
        assert np.abs(moved[method]).max() > 1e-4
    assert np.abs(moved["low_conflict_half"] - moved["high_conflict_half"]).max() > 1e-4


def test_kl_to_the_reference(setup):
    _, _, batch = setup
    same = batch.replace(ref_logp=batch.old_logp)  # the reference is the sampling policy
    _, metrics, _ = run_step(setup, step_config(kl_coef=0.1), batch=same)
    assert abs(metrics["loss/kl"]) < 1e-6

    rs = np.random.RandomState(1)
    shifted = batch.replace(ref_logp=batch.old_logp - jnp.asarray(rs.uniform(0.1, 1.0, batch.old_logp.shape),
                                                                  jnp.float32))
    plain, plain_metrics, _ = run_step(setup, step_config(kl_coef=0.0), batch=shifted)
    ignored, _, _ = run_step(setup, step_config(kl_coef=0.0), batch=batch)
    with_kl, kl_metrics, _ = run_step(setup, step_config(kl_coef=0.5), batch=shifted)
    np.testing.assert_array_equal(flat(plain), flat(ignored))  # kl_coef=0: the reference is unused
    assert plain_metrics["loss/kl"] == 0.0
    assert kl_metrics["loss/kl"] > 0.01
    assert kl_metrics["loss/loss"] > plain_metrics["loss/loss"]
    assert np.abs(flat(with_kl) - flat(plain)).max() > 1e-5


# ----------------------------------------------------------------------------------------------
# Sharding.
# ----------------------------------------------------------------------------------------------


def shard_rows(batch: RolloutBatch, mesh) -> RolloutBatch:
    """The batch with its rows split over the mesh's batch axes, as the sampler leaves them."""
    return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, x.shape)), batch)


def test_sharded_step_equals_single_device_and_compiles_once(setup, tmp_path):
    if jax.device_count() < 8:
        pytest.skip("needs the 8 simulated host devices of tests/conftest.py")
    graphdef, _, batch = setup
    # With prompt windows and skipped rows: the switch between windows and the conditional of each
    # micro-batch run on the mesh too (GD2PO-SNR keeps a quarter of the fixture's rollouts).
    config = step_config(num_minibatches=2, micro_batch_size=4, prompt_windows=(8, 12), skip_zero_advantage_rows=True)
    optimizer = ("adamw", 1e-3, 0.0)
    single, single_metrics, single_state = run_step(setup, config, optimizer=optimizer)
    assert single_metrics["update/skipped_rows"] > 0

    mesh = make_mesh(data=2, fsdp=4)
    # As the trainer does: the policy is loaded from its checkpoint onto the mesh.
    save_pretrained(new_model(), tmp_path / "policy")
    _, mesh_params = nnx.split(load_pretrained(tmp_path / "policy", mesh=mesh), nnx.Param)
    assert any(len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
               for x in jax.tree.leaves(mesh_params)), "some parameter should be split over fsdp"
    state = new_state(mesh_params, optimizer_of(optimizer))
    # As the trainer does: scalars replicated on the mesh, the state kept on its shardings.
    replicated = NamedSharding(mesh, PartitionSpec())
    state = jax.tree.map(lambda x: x if isinstance(x.sharding, NamedSharding) else jax.device_put(x, replicated), state)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    step = jit_train_step(make_train_step(graphdef, optimizer_of(optimizer), config, mesh), shardings)
    sharded_batch = shard_rows(batch, mesh)
    assert len(sharded_batch.input_ids.sharding.device_set) == 8
    state, metrics = step(state, sharded_batch)
    np.testing.assert_allclose(flat(state.params), flat(single), atol=1e-5, rtol=0)
    for name, value in jax.device_get(metrics).items():
        assert value == pytest.approx(single_metrics[name], rel=1e-4, abs=1e-5), name

    # More steps with new rollouts of the same shapes: same shardings, no recompilation, and the
    # single-device run still agrees.
    single_step = jitted_step(graphdef, config, optimizer)
    model = new_model()
    for i in range(2):
        nnx.update(model, jax.device_get(single_state.params))
        new_batch = sample_batch(model, seed=200 + i)
        single_state, _ = single_step(single_state, new_batch)
        state, _ = step(state, shard_rows(new_batch, mesh))
        assert step._cache_size() == 1, f"recompiled at step {i + 2}"
        assert jax.tree.map(lambda x: x.sharding, state) == shardings
    np.testing.assert_allclose(flat(state.params), flat(single_state.params), atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------
# Old log-probs recomputed before the update (rl.old_logprobs="recompute", verl).
# ----------------------------------------------------------------------------------------------


def shifted(batch: RolloutBatch, seed: int = 3, scale: float = 0.3) -> tuple[RolloutBatch, np.ndarray]:
    """The batch with its sampler log-probs moved by uniform(-scale, scale) per token (a mismatch
    between the sampler and the trained policy), and the shifts [B, M]."""
    shift = np.random.RandomState(seed).uniform(-scale, scale, batch.old_logp.shape).astype(np.float32)
    return batch.replace(old_logp=batch.old_logp + shift), shift


@pytest.mark.parametrize("layout", [dict(), dict(micro_batch_size=4, prompt_windows=(8, 12)),
                                    dict(micro_batch_size=2, prompt_windows=(8, 12), skip_zero_advantage_rows=True)],
                         ids=["whole", "micro-batches-on-windows", "skipping-rows-without-gradient"])
def test_recomputed_old_logprobs_give_unit_ratios_whatever_the_sampler_gave(setup, layout):
    _, _, batch = setup
    moved, shift = shifted(batch)
    config = step_config(old_logprobs="recompute", **layout)
    _, metrics, _ = run_step(setup, config, batch=moved)
    mask = np.asarray(batch.response_mask)
    if config.rl.skip_zero_advantage_rows:
        # Only the rows with a gradient are recomputed (and counted): a quarter of them here.
        assert metrics["update/skipped_rows"] >= 0.5
        mask = mask & (row_advantages(batch, config)[:, None] != 0)
    # One epoch of one minibatch: every ratio of the update is the recomputation's, 1.
    assert max(metrics["loss/ratio_max"] - 1, 1 - metrics["loss/ratio_min"]) < 1e-5
    assert metrics["loss/clip_fraction"] == 0.0 and metrics["loss/dual_clip_fraction"] == 0.0
    assert abs(metrics["loss/approx_kl"]) < 1e-7
    # |sampler - recomputed| over the response tokens: the shift (the sampler's own log-probs are
    # the policy's, up to rounding).
    assert metrics["rollout/logprob_diff_mean"] == pytest.approx(np.abs(shift)[mask].mean(), abs=1e-5)
    assert metrics["rollout/logprob_diff_max"] == pytest.approx(np.abs(shift)[mask].max(), abs=1e-5)
    # The sampler's log-probs of the same batch: its ratios are the shifts'.
    _, sampler, _ = run_step(setup, step_config(old_logprobs="sampler", **layout), batch=moved)
    assert sampler["loss/clip_fraction"] > 0 and sampler["loss/ratio_max"] > 1.2 and sampler["loss/ratio_min"] < 0.8
    assert "rollout/logprob_diff_mean" not in sampler


def test_recompute_of_the_samplers_batch_finds_no_mismatch(setup):
    _, metrics, _ = run_step(setup, step_config(old_logprobs="recompute"))
    assert metrics["rollout/logprob_diff_max"] < 1e-5  # the sampler computed them with the same weights


def test_truncated_importance_weights_multiply_the_policy_gradient_loss(setup):
    """rl.rollout_is_cap (verl's TIS): each token's loss times min(exp(recomputed - sampler), cap).
    With unit ratios the loss of a token is -A w: loss/pg_loss is the mean of -A w by hand."""
    _, _, batch = setup
    moved, shift = shifted(batch)
    cap = 1.1
    _, metrics, _ = run_step(setup, step_config(old_logprobs="recompute", rollout_is_cap=cap), batch=moved)
    weights = np.minimum(np.exp(-shift), cap)  # recomputed - (sampler + shift), the sampler being the policy
    mask = np.asarray(batch.response_mask)
    config = step_config()
    lengths = mask.sum(-1).reshape(P, G)
    advantages = np.asarray(step_advantages(batch.rewards, jnp.asarray(lengths), batch.valid, config).advantages)
    expected = (-advantages.reshape(-1, 1) * weights)[mask].mean()
    assert metrics["loss/pg_loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert metrics["rollout/is_weight_mean"] == pytest.approx(weights[mask].mean(), rel=1e-5)
    assert metrics["rollout/is_capped_fraction"] == pytest.approx((np.exp(-shift) > cap)[mask].mean(), abs=1e-6)
    _, plain, _ = run_step(setup, step_config(old_logprobs="recompute"), batch=moved)
    assert plain["loss/pg_loss"] == pytest.approx((-advantages.reshape(-1, 1) * np.ones_like(shift))[mask].mean(),
                                                  rel=1e-4, abs=1e-6)
    with pytest.raises(ValueError, match=r"^config\.rl\.rollout_is_cap: .* needs rl\.old_logprobs='recompute'"):
        step_config(rollout_is_cap=2.0)


# ----------------------------------------------------------------------------------------------
# Minibatches in order (rl.shuffle_minibatches=False).
# ----------------------------------------------------------------------------------------------


def test_minibatches_in_order_follow_the_batch_row_order(setup):
    _, _, batch = setup
    config = step_config(num_minibatches=2, shuffle_minibatches=False)
    in_order, _, _ = run_step(setup, config)
    explicit, _, _ = run_step(setup, config, batch=batch.replace(row_order=jnp.arange(P * G, dtype=jnp.int32)))
    np.testing.assert_array_equal(flat(in_order), flat(explicit))  # no row_order: rows 0 .. B - 1
    halves_swapped = jnp.concatenate([jnp.arange(8, 16), jnp.arange(8)]).astype(jnp.int32)
    swapped, _, _ = run_step(setup, config, batch=batch.replace(row_order=halves_swapped))
    shuffled, _, _ = run_step(setup, step_config(num_minibatches=2))
    assert np.abs(flat(swapped) - flat(in_order)).max() > 1e-6  # another first minibatch
    assert np.abs(flat(shuffled) - flat(in_order)).max() > 1e-6


# ----------------------------------------------------------------------------------------------
# verl's micro-batch weighting (rl.micro_batch_max_tokens).
# ----------------------------------------------------------------------------------------------


def with_verl_layout(batch: RolloutBatch, *, num_minibatches: int, max_tokens: int, ranks: int):
    """The batch with verl's minibatch order and micro-batches, as `collect_rollouts` lays them out
    from the rows' tokens (prompt + response), and the layout."""
    tokens = np.asarray(batch.attention_mask[:, :PROMPT_LEN]).sum(-1) + np.asarray(batch.response_mask).sum(-1)
    layout = verl_update_layout(tokens, num_minibatches=num_minibatches, max_tokens=max_tokens, ranks=ranks)
    return batch.replace(row_order=jnp.asarray(layout.row_order), segment_ids=jnp.asarray(layout.segment_ids)), layout


def verl_policy_loss(logp, old_logp, advantages, mask):
    """verl's compute_policy_loss (core_algos.py: clip 0.2 / 0.2, dual clip c = 3) and agg_loss
    "token-mean" of one micro-batch, written out: its token losses' mean over its own tokens."""
    ratio = jnp.exp(jnp.clip(logp - old_logp, -20.0, 20.0))
    advantages = advantages[:, None]
    clipped = jnp.maximum(-advantages * ratio, -advantages * jnp.clip(ratio, 0.8, 1.2))
    losses_ = jnp.where(advantages < 0, jnp.minimum(-advantages * 3.0, clipped), clipped)
    return jnp.sum(losses_ * mask) / (jnp.sum(mask) + 1e-8)


def verl_reference_update(graphdef, params, batch: RolloutBatch, layout, learning_rate: float):
    """SGD as verl's DataParallelPPOActor.update_policy runs it with use_dynamic_bsz: old log-probs
    recomputed with the starting parameters (compute_log_prob), then for each minibatch in order,
    for each of its micro-batches in verl's order, ``loss = token_mean(micro) * rows / minibatch
    rows``, backward (gradients summed), one optimizer step. Returns (parameters, minibatch losses)."""
    mask = np.asarray(batch.response_mask)
    completion = mask.shape[1]
    lengths = mask.sum(-1).reshape(P, G)
    advantages = step_advantages(batch.rewards, jnp.asarray(lengths), batch.valid, step_config()).advantages.reshape(-1)

    def logprobs(params, rows):
        model = merge_model(graphdef, params, jnp.float32)
        logp, _ = completion_logprobs(model, batch.input_ids[rows], batch.attention_mask[rows], completion)
        return logp

    old_logp = logprobs(params, np.arange(P * G))
    losses_ = []
    for micro_batches in layout.micro_batches:
        minibatch_rows = sum(len(rows) for rows in micro_batches)

        def minibatch_loss(params):
            total = 0.0
            for rows in micro_batches:
                rows = np.asarray(rows)
                token_mean = verl_policy_loss(logprobs(params, rows), old_logp[rows], advantages[rows],
                                              jnp.asarray(mask[rows], jnp.float32))
                total = total + token_mean * (len(rows) / minibatch_rows)
            return total

        # One program per minibatch: eager differentiation made the three cases 76 s instead of 52 (alone).
        loss, grads = jax.jit(jax.value_and_grad(minibatch_loss))(params)
        params = jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)
        losses_.append(float(loss))
    return params, losses_


VERL_CASES = [  # (token budget, verl ranks, minibatches, our micro-batch rows): different compositions
    (24, 1, 1, 0),  # about 9 micro-batches of one minibatch of 16 rows, computed all at once
    (48, 2, 2, 4),  # 2 ranks x 2 minibatches, ours in micro-batches of 4 rows
    (200, 1, 2, 2),  # one micro-batch per minibatch: the plain token mean
]


@pytest.mark.parametrize("budget,ranks,minibatches,micro", VERL_CASES)
def test_verl_micro_batch_weighting_is_verls_accumulation(setup, budget, ranks, minibatches, micro):
    graphdef, params, batch = setup
    laid_out, layout = with_verl_layout(batch, num_minibatches=minibatches, max_tokens=budget, ranks=ranks)
    lr = 0.1
    config = step_config(old_logprobs="recompute", shuffle_minibatches=False, micro_batch_max_tokens=budget,
                         num_minibatches=minibatches, micro_batch_size=micro)
    new_params, metrics, _ = run_step(setup, config, batch=laid_out, optimizer=("sgd", lr))
    want_params, want_losses = verl_reference_update(graphdef, params, batch, layout, lr)
    assert abs(metrics["loss/loss"] - np.mean(want_losses)) < 1e-6
    base = flat(params)
    np.testing.assert_allclose(flat(new_params) - base, flat(want_params) - base, rtol=1e-4, atol=ulps(base, 4))
    # Not the token mean over the minibatch, unless each minibatch is one micro-batch.
    plain, plain_metrics, _ = run_step(setup, step_config(old_logprobs="recompute", shuffle_minibatches=False,
                                                          num_minibatches=minibatches, micro_batch_size=micro),
                                       batch=laid_out, optimizer=("sgd", lr))
    one_each = all(len(micro_batches) == 1 for micro_batches in layout.micro_batches)
    assert one_each == bool(np.abs(flat(plain) - flat(new_params)).max() < ulps(base, 4) + 1e-7)


def test_verl_weighting_needs_the_batch_segments(setup):
    config = step_config(shuffle_minibatches=False, micro_batch_max_tokens=64)
    with pytest.raises(ValueError, match="the batch has no segment_ids"):
        run_step(setup, config)
    with pytest.raises(ValueError, match=r"^config\.rl\.micro_batch_max_tokens: .* set rl\.shuffle_minibatches=False"):
        step_config(micro_batch_max_tokens=64)


def test_sharded_verl_update_is_verls_and_compiles_once(setup, tmp_path):
    """The official runs' update (recomputed old log-probs, minibatches in order, verl's micro-batch
    weighting) on a mesh of 8 devices, with prompt windows: verl's accumulation, and new batches of
    the same shapes (new layouts) run the same program."""
    if jax.device_count() < 8:
        pytest.skip("needs the 8 simulated host devices of tests/conftest.py")
    graphdef, params, batch = setup
    budget, ranks, minibatches, lr = 40, 2, 2, 0.1
    config = step_config(old_logprobs="recompute", shuffle_minibatches=False, micro_batch_max_tokens=budget,
                         num_minibatches=minibatches, micro_batch_size=8, prompt_windows=(8, 12))
    mesh = make_mesh(data=2, fsdp=4)
    save_pretrained(new_model(), tmp_path / "policy")
    _, mesh_params = nnx.split(load_pretrained(tmp_path / "policy", mesh=mesh), nnx.Param)
    optimizer = optax.sgd(lr)
    state = new_state(mesh_params, optimizer)
    replicated = NamedSharding(mesh, PartitionSpec())
    state = jax.tree.map(lambda x: x if isinstance(x.sharding, NamedSharding) else jax.device_put(x, replicated), state)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    step = jit_train_step(make_train_step(graphdef, optimizer, config, mesh), shardings)
    laid_out, layout = with_verl_layout(batch, num_minibatches=minibatches, max_tokens=budget, ranks=ranks)
    state, metrics = step(state, shard_rows(laid_out, mesh))
    want_params, want_losses = verl_reference_update(graphdef, params, batch, layout, lr)
    assert abs(float(metrics["loss/loss"]) - np.mean(want_losses)) < 1e-6
    base = flat(params)
    np.testing.assert_allclose(flat(state.params) - base, flat(want_params) - base, rtol=1e-4, atol=ulps(base, 4))
    model = new_model()
    for i in range(2):
        nnx.update(model, jax.device_get(state.params))
        new_batch, _ = with_verl_layout(sample_batch(model, seed=300 + i), num_minibatches=minibatches,
                                        max_tokens=budget, ranks=ranks)
        state, metrics = step(state, shard_rows(new_batch, mesh))
        assert step._cache_size() == 1, f"recompiled at step {i + 2}"
        assert np.isfinite(float(metrics["loss/loss"]))


# ----------------------------------------------------------------------------------------------
# LoRA (model.lora): the state holds the adapters, the base is the step's third argument.
# ----------------------------------------------------------------------------------------------

LORA = LoRASpec(rank=4, alpha=8.0)


@pytest.fixture(scope="module")
def lora_setup(setup):
    """(graphdef, adapters, base, the fixture's batch): fresh adapters on the fixture's model (which
    sampled the batch: a fresh adapter is that model)."""
    graphdef, adapters, base = split_lora(Decoder(MODEL_CONFIG, rngs=nnx.Rngs(0), lora=LORA))
    return graphdef, adapters, base, setup[2]


def state_bytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def test_a_lora_update_trains_only_the_adapters(setup, lora_setup):
    """Gradients and the optimizer state are the adapters' alone; the base (an argument of the
    program, not donated) is unchanged."""
    _, full_params, _ = setup
    graphdef, adapters, base, batch = lora_setup
    optimizer = make_optimizer(1e-3, weight_decay=0.0)
    state = new_state(adapters, optimizer)
    base_before = flat(base)
    config = step_config(reward_names=NAMES, num_minibatches=2)
    step = jit_train_step(make_train_step(graphdef, optimizer, config))
    state, metrics = step(state, batch, base)
    metrics = jax.device_get(metrics)
    np.testing.assert_array_equal(flat(base), base_before)
    # The second minibatch runs on the adapters the first one moved.
    assert metrics["loss/ratio_max"] > 1.0 + 1e-6 or metrics["loss/ratio_min"] < 1.0 - 1e-6
    before, after = nnx.merge(graphdef, adapters, base), nnx.merge(graphdef, state.params, base)
    for (_, _, a0), (_, _, a1) in zip(adapters_of(before), adapters_of(after)):
        assert np.abs(np.asarray(a1.lora_b[...])).max() > 1e-4  # B left zero
        assert np.abs(np.asarray(a1.lora_a[...] - a0.lora_a[...])).max() > 0  # A moves once B is not zero
    adapter_bytes = state_bytes(adapters)
    # Adam's two moments over the adapters (and a counter): 2x their bytes, not the model's.
    assert state_bytes(state.opt_state) == 2 * adapter_bytes + 4
    assert state_bytes(optimizer.init(full_params)) == 2 * state_bytes(full_params) + 4
    assert 4 * adapter_bytes < state_bytes(full_params)  # rank 4 of width 32


def test_lora_step_with_zero_adapters_is_the_full_models_forward(setup, lora_setup):
    """Recomputed old log-probs through base + fresh adapters equal the sampler's (the base's)."""
    graphdef, adapters, base, batch = lora_setup
    shifted_batch, shift = shifted(batch)
    optimizer = make_optimizer(1e-3, weight_decay=0.0)
    step = jit_train_step(make_train_step(graphdef, optimizer, step_config(old_logprobs="recompute")))
    _, metrics = step(new_state(adapters, optimizer), shifted_batch, base)
    mask = np.asarray(batch.response_mask)
    assert float(jax.device_get(metrics)["rollout/logprob_diff_max"]) == pytest.approx(
        np.abs(shift)[mask].max(), abs=1e-5)


def test_sharded_lora_step_equals_single_device(lora_setup, tmp_path):
    """LoRA on the fsdp and tensor axes: the adapters split as their projections, one program, the
    single-device update's numbers."""
    if jax.device_count() < 8:
        pytest.skip("needs the 8 simulated host devices of tests/conftest.py")
    graphdef, adapters, base, batch = lora_setup
    optimizer = make_optimizer(1e-3, weight_decay=0.0)
    config = step_config(num_minibatches=2, micro_batch_size=4)
    single_step = jit_train_step(make_train_step(graphdef, optimizer, config))
    single, _ = single_step(new_state(adapters, optimizer), batch, base)
    single = jax.device_get(single.params)

    mesh = make_mesh(data=1, fsdp=4, tensor=2)
    save_pretrained(new_model(), tmp_path / "policy")
    model = load_pretrained(tmp_path / "policy", mesh=mesh, lora=LORA)
    _, mesh_adapters, mesh_base = split_lora(model)
    # The fresh adapters are the fixture's (PEFT's init from another key): use the fixture's values.
    mesh_adapters = jax.tree.map(lambda x, v: jax.device_put(v, x.sharding), mesh_adapters, adapters)
    assert any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(mesh_adapters))
    state = new_state(mesh_adapters, optimizer)
    replicated = NamedSharding(mesh, PartitionSpec())
    state = jax.tree.map(lambda x: x if isinstance(x.sharding, NamedSharding) else jax.device_put(x, replicated), state)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    step = jit_train_step(make_train_step(graphdef, optimizer, config, mesh), shardings)
    state, _ = step(state, shard_rows(batch, mesh), mesh_base)
    assert jax.tree.map(lambda x: x.sharding, state) == shardings
    np.testing.assert_allclose(flat(state.params), flat(single), atol=1e-6, rtol=0)
    state, _ = step(state, shard_rows(batch, mesh), mesh_base)
    assert step._cache_size() == 1


def test_lora_dropout_is_drawn_from_the_state_rng_in_the_update_only(lora_setup):
    """model.lora.dropout: the update's forward passes with a gradient drop adapter inputs (another
    update than without), the same masks from the same state RNG; the old log-probs' recompute has
    none (its log-probs are the sampler's, whatever the rate)."""
    graphdef, adapters, base, batch = lora_setup
    optimizer = make_optimizer(1e-2, weight_decay=0.0)

    steps = {rate: jit_train_step(make_train_step(graphdef, optimizer, step_config(
        num_minibatches=2, micro_batch_size=4, lora_dropout=rate, old_logprobs="recompute"))) for rate in (0.0, 0.5)}

    def update(rate: float, seed: int = 0):
        state, metrics = steps[rate](new_state(adapters, optimizer, seed), batch, base)
        return flat(state.params), jax.device_get(metrics)

    without, _ = update(0.0)
    with_dropout, metrics = update(0.5)
    assert np.abs(with_dropout - without).max() > 1e-4
    np.testing.assert_array_equal(update(0.5)[0], with_dropout)
    assert np.abs(update(0.5, seed=1)[0] - with_dropout).max() > 0
    assert metrics["rollout/logprob_diff_max"] < 1e-5  # the recompute: no dropout, the sampler's model


def test_a_lora_update_on_a_bfloat16_base_keeps_float32_adapters(lora_setup, tmp_path):
    """model.lora.base_dtype=bfloat16: the base loads in bf16, the adapters and their AdamW state in
    fp32 (load_pretrained(dtype=bf16, lora=...)), and the update trains them on it."""
    graphdef, _, _, batch = lora_setup
    save_pretrained(new_model(), tmp_path / "policy")
    _, adapters, base = split_lora(load_pretrained(tmp_path / "policy", dtype=jnp.bfloat16, lora=LORA))
    assert {x.dtype for x in jax.tree.leaves(base)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(adapters)} == {jnp.dtype(jnp.float32)}
    optimizer = make_optimizer(1e-3, weight_decay=0.0)
    step = jit_train_step(make_train_step(graphdef, optimizer, step_config(compute_dtype="bfloat16")))
    state, metrics = step(new_state(adapters, optimizer), batch, base)
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(state.opt_state) if x.ndim} == {jnp.dtype(jnp.float32)}
    assert np.isfinite(float(metrics["loss/grad_norm"])) and float(metrics["loss/grad_norm"]) > 0
    assert np.abs(flat(state.params) - flat(adapters)).max() > 1e-4


def test_lora_kl_reference_is_the_base_without_a_copy(setup, lora_setup):
    """The KL reference of a LoRA run (rl.kl_coef > 0): the base's own arrays on the graph without
    adapters (`plain_graphdef`) give the full model's reference log-probs, bit for bit."""
    from gd2po_jax.models.logprobs import reference_logprobs_fn
    from gd2po_jax.models.lora import plain_graphdef

    full_graphdef, full_params, batch = setup
    graphdef, adapters, base, _ = lora_setup
    ref_graphdef = plain_graphdef(nnx.merge(graphdef, adapters, base))
    args = (batch.input_ids, batch.attention_mask, batch.old_logp.shape[1])
    got = reference_logprobs_fn(ref_graphdef, "float32")(base, *args)
    want = reference_logprobs_fn(full_graphdef, "float32")(full_params, *args)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    reference = nnx.merge(ref_graphdef, base)
    assert reference.lora is None and reference.embed[...] is base["embed"][...]  # no copy
