"""compare.py's statistics over training seeds: sign_flip_p, horizon, paired_by_seed, exact t quantiles, Holm's
correction and ceilings."""
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from lib import compare


def brute_force_p(d):
    obs = abs(np.mean(d))
    means = [abs(np.mean(np.multiply(s, d))) for s in itertools.product((1, -1), repeat=len(d))]
    return sum(m >= obs - 1e-9 * np.mean(np.abs(d)) for m in means) / len(means)


def test_sign_flip_p_equals_the_hand_count_of_sign_assignments():
    assert compare.sign_flip_p([1] * 6) == pytest.approx(2 / 64)  # only all + and all - reach |mean| 1
    assert compare.sign_flip_p([1] * 5 + [-1]) == pytest.approx(14 / 64)  # all one sign (2) + one flipped (2 * 6)
    assert compare.sign_flip_p([0.3, -0.1]) == 1.0  # means ±0.1 and ±0.2: all 4 reach 0.1 (a floating-point tie)


def test_sign_flip_p_is_1_when_the_differences_sum_to_0_up_to_rounding():
    # accuracies out of 40: the sum is ~1e-17, not 0; a tolerance relative to it dropped true ties (p was 0.89)
    d = [-0.05, -0.05, 0.025, 0.025, 0.05, -0.05, 0.05]
    assert compare.sign_flip_p(d) == 1.0
    exact = [Fraction(round(x * 40), 40) for x in d]  # the brute force in exact arithmetic
    count = sum(abs(sum(s * x for s, x in zip(signs, exact))) >= abs(sum(exact))
                for signs in itertools.product((1, -1), repeat=len(d)))
    assert count == 2 ** len(d)


def test_sign_flip_p_of_5_seeds_cannot_reach_5_percent():
    assert compare.sign_flip_p([1] * 5) == pytest.approx(2 / 32)


def test_sign_flip_p_of_nothing_is_nan_and_of_zeros_is_1():
    assert math.isnan(compare.sign_flip_p([]))
    assert compare.sign_flip_p([0.0] * 4) == 1.0


def test_sign_flip_p_equals_a_brute_force_count_with_itertools():
    d = np.random.default_rng(1).normal(0.3, 1.0, 8)
    assert compare.sign_flip_p(d) == pytest.approx(brute_force_p(d))
    assert compare.sign_flip_p(np.round(d, 1)) == pytest.approx(brute_force_p(np.round(d, 1)))  # with ties


def test_sign_flip_p_monte_carlo_beyond_20_seeds():
    # 25 equal positive differences: only 2 of 2^25 assignments reach the observed mean, so no draw should
    assert compare.sign_flip_p([0.5] * 25) <= 2 / 65537
    # symmetric around 0: the observed mean is 0 and every assignment reaches it
    sym = np.concatenate([np.arange(1, 13), -np.arange(1, 13), [0.0]])
    assert compare.sign_flip_p(sym) == pytest.approx(1.0, abs=0.01)
    # one seed flipped out of 25 equal values: exact p = 2 * (1 + 25 + 300) / 2^25 ~ 2e-5 -> at most a few draws
    assert compare.sign_flip_p([1.0] * 24 + [-1.0]) < 0.01


def test_horizon_is_the_last_length_before_the_first_failure():
    assert compare.horizon([32, 64, 128, 256], [1.0, 0.97, 0.9, 0.99]) == 64  # the recovery at 256 does not count
    assert compare.horizon([256, 32, 128, 64], [0.99, 1.0, 0.9, 0.97]) == 64  # unsorted input
    assert compare.horizon([32, 64], [0.9, 1.0]) == 0  # the shortest fails
    assert compare.horizon([32, 64, 128], [0.95, 0.96, 1.0]) == 128  # all pass (0.95 is enough)
    assert compare.horizon([32, 64, 128], [1.0, 0.8, 0.7], threshold=0.75) == 64
    assert compare.horizon([32, 64], [1.0, float("nan")]) == 32  # a missing score fails


def test_paired_by_seed_pairs_values_by_seed_and_drops_unpaired_seeds():
    a = {3: 0.9, 1: 0.8, 2: 0.7, 7: 0.5}  # seed 7 has no baseline
    b = {2: 0.6, 1: 0.5, 3: 0.85, 9: 0.1}  # seed 9 has no setting
    r = compare.paired_by_seed(a, b)
    assert r["seeds"] == [1, 2, 3] and r["n"] == 3
    assert r["diffs"] == pytest.approx([0.3, 0.1, 0.05])
    mean, sd, lo, hi = compare.seed_interval(r["diffs"])
    assert (r["mean_diff"], r["sd"], r["ci_lo"], r["ci_hi"]) == (mean, sd, lo, hi)
    assert r["mean_diff"] == pytest.approx(0.15)
    assert r["sign_flip_p"] == pytest.approx(2 / 8)  # all positive, distinct: only all + and all - reach the mean


def test_paired_by_seed_with_no_common_seed_is_empty():
    r = compare.paired_by_seed({1: 0.5}, {2: 0.4})
    assert r["n"] == 0 and r["seeds"] == [] and r["diffs"] == []
    assert all(math.isnan(r[k]) for k in ("mean_diff", "sd", "ci_lo", "ci_hi", "sign_flip_p"))


@pytest.mark.parametrize("df,exact", [
    (1, 12.7062047361747),  # tan(0.475 pi): the Cauchy quantile
    (5, 2.57058183563632), (11, 2.20098516009164), (12, 2.17881282966723), (15, 2.13144954555978),
    (29, 2.04522964213270), (100, 1.98397151852355)])  # solved from the t CDF (incomplete beta) with mpmath, 30 digits
