"""Metrics against hand computations and independent implementations (torch)."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pytest_modeldiff.metrics import logits as metrics

rng = np.random.default_rng(0)


def test_kl_divergence_by_hand():
    ref = np.array([0.0, math.log(3.0)])  # p = [1/4, 3/4]
    cand = np.array([0.0, 0.0])  # q = [1/2, 1/2]
    expected = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert metrics.kl_divergence(ref, cand)[0] == pytest.approx(expected, rel=1e-12)


def test_kl_divergence_matches_torch_kl_div_and_direction():
    ref, cand = rng.normal(0, 3, (5, 1000)), rng.normal(0, 3, (5, 1000))
    # F.kl_div(input=log q, target=log p, log_target=True) = sum p (log p - log q) = KL(p || q)
    expected = F.kl_div(torch.log_softmax(torch.tensor(cand), -1), torch.log_softmax(torch.tensor(ref), -1),
                        reduction="none", log_target=True).sum(-1).numpy()
    np.testing.assert_allclose(metrics.kl_divergence(ref, cand), expected, rtol=1e-10)
    reverse = metrics.kl_divergence(cand, ref)
    assert not np.allclose(reverse, expected), "KL is not symmetric: the direction must be ref || cand"
    assert metrics.kl_divergence(ref, ref) == pytest.approx(np.zeros(5), abs=1e-12)


def test_kl_divergence_is_shift_invariant_and_stable_for_large_logits():
    ref = rng.normal(0, 1, (3, 50))
    np.testing.assert_allclose(metrics.kl_divergence(ref, ref + 1000.0), 0.0, atol=1e-9)


def test_nmse_matches_llama_cpp_formula_and_bands():
    ref, cand = rng.normal(0, 2, 4096), None
    cand = ref + rng.normal(0, 0.02, 4096)
    expected = np.mean((cand - ref) ** 2) / np.var(ref)  # check-nmse.py, verbatim formula
    assert metrics.nmse(ref, cand) == pytest.approx(expected, rel=1e-9)
    assert metrics.nmse(ref, ref) == 0.0
    assert metrics.nmse(np.ones(4), np.zeros(4)) == math.inf
    assert metrics.nmse_db(1e-3) == pytest.approx(-30.0)
    assert metrics.nmse_verdict(expected) == "excellent"
    assert metrics.nmse_verdict(0.05) == "acceptable"
    assert metrics.nmse_verdict(2.0).startswith("very poor")


def test_pooled_nmse_equals_nmse_of_concatenation():
    ref, cand = rng.normal(1, 2, (6, 300)), rng.normal(1, 2, (6, 300))
    moments = metrics.logit_moments(ref, cand)
    pooled = metrics.nmse_pooled(*moments, n_vocab=300)
    assert pooled == pytest.approx(metrics.nmse(ref.ravel(), cand.ravel()), rel=1e-9)
    subset = [m[[1, 4]] for m in moments]
    assert metrics.nmse_pooled(*subset, n_vocab=300) == pytest.approx(
        metrics.nmse(ref[[1, 4]].ravel(), cand[[1, 4]].ravel()), rel=1e-9)


def test_top_k_ids_match_a_full_numpy_sort():
    x = rng.normal(0, 1, (7, 5000)).astype(np.float32)
    np.testing.assert_array_equal(metrics.top_k_ids(x, 10), np.argsort(-x, axis=-1, kind="stable")[:, :10])


def test_overlap_of_ids_matches_python_sets():
    a = np.array([rng.permutation(30)[:10] for _ in range(50)])  # ids within a row are distinct
    b = np.array([rng.permutation(30)[:10] for _ in range(50)])
    expected = [len(set(x) & set(y)) / 10 for x, y in zip(a.tolist(), b.tolist())]
    np.testing.assert_allclose(metrics.overlap_of_ids(a, b), expected)


def test_topk_overlap_and_agreement_by_hand():
    ref = np.array([[5.0, 4.0, 3.0, 2.0, 1.0]])
    swapped = np.array([[4.0, 5.0, 3.0, 2.0, 1.0]])  # same top-2 set, other order
    other = np.array([[1.0, 2.0, 3.0, 4.0, 5.0]])
    assert metrics.topk_overlap(ref, swapped, k=2)[0] == 1.0
    assert metrics.topk_agreement(ref, swapped, k=2)[0] == 0.0
    assert metrics.topk_agreement(ref, swapped, k=3)[0] == 0.0
    assert metrics.topk_overlap(ref, other, k=2)[0] == 0.0
    assert metrics.topk_overlap(ref, other, k=3)[0] == pytest.approx(1 / 3)
    assert metrics.topk_agreement(ref, ref, k=5)[0] == 1.0


def test_top_k_ids_order_ties_by_id_inside_and_at_the_cut():
    x = np.array([[1.0, 3.0, 3.0, 0.0, 3.0],     # three-way tie at the top: ids 1, 2, 4
                  [5.0, 1.0, 2.0, 2.0, 2.0]])    # tie across the cut at k = 2: id 2 makes it
    np.testing.assert_array_equal(metrics.top_k_ids(x, 2), [[1, 2], [0, 2]])
    np.testing.assert_array_equal(metrics.top_k_ids(x, 5), np.argsort(-x, axis=-1, kind="stable"))


def test_top_k_ids_with_many_ties_match_a_stable_sort_of_the_whole_row():
    """Tied rows take the ids from the entries at or above the cut only: the same ids as sorting all."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 40, size=(64, 3000)).astype(np.float32)  # ties everywhere, also at the cut
    x[5, 7] = np.nan  # a NaN row is sorted whole
    expected = torch.sort(torch.as_tensor(x), descending=True, stable=True).indices[:, :21].numpy()
    np.testing.assert_array_equal(metrics.top_k_ids(x, 21), expected)


