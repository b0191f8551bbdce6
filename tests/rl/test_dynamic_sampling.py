"""Dynamic sampling with refill (`gd2po_jax.rl.dynamic_sampling`): the counting rule, the rounds of a
step on a tiny random Qwen2's real rollouts, the final batch (its rows, marks, filler and placement on
a mesh), and the saved rollouts' marks.

The rewards are scripted per prompt kind (the data column ``kind``) from each rollout's index in its
group, so that what counts is known: flat (both rewards constant), one (reward a constant, b varies),
conflict (a and b opposite on every rollout: all in sign conflict), agree (a and b equal and varying).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from bench.harness import step_config
from gd2po_jax.config import ConfigError, SamplingConfig
from gd2po_jax.data.prompts import PromptSet
from gd2po_jax.models import Decoder, load_pretrained, save_pretrained
from gd2po_jax.rewards.base import ROLLOUT_INDEX
from gd2po_jax.rl import dynamic_sampling as ds
from gd2po_jax.rl.rollout import RolloutSettings, collect_rollouts
from gd2po_jax.rl.rollout_log import refill_records, rollout_records
from gd2po_jax.rl.train_step import jit_train_step, make_train_step
from gd2po_jax.runtime.sharding import make_mesh
from gd2po_jax.training.optimizer import make_optimizer
from gd2po_jax.training.records import TrainState
from tests.fakes import DigitTokenizer, tiny_model_config

G = 4
CONFIG = tiny_model_config(vocab_size=48)
SAMPLING = SamplingConfig(max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=0)
SETTINGS = RolloutSettings(num_generations=G, sampling=SAMPLING, eos_token_ids=(1,), pad_token_id=0, prompt_length=12)
HARD = step_config(algorithm="gd2po_hard", num_generations=G)


@dataclasses.dataclass
class KindReward:
    """K=2 rewards (a, b) of rollout g of its group, by the prompt's kind (module docstring)."""

    names: tuple = ("a", "b")

    def __call__(self, prompts, responses, columns):
        out = []
        for kind, index in zip(columns["kind"], columns[ROLLOUT_INDEX]):
            g = index % G
            out.append(
                {"flat": (1.0, 0.0), "one": (0.5, float(g)), "conflict": (g % 2, 1 - g % 2), "agree": (g, g)}[kind]
            )
        return np.asarray(out, np.float32)


def prompts_of(kinds, start: int = 0) -> PromptSet:
    rng = np.random.default_rng(start)
    ids = [[int(t) for t in rng.integers(3, 48, size=int(rng.integers(2, 8)))] for _ in kinds]
    return PromptSet(texts=[f"p{start + i}" for i in range(len(kinds))], token_ids=ids, columns={"kind": list(kinds)})


@pytest.fixture(scope="module")
def model():
    return Decoder(CONFIG, rngs=nnx.Rngs(0))


class Sampler:
    """The data in order: ``draw(n)`` gives the next n prompts of ``kinds`` (counted in ``drawn``)."""

    def __init__(self, kinds, start: int):
        self.kinds, self.start, self.drawn = list(kinds), start, 0

    def draw(self, n: int) -> PromptSet:
        kinds = self.kinds[self.drawn : self.drawn + n]
        assert len(kinds) == n, "the test's data ran out"
        out = prompts_of(kinds, self.start + self.drawn)
        self.drawn += n
        return out


def run_rounds(model, first_kinds, later_kinds, *, mode="kept", max_rounds=4, config=HARD, mesh=None, calls=None,
               in_engine=False, reward=None, **kwargs):
    """A step's dynamic sampling by rounds, or (``in_engine``) refilled inside one engine run."""
    first = prompts_of(first_kinds)
    sampler = Sampler(later_kinds, start=100)
    reward = reward or KindReward()

    def collect(prompts, rng, refill=None):
        if calls is not None:
            calls.append((prompts, rng))
        return collect_rollouts(model, prompts, DigitTokenizer(), reward, SETTINGS, rng=rng, refill=refill)

    out = ds.collect_counted(first, sampler.draw, collect, rng=jax.random.PRNGKey(7), step_config=config, mode=mode,
                             min_kept=2, max_rounds=max_rounds, mesh=mesh, settings=SETTINGS, reward_names=("a", "b"),
                             collect_refilled=collect if in_engine else None, **kwargs)
    return out, first, sampler


