"""llama-perplexity's KL statistics: hand computations and independent implementations (numpy)."""
import math

import numpy as np
import pytest

from pytest_modeldiff.metrics import klstats


def test_mean_and_se_by_hand_and_llama_cpp_small_sample_rule():
    x = np.arange(1.0, 13.0)  # 12 values: mean 6.5, E[x^2] = 650/12
    mean, se = klstats.mean_and_se(x)
    assert mean == 6.5
    assert se == pytest.approx(math.sqrt((650 / 12 - 6.5 ** 2) / 11))
    assert klstats.mean_and_se(np.arange(10.0))[1] == 0.0  # llama.cpp: no uncertainty for n <= 10
    assert klstats.mean_and_se(np.full(20, 3.0)) == (3.0, 0.0)


def test_percentile_matches_numpy_linear_interpolation_and_the_median():
    values = np.random.default_rng(0).lognormal(size=1001)
    ordered = np.sort(values)
    for fraction in (0.0, 0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0):
        assert klstats.percentile(ordered, fraction) == pytest.approx(np.percentile(values, 100 * fraction))
    even = np.sort(values[:1000])
    assert klstats.percentile(even, 0.5) == pytest.approx(np.median(even))


def test_ppl_ratio_and_rms_dp_by_hand():
    ref_nll, cand_nll = np.log([2.0, 4.0]), np.log([4.0, 4.0])  # p(next) = 1/2, 1/4 vs 1/4, 1/4
    assert klstats.ppl_ratio(ref_nll, cand_nll) == pytest.approx(math.sqrt(16 / 8))  # exp(mean ln 4 - mean ln 2.83)
    assert klstats.dp(ref_nll, cand_nll) == pytest.approx([-0.25, 0.0])
    assert klstats.rms_dp(ref_nll, cand_nll) == pytest.approx(math.sqrt(0.25 ** 2 / 2))


def test_kl_stats_against_independent_formulas():
    rng = np.random.default_rng(1)
    n = 400
    ref_nll = rng.gamma(2.0, 1.0, n)
    cand_nll = ref_nll + rng.normal(0.05, 0.1, n)
    kld = rng.gamma(1.0, 0.01, n)
    same = (rng.random(n) < 0.9).astype(float)
    conf = rng.random(n)
    s = klstats.kl_stats(ref_nll, cand_nll, kld, same, conf)
    assert s.tokens == n
    assert s.ppl_ref == pytest.approx(np.exp(ref_nll.mean()))
    assert s.ppl_cand == pytest.approx(np.exp(cand_nll.mean()))
    assert s.ppl_cand_se == pytest.approx(s.ppl_cand * cand_nll.std() / math.sqrt(n - 1))
    # ln ratio: the uncertainty of a difference of correlated means
    cov = np.cov(cand_nll, ref_nll, bias=True)[0, 1] / (n - 1)
    expected = math.sqrt(cand_nll.var() / (n - 1) + ref_nll.var() / (n - 1) - 2 * cov)
    assert s.ln_ppl_ratio == pytest.approx(cand_nll.mean() - ref_nll.mean())
    assert s.ln_ppl_ratio_se == pytest.approx(expected)
    assert s.ppl_ratio == pytest.approx(math.exp(s.ln_ppl_ratio))
    assert s.nll_correlation == pytest.approx(np.corrcoef(cand_nll, ref_nll)[0, 1])
    assert s.kld_mean == pytest.approx(kld.mean()) and s.kld["median"] == pytest.approx(np.median(kld))
    assert s.kld["p99"] == pytest.approx(np.percentile(kld, 99)) and s.kld["max"] == kld.max()
    dp = np.exp(-cand_nll) - np.exp(-ref_nll)
    assert s.rms_dp == pytest.approx(np.sqrt(np.mean(dp ** 2)))
    assert s.dp["p25"] == pytest.approx(np.percentile(dp, 25))
    assert s.same_top == pytest.approx(same.mean())
    assert s.same_top_se == pytest.approx(math.sqrt(same.mean() * (1 - same.mean()) / (n - 1)))
    buckets = s.kld_by_confidence
    assert sum(b["tokens"] for b in buckets) == n
    assert buckets[0]["kld_mean"] == pytest.approx(kld[conf < 0.25].mean())
    assert klstats.kl_stats([], [], [], [], []) is None


def test_confidence_buckets_include_one_in_the_last_and_leave_empty_ones_empty():
    s = klstats.kl_stats([1.0, 1.0], [1.0, 1.0], [0.1, 0.3], [1.0, 1.0], [1.0, 0.25])
    tokens = [b["tokens"] for b in s.kld_by_confidence]
    assert tokens == [0, 1, 0, 0, 1]
    assert s.kld_by_confidence[4]["kld_mean"] == 0.1 and s.kld_by_confidence[2]["kld_mean"] is None


def test_kld_histogram_counts_every_value_once():
    h = klstats.kld_histogram([0.0, 1e-9, 1e-3, 1e-3, 0.5, 1e3, float("nan")], low=-8, high=2, per_decade=1)
    assert len(h["edges"]) == 11 and sum(h["counts"]) == 3
    assert h["counts"][5] == 2  # [1e-3, 1e-2)
    assert (h["below"], h["above"], h["nan"]) == (2, 1, 1)


def test_lines_print_llama_perplexity_layout():
    rng = np.random.default_rng(2)
    s = klstats.kl_stats(rng.random(50) + 1, rng.random(50) + 1, rng.random(50) / 10, np.ones(50), rng.random(50))
    text = "\n".join(klstats.lines(s))
    for label in ("Mean PPL(Q)", "Mean PPL(Q)/PPL(base)", "Mean    KLD:", "99.9%   KLD:", "Median  KLD:",
                  "Minimum KLD:", "RMS Δp    :", "Same top p: 100.000"):
        assert label in text
