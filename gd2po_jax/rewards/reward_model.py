"""Reward models as reward dimensions: ``config.rewards.kind = "reward_model"``.

Each reward name is scored by one score model (`gd2po_jax.models.score_model`: transformers
``*ForSequenceClassification``, align-anything and safe-rlhf checkpoints), e.g. the GD2PO paper's
helpfulness-safety setting::

    fn = build_reward_function({"kind": "reward_model", "names": ("useful", "harmless"),
                                "reward_models": {"useful": {"path": RM_DIR}, "harmless": {"path": CM_DIR}},
                                "policy_tokenizer": tokenizer, "policy_eos_ids": eos_ids, "mesh": mesh})
    rewards = fn(prompts, responses, columns)        # [N, 2] float32, higher = better
    fn.step_metrics()                                 # reward_truncated/<name>, time/reward_model/<name>

What a reward model reads (as the official GD2PO runs' verl ``RewardModelWorker._switch_chat_template``,
safe-alignment/verl/workers/fsdp_workers.py, builds it):

1. the response: the policy's sampled token ids (``columns[RESPONSE_IDS]``, EOS included), decoded
   by the policy's tokenizer with special tokens kept, then the text of the policy tokenizer's
   ``eos_token`` removed (only that one: another EOS id's text, e.g. Qwen's ``<|endoftext|>``,
   stays, as in the official code). Without ``columns[RESPONSE_IDS]`` (texts that were never
   sampled), ``responses`` as given;
2. appended as the assistant turn to the prompt's chat messages (``columns["prompt"]``);
3. rendered with the reward model's tokenizer's own chat template (``add_generation_prompt=False``),
   or, for a tokenizer without one, as align-anything's ``ModelFormatter.default_format`` writes a
   conversation: one ``ROLE: content`` line per turn (`plain_format`);
4. tokenized by that tokenizer with ``add_special_tokens=False`` (the template writes any BOS
   itself, as ``apply_chat_template(tokenize=True)`` does; align-anything trains its score models
   on text tokenized so), and right-padded. A conversation over ``max_length`` tokens is cut on the
   right (``truncation="right"``, the official worker's: counted per step as
   ``reward_truncated/<name>``) or stops the run (``truncation="error"``);
5. scored at its last token (the score model's last attention-mask token).

Fast path: when the reward model's tokenizer is the policy's (same vocabulary, special tokens and
chat template) and that template renders a conversation as the rendered prompt + the reply + a
fixed closing (probed once, `template_closing`), step 3 is skipped: the text is the policy's
rendered prompt (``prompts[i]``) + the reply + the closing, which is the same string, so the same
tokens (tests/rewards/test_reward_model.py proves it on sampled responses). The policy's sampled
token ids are never scored as they are: the re-tokenized text is what the slow path scores (they
differ where a sample is not the tokenizer's own tokenization of its text, and by the template's
closing), and the reward model sees the whole prompt even where the policy's was cut on the left.

Batching: a model's conversations are grouped by length into buckets (`length_buckets`: powers of
two from 128, then ``max_length``) and scored ``batch_size`` rows at a time, the last batch of a
bucket filled by repeating a row whose score is dropped: one compiled program per bucket, at most
``len(length_buckets(max_length))`` per model structure in a whole run (`score_batch_jit`).

Memory: parameters live on the run's mesh, sharded like the policy's (``mesh``); with ``offload``
they wait in host memory (NumPy) between calls and are copied to the devices for each call.

Errors: a score that is NaN (or infinite) stops the run (`RewardOutputError`, whatever
``rewards.on_error`` says) naming the reward, the model's path and the rollout; with
``truncation="error"`` so does a conversation over ``max_length`` (`RewardModelInputError`, naming
the rollout and its data row), and `check_columns` finds the prompts that alone fill it when the
data is loaded (naming the file and the row). With ``truncation="right"`` such a prompt is scored
cut, as the official runs score it (its response counts for nothing), with a warning. A model
directory without weights, with an unknown head layout, or without a tokenizer stops the run when
the reward is built, naming the path.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import pathlib
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from gd2po_jax.data.tokenization import load_tokenizer
from gd2po_jax.models.score_model import load_score_model
from gd2po_jax.rewards.base import RESPONSE_IDS, RewardOutputError, register_reward_kind
from gd2po_jax.runtime.distributed import host_value
from gd2po_jax.runtime.sharding import batch_sharding

logger = logging.getLogger(__name__)

MIN_BUCKET = 128
"""The shortest padded length of a scored conversation (`length_buckets`)."""

_PROBE_CONVERSATIONS = (
    ({"role": "user", "content": "Hi there"},),
    (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q?"},
        {"role": "assistant", "content": "A."},
        {"role": "user", "content": "And then?"},
    ),
)
_PROBE_REPLIES = ("Sure.", "\n two\nlines \n", "<think>x</think> y", "")
"""What `template_closing` renders: conversations with and without a system turn and history, and
replies with surrounding whitespace and think tags (which some templates rewrite)."""


class RewardModelInputError(RewardOutputError):
    """A rollout that a reward model with ``truncation="error"`` cannot score: its conversation is
    longer than the model's max_length. A `RewardOutputError`, so scoring stops at once naming the
    rollout (never floored)."""


# ----------------------------------------------------------------------------------------------
# Texts and tokens (pure host functions).
# ----------------------------------------------------------------------------------------------


def eos_text(tokenizer, eos_ids: Sequence[int] = ()) -> str:
    """What `response_text` removes: ``tokenizer.eos_token`` (the official code's
    ``response.replace(src_tokenizer.eos_token, "")``); for a tokenizer without one, the text of the
    first of ``eos_ids``; empty when neither exists."""
    if getattr(tokenizer, "eos_token", None):
        return str(tokenizer.eos_token)
    return tokenizer.decode([int(eos_ids[0])], skip_special_tokens=False) if len(eos_ids) else ""


def response_text(tokenizer, token_ids: Sequence[int], eos: str) -> str:
    """A sampled response as a reward model reads it: ``token_ids`` decoded with special tokens kept,
    every occurrence of ``eos`` (`eos_text`) removed."""
    text = tokenizer.decode(list(token_ids), skip_special_tokens=False)
    return text.replace(eos, "") if eos else text


def plain_format(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False) -> str:
    """A conversation as align-anything writes it for a tokenizer without a chat template
    (``ModelFormatter.default_format``, align_anything/configs/format_model.py; the official GD2PO
    copy is safe-alignment/verl/workers/align_anything/configs/format_model.py): one line
    ``ROLE: content`` per turn, the role upper-cased (a list content: one line per text part), and
    ``"ASSISTANT: "`` after them with ``add_generation_prompt``."""
    lines = []
    for message in messages:
        role, content = str(message["role"]).upper(), message["content"]
        if isinstance(content, str):
            lines.append(f"{role}: {content}\n")
        elif isinstance(content, (list, tuple)):
            lines.extend(f"{role}: {part['text']}\n" for part in content if part.get("type") == "text")
        else:
            raise ValueError(
                f"a {message['role']!r} turn has content of type {type(content).__name__}; "
                "a chat message's content is a string or a list of text parts"
            )
    return "".join(lines) + ("ASSISTANT: " if add_generation_prompt else "")


def render_messages(tokenizer, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
    """``messages`` rendered by ``tokenizer``'s chat template, or `plain_format` for a tokenizer
    without one (as align-anything's ``ModelFormatter`` chooses)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt
        )
    return plain_format(messages, add_generation_prompt)


