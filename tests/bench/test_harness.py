"""bench/harness.py, the bench scripts' shared measuring helpers: what each returns, in its units."""

import math
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from flax import nnx

from bench import harness


def fake_clock(*readings: float):
    """A clock that returns ``readings`` in turn (and fails the test if read once more)."""
    values = iter(readings)
    return lambda: next(values)


def test_time_calls_times_each_call_after_untimed_warmups():
    calls = []
    # Three timed calls of 3, 1 and 5 s; the two warm-ups must not read the clock at all.
    clock = fake_clock(0.0, 3.0, 10.0, 11.0, 20.0, 25.0)
    times = harness.time_calls(lambda: calls.append(len(calls)) or np.float32(1), repeats=3, warmup=2, clock=clock)
    assert times == [3.0, 1.0, 5.0]  # in call order, not sorted
    assert calls == [0, 1, 2, 3, 4]  # 2 warm-ups + 3 timed calls
    assert harness.best_and_median(times) == (1.0, 3.0)


def test_time_calls_with_no_repeats_only_warms_up():
    calls = []
    assert harness.time_calls(lambda: calls.append(1), repeats=0, warmup=3, clock=fake_clock()) == []
    assert len(calls) == 3


def test_time_call_returns_the_finished_result_and_its_seconds():
    result, seconds = harness.time_call(lambda: jax.numpy.arange(4) * 2, clock=fake_clock(5.0, 5.25))
    assert seconds == 0.25
    assert np.asarray(result).tolist() == [0, 2, 4, 6]
    _, real = harness.time_call(lambda: jax.numpy.ones(3))
    assert 0 <= real < 60  # the default clock: wall seconds


def test_best_and_median():
    assert harness.best_and_median([0.3, 0.1, 0.5, 0.2]) == (0.1, 0.25)  # an even count: the middle two's mean
    assert harness.best_and_median([2.0]) == (2.0, 2.0)
    with pytest.raises(ValueError, match="no timings"):
        harness.best_and_median([])


def test_compile_counter_counts_a_fresh_program_and_not_a_cached_one():
    with harness.CompileCounter() as counter:
        fn = jax.jit(lambda x: x * 3 + 1)
        fn(np.ones(7, np.float32)).block_until_ready()
        assert counter.count == 1 and counter.seconds > 0
        snapshot = counter.snapshot()
        fn(np.ones(7, np.float32)).block_until_ready()
        assert counter.since(snapshot) == (0, 0.0)  # the same shape: served from the jit cache
        fn(np.ones(8, np.float32)).block_until_ready()
        count, seconds = counter.since(snapshot)
        assert count == 1 and seconds > 0  # a new shape is a new program
    jax.jit(lambda x: x - 5)(np.ones(3, np.float32)).block_until_ready()
    assert counter.count == 2  # closed at the end of the with block: no longer counting


def test_random_prompts_are_ids_in_range_and_reproducible():
    prompts = harness.random_prompts(50, count=6, length=9, seed=3)
    assert len(prompts) == 6 and all(len(p) == 9 for p in prompts)
    ids = np.array(prompts)
    assert ids.min() >= 2 and ids.max() < 50  # 0 and 1 are left to pad / EOS
    assert all(type(i) is int for i in prompts[0])  # plain ints, as generate takes them
    assert harness.random_prompts(50, 6, 9, seed=3) == prompts
    assert harness.random_prompts(50, 6, 9, seed=4) != prompts
    # The head-to-head harness's draw (anchor_workloads's docstring: "NumPy default_rng(0)").
    expected = np.random.default_rng(0).integers(2, 1000, size=(4, 5), dtype=np.int64)
    assert harness.random_prompts(1000, 4, 5) == expected.tolist()


def test_ragged_random_prompts_vary_in_length_within_half_to_full():
    prompts = harness.random_prompts(100, count=40, length=10, seed=1, ragged=True)
    lengths = [len(p) for p in prompts]
    assert min(lengths) >= 5 and max(lengths) <= 10
    assert len(set(lengths)) > 1
    full = harness.random_prompts(100, count=40, length=10, seed=1)
    assert all(full[i][: len(p)] == p for i, p in enumerate(prompts))  # the first ids of each row


def test_matmul_peak_is_gflops_of_the_fastest_call(monkeypatch):
    seen = {}

    def fake_time_calls(fn, repeats, warmup=0, clock=None):
        seen.update(repeats=repeats, warmup=warmup, shape=fn().shape)
        return [0.5, 0.25, 1.0]

    monkeypatch.setattr(harness, "time_calls", fake_time_calls)
    assert harness.matmul_peak_gflops(size=64, repeats=3) == pytest.approx(2 * 64**3 / 0.25 / 1e9)
    assert seen == {"repeats": 3, "warmup": 2, "shape": (64, 64)}


