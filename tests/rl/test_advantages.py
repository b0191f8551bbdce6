"""Tests of gd2po_jax.rl.advantages: reference vectors of the official code, TRL and verl, and the
properties the spec demands (permutation, tau limits, padding, constant groups, jit/vmap, dtypes)."""

import json

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gd2po_jax.rl.advantages import (
    METHODS,
    SNR_HALF_METHODS,
    advantage_diagnostics,
    compute_advantages,
    conflict_score,
    snr_halves,
    token_whiten,
)
from tests.fakes import REFERENCE
from tests.tolerances import ulps

# ------------------------------------------------------------------------------------------------
# Official GD2PO vectors.
# ------------------------------------------------------------------------------------------------

OFFICIAL_BLOCKS = {"GRPO": ("grpo", None), "GDPO": ("gdpo", None), "GD2PO_Hard": ("gd2po_hard", None)}

# Official meta_info keys -> our diagnostics names.
HARD_META = {
    "gdpo_filter_group_ratio_conflict_ratio": "conflict_ratio",
    "gdpo_filter_group_ratio_keep_ratio": "kept_fraction",
    "gdpo_filter_group_ratio_mean": "query_weight_mean",
    "gdpo_filter_group_ratio_min": "query_weight_min",
    "gdpo_filter_group_ratio_max": "query_weight_max",
    "gdpo_filter_group_ratio_std": "query_weight_std",
}
SNR_META = {
    "gdpo_filter_ratio_conflict_ratio": "conflict_ratio",
    "gdpo_filter_ratio_true_conflict_ratio": "dropped_ratio",
    "gdpo_filter_ratio_keep_ratio": "kept_fraction",
    "gdpo_filter_ratio_mean_in_conflict": "snr_mean_in_conflict",
    "gdpo_filter_ratio_abs_mean_in_conflict": "snr_abs_mean_in_conflict",
    "gdpo_filter_ratio_p50_in_conflict": "snr_p50_in_conflict",
    "gdpo_filter_ratio_true_conflict_in_conflict_ratio": "dropped_in_conflict_ratio",
    "gdpo_filter_ratio_group_ratio_mean": "query_weight_mean",
    "gdpo_filter_ratio_group_ratio_min": "query_weight_min",
    "gdpo_filter_ratio_group_ratio_max": "query_weight_max",
    "gdpo_filter_ratio_group_ratio_std": "query_weight_std",
}


def _official_cases():
    return json.loads((REFERENCE / "gd2po_official_vectors.json").read_text())


def _official_inputs(case):
    group = case["inputs"]["group_sizes"][0]
    assert all(size == group for size in case["inputs"]["group_sizes"])
    names = case["active_rewards"]
    rewards = np.stack([case["inputs"]["rewards"][n] for n in names], -1).reshape(-1, group, len(names))
    lengths = np.asarray(case["inputs"]["response_lengths"]).reshape(-1, group)
    return jnp.asarray(rewards, jnp.float32), jnp.asarray(lengths), names


def _method_blocks(case):
    for key in case:
        if key in OFFICIAL_BLOCKS:
            yield key, OFFICIAL_BLOCKS[key][0], 0.8
        elif key.startswith("GD2PO_SNR_tau"):
            yield key, "gd2po_snr", float(key.removeprefix("GD2PO_SNR_tau"))


def _tolerance(case_name, block):
    # case3: S = A_correctness + A_length is only the residue of the two 1e-6 epsilons (about
    # 1.3e-6), and the token whitening then divides it by sqrt(var + 1e-8) ~ 1e-4, amplifying the
    # float32 rounding of A_k (~6e-8 each) ten-thousandfold. The official float32 run gives
    # +-0.013112, float64 gives +-0.012499: a bound tighter than their gap (6e-4) would test the
    # rounding order of the summation, not the algorithm.
    if case_name == "case3_edge_allconflict_and_constant" and block == "GDPO":
        return 1e-3
    return 1e-5


def test_official_vectors_cover_every_method():
    """Every method of the official code has vectors; the SNR halves (the paper's ablation, no
    official code) are tested by hand below."""
    cases = _official_cases()
    assert len(cases) == 4
    seen = {method for case in cases for _, method, _ in _method_blocks(case)}
    assert seen == set(METHODS) - set(SNR_HALF_METHODS)
    assert set(SNR_HALF_METHODS) <= set(METHODS)


@pytest.mark.parametrize("index", range(4))
def test_official_vectors(index):
    case = _official_cases()[index]
    rewards, lengths, names = _official_inputs(case)
    flat = lambda x: np.asarray(x).reshape(-1)  # noqa: E731
    for block, method, tau in _method_blocks(case):
        out = compute_advantages(rewards, lengths, method, snr_tau=tau)
        expected = case[block]
        np.testing.assert_allclose(
            flat(out.advantages), expected["advantage_per_rollout"], atol=_tolerance(case["name"], block),
            err_msg=f"{case['name']} {block} advantages",
        )
        for k, name in enumerate(names):
            np.testing.assert_allclose(
                flat(out.reward_advantages[..., k]), case["A_k_per_rollout"][name], atol=1e-5,
                err_msg=f"{case['name']} A_k {name}",
            )
        np.testing.assert_array_equal(flat(out.conflict), case["sign_conflict"])
        np.testing.assert_allclose(flat(out.snr), case["snr_ratio"], atol=1e-5)
        if "keep" in expected:
            np.testing.assert_array_equal(flat(out.keep), expected["keep"], err_msg=f"{case['name']} {block}")
            kappa = np.repeat(np.asarray(out.query_weight), rewards.shape[1])
            np.testing.assert_allclose(kappa, expected["kappa"], atol=1e-7)
        else:
            assert bool(jnp.all(out.keep))
            np.testing.assert_array_equal(np.asarray(out.query_weight), 1.0)
        meta_names = HARD_META if method == "gd2po_hard" else SNR_META if method == "gd2po_snr" else {}
        diagnostics = advantage_diagnostics(out)
        for official, ours in meta_names.items():
            np.testing.assert_allclose(
                float(diagnostics[ours]), expected["meta_info"][official], atol=1e-6,
                err_msg=f"{case['name']} {block} {official}",
            )


def test_precision_sensitive_case_matches_float32_run():
    """Our float32 computation lands on the official float32 value, not the float64 one."""
    case = _official_cases()[2]
    rewards, lengths, _ = _official_inputs(case)
    out = compute_advantages(rewards, lengths, "gdpo")
    assert abs(abs(float(out.advantages[0, 0])) - 0.013112) < 2e-4


# ------------------------------------------------------------------------------------------------
# TRL / verl / NVlabs vectors.
# ------------------------------------------------------------------------------------------------