# ----------------------------------------------------------------------------------------------
# The rule.
# ----------------------------------------------------------------------------------------------


def test_varies_is_relative_to_the_reward_s_scale_not_std_nonzero():
    x = np.float32(0.7)
    noisy = np.nextafter(x, np.float32(1.0))  # one ulp apart: std != 0, but float noise
    rewards = np.array(
        [
            [[x, 0.0], [noisy, 0.0], [x, 0.0]],  # a: noise only; b: all zeros
            [[1000.0, 1e-30], [1000.0, 0.0], [1000.001, 0.0]],  # a: 1e-6 of its scale (noise); b: tiny but real
            [[np.nan, 1.0], [2.0, 1.0], [np.nan, 3.0]],  # a: one value present (no spread)
            [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]],  # both vary
        ],
        np.float32,
    )
    assert np.std(rewards[0, :, 0]) > 0
    varies = ds.reward_varies(rewards, np.ones(4, bool))
    np.testing.assert_array_equal(varies, [[False, False], [False, True], [False, True], [True, True]])
    # An invalid prompt never varies; a reward of weight 0 moves nothing and never counts.
    np.testing.assert_array_equal(ds.reward_varies(rewards, np.array([1, 1, 1, 0], bool))[3], [False, False])
    np.testing.assert_array_equal(ds.reward_varies(rewards, np.ones(4, bool), weights=(0.0, 1.0))[3], [False, True])


def test_signal_counts_groups_where_one_reward_is_constant_and_another_varies():
    # Reward a is constant in every group; b varies in all but the last.
    rewards = np.zeros((3, G, 2), np.float32)
    rewards[..., 0] = 1.0
    rewards[0, :, 1] = [0, 1, 2, 3]
    rewards[1, :, 1] = [1, 1, 1, 0]
    lengths = np.full((3, G), 5)
    counted, varies = ds.counted_groups("signal", rewards, lengths, np.ones(3, bool), HARD)
    np.testing.assert_array_equal(counted, [True, True, False])
    np.testing.assert_array_equal(varies[:, 0], [False, False, False])
    # The summed reward would say the same here; a summed-reward filter drops this one: a + b constant.
    rewards[2, :, 0], rewards[2, :, 1] = [0, 1, 0, 1], [1, 0, 1, 0]
    assert ds.counted_groups("signal", rewards, lengths, np.ones(3, bool), HARD)[0][2]


def test_kept_drops_groups_that_all_conflict_or_all_tie():
    rewards = np.zeros((4, G, 2), np.float32)
    rewards[0] = np.stack([[0, 1, 0, 1], [1, 0, 1, 0]], -1)  # every rollout in conflict
    rewards[1] = 1.0  # all tie
    rewards[2] = np.stack([[0, 1, 2, 3], [0, 1, 2, 3]], -1)  # agree
    rewards[3] = np.stack([[0, 1, 0, 0], [0, 0, 0, 1]], -1)  # two rollouts in conflict, two kept with a signal
    lengths = np.full((4, G), 5)
    valid = np.ones(4, bool)
    counted, _ = ds.counted_groups("kept", rewards, lengths, valid, HARD, min_kept=2)
    np.testing.assert_array_equal(counted, [False, False, True, True])
    np.testing.assert_array_equal(ds.counted_groups("kept", rewards, lengths, valid, HARD, min_kept=3)[0],
                                  [False, False, True, False])
    # signal counts the conflicting group; GDPO keeps every rollout, so kept counts it too.
    np.testing.assert_array_equal(ds.counted_groups("signal", rewards, lengths, valid, HARD)[0], [1, 0, 1, 1])
    gdpo = step_config(algorithm="gdpo", num_generations=G)
    np.testing.assert_array_equal(ds.counted_groups("kept", rewards, lengths, valid, gdpo)[0], [1, 0, 1, 1])
    # A rollout without update tokens (a truncated one, masked) carries no signal.
    no_tokens = lengths.copy()
    no_tokens[2, :3] = 0
    assert not ds.counted_groups("kept", rewards, no_tokens, valid, HARD)[0][2]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("dynamic_sampling", "maybe", "rl.dynamic_sampling"),
        ("dynamic_sampling_min_kept", 9, "rl.dynamic_sampling_min_kept: must be at most rl.num_generations=4"),
        ("dynamic_sampling_min_kept", 0, "rl.dynamic_sampling_min_kept"),
        ("dynamic_sampling_max_rounds", 0, "rl.dynamic_sampling_max_rounds"),
    ],
)
def test_invalid_fields_are_refused_in_one_line(field, value, message):
    with pytest.raises(ConfigError, match=message) as err:
        step_config(num_generations=G, **{field: value})
    assert "\n" not in str(err.value)


