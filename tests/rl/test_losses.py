"""Tests of gd2po_jax.rl.losses: the clipped surrogate, aggregation modes, KL, exact micro-batch
accumulation, verl's micro-batch weighting, truncated importance weights, and gradients against
finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gd2po_jax.rl.losses import (
    LOSS_AGG_MODES,
    accumulate,
    aggregate_loss,
    approx_kl_old_new,
    clipped_surrogate,
    kl_penalty,
    policy_loss,
    verl_row_weights,
)
from gd2po_jax.rl.micro_batches import verl_update_layout
from tests.fakes import random_normal
from tests.tolerances import ulps


def test_clipped_surrogate_hand_computed():
    # Columns: ratio inside the clip range; above it with A > 0 (clipped); below it with A < 0
    # (clipped); far above it with A < 0 (dual clip bounds the loss at -A * c); below with A > 0.
    log_ratio = jnp.log(jnp.asarray([[1.1, 1.5, 0.5, 10.0, 0.5]]))
    old = jnp.zeros((1, 5))
    adv = jnp.asarray([[2.0, 1.0, -1.0, -1.0, 1.0]])
    loss, stats = clipped_surrogate(log_ratio, old, adv, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    expected = [
        -2.0 * 1.1,  # max(-2.2, -2.2)
        -1.0 * 1.28,  # max(-1.5, -1.28)
        1.0 * 0.8,  # max(0.5, 0.8)
        3.0,  # max(10, 1.28) = 10, then min(10, 3)
        -0.5,  # max(-0.5, -0.8)
    ]
    np.testing.assert_allclose(loss[0], expected, rtol=1e-6)
    np.testing.assert_array_equal(stats["clipped"][0], [False, True, True, False, False])
    np.testing.assert_array_equal(stats["dual_clipped"][0], [False, False, False, True, False])
    no_dual, _ = clipped_surrogate(log_ratio, old, adv, clip_low=0.2, clip_high=0.28, dual_clip=None)
    assert float(no_dual[0, 3]) == pytest.approx(10.0, rel=1e-6)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        clipped_surrogate(log_ratio, old, adv, dual_clip=0.5)


def test_per_sequence_advantages_broadcast_over_tokens():
    logp, old = random_normal((3, 4), 5, 0.1), random_normal((3, 4), 6, 0.1)
    adv = jnp.asarray([1.0, -0.5, 0.0])
    per_seq, _ = clipped_surrogate(logp, old, adv)
    per_token, _ = clipped_surrogate(logp, old, jnp.broadcast_to(adv[:, None], (3, 4)))
    np.testing.assert_array_equal(per_seq, per_token)
    np.testing.assert_array_equal(per_seq[2], 0.0)


def test_log_ratio_is_clamped():
    loss, stats = clipped_surrogate(jnp.asarray([[100.0]]), jnp.zeros((1, 1)), jnp.asarray([[1.0]]))
    assert float(stats["ratio"][0, 0]) == pytest.approx(np.exp(20.0), rel=1e-5)
    assert np.isfinite(float(loss[0, 0]))


def test_aggregation_modes_hand_computed():
    per_token = jnp.asarray([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    mask = jnp.asarray([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    expected = {
        "token-mean": (1 + 2 + 3 + 10 + 20, 5),
        "seq-mean-token-mean": (2.0 + 15.0, 2),
        "seq-mean-token-sum": (6 + 30, 2),
        "seq-mean-token-sum-norm": (36, 2 * 4),
    }
    for mode in LOSS_AGG_MODES:
        numerator, denominator = aggregate_loss(per_token, mask, mode)
        assert (float(numerator), float(denominator)) == pytest.approx(expected[mode]), mode
    numerator, denominator = aggregate_loss(per_token, mask, "seq-mean-token-sum-norm", norm_length=10)
    assert float(denominator) == 20.0
    with pytest.raises(ValueError, match="loss aggregation mode"):
        aggregate_loss(per_token, mask, "mean")


def test_kl_estimators():
    logp = jnp.asarray([[-1.0, -2.0, -0.5]])
    ref = jnp.asarray([[-1.5, -2.0, 0.0]])
    np.testing.assert_allclose(kl_penalty(logp, ref, "k1"), logp - ref)
    delta = np.asarray(ref - logp)
    np.testing.assert_allclose(kl_penalty(logp, ref, "k3"), np.exp(delta) - delta - 1, rtol=1e-6)
    assert float(kl_penalty(logp, ref, "k3")[0, 1]) == 0.0
    assert np.all(np.asarray(kl_penalty(logp, ref, "k3")) >= 0)
    with pytest.raises(ValueError, match="KL estimator"):
        kl_penalty(logp, ref, "k2")


def test_approx_kl_estimates_kl_from_the_old_policy_to_the_new():
    # Tokens come from the old policy: the expectation of the per-token estimate under it is
    # exactly KL(old || new), not KL(new || old) (two different numbers for these distributions).
    old = np.asarray([0.7, 0.2, 0.1])
    new = np.asarray([0.3, 0.3, 0.4])
    kl_old_new = np.sum(old * np.log(old / new))
    kl_new_old = np.sum(new * np.log(new / old))
    estimate = np.asarray(approx_kl_old_new(jnp.asarray(np.log(new) - np.log(old), jnp.float32)))
    assert np.all(estimate >= 0)
    assert np.sum(old * estimate) == pytest.approx(kl_old_new, rel=1e-5)
    assert abs(kl_old_new - kl_new_old) > 0.04


def _batch(seed, batch=6, length=5):
    rng = np.random.default_rng(seed)
    logp = jnp.asarray(rng.normal(size=(batch, length)) * 0.3 - 1.0, jnp.float32)
    old = logp + jnp.asarray(rng.normal(size=(batch, length)) * 0.2, jnp.float32)
    ref = logp + jnp.asarray(rng.normal(size=(batch, length)) * 0.1, jnp.float32)
    adv = jnp.asarray(rng.normal(size=(batch,)), jnp.float32)
    lengths = rng.integers(0, length + 1, size=batch)
    mask = jnp.asarray(np.arange(length)[None, :] < lengths[:, None])
    entropy = jnp.asarray(rng.uniform(0, 2, size=(batch, length)), jnp.float32)
    return logp, old, ref, adv, mask, entropy


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_microbatch_accumulation_equals_full_batch(mode):
    logp, old, ref, adv, mask, entropy = _batch(7)
    kwargs = dict(agg_mode=mode, kl_coef=0.05, entropy_coef=0.01, clip_high=0.28)

    def full_loss(logp):
        return policy_loss(logp, old, adv, mask, ref_logp=ref, entropy=entropy, **kwargs).loss()

    def micro_loss(logp):
        parts = [
            policy_loss(logp[s], old[s], adv[s], mask[s], ref_logp=ref[s], entropy=entropy[s], **kwargs)
            for s in (slice(0, 2), slice(2, 3), slice(3, 6))
        ]
        total = parts[0]
        for part in parts[1:]:
            total = accumulate(total, part)
        return total.loss(), total

    (micro, total), micro_grad = jax.value_and_grad(micro_loss, has_aux=True)(logp)
    full, full_grad = jax.value_and_grad(full_loss)(logp)
    np.testing.assert_allclose(micro, full, rtol=1e-6)
    np.testing.assert_allclose(micro_grad, full_grad, rtol=1e-6, atol=ulps(full_grad, 4))
    whole = policy_loss(logp, old, adv, mask, ref_logp=ref, entropy=entropy, **kwargs)
    for name, value in whole.metrics().items():
        np.testing.assert_allclose(total.metrics()[name], value, rtol=1e-5, atol=1e-7, err_msg=name)


def test_policy_loss_terms_and_metrics():
    logp, old, ref, adv, mask, entropy = _batch(8)
    plain = policy_loss(logp, old, adv, mask)
    with_kl = policy_loss(logp, old, adv, mask, ref_logp=ref, kl_coef=0.1)
    with_ent = policy_loss(logp, old, adv, mask, entropy=entropy, entropy_coef=0.01)
    kl_num, den = aggregate_loss(kl_penalty(logp, ref, "k3"), mask, "token-mean")
    ent_num, _ = aggregate_loss(entropy, mask, "token-mean")
    np.testing.assert_allclose(with_kl.loss(), plain.loss() + 0.1 * kl_num / den, rtol=1e-6)
    np.testing.assert_allclose(with_ent.loss(), plain.loss() - 0.01 * ent_num / den, rtol=1e-6)
    metrics = plain.metrics()
    _, stats = clipped_surrogate(logp, old, adv)
    maskn = np.asarray(mask)
    np.testing.assert_allclose(metrics["clip_fraction"], np.asarray(stats["clipped"])[maskn].mean(), rtol=1e-6)
    ratio = np.exp(np.asarray(logp - old))[maskn]
    np.testing.assert_allclose(metrics["ratio_min"], ratio.min(), rtol=1e-5)
    np.testing.assert_allclose(metrics["ratio_max"], ratio.max(), rtol=1e-5)
    np.testing.assert_allclose(metrics["ratio_mean"], ratio.mean(), rtol=1e-5)
    log_ratio = np.asarray(logp - old)[maskn]
    np.testing.assert_allclose(metrics["approx_kl"], np.mean(np.exp(log_ratio) - 1 - log_ratio), rtol=1e-4)
    assert float(metrics["tokens"]) == maskn.sum()
    with pytest.raises(ValueError, match="no ref_logp"):
        policy_loss(logp, old, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="no per-token entropy"):
        policy_loss(logp, old, adv, mask, entropy_coef=0.1)


def test_empty_batch_gives_zero_loss_and_finite_metrics():
    logp, old, _, adv, _, _ = _batch(9)
    out = policy_loss(logp, old, adv, jnp.zeros(logp.shape, bool))
    assert float(out.loss()) == 0.0
    assert all(np.isfinite(float(v)) for v in out.metrics().values())


def test_gradient_matches_finite_differences():
    """jax.grad of the clipped objective against central differences, in float64, at points away
    from the clip kinks (where the objective is not differentiable)."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(10)
        old = jnp.asarray(rng.normal(size=(4, 6)) * 0.5 - 1.0)
        # Log-ratios spread over the unclipped, clipped and dual-clipped regions, none near a kink.
        offsets = rng.choice([-1.5, -0.6, -0.05, 0.03, 0.1, 0.7, 1.6], size=(4, 6))
        logp = old + jnp.asarray(offsets)
        adv = jnp.asarray([1.3, -0.7, 0.4, -2.0], jnp.float64)
        mask = jnp.asarray(rng.random(size=(4, 6)) < 0.8)
        for mode in LOSS_AGG_MODES:
            @jax.jit
            def objective(logp, mode=mode):
                return policy_loss(logp, old, adv, mask, agg_mode=mode, clip_high=0.28).loss()

            grad = np.asarray(jax.grad(objective)(logp))
            numeric = np.zeros_like(grad)
            step = 1e-6
            for index in np.ndindex(*logp.shape):
                bump = jnp.zeros_like(logp).at[index].set(step)
                numeric[index] = (objective(logp + bump) - objective(logp - bump)) / (2 * step)
            np.testing.assert_allclose(grad, numeric, atol=1e-6, err_msg=mode)
            assert np.any(np.abs(grad) > 1e-3), mode  # the test exercises non-zero gradients
            np.testing.assert_array_equal(grad[~np.asarray(mask)], 0.0)


