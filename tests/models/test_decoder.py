"""gd2po_jax.models.decoder: the attention implementations (plain, `jax.nn.dot_product_attention` on
rows rolled to right padding, cuDNN's selection and fallback) and the remat policies."""

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gd2po_jax.models import decoder
from gd2po_jax.models.decoder import (
    Decoder,
    attention_implementation,
    remat_policy,
    roll_rows,
    select_attention,
)
from gd2po_jax.models.logprobs import completion_logprobs
from tests.fakes import ragged_batch, tiny_model_config
from tests.tolerances import ulps

# Prompts of 9, 6, 12 and 7 tokens left-padded to 12, then 5 completion tokens (all real, as the
# trainer's rows are): every row's completion is predicted from real tokens only.
LENGTHS, WIDTH, COMPLETION = (9, 6, 12, 7), 12, 5


def _batch():
    ids, mask = ragged_batch(lengths=LENGTHS, width=WIDTH)
    return jnp.asarray(ids % 64, jnp.int32), jnp.asarray(mask, bool)


def _loss_and_grads(config, *, attention="plain", remat="none", dtype=jnp.float32):
    """The loss of `completion_logprobs` (log-probs and an entropy term) of a seeded model, and its
    gradients, jitted."""
    ids, mask = _batch()
    graphdef, params = nnx.split(
        Decoder(config, dtype=dtype, rngs=nnx.Rngs(3), remat=remat, attention=attention), nnx.Param
    )

    def loss(params):
        logp, entropy = completion_logprobs(nnx.merge(graphdef, params), ids, mask, COMPLETION, with_entropy=True)
        return -jnp.mean(logp) + 0.1 * jnp.mean(entropy)

    return jax.jit(jax.value_and_grad(loss))(params)


def _assert_same(got, want, count=16):
    (got_loss, got_grads), (want_loss, want_grads) = got, want
    assert float(got_loss) == pytest.approx(float(want_loss), abs=ulps(want_loss, 8))
    for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=ulps(b, count))


def test_select_attention_picks_cudnn_on_a_gpu_in_bfloat16_and_plain_elsewhere():
    assert select_attention("auto", "gpu", jnp.bfloat16, 128) == "cudnn"
    assert select_attention("auto", "cuda", jnp.float16, 64) == "cudnn"
    assert select_attention("auto", "gpu", jnp.float32, 128) == "plain"  # cuDNN's kernel takes 16-bit floats
    assert select_attention("auto", "gpu", jnp.bfloat16, 256) == "plain"  # a head wider than its kernels
    assert select_attention("auto", "gpu", jnp.bfloat16, 12) == "plain"
    assert select_attention("auto", "cpu", jnp.bfloat16, 128) == "plain"
    assert select_attention("auto", "tpu", jnp.bfloat16, 128) == "plain"
    for requested in ("plain", "xla", "cudnn"):
        assert select_attention(requested, "cpu", jnp.float32, 8) == requested
    with pytest.raises(ValueError, match="flash"):
        select_attention("flash", "gpu", jnp.bfloat16, 128)


def test_cudnn_that_does_not_run_falls_back_to_plain_said_once(caplog):
    """Here (a CPU) cuDNN's attention cannot run: "cudnn" asked, or chosen by "auto" on a GPU
    backend, attends with the plain path, and the log says so once."""
    decoder.cudnn_attention_failure.cache_clear()
    decoder._log_fallback.cache_clear()
    with caplog.at_level(logging.WARNING, logger=decoder.__name__):
        assert attention_implementation("cudnn", "cpu", jnp.bfloat16, 8) == "plain"
        assert attention_implementation("cudnn", "cpu", jnp.bfloat16, 8) == "plain"
    assert decoder.cudnn_attention_failure(8, "bfloat16")  # why, in one line
    said = [r for r in caplog.records if "cuDNN" in r.getMessage()]
    assert len(said) == 1 and "plain path" in said[0].getMessage()
    assert attention_implementation("xla", "cpu", jnp.float32, 8) == "xla"  # no probe for the others


def test_roll_rows_puts_left_padding_on_the_right_and_rolls_back():
    x = jnp.arange(2 * 5 * 3).reshape(2, 5, 3)
    shift = jnp.asarray([2, 0])
    rolled = roll_rows(x, shift)
    np.testing.assert_array_equal(rolled[0], jnp.concatenate([x[0, 2:], x[0, :2]]))
    np.testing.assert_array_equal(rolled[1], x[1])
    np.testing.assert_array_equal(roll_rows(rolled, -shift), x)