TRL_VERL_SETTINGS = {
    "trl_grpo_group": dict(method="grpo", group_eps=1e-4),
    "trl_grpo_batch": dict(method="grpo", group_eps=1e-4, group_scale="batch"),
    "trl_grpo_none": dict(method="grpo", group_scale="none"),
    "trl_gdpo_pre_bn": dict(method="gdpo", group_eps=1e-4, batch_norm="none"),
    "trl_gdpo": dict(method="gdpo", group_eps=1e-4, batch_norm="sequence"),
    "verl_grpo": dict(method="grpo"),
    "verl_grpo_no_std": dict(method="grpo", group_scale="none"),
    "verl_gdpo_pre_whiten": dict(method="gdpo", batch_norm="none"),
    "verl_gdpo": dict(method="gdpo"),
    # NVlabs omits verl's +1e-8 in the masked-mean denominator: within 1e-9 of verl's.
    "nvlabs_verl_gdpo": dict(method="gdpo"),
    # TRL head: NaN-aware (missing rewards left out; all-missing rollouts get 0).
    "trl_head_grpo_group": dict(method="grpo", group_eps=1e-4),
    "trl_head_grpo_batch": dict(method="grpo", group_eps=1e-4, group_scale="batch"),
    "trl_head_gdpo": dict(method="gdpo", group_eps=1e-4, batch_norm="sequence"),
    # NVlabs' TRL GDPO sets missing rewards to 0 first.
    "nvlabs_trl_gdpo": dict(method="gdpo", group_eps=1e-4, batch_norm="sequence", nan_to_zero=True),
}


TRL_VERL_FILE = REFERENCE / "gdpo_trl_verl_vectors.json"


def _trl_verl_cases():
    cases = json.loads(TRL_VERL_FILE.read_text())
    return [
        pytest.param(case, key, id=f"{name}-{key}")
        for name, case in cases.items()
        for key in case
        if key in TRL_VERL_SETTINGS
    ]


@pytest.mark.parametrize("case,key", _trl_verl_cases())
def test_trl_verl_vectors(case, key):
    trl_verl_key = key
    group = case.get("G", 4)
    rewards = np.array(
        [[np.nan if v is None else v for v in row] for row in case["rewards_per_func"]], np.float32
    ).reshape(-1, group, 2)
    lengths = np.asarray(case.get("lengths", [1] * (rewards.shape[0] * group))).reshape(-1, group)
    settings_ = dict(TRL_VERL_SETTINGS[trl_verl_key])
    if settings_.pop("nan_to_zero", False):
        rewards = np.nan_to_num(rewards)
    out = compute_advantages(
        jnp.asarray(rewards), jnp.asarray(lengths),
        reward_weights=jnp.asarray(case.get("weights", [1.0, 1.0])), **settings_,
    )
    np.testing.assert_allclose(np.asarray(out.advantages).reshape(-1), case[trl_verl_key], atol=1e-5)


def test_all_trl_verl_outputs_are_checked():
    cases = json.loads(TRL_VERL_FILE.read_text())
    inputs = {"rewards_per_func", "weights", "G", "lengths", "L", "weighted_sum"}
    for name, case in cases.items():
        unchecked = set(case) - inputs - set(TRL_VERL_SETTINGS)
        assert not unchecked, f"case {name}: outputs without a test: {unchecked}"


# ------------------------------------------------------------------------------------------------
# Behaviours from the spec and the papers.
# ------------------------------------------------------------------------------------------------


def test_advantage_collapse_grpo_vs_gdpo():
    """GDPO paper: two binary rewards, G = 2. Groups whose reward sums are (0,1), (0,2), (1,2) get
    identical GRPO advantages; GDPO separates the (0,2) group (both rewards improve) from them."""
    rewards = jnp.asarray(
        [
            [[0, 0], [0, 1]],  # sums (0, 1)
            [[0, 0], [1, 1]],  # sums (0, 2)
            [[1, 0], [1, 1]],  # sums (1, 2)
        ],
        jnp.float32,
    )
    lengths = jnp.ones((3, 2), jnp.int32)
    grpo = np.asarray(compute_advantages(rewards, lengths, "grpo").advantages)
    np.testing.assert_allclose(grpo[0], grpo[1], atol=1e-6)
    np.testing.assert_allclose(grpo[0], grpo[2], atol=1e-6)
    np.testing.assert_allclose(grpo[0], [-0.7071063, 0.7071063], atol=1e-6)

    pre = np.asarray(compute_advantages(rewards, lengths, "gdpo", batch_norm="none").advantages)
    np.testing.assert_allclose(pre[1], 2 * pre[0], atol=1e-6)
    gdpo = np.asarray(compute_advantages(rewards, lengths, "gdpo").advantages)
    assert abs(gdpo[1, 1]) > abs(gdpo[0, 1]) + 0.3
    assert gdpo[1, 1] > 0 > gdpo[1, 0]


def test_zero_advantages_do_not_conflict():
    # Rollout 0: (+, 0) -> no conflict. Rollout 1: (+, -, 0) -> conflict.
    token_adv = jnp.asarray([[[1.0, 0.0, 0.0], [1.0, -1.0, 0.0], [5e-9, -5e-9, 1.0]]])
    from gd2po_jax.rl.advantages import sign_conflict

    np.testing.assert_array_equal(sign_conflict(token_adv)[0], [False, True, False])


def test_snr_threshold_is_clamped():
    rng = np.random.default_rng(0)
    rewards = jnp.asarray(rng.normal(size=(3, 4, 3)), jnp.float32)
    lengths = jnp.asarray(rng.integers(1, 9, size=(3, 4)))
    above = compute_advantages(rewards, lengths, "gd2po_snr", snr_tau=7.0)
    hard = compute_advantages(rewards, lengths, "gd2po_hard")
    np.testing.assert_array_equal(above.advantages, hard.advantages)
    below = compute_advantages(rewards, lengths, "gd2po_snr", snr_tau=-1.0)
    gdpo = compute_advantages(rewards, lengths, "gdpo")
    np.testing.assert_array_equal(below.advantages, gdpo.advantages)


def test_group_of_one_uses_mean_zero_std_one():
    rewards = jnp.asarray([[[2.0]], [[-1.0]], [[0.5]]])
    out = compute_advantages(rewards, jnp.ones((3, 1), jnp.int32), "grpo")
    np.testing.assert_allclose(np.asarray(out.advantages)[:, 0], [2.0, -1.0, 0.5], rtol=2e-6)


