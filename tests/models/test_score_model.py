"""gd2po_jax.models.score_model: parity with transformers, the Amo and beaver layouts against a
hand-computed reference, save/load round trips, mesh placement, training gradients, bad input."""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx
from safetensors.numpy import save_file
from transformers import AutoModel, AutoModelForSequenceClassification

from gd2po_jax.models import (
    ScoreModel,
    ScoreNormalizer,
    load_score_model,
    save_score_model,
    score_fn,
)
from gd2po_jax.models.decoder import Decoder
from gd2po_jax.models.pretrained import tensor_maps
from gd2po_jax.models.safetensors_io import INDEX_FILE, SafetensorsCheckpoint
from gd2po_jax.runtime.sharding import make_mesh
from tests.fakes import VOCAB, hf_config, tiny_checkpoint, tiny_model_config

PAD = 0  # pad_token_id of the tiny checkpoints; real tokens are drawn from [1, VOCAB)
LENGTHS = (9, 4, 12, 1)
WIDTH = 12
FAMILY_TYPE = {"qwen2": "qwen2", "llama3": "llama"}


def _batch(side: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(ids [4, 12] int32, mask [4, 12] bool)``: rows of LENGTHS real tokens, padded on ``side``."""
    rs = np.random.RandomState(seed)
    ids = np.full((len(LENGTHS), WIDTH), PAD, np.int32)
    mask = np.zeros((len(LENGTHS), WIDTH), bool)
    for i, n in enumerate(LENGTHS):
        cols = slice(0, n) if side == "right" else slice(WIDTH - n, WIDTH)
        ids[i, cols] = rs.randint(1, VOCAB, n)
        mask[i, cols] = True
    return ids, mask


def _seeded_random(build, seed: int) -> torch.nn.Module:
    """``build()``'s model drawn from torch's RNG seeded with ``seed`` (the same model in every run and
    test order), then every weight (norms too) moved by 0.2 * normal, so a forgotten bias, norm or
    transpose shows."""
    torch.manual_seed(seed)
    model = build()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn_like(param))
    return model.eval()


def _scores(model, ids, mask) -> np.ndarray:
    return np.asarray(jax.device_get(score_fn(model, ids, mask)))


def _random_score_model(config, seed: int, **options) -> ScoreModel:
    """A `ScoreModel` with normal(0, 0.2) parameters drawn by numpy (no jax init program to compile)."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: ScoreModel(config, rngs=nnx.Rngs(0), **options)))
    rng = np.random.default_rng(seed)
    state = jax.tree.map(lambda s: jnp.asarray(0.2 * rng.normal(size=s.shape), s.dtype), state)
    return nnx.merge(graphdef, state)


def _assert_same_model(a: ScoreModel, b: ScoreModel):
    """Equal parameters (bit for bit), architecture, head and score settings."""
    assert dataclasses.replace(a.config, hf_json="") == dataclasses.replace(b.config, hf_json="")
    assert (a.negate, a.normalizer, a.head_bias is None) == (b.negate, b.normalizer, b.head_bias is None)
    leaves_a, leaves_b = jax.tree.leaves(nnx.state(a)), jax.tree.leaves(nnx.state(b))
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _hf_logits(model, ids, mask) -> np.ndarray:
    """transformers' ``logits[:, 0]`` called as users call it (no position ids)."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long))
    return out.logits[:, 0].float().numpy()


def _write_sharded(directory: pathlib.Path, hf: dict, tensors: dict[str, np.ndarray], shards: int = 3):
    """A checkpoint written without our writer: config.json, ``shards`` safetensors files, index."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(hf))
    names = list(tensors)
    weight_map = {}
    for i, part in enumerate(np.array_split(np.arange(len(names)), shards)):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({names[j]: np.ascontiguousarray(tensors[names[j]]) for j in part}, str(directory / file))
        weight_map.update({names[j]: file for j in part})
    total = sum(t.nbytes for t in tensors.values())
    (directory / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))


class Body:
    """A random transformers body (``*Model``, no head) of ``family`` and its config.json dict."""

    def __init__(self, family: str, seed: int):
        self.config = hf_config(family, tie=False)
        self.config.pad_token_id = PAD
        self.model = _seeded_random(lambda: AutoModel.from_config(self.config), seed)

    def tensors(self) -> dict[str, np.ndarray]:
        """The body's weights under ``model.*`` names, float32 numpy."""
        return {f"model.{k}": v.float().numpy() for k, v in self.model.state_dict().items()}

    def end_hidden(self, ids, mask) -> np.ndarray:
        """``[B, D]`` final hidden state at each row's last mask-1 token."""
        with torch.no_grad():
            hidden = self.model(input_ids=torch.tensor(ids, dtype=torch.long),
                                attention_mask=torch.tensor(mask, dtype=torch.long)).last_hidden_state.numpy()
        last = np.array([np.nonzero(m)[0][-1] for m in mask])
        return hidden[np.arange(len(ids)), last].astype(np.float64)


