"""On-device autoregressive sampling with a preallocated KV cache.

    out = generate(model, prompts, max_new_tokens=256, temperature=1.0, top_p=1.0, top_k=0,
                   eos_token_ids=[eos], rng=key, num_samples=G)

Prompts (ragged token-id lists) are left-padded to a length bucket (`bucket_length`), so a training
run compiles one prefill and one decode program per bucket, not one per batch. The prefill runs the
P prompts once into a cache of the prompt's slots and then repeats it G times; decoding runs over
the donated `DecodeState` in a few segments (`decode_segments`), each a `jax.lax.while_loop` that
writes its own chunk of the completion's cache and attends over the prompt's slots and the chunks
written so far, not over slots it has not reached (with 64 + 256 tokens the steps attend over 239
slots on average, not 320); it stops as soon as every row has emitted an EOS token.
Each step is `gd2po_jax.models.decode_step.decode_step` (feature-major weight products). Rows are
prompt-major: row ``p * G + g`` is sample g of prompt p.

``out.logprobs`` are those of the policy at ``logprob_temperature`` (``log_softmax(logits / T)``;
T = 1, the raw logits, by default), whatever temperature / top-p / top-k the tokens were drawn with:
the trainer uses them as old_logp, so T must be the update's (`gd2po_jax.rl.train_step.StepConfig`'s
``logprob_temperature``; verl uses the sampling temperature). The KV cache is in the dtype the
activations are computed in, that of the parameters (bf16 when the policy was merged at bf16).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.sharding import Mesh

from gd2po_jax.models.decode_step import decode_step, decode_weights
from gd2po_jax.models.decoder import Decoder, KVCache, init_cache
from gd2po_jax.models.draws import (  # noqa: F401  (re-exported: the sampler's public names)
    activation_dtype,
    categorical,
    inverse_cdf,
    is_eos,
    nucleus_filter,
    row_uniforms,
    sample_rows,
)
from gd2po_jax.models.engine import GroupOutput, run_engine
from gd2po_jax.runtime.distributed import batch_rows
from gd2po_jax.runtime.sharding import BATCH_AXES, mesh_of, named_sharding


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Static sampling settings (one compiled program per distinct value).

    temperature 0 means greedy; top_k 0 and top_p 1 disable those filters. Tokens after a row's
    EOS are ``pad_token_id``. The returned log-probs are those of ``softmax(logits /
    logprob_temperature)``, without the top-k / top-p filters.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    logprob_temperature: float = 1.0
    merge_adapters: bool = True  # a LoRA model decodes on merged weights (`decode_weights`)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not self.logprob_temperature > 0:
            raise ValueError(f"logprob_temperature must be > 0, got {self.logprob_temperature}")


@struct.dataclass
class GenerateOutput:
    """Result of `generate` (N = number of prompts x num_samples, M = max_new_tokens).

    tokens: [N, M] int32, ``pad_token_id`` after EOS; logprobs: [N, M] float32 log-probs of
    ``tokens`` at ``logprob_temperature`` (0 after EOS); lengths: [N] int32 completion lengths, EOS
    included; finished: [N] bool, an EOS was emitted; prompt_tokens / prompt_mask: [N, Lp]
    left-padded prompts.
    """

    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    finished: jax.Array
    prompt_tokens: jax.Array
    prompt_mask: jax.Array


@struct.dataclass
class DecodeState:
    """Loop state of the decoder (donated between prefill and decode).

    caches: the cache of N rows in segments, in slot order (`KVCache` each): the prompt's, then
    the completion's chunks written so far; tokens, logprobs: [N, M]; last: [N] token fed next;
    lengths: [N]; finished: [N]; step: [] tokens sampled so far; rng: base key (folded with step).
    """

    caches: tuple[KVCache, ...]
    tokens: jax.Array
    logprobs: jax.Array
    last: jax.Array
    lengths: jax.Array
    finished: jax.Array
    step: jax.Array
    rng: jax.Array

    if TYPE_CHECKING:  # flax.struct.dataclass adds replace() (dataclasses.replace), undeclared in its typing

        def replace(self, **changes: Any) -> DecodeState: ...


def bucket_length(length: int, *, min_length: int = 16, multiple: int = 64) -> int:
    """Padded prompt length: a power of two (at least ``min_length``) up to ``multiple``, then the
    next multiple of ``multiple``. E.g. 5 -> 16, 17 -> 32, 64 -> 64, 65 -> 128, 130 -> 192."""
    if length <= multiple:
        return max(min_length, 1 << max(0, length - 1).bit_length())
    return -(-length // multiple) * multiple


def decode_segments(max_new_tokens: int, *, max_segments: int = 4, granule: int = 64) -> tuple[int, ...]:
    """Where the decode loop's segments end, in completion slots written (cumulative).

    Decoding M tokens writes M - 1 completion slots (token 0 comes from the prefill). The segments
    end at about M/8, M/4, M/2 (rounded up to ``granule``) and M - 1, dropping ends under
    ``granule`` or repeated: each segment is one more loop in the decode program (compiled once,
    1-3 s more on a small model), and each of its steps attends over the prompt's slots and the
    completion's slots up to its end. E.g. M = 64 -> (63,); 96 -> (64, 95); 256 -> (64, 128, 255);
    1024 -> (128, 256, 512, 1023).
    """
    slots = max_new_tokens - 1
    ends: list[int] = []
    for shift in range(max_segments - 1, 0, -1):
        end = -(-(slots >> shift) // granule) * granule
        if granule <= end < slots and (not ends or end > ends[-1]):
            ends.append(end)
    return (*ends, slots) if slots > 0 else ()


def left_pad(prompts: Sequence[Sequence[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, mask)``, both ``[P, length]`` int32, prompts right-aligned (left padding)."""
    ids = np.full((len(prompts), length), pad_id, np.int32)
    mask = np.zeros((len(prompts), length), np.int32)
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        if len(prompt) > length:
            raise ValueError(f"prompt {i} has {len(prompt)} tokens, more than the padded length {length}")
        ids[i, length - len(prompt) :] = prompt
        mask[i, length - len(prompt) :] = 1
    return ids, mask