def render_conversation(tokenizer, messages: Sequence[Mapping[str, str]], response: str) -> str:
    """``messages`` + the assistant turn ``response``, rendered by ``tokenizer``'s chat template
    (``add_generation_prompt=False``), or in `plain_format` without one."""
    conversation = [{"role": m["role"], "content": m["content"]} for m in messages]
    conversation.append({"role": "assistant", "content": response})
    return render_messages(tokenizer, conversation, add_generation_prompt=False)


def encode(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of rendered ``texts``, without added special tokens (the template wrote them)."""
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def _tokenizer_identity(tokenizer) -> tuple:
    """What makes two tokenizers tokenize and render alike: class, chat template, special tokens, and
    the vocabulary / merges / normalization (the fast backend's JSON, padding settings left out)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        state.pop("padding", None)
        state.pop("truncation", None)
        body = json.dumps(state, sort_keys=True)
    else:
        body = json.dumps(sorted(tokenizer.get_vocab().items()))
    special = json.dumps(tokenizer.special_tokens_map, sort_keys=True)
    return type(tokenizer).__name__, tokenizer.chat_template, special, body


def same_tokenizer(a, b) -> bool:
    """Whether tokenizers ``a`` and ``b`` render and tokenize every conversation alike."""
    return a is b or _tokenizer_identity(a) == _tokenizer_identity(b)


def template_closing(tokenizer) -> str | None:
    """The text ``tokenizer``'s chat template writes after an assistant reply (e.g. ChatML's
    ``"<|im_end|>\\n"``) when, on every probe conversation and reply, it renders
    ``messages + [assistant: reply]`` as ``render(messages, add_generation_prompt=True) + reply +
    closing`` with one fixed closing; None when it does not (a template that rewrites replies or
    earlier turns), or fails on a probe."""
    closing = None
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        for messages in _PROBE_CONVERSATIONS:
            prompt = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
            for reply in _PROBE_REPLIES:
                full = render_conversation(tokenizer, messages, reply)
                if not full.startswith(prompt + reply):
                    return None
                tail = full[len(prompt) + len(reply) :]
                if closing is not None and tail != closing:
                    return None
                closing = tail
    except Exception:  # noqa: BLE001 - a template that cannot render a probe gets the slow path
        return None
    return closing


def length_buckets(max_length: int, min_length: int = MIN_BUCKET) -> tuple[int, ...]:
    """The padded lengths conversations are scored at: powers of two from ``min_length`` below
    ``max_length``, then ``max_length`` (2048 -> 128, 256, ..., 1024, 2048; 200 -> 128, 200)."""
    buckets, length = [], min_length
    while length < max_length:
        buckets.append(length)
        length *= 2
    return (*buckets, max_length)


@dataclasses.dataclass(frozen=True)
class Batch:
    """One forward pass: ``rows`` (``batch_size`` indices into the scored conversations; the first
    ``num_real`` are distinct, the rest repeat the first to fill the batch) padded to ``length``."""

    length: int
    rows: tuple[int, ...]
    num_real: int


def plan_batches(lengths: Sequence[int], batch_size: int, buckets: Sequence[int]) -> list[Batch]:
    """The forward passes that score conversations of ``lengths`` tokens (each at most
    ``buckets[-1]``): each in the shortest bucket that holds it, ``batch_size`` rows per pass.

    Raises:
      ValueError: a length over the largest bucket (callers cut conversations first).
    """
    by_bucket: dict[int, list[int]] = {}
    for row, length in enumerate(lengths):
        bucket = next((b for b in buckets if length <= b), None)
        if bucket is None:
            raise ValueError(f"conversation {row} has {length} tokens, more than the largest bucket {buckets[-1]}")
        by_bucket.setdefault(bucket, []).append(row)
    batches = []
    for bucket in sorted(by_bucket):
        rows = by_bucket[bucket]
        for start in range(0, len(rows), batch_size):
            real = rows[start : start + batch_size]
            batches.append(Batch(bucket, tuple(real + [real[0]] * (batch_size - len(real))), len(real)))
    return batches


def right_padded(token_lists: Sequence[Sequence[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids [B, length] int32, mask [B, length] bool)``: each list left-aligned, padded on the right."""
    ids = np.full((len(token_lists), length), pad_id, np.int32)
    mask = np.zeros((len(token_lists), length), bool)
    for i, tokens in enumerate(token_lists):
        ids[i, : len(tokens)] = tokens
        mask[i, : len(tokens)] = True
    return ids, mask


# ----------------------------------------------------------------------------------------------
# One reward model.
# ----------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=0)
def score_batch_jit(graphdef, params, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """``[B]`` float32 scores of ``input_ids [B, T]`` by the score model ``nnx.merge(graphdef, params)``:
    one compiled program per model structure (``graphdef``, which holds the config) and batch shape,
    shared by the models with the same structure."""
    return nnx.merge(graphdef, params)(input_ids, attention_mask)


@dataclasses.dataclass(frozen=True)
class Encoded:
    """The conversations one reward model scores: ``token_ids`` (N lists, cut to max_length),
    ``truncated`` [N] bool (longer than max_length: cut), ``lengths`` [N] their tokens before any
    cut, ``fast`` (the fast path rendered them)."""

    token_ids: list[list[int]]
    truncated: np.ndarray
    lengths: np.ndarray
    fast: bool


class RewardModel:
    """One score model ready to score conversations: its tokenizer, its parameters (on the mesh, or in
    host memory with ``offload``) and one jitted scoring program per length bucket.

    Args:
      name: the reward it gives (in errors and metrics).
      path: the score-model directory (weights, config.json, its tokenizer, with the chat template the
        model was trained with, or without one: `plain_format`).
      negate, normalize: `gd2po_jax.models.load_score_model`'s options (None: the checkpoint's).
      max_length: tokens scored per conversation.
      truncation: a longer conversation is cut on the right ("right") or an error ("error"; the
        caller raises, `Encoded.truncated` says which).
      batch_size: rows per forward pass (divisible by the mesh's data x fsdp devices).
      dtype: parameter dtype ("bfloat16" | "float32").
      mesh: the run's mesh (None: the default device).
      offload: keep the parameters in host memory between `scores` calls.
      adapter: a PEFT LoRA adapter directory trained on ``path``, merged in when loaded; "": none.

    Raises:
      ValueError: naming the reward and ``path``: no such directory, no weights, an unknown head
        layout, no tokenizer, a bad batch size or truncation.
    """

    def __init__(
        self,
        name: str,
        path: str,
        *,
        negate: bool | None = None,
        normalize: bool | None = None,
        max_length: int = 2048,
        truncation: str = "right",
        batch_size: int = 32,
        dtype: str = "bfloat16",
        mesh: Mesh | None = None,
        offload: bool = False,
        adapter: str = "",
    ):
        self.name, self.path = name, str(path)
        self.max_length, self.batch_size, self.mesh, self.offload = int(max_length), int(batch_size), mesh, offload
        self.truncation = truncation
        where = f"reward model {name!r} ({self.path})"
        if truncation not in ("right", "error"):
            raise ValueError(
                f"{where}: truncation={truncation!r} is not 'right' or 'error' "
                f"(config.rewards.reward_models.{name}.truncation)"
            )
        if not self.path or not pathlib.Path(self.path).is_dir():
            raise ValueError(f"{where}: no such directory (config.rewards.reward_models.{name}.path)")
        shards = mesh.shape["data"] * mesh.shape["fsdp"] if mesh is not None else 1
        if self.batch_size < 1 or self.batch_size % shards:
            raise ValueError(
                f"{where}: batch_size={batch_size} must be a positive multiple of the {shards} "
                "data-parallel devices (config.rewards.reward_models.<name>.batch_size)"
            )
        try:
            self.tokenizer = load_tokenizer(self.path)
        except (OSError, ValueError) as err:
            raise ValueError(
                f"{where}: cannot load its tokenizer ({type(err).__name__}: {err}); a reward "
                "model directory needs the tokenizer it was trained with"
            ) from None
        if not getattr(self.tokenizer, "chat_template", None):
            logger.info(
                "%s: its tokenizer has no chat template; conversations are rendered as align-anything's "
                "plain 'ROLE: content' lines",
                where,
            )
        try:
            model = load_score_model(
                self.path, dtype, mesh, negate=negate, normalize=normalize, adapter=adapter or None
            )
        except (FileNotFoundError, KeyError, ValueError, RuntimeError) as err:
            raise ValueError(f"{where}: {err}") from None
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.buckets = length_buckets(self.max_length)
        self.closing = template_closing(self.tokenizer)
        self._graphdef, state = nnx.split(model)
        self._shardings = jax.tree.map(lambda x: x.sharding, state)
        self.batch_shapes: set[tuple[int, int]] = set()  # the [B, T] shapes scored: one program each
        self._state = None if offload else state
        self._host_state = host_value(state) if offload else None  # whole, on every process
        if offload:
            jax.tree.map(lambda x: x.delete(), state)

    def on_device(self) -> bool:
        """Whether the parameters are on the devices now (always, without offload)."""
        return self._state is not None

    def prompt_lengths(self, prompts_messages: Sequence[Sequence[Mapping[str, str]]]) -> list[int]:
        """Tokens of each prompt rendered by this model (`render_messages`) with the assistant turn opened."""
        texts = [render_messages(self.tokenizer, messages, add_generation_prompt=True) for messages in prompts_messages]
        return [len(ids) for ids in encode(self.tokenizer, texts)]

    def encode(
        self, prompts: Sequence[str], responses: Sequence[str], messages: Sequence | None, fast: bool
    ) -> Encoded:
        """The conversations of N rollouts as this model scores them (module docstring, steps 2-4).

        Args:
          prompts: the policy's rendered prompts (the fast path's prefix).
          responses: the response texts (`response_text`).
          messages: each rollout's chat messages (the slow path's); None only with ``fast``.
          fast: render by concatenation (`template_closing`; only for the policy's own tokenizer).
        """
        if fast:
            assert self.closing is not None  # fast only with a closing (`template_closing` found one)
            texts = [prompt + response + self.closing for prompt, response in zip(prompts, responses)]
        else:
            assert messages is not None  # None only with fast
            texts = [render_conversation(self.tokenizer, m, r) for m, r in zip(messages, responses)]
        token_ids = encode(self.tokenizer, texts)
        lengths = np.array([len(ids) for ids in token_ids], np.int64)
        return Encoded([ids[: self.max_length] for ids in token_ids], lengths > self.max_length, lengths, fast)

    def scores(self, token_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """``[N]`` float32 scores of conversations of at most ``max_length`` tokens each, in fixed-shape
        batches (`plan_batches`); NaN is returned as it is (the caller names the rollout)."""
        out = np.full(len(token_ids), np.nan, np.float32)
        if not len(token_ids):
            return out
        params = self._state if self._state is not None else jax.device_put(self._host_state, self._shardings)
        try:
            for batch in plan_batches([len(ids) for ids in token_ids], self.batch_size, self.buckets):
                ids, mask = right_padded([token_ids[r] for r in batch.rows], batch.length, self.pad_id)
                if self.mesh is not None:
                    ids = jax.device_put(ids, batch_sharding(self.mesh, ids.shape))
                    mask = jax.device_put(mask, batch_sharding(self.mesh, mask.shape))
                self.batch_shapes.add(ids.shape)
                scores = np.asarray(host_value(score_batch_jit(self._graphdef, params, ids, mask)), np.float32)
                out[list(batch.rows[: batch.num_real])] = scores[: batch.num_real]
        finally:
            if self._state is None:  # offloaded: free the device copy now
                jax.tree.map(lambda x: x.delete(), params)
        return out


# ----------------------------------------------------------------------------------------------
# The reward function.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RewardModelScores:
    """``values`` [N, K] float32 scores (finite) and ``truncated`` [N, K] bool (the conversation was
    cut to the model's max_length), reward k by `RewardModelReward.names` [k]."""

    values: np.ndarray
    truncated: np.ndarray


@register_reward_kind("reward_model")
class RewardModelReward:
    """K score models, one per reward name, as a batch reward function (`gd2po_jax.rewards.base`;
    the module docstring says how a rollout is rendered, batched and scored).

    Args:
      names: the K rewards, in order.
      reward_models: name -> options of `RewardModel` (``path``, ``negate``, ``normalize``,
        ``max_length``, ``truncation``, ``batch_size``, ``dtype``): ``config.rewards.reward_models``.
      policy_tokenizer: the policy's tokenizer (decodes ``columns[RESPONSE_IDS]``; its ``eos_token``
        is removed from decoded responses; the fast path compares against it). None: responses are
        taken as given.
      policy_eos_ids: the policy's EOS ids: the first one's text is removed instead when the policy's
        tokenizer has no ``eos_token`` (`eos_text`).
      mesh: the run's mesh, the score models' parameters are sharded over it.
      offload: keep every model's parameters in host memory between calls (``config.rewards.offload``).

    Raises:
      ValueError: ``names`` and ``reward_models`` do not match, or a model cannot be used (`RewardModel`).
    """

    scores_on_devices = True  # one program over the run's mesh: several processes score every rollout

    def __init__(
        self,
        names: Sequence[str],
        reward_models: Mapping[str, Mapping[str, Any]],
        *,
        policy_tokenizer=None,
        policy_eos_ids: Sequence[int] = (),
        mesh: Mesh | None = None,
        offload: bool = False,
    ):
        self.names = tuple(names)
        missing = [n for n in self.names if n not in reward_models]
        extra = sorted(set(reward_models) - set(self.names))
        if not self.names or missing or extra or len(set(self.names)) != len(self.names):
            raise ValueError(
                f"the reward_model reward needs one reward model per name of {self.names}; got "
                f"models for {sorted(reward_models)} (config.rewards.reward_models)"
            )
        self.models = {
            name: RewardModel(name, **dict(reward_models[name]), mesh=mesh, offload=offload) for name in self.names
        }
        self.policy_tokenizer = policy_tokenizer
        self.eos = eos_text(policy_tokenizer, policy_eos_ids) if policy_tokenizer is not None else ""
        self.fast = {
            name: policy_tokenizer is not None
            and model.closing is not None
            and same_tokenizer(policy_tokenizer, model.tokenizer)
            for name, model in self.models.items()
        }
        self._lock = threading.Lock()  # one scoring at a time (rewards.num_workers chunks queue here)
        self._seconds = dict.fromkeys(self.names, 0.0)
        self._truncated = dict.fromkeys(self.names, 0)
        self._scored = 0
        self._warned_prompt_only: set[str] = set()  # models that scored a cut prompt (warned once)

    # ---------------------------------------------------------------- inputs

    def response_texts(self, responses: Sequence[str], columns: Mapping[str, Sequence[Any]]) -> list[str]:
        """The response texts the models read: from ``columns[RESPONSE_IDS]`` when the rollout has
        them (as `response_text`, decoded in one batch), else ``responses`` as given."""
        ids = columns.get(RESPONSE_IDS)
        if ids is None:
            return list(responses)
        if self.policy_tokenizer is None:
            raise ValueError(
                "the reward_model reward got sampled token ids (columns['response_ids']) but no "
                "policy_tokenizer to decode them"
            )
        texts = self.policy_tokenizer.batch_decode([list(row) for row in ids], skip_special_tokens=False)
        return [text.replace(self.eos, "") for text in texts] if self.eos else texts

    def encode(
        self, prompts: Sequence[str], responses: Sequence[str], columns: Mapping[str, Sequence[Any]]
    ) -> dict[str, Encoded]:
        """What each model scores for N rollouts (the module docstring's steps 1-4), by reward name."""
        texts = self.response_texts(responses, columns)
        return {name: self._encode(name, prompts, texts, columns) for name in self.names}

    def _encode(
        self, name: str, prompts: Sequence[str], texts: Sequence[str], columns: Mapping[str, Sequence[Any]]
    ) -> Encoded:
        model, messages = self.models[name], columns.get("prompt")
        if not self.fast[name] and messages is None:
            raise ValueError(
                f"reward model {name!r} ({model.path}) renders each conversation with its own chat "
                "template and needs the chat messages of each prompt: the dataset column 'prompt'"
            )
        return model.encode(prompts, texts, messages, self.fast[name])

    # ---------------------------------------------------------------- data checks

    def check_columns(self, columns: Mapping[str, Sequence[Any]]) -> list[tuple[int, str, str]]:
        """(row, "prompt", problem) of each dataset row whose prompt alone fills the max_length of a
        model with ``truncation="error"`` (every rollout of it would stop the run), for
        `gd2po_jax.rewards.base.column_problems`. Models that cut on the right score such rows cut."""
        if "prompt" not in columns:
            raise ValueError("the reward_model reward needs the dataset column 'prompt' (the chat messages)")
        problems = []
        for name, model in self.models.items():
            if model.truncation != "error":
                continue
            for row, length in enumerate(model.prompt_lengths(columns["prompt"])):
                if length >= model.max_length:
                    problems.append((row, "prompt", self._too_long(name, length)))
        return problems

    def _too_long(self, name: str, length: int) -> str:
        model = self.models[name]
        return (
            f"the prompt renders to {length} tokens with reward model {name!r} ({model.path}), at least its "
            f"max_length={model.max_length} (config.rewards.reward_models.{name}.max_length, truncation='error'): "
            "no token of a response would be scored"
        )

    def _check_truncated(self, name: str, encoded: Encoded, columns) -> None:
        """What a conversation over the model's max_length does: with ``truncation="error"`` raises
        `RewardModelInputError` for the first one (naming the rollout and its data row); with "right"
        it was cut, and a model that cut a prompt (its response wholly cut off) warns once."""
        rows = np.flatnonzero(encoded.truncated)
        if not len(rows):
            return
        model = self.models[name]
        if model.truncation == "error":
            i = int(rows[0])
            data_row = columns["row"][i] if "row" in columns else None
            where = "" if data_row is None else f" (data row {data_row}, 0-based)"
            raise RewardModelInputError(
                type(self).__name__,
                f"the conversation renders to {encoded.lengths[i]} tokens with reward model "
                f"{name!r} ({model.path}), more than its max_length={model.max_length} "
                f"(config.rewards.reward_models.{name}.max_length; truncation='right' cuts it){where}",
                reward=name,
                rollout=i,
            )
        if name in self._warned_prompt_only or "prompt" not in columns:
            return
        lengths = model.prompt_lengths([columns["prompt"][i] for i in rows])
        cut = sum(length >= model.max_length for length in lengths)
        if cut:
            self._warned_prompt_only.add(name)
            logger.warning(
                "reward model %r (%s): %d conversation(s) whose prompt alone fills max_length=%d were "
                "scored without any response token (truncation='right', as the official runs; "
                "reward_truncated/%s counts them; warned once)",
                name,
                model.path,
                cut,
                model.max_length,
                name,
            )

    # ---------------------------------------------------------------- scoring

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], columns: Mapping[str, Sequence[Any]]
    ) -> RewardModelScores:
        """Scores of N rollouts by every model, with which conversations were cut.

        Raises:
          RewardOutputError: a model scored NaN or infinity for a rollout (naming reward, path, rollout).
          RewardModelInputError: a conversation is longer than the max_length of a model with
            ``truncation="error"``.
        """
        with self._lock:
            values = np.zeros((len(responses), len(self.names)), np.float32)
            truncated = np.zeros((len(responses), len(self.names)), bool)
            start = time.perf_counter()
            texts = self.response_texts(responses, columns)
            decoding = (time.perf_counter() - start) / len(self.names)  # shared by the models
            for k, (name, model) in enumerate(self.models.items()):
                start = time.perf_counter()
                encoded = self._encode(name, prompts, texts, columns)
                self._check_truncated(name, encoded, columns)
                scores = model.scores(encoded.token_ids)
                bad = np.flatnonzero(~np.isfinite(scores))
                if len(bad):
                    raise RewardOutputError(
                        type(self).__name__,
                        f"reward model {model.path} scored {scores[bad[0]]} (a score model "
                        "must give a finite number for every conversation; check its weights and dtype)",
                        reward=name,
                        rollout=int(bad[0]),
                    )
                values[:, k], truncated[:, k] = scores, encoded.truncated
                self._seconds[name] += time.perf_counter() - start + decoding
        return RewardModelScores(values, truncated)

    def __call__(
        self, prompts: Sequence[str], responses: Sequence[str], columns: Mapping[str, Sequence[Any]]
    ) -> np.ndarray:
        """Rewards ``[N, K]`` float32 of N rollouts (`score`), counted in `step_metrics`."""
        scored = self.score(prompts, responses, columns)
        with self._lock:
            self._scored += len(responses)
            for k, name in enumerate(self.names):
                self._truncated[name] += int(scored.truncated[:, k].sum())
        return scored.values

    def step_metrics(self) -> dict[str, float]:
        """Since the last call: ``reward_truncated/<name>``, the share of scored conversations cut to
        the model's max_length, and ``time/reward_model/<name>``, seconds spent decoding, rendering,
        tokenizing and scoring for that model. Forgets them."""
        with self._lock:
            metrics = {}
            for name in self.names:
                metrics[f"reward_truncated/{name}"] = self._truncated[name] / self._scored if self._scored else 0.0
                metrics[f"time/reward_model/{name}"] = self._seconds[name]
            self._seconds = dict.fromkeys(self.names, 0.0)
            self._truncated = dict.fromkeys(self.names, 0)
            self._scored = 0
        return metrics
