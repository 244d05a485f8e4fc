"""Logit metrics: small pure functions, one formula each.

Inputs are logits of shape (n_positions, n_vocab) (a single vector is treated as one position),
numpy arrays or torch tensors; ``ref`` is the reference model (p = softmax(ref)), ``cand`` the
candidate (q = softmax(cand)). Per-position functions return float64 numpy arrays of length
n_positions; pooled functions return a float. Arithmetic is float64 so that tiny differences
(f32 vs f16) are not rounding noise; torch runs the reductions (multi-threaded, no extra copies).
"""
from __future__ import annotations

import math

import numpy as np
import torch


def _2d(x, dtype=torch.float64) -> torch.Tensor:
    if isinstance(x, np.ndarray) and not x.flags.writeable:  # read-only memmap (dumps)
        x = np.array(x)
    t = torch.as_tensor(x)
    t = t[None, :] if t.ndim == 1 else t
    return t.to(dtype)


def kl_divergence(ref, cand) -> np.ndarray:
    """KL(ref || cand) per position: sum_i p_i (log p_i - log q_i), in nats.

    This is llama-perplexity's direction (base = reference); exllamav2 uses the reverse.
    """
    return kl_and_prob_mse(*log_probs(ref, cand))[0]


def prob_mse(ref, cand) -> np.ndarray:
    """Probability MSE per position: mean_i (p_i - q_i)^2 over the vocabulary (exllamav2's MSE).

    Pooled over positions by a plain mean, this is mse_loss(softmax(ref), softmax(cand)).
    """
    return kl_and_prob_mse(*log_probs(ref, cand))[1]


def log_probs(ref, cand) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax of both sides, float64: computed once and shared by the functions below."""
    return torch.log_softmax(_2d(ref), -1), torch.log_softmax(_2d(cand), -1)


def kl_and_prob_mse(log_p: torch.Tensor, log_q: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per row, from log probabilities: KL = sum_i p_i (log p_i - log q_i) (kl_divergence) and
    mean_i (p_i - q_i)^2 (prob_mse); p and q are exponentiated once for both."""
    p, q = log_p.exp(), log_q.exp()
    kl = torch.linalg.vecdot(p, log_p - log_q).clamp_min(0.0)  # a row dot product: one temporary less
    return kl.numpy(), p.sub_(q).square_().mean(-1).numpy()  # in place: p is not needed any more


def target_nll(logits, targets) -> np.ndarray:
    """Negative log-likelihood of each position's target (next) token: -log softmax(logits)[target]."""
    return nll_from_log_probs(torch.log_softmax(_2d(logits), -1), targets)


def nll_from_log_probs(log_p: torch.Tensor, targets) -> np.ndarray:
    """-log_p[t, targets[t]] per row."""
    index = torch.as_tensor(np.asarray(targets), dtype=torch.int64)[:, None]
    return (-log_p.gather(-1, index)[:, 0]).numpy()


def target_rank(logits, targets) -> np.ndarray:
    """Per position, how many logits are strictly larger than the target token's:
    rank[t] = |{i : logits[t, i] > logits[t, targets[t]]}|. The target is among the model's top K
    iff rank < K; a tie with the target counts in the target's favour, so the result does not
    depend on how a top-k routine orders equal values."""
    x = _2d(logits, torch.float32)
    index = torch.as_tensor(np.asarray(targets), dtype=torch.int64)[:, None]
    return (x > x.gather(-1, index)).sum(-1).numpy()


def topk_accuracy(ranks, k: int) -> float:
    """Fraction of positions whose target is among the top k: mean(rank < k) (see target_rank)."""
    return float(np.mean(np.asarray(ranks) < k))


def perplexity(nll) -> float:
    """exp(mean negative log-likelihood of the targets)."""
    return float(np.exp(np.mean(nll)))


def max_abs_diff(ref, cand) -> tuple[np.ndarray, np.ndarray]:
    """max_i |cand_i - ref_i| per position, and the vocabulary id i where it occurs."""
    values, ids = (_2d(cand) - _2d(ref)).abs().max(-1)
    return values.numpy(), ids.numpy()


def top_k_ids(logits, k: int) -> np.ndarray:
    """Ids of the k largest logits per row, largest first; equal logits in id order (lowest
    first), like a stable descending sort, so ties give the same ids on every platform."""
    x = _2d(logits, torch.float32)
    k = min(k, x.shape[-1])
    values, ids = torch.topk(x, min(k + 1, x.shape[-1]), dim=-1, sorted=True)
    # topk leaves the order of equal values (and which of them makes the cut) unspecified: rows
    # with a tie among the k kept or between the k-th and the next are redone with a stable sort.
    for row in torch.nonzero((values[:, 1:] == values[:, :-1]).any(-1))[:, 0].tolist():
        ids[row] = _stable_top(x[row], values[row, -1], ids.shape[-1])
    return ids[:, :k].numpy()


def _stable_top(row: torch.Tensor, last: torch.Tensor, n: int) -> torch.Tensor:
    """The first n ids of a stable descending sort of ``row``, ``last`` being its n-th largest
    value: only the entries >= last can be among them, so only those are sorted (ascending ids
    in, so the stable sort keeps equal values in id order). A row with NaN is sorted whole."""
    if torch.isnan(row).any():
        return torch.sort(row, descending=True, stable=True).indices[:n]
    keep = torch.nonzero(row >= last)[:, 0]
    return keep[torch.sort(row[keep], descending=True, stable=True).indices[:n]]


def topk_overlap(ref, cand, k: int = 10) -> np.ndarray:
    """Set overlap per position: |topk(ref) & topk(cand)| / k (order ignored)."""
    return overlap_of_ids(top_k_ids(ref, k), top_k_ids(cand, k))