def completion_mask(lengths: jax.Array, max_new_tokens: int) -> jax.Array:
    """``[N, M]`` bool loss mask: the first ``lengths`` tokens, EOS included.

    Derive masks from lengths, never from ``tokens != pad``: many tokenizers use EOS as pad.
    """
    return jnp.arange(max_new_tokens)[None, :] < lengths[:, None]


def _constrain(x: jax.Array, mesh: Mesh | None, spec) -> jax.Array:
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, named_sharding(mesh, spec, x.shape))


def _constrain_state(state: DecodeState, mesh: Mesh | None) -> DecodeState:
    """Rows over the batch axes, cache heads over "tensor" (where the sizes divide)."""
    kv_spec = (BATCH_AXES, "tensor", None, None)
    caches = tuple(
        cache.replace(
            keys=tuple(_constrain(k, mesh, kv_spec) for k in cache.keys),
            values=tuple(_constrain(v, mesh, kv_spec) for v in cache.values),
            valid=_constrain(cache.valid, mesh, (BATCH_AXES,)),
        )
        for cache in state.caches
    )
    row_fields = ("tokens", "logprobs", "last", "lengths", "finished")
    rows = {f: _constrain(getattr(state, f), mesh, (BATCH_AXES,)) for f in row_fields}
    return state.replace(caches=caches, **rows)


def _advance(state: DecodeState, logits: jax.Array, caches: tuple[KVCache, ...], params: SamplingParams) -> DecodeState:
    """Samples token ``state.step`` from ``logits [N, V]`` and records it (pad after EOS)."""
    rows = jnp.arange(state.last.shape[0], dtype=jnp.int32)
    tokens, logp = sample_rows(logits, row_uniforms(state.rng, rows, jnp.broadcast_to(state.step, rows.shape)), params)
    tokens = jnp.where(state.finished, params.pad_token_id, tokens)
    logp = jnp.where(state.finished, 0.0, logp)
    return state.replace(
        caches=caches,
        tokens=jax.lax.dynamic_update_slice(state.tokens, tokens[:, None], (0, state.step)),
        logprobs=jax.lax.dynamic_update_slice(state.logprobs, logp[:, None], (0, state.step)),
        last=tokens,
        lengths=state.lengths + (~state.finished).astype(jnp.int32),
        finished=state.finished | is_eos(tokens, params.eos_token_ids),
        step=state.step + 1,
    )


def _prefill(graphdef, params_state, input_ids, mask, rng, params: SamplingParams, num_samples: int, mesh):
    """Runs the P prompts ``[P, Lp]`` into a cache of Lp slots, repeats it G times, samples token 0
    of N = P*G rows."""
    model: Decoder = nnx.merge(graphdef, params_state)
    p, lp = input_ids.shape
    n, m = p * num_samples, params.max_new_tokens
    input_ids = _constrain(input_ids, mesh, (BATCH_AXES,))
    cache = init_cache(model.config, p, lp, activation_dtype(model))
    hidden, cache = model.hidden_states(input_ids, mask, cache=cache)
    logits = model.logits(hidden[:, -1:])[:, 0]
    repeat = lambda x: jnp.repeat(x, num_samples, axis=0)  # noqa: E731
    cache = cache.replace(
        keys=tuple(map(repeat, cache.keys)), values=tuple(map(repeat, cache.values)), valid=repeat(cache.valid)
    )
    state = DecodeState(
        caches=(cache,),
        tokens=jnp.full((n, m), params.pad_token_id, jnp.int32),
        logprobs=jnp.zeros((n, m), jnp.float32),
        last=jnp.zeros((n,), jnp.int32),
        lengths=jnp.zeros((n,), jnp.int32),
        finished=jnp.zeros((n,), bool),
        step=jnp.zeros((), jnp.int32),
        rng=rng,
    )
    state = _constrain_state(state, mesh)
    return _advance(state, repeat(logits), state.caches, params)


