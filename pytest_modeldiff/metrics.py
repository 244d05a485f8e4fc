"""Logit metrics: small pure numpy functions, one formula each.

Inputs are logits of shape (n_positions, n_vocab) (a single vector is treated as one position);
``ref`` is the reference model (p = softmax(ref)), ``cand`` the candidate (q = softmax(cand)).
Per-position functions return float64 arrays of length n_positions; pooled functions return a
float. Work is done in float64 so that tiny differences (f32 vs f16) are not rounding noise.
"""
from __future__ import annotations

import numpy as np


def _2d(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x[None, :] if x.ndim == 1 else x


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log_softmax(x)_i = x_i - max(x) - log(sum_j exp(x_j - max(x))), per row."""
    x = _2d(logits)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def kl_divergence(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """KL(ref || cand) per position: sum_i p_i (log p_i - log q_i), in nats.

    This is llama-perplexity's direction (base = reference); exllamav2 uses the reverse.
    """
    log_p, log_q = log_softmax(ref), log_softmax(cand)
    return np.maximum((np.exp(log_p) * (log_p - log_q)).sum(axis=-1), 0.0)


def max_abs_diff(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """max_i |cand_i - ref_i| per position."""
    return np.abs(_2d(cand) - _2d(ref)).max(axis=-1)


def top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits per row, largest first (equal values: lower id first)."""
    x = _2d(logits)
    part = np.argpartition(-x, kth=min(k, x.shape[-1] - 1), axis=-1)[:, :k]
    order = np.lexsort((part, -np.take_along_axis(x, part, axis=-1)), axis=-1)
    return np.take_along_axis(part, order, axis=-1)


def topk_overlap(ref: np.ndarray, cand: np.ndarray, k: int = 10) -> np.ndarray:
    """Set overlap per position: |topk(ref) & topk(cand)| / k (order ignored)."""
    a, b = top_k_ids(ref, k), top_k_ids(cand, k)
    return np.array([len(set(x) & set(y)) / k for x, y in zip(a.tolist(), b.tolist())])


def topk_agreement(ref: np.ndarray, cand: np.ndarray, k: int = 1) -> np.ndarray:
    """Ordered agreement per position (exllamav2): 1.0 iff the first k ids are equal in order.

    k = 1 is "same top": argmax(cand) == argmax(ref).
    """
    return (top_k_ids(ref, k) == top_k_ids(cand, k)).all(axis=-1).astype(np.float64)


def nmse(ref: np.ndarray, cand: np.ndarray) -> float:
    """llama.cpp check-nmse.py: mean((cand - ref)^2) / var(ref), var with ddof=0, over all elements.

    0 when both are equal; inf when ref is constant and cand differs.
    """
    return nmse_pooled(*logit_moments(ref, cand), n_vocab=_2d(ref).shape[-1])


def logit_moments(ref: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-position sums from which NMSE can be pooled over any subset of positions later:
    sse_t = sum_i (cand_ti - ref_ti)^2, ref_sum_t = sum_i ref_ti, ref_sumsq_t = sum_i ref_ti^2.
    """
    r, c = _2d(ref), _2d(cand)
    return ((c - r) ** 2).sum(-1), r.sum(-1), (r * r).sum(-1)


def nmse_pooled(sse, ref_sum, ref_sumsq, n_vocab: int) -> float:
    """NMSE over the positions given: N = n_positions * n_vocab elements,
    mse = sum(sse) / N, var = sum(ref_sumsq) / N - (sum(ref_sum) / N)^2, nmse = mse / var.
    """
    n = float(len(sse) * n_vocab)
    mse = float(np.sum(sse)) / n
    mean = float(np.sum(ref_sum)) / n
    var = max(float(np.sum(ref_sumsq)) / n - mean * mean, 0.0)
    if var == 0.0:
        return 0.0 if mse == 0.0 else float("inf")
    return mse / var


def nmse_db(value: float) -> float:
    """NMSE in decibels: 10 log10(nmse) (-inf for a perfect match)."""
    return float("-inf") if value <= 0 else 10.0 * float(np.log10(value))


# llama.cpp check-nmse.py interpretation bands: (upper bound, verdict)
NMSE_BANDS = [
    (1e-6, "essentially identical"),
    (1e-4, "excellent"),
    (1e-3, "very good"),
    (1e-2, "good"),
    (1e-1, "acceptable"),
    (1.0, "poor"),
]


def nmse_verdict(value: float) -> str:
    """llama.cpp's verdict band for an NMSE value."""
    if value == 0:
        return "perfect"
    for bound, verdict in NMSE_BANDS:
        if value < bound:
            return verdict
    return "very poor (worse than noise)"