# ----------------------------------------------------------------------------------------------
# verl's micro-batch weighting (rl.micro_batch_max_tokens).
# ----------------------------------------------------------------------------------------------


def verl_dynamic_batch_loss(per_token: np.ndarray, mask: np.ndarray, micro_batches, minibatch_rows: int) -> float:
    """verl's loss of one minibatch, as DataParallelPPOActor.update_policy accumulates it with
    use_dynamic_bsz: for each micro-batch, in verl's order, the token mean over its own tokens
    (agg_loss "token-mean": masked_mean, + 1e-8), times its rows / the minibatch's rows."""
    total = 0.0
    for rows in micro_batches:
        rows = list(rows)
        token_mean = (per_token[rows] * mask[rows]).sum() / (mask[rows].sum() + 1e-8)
        total += token_mean * (len(rows) / minibatch_rows)
    return float(total)


@pytest.mark.parametrize("max_tokens", [40, 90, 400])  # many small micro-batches .. one
@pytest.mark.parametrize("micro_rows", [1, 4, 12])  # ours: any fixed size gives the same sum
def test_verl_row_weights_reproduce_verls_micro_batch_accumulation(max_tokens, micro_rows):
    rs = np.random.RandomState(max_tokens + micro_rows)
    rows, width, prompt = 12, 16, 5
    lengths = rs.randint(1, width + 1, rows)
    mask = np.arange(width)[None, :] < lengths[:, None]
    mask[3] = False  # a row without loss tokens (a padded prompt's)
    per_token = rs.normal(size=(rows, width)).astype(np.float32)
    layout = verl_update_layout(prompt + lengths, num_minibatches=1, max_tokens=max_tokens)
    (micro_batches,) = layout.micro_batches
    want = verl_dynamic_batch_loss(per_token.astype(np.float64), mask, micro_batches, rows)

    weights = verl_row_weights(jnp.asarray(mask), jnp.asarray(layout.segment_ids), rows)
    numerator = 0.0
    for start in range(0, rows, micro_rows):  # our fixed micro-batches, in the batch's order
        part = slice(start, start + micro_rows)
        num, _ = aggregate_loss(jnp.asarray(per_token[part]), jnp.asarray(mask[part]), row_weights=weights[part])
        numerator += float(num)
    assert abs(numerator - want) < 1e-6
    # Not the plain token mean of the minibatch (unless one micro-batch holds every row).
    plain = float((per_token * mask).sum() / mask.sum())
    assert (len(micro_batches) == 1) == (abs(plain - want) < 1e-6)


