"""The suite's fakes, in one place: paths, fake tokenizers, tiny model and run configs, tiny
checkpoints (random transformers models, a random policy with a tokenizer trained on the tool-calling
data), and the tiny data sets in the real formats (`data_files`, written by tests/fixture_data.py).
Everything is built locally; nothing is downloaded, and nothing outside the repository is read.

Heavy imports (torch, transformers, datasets) happen inside the functions that need them, so that
a ``train.py`` subprocess whose config file imports `tiny_config` from here stays light.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pathlib
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gd2po_jax.config import RunConfig
from gd2po_jax.models import ModelConfig
from tests.xla_env import SUBPROCESS_DEVICES, xla_flags

REPO = pathlib.Path(__file__).resolve().parents[1]  # the repository root (train.py, configs/, ...)
REFERENCE = REPO / "tests" / "reference"  # numbers of the official code (tests/reference/README.md)


def load_bench_script(name: str):
    """The bench script bench/<name>.py as the module ``bench.<name>`` (imported once per process, as
    ``python -m bench.<name>`` runs it from the repository root; its ``main`` is not called)."""
    return importlib.import_module(f"bench.{name}")


_SCRATCH = tempfile.TemporaryDirectory(prefix="gd2po_fakes_")  # checkpoints built here; removed at exit


RUNTIME_INSTALL = REPO / "tests" / "runtime_install"  # its sitecustomize.py hides test-only modules


@functools.cache
def hidden_modules() -> str:
    """The top-level modules a venv of requirements.txt alone would lack (tests/runtime_closure.py), as
    tests/runtime_install/sitecustomize.py reads them from ``GD2PO_JAX_HIDDEN_MODULES``."""
    from tests.runtime_closure import modules_only_for_tests

    return ",".join(modules_only_for_tests())


def subprocess_env(**changes: str) -> dict[str, str]:
    """The environment of a ``train.py`` / bench subprocess: this one's, with 2 simulated CPU devices
    and optimized code (tests/xla_env.py says why), offline Hugging Face libraries, unbuffered output,
    torch, pytest, peft ... unimportable as in an install from requirements.txt alone (tests/runtime_install),
    and ``changes``."""
    python_path = os.pathsep.join(filter(None, [str(RUNTIME_INSTALL), os.environ.get("PYTHONPATH")]))
    return {
        **os.environ, "XLA_FLAGS": xla_flags(SUBPROCESS_DEVICES), "JAX_PLATFORMS": "cpu",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": python_path, "GD2PO_JAX_HIDDEN_MODULES": hidden_modules(), **changes,
    }


def bench_env(**changes: str) -> dict[str, str]:
    """`subprocess_env` for a bench script's subprocess: its code compiled unoptimized, without the fusion
    emitters (tests/xla_env.py)."""
    return subprocess_env(XLA_FLAGS=xla_flags(SUBPROCESS_DEVICES, optimized=False), **changes)


# ----------------------------------------------------------------------------------------------
# Fake tokenizers: the few methods each test needs, over a trivial vocabulary.
# ----------------------------------------------------------------------------------------------


def random_normal(shape, seed: int, scale: float = 1.0):
    """A float32 jax array of normal draws [*shape], reproducible from ``seed``."""
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape) * scale, jnp.float32)


class DigitTokenizer:
    """Decodes token ids as space-separated numbers (enough for reward functions on text)."""

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


class EchoTokenizer:
    """Chat template = the contents joined; tokens = characters (enough to test the plumbing)."""

    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **_):
        return "|".join(m["content"] for m in messages) + (">" if add_generation_prompt else "")

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[ord(c) for c in text] for text in texts]}


class TagTokenizer:
    """``<role>content`` turns; one token per character (id = code point % 62 + 2, in [2, 64))."""

    chat_template = "tags"
    pad_token_id = 0
    eos_token_id = 1

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **_):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 62 + 2 for c in text]}


# ----------------------------------------------------------------------------------------------
# Configs.
# ----------------------------------------------------------------------------------------------


def tiny_model_config(**changes) -> ModelConfig:
    """A 2-layer, 32-wide Qwen2 (4 query / 2 kv heads of 8, q/k/v biases, vocabulary 64), with
    ``changes`` to any `ModelConfig` field."""
    fields = dict(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True)
    return ModelConfig(**{**fields, **changes})


def tiny_config(**changes):
    """configs/tiny.py with ``changes`` (dotted names with "__" for ".", e.g. ``rl__snr_tau=0.3``)."""
    from configs import tiny

    return with_changes(tiny.get_config(), changes)


def tiny_safety_config(**changes):
    """configs/safety_embedded.py shrunk to seconds per step, with ``changes`` (as `tiny_config`'s):
    a world of 96 training prompts, 1-layer 32-wide reward models trained for 60 steps on its 192
    pairs, configs/tiny.py's 64-wide policy and a 60-step warm start, then 4 RL steps of 8 prompts
    x 4 rollouts of at most 80 tokens (the longest demonstration has 75), 16 validation examples."""
    from configs import safety_embedded, tiny

    config = safety_embedded.get_config()
    config.data.safety.update(tokenizer_vocab_size=1024, num_train=96, num_validation=16, num_test=32,
                              pairs_per_prompt=2)
    config.data.safety.reward_training.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                                              num_kv_heads=2, head_dim=16, num_steps=60, batch_size=16,
                                              learning_rate=3e-3, max_length=160)
    for name in config.rewards.names:
        config.rewards.reward_models[name].update(max_length=160, batch_size=32)
    config.model.tiny = tiny.get_config().model.tiny
    config.sft.update(num_steps=60, batch_size=16, learning_rate=1e-2, max_length=160)
    config.train.update(prompts_per_step=8, num_steps=4, learning_rate=1e-3)
    config.sampling.max_new_tokens = 80
    config.eval.update(max_examples=16, batch_size=8)
    config.checkpoint.update(every_steps=2, keep=2)
    return with_changes(config, changes)


def as_run_config(config) -> RunConfig:
    """``config`` (a ConfigDict of configs/*.py, or a `RunConfig`) as the typed `RunConfig` that
    library functions take (what train.py builds once from its --config)."""
    return config if isinstance(config, RunConfig) else RunConfig.from_config_dict(config)


def tiny_run_config(**changes) -> RunConfig:
    """`tiny_config` (**changes) as a `RunConfig`."""
    return as_run_config(tiny_config(**changes))


def with_changes(config, changes):
    """``config`` with ``changes`` (dotted names with "__" for ".") set."""
    for name, value in changes.items():
        *parents, field = name.split("__")
        node = config
        for parent in parents:
            node = node[parent]
        node[field] = value
    return config


def write_config_file(directory: pathlib.Path, *, factory: str = "tiny_config", **changes) -> pathlib.Path:
    """A config file for ``train.py --config=`` that builds ``factory`` (**changes): `tiny_config`, or
    `tiny_safety_config`."""
    path = directory / f"{factory}.py"
    path.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        f"from tests.fakes import {factory}\n\n\n"
        "def get_config():\n"
        f"    return {factory}(**{changes!r})\n"
    )
    return path


def tensorboard_scalars(directory: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value), ...] of the scalars in the TensorBoard event files in ``directory``,
    in file order, read as TensorBoard reads them: record by record (TFRecord framing), stopping at
    a record cut short, and a session start at step S (tensorboardX's ``purge_step``) dropping
    what was read for steps >= S."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, list[tuple[int, float]]] = {}
    for file in sorted(pathlib.Path(directory).glob("events.out.tfevents.*")):
        data, offset = file.read_bytes(), 0
        while offset + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            end = offset + 12 + length + 4
            if end > len(data):
                break
            event = Event.FromString(data[offset + 12:offset + 12 + length])
            if event.HasField("session_log") and event.session_log.status == event.session_log.START:
                scalars = {tag: [(s, v) for s, v in points if s < event.step] for tag, points in scalars.items()}
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
            offset = end
    return scalars


# ----------------------------------------------------------------------------------------------
# Tiny random transformers checkpoints, for parity tests.
# ----------------------------------------------------------------------------------------------

VOCAB = 128  # vocabulary of the tiny transformers checkpoints
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def hf_config(family: str, tie: bool):
    """The transformers config of a tiny ``family`` ("qwen2", "qwen3" or "llama3") checkpoint."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    if family == "qwen2":
        return Qwen2Config(**COMMON, tie_word_embeddings=tie, rope_theta=1e6)
    if family == "qwen3":
        return Qwen3Config(**COMMON, tie_word_embeddings=tie, head_dim=16)
    if family == "llama3":
        # llama3 rope scaling with a short original context so all three frequency bands occur.
        return LlamaConfig(
            **COMMON,
            tie_word_embeddings=tie,
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        )
    raise ValueError(f"unknown family {family!r}; known: qwen2, qwen3, llama3")


def build_hf_model(family: str, tie: bool, seed: int = 0):
    """A random ``*ForCausalLM`` in eval mode; every weight (biases and norms too) is perturbed so
    that a forgotten bias, norm or transpose shows in the logits."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(family, tie)).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn_like(param))
    return model


@functools.lru_cache(maxsize=None)
def tiny_checkpoint(family: str, tie: bool = False, seed: int = 0):
    """(directory, torch model) of a saved tiny checkpoint, built once per process."""
    model = build_hf_model(family, tie, seed)
    directory = pathlib.Path(_SCRATCH.name) / f"{family}-{'tied' if tie else 'untied'}-{seed}"
    model.save_pretrained(directory)
    return directory, model


def ragged_batch(seed: int = 0, lengths=(9, 4, 12, 1), width: int = 12):
    """Left-padded ``(ids, mask)`` int64 numpy arrays ``[B, width]`` with the given prompt lengths."""
    rs = np.random.RandomState(seed)
    ids = np.zeros((len(lengths), width), np.int64)
    mask = np.zeros((len(lengths), width), np.int64)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = rs.randint(0, VOCAB, n)
        mask[i, width - n :] = 1
    return ids, mask


def hf_forward_logits(model, ids: np.ndarray, mask: np.ndarray):
    """transformers logits as a torch tensor ``[B, T, V]`` (float32, autograd on) with generate's
    positions (cumsum(mask) - 1)."""
    import torch

    positions = np.clip(mask.cumsum(-1) - 1, 0, None)
    out = model(
        input_ids=torch.tensor(ids),
        attention_mask=torch.tensor(mask),
        position_ids=torch.tensor(positions),
    )
    return out.logits.float()


def hf_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """transformers logits ``[B, T, V]`` (numpy) with generate's positions."""
    import torch

    with torch.no_grad():
        return hf_forward_logits(model, ids, mask).numpy()


@nnx.jit
def jax_logits(model, ids, mask):
    """Jitted ``model(ids, attention_mask=mask)``."""
    return model(ids, attention_mask=mask)


def logits_of(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.asarray(jax.device_get(jax_logits(model, ids, mask)))


# ----------------------------------------------------------------------------------------------
# The tiny data sets in the real formats, and a tiny random policy that reads the tool-calling ones.
# ----------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def data_files() -> pathlib.Path:
    """A directory laid out as the real data directory (``GD2PO_JAX_DATA_DIR``) with the tiny data sets
    of tests/fixture_data.py: rlla_4k/test.parquet, rlla_4k/rlla_sft.json,
    api_bank/level-{1,2,3}-api_processed.json, safe_alignment/{alpaca,hh_rlhf,pku_saferlhf}_test.parquet.
    Written once per process; read-only for tests (copy a file before changing it)."""
    from tests.fixture_data import write_data_dir

    return write_data_dir(pathlib.Path(_SCRATCH.name) / "data")


def tool_calling_corpus() -> list[str]:
    """Every message of the RLLA rows and of the API-Bank files of `data_files`, plus the RLLA ground
    truths."""
    from gd2po_jax.data.loaders import load_api_bank, load_verl_parquet

    rlla = load_verl_parquet(data_files() / "rlla_4k" / "test.parquet").dataset
    api_bank = load_api_bank(data_files() / "api_bank").dataset
    texts = [m["content"] for d in (rlla, api_bank) for p in d["prompt"] for m in p]
    return texts + list(rlla["ground_truth"])


@functools.lru_cache(maxsize=None)
def tiny_policy(vocab_size: int = 8192, seed: int = 0) -> pathlib.Path:
    """Directory of a Hugging Face policy whose tokenizer (ChatML template, EOS <|im_end|>) is
    trained on the tool-calling data of `data_files` (at most ``vocab_size`` tokens: the corpus is
    small), so its RLLA and API-Bank prompts tokenize to a few hundred tokens, and a random 1-layer
    Qwen2. Built once per process."""
    import jax.numpy as jnp

    from gd2po_jax.data.corpus_tokenizer import build_tokenizer
    from gd2po_jax.models import Decoder, save_pretrained

    out_dir = pathlib.Path(_SCRATCH.name) / f"qwen2-tiny-{vocab_size}-{seed}"
    tokenizer = build_tokenizer(tool_calling_corpus(), vocab_size)
    config = tiny_model_config(vocab_size=len(tokenizer), num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                               tie_word_embeddings=True, max_position_embeddings=8192)
    model = Decoder(config, dtype=jnp.float32, rngs=nnx.Rngs(seed))
    save_pretrained(model, out_dir, tokenizer=tokenizer)
    return out_dir


# ----------------------------------------------------------------------------------------------
# The helpfulness-safety setting, tiny: a policy and score models whose tokenizers are trained on
# the Alpaca prompts of `data_files`.
# ----------------------------------------------------------------------------------------------

PLAIN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '### ' + message['role'] | upper + ':\\n' + message['content'] + '\\n\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '### ASSISTANT:\\n' }}{%- endif %}"
)
"""A chat template unlike the ChatML of `gd2po_jax.data.corpus_tokenizer`: plain-text role headers, no
special tokens (the "other" reward models render conversations with it)."""


def alpaca_path() -> pathlib.Path:
    """The prompt-only Alpaca parquet of `data_files` (the format of the real alpaca_test.parquet)."""
    return data_files() / "safe_alignment" / "alpaca_test.parquet"


def alpaca_prompts() -> list:
    """The chat messages of the Alpaca prompts of `data_files`."""
    from gd2po_jax.data.loaders import load_verl_parquet

    return load_verl_parquet(alpaca_path(), require_ground_truth=False).dataset["prompt"]


@functools.lru_cache(maxsize=None)
def safety_tokenizer_dir(template: str = "chatml") -> pathlib.Path:
    """A saved tokenizer trained on the Alpaca prompts: "chatml" (at most 512 tokens, ChatML template:
    the policy's) or "plain" (at most 384 tokens, `PLAIN_CHAT_TEMPLATE`). Built once per process."""
    from gd2po_jax.data.corpus_tokenizer import build_tokenizer

    out_dir = pathlib.Path(_SCRATCH.name) / f"safety-tokenizer-{template}"
    corpus = [m["content"] for prompt in alpaca_prompts() for m in prompt]
    tokenizer = build_tokenizer(corpus, 512 if template == "chatml" else 384)
    if template == "plain":
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


def _numpy_init(module_fn, seed: int, scale: float = 0.2):
    """``module_fn()``'s module with normal(0, scale) parameters drawn by numpy (no init program)."""
    graphdef, state = nnx.split(nnx.eval_shape(module_fn))
    rng = np.random.default_rng(seed)
    return nnx.merge(graphdef, jax.tree.map(lambda s: jnp.asarray(scale * rng.normal(size=s.shape), s.dtype), state))


@functools.lru_cache(maxsize=None)
def tiny_safety_policy(seed: int = 0) -> pathlib.Path:
    """A random 2-layer, 32-wide Qwen2 policy with the "chatml" `safety_tokenizer_dir` (EOS <|im_end|>)."""
    from gd2po_jax.data.tokenization import load_tokenizer
    from gd2po_jax.models import Decoder, save_pretrained

    out_dir = pathlib.Path(_SCRATCH.name) / f"safety-policy-{seed}"
    tokenizer = load_tokenizer(safety_tokenizer_dir("chatml"))
    config = tiny_model_config(vocab_size=len(tokenizer), tie_word_embeddings=True)
    save_pretrained(_numpy_init(lambda: Decoder(config, rngs=nnx.Rngs(0)), seed, 0.05), out_dir,
                    tokenizer=tokenizer)
    return out_dir


@functools.lru_cache(maxsize=None)
def tiny_score_model_dir(layout: str, template: str = "chatml", seed: int = 0,
                         nan_token: int | None = None) -> pathlib.Path:
    """A random 2-layer, 32-wide Qwen2 score model saved in ``layout`` ("sequence_classification", "amo"
    or "beaver") with the ``template`` `safety_tokenizer_dir`; with ``nan_token``, that token's
    embedding is NaN (every conversation holding it scores NaN). Built once per process."""
    from gd2po_jax.data.tokenization import load_tokenizer
    from gd2po_jax.models import ScoreModel, save_score_model

    out_dir = pathlib.Path(_SCRATCH.name) / f"score-{layout}-{template}-{seed}-{nan_token}"
    tokenizer = load_tokenizer(safety_tokenizer_dir(template))
    config = tiny_model_config(vocab_size=len(tokenizer))
    model = _numpy_init(lambda: ScoreModel(config, rngs=nnx.Rngs(0), head_bias=layout == "beaver"), seed)
    if nan_token is not None:
        model.decoder.embed[...] = model.decoder.embed[...].at[nan_token].set(jnp.nan)
    save_score_model(model, out_dir, layout=layout, tokenizer=tokenizer)
    return out_dir