@pytest.mark.parametrize("remat", ["none", "full"])
def test_xla_attention_on_rolled_rows_has_the_plain_paths_gradients(remat):
    """Left padding rolled to the right under a causal mask alone, the window's last layer included:
    loss and gradients equal the plain path's to float32 rounding."""
    config = tiny_model_config(num_layers=3)
    _assert_same(_loss_and_grads(config, attention="xla", remat=remat), _loss_and_grads(config))


@pytest.mark.parametrize("padding", ["left", "right", "both"])
def test_xla_attention_gives_the_plain_paths_hidden_states_at_real_tokens(padding):
    """Rows padded on the left (the policy's), on the right (score models') or on both sides: the
    rows' leading pads are rolled to the right, so every real token sees the same keys."""
    config = tiny_model_config(model_type="qwen3", qkv_bias=False, qk_norm=True)
    ids, mask = _batch()
    if padding == "right":
        ids, mask = jnp.flip(ids, axis=1), jnp.flip(mask, axis=1)
    elif padding == "both":
        mask = mask.at[:, -2:].set(False)
    model = Decoder(config, rngs=nnx.Rngs(1))
    plain, _ = model.hidden_states(ids, mask)
    model.attention = "xla"
    rolled, _ = model.hidden_states(ids, mask)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(rolled)[real], np.asarray(plain)[real], rtol=1e-5, atol=ulps(plain, 16))
    if padding != "left":
        return
    window, _ = model.hidden_states(ids, mask, window=(WIDTH - 4, 3))
    np.testing.assert_allclose(np.asarray(window), np.asarray(plain)[:, WIDTH - 4 : WIDTH - 1], rtol=1e-5,
                               atol=ulps(plain, 16))


@pytest.mark.parametrize("remat", ["full", "minimal", "dots"])
def test_remat_policies_give_the_gradients_without_remat(remat):
    config = tiny_model_config(num_layers=3)
    _assert_same(_loss_and_grads(config, remat=remat), _loss_and_grads(config))


def test_remat_accepts_the_boolean_of_older_configs_and_rejects_unknown_policies():
    config = tiny_model_config()
    assert Decoder(config, rngs=nnx.Rngs(0), remat=True).remat == "full"
    assert Decoder(config, rngs=nnx.Rngs(0), remat=False).remat == "none"
    with pytest.raises(ValueError, match="remat"):
        Decoder(config, rngs=nnx.Rngs(0), remat="some")
    with pytest.raises(ValueError, match="attention"):
        Decoder(config, rngs=nnx.Rngs(0), attention="flash")
    with pytest.raises(ValueError, match="none"):
        remat_policy("none")


def _score_tensors(text: str, length: int, dtype: str) -> set[str]:
    """The ``[..., S, S]`` tensors of ``dtype`` in a StableHLO text."""
    return set(re.findall(rf"tensor<(?:\d+x)*{length}x{length}x{dtype}>", text))


def test_the_cudnn_update_lowered_for_a_gpu_keeps_no_score_tensor(monkeypatch):
    """The gradient of a bf16 model's completion log-probs, lowered for CUDA here (no GPU needed to
    lower; cuDNN's version, which JAX reads from the device while tracing, is stood in for):
    attention is cuDNN's fused forward and backward, and no ``[S, S]`` tensor is left. The plain
    path's lowering has them (the check can fail)."""
    from jax._src.cudnn import fused_attention_stablehlo

    monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(decoder, "cudnn_attention_failure", lambda head_dim, dtype: None)
    length = 96
    config = tiny_model_config(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16)

    def lowered(attention):
        model = nnx.eval_shape(
            lambda: Decoder(config, dtype=jnp.bfloat16, rngs=nnx.Rngs(0), remat="full", attention=attention)
        )
        graphdef, params = nnx.split(model, nnx.Param)

        def loss(params, ids, mask):
            return -jnp.mean(completion_logprobs(nnx.merge(graphdef, params), ids, mask, 32)[0])

        spec = lambda dtype: jax.ShapeDtypeStruct((2, length), dtype)  # noqa: E731
        traced = jax.jit(jax.grad(loss)).trace(params, spec(jnp.int32), spec(jnp.bool_))
        return traced.lower(lowering_platforms=("cuda",)).as_text()

    cudnn = lowered("cudnn")
    assert "__cudnn$fmhaSoftmax" in cudnn and "__cudnn$fmhaSoftmaxBackward" in cudnn
    assert not _score_tensors(cudnn, length, "f32") and not _score_tensors(cudnn, length, "bf16")
    assert _score_tensors(lowered("plain"), length, "f32")