def test_verl_row_weights_of_one_segment_are_the_token_mean():
    mask = jnp.asarray([[1, 1, 0], [1, 0, 0], [0, 0, 0]], bool)
    weights = verl_row_weights(mask, jnp.zeros(3, jnp.int32), 3)
    np.testing.assert_allclose(weights, [1 / 3] * 3, rtol=1e-7)  # 3 rows / (3 rows x 3 tokens)
    # Segments {0}, {1, 2}: row 0 gets 1 / (3 x 2), rows 1 and 2 get 2 / (3 x 1).
    weights = verl_row_weights(mask, jnp.asarray([0, 1, 1]), 3)
    np.testing.assert_allclose(weights, [1 / 6, 2 / 3, 2 / 3], rtol=1e-7)
    with pytest.raises(ValueError, match="need token-mean"):
        aggregate_loss(jnp.ones((3, 3)), mask, "seq-mean-token-mean", row_weights=weights)


def test_truncated_is_weights_multiply_the_clipped_loss():
    logp = jnp.log(jnp.asarray([[1.1, 0.5]]))
    adv = jnp.asarray([[1.0, -1.0]])
    mask = jnp.ones((1, 2), bool)
    plain = policy_loss(logp, jnp.zeros((1, 2)), adv, mask)
    weighted = policy_loss(logp, jnp.zeros((1, 2)), adv, mask, is_weights=jnp.asarray([[2.0, 0.5]]))
    per_token = np.asarray([-1.1, 0.8])  # max(-A rho, -A clip(rho)), as in test_clipped_surrogate_hand_computed
    assert float(plain.numerator) == pytest.approx(per_token.sum(), rel=1e-6)
    assert float(weighted.numerator) == pytest.approx(2.0 * per_token[0] + 0.5 * per_token[1], rel=1e-6)
    assert float(weighted.denominator) == float(plain.denominator) == 2.0
    # No gradient flows into the weights.
    grad = jax.grad(lambda w: policy_loss(logp, jnp.zeros((1, 2)), adv, mask, is_weights=w).numerator)(
        jnp.ones((1, 2)))
    assert not np.any(np.asarray(grad))
