"""Dataset-level statistics of llama-perplexity's KL-divergence mode (tools/perplexity,
``kl_divergence()``), computed from per-position numbers, with its formulas:

- per scored token (p = reference, q = candidate): KLD = sum_i p_i (log p_i - log q_i) (direction
  KL(reference || candidate), llama's base || model), nll = -log q[next], dp = q[next] - p[next],
  same top = argmax q == argmax p;
- mean ± standard error, se = sqrt((E[x^2] - E[x]^2) / (n - 1)) (0 for n <= 10, as llama.cpp);
- PPL = exp(mean nll) ± PPL * se(nll); ln(PPL(Q)/PPL(base)) = mean nll_q - mean nll_p
  ± sqrt(se_q^2 + se_p^2 - 2 cov), cov = (E[ab] - E[a] E[b]) / (n - 1); ratio = exp(ln ratio)
  ± ratio * se(ln ratio); Pearson correlation = cov / (se_q se_p);
- RMS dp = sqrt(mean dp^2) ± se(dp^2) / (2 RMS); same top ± sqrt(p (1 - p) / (n - 1));
- percentiles by linear interpolation at fraction * (n - 1) of the sorted values, median the
  mean of the two middle values (the same number).

Plus exllamav3's view: mean KLD by the reference's confidence (its top-1 probability) in the
buckets [0, .25), [.25, .5), [.5, .75), [.75, .95), [.95, 1].
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

# Percentile ladders as llama-perplexity prints them: (label, fraction)
KLD_LADDER = (("max", 1.0), ("p99.9", 0.999), ("p99", 0.99), ("p95", 0.95), ("p90", 0.9), ("median", 0.5),
              ("p10", 0.1), ("p5", 0.05), ("p1", 0.01), ("p0.1", 0.001), ("min", 0.0))
DP_LADDER = (("max", 1.0), ("p99.9", 0.999), ("p99", 0.99), ("p95", 0.95), ("p90", 0.9), ("p75", 0.75),
             ("median", 0.5), ("p25", 0.25), ("p10", 0.1), ("p5", 0.05), ("p1", 0.01), ("p0.1", 0.001),
             ("min", 0.0))
CONFIDENCE_BUCKETS = ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 0.95), (0.95, 1.0))


def mean_and_se(values) -> tuple[float, float]:
    """(mean, standard error) as llama-perplexity: se = sqrt((E[x^2] - E[x]^2) / (n - 1)), 0 when
    that variance is not positive or n <= 10."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if n == 0:
        return float("nan"), float("nan")
    mean = float(x.mean())
    var = float(np.mean(x * x)) - mean * mean
    return mean, (float(np.sqrt(var / (n - 1))) if var > 0 and n > 10 else 0.0)