def test_matmul_peak_measures_a_positive_rate():
    for dtype in (np.float32, jax.numpy.bfloat16):
        rate = harness.matmul_peak_gflops(size=64, repeats=2, dtype=dtype, device=jax.devices("cpu")[0])
        assert math.isfinite(rate) and rate > 0


def test_device_description_and_peak_memory():
    assert harness.device_description() == f"{jax.devices()[0].device_kind} x{jax.device_count()}"

    class FakeDevice:
        def __init__(self, stats):
            self.stats = stats

        def memory_stats(self):
            return self.stats

    assert harness.device_peak_bytes(FakeDevice({"peak_bytes_in_use": 3 * 2**20, "bytes_in_use": 1})) == 3 * 2**20
    assert harness.device_peak_bytes(FakeDevice(None)) is None  # a CPU reports no memory_stats()
    assert harness.device_peak_bytes(FakeDevice({"bytes_in_use": 1})) is None


@pytest.mark.parametrize("name, params", [("qwen2-29m", 29.0e6), ("qwen2.5-0.5b", 494.0e6),
                                          ("qwen2.5-1.5b", 1.54e9)])
def test_qwen2_shapes_have_their_parameter_counts(name, params):
    config = harness.qwen2_config(**harness.QWEN2_SHAPES[name])
    assert config.model_type == "qwen2" and config.tie_word_embeddings and config.qkv_bias
    assert config.num_params() == pytest.approx(params, rel=0.01)


def test_random_model_is_seeded_and_typed():
    config = harness.qwen2_config(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, vocab=64, head_dim=16)

    def params(model):
        return jax.tree.leaves(nnx.state(model, nnx.Param))

    model = harness.random_model(config)
    assert model.config == config and {x.dtype for x in params(model)} == {np.dtype(np.float32)}
    assert all(np.array_equal(a, b) for a, b in zip(params(model), params(harness.random_model(config))))  # seed 0
    bf16 = harness.random_model(config, jax.numpy.bfloat16)
    assert {x.dtype for x in params(bf16)} == {np.dtype(jax.numpy.bfloat16)}


def test_step_rollouts_takes_the_steps_prompts_in_order_and_the_trainers_settings(monkeypatch):
    import gd2po_jax.rl.rollout

    class Prompts:
        def __init__(self, ids):
            self.ids = ids

        def __len__(self):
            return len(self.ids)

        def select(self, indices):
            return [self.ids[i] for i in indices]

    config = SimpleNamespace(train=SimpleNamespace(prompts_per_step=3),
                             rl=SimpleNamespace(num_generations=2, tempered_logprobs=True, micro_batch_max_tokens=0,
                                                micro_batch_ranks=1, num_minibatches=1),
                             sampling=SimpleNamespace(temperature=0.7, prompts_per_call=3),
                             rewards=SimpleNamespace(on_error="min", num_workers=2, timeout_s=5.0, score_groups=False))
    setup = SimpleNamespace(train=Prompts(["a", "b", "c", "d", "e"]), tokenizer="tok", reward_fn="reward",
                            eos_ids=(1,), pad_id=0, prompt_length=16)
    calls = []
    monkeypatch.setattr(gd2po_jax.rl.rollout, "collect_rollouts",
                        lambda policy, prompts, *args, **kwargs: calls.append((policy, prompts, args, kwargs)))
    harness.step_rollouts(config, setup, "policy", 0)
    harness.step_rollouts(config, setup, "policy", 1)
    assert [c[1] for c in calls] == [["a", "b", "c"], ["d", "e", "a"]]  # in order, wrapping around
    policy, _, (tokenizer, reward_fn, settings), kwargs = calls[1]
    assert (policy, tokenizer, reward_fn) == ("policy", "tok", "reward")
    assert jax.random.key_data(kwargs.pop("rng")).tolist() == jax.random.key_data(jax.random.key(1)).tolist()
    assert kwargs == {}
    assert settings == gd2po_jax.rl.rollout.RolloutSettings(
        num_generations=2, sampling=config.sampling, eos_token_ids=(1,), pad_token_id=0, prompt_length=16,
        prompts_per_call=3, logprob_temperature=0.7, on_error="min", num_workers=2, timeout_s=5.0,
        score_groups=False)


def test_step_config_is_the_defaults_with_the_changes():
    config = harness.step_config(algorithm="grpo", dual_clip=0.0, micro_batch_size=8, prompt_windows=(4,))
    assert (config.rl.algorithm, config.dual_clip_bound, config.rl.micro_batch_size) == ("grpo", None, 8)
    assert config.prompt_windows == (4,)
    changed = ("algorithm", "dual_clip", "micro_batch_size")
    untouched = {k: v for k, v in harness.STEP_DEFAULTS.items() if k not in changed}
    held = {k: getattr(config.rl if hasattr(config.rl, k) else config, k) for k in untouched}
    assert held == untouched
    assert harness.step_config().rl.algorithm == "gd2po_snr"  # the changes are not kept between calls