# ----------------------------------------------------------------------------------------------
# Checkpoints shared by the tests of this module (built once).
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("score_models")


def _sequence_classification(directory: pathlib.Path, family: str, num_labels: int = 1, seed: int = 0):
    config = hf_config(family, tie=family == "qwen2")
    config.num_labels = num_labels
    config.pad_token_id = PAD
    model = _seeded_random(lambda: AutoModelForSequenceClassification.from_config(config), seed)
    model.save_pretrained(directory)
    return directory, model


@pytest.fixture(scope="module")
def seq_cls(workdir):
    """family -> (directory, transformers *ForSequenceClassification) for qwen2 (tied) and llama3."""
    return {family: _sequence_classification(workdir / f"seqcls-{family}", family, seed=i)
            for i, family in enumerate(FAMILY_TYPE)}


@pytest.fixture(scope="module")
def amo(workdir):
    """(directory, Qwen2 body, head [1, D]) of an align-anything checkpoint in 3 shards + index."""
    body = Body("qwen2", seed=3)
    head = np.random.default_rng(3).normal(size=(1, body.config.hidden_size)).astype(np.float32)
    hf = {**body.config.to_dict(), "architectures": ["AccustomedQwen2RewardModel"], "dtype": "float32"}
    directory = workdir / "amo"
    _write_sharded(directory, hf, {**body.tensors(), "score_head.weight": head})
    return directory, body, head


# The two safe-rlhf models: a cost model (normalize = scale, negated) and a reward model (affine).
BEAVER = {
    "cost": dict(mean=0.7, var=2.5, count=4096, normalizer_type="ExponentialMovingAverage", momentum=0.9),
    "reward": dict(mean=-0.4, var=0.36, count=1024, normalizer_type="RunningMeanStd"),
}


@pytest.fixture(scope="module")
def beaver(workdir):
    """score_type -> (directory, Llama body, head [1, D], bias [1], stats) of safe-rlhf checkpoints
    with do_normalize=True, a head bias and normalizer buffers, in 3 shards + index."""
    body = Body("llama3", seed=4)
    rng = np.random.default_rng(4)
    out = {}
    for score_type, stats in BEAVER.items():
        head = rng.normal(size=(1, body.config.hidden_size)).astype(np.float32)
        bias = rng.normal(size=(1,)).astype(np.float32)
        hf = {**body.config.to_dict(), "architectures": ["LlamaModelForScore"], "score_dim": 1, "bias": True,
              "score_type": score_type, "do_normalize": True, "dtype": "float32",
              **{k: v for k, v in stats.items() if k not in ("mean", "var", "count")}}
        buffers = {"normalizer.mean": np.array([stats["mean"]], np.float32),
                   "normalizer.var": np.array([stats["var"]], np.float32),
                   "normalizer.count": np.array([stats["count"]], np.int64)}
        directory = workdir / f"beaver-{score_type}"
        _write_sharded(directory, hf, {**body.tensors(), "score_head.weight": head, "score_head.bias": bias,
                                       **buffers})
        out[score_type] = (directory, body, head, bias, stats)
    return out


# ----------------------------------------------------------------------------------------------
# Scores.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(FAMILY_TYPE))
def test_sequence_classification_scores_equal_transformers_logits(seq_cls, family):
    path, hf_model = seq_cls[family]
    model = load_score_model(path, dtype="float32")
    assert model.config.model_type == FAMILY_TYPE[family] and model.decoder.lm_head is None
    assert not model.negate and model.normalizer is None
    for side in ("right", "left"):
        ids, mask = _batch(side)
        ref = _hf_logits(hf_model, ids, mask)
        ours = _scores(model, ids, mask)
        assert ours.shape == (4,) and ours.dtype == np.float32
        assert np.ptp(ref) > 0.1  # rows score differently: the last-token pick matters
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-4, err_msg=f"{side}-padded batch")


