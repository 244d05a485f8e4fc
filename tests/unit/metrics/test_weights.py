"""Weight metrics against a hand computation and an independent implementation (torch)."""
import math

import numpy as np
import pytest
import torch

from pytest_modeldiff.metrics import weights as wm


def test_hand_computed_small_tensor():
    r = np.array([[1.0, 2.0], [3.0, 4.0]])
    c = np.array([[1.0, 2.5], [3.0, 2.0]])  # d = [0, 0.5, 0, -2]
    m = wm.moments(r, c)
    s = wm.summary(m)
    assert s["l2"] == pytest.approx(math.sqrt(0.25 + 4))
    assert s["l1"] == pytest.approx(2.5)
    assert s["max_abs"] == 2.0
    assert s["mean_diff"] == pytest.approx(-1.5 / 4)
    assert s["rel"] == pytest.approx(math.sqrt(4.25 / 30))
    assert s["sqnr_db"] == pytest.approx(10 * math.log10(30 / 4.25))
    assert s["changed_fraction"] == 0.5
    rc, cc = 1 + 5 + 9 + 8, 1 + 6.25 + 9 + 4
    assert s["cos"] == pytest.approx(rc / math.sqrt(30 * cc))
    assert s["gain"] == pytest.approx(rc / 30)
    assert s["residual_after_gain"] == pytest.approx(math.sqrt(cc - rc ** 2 / 30) / math.sqrt(30))


def test_against_torch():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(300, 70)).astype(np.float32)
    c = (r * 1.01 + rng.normal(scale=0.05, size=r.shape)).astype(np.float32)
    s = wm.summary(wm.moments(r, c))
    tr, tc = torch.from_numpy(r).double(), torch.from_numpy(c).double()
    d = tc - tr
    assert s["l2"] == pytest.approx(torch.linalg.norm(d).item(), rel=1e-12)
    assert s["l1"] == pytest.approx(torch.linalg.norm(d.flatten(), ord=1).item(), rel=1e-12)
    assert s["cos"] == pytest.approx(torch.nn.functional.cosine_similarity(tr.flatten(), tc.flatten(), dim=0).item(),
                                     rel=1e-12)
    assert s["rel"] == pytest.approx((torch.linalg.norm(d) / torch.linalg.norm(tr)).item(), rel=1e-12)
    gain = torch.linalg.lstsq(tr.reshape(-1, 1), tc.reshape(-1, 1)).solution.item()  # c ~ g r
    assert s["gain"] == pytest.approx(gain, rel=1e-10)
    assert s["residual_after_gain"] == pytest.approx((torch.linalg.norm(tc - gain * tr) / torch.linalg.norm(tr)).item(),
                                                     rel=1e-8)


def test_chunks_add_up_to_the_whole():
    rng = np.random.default_rng(1)
    r, c = rng.normal(size=(50, 8)), rng.normal(size=(50, 8))
    whole = wm.moments(r, c)
    parts = wm.moments(r[:17], c[:17]) + wm.moments(r[17:], c[17:])
    for name in ("sum_d2", "sum_abs_d", "sum_d", "sum_r2", "sum_c2", "sum_rc"):
        assert getattr(parts, name) == pytest.approx(getattr(whole, name), rel=1e-12)
    assert (parts.n, parts.changed, parts.max_abs_d) == (whole.n, whole.changed, whole.max_abs_d)


def test_cosine_keeps_tiny_differences():
    """f16 rounding gives 1 - cos ~ 2e-8; computed as <r,c>/(|r||c|) in float64 that is at the
    edge of cancellation, the identity used keeps it to a few digits."""
    rng = np.random.default_rng(2)
    r = rng.normal(size=100_000)
    c = r.astype(np.float16).astype(np.float64)
    exact = np.sum((r / np.linalg.norm(r) - c / np.linalg.norm(c)) ** 2) / 2  # 1 - cos, no cancellation
    assert 1 - wm.cosine(wm.moments(r, c)) == pytest.approx(exact, rel=1e-6)


def test_identical_zero_and_nan_tensors():
    z = np.zeros(4)
    same = wm.summary(wm.moments(np.ones(4), np.ones(4)))
    assert (same["rel"], same["cos"], same["sqnr_db"], same["changed_fraction"]) == (0.0, 1.0, math.inf, 0.0)
    assert wm.summary(wm.moments(z, z))["cos"] == 1.0
    assert wm.relative_change(wm.moments(z, np.ones(4))) == math.inf
    bad = wm.moments(np.ones(4), np.array([1.0, np.nan, np.inf, 1.0]))
    assert bad.nonfinite == 2 and bad.changed == 2 and math.isnan(bad.max_abs_d)
    assert math.isnan((bad + wm.moments(z, z)).max_abs_d)


def test_norms_spot_a_permutation():
    rng = np.random.default_rng(3)
    rows = rng.uniform(1, 2, size=20)
    assert wm.norms_rel(rows, rows[::-1], sort=True) == 0.0 and wm.norms_rel(rows, rows[::-1]) > 0.1
    assert wm.norms_rel(rows, rows * 1.21, sort=True) == pytest.approx(0.1)  # squared norms: x1.1 in norm
    assert wm.norms_rel(rows, rows[:10]) == math.inf