def _decode(graphdef, params_state, state: DecodeState, params: SamplingParams, mesh) -> DecodeState:
    """Single-token steps until M tokens or every row finished: one `jax.lax.while_loop` per
    `decode_segments` segment, each appending an empty chunk of the completion's cache that its
    steps fill (a finished loop skips the later ones: their conditions are false at once)."""
    model: Decoder = nnx.merge(graphdef, params_state)
    weights = decode_weights(model, params.merge_adapters)  # [out, in] copies, made once before the loop
    rows = state.last.shape[0]
    start = 0
    for end in decode_segments(params.max_new_tokens):
        chunk = init_cache(model.config, rows, end - start, activation_dtype(model))
        state = _constrain_state(state.replace(caches=(*state.caches, chunk)), mesh)

        def cond(s: DecodeState, end=end):
            # The step that samples token t writes the key and value of token t - 1: slot t - 1.
            return (s.step <= end) & ~jnp.all(s.finished)

        def body(s: DecodeState):
            logits, caches = decode_step(model.config, weights, s.last, s.caches)
            return _constrain_state(_advance(s, logits.T, caches, params), mesh)

        state = jax.lax.while_loop(cond, body, state)
        start = end
    return state


prefill_fn = jax.jit(_prefill, static_argnums=(0, 5, 6, 7))
decode_fn = jax.jit(_decode, static_argnums=(0, 3, 4), donate_argnums=(2,))


