"""gd2po_jax.models.engine: the engine's completions equal the one-shot path's for any slot count;
the host loop's bookkeeping (slots, regions, groups, the drain) and its work per token."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gd2po_jax.models import load_pretrained
from gd2po_jax.models.engine import (
    Scheduler,
    drive,
    engine_layout,
    run_engine,
    simulate,
    slot_counts,
)
from gd2po_jax.models.logprobs import merge_model
from gd2po_jax.models.sampling import SamplingParams, bucket_length, generate, left_pad
from tests.fakes import VOCAB, tiny_checkpoint

PROMPT_LENGTHS = (3, 7, 5, 9, 1, 4)


@pytest.fixture(scope="module")
def model():
    path, _ = tiny_checkpoint("qwen2", True)
    return load_pretrained(path)


def _prompts(seed=1, lengths=PROMPT_LENGTHS):
    rs = np.random.RandomState(seed)
    return [[int(t) for t in rs.randint(0, VOCAB, n)] for n in lengths]


def _eos_ids(model, prompts, new_tokens):
    """Two EOS ids taken from greedy rows at different steps: rows stop at different lengths."""
    free = np.asarray(generate(model, prompts, max_new_tokens=new_tokens, temperature=0.0, static=True).tokens)
    return sorted({int(free[0, 2]), int(free[1, 5])})


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.8, 5, 0.9)])
def test_engine_equals_the_one_shot_path_for_any_slot_count(model, temperature, top_k, top_p):
    prompts, new = _prompts(), 14
    eos = _eos_ids(model, prompts, new)
    kwargs = dict(max_new_tokens=new, temperature=temperature, top_k=top_k, top_p=top_p, eos_token_ids=eos,
                  rng=jax.random.key(5), num_samples=3)
    one_shot = generate(model, prompts, static=True, **kwargs)
    lengths = np.asarray(one_shot.lengths)
    assert lengths.min() < new and len(set(lengths.tolist())) >= 3, "test needs rows stopping at different steps"
    # The layers unrolled (the CPU's default) and in a scan (GPU and TPU), whose step attends to the
    # new token's key apart from the cache's.
    for slots, chunk, scan_layers in ((0, 16, False), (1, 4, False), (4, 3, False), (7, 5, False), (18, 1, False),
                                      (0, 16, True), (1, 4, True), (7, 5, True)):
        out = generate(model, prompts, slots=slots, chunk=chunk, scan_layers=scan_layers, **kwargs)
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(one_shot.tokens),
                                      err_msg=f"slots={slots} scan_layers={scan_layers}")
        np.testing.assert_array_equal(np.asarray(out.lengths), lengths)
        np.testing.assert_array_equal(np.asarray(out.finished), np.asarray(one_shot.finished))
        np.testing.assert_array_equal(np.asarray(out.prompt_tokens), np.asarray(one_shot.prompt_tokens))
        # The same values summed in other orders (other batch sizes, the new token's key apart): ulps.
        np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(one_shot.logprobs), atol=1e-5, rtol=0)


def test_engine_in_bf16_follows_the_one_shot_path(model):
    prompts = _prompts(2)
    kwargs = dict(max_new_tokens=9, temperature=0.0, num_samples=2)
    graphdef, state = nnx.split(model)
    bf16 = merge_model(graphdef, state, jnp.bfloat16)
    one_shot = generate(bf16, prompts, static=True, **kwargs)
    out = generate(bf16, prompts, slots=3, chunk=2, **kwargs)
    # bf16 keys and values are rounded alike in both paths: greedy tokens agree where no near-tie.
    agree = np.mean(np.asarray(out.tokens) == np.asarray(one_shot.tokens))
    assert agree >= 0.9, agree
    np.testing.assert_allclose(np.asarray(out.logprobs)[:, 0], np.asarray(one_shot.logprobs)[:, 0], atol=2e-2)


def test_groups_are_reported_once_as_they_complete(model):
    prompts = _prompts(3)
    eos = _eos_ids(model, prompts, 12)
    ids, mask = left_pad(prompts, bucket_length(max(map(len, prompts))), 0)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, eos_token_ids=tuple(eos), pad_token_id=0)
    seen, groups = [], {}

    def on_group(prompt, group):
        seen.append(prompt)
        groups[prompt] = jax.tree.map(np.asarray, group)  # read while the next chunk runs

    run = run_engine(model, ids, mask, params, num_samples=2, rng=jax.random.key(1), slots=3, chunk=2,
                     on_group=on_group)
    assert sorted(seen) == list(range(len(prompts))) and seen == run.completed_groups
    for prompt, group in groups.items():  # what the callback got is the rows' final output
        rows = slice(2 * prompt, 2 * prompt + 2)
        np.testing.assert_array_equal(group.tokens, np.asarray(run.tokens)[rows])
        np.testing.assert_array_equal(group.lengths, np.asarray(run.lengths)[rows])
        np.testing.assert_array_equal(group.logprobs, np.asarray(run.logprobs)[rows])
    lengths = np.asarray(run.lengths).reshape(len(prompts), 2).max(axis=1)
    # With 3 slots a group that stops early completes before a later-admitted longer one: the order
    # follows completion (not the prompts' order) wherever lengths differ enough.
    assert run.stats.tokens == int(np.asarray(run.lengths).sum())
    assert run.stats.slot_steps >= run.stats.tokens - len(prompts) * 2  # token 0 comes from the prefill
    assert len(seen) == len(lengths)


def test_single_token_budget_needs_no_decode(model):
    prompts = _prompts(4)
    out = generate(model, prompts, max_new_tokens=1, temperature=0.0, num_samples=2, slots=2)
    ref = generate(model, prompts, max_new_tokens=1, temperature=0.0, num_samples=2, static=True)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert np.all(np.asarray(out.lengths) == 1)


def test_slot_counts_and_layout():
    assert slot_counts(64, 4) == (64, 32, 16, 8, 4)
    assert slot_counts(6, 4) == (6,)
    assert slot_counts(5, 1) == (5, 2, 1)
    assert engine_layout(rows=24, num_samples=4, slots=0, min_slots=4) == (24, 6, 30, (24, 12, 6))
    assert engine_layout(rows=24, num_samples=4, slots=100, min_slots=4)[0] == 24


def test_scheduler_places_rows_frees_slots_and_regions():
    scheduler = Scheduler(num_prompts=3, num_samples=2, slots=3, regions=4, max_prefill=2)
    assert scheduler.prompts_to_admit() == [0, 1]  # 3 free slots need 2 groups of 2
    placed = scheduler.place()
    assert [(slot, row) for slot, row, _ in placed] == [(0, 0), (1, 1), (2, 2)]
    assert list(scheduler.waiting) == [3]
    assert scheduler.finish([True, False, True]) == []  # row 1 stopped; prompt 0 still has row 0
    assert scheduler.prompts_to_admit() == []  # row 3 waits for the free slot
    assert scheduler.place() == [(1, 3, scheduler.region_of_prompt[1])]
    assert scheduler.finish([False, True, True]) == [0]  # row 0 done: group 0 complete, region freed
    assert 0 not in scheduler.region_of_prompt and len(scheduler.free_regions) == 3
    assert scheduler.prompts_to_admit() == [2]
    assert not scheduler.drained or scheduler.waiting


def test_drain_halves_the_slots_while_the_busy_ones_fit():
    scheduler = Scheduler(num_prompts=2, num_samples=2, slots=4, regions=6, max_prefill=2)
    scheduler.prompts_to_admit()
    scheduler.place()
    scheduler.finish([False, True, False, False])
    assert scheduler.drained and scheduler.busy == 1
    assert scheduler.shrink_to((4, 2, 1)) == [1, 0]  # one step down at a time: 4 -> 2 -> 1
    assert scheduler.shrink_to((4, 2, 1)) == [0]
    assert scheduler.shrink_to((4, 2, 1)) is None
    assert scheduler.slot_rows == [1]


def test_a_run_whose_last_rows_stopped_keeps_its_slots():
    """Once every row stopped and nothing more can be allowed, no compaction runs (no chunk would use
    the smaller slots); with ``allowed``, more prompts may come, and the drained slots shrink."""

    def run(allowed):
        scheduler = Scheduler(num_prompts=2, num_samples=2, slots=4, regions=2, max_prefill=2)
        compacted = []
        drive(scheduler, admit=lambda prompts: None, chunk=lambda placed: (lambda: [False] * len(scheduler.slot_rows)),
              compact=compacted.append, slot_counts=(4, 2, 1), allowed=allowed)
        assert scheduler.done and scheduler.completed == [0, 1]
        return compacted

    assert run(None) == []
    assert run(lambda wait: 2) == [[0, 1], [0]]


def test_the_scheduler_admits_up_to_the_limit_and_grows_the_slots_back():
    scheduler = Scheduler(num_prompts=4, num_samples=2, slots=4, regions=6, max_prefill=2)
    scheduler.limit = 1
    assert scheduler.prompts_to_admit() == [0]  # 4 free slots would take 2 prompts; 1 is allowed
    scheduler.place()
    assert scheduler.drained and not scheduler.done
    assert scheduler.finish([False, False, False, False]) == [0]
    assert scheduler.done
    assert scheduler.shrink_to((4, 2, 1)) == [0, 1] and scheduler.shrink_to((4, 2, 1)) == [0]
    assert scheduler.grow_to((4, 2, 1)) is None  # drained: nothing to grow for
    scheduler.limit = 2
    assert not scheduler.done and scheduler.grow_to((4, 2, 1)) == [0, 1]  # one prompt's 2 rows: 2 slots
    assert scheduler.grow_to((4, 2, 1)) is None and scheduler.prompts_to_admit() == [1]
    scheduler.place()
    scheduler.limit = 4
    assert scheduler.grow_to((4, 2, 1)) == [0, 1, 2, 3]  # 2 busy + 2 prompts' 4 rows: all 4 slots
    assert scheduler.prompts_to_admit() == [2]  # one more prompt fits the 2 free slots


def test_prompts_allowed_while_the_engine_runs_sample_as_in_one_run(model):
    """The caller allows prompts as groups complete (dynamic sampling's refill): each admitted prompt's
    rows are those of a run that had them all from the start (per-row draws); prompts never allowed
    stay empty; the slots shrink in the drain and grow back for the late ones."""
    prompts = _prompts(6)
    eos = _eos_ids(model, prompts, 12)
    ids, mask = left_pad(prompts, bucket_length(max(map(len, prompts))), 0)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, eos_token_ids=tuple(eos), pad_token_id=0)
    kwargs = dict(num_samples=2, rng=jax.random.key(4), slots=4, min_slots=1, chunk=2)
    whole = run_engine(model, ids, mask, params, **kwargs)
    late = ids.copy()
    late[3:] = 0  # written only when allowed: the engine reads a prompt's row when it admits it
    asked, seen = [], []

    def allowed(wait):
        asked.append(wait)
        if wait and len(seen) >= 3:  # the engine is idle and asks: one more, then no further
            late[3] = ids[3]
            return 4
        return 2 if len(seen) < 2 else 3  # one more once both first groups are in

    run = run_engine(model, late, mask, params, on_group=lambda prompt, _: seen.append(prompt), allowed=allowed,
                     **kwargs)
    assert sorted(seen) == [0, 1, 2, 3] and True in asked
    rows = slice(0, 8)
    for name in ("tokens", "lengths", "finished"):
        np.testing.assert_array_equal(np.asarray(getattr(run, name))[rows], np.asarray(getattr(whole, name))[rows])
    np.testing.assert_allclose(np.asarray(run.logprobs)[rows], np.asarray(whole.logprobs)[rows], atol=1e-5, rtol=0)
    assert np.all(np.asarray(run.lengths)[8:] == 0)  # prompts 4 and 5 were never allowed
    assert run.completed_groups == seen
    assert run.stats.slot_counts[0] == 4 and min(run.stats.slot_counts) < 4 and run.stats.grown >= 1


def test_work_is_proportional_to_tokens_on_a_long_tail():
    # W-tail's lengths: geometric with mean 128, cut at 512 tokens; 64 prompts x 4.
    lengths = np.minimum(np.random.default_rng(0).geometric(1 / 128, 256), 512)
    static = 256 * (lengths.max() - 1) / lengths.sum()
    stats = simulate(lengths, 4, slots=64, min_slots=4, chunk=16)
    assert stats.slot_steps_per_token <= 1.3 < 3 < static, (stats, static)
    assert stats.slot_counts == [64, 32, 16, 8, 4]
    # Fixed lengths (workload W): one prefill, no idle slot but the last chunk's remainder.
    fixed = simulate([64] * 32, 1, slots=0, chunk=16)
    assert fixed.prefills == 1 and fixed.chunks == 4 and fixed.slot_steps == 32 * 64


def test_simulate_counts_what_the_engine_runs(model):
    prompts = _prompts(5)
    eos = _eos_ids(model, prompts, 16)
    ids, mask = left_pad(prompts, bucket_length(max(map(len, prompts))), 0)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, eos_token_ids=tuple(eos), pad_token_id=0)
    run = run_engine(model, ids, mask, params, num_samples=2, rng=jax.random.key(3), slots=4, min_slots=1, chunk=3)
    predicted = simulate(np.asarray(run.lengths), 2, slots=4, min_slots=1, chunk=3)
    assert (predicted.slot_steps, predicted.chunks, predicted.prefills, predicted.slot_counts) == (
        run.stats.slot_steps,
        run.stats.chunks,
        run.stats.prefills,
        run.stats.slot_counts,
    )


def test_the_kernels_attention_in_the_scanned_step_equals_the_one_shot_path():
    """The scanned step attending with the Pallas kernel (`gd2po_jax.models.decode_attention`, run in
    Pallas's interpreter here; compiled on a GPU, where it is the default) gives the one-shot path's
    completions, for one slot and several (a 16-wide head: the kernel's smallest)."""
    from gd2po_jax.models import Decoder
    from gd2po_jax.models.engine import decode_attention_kind
    from tests.fakes import tiny_model_config

    config = tiny_model_config(head_dim=16, num_heads=4, num_kv_heads=2, vocab_size=VOCAB)
    model = Decoder(config, rngs=nnx.Rngs(3))
    prompts, new = _prompts(lengths=(3, 7, 5, 9)), 10
    kwargs = dict(max_new_tokens=new, temperature=1.0, pad_token_id=0, rng=jax.random.key(2), num_samples=2,
                  prompt_length=bucket_length(9), static=True)
    free = np.asarray(generate(model, prompts, **kwargs).tokens)
    eos = sorted({int(free[0, 3]), int(free[3, 6])})  # rows stop at different steps
    one_shot = generate(model, prompts, eos_token_ids=eos, **kwargs)
    params = SamplingParams(max_new_tokens=new, temperature=1.0, eos_token_ids=tuple(eos), pad_token_id=0)
    ids, mask = left_pad(prompts, bucket_length(9), 0)
    assert len(set(np.asarray(one_shot.lengths).tolist())) >= 3, "test needs rows stopping at different steps"
    for slots, chunk in ((1, 4), (3, 3), (0, 16)):
        run = run_engine(model, ids, mask, params, num_samples=2, rng=jax.random.key(2), slots=slots, chunk=chunk,
                         scan_layers=True, attention="interpret")
        np.testing.assert_array_equal(np.asarray(run.tokens), np.asarray(one_shot.tokens), err_msg=f"slots={slots}")
        np.testing.assert_array_equal(np.asarray(run.lengths), np.asarray(one_shot.lengths))
        np.testing.assert_allclose(np.asarray(run.logprobs), np.asarray(one_shot.logprobs), atol=1e-5, rtol=0)
    assert decode_attention_kind(None, config, jnp.float32, True) == ("pallas" if jax.default_backend() == "gpu"
                                                                     else "xla")
    assert decode_attention_kind(None, config, jnp.float32, False) == "xla"  # the kernel is the scan's
    with pytest.raises(ValueError, match="needs the layer scan"):
        decode_attention_kind("pallas", config, jnp.float32, False)
    with pytest.raises(ValueError, match="head_dim=8"):
        decode_attention_kind("interpret", tiny_model_config(), jnp.float32, True)
    with pytest.raises(ValueError, match="must be one of"):
        decode_attention_kind("triton", config, jnp.float32, True)


def test_the_default_kernel_is_checked_once_and_a_failing_one_is_left_for_xla(monkeypatch, caplog):
    """`kernel_works`: the GPU's default kernel runs a small case against XLA's attention first; a
    kernel that raises (a Triton compile failing) or computes something else is not used, with a
    warning. (Here in Pallas's interpreter.)"""
    from gd2po_jax.models import engine

    engine.kernel_works.cache_clear()
    assert engine.kernel_works(16, 7, "float32", interpret=True)
    assert engine.kernel_works(64, 2, "bfloat16", interpret=True)

    def broken(*args, **kwargs):
        raise RuntimeError("triton: out of shared memory\nmore")

    monkeypatch.setattr(engine, "slot_decode_attention", broken)
    with caplog.at_level("WARNING"):
        assert not engine.kernel_works(32, 2, "float32", interpret=True)
    assert "does not run here (RuntimeError: triton: out of shared memory)" in caplog.text
    monkeypatch.setattr(engine, "slot_decode_attention", lambda q, *a, **k: jnp.zeros_like(q))
    with caplog.at_level("WARNING"):
        assert not engine.kernel_works(32, 4, "float32", interpret=True)
    assert "differs from XLA's by" in caplog.text
    engine.kernel_works.cache_clear()


def test_the_chunk_with_the_kernel_lowers_for_a_gpu():
    """The whole chunk program (fori_loop over steps, scan over layers, the kernel per layer) lowers
    for CUDA on this CPU machine: the Pallas kernel becomes a Triton call, so what the GPU run would
    reject at the Pallas level (shapes, ops) fails here. Triton's own compile needs a GPU."""
    from gd2po_jax.models import Decoder
    from gd2po_jax.models.engine import engine_weights, init_state, run_chunk
    from tests.fakes import tiny_model_config

    config = tiny_model_config(head_dim=64, num_heads=14, num_kv_heads=2, hidden_size=128)
    model = Decoder(config, rngs=nnx.Rngs(0))
    graphdef, params_state = nnx.split(model)
    weights = engine_weights(graphdef, params_state, True, stacked=True)
    state = init_state(config, regions=6, slots=4, rows=8, prompt_length=16, max_new_tokens=12, dtype=jnp.bfloat16,
                       pad_token_id=0, rng=jax.random.key(0), stacked_layers=True)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, eos_token_ids=(1,), pad_token_id=0)
    chunk = jax.jit(run_chunk, static_argnums=(0, 5, 6, 7))
    rows, regions = np.full(4, 8, np.int32), np.zeros(4, np.int32)
    text = chunk.trace(config, weights, state, rows, regions, params, 4, "pallas").lower(
        lowering_platforms=("cuda",)).as_text()
    assert text.count('name = "slot_decode_attention"') == 1  # once, in the scanned layer
    assert "__gpu$xla.gpu.triton" in text


def test_layer_scan_is_picked_by_backend_and_keeps_the_layers_stacked(model):
    from gd2po_jax.models.engine import compact, init_state, layer_scan

    assert layer_scan(None) is (jax.default_backend() != "cpu")
    assert layer_scan(True) is True and layer_scan(False) is False
    config = model.config
    state = init_state(config, regions=3, slots=4, rows=8, prompt_length=5, max_new_tokens=6, dtype=jnp.float32,
                       pad_token_id=0, rng=jax.random.key(0), stacked_layers=True)
    assert state.stacked_layers and len(state.slot_keys) == 1
    assert state.slot_keys[0].shape == (config.num_layers, 4, config.num_kv_heads, config.head_dim, 8)  # 5, aligned
    marked = state.replace(slot_keys=(state.slot_keys[0].at[:, 2].set(1.0),))
    smaller = compact(marked, jnp.asarray([2, 0]))
    assert smaller.slot_keys[0].shape[1] == 2 and smaller.num_slots == 2
    assert float(smaller.slot_keys[0][:, 0].min()) == 1.0 and float(smaller.slot_keys[0][:, 1].max()) == 0.0


def test_the_chunks_cpu_compile_options_keep_its_results_bit_for_bit(model, monkeypatch):
    from gd2po_jax.models import engine

    prompts = _prompts(4)
    ids, mask = left_pad(prompts, bucket_length(max(map(len, prompts))), 0)
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    runs = []
    # Against XLA's default level, named: the suite's processes compile at level 0 (tests/xla_env.py),
    # which JitByBackend leaves to them unless XLA_FLAGS is out of the way.
    monkeypatch.setenv("XLA_FLAGS", "")
    for options in (engine.CPU_CHUNK_OPTIONS, {"xla_backend_optimization_level": 2}):
        chunk = engine.JitByBackend(engine.run_chunk, {"cpu": options}, static_argnums=(0, 5, 6, 7),
                                    donate_argnums=(2,))
        monkeypatch.setattr(engine, "chunk_fn", chunk)
        run = run_engine(model, ids, mask, params, num_samples=2, rng=jax.random.key(3), slots=4, chunk=3)
        runs.append((np.asarray(run.tokens), np.asarray(run.logprobs)))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])


