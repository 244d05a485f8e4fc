"""Logit checks (KLD, NMSE, top-k, ...) over each scope of positions, and next-token
accuracy; what a failure tells the user: worst positions and a hint."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..metrics import klstats
from ..metrics import logits as metrics
from .registry import CHECKS, HIGHER
from .results import ERROR, FAILED, PASSED, SKIPPED, CheckResult, Row, fmt
from .thresholds import Threshold

if TYPE_CHECKING:  # records of the engine, which runs the checks: no import at run time
    from ..engine.records import Comparison, PositionStats


# --------------------------------------------------------------------------- logit checks
@dataclass(frozen=True)
class LogitMetric:
    """How a logit check aggregates per-position values over a set of positions."""

    label: str
    aggregate: Callable[[PositionStats, int], float]
    per_position: Callable[[PositionStats], np.ndarray] | None  # for "worst positions"
    next_token: bool = False  # uses the next token: only positions that have one count
    count: Callable[[PositionStats], np.ndarray] | None = None  # 0/1 per position: a fraction of a count


def topk_overlap_metric(k: int) -> LogitMetric:
    return LogitMetric(f"top-{k} overlap", lambda s, v: float(s.overlap(k).mean()), lambda s: -s.overlap(k))


def topk_agreement_metric(k: int, label: str = "") -> LogitMetric:
    return LogitMetric(label or f"top-{k} ordered agreement", lambda s, v: float(s.agreement(k).mean()),
                       lambda s: -s.agreement(k), count=lambda s: s.agreement(k))


LOGIT_METRICS = {
    "kld": LogitMetric("kld mean", lambda s, v: float(np.mean(s.kld)), lambda s: s.kld),  # NaN rows -> NaN
    "nmse": LogitMetric("nmse", lambda s, v: metrics.nmse_pooled(s.sse, s.ref_sum, s.ref_sumsq, v), None),
    "max_abs": LogitMetric("max |diff|", lambda s, v: float(np.max(s.max_abs)), lambda s: s.max_abs),
    "top10": topk_overlap_metric(10),
    "same_top": topk_agreement_metric(1, "same top-1"),
    "prob_mse": LogitMetric("probability MSE", lambda s, v: float(np.mean(s.prob_mse)), lambda s: s.prob_mse),
    "kld_p99": LogitMetric("kld 99th percentile", lambda s, v: klstats.kld_percentile(s.kld, 0.99), lambda s: s.kld),
    "ppl_ratio": LogitMetric("PPL(cand) / PPL(ref)", lambda s, v: klstats.ppl_ratio(s.ref_nll, s.cand_nll),
                             lambda s: s.cand_nll - s.ref_nll, next_token=True),
    "rms_dp": LogitMetric("RMS dp", lambda s, v: klstats.rms_dp(s.ref_nll, s.cand_nll),
                          lambda s: np.abs(klstats.dp(s.ref_nll, s.cand_nll)), next_token=True),
}


def logit_metric_values(cmp: Comparison) -> dict[str, float]:
    """Every logit metric over all compared positions (each next-token metric over those with a
    next token), whichever checks were selected: the numbers reports and baselines keep."""
    values = {}
    if cmp.stats is None:
        return values
    for name, metric in LOGIT_METRICS.items():
        scopes = _scopes(cmp.stats, metric.next_token)
        if scopes:
            values[name] = metric.aggregate(scopes[0][1], cmp.n_vocab)
    return values


def _scopes(stats: PositionStats, next_token: bool = False) -> list[tuple[str, PositionStats]]:
    """All compared positions, and the last position of each sequence (llama.cpp's single-vector
    view) when those are compared; metrics of the next token take the positions that have one."""
    if next_token:
        with_next = stats.select(stats.target >= 0)
        return [(f"{len(with_next)} next tokens", with_next)] if len(with_next) else []
    last = stats.select(stats.is_last)
    n_seq = len(np.unique(stats.seq))
    if len(last) == len(stats):
        return [(f"last position of {n_seq} sequences", stats)]
    if not len(last):  # llama-perplexity's scored positions stop before the last
        return [(f"{len(stats)} scored positions", stats)]
    return [(f"all {len(stats)} positions", stats), (f"last position of {n_seq} sequences", last)]


def _passes(value: float, threshold: float, direction: str) -> bool:
    if not np.isfinite(value):  # NaN/Inf logits never pass
        return False
    return value >= threshold if direction == HIGHER else value <= threshold


def check_logits(name: str, cmp: Comparison, threshold: Threshold, metric: LogitMetric | None = None) -> CheckResult:
    """Evaluate a registered logit check (``metric`` may replace its aggregation, e.g. top-k with
    another k) over all positions and over the last positions; both must pass."""
    check, metric = CHECKS[name], metric or LOGIT_METRICS[name]
    if cmp.error:
        return CheckResult(name, cmp.name, ERROR, reason=cmp.error, threshold=threshold)
    stats = cmp.stats
    symbol = ">=" if check.direction == HIGHER else "<="
    scopes = _scopes(stats, metric.next_token)
    if not scopes:
        return CheckResult(name, cmp.name, SKIPPED, threshold=threshold, reason=(
            "no position has a next token to predict (a last-position dump holds one row per prompt)"))
    result = CheckResult(name, cmp.name, PASSED, threshold=threshold)
    for scope, subset in scopes:
        value = metric.aggregate(subset, cmp.n_vocab)
        ok = _passes(value, threshold.value, check.direction)
        shown = fmt(value)
        one_per_sequence = bool(subset.is_last.all())  # the last-position scope, beside all positions or alone
        if one_per_sequence and metric.count is not None and check.direction == HIGHER and np.isfinite(value):
            # one count per sequence (7 by default): 3 of 7 is noise, not a verdict, so it fails only
            # when even the 95 % upper bound of the fraction is under the limit
            hits, n = int(metric.count(subset).sum()), len(subset)
            bound = metrics.fraction_upper_bound(hits, n)
            ok = _passes(bound, threshold.value, check.direction)
            shown = f"{fmt(value)} ({hits} of {n}, 95 % upper bound {fmt(bound)})"
        result.rows.append(Row(f"{metric.label}, {scope}", shown, f"{symbol} {fmt(threshold.value)}", ok))
        if result.value is None:
            result.value = value
        if not ok:
            result.status = FAILED
    if name == "nmse":
        result.extra = {"nmse_db": metrics.nmse_db(result.value), "verdict": metrics.nmse_verdict(result.value)}
        result.rows[0].value += f" ({result.extra['nmse_db']:.1f} dB, {result.extra['verdict']})"
    if name == "kld" and stats.finite.all():
        result.extra = {"median": float(np.median(stats.kld)), "max": float(np.max(stats.kld))}
        result.rows[0].value += f" (median {fmt(result.extra['median'])}, max {fmt(result.extra['max'])})"
    if result.status == FAILED:
        _explain(result, cmp, metric)
    return result


def _explain(result: CheckResult, cmp: Comparison, metric: LogitMetric) -> None:
    stats = cmp.stats
    bad = int((~stats.finite).sum())
    if bad:
        first = int(np.argmin(stats.finite))
        result.details.append(f"the candidate produced NaN/Inf logits at {bad} of {len(stats)} positions "
                              f"(first: sequence {stats.seq[first]}, position {stats.pos[first]})")
    if metric.per_position is not None:
        per = np.nan_to_num(metric.per_position(stats), nan=np.inf)
        for idx in np.argsort(-per, kind="stable")[:5]:
            s, p = int(stats.seq[idx]), int(stats.pos[idx])
            ref_next, cand_next = int(stats.ref_top[idx, 0]), int(stats.cand_top[idx, 0])
            result.details.append(
                f"sequence '{cmp.eval.sequences[s].label}' position {p} after {cmp.context(s, p)!r}: "
                f"kld {fmt(stats.kld[idx])}, max|diff| {fmt(stats.max_abs[idx])}, "
                f"top-1 reference {cmp.reference.piece(ref_next)!r} vs candidate {cmp.candidate.piece(cand_next)!r}")
    result.hint = _hint(cmp)


def _hint(cmp: Comparison) -> str:
    """Point at the likely cause from where along the sequence the error sits. At position 0
    rope is the identity and attention sees one token, so a clean position 0 with errors after
    it points at rope or attention; an error already at position 0 points at weights or norms."""
    stats = cmp.stats
    kld = np.nan_to_num(stats.kld, nan=np.inf)
    first, later = kld[stats.pos == 0], kld[stats.pos > 0]
    if len(first) and len(later) and np.mean(later) > 10 * max(np.mean(first), 1e-6):
        where = ("position 0 is fine and later positions are not: suspect rope (freq base, scaling, Q/K "
                 "permutation) or attention (heads, kv heads, window, soft-capping)")
    else:
        where = ("the error is there from position 0: suspect weights (a scaled or wrong tensor, "
                 "quantization), norm epsilon or the output head")
    return (f"{where}; compare with --cand-runner gguf-torch to separate weight error (present there too) "
            f"from llama.cpp kernel error, or set the threshold with @pytest.mark.modeldiff(...) / "
            f"--modeldiff-threshold if the candidate type ({cmp.quant_type}, class {cmp.quant_class}) "
            "is expected to be this far off")


# --------------------------------------------------------------------------- next-token accuracy
def check_topk_acc_drop(cmp: Comparison, threshold: Threshold) -> CheckResult:
    """For K = 1..topk_max: reference top-K accuracy minus the candidate's, each at most the
    threshold. Accuracy is the fraction of positions whose next token is among the model's top K
    (quality.py); the drop measures lost quality, not disagreement (same_top, top10 do that)."""
    name = "topk_acc_drop"
    if cmp.error:
        return CheckResult(name, cmp.name, ERROR, reason=cmp.error, threshold=threshold)
    q = cmp.quality
    if q.positions == 0:
        return CheckResult(name, cmp.name, SKIPPED, threshold=threshold, reason=(
            "no position has a next token to predict (a last-position dump holds one row per prompt)"))
    drops = np.nan_to_num(q.accuracy_drop, nan=np.inf)
    k = int(np.argmax(drops)) + 1  # the worst K; the quality table shows every K
    ok = _passes(drops[k - 1], threshold.value, CHECKS[name].direction)
    result = CheckResult(name, cmp.name, PASSED if ok else FAILED, threshold=threshold, value=float(drops[k - 1]))
    result.rows.append(Row(f"top-{k} accuracy drop, worst of K = 1..{q.topk_max} ({fmt(q.ref_accuracy[k - 1])} -> "
                           f"{fmt(q.cand_accuracy[k - 1])} over {q.positions} next tokens)",
                           fmt(drops[k - 1]), f"<= {fmt(threshold.value)}", ok))
    if not ok:
        stats = cmp.stats
        has = stats.target >= 0
        lost = np.flatnonzero(has & (stats.ref_rank < k) & (stats.cand_rank >= k))
        found = int((has & (stats.ref_rank >= k) & (stats.cand_rank < k)).sum())
        result.details.append(f"top-{k}: the candidate misses {len(lost)} next tokens that the reference has in its "
                              f"top {k}, and finds {found} that the reference misses")
        for idx in lost[np.argsort(-stats.cand_rank[lost], kind="stable")][:5]:
            s, p = int(stats.seq[idx]), int(stats.pos[idx])
            result.details.append(
                f"sequence '{cmp.eval.sequences[s].label}' position {p} after {cmp.context(s, p)!r}: next token "
                f"{cmp.reference.piece(int(stats.target[idx]))!r} ranked {int(stats.ref_rank[idx]) + 1} by the "
                f"reference, {int(stats.cand_rank[idx]) + 1} by the candidate (kld {fmt(stats.kld[idx])})")
        result.hint = _hint(cmp)
    return result
