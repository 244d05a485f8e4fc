"""The weights check: every tensor against the usual error of its storage type."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..formats.quant_types import WeightLimits, usual_weight_gain
from ..weights.diff import WORST_TENSORS
from .registry import CHECKS
from .results import ERROR, FAILED, PASSED, SKIPPED, CheckResult, Row, fmt
from .thresholds import PER_TENSOR_TYPE, Threshold

if TYPE_CHECKING:  # records of the engine, which runs the checks: no import at run time
    from ..engine.records import WeightComparison

# --------------------------------------------------------------------------- weights check
WEIGHT_KEYS = tuple(limit.key for limit in CHECKS["weights"].limits)  # weight_rel, weight_cos, weight_gain


def judge_tensors(tensors, rel: float | None = None, cos: float | None = None,
                  gain: float | None = None) -> list[tuple]:
    """(tensor, its limits or None, passed) for each compared tensor pair: the limits set (None:
    from the usual error and gain of the candidate's storage type), or for a tensor without
    metrics (missing, added, reshaped) whether the converter drops or makes it on purpose. The
    weights check's verdict and the layers check's weight evidence both come from here."""
    judged = []
    for t in tensors:
        if t.metrics:
            limits = WeightLimits.of(t.usual_rel, rel, cos, gain,
                                     usual_gain=usual_weight_gain(t.ref_type, t.cand_type) if t.usual_rel else 0.0)
            judged.append((t, limits, limits.passes(t.metrics)))
        else:
            judged.append((t, None, t.expected))
    return judged


def check_weights(weights: WeightComparison, thresholds: dict[str, Threshold]) -> CheckResult:
    """Every tensor pair within its limits (relative change, cosine, |gain - 1|: the threshold
    when one is set, else from the usual error of the candidate's storage type); no tensor missing,
    added or reshaped unless llama.cpp's converter drops or makes it on purpose."""
    name = "weights"
    if weights.skipped:
        return CheckResult(name, weights.name, SKIPPED, reason=weights.skipped)
    if weights.error:
        return CheckResult(name, weights.name, ERROR, reason=weights.error)
    diff = weights.diff
    rel_t, cos_t, gain_t = (thresholds[key] for key in WEIGHT_KEYS)
    judged = judge_tensors(diff.tensors, rel_t.value, cos_t.value, gain_t.value)
    compared = [(t, lim, ok) for t, lim, ok in judged if lim is not None]
    result = CheckResult(name, weights.name, PASSED if all(ok for *_, ok in judged) else FAILED,
                         threshold=rel_t if rel_t.value is not None else None)
    n_ok = sum(ok for *_, ok in compared)
    result.rows.append(Row("tensors within their limits", f"{n_ok}/{len(compared)}", "all", n_ok == len(compared)))
    if compared:
        def worst(metric):
            return max(compared, key=lambda x: np.nan_to_num(metric(x[0].metrics), nan=np.inf))

        for label, metric, limit in (("||d||/||ref||", lambda m: m["rel"], lambda lim: lim.rel),
                                     ("1 - cosine", lambda m: 1.0 - m["cos"], lambda lim: 1.0 - lim.cos),
                                     ("|gain - 1|", lambda m: abs(m["gain"] - 1.0), lambda lim: lim.gain)):
            t, lim, _ = worst(metric)
            value = metric(t.metrics)
            result.rows.append(Row(f"largest {label}: {t.name} ({t.ref_type} -> {t.cand_type})", fmt(value),
                                   f"<= {fmt(limit(lim))}", bool(value <= limit(lim))))
        result.value = float(worst(lambda m: m["rel"])[0].rel)
    for status in ("removed", "added", "shape-changed"):
        unexpected = [t for t, _, ok in judged if t.status == status and not ok]
        result.rows.append(Row(f"tensors {status}", str(len(unexpected)), "0", not unexpected))
    source = next((t.source for t in (rel_t, cos_t, gain_t) if t.value is not None), None)
    report = diff.to_dict()
    for entry, (t, lim, ok) in zip(report["tensors"], judged):
        entry.update({"limit_rel": lim and lim.rel, "limit_cos": lim and lim.cos, "limit_gain": lim and lim.gain,
                      "passed": ok})
    result.extra = {"weights": report, "limits_source": source or PER_TENSOR_TYPE}
    if result.status == FAILED:
        _explain_weights(result, judged, source)
    return result


def _explain_weights(result: CheckResult, judged: list, source: str | None) -> None:
    bad = [(t, lim) for t, lim, ok in judged if not ok]
    bad.sort(key=lambda x: (x[1] is not None, -np.nan_to_num(x[0].rel, nan=np.inf) if x[1] else 0))
    for t, lim in bad[:WORST_TENSORS]:
        where = f"{t.name} [{t.group}{'' if t.layer is None else f', layer {t.layer}'}]"
        if lim is None:
            shapes = f" {t.ref_shape} -> {t.cand_shape}" if t.status == "shape-changed" else ""
            result.details.append(f"{where}: {t.status}{shapes}: {t.cause}{'; ' + t.note if t.note else ''}")
            continue
        m = t.metrics
        cause = t.cause or (f"within {t.cand_type}'s usual error ({fmt(t.usual_rel)}) "
                            f"but over the threshold from {source}")
        result.details.append(f"{where} {t.ref_type} -> {t.cand_type}: ||d||/||ref|| {fmt(m['rel'])} (limit "
                              f"{fmt(lim.rel)}), 1 - cos {fmt(1.0 - m['cos'])}, gain {m['gain']:.5g}: "
                              f"likely cause: {cause}")
    if len(bad) > WORST_TENSORS:
        result.details.append(f"... and {len(bad) - WORST_TENSORS} more (every tensor is in the JSON report)")
    causes = " ".join(t.cause for t, _ in bad)
    if all(lim is not None and not t.cause for t, lim in bad):
        result.hint = (f"every failing tensor is within its storage type's usual error: the threshold from {source} "
                       "asks for more than those types can store; loosen it, or compare a wider type")
    elif "rope" in causes:
        result.hint = ("Q/K rows are in the wrong rope order: convert with llama.cpp's convert_hf_to_gguf.py, which "
                       "permutes Q/K for llama-family models, and do not permute them again")
    elif any(t.status in ("removed", "added", "shape-changed") for t, _ in bad):
        result.hint = ("the two files do not hold the same set of tensors: check the converter's tensor map for this "
                       "architecture and that both files are the same model")
    else:
        result.hint = ("a tensor changed beyond its storage type's usual error: re-convert it, or set weight_rel / "
                       "weight_cos / weight_gain (@pytest.mark.modeldiff(...), --modeldiff-threshold) if it is meant "
                       "to differ (a fine-tune is better judged by the logit checks)")