def overlap_of_ids(ref_ids: np.ndarray, cand_ids: np.ndarray) -> np.ndarray:
    """|set(ref_ids[t]) & set(cand_ids[t])| / k per row of two (n, k) id arrays."""
    k = ref_ids.shape[-1]
    return (ref_ids[:, :, None] == cand_ids[:, None, :]).any(-1).sum(-1) / k


def topk_agreement(ref, cand, k: int = 1) -> np.ndarray:
    """Ordered agreement per position (exllamav2): 1.0 iff the first k ids are equal in order.

    k = 1 is "same top": argmax(cand) == argmax(ref).
    """
    return agreement_of_ids(top_k_ids(ref, k), top_k_ids(cand, k))


def agreement_of_ids(ref_ids: np.ndarray, cand_ids: np.ndarray) -> np.ndarray:
    """1.0 per row where two (n, k) id arrays are equal element by element (same ids, same order)."""
    return (ref_ids == cand_ids).all(axis=-1).astype(np.float64)


def fraction_upper_bound(successes: int, n: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound of a success probability seen as ``successes`` of
    ``n``: the p with P(X <= successes | n, p) = 1 - confidence, X ~ Binomial(n, p); 1 when
    successes = n. Closed forms: 1 - (1 - confidence)^(1/n) for 0 successes, confidence^(1/n) for
    n - 1. A fraction over 7 sequences is judged by this, not by its noisy point value."""
    if n <= 0 or successes >= n:
        return 1.0
    alpha = 1.0 - confidence

    def cdf(p: float) -> float:  # P(X <= successes), summed in log space (n may be large)
        logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                + (i * math.log(p) if i else 0.0) + (n - i) * math.log1p(-p) for i in range(successes + 1)]
        top = max(logs)
        return math.exp(top) * sum(math.exp(x - top) for x in logs)

    low, high = successes / n, 1.0  # cdf falls from >= 0.5-ish at the point value to 0 at 1
    for _ in range(60):
        mid = (low + high) / 2
        if cdf(mid) > alpha:
            low = mid
        else:
            high = mid
    return high


def nmse(ref, cand) -> float:
    """llama.cpp check-nmse.py: mean((cand - ref)^2) / var(ref), var with ddof=0, over all elements.

    0 when both are equal; inf when ref is constant and cand differs.
    """
    return nmse_pooled(*logit_moments(ref, cand), n_vocab=_2d(ref).shape[-1])


def logit_moments(ref, cand) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-position sums from which NMSE can be pooled over any subset of positions later:
    sse_t = sum_i (cand_ti - ref_ti)^2, ref_sum_t = sum_i ref_ti, ref_sumsq_t = sum_i ref_ti^2.
    """
    r, c = _2d(ref), _2d(cand)
    return ((c - r) ** 2).sum(-1).numpy(), r.sum(-1).numpy(), (r * r).sum(-1).numpy()


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


# --------------------------------------------------------------------------- hidden states
# Inputs of shape (n_states, n_tokens, n_embd): one matrix per layer boundary (embedding, each
# decoder layer's output, final norm); outputs have one value per state.
def _3d(x) -> torch.Tensor:
    t = _2d(x)
    return t[None] if t.ndim == 2 else t


def relative_frobenius(ref, cand) -> np.ndarray:
    """rfn per state: ||cand - ref||_F / ||ref||_F (exllamav2's relative error; 0 = identical)."""
    sq_diff, sq_ref = hidden_moments(ref, cand)[:2]
    return rfn_from_moments(sq_diff, sq_ref)


def cosine_error(ref, cand) -> np.ndarray:
    """Per state: 1 - mean over tokens t of cos(ref_t, cand_t), cos = <a, b> / (|a| |b|)."""
    return 1.0 - hidden_moments(ref, cand)[2]


def hidden_moments(ref, cand) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per state: sum (cand - ref)^2, sum ref^2, and the mean over tokens of cos(ref_t, cand_t)
    (a zero vector has cosine 1 with itself, 0 with anything else). Sums pool over sequences.
    One state at a time: the float64 copies and temporaries are one state's, not every layer's."""
    ref, cand = (x[None] if np.ndim(x) == 2 else x for x in (ref, cand))
    parts = []
    for k in range(len(ref)):
        r, c = _3d(ref[k]), _3d(cand[k])
        norms = r.norm(dim=-1) * c.norm(dim=-1)
        d = c - r
        cos = torch.where(norms > 0, (r * c).sum(-1) / norms.clamp_min(1e-300), (d == 0).all(-1).to(r.dtype))
        parts.append(((d * d).sum(), (r * r).sum(), cos.mean()))
    return tuple(np.array([float(p[i]) for p in parts]) for i in range(3))


def rfn_from_moments(sq_diff, sq_ref) -> np.ndarray:
    """sqrt(sum (cand - ref)^2 / sum ref^2); 0 for identical zeros, inf if only ref is zero."""
    sq_diff, sq_ref = np.asarray(sq_diff, dtype=np.float64), np.asarray(sq_ref, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.sqrt(sq_diff / sq_ref)
    return np.where(sq_diff == 0, 0.0, out)


def sqnr_db(sq_ref, sq_diff) -> np.ndarray:
    """Signal to quantization-noise ratio, 10 log10(sum ref^2 / sum (cand - ref)^2), in dB
    (exllamav3); +inf when identical. Higher is better: 20 dB = 10 % relative error."""
    sq_diff, sq_ref = np.asarray(sq_diff, dtype=np.float64), np.asarray(sq_ref, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return 10.0 * np.log10(sq_ref / sq_diff)