def test_the_ring_layout_reads_only_the_columns_a_row_wrote(model):
    """The unrolled step writes one column of every slot's cache a step: a row starts at whatever
    column is next (``slot_shift``), wraps past the cache's end, and never attends to the columns
    it did not write (here another run's leftovers: large values, not zeros), so its tokens are
    those of a run that started at column 0 of clean caches."""
    from gd2po_jax.models import engine

    prompts = _prompts(6, (4, 6, 2))
    ids, mask = left_pad(prompts, bucket_length(max(map(len, prompts))), 0)
    new, num_samples, slots = 10, 2, 4
    params = SamplingParams(max_new_tokens=new, temperature=1.0, pad_token_id=0)
    graphdef, params_state = nnx.split(model)
    weights = engine.weights_fn(graphdef, params_state, True, False)

    def run(state, steps):
        p = ids.shape[0]
        state = engine.admit_fn(graphdef, params_state, state, ids, mask, np.arange(p, dtype=np.int32),
                                np.arange(p, dtype=np.int32) * num_samples, params, num_samples)
        rows, regions = np.arange(slots, dtype=np.int32), np.arange(slots, dtype=np.int32) // num_samples
        return engine.chunk_fn(model.config, weights, state, rows, regions, params, steps, "xla")

    def empty():
        return engine.init_state(model.config, regions=3, slots=slots, rows=6, prompt_length=ids.shape[1],
                                 max_new_tokens=new, dtype=jnp.float32, pad_token_id=0, rng=jax.random.key(2))

    clean = run(empty(), new - 1)
    columns = clean.slot_keys[0].shape[-1]  # 9 positions -> 16
    dirty = empty()
    dirty = dirty.replace(
        slot_keys=tuple(jnp.full_like(x, 300.0) for x in dirty.slot_keys),
        slot_values=tuple(jnp.full_like(x, -300.0) for x in dirty.slot_values),
        write_column=jnp.asarray(columns - 3, jnp.int32),
    )
    shifted = run(dirty, new - 1)
    assert np.asarray(clean.slot_shift).tolist() == [0] * slots
    assert np.asarray(shifted.slot_shift).tolist() == [columns - 3] * slots
    assert int(shifted.write_column) == (columns - 3 + new - 1) % columns
    # Row 0's key of completion position j: column j of the clean run, (columns - 3 + j) % C here.
    written = np.asarray(clean.lengths)[0] - 1
    for j in range(written):
        np.testing.assert_allclose(np.asarray(shifted.slot_keys[0][0, :, :, (columns - 3 + j) % columns]),
                                   np.asarray(clean.slot_keys[0][0, :, :, j]), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(shifted.tokens)[:slots], np.asarray(clean.tokens)[:slots])
    np.testing.assert_allclose(np.asarray(shifted.logprobs)[:slots], np.asarray(clean.logprobs)[:slots], atol=1e-5)
    assert np.asarray(clean.lengths)[:slots].min() > 3, "rows must write past the ring's end"
    # A chunk longer than its rows: on CPU it ends once none is active (the ring's column tells).
    longer = run(empty(), new + 6)
    np.testing.assert_array_equal(np.asarray(longer.tokens), np.asarray(clean.tokens))
    if jax.default_backend() == "cpu":
        assert int(longer.write_column) == new - 1