def test_amo_layout_scores_as_the_hidden_state_at_the_last_token_times_the_head(amo):
    path, body, head = amo
    assert len(list(path.glob("*.safetensors"))) == 3
    model = load_score_model(path, dtype="float32")
    assert model.head_bias is None and not model.negate and model.normalizer is None
    ids, mask = _batch("right", seed=1)
    ref = body.end_hidden(ids, mask) @ head[0].astype(np.float64)
    np.testing.assert_allclose(_scores(model, ids, mask), ref, rtol=0, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(model.transform(jnp.asarray(ref, jnp.float32))), np.float32(ref))


@pytest.mark.parametrize("score_type", list(BEAVER))
def test_beaver_layout_is_normalized_and_a_cost_model_negated_by_default(beaver, score_type):
    path, body, head, bias, stats = beaver[score_type]
    model = load_score_model(path, dtype="float32")
    assert model.negate == (score_type == "cost")
    assert model.normalizer == ScoreNormalizer(
        function={"cost": "scale", "reward": "affine"}[score_type],
        mean=float(np.float32(stats["mean"])), var=float(np.float32(stats["var"])), count=stats["count"],
        enabled=True,
    )
    ids, mask = _batch("left", seed=2)
    raw = body.end_hidden(ids, mask) @ head[0].astype(np.float64) + bias[0]
    std = np.sqrt(np.float32(stats["var"])) + 1e-8
    expected = -raw / std if score_type == "cost" else (raw - np.float32(stats["mean"])) / std
    np.testing.assert_allclose(_scores(model, ids, mask), expected, rtol=0, atol=1e-4)
    plain = load_score_model(path, dtype="float32", negate=False, normalize=False)
    assert not plain.negate and not plain.normalizer.enabled
    raw32 = jnp.asarray(raw, jnp.float32)
    np.testing.assert_array_equal(np.asarray(plain.transform(raw32)), np.asarray(raw32))
    np.testing.assert_allclose(np.asarray(model.transform(raw32)), expected, rtol=1e-6, atol=1e-6)


def test_bfloat16_default_and_an_empty_row_scores_nan(seq_cls):
    path, hf_model = seq_cls["qwen2"]
    model = load_score_model(path)
    assert model.head_kernel[...].dtype == jnp.bfloat16 and model.decoder.embed[...].dtype == jnp.bfloat16
    ids, mask = _batch("right")
    mask[1] = False
    scores = _scores(model, ids, mask)
    assert scores.dtype == np.float32 and np.isnan(scores[1])
    keep = [0, 2, 3]
    np.testing.assert_allclose(scores[keep], _hf_logits(hf_model, ids, mask)[keep], rtol=0, atol=0.1)


def test_sharded_load_on_a_mesh_gives_the_same_scores_and_saves(seq_cls, tmp_path):
    path, _ = seq_cls["llama3"]
    mesh = make_mesh(data=1, fsdp=2, tensor=2, devices=jax.devices()[:4])
    sharded = load_score_model(path, dtype="float32", mesh=mesh)
    q_kernel = sharded.decoder.layers[0].attn.q_kernel[...]
    assert q_kernel.sharding.mesh == mesh and tuple(q_kernel.sharding.spec) == ("fsdp", "tensor", None)
    assert tuple(sharded.head_kernel[...].sharding.spec)[0] == "fsdp"
    ids, mask = _batch("right", seed=3)
    single = load_score_model(path, dtype="float32")
    np.testing.assert_allclose(_scores(sharded, ids, mask), _scores(single, ids, mask), rtol=0, atol=1e-5)
    save_score_model(sharded, tmp_path / "out")
    _assert_same_model(load_score_model(tmp_path / "out", dtype="float32"), single)


# ----------------------------------------------------------------------------------------------
# Saving.
# ----------------------------------------------------------------------------------------------


def test_sequence_classification_round_trip_loads_in_transformers(seq_cls, tmp_path):
    path, hf_model = seq_cls["llama3"]
    model = load_score_model(path, dtype="float32")
    files = save_score_model(model, tmp_path / "out", max_shard_bytes=40_000)
    assert INDEX_FILE in files and len(files) > 3
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and config["pad_token_id"] == PAD
    assert "lm_head.weight" not in SafetensorsCheckpoint(tmp_path / "out").names()
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    assert type(reloaded) is type(hf_model) and reloaded.config.num_labels == 1
    ids, mask = _batch("right", seed=4)
    np.testing.assert_array_equal(_hf_logits(reloaded, ids, mask), _hf_logits(hf_model, ids, mask))
    _assert_same_model(load_score_model(tmp_path / "out", dtype="float32"), model)


