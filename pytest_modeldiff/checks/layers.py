"""The per-layer check: relative error of each layer's hidden state, where it departs, and which
layer to suspect.

Three pieces of evidence name a suspect layer: the change point of the rfn profile (the state whose
error departs from the running level of the earlier states, metrics/layers.py ``departures``), each
layer's isolated error (the layer fed the reference's input: gguf-torch and hf candidates give it,
llama.cpp candidates get it from a gguf-torch pass over the same file, --modeldiff-isolate) and the
weights check's out-of-limit tensors of that layer. The absolute per-layer limits give the verdict;
a change point that the weights agree with fails the check too (a tensor changed beyond its type's
error and the hidden states depart right there), so small but real breaks are not passed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..formats.quant_types import usual_weight_error
from ..metrics.layers import AGREES, DEPARTS, EMBD, FLOAT16_FLOOR, NORM, departures, describe, isolated_departures
from .logits import _passes
from .registry import CHECKS
from .results import ERROR, FAILED, PASSED, SKIPPED, CheckResult, Row, fmt
from .thresholds import Threshold
from .weights import judge_tensors

if TYPE_CHECKING:  # records of the engine, which runs the checks: no import at run time
    from ..engine.records import Comparison


# --------------------------------------------------------------------------- per-layer check
def check_layers(cmp: Comparison, threshold: Threshold) -> CheckResult:
    """Every layer's mean rfn against its limit (``threshold.value`` is a LayerLimits), plus the
    suspect layer: error accumulates with depth, so neither the largest value nor the first excess
    of an absolute limit is where a conversion breaks; the change point is."""
    if cmp.layers is None and cmp.layers_skipped:
        return CheckResult("layers", cmp.name, SKIPPED, reason=cmp.layers_skipped)
    if cmp.layers is None:
        reason = cmp.layers_error or ("hidden states were not captured: add 'layers' to --modeldiff-checks "
                                      "(or Settings(layers=True))")
        return CheckResult("layers", cmp.name, ERROR, reason=reason)
    st = cmp.layers
    first = _first_over(st, threshold)
    bad = _weight_evidence(cmp)
    floor = _floor(cmp)
    # limits the user set (marker, option, ini) say what rfn is acceptable: the verdict is theirs alone
    user_limits = any(not threshold.value.for_layer(name).source.startswith("default") for name in st.names)
    suspect = _suspect(st, bad, floor)
    if suspect is not None and user_limits:
        suspect["fails"] = False
    failing = first is not None or (suspect is not None and suspect["fails"])
    if (st.isolated_rfn is None and cmp.isolate_of is not None
            and (cmp.isolate == "always" or (cmp.isolate == "auto" and failing))):
        cmp.isolate_of()  # fills st.isolated_rfn, or says why not in cmp.isolate_error
        suspect = _suspect(st, bad, floor)
        if suspect is not None and user_limits:
            suspect["fails"] = False
        failing = first is not None or (suspect is not None and suspect["fails"])
    if not failing and suspect is not None and not suspect["weights"]:
        suspect = None  # a passing check without weight evidence accuses no layer (a quantized embedding
        # holds much of a healthy q4's error and departs from the later increments: no bug)

    rfn, rfn_max, cos_err, sqnr, iso = st.rfn_mean, st.rfn_max, st.cos_err.mean(0), st.sqnr_db, st.isolated_mean
    dep = departures(rfn, st.kept + 1 if st.kept else 0, floor)
    per_layer = []
    for i, name in enumerate(st.names):
        limit = threshold.value.for_layer(name)
        kept = st.is_kept(i)
        per_layer.append({"name": name, "rfn_mean": rfn[i], "rfn_max": rfn_max[i], "cos_err": cos_err[i],
                          "sqnr_db": sqnr[i], "isolated_rfn": None if iso is None else iso[i],
                          "departure": None if np.isnan(dep.ratio[i]) else float(dep.ratio[i]),
                          "threshold": limit.value, "threshold_source": limit.source,
                          "passed": kept or _passes(rfn[i], limit.value, CHECKS["layers"].direction), "kept": kept,
                          "weights_out_of_limit": bad.get(name, []) if bad else []})
    judged = [i for i in range(len(st.names)) if not per_layer[i]["kept"]]
    worst = max(judged, key=lambda i: np.nan_to_num(rfn[i], nan=np.inf))
    jump = dep.largest(judged)
    result = CheckResult("layers", cmp.name, FAILED if failing else PASSED, value=float(rfn[worst]))
    result.rows.append(Row(f"rfn, worst of {len(judged)} states ({describe(st.names[worst])})", fmt(rfn[worst]),
                           f"<= {fmt(per_layer[worst]['threshold'])}", per_layer[worst]["passed"]))
    if first is not None:
        result.rows.append(Row(f"rfn, first over its limit ({describe(st.names[first])})", fmt(rfn[first]),
                               f"<= {fmt(per_layer[first]['threshold'])}", False))
    if suspect is not None:
        result.rows.append(Row(f"suspect layer: {describe(suspect['layer'])} ({', '.join(suspect['evidence'])})",
                               _times(suspect["departure"]), "rfn limits set by the user" if user_limits
                               else "no change point with weights out of limit", not suspect["fails"]))
    result.extra = {"layers": per_layer, "first_offending": None if first is None else st.names[first],
                    "largest_jump": None if jump is None else st.names[jump],
                    "suspect_layer": None if suspect is None else suspect["layer"],
                    "suspect": None if suspect is None else {k: v for k, v in suspect.items() if k != "index"},
                    "isolated_source": (st.isolated_source or cmp.candidate.kind) if iso is not None else None,
                    "isolate_error": cmp.isolate_error, "kept": st.kept, "source": st.source}
    if cmp.attribution is not None:
        result.extra["attribution"] = cmp.attribution
        top = cmp.attribution.get("largest")
        if top:
            result.rows.append(Row(f"attribution: most KLD from {describe(top['name'])}'s weights alone",
                                   fmt(top["kld"]), f"{100 * top['share']:.0f} % of the layers' sum", True))
    if failing:
        _explain_layers(result, cmp, first, suspect)
    return result


def _times(x: float | None) -> str:
    if x is None or np.isnan(x):
        return "n/a"
    return "x inf" if np.isinf(x) else f"x{x:.3g}"


def _first_over(st, threshold: Threshold) -> int | None:
    rfn = st.rfn_mean
    for i, name in enumerate(st.names):
        if not st.is_kept(i) and not _passes(rfn[i], threshold.value.for_layer(name).value,
                                             CHECKS["layers"].direction):
            return i
    return None


def _state_of(tensor) -> str | None:
    """The hidden state a tensor first acts on: decoder layer i's tensors -> "i", the token
    embedding -> embd, the final norm -> norm (the output head acts after every state: None)."""
    if tensor.layer is not None:
        return str(tensor.layer)
    if tensor.group == "embedding":
        return EMBD
    if tensor.group == "norm":
        return NORM
    return None


def _weight_evidence(cmp: Comparison) -> dict[str, list[str]] | None:
    """Tensors beyond their storage type's usual error (or unexpectedly missing, added or
    reshaped), by the state they act on; None when the weights were not compared."""
    if cmp.weights_of is None:
        return None
    try:
        wc = cmp.weights_of()
    except Exception:  # evidence, not a verdict: the weights check reports its own errors
        return None
    if wc is None or wc.diff is None:
        return None
    bad: dict[str, list[str]] = {}
    for t, _, ok in judge_tensors(wc.diff.tensors):  # the weights check's default limits
        state = _state_of(t)
        if not ok and state is not None:
            bad.setdefault(state, []).append(t.name)
    return bad


def _floor(cmp: Comparison) -> float:
    """The error the first non-zero state may show by itself: the candidate type's usual weight
    error, at least a float16 rounding."""
    try:
        usual = usual_weight_error("F32", str(cmp.quant_type).upper())
    except Exception:
        usual = 0.0
    return max(usual, FLOAT16_FLOOR)


def _suspect(st, bad: dict[str, list[str]] | None, floor: float = FLOAT16_FLOOR) -> dict | None:
    """The layer to suspect and why: the isolated error first (a layer that alone departs from the
    others), then the change point of the rfn profile, each preferring a state whose weights are out
    of limit when the two agree. None when nothing departs."""
    start = st.kept + 1 if st.kept else 0
    n = len(st.names)
    dep = departures(st.rfn_mean, start, floor)
    iso = None if st.isolated_mean is None else isolated_departures(st.isolated_mean)
    bad = bad or {}
    judged = range(start, n)

    def with_weights(candidates):
        return [i for i in candidates if st.names[i] in bad]

    index, evidence = None, []
    if iso is not None:
        own = [i for i in judged if i > 0 and iso[i] >= DEPARTS]
        agreeing = with_weights(own)
        if own:
            index = max(agreeing or own, key=lambda i: iso[i])
            evidence.append("isolated error")
    if index is None:
        cp = [i for i in judged if dep.ratio[i] >= DEPARTS]
        agreeing = with_weights(i for i in judged if dep.ratio[i] >= AGREES)
        if agreeing:
            index = max(agreeing, key=lambda i: (dep.ratio[i], dep.z[i]))
        elif cp:
            index = max(cp, key=lambda i: (dep.ratio[i], dep.z[i]))
    if index is None:
        return None
    name = st.names[index]
    if dep.ratio[index] >= AGREES:
        evidence.append("change point")
    tensors = bad.get(name, [])
    if tensors:
        evidence.append("weights")
    return {"layer": name, "index": index, "evidence": evidence,
            "departure": None if np.isnan(dep.ratio[index]) else float(dep.ratio[index]),
            "z": None if np.isnan(dep.z[index]) else float(dep.z[index]),
            "isolated_ratio": None if iso is None else float(iso[index]),
            "tensors": tensors, "weights": bool(tensors),
            # a change point (or isolated error) that the weights agree with is a failure by itself
            "fails": bool(tensors) and (dep.ratio[index] >= AGREES or (iso is not None and iso[index] >= DEPARTS))}


def _explain_layers(result: CheckResult, cmp: Comparison, first: int | None, suspect: dict | None) -> None:
    st, per_layer = cmp.layers, result.extra["layers"]
    rfn = st.rfn_mean
    if first is not None:
        result.details.append(f"first state over its limit: {describe(st.names[first])} (rfn {fmt(rfn[first])} > "
                              f"{fmt(per_layer[first]['threshold'])} from {per_layer[first]['threshold_source']})")
    iso = st.isolated_mean
    if suspect is not None:
        i, name = suspect["index"], suspect["layer"]
        parts = []
        if i > 0 and suspect["departure"] is not None:
            parts.append(f"rfn {fmt(rfn[i - 1])} -> {fmt(rfn[i])}, {_times(suspect['departure'])} over the growth "
                         "of the states before it")
        elif suspect["departure"] is not None:
            parts.append(f"rfn {fmt(rfn[i])}, {_times(suspect['departure'])} what a later layer adds")
        if iso is not None:
            source = result.extra["isolated_source"]
            parts.append(f"isolated rfn {fmt(iso[i])}, {_times(suspect['isolated_ratio'])} the median layer's "
                         f"({source})")
        if suspect["tensors"]:
            parts.append(f"out of limit: {', '.join(suspect['tensors'][:4])}")
        result.details.append(f"suspect: {describe(name)} ({'; '.join(parts)})")
    elif iso is not None:
        own = int(np.argmax(np.nan_to_num(iso[1:], nan=np.inf))) + 1
        result.details.append(f"isolated error (each layer fed the reference's input): largest at "
                              f"{describe(st.names[own])}, rfn {fmt(iso[own])}; no layer departs from the others")
    if cmp.isolate_error:
        result.details.append(f"isolated pass not run: {cmp.isolate_error}")
    result.hint = "; ".join(_tips(cmp, first, suspect))


def _tips(cmp: Comparison, first: int | None, suspect: dict | None) -> list[str]:
    """What to look at, worded so it cannot contradict the table: it names states and quotes numbers."""
    st = cmp.layers
    rfn = st.rfn_mean
    tips = []
    if suspect is None:
        tips.append("no single state departs from the growth of the ones before it: the error is spread over every "
                    "layer, as from what all layers share (rope freq base or scaling, Q/K permutation, norm epsilon, "
                    "head counts) or a uniformly coarser storage type")
    else:
        i, name = suspect["index"], suspect["layer"]
        before = [j for j in range(i) if not st.is_kept(j)]
        level = (f"the states before it stay at rfn <= {fmt(float(np.max(rfn[before])))}; " if before else "")
        tensors = f" ({', '.join(suspect['tensors'][:4])})" if suspect["tensors"] else ""
        if name == EMBD:
            tips.append(f"the token embeddings already differ{tensors}: token_embd rows (vocabulary order, a shifted "
                        "or transposed tensor) or an embedding scale")
        elif name == NORM:
            tips.append(f"{level}only the final norm departs{tensors}: output_norm weight or norm epsilon")
        elif name == "0" and not suspect["tensors"] and "isolated error" not in suspect["evidence"]:
            tips.append("the error departs at the first decoder layer, where both its own tensors and everything all "
                        "layers share show first (rope freq base or scaling, Q/K permutation, norm epsilon, head "
                        "counts)")
        else:
            how = ("departs from that level" if "change point" in suspect["evidence"]
                   else "stands out by its own (isolated) error")
            tips.append(f"{level}{describe(name)} {how}{tensors}: suspect that layer's own tensors "
                        "(scaled, swapped, transposed or corrupted weights)")
        if first is not None and first != i:
            tips.append(f"rfn first exceeds its absolute limit at {describe(st.names[first])}, "
                        f"{abs(first - i)} state(s) {'after' if first > i else 'before'} the suspect")
    if st.isolated_mean is None and cmp.isolate != "never":
        tips.append("--cand-runner gguf-torch (or --modeldiff-isolate always) adds each layer's isolated error")
    target = suspect["layer"] if suspect is not None else (None if first is None else st.names[first])
    if target is not None and target.isdigit() and int(target) > 0:
        tips.append(f"--modeldiff-keep-layers {target} checks whether the layers after it are fine")
    return tips