def test_t_quantiles_are_exact_for_every_df(df, exact):
    assert compare.t975(df) == pytest.approx(exact, abs=1e-12)  # scipy's
    assert compare._t975(df) == pytest.approx(exact, abs=1e-10)  # without scipy (the lent GPU's image)
    mean, sd, lo, hi = compare.seed_interval(np.arange(df + 1.0))
    assert hi - mean == pytest.approx(exact * sd / math.sqrt(df + 1), rel=1e-12)


def test_holm_on_a_hand_computed_family():
    # sorted 0.01, 0.02, 0.03, 0.04 (m = 4): x 4, 3, 2, 1 = 0.04, 0.06, 0.06, 0.04 -> running max 0.04, 0.06, 0.06, 0.06
    assert compare.holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    # step-down: 0.01 < 0.05 / 4 rejects; 0.02 > 0.05 / 3 stops it, so the 0.04s are kept though 0.04 < 0.05 / 2
    assert [h < 0.05 for h in compare.holm([0.01, 0.02, 0.04, 0.04])] == [True, False, False, False]
    assert compare.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    h = compare.holm([0.002, math.nan, 0.03])  # nan: not in the family (m = 2)
    assert h[0] == pytest.approx(0.004) and math.isnan(h[1]) and h[2] == pytest.approx(0.03)
    assert compare.holm([]) == []


def test_both_settings_at_a_bound_on_every_seed_is_a_ceiling_not_an_equivalence():
    r = compare.paired_by_seed({0: 1.0, 1: 1.0, 2: 1.0}, {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.5}, bounds=(0.0, 1.0))
    assert r["at_bound"] == 1.0 and r["ci_lo"] == r["ci_hi"] == 0.0  # the interval is [0, 0] by construction
    assert compare.paired_by_seed({0: 0.0, 1: 0.0}, {0: 0.0, 1: 0.0}, bounds=(0.0, 1.0))["at_bound"] == 0.0
    assert compare.paired_by_seed({0: 1.0, 1: 1.0}, {0: 1.0, 1: 0.98}, bounds=(0.0, 1.0))["at_bound"] is None
    assert compare.paired_by_seed({0: 0.7, 1: 0.7}, {0: 0.7, 1: 0.7}, bounds=(0.0, 1.0))["at_bound"] is None
    assert compare.paired_by_seed({0: 1.0}, {0: 1.0})["at_bound"] is None  # no bounds given: never


def test_the_committed_verdicts_exact_p_at_10_seeds_holm_ties_and_t_interval_against_scipy():
    # the synthetic suite's 10 seeds: every seed better -> only all + and all - reach the mean, p = 2 / 2^10; FIRST
    # at 128 N (2 seeds tie at 1.000, their signs are free): 2 x 2^2 / 2^10 = 2 / 2^8 = 0.0078125 (RESULTS.md)
    d = np.linspace(0.05, 0.9, 10)
    assert compare.sign_flip_p(d) == 2 / 1024
    assert compare.sign_flip_p([*d[:8], 0.0, 0.0]) == 2 / 256
    assert compare.sign_flip_p([*d[1:], -d[0]]) == 4 / 1024  # the smallest flipped: it and all + (and mirrors)
    stats = pytest.importorskip("scipy.stats")
    for x in (d, [*d[:7], -0.3, 0.0, 0.0], np.round(np.random.default_rng(2).normal(0.1, 0.3, 10), 2)):
        exact = stats.permutation_test((np.asarray(x),), np.mean, permutation_type="samples", n_resamples=np.inf)
        assert compare.sign_flip_p(x) == pytest.approx(exact.pvalue, abs=1e-12)
        ci = stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
        assert compare.seed_interval(x)[2:] == pytest.approx((ci.low, ci.high), abs=1e-12)
    # ties share one adjusted p whatever their order: FIRST's table, 9 rows at 2/256 and one at 0.125 -> 10 x 2/256
    assert compare.holm([0.125, *[2 / 256] * 9]) == pytest.approx([0.125, *[0.078125] * 9])
    assert compare.holm([0.02, 0.5, 0.02, 0.02]) == pytest.approx([0.08, 0.5, 0.08, 0.08])  # 4 x, 3 x, 2 x -> max


def test_paired_is_values_minus_base_seed_by_seed():
    mean, sd, lo, hi, p = compare.paired([0.9, 0.7, 0.8], [0.5, 0.6, 0.2])  # differences 0.4, 0.1, 0.6
    assert mean == pytest.approx(1.1 / 3) and p == pytest.approx(2 / 8)
    assert (sd, lo, hi) == pytest.approx(compare.seed_interval([0.4, 0.1, 0.6])[1:])


def test_holm_caps_an_adjusted_p_above_1_at_1():
    assert compare.holm([0.6, 0.9]) == [1.0, 1.0]  # 2 x 0.6 = 1.2 and the running max carries it to 0.9's row


def test_sign_flip_p_is_exact_up_to_20_seeds_and_a_monte_carlo_p_counts_the_observed_assignment():
    assert compare.sign_flip_p([1.0] * 20) == 2 / 2**20  # exact: all + and all -, not a Monte Carlo estimate
    # 25 seeds: no draw reaches the observed mean, and the observed assignment itself counts: (1 + 0) / (1 + draws)
    assert compare.sign_flip_p([0.5] * 25) == 1 / (1 + 2**16)
