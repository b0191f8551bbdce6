"""gd2po_jax.models.sampling: greedy parity with transformers, log-probs, sampling statistics, compiles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from gd2po_jax.models import Decoder, load_pretrained
from gd2po_jax.models.sampling import (
    SamplingParams,
    bucket_length,
    categorical,
    completion_mask,
    decode_fn,
    decode_segments,
    generate,
    left_pad,
    prefill_fn,
)
from gd2po_jax.models.engine import admit_fn, chunk_fn, compact_fn, weights_fn
from gd2po_jax.models.logprobs import merge_model
from tests.fakes import VOCAB, logits_of, tiny_checkpoint, tiny_model_config

PROMPT_LENGTHS = (3, 7, 5, 9, 1)


def _prompts(seed=1, lengths=PROMPT_LENGTHS):
    rs = np.random.RandomState(seed)
    return [[int(t) for t in rs.randint(0, VOCAB, n)] for n in lengths]


def _hf_greedy(hf, prompts, max_new_tokens, eos=None, pad=0):
    width = max(map(len, prompts))
    ids, mask = left_pad(prompts, width, 0)
    with torch.no_grad():
        out = hf.generate(
            torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    tokens = out[:, width:].numpy()
    return np.pad(tokens, ((0, 0), (0, max_new_tokens - tokens.shape[1])), constant_values=pad)


def _recomputed_logprobs(model, out, logprob_temperature=1.0):
    """[N, M] log-probs of ``out.tokens`` at ``logprob_temperature`` by one full forward pass over
    prompt + completion (all of it, also after EOS)."""
    prompt_len = out.prompt_tokens.shape[1]
    ids = np.concatenate([out.prompt_tokens, out.tokens], axis=1)
    mask = np.concatenate([out.prompt_mask, np.ones_like(out.tokens)], axis=1)
    logits = logits_of(model, ids, mask)[:, prompt_len - 1 : -1]
    logp = jax.nn.log_softmax(logits / logprob_temperature, axis=-1)
    return np.take_along_axis(np.asarray(logp), np.asarray(out.tokens)[..., None], axis=-1)[..., 0]


@pytest.mark.parametrize("family,tie", [("qwen2", True), ("qwen3", False), ("llama3", False)])
def test_greedy_matches_transformers_generate_with_eos_at_different_steps(family, tie):
    path, hf = tiny_checkpoint(family, tie)
    model = load_pretrained(path)
    prompts, new = _prompts(), 10
    free = np.asarray(generate(model, prompts, max_new_tokens=new, temperature=0.0).tokens)
    np.testing.assert_array_equal(free, _hf_greedy(hf, prompts, new))
    # Two EOS ids taken from different rows at different steps: rows finish at different steps.
    eos = sorted({int(free[0, 2]), int(free[1, 5])})
    pad = next(t for t in range(VOCAB) if t not in eos)
    out = generate(model, prompts, max_new_tokens=new, temperature=0.0, eos_token_ids=eos, pad_token_id=pad)
    ref = _hf_greedy(hf, prompts, new, eos=eos, pad=pad)
    np.testing.assert_array_equal(np.asarray(out.tokens), ref)
    lengths, finished = np.asarray(out.lengths), np.asarray(out.finished)
    assert len(set(lengths[finished].tolist())) >= 2, "test needs rows finishing at different steps"
    for row, n, done in zip(np.asarray(out.tokens), lengths, finished):
        assert (row[n - 1] in eos) == done and np.all(row[n:] == pad)


def test_several_decode_segments_match_transformers_and_the_full_forward():
    # 200 new tokens decode in three segments (64, 128, 199 completion slots): chunk boundaries,
    # positions across them, and rows whose EOS comes in different segments.
    path, hf = tiny_checkpoint("qwen2", True)
    model = load_pretrained(path)
    prompts, new = _prompts(), 200
    assert decode_segments(new) == (64, 128, 199)
    free = np.asarray(generate(model, prompts, max_new_tokens=new, temperature=0.0).tokens)
    np.testing.assert_array_equal(free, _hf_greedy(hf, prompts, new))
    eos = sorted({int(free[0, 40]), int(free[1, 150])})
    pad = next(t for t in range(VOCAB) if t not in eos)
    out = generate(model, prompts, max_new_tokens=new, temperature=0.0, eos_token_ids=eos, pad_token_id=pad)
    np.testing.assert_array_equal(np.asarray(out.tokens), _hf_greedy(hf, prompts, new, eos=eos, pad=pad))
    lengths = np.asarray(out.lengths)
    assert lengths.min() <= 64 < lengths.max(), ("test needs EOS in different segments", lengths)
    sampled = generate(model, prompts, max_new_tokens=new, rng=jax.random.key(4))
    np.testing.assert_allclose(np.asarray(sampled.logprobs), _recomputed_logprobs(model, sampled), atol=1e-5)


def test_decode_segments():
    assert decode_segments(1) == ()  # the prefill samples the only token
    assert decode_segments(2) == (1,)
    assert decode_segments(64) == (63,)
    assert decode_segments(96) == (64, 95)
    assert decode_segments(256) == (64, 128, 255)
    assert decode_segments(1024) == (128, 256, 512, 1023)
    assert decode_segments(256, granule=32) == (32, 64, 128, 255)
    for m in range(1, 3000, 7):
        ends = decode_segments(m)
        assert len(ends) <= 4 and list(ends) == sorted(set(ends)) and (ends[-1] == m - 1 if m > 1 else not ends)
        assert all(e % 64 == 0 for e in ends[:-1])


@pytest.mark.parametrize(
    "temperature,top_k,top_p,logprob_temperature", [(1.0, 0, 1.0, 1.0), (0.7, 20, 0.9, 1.0), (0.7, 20, 0.9, 0.7)]
)
def test_logprobs_equal_full_forward_recomputation(temperature, top_k, top_p, logprob_temperature):
    # Whatever filters drew the tokens, the log-probs are log_softmax(logits / logprob_temperature):
    # the raw logits (T = 1) or, as verl's old log-probs, the sampling temperature's.
    path, _ = tiny_checkpoint("qwen3", False)
    model = load_pretrained(path)
    out = generate(
        model,
        _prompts(),
        max_new_tokens=8,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_ids=[3],
        rng=jax.random.key(7),
        num_samples=2,
        logprob_temperature=logprob_temperature,
    )
    ref = _recomputed_logprobs(model, out, logprob_temperature)
    valid = np.asarray(completion_mask(out.lengths, 8))
    np.testing.assert_allclose(np.asarray(out.logprobs)[valid], ref[valid], atol=1e-5)
    assert np.all(np.asarray(out.logprobs)[~valid] == 0)


def _peaked_model(vocab=16, scale=20.0):
    """A toy model whose next-token distribution is far from uniform."""
    config = tiny_model_config(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1
    )
    model = Decoder(config, rngs=nnx.Rngs(0))
    model.lm_head[...] = model.lm_head[...] * scale
    return model


def _first_token_probs(model, prompt, temperature=1.0):
    logits = logits_of(model, np.asarray([prompt]), np.ones((1, len(prompt)), np.int32))[0, -1]
    return np.asarray(jax.nn.softmax(logits / temperature)), logits


def _frequencies(tokens, vocab):
    return np.bincount(np.asarray(tokens)[:, 0], minlength=vocab) / len(tokens)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampled_frequencies_match_softmax(temperature):
    model, prompt, n = _peaked_model(), [1, 2, 3], 4096
    probs, _ = _first_token_probs(model, prompt, temperature)
    assert probs.max() > 0.2 and np.sort(probs)[-4] > 0.02  # a non-trivial distribution
    out = generate(model, [prompt], max_new_tokens=1, temperature=temperature, num_samples=n, rng=jax.random.key(1))
    freq = _frequencies(out.tokens, len(probs))
    sigma = np.sqrt(probs * (1 - probs) / n) + 1e-9
    assert np.all(np.abs(freq - probs) < 5 * sigma + 1e-3)
    chi2 = np.sum((freq - probs) ** 2 / np.maximum(probs, 1e-9) * n)
    assert chi2 < 60  # 15 degrees of freedom: p < 1e-6 for a correct sampler


def test_top_k_one_equals_greedy():
    path, _ = tiny_checkpoint("llama3", False)
    model = load_pretrained(path)
    greedy = generate(model, _prompts(), max_new_tokens=6, temperature=0.0)
    top1 = generate(model, _prompts(), max_new_tokens=6, temperature=1.3, top_k=1, rng=jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(top1.tokens), np.asarray(greedy.tokens))


def test_top_p_restricts_to_nucleus_and_renormalises():
    model, prompt, n, top_p = _peaked_model(), [1, 2, 3], 4096, 0.6
    probs, _ = _first_token_probs(model, prompt)
    order = np.argsort(-probs)
    keep = order[: int(np.searchsorted(np.cumsum(probs[order]), top_p)) + 1]
    assert 2 <= len(keep) < len(probs)
    out = generate(model, [prompt], max_new_tokens=1, top_p=top_p, num_samples=n, rng=jax.random.key(2))
    freq = _frequencies(out.tokens, len(probs))
    assert set(np.nonzero(freq)[0]) <= set(keep.tolist())
    nucleus = np.zeros_like(probs)
    nucleus[keep] = probs[keep] / probs[keep].sum()
    assert np.all(np.abs(freq - nucleus) < 5 * np.sqrt(nucleus * (1 - nucleus) / n) + 1e-3)


def test_top_k_restricts_support():
    model, prompt = _peaked_model(), [4, 5]
    probs, _ = _first_token_probs(model, prompt)
    out = generate(model, [prompt], max_new_tokens=1, top_k=3, num_samples=2048, rng=jax.random.key(5))
    assert set(np.unique(np.asarray(out.tokens))) <= set(np.argsort(-probs)[:3].tolist())
    assert len(np.unique(np.asarray(out.tokens))) == 3


def test_categorical_never_draws_masked_entries_and_matches_probs():
    logits = jnp.asarray(np.random.RandomState(0).randn(1, 300) * 2, jnp.float32).at[0, 250:].set(-jnp.inf)
    keys = jax.random.split(jax.random.key(0), 20000)
    draws = np.asarray(jax.jit(jax.vmap(lambda k: categorical(k, logits)[0]))(keys))
    assert draws.max() < 250
    probs = np.asarray(jax.nn.softmax(logits[0]))
    freq = np.bincount(draws, minlength=300) / len(draws)
    assert np.all(np.abs(freq - probs) < 5 * np.sqrt(probs * (1 - probs) / len(draws)) + 1e-4)


def test_samples_are_prompt_major_and_greedy_copies_agree():
    model = _peaked_model(scale=5.0)
    prompts = [[1, 2], [3], [4, 5, 6]]
    out = generate(model, prompts, max_new_tokens=4, temperature=0.0, num_samples=3)
    tokens = np.asarray(out.tokens).reshape(3, 3, 4)
    assert np.all(tokens == tokens[:, :1])
    np.testing.assert_array_equal(np.asarray(out.prompt_tokens)[::3, -1], [2, 3, 6])
    sampled = generate(model, prompts, max_new_tokens=4, num_samples=3, rng=jax.random.key(0))
    assert sampled.tokens.shape == (9, 4) and sampled.lengths.shape == (9,)


def test_loop_stops_when_every_row_finished():
    model = _peaked_model(scale=5.0)
    prompts = [[1, 2], [1, 2]]
    first = int(np.asarray(generate(model, prompts, max_new_tokens=1, temperature=0.0).tokens)[0, 0])
    params = SamplingParams(max_new_tokens=20, temperature=0.0, eos_token_ids=(first,), pad_token_id=0)
    graphdef, state = nnx.split(model)
    ids, mask = left_pad(prompts, 16, 0)
    dstate = prefill_fn(graphdef, state, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0), params, 1, None)
    dstate = decode_fn(graphdef, state, dstate, params, None)
    assert int(dstate.step) == 1
    np.testing.assert_array_equal(np.asarray(dstate.lengths), [1, 1])
    assert np.all(np.asarray(dstate.tokens)[:, 1:] == 0)


def _program_counts():
    return tuple(fn._cache_size() for fn in (prefill_fn, decode_fn, admit_fn, chunk_fn, compact_fn, weights_fn))


@pytest.mark.parametrize("static", [True, False])
def test_one_compilation_per_length_bucket(static):
    # The static path: one prefill and one decode program per bucket. The engine: its programs
    # (weights, admit, chunk, compact) compiled by the first call of a bucket, none by the next.
    model = _peaked_model(vocab=24)
    kwargs = dict(max_new_tokens=5, temperature=0.8, num_samples=2, static=static)
    generate(model, _prompts(9, (3, 9, 4)), rng=jax.random.key(9), **kwargs)
    before = _program_counts()
    for i, lengths in enumerate([(3, 9, 4), (16, 2, 5), (11, 12, 13)]):  # all in the 16 bucket
        generate(model, _prompts(i, lengths), rng=jax.random.key(i), **kwargs)
    assert _program_counts() == before
    generate(model, _prompts(5, (17, 2, 3)), **kwargs)  # bucket 32
    grown = np.asarray(_program_counts()) - np.asarray(before)
    if static:
        assert grown.tolist() == [1, 1, 0, 0, 0, 0]
    else:
        assert grown[:2].tolist() == [0, 0] and grown[2] >= 1 and grown[3] >= 1


def test_bucket_length_left_pad_and_completion_mask():
    assert [bucket_length(n) for n in (1, 5, 16, 17, 33, 64, 65, 130)] == [16, 16, 16, 32, 64, 64, 128, 192]
    ids, mask = left_pad([[5, 6], [7]], 4, pad_id=9)
    np.testing.assert_array_equal(ids, [[9, 9, 5, 6], [9, 9, 9, 7]])
    np.testing.assert_array_equal(mask, [[0, 0, 1, 1], [0, 0, 0, 1]])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        left_pad([[1], []], 4, 0)
    np.testing.assert_array_equal(
        completion_mask(jnp.asarray([2, 0, 3]), 3), [[True, True, False], [False, False, False], [True, True, True]]
    )


@pytest.mark.parametrize("compute_dtype", ["bfloat16", "float32"])
def test_kv_cache_is_in_the_compute_dtype(compute_dtype):
    # The trainer samples from float32 master weights merged at the compute dtype; the merged module
    # still reports float32 (model.dtype), but its keys and values are computed in the compute dtype.
    model = _peaked_model()
    graphdef, params = nnx.split(model, nnx.Param)
    policy = merge_model(graphdef, params, compute_dtype)
    assert policy.dtype == jnp.float32
    sampling = SamplingParams(max_new_tokens=2, temperature=0.0)
    graphdef, state = nnx.split(policy)
    ids, mask = left_pad([[1, 2, 3]], 16, 0)
    dstate = prefill_fn(graphdef, state, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0), sampling, 2, None)
    (prompt_cache,) = dstate.caches
    for cache in prompt_cache.keys + prompt_cache.values:
        assert cache.dtype == jnp.dtype(compute_dtype)


def test_invalid_sampling_settings_are_rejected():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(max_new_tokens=4, top_p=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="logprob_temperature"):
        SamplingParams(max_new_tokens=4, logprob_temperature=0.0)