def test_an_option_the_xla_flags_set_is_left_to_them(monkeypatch):
    from gd2po_jax.models.engine import JitByBackend

    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=8")
    fn = JitByBackend(lambda x: x + 1, {"cpu": {"xla_backend_optimization_level": 1, "xla_cpu_enable_fast_math": False}})
    assert fn.options == {"cpu": {"xla_cpu_enable_fast_math": False}}
    assert int(fn(jnp.asarray(1))) == 2


def test_row_logits_are_the_same_in_either_orientation():
    from gd2po_jax.models.engine import row_logits

    rs = np.random.RandomState(0)
    unembed, h = jnp.asarray(rs.randn(50, 16), jnp.float32), jnp.asarray(rs.randn(16, 7), jnp.float32)
    expected = np.asarray(h).T @ np.asarray(unembed).T
    for feature_major in (True, False, None):
        got = np.asarray(jax.jit(row_logits, static_argnums=2)(unembed, h, feature_major))
        assert got.shape == (7, 50) and got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_generate_adds_prompts_while_the_engine_runs_and_refuses_what_it_cannot(model):
    prompts = _prompts(7)
    kwargs = dict(max_new_tokens=5, temperature=1.0, rng=jax.random.key(2), num_samples=2)
    whole = generate(model, prompts, **kwargs)
    added = []

    def more_prompts(wait):
        if not added:
            added.append(True)
            return prompts[3:5]  # two more at the first ask
        return []

    out = generate(model, prompts[:3], more_prompts=more_prompts, max_prompts=6,
                   prompt_length=whole.prompt_tokens.shape[1], **kwargs)
    rows = slice(0, 10)
    np.testing.assert_array_equal(np.asarray(out.tokens)[rows], np.asarray(whole.tokens)[rows])
    np.testing.assert_array_equal(np.asarray(out.prompt_tokens)[rows], np.asarray(whole.prompt_tokens)[rows])
    assert np.all(np.asarray(out.lengths)[10:] == 0) and out.tokens.shape[0] == 12
    with pytest.raises(ValueError, match="more_prompts needs the rollout engine"):
        generate(model, prompts, more_prompts=more_prompts, max_prompts=8, static=True, **kwargs)
    with pytest.raises(ValueError, match="more than max_prompts=4"):
        generate(model, prompts[:3], more_prompts=lambda wait: prompts[:2], max_prompts=4, **kwargs)