def test_amo_round_trip(amo, tmp_path):
    model = load_score_model(amo[0], dtype="float32")
    files = save_score_model(model, tmp_path / "out", layout="amo", max_shard_bytes=40_000)
    assert INDEX_FILE in files
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["AccustomedQwen2RewardModel"] and "score_type" not in config
    names = SafetensorsCheckpoint(tmp_path / "out").names()
    assert "score_head.weight" in names and not {"score.weight", "lm_head.weight", "score_head.bias"} & names
    _assert_same_model(load_score_model(tmp_path / "out", dtype="float32"), model)


def test_beaver_round_trip_keeps_sign_statistics_and_config_fields(beaver, tmp_path):
    source = beaver["cost"][0]
    model = load_score_model(source, dtype="float32")
    save_score_model(model, tmp_path / "out", layout="beaver", dtype="bfloat16")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {k: config[k] for k in ("score_type", "do_normalize", "bias", "score_dim", "normalizer_type", "momentum")} \
        == {"score_type": "cost", "do_normalize": True, "bias": True, "score_dim": 1,
            "normalizer_type": "ExponentialMovingAverage", "momentum": 0.9}
    assert SafetensorsCheckpoint(tmp_path / "out").get("normalizer.count", (1,))[0] == BEAVER["cost"]["count"]
    reloaded = load_score_model(tmp_path / "out", dtype="bfloat16")
    assert reloaded.negate and reloaded.normalizer == model.normalizer
    _assert_same_model(reloaded, load_score_model(source, dtype="bfloat16"))


def test_a_new_model_saves_as_beaver_with_its_sign_and_other_layouts_refuse_what_they_cannot_store(tmp_path):
    config = tiny_model_config(model_type="llama", qkv_bias=False)
    model = _random_score_model(config, seed=7, head_bias=True, negate=True)
    save_score_model(model, tmp_path / "beaver", layout="beaver")
    reloaded = load_score_model(tmp_path / "beaver", dtype="float32")
    assert reloaded.negate and reloaded.head_bias is not None and not reloaded.normalizer.enabled
    assert reloaded.normalizer.function == "scale"  # score_type="cost"
    _assert_same_model(nnx.merge(nnx.graphdef(model), nnx.state(reloaded)), model)
    for layout in ("amo", "sequence_classification"):
        with pytest.raises(ValueError, match=rf"{layout} layout cannot store a head bias, negate=True.*beaver"):
            save_score_model(model, tmp_path / layout, layout=layout)
    mismatched = _random_score_model(config, seed=0, negate=True, normalizer=ScoreNormalizer("affine"))
    with pytest.raises(ValueError, match=r"negate=True with a 'affine' normalizer.*score_type='reward'"):
        save_score_model(mismatched, tmp_path / "x", layout="beaver")


# ----------------------------------------------------------------------------------------------
# Training and the decoder without a head.
# ----------------------------------------------------------------------------------------------


def test_bradley_terry_step_trains_head_and_body_and_lowers_the_loss(beaver):
    model = load_score_model(beaver["reward"][0], dtype="float32")
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    chosen, mask = _batch("right", seed=8)
    rejected, _ = _batch("right", seed=9)

    def loss_fn(model):
        better, worse = model.raw_scores(chosen, mask), model.raw_scores(rejected, mask)
        return -jnp.mean(jax.nn.log_sigmoid(better - worse)) + 1e-3 * jnp.mean(better**2 + worse**2)

    @nnx.jit
    def step(model, optimizer):
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss, grads

    loss0, grads = step(model, optimizer)
    assert float(jnp.abs(grads.head_kernel[...]).max()) > 0
    assert float(jnp.abs(grads.decoder.layers[0].attn.q_kernel[...]).max()) > 0
    losses = [float(step(model, optimizer)[0]) for _ in range(3)]
    assert losses[-1] < float(loss0)
    assert model.normalizer.mean == pytest.approx(BEAVER["reward"]["mean"])  # statistics are settings, not parameters


def test_decoder_without_lm_head():
    config = tiny_model_config(tie_word_embeddings=False)
    body = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0), lm_head=False))
    assert body.lm_head is None and nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))).lm_head is not None
    assert "lm_head.weight" not in {tm.hf_name for tm in tensor_maps(config, lm_head=False)}
    assert "lm_head.weight" in {tm.hf_name for tm in tensor_maps(config)}
    with pytest.raises(ValueError, match="lm_head=False"):
        body.logits(jnp.zeros((1, 1, config.hidden_size)))


# ----------------------------------------------------------------------------------------------
# Bad input.
# ----------------------------------------------------------------------------------------------