def test_round_sizes_are_whole_sampler_calls():
    assert ds.round_sizes(3, 8, 0) == 8
    assert ds.round_sizes(3, 8, 2) == 4
    assert ds.round_sizes(8, 8, 2) == 8
    assert ds.round_sizes(1, 8, 8) == 8


# ----------------------------------------------------------------------------------------------
# The rounds of a step.
# ----------------------------------------------------------------------------------------------


def rows_equal(batch, i, source, j):
    for name in ("input_ids", "attention_mask", "response_mask", "old_logp"):
        np.testing.assert_array_equal(np.asarray(getattr(batch, name))[i], np.asarray(getattr(source, name))[j], name)


def test_a_full_first_round_is_the_plain_step(model):
    """Round 0 samples with the step's key: when it fills the batch, the final batch is what a step
    without dynamic sampling updates on, array for array."""
    kinds = ["agree", "one", "agree", "one"]
    out, first, sampler = run_rounds(model, kinds, [], mode="signal")
    plain = collect_rollouts(model, first, DigitTokenizer(), KindReward(), SETTINGS, rng=jax.random.PRNGKey(7))
    for name in ("input_ids", "attention_mask", "response_mask", "old_logp", "ref_logp", "rewards", "valid"):
        np.testing.assert_array_equal(np.asarray(getattr(out.batch, name)), np.asarray(getattr(plain.batch, name)))
    assert out.responses == plain.responses and sampler.drawn == 0 and out.dropped is None
    assert out.sampling_metrics["dynamic_sampling/rounds"] == 1
    assert out.sampling_metrics["dynamic_sampling/generated_tokens"] == plain.generated_tokens


def test_a_conflicting_group_is_replaced_by_the_next_prompts_in_order(model):
    calls = []
    out, first, sampler = run_rounds(model, ["agree", "conflict", "flat", "one"], ["conflict", "agree", "agree", "one"],
                                     calls=calls)
    # Round 1 draws the next P prompts in order (prompts_per_call 0: one call of the step's size); two count:
    # agree (p101) and agree (p102) fill the batch, one (p103) counts too and is surplus.
    assert sampler.drawn == 4 and len(calls) == 2
    assert out.prompts.texts == ["p0", "p3", "p101", "p102"]
    assert out.marks == (ds.COUNTED,) * 4 and bool(np.all(np.asarray(out.batch.valid)))
    prompts, rewards, lengths, truncated, responses, marks = out.dropped
    assert prompts.texts == ["p103", "p1", "p2", "p100"]
    assert marks == (ds.SURPLUS, ds.NO_SIGNAL, ds.NO_SIGNAL, ds.NO_SIGNAL)
    # Each row is its round's row, rewards and texts with it.
    rounds = [collect_rollouts(model, p, DigitTokenizer(), KindReward(), SETTINGS, rng=k) for p, k in calls]
    for i, (r, p) in enumerate([(0, 0), (0, 3), (1, 1), (1, 2)]):
        rollouts = rounds[r]
        for g in range(G):
            rows_equal(out.batch, i * G + g, rollouts.batch, p * G + g)
            assert out.responses[i * G + g] == rollouts.responses[p * G + g]
        np.testing.assert_array_equal(out.rewards[i], rollouts.rewards[p])
    # The rounds' keys: distinct, deterministic, round 0 the step's.
    assert np.array_equal(calls[0][1], jax.random.PRNGKey(7))
    assert np.array_equal(calls[1][1], ds.round_key(jax.random.PRNGKey(7), 1))
    assert not np.array_equal(calls[1][1], jax.random.fold_in(jax.random.PRNGKey(7), 1))
    m = out.sampling_metrics
    assert (m["dynamic_sampling/rounds"], m["dynamic_sampling/prompts_drawn"], m["dynamic_sampling/groups_counted"],
            m["dynamic_sampling/surplus_groups"], m["dynamic_sampling/filler_groups"]) == (2, 8, 4, 1, 0)
    # Reward a does not vary in flat and one (p2, p3, p103); b in flat only (p2).
    assert m["dynamic_sampling/no_signal_fraction/a"] == 3 / 8
    assert m["dynamic_sampling/no_signal_fraction/b"] == 1 / 8
    assert m["dynamic_sampling/generated_tokens"] == out.generated_tokens == sum(r.generated_tokens for r in rounds)