def test_unweighted_equals_weights_one_and_weights_scale_rewards():
    rng = np.random.default_rng(1)
    rewards = jnp.asarray(rng.normal(size=(4, 4, 2)), jnp.float32)
    lengths = jnp.asarray(rng.integers(1, 9, size=(4, 4)))
    base = compute_advantages(rewards, lengths, "gd2po_snr", snr_tau=0.5)
    ones = compute_advantages(rewards, lengths, "gd2po_snr", snr_tau=0.5, reward_weights=jnp.ones(2))
    np.testing.assert_array_equal(base.advantages, ones.advantages)
    # A zero weight removes a reward entirely: equal to running on the other reward alone.
    zero = compute_advantages(rewards, lengths, "gd2po_snr", snr_tau=0.5, reward_weights=jnp.asarray([1.0, 0.0]))
    alone = compute_advantages(rewards[..., :1], lengths, "gd2po_snr", snr_tau=0.5)
    np.testing.assert_allclose(zero.advantages, alone.advantages, atol=1e-6)
    assert not bool(jnp.any(zero.conflict))


def test_rejects_bad_arguments():
    rewards = jnp.zeros((2, 4, 2))
    lengths = jnp.ones((2, 4), jnp.int32)
    with pytest.raises(ValueError, match="method must be one of"):
        compute_advantages(rewards, lengths, "ppo")
    with pytest.raises(ValueError, match="batch_norm"):
        compute_advantages(rewards, lengths, "gdpo", batch_norm="tokens")
    with pytest.raises(ValueError, match=r"lengths must be \[P, G\]"):
        compute_advantages(rewards, jnp.ones((2, 3), jnp.int32), "gdpo")
    with pytest.raises(ValueError, match="reward_weights must have K = 2"):
        compute_advantages(rewards, lengths, "gdpo", reward_weights=jnp.ones(3))
    with pytest.raises(ValueError, match=r"rewards must be \[P, G, K\]"):
        compute_advantages(jnp.zeros((8, 2)), lengths, "gdpo")


def test_dapo_filter_drops_groups_without_variance():
    rewards = jnp.asarray(
        [
            [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]],  # no variance in any reward: dropped
            [[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]],  # reward 1 varies: kept
            [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
        ]
    )
    lengths = jnp.full((3, 4), 3)
    for method in METHODS:
        plain = compute_advantages(rewards, lengths, method)
        dapo = compute_advantages(rewards, lengths, method, drop_zero_variance_groups=True)
        assert not bool(jnp.any(dapo.keep[0])), method
        assert float(dapo.query_weight[0]) == 0.0, method
        np.testing.assert_array_equal(dapo.advantages[0], 0.0)
        np.testing.assert_array_equal(dapo.keep[1:], plain.keep[1:])
    # The dropped group was constant (advantage 0) but counted in the whitening statistics; without
    # it, GDPO's token whitening differs.
    gdpo_plain = compute_advantages(rewards, lengths, "gdpo").advantages
    gdpo_dapo = compute_advantages(rewards, lengths, "gdpo", drop_zero_variance_groups=True).advantages
    assert not np.allclose(gdpo_plain[1:], gdpo_dapo[1:], atol=1e-3)
    np.testing.assert_array_equal(
        compute_advantages(rewards, lengths, "gdpo").reward_zero_std,
        [[True, True], [True, False], [False, False]],
    )