def test_a_directory_without_weights_or_that_does_not_exist_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps(hf_config("qwen2", tie=True).to_dict()))
    with pytest.raises(FileNotFoundError, match=rf"no \*\.safetensors files in {tmp_path / 'empty'}"):
        load_score_model(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match=rf"score model directory: '{tmp_path / 'absent'}' does not exist"):
        load_score_model(tmp_path / "absent")


def test_a_causal_lm_and_an_unknown_head_are_named():
    causal, _ = tiny_checkpoint("qwen2", tie=False)
    with pytest.raises(ValueError, match=rf"{causal} is a causal language model .*lm_head\.weight"):
        load_score_model(causal)
    headless, _ = tiny_checkpoint("qwen2", tie=True)  # tied: no lm_head.weight, no head at all
    with pytest.raises(ValueError, match=rf"{headless}: unknown score-head layout"):
        load_score_model(headless)


def test_num_labels_2_score_dim_2_and_unexpected_tensors_are_rejected(amo, tmp_path):
    two_labels, _ = _sequence_classification(tmp_path / "two", "qwen2", num_labels=2)
    with pytest.raises(ValueError, match=rf"{two_labels}: 'score.weight' has 2 rows, i.e. num_labels=2"):
        load_score_model(two_labels)
    _, body, head = amo
    hf = {**body.config.to_dict(), "score_dim": 2, "score_type": "reward"}
    _write_sharded(tmp_path / "dim2", hf, {**body.tensors(), "score_head.weight": np.concatenate([head, head])}, 1)
    with pytest.raises(ValueError, match=rf"{tmp_path / 'dim2'}: score_dim=2"):
        load_score_model(tmp_path / "dim2")
    lm_head = np.zeros((VOCAB, body.config.hidden_size), np.float32)
    _write_sharded(tmp_path / "extra", {**body.config.to_dict()},
                   {**body.tensors(), "score_head.weight": head, "lm_head.weight": lm_head}, 1)
    with pytest.raises(ValueError, match=r"extra: \['model-00001-of-00001.safetensors'\] hold tensors .*amo.*lm_head"):
        load_score_model(tmp_path / "extra")
    with pytest.raises(ValueError, match=rf"{amo[0]}: normalize=True, but this amo checkpoint has no normalizer"):
        load_score_model(amo[0], normalize=True)


# ----------------------------------------------------------------------------------------------
# A LoRA-trained reward model: a PEFT adapter on its base.
# ----------------------------------------------------------------------------------------------


def test_a_peft_adapter_on_a_score_model_scores_as_peft(seq_cls, tmp_path):
    """A PEFT ``SEQ_CLS`` LoRA adapter (with the trained score head PEFT saves) on the qwen2 score
    model scores as transformers + peft; without its head, with the base's."""
    from peft import LoraConfig, PeftModel, get_peft_model

    path, _ = seq_cls["qwen2"]
    base = AutoModelForSequenceClassification.from_pretrained(path).eval()
    peft_model = get_peft_model(base, LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8,
                                                 target_modules=["q_proj", "v_proj", "down_proj"]))
    torch.manual_seed(7)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                param.add_(0.2 * torch.randn_like(param))
    peft_model.save_pretrained(tmp_path / "adapter")
    peft_model = PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(path),
                                           tmp_path / "adapter").eval()
    model = load_score_model(path, dtype="float32", adapter=tmp_path / "adapter")
    assert model.decoder.lora is None  # merged in
    ids, mask = _batch("left")
    want = _hf_logits(peft_model, ids, mask)
    np.testing.assert_allclose(_scores(model, ids, mask), want, rtol=0, atol=1e-4)
    plain = _scores(load_score_model(path, dtype="float32"), ids, mask)
    assert np.abs(plain - want).max() > 1e-2  # the adapter and its head matter
    # An adapter of LoRA layers alone (no head saved): the base's head.
    from safetensors.numpy import load_file

    tensors = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    (tmp_path / "no_head").mkdir()
    config_text = (tmp_path / "adapter" / "adapter_config.json").read_text()
    (tmp_path / "no_head" / "adapter_config.json").write_text(config_text)
    save_file({k: v for k, v in tensors.items() if ".lora_" in k}, tmp_path / "no_head" / "adapter_model.safetensors")
    headless = load_score_model(path, dtype="float32", adapter=tmp_path / "no_head")
    np.testing.assert_array_equal(np.asarray(headless.head_kernel[...]),
                                  np.asarray(load_score_model(path, dtype="float32").head_kernel[...]))