def test_the_round_limit_updates_on_what_it_has_with_filler_and_says_so(model, caplog):
    out, _, sampler = run_rounds(model, ["flat", "agree", "flat", "flat"], ["flat"] * 8, max_rounds=3,
                                 prompts_per_call=2)
    # Round 1 and 2 each draw the fewest whole calls that could fill the batch: 2 calls of 2 prompts.
    assert sampler.drawn == 8
    m = out.sampling_metrics
    assert (m["dynamic_sampling/rounds"], m["dynamic_sampling/groups_counted"], m["dynamic_sampling/filler_groups"]) \
        == (3, 1, 3)
    assert out.marks == (ds.COUNTED, ds.FILLER, ds.FILLER, ds.FILLER)
    np.testing.assert_array_equal(np.asarray(out.batch.valid), [True, False, False, False])
    with caplog.at_level(logging.WARNING):
        assert ds.warn_short_step(m, 5, 3)
    assert "step 5: rl.dynamic_sampling found 1 of 4 groups that count in 3 round(s)" in caplog.text
    # Nothing counts at all: an update with no advantage, said in the warning.
    none, _, _ = run_rounds(model, ["flat"] * 4, ["flat"] * 4, max_rounds=2)
    assert none.sampling_metrics["dynamic_sampling/groups_counted"] == 0
    assert not np.asarray(none.batch.valid).any()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ds.warn_short_step(none.sampling_metrics, 1, 2)
    assert "no group counted" in caplog.text


def test_in_the_engine_a_first_set_that_counts_is_the_plain_step(model):
    """Refilled inside the engine, a step whose first P groups all count samples nothing more and
    updates on exactly the plain step's batch."""
    kinds = ["agree", "one", "agree", "one"]
    out, first, sampler = run_rounds(model, kinds, [], mode="signal", in_engine=True)
    plain = collect_rollouts(model, first, DigitTokenizer(), KindReward(), SETTINGS, rng=jax.random.PRNGKey(7))
    for name in ("input_ids", "attention_mask", "response_mask", "old_logp", "ref_logp", "rewards", "valid"):
        np.testing.assert_array_equal(np.asarray(getattr(out.batch, name)), np.asarray(getattr(plain.batch, name)))
    assert out.responses == plain.responses and sampler.drawn == 0 and out.dropped is None
    assert out.sampling_metrics["dynamic_sampling/prompts_drawn"] == 4


@dataclasses.dataclass
class SlowKindReward(KindReward):
    """`KindReward` whose calls take 0 to 30 ms, at random: the rewards come back in any order."""

    seed: int = 0

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)

    def __call__(self, prompts, responses, columns):
        time.sleep(float(self.rng.uniform(0, 0.03)))
        return super().__call__(prompts, responses, columns)