def generate(
    model: Decoder,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_ids: Sequence[int] = (),
    rng: jax.Array | None = None,
    num_samples: int = 1,
    pad_token_id: int | None = None,
    prompt_length: int | None = None,
    logprob_temperature: float = 1.0,
    merge_adapters: bool = True,
    slots: int = 0,
    chunk: int = 16,
    static: bool = False,
    scan_layers: bool | None = None,
    on_group: Callable[[int, GroupOutput], None] | None = None,
    more_prompts: Callable[[bool], Sequence[Sequence[int]]] | None = None,
    max_prompts: int = 0,
) -> GenerateOutput:
    """Samples ``num_samples`` completions for each prompt; see the module docstring.

    Args:
      model: a `Decoder` (its parameters may be sharded; the batch then follows the mesh).
      prompts: P token-id lists of any lengths (>= 1).
      max_new_tokens: M, completion length budget (static: one program per value).
      temperature, top_p, top_k: sampling filters; temperature 0 = greedy.
      eos_token_ids: tokens that end a completion (kept in it, counted in ``lengths``).
      rng: PRNG key (default ``jax.random.key(0)``).
      num_samples: G completions per prompt.
      pad_token_id: filler after EOS and for prompt padding (default the first EOS id, else 0).
      prompt_length: padded prompt length; default `bucket_length` of the longest prompt.
      logprob_temperature: T of the returned log-probs, ``log_softmax(logits / T)``: 1 (default) or,
        as verl, the sampling temperature; it must be the update's.
      merge_adapters: a LoRA model decodes on its weights with the adapters merged in, once per call
        (default; `gd2po_jax.models.decode_step.decode_weights`); False applies them per token.
      slots, chunk: the rollout engine's slots (rows decoded at once; 0: one per row) and decode
        steps per host sync (`gd2po_jax.models.engine.run_engine`).
      scan_layers: the engine's step scans the layers (True), unrolls them (False), or picks by
        backend (None: a scan on GPU and TPU; `gd2po_jax.models.engine.layer_scan`).
      static: decode every row in lock-step until the longest stops (the one-shot path, kept for
        comparison); a model sharded over several devices or processes always decodes so.
      on_group: ``on_group(prompt, group)`` with a prompt's index and its G rows (`GroupOutput`)
        as soon as they are all done: with the engine, device arrays, while it decodes the rest
        (the caller's work on a group overlaps the decode); on the lock-step path, host arrays,
        every prompt in order after the decode. One process only (rows live on several otherwise).
      more_prompts: prompts added while the engine runs (dynamic sampling's refill):
        ``more_prompts(wait)`` gives the token-id lists to append after those given so far (prompt
        indices go on from P), asked as `gd2po_jax.models.engine.run_engine` asks ``allowed``; the
        output has rows for ``max_prompts`` prompts, those of prompts never added empty (length 0,
        pad). The engine's slots default to the first P prompts' rows. Not with ``static``.
    """
    if pad_token_id is None:
        pad_token_id = int(eos_token_ids[0]) if len(eos_token_ids) else 0
    params = SamplingParams(
        max_new_tokens=int(max_new_tokens),
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=int(top_k),
        eos_token_ids=tuple(int(t) for t in eos_token_ids),
        pad_token_id=int(pad_token_id),
        logprob_temperature=float(logprob_temperature),
        merge_adapters=bool(merge_adapters),
    )
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if not len(prompts):
        raise ValueError("prompts is empty")
    length = prompt_length or bucket_length(max(len(p) for p in prompts))
    rng = jax.random.key(0) if rng is None else rng
    mesh = mesh_of(model)
    # Each process pads only the prompts its devices hold (all of them in one process).
    ids, mask = batch_rows(
        lambda rows: left_pad([prompts[i] for i in rows], length, params.pad_token_id), len(prompts), mesh
    )
    repeat = lambda x: jnp.repeat(x, num_samples, axis=0)  # noqa: E731
    allowed = None
    if more_prompts is not None:
        if static or not engine_applies(mesh):
            raise ValueError("generate's more_prompts needs the rollout engine: one process, one device, static=False")
        if max_prompts < len(prompts):
            raise ValueError(f"max_prompts={max_prompts} is less than the {len(prompts)} prompts given")
        ids, mask, allowed = _growing_prompts(ids, mask, max_prompts, length, params.pad_token_id, more_prompts)
        slots = slots or len(prompts) * num_samples
    if not (static or not engine_applies(mesh)):
        run = run_engine(
            model,
            ids,
            mask,
            params,
            num_samples=num_samples,
            rng=rng,
            slots=slots,
            chunk=chunk,
            scan_layers=scan_layers,
            on_group=on_group,
            allowed=allowed,
        )
        return GenerateOutput(
            tokens=run.tokens,
            logprobs=run.logprobs,
            lengths=run.lengths,
            finished=run.finished,
            prompt_tokens=repeat(jnp.asarray(ids)),
            prompt_mask=repeat(jnp.asarray(mask)),
        )
    graphdef, state = nnx.split(model)  # (the engine splits the model itself)
    dstate = prefill_fn(graphdef, state, ids, mask, rng, params, num_samples, mesh)
    dstate = decode_fn(graphdef, state, dstate, params, mesh)
    if on_group is not None:
        if jax.process_count() > 1:
            raise ValueError("generate's on_group takes one process's rows: it cannot run with several processes")
        # Every row is done: one copy to the host, then each group is a slice of it.
        outputs = jax.device_get(GroupOutput(dstate.tokens, dstate.logprobs, dstate.lengths, dstate.finished))
        for prompt in range(len(prompts)):
            rows = slice(prompt * num_samples, (prompt + 1) * num_samples)
            on_group(prompt, jax.tree.map(lambda x, rows=rows: x[rows], outputs))
    return GenerateOutput(
        tokens=dstate.tokens,
        logprobs=dstate.logprobs,
        lengths=dstate.lengths,
        finished=dstate.finished,
        prompt_tokens=repeat(ids),
        prompt_mask=repeat(mask),
    )


def _growing_prompts(ids, mask, capacity: int, length: int, pad_token_id: int, more_prompts):
    """Host buffers ``[capacity, length]`` holding ``ids, mask`` [P, length] first, and the engine's
    ``allowed(wait)`` that pads what ``more_prompts(wait)`` adds into the next rows and returns how
    many prompts the buffers hold."""
    p = ids.shape[0]
    all_ids = np.full((capacity, length), pad_token_id, np.int32)
    all_mask = np.zeros((capacity, length), np.int32)
    all_ids[:p], all_mask[:p] = np.asarray(ids), np.asarray(mask)
    count = [p]

    def allowed(wait: bool) -> int:
        new = list(more_prompts(wait))
        if new:
            start = count[0]
            if start + len(new) > capacity:
                raise ValueError(
                    f"more_prompts added {start + len(new)} prompts in all, more than max_prompts={capacity}"
                )
            all_ids[start : start + len(new)], all_mask[start : start + len(new)] = left_pad(new, length, pad_token_id)
            count[0] += len(new)
        return count[0]

    return all_ids, all_mask, allowed


def engine_applies(mesh: Mesh | None) -> bool:
    """Whether `generate` runs the rollout engine for a model on ``mesh``: one process and one
    device (the engine's host loop drives one device's slots; a sharded model decodes in lock-step)."""
    return jax.process_count() == 1 and (mesh is None or mesh.devices.size == 1)