def test_target_rank_and_topk_accuracy_by_hand_with_ties():
    logits = np.array([[0.0, 2.0, 1.0, 2.0],    # target 3 ties with id 1 for the top: rank 0
                       [3.0, 2.0, 2.0, 1.0],    # target 2 ties with id 1 behind id 0: rank 1
                       [1.0, 1.0, 1.0, 1.0],    # everything tied: rank 0
                       [4.0, 3.0, 2.0, 1.0]])   # target 3 is last: rank 3
    targets = [3, 2, 0, 3]
    ranks = metrics.target_rank(logits, targets)
    np.testing.assert_array_equal(ranks, [0, 1, 0, 3])
    assert [metrics.topk_accuracy(ranks, k) for k in (1, 2, 3, 4)] == [0.5, 0.75, 0.75, 1.0]


def test_target_nll_and_perplexity_match_torch_cross_entropy():
    logits, targets = rng.normal(0, 3, (6, 300)), rng.integers(0, 300, 6)
    expected = F.cross_entropy(torch.tensor(logits), torch.tensor(targets), reduction="none").numpy()
    np.testing.assert_allclose(metrics.target_nll(logits, targets), expected, rtol=1e-10)
    assert metrics.perplexity(expected) == pytest.approx(math.exp(expected.mean()), rel=1e-12)
    uniform = np.zeros((3, 7))  # every token equally likely: perplexity = vocabulary size
    assert metrics.perplexity(metrics.target_nll(uniform, [0, 3, 6])) == pytest.approx(7.0, rel=1e-12)


def test_prob_mse_by_hand_and_against_torch_mse_loss():
    ref, cand = np.array([0.0, math.log(3.0)]), np.array([0.0, 0.0])  # p = [1/4, 3/4], q = [1/2, 1/2]
    assert metrics.prob_mse(ref, cand)[0] == pytest.approx((0.25 ** 2 + 0.25 ** 2) / 2, rel=1e-12)
    ref, cand = rng.normal(0, 3, (5, 1000)), rng.normal(0, 3, (5, 1000))
    expected = F.mse_loss(torch.softmax(torch.tensor(ref), -1), torch.softmax(torch.tensor(cand), -1)).item()
    assert float(np.mean(metrics.prob_mse(ref, cand))) == pytest.approx(expected, rel=1e-10)
    assert metrics.prob_mse(ref, ref + 5.0) == pytest.approx(np.zeros(5), abs=1e-15)


def test_max_abs_diff():
    values, ids = metrics.max_abs_diff(np.array([1.0, -2.0, 3.0]), np.array([1.5, -4.0, 3.0]))
    assert (values[0], ids[0]) == (2.0, 1)


# --------------------------------------------------------------------------- hidden states
def test_hidden_metrics_by_hand():
    ref = np.array([[[3.0, 4.0], [0.0, 1.0]]])  # one state, two tokens; ||ref||_F^2 = 26
    cand = np.array([[[3.0, 4.0], [1.0, 1.0]]])  # differs by 1 in one element
    assert metrics.relative_frobenius(ref, cand)[0] == pytest.approx(np.sqrt(1 / 26))
    # token 0 identical (cos 1), token 1: <(0,1),(1,1)> / (1 * sqrt 2) = 1 / sqrt 2
    assert metrics.cosine_error(ref, cand)[0] == pytest.approx(1 - (1 + 1 / np.sqrt(2)) / 2)
    assert metrics.sqnr_db(26.0, 1.0) == pytest.approx(10 * np.log10(26))
    assert metrics.relative_frobenius(ref, ref)[0] == 0 and metrics.sqnr_db(26.0, 0.0) == np.inf


def test_hidden_metrics_against_independent_implementations():
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(5, 7, 16))
    cand = ref + rng.normal(scale=0.1, size=ref.shape)
    expected_rfn = [np.linalg.norm(c - r) / np.linalg.norm(r) for r, c in zip(ref, cand)]
    np.testing.assert_allclose(metrics.relative_frobenius(ref, cand), expected_rfn, rtol=1e-10)
    cos = torch.nn.functional.cosine_similarity(torch.from_numpy(ref).double(), torch.from_numpy(cand).double(), dim=-1)
    np.testing.assert_allclose(metrics.cosine_error(ref, cand), 1 - cos.mean(-1).numpy(), rtol=1e-10)
    sq_diff, sq_ref, _ = metrics.hidden_moments(ref, cand)
    np.testing.assert_allclose(metrics.rfn_from_moments(sq_diff, sq_ref), expected_rfn, rtol=1e-10)


def test_fraction_upper_bound_hand_values_and_binomial_tail():
    n = 7
    assert metrics.fraction_upper_bound(0, n) == pytest.approx(1 - 0.05 ** (1 / n), abs=1e-12)  # closed form
    assert metrics.fraction_upper_bound(n - 1, n) == pytest.approx(0.95 ** (1 / n), abs=1e-12)
    assert metrics.fraction_upper_bound(n, n) == 1.0 and metrics.fraction_upper_bound(0, 0) == 1.0
    # independently: the binomial tail summed with exact integers at the bound is 1 - confidence
    for k in (1, 3, 5):
        p = metrics.fraction_upper_bound(k, n)
        tail = sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))
        assert tail == pytest.approx(0.05, abs=1e-9)
    assert metrics.fraction_upper_bound(3, 7) == pytest.approx(0.7747, abs=1e-4)  # Beta(4, 4) 95th percentile
    assert metrics.fraction_upper_bound(280, 400) < 0.74  # many samples: close to the point value 0.70