def test_in_the_engine_each_group_that_does_not_count_is_replaced_by_the_next_prompt(model):
    """One prompt drawn per group that does not count, while the engine runs: the prompts sampled are
    the shortest prefix of the data's order with P counted groups (no surplus), each row the row of
    a run of those prompts with the step's key, whatever the timing of the rewards."""
    out, first, sampler = run_rounds(model, ["agree", "conflict", "flat", "one"],
                                     ["conflict", "agree", "agree", "one"], in_engine=True)
    # conflict (p1) and flat (p2) do not count: p100 and p101 are drawn; p100 (conflict) does not
    # count: p102 is drawn. p103 is never drawn.
    assert sampler.drawn == 3
    assert out.prompts.texts == ["p0", "p3", "p101", "p102"]
    assert out.marks == (ds.COUNTED,) * 4 and bool(np.all(np.asarray(out.batch.valid)))
    prompts, rewards, lengths, truncated, responses, marks = out.dropped
    assert prompts.texts == ["p1", "p2", "p100"] and marks == (ds.NO_SIGNAL,) * 3
    m = out.sampling_metrics
    assert (m["dynamic_sampling/rounds"], m["dynamic_sampling/prompts_drawn"], m["dynamic_sampling/groups_counted"],
            m["dynamic_sampling/surplus_groups"], m["dynamic_sampling/filler_groups"]) == (1, 7, 4, 0, 0)
    # The rows are those of one run of the seven prompts with the step's key (the engine's per-row
    # draws), through as many slots as the refilled run had (P x G: the same programs).
    sampled = {text: (ids, kind) for part in (out.prompts, prompts)
               for text, ids, kind in zip(part.texts, part.token_ids, part.columns["kind"])}
    order = ["p0", "p1", "p2", "p3", "p100", "p101", "p102"]
    everything = PromptSet(order, [sampled[t][0] for t in order], {"kind": [sampled[t][1] for t in order]})
    same_slots = dataclasses.replace(SETTINGS, sampling=dataclasses.replace(SAMPLING, engine_slots=4 * G))
    whole = collect_rollouts(model, everything, DigitTokenizer(), KindReward(), same_slots, rng=jax.random.PRNGKey(7))
    for i, p in enumerate([0, 3, 5, 6]):
        for g in range(G):
            for name in ("input_ids", "attention_mask", "response_mask"):
                np.testing.assert_array_equal(np.asarray(getattr(out.batch, name))[i * G + g],
                                              np.asarray(getattr(whole.batch, name))[p * G + g], name)
            np.testing.assert_allclose(np.asarray(out.batch.old_logp)[i * G + g],
                                       np.asarray(whole.batch.old_logp)[p * G + g], atol=1e-5, rtol=0)
            assert out.responses[i * G + g] == whole.responses[p * G + g]
        np.testing.assert_array_equal(out.rewards[i], whole.rewards[p])
    # Rewards that come back late and out of order decide the same prompts and rows.
    for seed in (1, 2):
        slow, _, slow_sampler = run_rounds(model, ["agree", "conflict", "flat", "one"],
                                           ["conflict", "agree", "agree", "one"], in_engine=True,
                                           reward=SlowKindReward(seed=seed))
        assert slow_sampler.drawn == 3 and slow.prompts.texts == out.prompts.texts
        for name in ("input_ids", "response_mask", "old_logp", "rewards"):
            np.testing.assert_array_equal(np.asarray(getattr(slow.batch, name)), np.asarray(getattr(out.batch, name)))


def test_in_the_engine_the_prompt_limit_updates_on_what_it_has(model):
    """At most P x max_rounds prompts: then the step updates on what counted, the rest filler."""
    out, _, sampler = run_rounds(model, ["flat", "agree", "flat", "flat"], ["flat"] * 8, max_rounds=2, in_engine=True)
    assert sampler.drawn == 4
    m = out.sampling_metrics
    assert (m["dynamic_sampling/prompts_drawn"], m["dynamic_sampling/groups_counted"],
            m["dynamic_sampling/filler_groups"]) == (8, 1, 3)
    assert out.marks == (ds.COUNTED, ds.FILLER, ds.FILLER, ds.FILLER)
    np.testing.assert_array_equal(np.asarray(out.batch.valid), [True, False, False, False])
    assert out.prompts.texts == ["p1", "p0", "p2", "p3"]