def test_xlas_implementation_materializes_float32_scores_on_the_cpu():
    """What docs/speed.md says of "xla": `jax.nn`'s XLA implementation is an einsum and a softmax,
    so the CPU's compiled gradient holds float32 ``[S, S]`` scores, as the plain path's does (the
    flash path without them is cuDNN's, on a GPU)."""
    length = 64
    config = tiny_model_config(num_layers=1)
    model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0), attention="xla"))
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(params, ids, mask):
        hidden, _ = nnx.merge(graphdef, params).hidden_states(ids, mask)
        return jnp.sum(hidden**2)

    spec = lambda dtype: jax.ShapeDtypeStruct((2, length), dtype)  # noqa: E731
    hlo = jax.jit(jax.grad(loss)).lower(params, spec(jnp.int32), spec(jnp.bool_)).compile().as_text()
    assert re.search(rf"f32\[(?:\d+,)*{length},{length}\]", hlo)


def test_the_update_attending_with_xla_on_rolled_rows_is_the_plain_update():
    """One GRPO update (micro-batches, prompt windows of length buckets, SGD so the change is the
    gradient) of ragged left-padded rollouts: the same step with either attention."""
    import optax

    from bench.harness import step_config
    from gd2po_jax.rl.train_step import jit_train_step, make_train_step
    from gd2po_jax.training.records import RolloutBatch, TrainState

    config = tiny_model_config(num_layers=2)
    prompts, group, prompt_len, new = 4, 2, 12, 6
    rs = np.random.RandomState(0)
    lengths = rs.randint(3, prompt_len + 1, prompts * group)
    mask = np.arange(prompt_len)[None] >= (prompt_len - lengths)[:, None]
    ids = np.where(mask, rs.randint(2, 64, (prompts * group, prompt_len)), 0)
    batch = RolloutBatch(
        input_ids=jnp.asarray(np.concatenate([ids, rs.randint(2, 64, (prompts * group, new))], 1), jnp.int32),
        attention_mask=jnp.asarray(np.concatenate([mask, np.ones((prompts * group, new), bool)], 1)),
        response_mask=jnp.asarray(np.arange(new)[None] < rs.randint(2, new + 1, (prompts * group, 1))),
        old_logp=jnp.asarray(rs.normal(-4.0, 0.1, (prompts * group, new)), jnp.float32),
        ref_logp=jnp.zeros((prompts * group, new), jnp.float32),
        rewards=jnp.asarray(rs.uniform(size=(prompts, group, 1)), jnp.float32), valid=jnp.ones((prompts,), bool))
    optimizer = optax.sgd(1.0)

    def change(attention):
        graphdef, params = nnx.split(Decoder(config, rngs=nnx.Rngs(3), attention=attention), nnx.Param)
        step = jit_train_step(make_train_step(
            graphdef, optimizer, step_config(algorithm="grpo", micro_batch_size=4, length_bucket=4)))
        state = TrainState(jax.tree.map(jnp.copy, params), optimizer.init(params), jnp.zeros((), jnp.int32),
                           jax.random.PRNGKey(0))
        state, metrics = step(state, batch)
        return jax.tree.map(lambda new, old: new - old, state.params, params), metrics

    (plain, plain_metrics), (xla, xla_metrics) = change("plain"), change("xla")
    for a, b in zip(jax.tree.leaves(xla), jax.tree.leaves(plain), strict=True):
        # sums over the rows' tokens and the micro-batches, reassociated: a bound of the accumulated sum
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=ulps(b, 256))
    assert float(jnp.max(jnp.abs(plain.layers[0].attn.q_kernel[...]))) > 0
    for name in ("loss/pg_loss", "loss/grad_norm"):
        assert float(xla_metrics[name]) == pytest.approx(float(plain_metrics[name]), rel=1e-5), name