def test_missing_rewards_are_left_out():
    """A NaN reward is left out of its group's statistics; an all-NaN rollout gets 0 and no weight."""
    rewards = jnp.asarray(
        [[[1.0, 3.0], [1.0, jnp.nan], [0.0, -3.0], [1.0, 0.5]], [[jnp.nan, jnp.nan], [1.0, -3.0], [1.0, 1.0], [0.0, -0.5]]]
    )
    lengths = jnp.full((2, 4), 4)
    for method in METHODS:
        out = compute_advantages(rewards, lengths, method)
        assert np.all(np.isfinite(np.asarray(out.advantages))), method
        assert float(out.advantages[1, 0]) == 0.0
        assert not bool(out.keep[1, 0])
    # Reward 1 of prompt 0 is normalized over the three present values only.
    out = compute_advantages(rewards, lengths, "gdpo")
    present = np.asarray([3.0, -3.0, 0.5])
    expected = (present - present.mean()) / (present.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(np.asarray(out.reward_advantages)[0, [0, 2, 3], 1], expected, atol=1e-5)
    assert float(out.reward_advantages[0, 1, 1]) == 0.0


def test_diagnostics_values():
    rewards = jnp.asarray(
        [[[3.0, 0.1], [-3.0, 0.9], [1.0, 0.5], [-3.0, 0.1]], [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]]
    )
    lengths = jnp.full((2, 4), 2)
    out = compute_advantages(rewards, lengths, "gd2po_hard")
    metrics = advantage_diagnostics(out)
    conflicts = int(jnp.sum(out.conflict))
    assert conflicts >= 1
    assert float(metrics["conflict_ratio"]) == pytest.approx(conflicts / 8)
    assert float(metrics["kept_fraction"]) == pytest.approx(1 - conflicts / 8)
    assert float(metrics["zero_std_fraction/0"]) == pytest.approx(0.5)
    assert float(metrics["zero_std_fraction/1"]) == pytest.approx(0.5)
    assert float(metrics["abs_advantage_mean"]) == pytest.approx(float(jnp.mean(jnp.abs(out.advantages))))
    gdpo = compute_advantages(rewards, lengths, "gdpo").advantages
    assert float(metrics["abs_advantage_mean_unfiltered"]) == pytest.approx(float(jnp.mean(jnp.abs(gdpo))))
    for value in metrics.values():
        assert np.isfinite(float(value))


def test_diagnostics_with_no_valid_prompt_are_finite():
    out = compute_advantages(jnp.ones((2, 4, 2)), jnp.ones((2, 4), jnp.int32), "gd2po_snr", valid=jnp.zeros(2, bool))
    metrics = advantage_diagnostics(out, valid=jnp.zeros(2, bool))
    assert all(np.isfinite(float(v)) for v in metrics.values())
    np.testing.assert_array_equal(out.advantages, 0.0)


# ------------------------------------------------------------------------------------------------
# The SNR halves (the paper's appendix C.1, Table 6).
# ------------------------------------------------------------------------------------------------

NAN = np.nan
# Two rewards, G = 4. The conflict score c is |snr| in conflict, 1 without (from the group
# advantages A_1, A_2 of each prompt, computed by hand from the rewards; snr does not depend on L).
HALVES_REWARDS = np.asarray([
    # A_1 = [-0.945 -0.567 0.189 1.323], A_2 = [1.025 0.439 -1.317 -0.146]: all four conflict,
    # snr = [0.041 -0.127 -0.749 0.801]. Order by c: 3, 2, 1, 0 (by signed snr: 3, 0, 1, 2).
    [[0, 4], [1, 3], [3, 0], [6, 2]],
    # A_2 = [1.389 0 -0.463 -0.926]: rollout 1 has A_2 = 0 exactly, no conflict, c = 1 (snr = -1:
    # the two rewards agree it is bad). c = [0.190 1 0.420 0.177]. Order: 1, 2, 0, 3 (signed: 0, 3, 2, 1).
    [[0, 5], [1, 2], [3, 1], [6, 0]],
    # Reward 2 constant: A_2 = 0, no conflict anywhere, c = 1 for all: ties, by index: 0, 1, 2, 3.
    [[0, 1], [1, 1], [2, 1], [3, 1]],
    # Rollout 2 unscored (all NaN): n = 3 eligible, n // 2 = 1. Over [0, 1, 6] and [4, 3, 2]:
    # A_1 = [-0.726 -0.415 1.141], A_2 = [1 0 -1], c = [0.159 1 - 0.066]. Order: 1, 0, 3.
    [[0, 4], [1, 3], [NAN, NAN], [6, 2]],
    # Rollout 1 sits at both group means: A_1 = A_2 = 0, snr = 0 but no conflict, so c = 1 (not 0).
    # A_1 = [-0.926 0 -0.463 1.389], A_2 = [1.414 0 -0.707 -0.707]: c = [0.209 1 1 0.325].
    # Order: 1, 2, 3, 0 (by |snr| alone, 2, 3, 0, 1).
    [[0, 3], [2, 1], [1, 0], [5, 0]],
    # A padded prompt (valid = False): nothing is kept.
    [[9, 0], [0, 9], [5, 5], [1, 2]],
], np.float32)
HALVES_LENGTHS = np.asarray([[3, 5, 2, 7], [4, 4, 6, 1], [2, 9, 3, 5], [6, 2, 8, 3], [1, 4, 2, 6], [5, 5, 5, 5]],
                            np.int32)
HALVES_VALID = np.asarray([True, True, True, True, True, False])
LOW_HALF = [[0, 0, 1, 1], [0, 1, 1, 0], [1, 1, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0]]
HIGH_HALF = [[1, 1, 0, 0], [1, 0, 0, 1], [0, 0, 1, 1], [0, 0, 0, 1], [1, 0, 0, 1], [0, 0, 0, 0]]


def _group_norm64(x):
    """The spec's group normalization in float64 over the present (non-NaN) values of a row."""
    out = np.zeros_like(x, np.float64)
    present = ~np.isnan(x)
    values = x[present].astype(np.float64)
    if np.ptp(values) > 0:
        out[present] = (values - values.mean()) / (values.std(ddof=1) + 1e-6)
    return out


def _gd2po_batch_step64(rewards, lengths, valid, keep, reweight=True):
    """``keep * batch_whiten(kappa * S, weights = L * keep)`` in float64 (docs/algorithm.md); kappa 1
    without ``reweight``."""
    summed = np.zeros(rewards.shape[:2])
    for p in np.flatnonzero(valid):
        for k in range(rewards.shape[2]):
            summed[p] += _group_norm64(rewards[p, :, k])
    keep = np.asarray(keep, bool)
    kappa = keep.sum(1, keepdims=True) / keep.shape[1] if reweight else 1.0
    values, weights = kappa * summed, lengths * keep
    total = weights.sum()
    mean = (weights * values).sum() / total
    var = (weights * (values - mean) ** 2).sum() / total * total / (total - 1)
    return np.where(keep, (values - mean) / np.sqrt(var + 1e-8), 0.0)


@pytest.mark.parametrize("method,expected", [("low_conflict_half", LOW_HALF), ("high_conflict_half", HIGH_HALF)])
def test_snr_halves_by_hand(method, expected):
    out = compute_advantages(jnp.asarray(HALVES_REWARDS), jnp.asarray(HALVES_LENGTHS), method,
                             valid=jnp.asarray(HALVES_VALID))
    np.testing.assert_array_equal(out.keep, np.asarray(expected, bool))
    # kappa = (n // 2) / G: 2 of 4 kept, 1 of 4 where one rollout is unscored, 0 for the padding.
    np.testing.assert_array_equal(out.query_weight, [0.5, 0.5, 0.5, 0.25, 0.5, 0.0])
    reference = _gd2po_batch_step64(HALVES_REWARDS, HALVES_LENGTHS, HALVES_VALID, expected)
    np.testing.assert_allclose(out.advantages, reference, atol=1e-5)
    assert np.all(np.asarray(out.advantages)[~np.asarray(expected, bool)] == 0.0)
    # The unfiltered advantages are GDPO's, as for the other filtering methods.
    gdpo = compute_advantages(jnp.asarray(HALVES_REWARDS), jnp.asarray(HALVES_LENGTHS), "gdpo",
                              valid=jnp.asarray(HALVES_VALID))
    np.testing.assert_array_equal(out.unfiltered_advantages, gdpo.advantages)
    metrics = advantage_diagnostics(out, valid=jnp.asarray(HALVES_VALID))
    assert float(metrics["kept_fraction"]) == pytest.approx(9 / 20)  # 2 + 2 + 2 + 1 + 2 of 20 real rollouts


def test_snr_halves_rank_by_absolute_snr_and_break_ties_by_index():
    score = jnp.asarray([[0.3, 0.9, 0.9, 0.1], [1.0, 1.0, 1.0, 0.5], [0.2, 0.2, 0.2, 0.2], [0.0, -0.0, 0.7, 0.0]])
    eligible = jnp.asarray([[True] * 4, [True] * 4, [True] * 4, [True] * 4])
    low, high = snr_halves(score, eligible)
    np.testing.assert_array_equal(low, [[0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0]])
    np.testing.assert_array_equal(high, [[1, 0, 0, 1], [0, 0, 1, 1], [0, 0, 1, 1], [0, 1, 0, 1]])
    # Odd counts: the middle rollout of the order is in neither half; fewer than 2 keep nothing.
    odd = jnp.asarray([[True, True, False, True], [False, True, False, False], [False] * 4, [True] * 4])
    low, high = snr_halves(jnp.asarray([[0.5, 0.2, 0.9, 0.8]] * 4), odd)
    np.testing.assert_array_equal(low, [[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 1]])
    np.testing.assert_array_equal(high, [[0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    # The score is |snr| of a rollout in conflict, 1 of one without (whatever its snr).
    out = compute_advantages(jnp.asarray(HALVES_REWARDS[:2]), jnp.asarray(HALVES_LENGTHS[:2]), "gdpo")
    np.testing.assert_allclose(out.snr[1, 1], -1.0, atol=1e-6)
    np.testing.assert_allclose(conflict_score(out.conflict, out.snr),
                               [[0.041, 0.127, 0.749, 0.801], [0.190, 1.0, 0.420, 0.177]], atol=1e-3)


def test_batch_halves_rank_every_rollout_of_the_batch_together():
    """``halves_ranking="batch"``: the n eligible rollouts of the whole batch ordered by c (ties by
    their place in the batch, prompt-major); the halves are the first and last n // 2, and kappa is
    each prompt's kept share, no longer the same for every prompt."""
    rewards, lengths, valid = (jnp.asarray(x) for x in (HALVES_REWARDS, HALVES_LENGTHS, HALVES_VALID))
    gdpo = compute_advantages(rewards, lengths, "gdpo", valid=valid)
    score = np.asarray(conflict_score(gdpo.conflict, gdpo.snr)).reshape(-1)
    eligible = np.flatnonzero(np.asarray(gdpo.keep).reshape(-1))  # scored rollouts of real prompts
    assert len(eligible) == 19
    ordered = sorted(eligible, key=lambda i: (-score[i], i))
    for method, half in (("low_conflict_half", ordered[:9]), ("high_conflict_half", ordered[-9:])):
        expected = np.zeros(HALVES_REWARDS.shape[:2], bool)
        expected.reshape(-1)[half] = True
        out = compute_advantages(rewards, lengths, method, valid=valid, halves_ranking="batch")
        np.testing.assert_array_equal(out.keep, expected)
        np.testing.assert_array_equal(out.query_weight, expected.sum(1) / 4)
        reference = _gd2po_batch_step64(HALVES_REWARDS, HALVES_LENGTHS, HALVES_VALID, expected)
        np.testing.assert_allclose(out.advantages, reference, atol=1e-5)
        per_prompt = compute_advantages(rewards, lengths, method, valid=valid)
        assert not np.array_equal(out.keep, per_prompt.keep)  # another cut than the per-prompt one
    with pytest.raises(ValueError, match="halves ranking must be one of"):
        snr_halves(jnp.zeros((2, 2)), jnp.ones((2, 2), bool), "group")


@pytest.mark.parametrize("method", ["gd2po_hard", "gd2po_snr", "low_conflict_half"])
def test_without_query_reweighting_every_prompt_weighs_one(method):
    """``query_reweighting=False`` (the paper's "filtering alone"): the same rollouts are kept, the
    batch step whitens S instead of kappa S, and ``query_weight`` is 1 for a prompt with a kept
    rollout, 0 for one without (its advantages are 0 whatever its weight)."""
    rewards, lengths, valid = (jnp.asarray(x) for x in (HALVES_REWARDS, HALVES_LENGTHS, HALVES_VALID))
    reweighted = compute_advantages(rewards, lengths, method, valid=valid, snr_tau=0.5)
    alone = compute_advantages(rewards, lengths, method, valid=valid, snr_tau=0.5, query_reweighting=False)
    keep = np.asarray(alone.keep)
    np.testing.assert_array_equal(keep, reweighted.keep)
    reference = _gd2po_batch_step64(HALVES_REWARDS, HALVES_LENGTHS, HALVES_VALID, keep, reweight=False)
    np.testing.assert_allclose(alone.advantages, reference, atol=1e-5)
    assert np.abs(np.asarray(alone.advantages) - np.asarray(reweighted.advantages)).max() > 1e-3
    np.testing.assert_array_equal(alone.query_weight, keep.any(1).astype(np.float32))
    np.testing.assert_array_equal(alone.unfiltered_advantages, reweighted.unfiltered_advantages)
    metrics = advantage_diagnostics(alone, valid=valid)
    with_kept = keep.any(1) & HALVES_VALID
    assert float(metrics["query_weight_min"]) == (1.0 if with_kept[HALVES_VALID].all() else 0.0)
    assert float(metrics["query_weight_max"]) == 1.0
    # Every real prompt keeping a rollout: the minimum weight is 1.
    full = compute_advantages(rewards[1:3], lengths[1:3], method, snr_tau=0.5, query_reweighting=False)
    assert np.asarray(full.keep).any(1).all()
    assert float(advantage_diagnostics(full)["query_weight_min"]) == 1.0


def test_snr_eps_is_added_to_the_snr_denominator():
    """``snr_eps`` (official 1e-8 for tool calling, 1e-6 for helpfulness-safety) matters where the
    reward-wise advantages are tiny: T = (-1e-6, 5e-7) has snr -1/3 with 1e-8 and -1/5 with 1e-6, so
    tau = 0.3 keeps the rollout with the one and drops it with the other. The sign test keeps 1e-8."""
    rewards = jnp.asarray([[[0.0, 1e-12], [2e-12, 0.0]]], jnp.float32)  # [1, 2, 2]: two rewards, G = 2
    lengths = jnp.ones((1, 2), jnp.int32)
    small = compute_advantages(rewards, lengths, "gd2po_snr", snr_tau=0.3)
    large = compute_advantages(rewards, lengths, "gd2po_snr", snr_tau=0.3, snr_eps=1e-6)
    token_adv = np.asarray(small.reward_advantages, np.float64)  # L = 1
    assert np.all(np.asarray(small.conflict)) and np.all(np.asarray(large.conflict))
    for out, eps in ((small, 1e-8), (large, 1e-6)):
        expected = token_adv.sum(-1) / (np.abs(token_adv).sum(-1) + eps)
        np.testing.assert_allclose(out.snr, expected, rtol=1e-5)
    assert np.abs(np.asarray(small.snr)).min() > 0.3 > np.abs(np.asarray(large.snr)).max()
    assert np.all(np.asarray(small.keep)) and not np.any(np.asarray(large.keep))


# ------------------------------------------------------------------------------------------------
# Properties (hypothesis).
# ------------------------------------------------------------------------------------------------

REWARD_VALUES = st.sampled_from([-3.0, -1.5, 0.0, 0.25, 0.5, 1.0, 1.8, 3.0])


SHAPES = [(1, 2, 1), (3, 4, 1), (2, 4, 2), (3, 5, 3), (4, 2, 3), (1, 4, 2)]


@st.composite
def batches(draw, min_group=2, max_rewards=3):
    """(rewards [P, G, K] float32, lengths [P, G] int32) with discrete or continuous rewards."""
    # A few fixed shapes: every new shape costs XLA compilations, and these cover P = 1, G = 2,
    # K = 1 and uneven sizes.
    shape = draw(st.sampled_from([s for s in SHAPES if s[1] >= min_group and s[2] <= max_rewards]))
    if draw(st.booleans()):
        rewards = draw(hnp.arrays(np.float32, shape, elements=REWARD_VALUES))
    else:
        rewards = draw(hnp.arrays(np.float32, shape, elements=st.floats(-4, 4, width=32)))
    lengths = draw(hnp.arrays(np.int32, shape[:2], elements=st.integers(1, 40)))
    return rewards, lengths


METHOD_KW = st.sampled_from(
    [("grpo", {}), ("gdpo", {}), ("gd2po_hard", {}), ("gd2po_snr", {"snr_tau": 0.5}),
     ("gd2po_snr", {"snr_tau": 0.8}), ("gdpo", {"batch_norm": "sequence"}),
     ("gd2po_snr", {"snr_tau": 0.3, "batch_norm": "sequence"}), ("gd2po_hard", {"batch_norm": "none"}),
     ("low_conflict_half", {}), ("high_conflict_half", {"batch_norm": "sequence"})]
)


def _run(rewards, lengths, method, **kwargs):
    return compute_advantages(jnp.asarray(rewards), jnp.asarray(lengths), method, **kwargs)


def _filter_is_stable(out, tau, margin=1e-4):
    """True when no conflicting rollout's |snr| sits within ``margin`` of tau: summation-order
    rounding could then flip a keep decision, which is not what the permutation test is about."""
    snr = np.abs(np.asarray(out.snr))[np.asarray(out.conflict)]
    return not np.any(np.abs(snr - tau) < margin)


def _batch_norm_is_stable(out, method, batch_norm, margin=1e-3):
    """True unless the batch step whitens (nearly) constant values: when every kept token carries
    the same summed advantage, its variance is rounding noise and ``rsqrt(var + 1e-8)`` scales
    that noise (an ulp of the group means, which depend on the summation order) up by ~1e4."""
    if method == "grpo" or batch_norm == "none":
        return True
    summed = np.sum(np.asarray(out.reward_advantages), axis=-1)[np.asarray(out.keep)]
    return summed.size == 0 or np.ptp(summed) > margin


def _groups_are_well_conditioned(rewards, limit=4e-6):
    """True unless some group's reward spread is so small against its magnitude that float32's
    ``x - mean`` cancels: the advantages then carry rounding noise of about eps * max|r| / std
    (e.g. 1.7e-5 for four rewards of -2.014 and one of -2.047), which depends on the summation
    order, hence on the permutation."""
    r = np.asarray(rewards, np.float64)
    std = np.nanstd(r, axis=1, ddof=1) if r.shape[1] > 1 else np.zeros(r.shape[::2])
    noise = np.finfo(np.float32).eps * np.nanmax(np.abs(r), axis=1) / np.where(std > 0, std, np.inf)
    return not np.any(noise > limit)


def _ranking_is_stable(out, margin=1e-4):
    """True when no two rollouts of a group have conflict scores within ``margin``: the SNR halves
    break ties by rollout index, so only a batch without (near) ties is permutation-equivariant."""
    score = np.asarray(conflict_score(out.conflict, out.snr))
    gaps = np.abs(score[:, :, None] - score[:, None, :]) + np.eye(score.shape[1])[None] * 2 * margin
    return not np.any(gaps < margin)


@settings(max_examples=40, deadline=None)
@given(batch=batches(), method_kw=METHOD_KW, data=st.data())
def test_permutation_equivariance(batch, method_kw, data):
    rewards, lengths = batch
    method, kwargs = method_kw
    out = _run(rewards, lengths, method, **kwargs)
    if not _filter_is_stable(out, kwargs.get("snr_tau", 2.0)):
        return
    if method in SNR_HALF_METHODS and not _ranking_is_stable(out):
        return
    if not _batch_norm_is_stable(out, method, kwargs.get("batch_norm", "token")):
        return
    if not _groups_are_well_conditioned(rewards):
        return
    num_prompts, group, _ = rewards.shape
    prompt_perm = np.asarray(data.draw(st.permutations(range(num_prompts))))
    rollout_perm = np.asarray(data.draw(st.permutations(range(group))))
    permuted = _run(rewards[prompt_perm][:, rollout_perm], lengths[prompt_perm][:, rollout_perm], method, **kwargs)
    perm = lambda x: np.asarray(x)[prompt_perm][:, rollout_perm]  # noqa: E731
    np.testing.assert_allclose(permuted.advantages, perm(out.advantages), atol=2e-5)
    np.testing.assert_array_equal(permuted.keep, perm(out.keep))
    np.testing.assert_array_equal(permuted.conflict, perm(out.conflict))
    np.testing.assert_allclose(permuted.snr, perm(out.snr), atol=2e-5)
    np.testing.assert_allclose(permuted.query_weight, np.asarray(out.query_weight)[prompt_perm])


@settings(max_examples=40, deadline=None)
@given(batch=batches(), batch_norm=st.sampled_from(["token", "sequence", "none"]))
def test_tau_limits(batch, batch_norm):
    rewards, lengths = batch
    gdpo = _run(rewards, lengths, "gdpo", batch_norm=batch_norm)
    hard = _run(rewards, lengths, "gd2po_hard", batch_norm=batch_norm)
    tau0 = _run(rewards, lengths, "gd2po_snr", snr_tau=0.0, batch_norm=batch_norm)
    tau1 = _run(rewards, lengths, "gd2po_snr", snr_tau=1.0, batch_norm=batch_norm)
    np.testing.assert_array_equal(tau0.advantages, gdpo.advantages)
    np.testing.assert_array_equal(tau0.keep, gdpo.keep)
    np.testing.assert_array_equal(tau1.advantages, hard.advantages)
    np.testing.assert_array_equal(tau1.keep, hard.keep)
    np.testing.assert_array_equal(tau1.query_weight, hard.query_weight)


@settings(max_examples=40, deadline=None)
@given(batch=batches(max_rewards=1))
def test_single_reward_gdpo_is_grpo_then_whitening(batch):
    rewards, lengths = batch
    grpo = _run(rewards, lengths, "grpo").advantages
    gdpo = _run(rewards, lengths, "gdpo").advantages
    expected = token_whiten(grpo, jnp.asarray(lengths, jnp.float32))
    np.testing.assert_allclose(gdpo, expected, atol=1e-5)
    # With one reward there is nothing to conflict with: Hard and SNR equal GDPO.
    np.testing.assert_array_equal(_run(rewards, lengths, "gd2po_hard").advantages, gdpo)


@settings(max_examples=30, deadline=None)
@given(batch=batches(), method_kw=METHOD_KW)
def test_constant_groups_give_zero(batch, method_kw):
    rewards, lengths = batch
    constant = np.broadcast_to(rewards[:, :1, :], rewards.shape).copy()
    out = _run(constant, lengths, method_kw[0], **method_kw[1])
    np.testing.assert_array_equal(out.advantages, 0.0)
    np.testing.assert_array_equal(out.reward_advantages, 0.0)
    assert not bool(jnp.any(out.conflict))


@settings(max_examples=30, deadline=None)
@given(
    values=hnp.arrays(np.float32, (3, 4), elements=st.floats(-3, 3, width=32), unique=True),
    lengths=hnp.arrays(np.int32, (3, 4), elements=st.integers(1, 20)),
    batch_norm=st.sampled_from(["token", "sequence", "none"]),
)
def test_all_filtered_gives_zeros(values, lengths, batch_norm):
    # Reward 2 is the exact mirror of reward 1: every rollout off its group's mean conflicts with
    # |snr| ~ 0 (a rollout at the mean, e.g. 0 in [0, 1, 2, -3], has A = 0 and no conflict).
    assume(np.all(np.abs(values - values.astype(np.float64).mean(axis=1, keepdims=True)) > 1e-3))
    rewards = np.stack([values, -values], axis=-1)
    hard = _run(rewards, lengths, "gd2po_hard", batch_norm=batch_norm)
    assert bool(jnp.all(hard.conflict))
    np.testing.assert_array_equal(hard.advantages, 0.0)
    np.testing.assert_array_equal(hard.query_weight, 0.0)
    assert not bool(jnp.any(hard.keep))
    snr = _run(rewards, lengths, "gd2po_snr", snr_tau=0.2, batch_norm=batch_norm)
    np.testing.assert_array_equal(snr.advantages, 0.0)


@settings(max_examples=30, deadline=None)
@given(batch=batches(), method_kw=METHOD_KW, extra=st.just(2), seed=st.integers(0, 2**31 - 1))
def test_padded_prompts_change_nothing(batch, method_kw, extra, seed):
    rewards, lengths = batch
    method, kwargs = method_kw
    rng = np.random.default_rng(seed)
    pad_rewards = rng.normal(size=(extra,) + rewards.shape[1:]).astype(np.float32) * 10
    pad_lengths = rng.integers(1, 50, size=(extra, rewards.shape[1])).astype(np.int32)
    padded = _run(
        np.concatenate([rewards, pad_rewards]), np.concatenate([lengths, pad_lengths]), method,
        valid=jnp.arange(rewards.shape[0] + extra) < rewards.shape[0], **kwargs,
    )
    plain = _run(rewards, lengths, method, **kwargs)
    real = slice(0, rewards.shape[0])
    # The batch statistics are sums over up to P * G rollouts, reassociated when padding is added.
    np.testing.assert_allclose(padded.advantages[real], plain.advantages, atol=ulps(plain.advantages, 16))
    np.testing.assert_array_equal(padded.keep[real], plain.keep)
    np.testing.assert_allclose(padded.query_weight[real], plain.query_weight)
    np.testing.assert_array_equal(padded.advantages[rewards.shape[0]:], 0.0)
    np.testing.assert_array_equal(padded.keep[rewards.shape[0]:], False)
    np.testing.assert_array_equal(padded.query_weight[rewards.shape[0]:], 0.0)


@settings(max_examples=25, deadline=None)
@given(batch=batches(), method_kw=METHOD_KW)
def test_never_nan(batch, method_kw):
    rewards, lengths = batch
    out = _run(rewards * 1e6, lengths, method_kw[0], **method_kw[1])
    for field in (out.advantages, out.snr, out.query_weight, out.reward_advantages):
        assert np.all(np.isfinite(np.asarray(field)))
    assert np.all(np.abs(np.asarray(out.snr)) <= 1.0)


@pytest.mark.parametrize("method", METHODS)
def test_jit_and_vmap_match_eager(method):
    rng = np.random.default_rng(3)
    rewards = jnp.asarray(rng.choice([-3.0, 0.0, 1.0, 3.0, 0.5], size=(5, 3, 4, 3)), jnp.float32)
    lengths = jnp.asarray(rng.integers(1, 30, size=(5, 3, 4)))
    tau = jnp.float32(0.6)
    jitted = jax.jit(compute_advantages, static_argnames=("method", "batch_norm"))
    batched = jax.vmap(lambda r, l: compute_advantages(r, l, method, snr_tau=tau))(rewards, lengths)
    for i in range(rewards.shape[0]):
        eager = compute_advantages(rewards[i], lengths[i], method, snr_tau=0.6)
        compiled = jitted(rewards[i], lengths[i], method=method, snr_tau=tau)
        for got in (compiled, jax.tree.map(lambda x: x[i], batched)):
            # jit / vmap may reassociate the batch sums (12 rollouts): a few ulps of the largest.
            np.testing.assert_allclose(got.advantages, eager.advantages, atol=ulps(eager.advantages, 16))
            np.testing.assert_array_equal(got.keep, eager.keep)
            np.testing.assert_allclose(got.query_weight, eager.query_weight)


def test_traced_tau_does_not_recompile():
    rewards = jnp.asarray(np.random.default_rng(4).normal(size=(3, 4, 3)), jnp.float32)
    lengths = jnp.full((3, 4), 5)
    jitted = jax.jit(lambda r, l, tau: compute_advantages(r, l, "gd2po_snr", snr_tau=tau))
    outs = [jitted(rewards, lengths, jnp.float32(t)) for t in (0.0, 0.5, 1.0)]
    assert jitted._cache_size() == 1
    gdpo = compute_advantages(rewards, lengths, "gdpo").advantages
    # jitted with a traced tau vs eager: the batch sums may be reassociated, a few ulps of the largest.
    np.testing.assert_allclose(outs[0].advantages, gdpo, atol=ulps(gdpo, 16))


@pytest.mark.parametrize("method", METHODS)
def test_bfloat16_inputs(method):
    rng = np.random.default_rng(5)
    rewards = jnp.asarray(rng.normal(size=(4, 4, 3)), jnp.bfloat16)
    lengths = jnp.asarray(rng.integers(1, 30, size=(4, 4)))
    low = compute_advantages(rewards, lengths, method, snr_tau=0.5)
    full = compute_advantages(rewards.astype(jnp.float32), lengths, method, snr_tau=0.5)
    assert low.advantages.dtype == jnp.float32
    np.testing.assert_array_equal(low.advantages, full.advantages)


@settings(max_examples=30, deadline=None)
@given(batch=batches(), discrete=st.booleans())
def test_snr_halves_are_complementary_halves(batch, discrete):
    rewards, lengths = batch
    if discrete:  # many ties (equal rewards, rollouts without conflict)
        rewards = np.round(rewards)
    low = _run(rewards, lengths, "low_conflict_half")
    high = _run(rewards, lengths, "high_conflict_half")
    keep_low, keep_high = np.asarray(low.keep), np.asarray(high.keep)
    group = rewards.shape[1]
    assert not np.any(keep_low & keep_high)
    np.testing.assert_array_equal(keep_low.sum(1), group // 2)
    np.testing.assert_array_equal(keep_high.sum(1), group // 2)
    if group % 2 == 0:
        assert np.all(keep_low | keep_high)
        assert float(advantage_diagnostics(low)["kept_fraction"]) == 0.5
        assert float(advantage_diagnostics(high)["kept_fraction"]) == 0.5
    # Every kept low-conflict rollout scores at least as high as every kept high-conflict one.
    score = np.where(np.asarray(low.conflict), np.abs(np.asarray(low.snr)), 1.0)
    for p in range(rewards.shape[0]):
        assert score[p][keep_low[p]].min() >= score[p][keep_high[p]].max()
    np.testing.assert_array_equal(low.query_weight, np.float32(group // 2) / np.float32(group))
    np.testing.assert_array_equal(low.conflict, high.conflict)


# ------------------------------------------------------------------------------------------------
# The registry, aggregators of your own, per-reward and pairwise diagnostics, the >10x check (issue 61).
# ------------------------------------------------------------------------------------------------


def test_the_registry_is_the_one_source_of_the_algorithm_names():
    from gd2po_jax.config import ALGORITHMS
    from gd2po_jax.rl.advantages import ADVANTAGE_METHODS

    assert METHODS == ALGORITHMS  # config cannot import rl: held equal here
    assert set(METHODS) <= set(ADVANTAGE_METHODS)


def test_an_aggregator_of_your_own_is_checked_before_it_runs(tmp_path):
    from gd2po_jax.config import ConfigError
    from gd2po_jax.rl.advantages import advantage_method

    path = tmp_path / "my_aggregators.py"
    path.write_text(
        "import jax.numpy as jnp\n\n"
        "def keep_all(signals, eligible, options):\n    return eligible, jnp.where(eligible, signals.summed, 0.0)\n\n"
        "def two_args(signals, eligible):\n    return eligible, signals.summed\n\n"
        "def flat(signals, eligible, options):\n    return eligible, signals.summed.reshape(-1)\n"
    )
    rewards, lengths = jnp.asarray([[[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]]), jnp.ones((1, 3), jnp.int32)
    out = compute_advantages(rewards, lengths, f"{path}:keep_all")
    np.testing.assert_allclose(out.advantages, out.summed)  # S itself, kept everywhere
    np.testing.assert_allclose(out.unfiltered_advantages, compute_advantages(rewards, lengths, "gdpo").advantages)
    with pytest.raises(ConfigError, match=r"^config\.rl\.algorithm \('.*:two_args'\): two_args in .* cannot take "
                                          r"\(signals, eligible, options\)"):
        advantage_method(f"{path}:two_args")
    with pytest.raises(ConfigError, match=r"^config\.rl\.algorithm \('.*:flat'\): returned .*; an aggregator returns "
                                          r"\(keep, advantages\), two \[P, G\] = \(1, 3\) arrays"):
        compute_advantages(rewards, lengths, f"{path}:flat")
    with pytest.raises(ConfigError, match=r"^config\.rl\.algorithm \('.*nowhere\.py:f'\): no file"):
        advantage_method(f"{tmp_path / 'nowhere.py'}:f")
    with pytest.raises(ConfigError, match=r"'ppo' is not one of .*nor an aggregator of your own"):
        advantage_method("ppo")


def test_the_config_takes_an_aggregator_by_import_path():
    from gd2po_jax.config import ConfigError
    from tests.fakes import tiny_run_config

    config = tiny_run_config().replace({"rl.algorithm": "examples/aggregators/quantile_gdpo.py:quantile_gdpo"})
    assert config.rl.algorithm.endswith(":quantile_gdpo")
    with pytest.raises(ConfigError, match=r"^config\.rl\.algorithm: 'my_module:' is not module:callable"):
        tiny_run_config().replace({"rl.algorithm": "my_module:"})


def test_per_reward_and_pairwise_diagnostics_by_hand():
    """Two rewards that disagree on every rollout of the first group, a third that agrees with the first."""
    rewards = jnp.asarray([[[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]], [[1.0, 1.0, 1.0], [0.0, 0.0, np.nan]]])
    out = compute_advantages(rewards, jnp.ones((2, 2), jnp.int32), "gdpo", reward_weights=jnp.asarray([1.0, 3.0, 1.0]))
    m = {k: float(v) for k, v in advantage_diagnostics(out, reward_names=("a", "b", "c")).items()}
    # A_a = +-0.707 in both groups; A_b = -+0.707, then +-0.707; A_c = A_a in group 0, 0 in group 1 (one value).
    assert m["conflict/a~b"] == pytest.approx(0.5)  # 2 of 4 rollouts
    assert m["conflict/a~c"] == 0.0 and m["conflict/b~c"] == pytest.approx(2 / 3)  # of the 3 with both
    # S = A_a + 3 A_b + A_c: b (weight 3) sets the sign: a and c oppose S on group 0.
    assert m["opposes_sum/a"] == pytest.approx(0.5) and m["opposes_sum/b"] == 0.0
    assert m["opposes_sum/c"] == pytest.approx(2 / 3)  # of its 3 present values
    assert m["reward_advantage_mean/a"] == pytest.approx(0.0, abs=1e-6)
    assert m["reward_advantage_std/a"] == pytest.approx(1 / np.sqrt(2), rel=1e-4)
    summed = np.asarray(out.summed)
    assert m["pre_batch_abs_mean"] == pytest.approx(np.abs(summed).mean(), rel=1e-5)
    assert m["post_batch_abs_mean"] == pytest.approx(float(jnp.mean(jnp.abs(out.advantages))), rel=1e-5)
    assert not [k for k in m if k.startswith("conflict/") and k not in ("conflict/a~b", "conflict/a~c", "conflict/b~c")]


def test_a_10x_jump_of_the_pre_batch_magnitude_is_warned_once_naming_both_steps(caplog):
    """The GDPO guidance's check: rewards whose scale jumps 100x at step 3 move S 100x without the group
    std (group_scale='none'): warned once, at step 3, naming steps 2 and 3; GDPO's group normalization
    keeps S scale-free (no warning)."""
    from gd2po_jax.rl.advantages import MagnitudeWatch

    rng = np.random.default_rng(0)
    base = rng.normal(size=(6, 4, 8, 2)).astype(np.float32)
    scales = [1.0, 1.0, 100.0, 100.0, 1.0, 1.0]
    lengths = jnp.full((4, 8), 3)

    def run(group_scale):
        watch, jumps = MagnitudeWatch(), {}
        for step, (rewards, scale) in enumerate(zip(base, scales), start=1):
            out = compute_advantages(jnp.asarray(rewards * scale), lengths, "gdpo", group_scale=group_scale)
            metrics = {f"advantages/{k}": float(v) for k, v in advantage_diagnostics(out).items()}
            jumps.update({step: v for v in watch.check(step, metrics).values()})
        return jumps

    with caplog.at_level("WARNING", logger="gd2po_jax.rl.advantages"):
        jumps = run("none")
    assert list(jumps) == [3] and jumps[3] > 10  # step 5 falls back 100x too: warned once only
    assert len(caplog.records) == 1
    assert "advantages/pre_batch_abs_mean changed" in caplog.text and "from step 2" in caplog.text
    assert "to step 3" in caplog.text
    assert run("group") == {}