def test_refilling_in_the_engine_where_it_cannot_is_refused(model):
    settings = dataclasses.replace(SETTINGS, score_groups=False)
    refill = ds.Refill(max_prompts=8, draw=Sampler([], 100).draw, counts=lambda *a: True)
    with pytest.raises(ValueError, match="score_groups"):
        collect_rollouts(model, prompts_of(["agree"] * 4), DigitTokenizer(), KindReward(), settings,
                         rng=jax.random.PRNGKey(0), refill=refill)


def test_saved_rollouts_mark_the_batch_s_groups_and_list_the_dropped_ones(model):
    out, _, _ = run_rounds(model, ["agree", "conflict", "flat", "one"], ["conflict", "agree", "agree", "one"])
    lengths = np.asarray(out.batch.response_mask.sum(-1))
    advantages = ds.host_advantages(out.rewards, lengths, np.asarray(out.batch.valid), HARD)
    records = rollout_records(3, out.prompts, out.responses, out.rewards, lengths, out.truncated, advantages, ("a", "b"))
    records = refill_records(3, records, out, HARD, ("a", "b"))
    assert len(records) == 8 * G
    assert [r["dynamic_sampling"] for r in records[:: G]] == ["counted"] * 4 + ["surplus"] + ["no_signal"] * 3
    assert [r["rollout"] for r in records] == list(range(8 * G))
    assert [r["prompt"] for r in records[4 * G :: G]] == ["p103", "p1", "p2", "p100"]
    conflict = records[5 * G : 6 * G]  # p1: every rollout in conflict, none kept, no advantage
    assert all(r["conflict"] and not r["keep"] and r["advantage"] == 0.0 for r in conflict)


def test_sharded_rounds_give_a_batch_placed_as_a_plain_step_s(tmp_path):
    """On 8 devices (data x fsdp): the final batch has a plain round's shardings and shapes, so the
    jitted update that ran on a plain batch runs on it without compiling again."""
    if jax.device_count() < 8:
        pytest.skip("needs the 8 simulated host devices of tests/conftest.py")
    mesh = make_mesh(data=2, fsdp=4)
    save_pretrained(Decoder(CONFIG, rngs=nnx.Rngs(0)), tmp_path / "policy")
    model = load_pretrained(tmp_path / "policy", mesh=mesh)
    calls = []
    out, _, _ = run_rounds(model, ["agree", "conflict", "flat", "one"], ["conflict", "agree", "agree", "one"],
                           mesh=mesh, calls=calls)
    plain = collect_rollouts(model, calls[0][0], DigitTokenizer(), KindReward(), SETTINGS, rng=calls[0][1])
    for name in ("input_ids", "attention_mask", "response_mask", "old_logp", "ref_logp"):
        got, want = getattr(out.batch, name), getattr(plain.batch, name)
        assert got.shape == want.shape and got.sharding == want.sharding, name
    assert len(out.batch.input_ids.sharding.device_set) == 8
    rows_equal(out.batch, 0, plain.batch, 0)
    graphdef, params = nnx.split(model, nnx.Param)
    optimizer = make_optimizer(1e-3, weight_decay=0.0)
    state = TrainState(params, optimizer.init(params), jax.numpy.zeros((), jax.numpy.int32), jax.random.PRNGKey(0))
    # As the trainer does: scalars replicated on the mesh, the state kept on its shardings.
    replicated = NamedSharding(mesh, PartitionSpec())
    state = jax.tree.map(lambda x: x if isinstance(x.sharding, NamedSharding) else jax.device_put(x, replicated), state)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    step = jit_train_step(
        make_train_step(graphdef, optimizer, HARD.with_changes(reward_names=("a", "b")), mesh), shardings
    )
    state, plain_metrics = step(state, plain.batch)
    state, metrics = step(state, out.batch)
    assert step._cache_size() == 1
    assert jax.tree.map(lambda x: x.sharding, state) == shardings
    metrics = jax.device_get(metrics)
    assert metrics["advantages/kept_fraction"] > jax.device_get(plain_metrics)["advantages/kept_fraction"]