def covariance(a, b) -> float:
    """llama-perplexity's covariance of the means: (E[ab] - E[a] E[b]) / (n - 1), 0 for n < 10."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n = len(a)
    if n < 10:
        return 0.0
    return (float(np.mean(a * b)) - float(a.mean()) * float(b.mean())) / (n - 1)


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """Linear interpolation at fraction * (n - 1) of ascending values (llama-perplexity's)."""
    v = sorted_values
    if fraction <= 0:
        return float(v[0])
    if fraction >= 1:
        return float(v[-1])
    at = fraction * (len(v) - 1)
    i = int(at)
    return float((1 - (at - i)) * v[i] + (at - i) * v[min(i + 1, len(v) - 1)])


def kld_percentile(kld, fraction: float) -> float:
    """A percentile of per-token KLD (NaN if any is NaN: a NaN candidate never passes)."""
    kld = np.asarray(kld, dtype=np.float64)
    return float("nan") if np.isnan(kld).any() else percentile(np.sort(kld), fraction)


def ppl_ratio(ref_nll, cand_nll) -> float:
    """PPL(Q) / PPL(base) = exp(mean nll_q - mean nll_p)."""
    return float(np.exp(np.mean(cand_nll) - np.mean(ref_nll)))


def dp(ref_nll, cand_nll) -> np.ndarray:
    """Per token, the candidate's probability of the next token minus the reference's:
    q[next] - p[next] = exp(-nll_q) - exp(-nll_p)."""
    return np.exp(-np.asarray(cand_nll, np.float64)) - np.exp(-np.asarray(ref_nll, np.float64))


def rms_dp(ref_nll, cand_nll) -> float:
    """sqrt(mean dp^2)."""
    return float(np.sqrt(np.mean(dp(ref_nll, cand_nll) ** 2)))


def ladder(values, fractions) -> dict[str, float]:
    v = np.sort(np.asarray(values, dtype=np.float64))
    return {label: percentile(v, f) for label, f in fractions}


@dataclass(frozen=True)
class KLStats:
    """llama-perplexity's final statistics over the scored tokens (those with a next token)."""

    tokens: int
    ppl_ref: float
    ppl_ref_se: float
    ppl_cand: float
    ppl_cand_se: float
    ln_ppl_ratio: float
    ln_ppl_ratio_se: float
    ppl_ratio: float
    ppl_ratio_se: float
    ppl_diff: float
    ppl_diff_se: float
    nll_correlation: float  # Pearson correlation of the two models' per-token nll
    kld_mean: float
    kld_se: float
    kld: dict  # KLD_LADDER label -> value
    dp_mean: float
    dp_se: float
    dp: dict  # DP_LADDER label -> value (probability, not percent)
    rms_dp: float
    rms_dp_se: float
    same_top: float
    same_top_se: float
    kld_by_confidence: list  # [{"low", "high", "tokens", "kld_mean"}] per CONFIDENCE_BUCKETS

    def to_dict(self) -> dict:
        return asdict(self)


def kl_stats(ref_nll, cand_nll, kld, same_top, ref_confidence) -> KLStats | None:
    """Statistics over per-token arrays (one entry per scored token): the two models' nll of the
    next token, KL(ref || cand), 1.0 where the top-1 ids agree, the reference's top-1 probability.
    None without tokens."""
    nll_p, nll_q = np.asarray(ref_nll, np.float64), np.asarray(cand_nll, np.float64)
    kld, same, conf = np.asarray(kld, np.float64), np.asarray(same_top, np.float64), np.asarray(ref_confidence)
    n = len(nll_p)
    if n == 0:
        return None
    log_q, se_q = mean_and_se(nll_q)
    log_p, se_p = mean_and_se(nll_p)
    cov = covariance(nll_q, nll_p)
    ppl_q, ppl_p = float(np.exp(log_q)), float(np.exp(log_p))
    ln_ratio, ln_ratio_se = log_q - log_p, float(np.sqrt(max(se_q * se_q + se_p * se_p - 2 * cov, 0.0)))
    ppl_q_se, ppl_p_se = ppl_q * se_q, ppl_p * se_p
    dps = dp(nll_p, nll_q)
    dp_mean, dp_se = mean_and_se(dps)
    mse, mse_se = mean_and_se(dps * dps)
    rms = float(np.sqrt(mse))
    top = float(same.mean())
    kld_mean, kld_se = mean_and_se(kld)
    buckets = []
    for low, high in CONFIDENCE_BUCKETS:
        inside = (conf >= low) & ((conf < high) if high < 1.0 else (conf <= high))
        buckets.append({"low": low, "high": high, "tokens": int(inside.sum()),
                        "kld_mean": float(kld[inside].mean()) if inside.any() else None})
    return KLStats(
        tokens=n, ppl_ref=ppl_p, ppl_ref_se=ppl_p_se, ppl_cand=ppl_q, ppl_cand_se=ppl_q_se,
        ln_ppl_ratio=ln_ratio, ln_ppl_ratio_se=ln_ratio_se,
        ppl_ratio=float(np.exp(ln_ratio)), ppl_ratio_se=float(np.exp(ln_ratio)) * ln_ratio_se,
        ppl_diff=ppl_q - ppl_p,
        ppl_diff_se=float(np.sqrt(max(ppl_q_se ** 2 + ppl_p_se ** 2 - 2 * ppl_q * ppl_p * cov, 0.0))),
        nll_correlation=cov / (se_q * se_p) if se_q > 0 and se_p > 0 else float("nan"),
        kld_mean=kld_mean, kld_se=kld_se, kld=ladder(kld, KLD_LADDER),
        dp_mean=dp_mean, dp_se=dp_se, dp=ladder(dps, DP_LADDER),
        rms_dp=rms, rms_dp_se=0.5 / rms * mse_se if rms > 0 else 0.0,
        same_top=top, same_top_se=float(np.sqrt(top * (1 - top) / (n - 1))) if n > 1 else 0.0,
        kld_by_confidence=buckets)


def kld_histogram(kld, low: int = -8, high: int = 2, per_decade: int = 4) -> dict:
    """Counts of per-token KLD in log-spaced bins from 10^low to 10^high nats (``edges``), plus
    ``below`` (smaller, zeros included) and ``above``; NaN values are counted apart."""
    kld = np.asarray(kld, dtype=np.float64)
    finite = kld[np.isfinite(kld)]
    edges = np.logspace(low, high, (high - low) * per_decade + 1)
    counts, _ = np.histogram(finite, bins=edges)
    return {"edges": edges.tolist(), "counts": counts.tolist(), "below": int((finite < edges[0]).sum()),
            "above": int((finite > edges[-1]).sum()), "nan": int(len(kld) - len(finite))}


def lines(s: KLStats) -> list[str]:
    """The statistics in llama-perplexity's layout (probabilities in percent as it prints them)."""
    out = [f"====== Perplexity statistics ({s.tokens} scored tokens) ======",
           f"Mean PPL(Q)                   : {s.ppl_cand:10.6f} ± {s.ppl_cand_se:10.6f}",
           f"Mean PPL(base)                : {s.ppl_ref:10.6f} ± {s.ppl_ref_se:10.6f}",
           f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * s.nll_correlation:6.2f}%",
           f"Mean ln(PPL(Q)/PPL(base))     : {s.ln_ppl_ratio:10.6f} ± {s.ln_ppl_ratio_se:10.6f}",
           f"Mean PPL(Q)/PPL(base)         : {s.ppl_ratio:10.6f} ± {s.ppl_ratio_se:10.6f}",
           f"Mean PPL(Q)-PPL(base)         : {s.ppl_diff:10.6f} ± {s.ppl_diff_se:10.6f}",
           "====== KL divergence statistics (KL(reference || candidate), nats) ======",
           f"Mean    KLD: {s.kld_mean:10.6f} ± {s.kld_se:10.6f}"]
    out += [f"{_label(k):<8}KLD: {v:10.6f}" for k, v in s.kld.items()]
    out += ["====== Token probability statistics ======",
            f"Mean    Δp: {100 * s.dp_mean:6.3f} ± {100 * s.dp_se:5.3f} %"]
    out += [f"{_label(k):<8}Δp: {100 * v:6.3f}%" for k, v in s.dp.items()]
    out += [f"RMS Δp    : {100 * s.rms_dp:6.3f} ± {100 * s.rms_dp_se:5.3f} %",
            f"Same top p: {100 * s.same_top:6.3f} ± {100 * s.same_top_se:5.3f} %",
            "KLD by reference confidence (top-1 probability):"]
    out += [f"  [{b['low']:.2f}, {b['high']:.2f}{']' if b['high'] == 1.0 else ')'}: {b['tokens']:6d} tokens, "
            + ("mean KLD -" if b["kld_mean"] is None else f"mean KLD {b['kld_mean']:.6f}") for b in s.kld_by_confidence]
    return out


def _label(key: str) -> str:
    return {"max": "Maximum", "min": "Minimum", "median": "Median"}.get(key, f"{key[1:]}%")
