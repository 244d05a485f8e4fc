"""The per-layer check: relative error of each layer's hidden state, where it departs."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..metrics.layers import EMBD, NORM, describe
from .logits import _passes
from .registry import CHECKS
from .results import ERROR, FAILED, PASSED, SKIPPED, CheckResult, Row, fmt
from .thresholds import Threshold

if TYPE_CHECKING:  # records of the engine, which runs the checks: no import at run time
    from ..engine.records import Comparison


# --------------------------------------------------------------------------- per-layer check
def check_layers(cmp: Comparison, threshold: Threshold) -> CheckResult:
    """Every layer's mean rfn against its limit (``threshold.value`` is a LayerLimits). The
    report names the first layer over its limit and the largest jump: error accumulates with
    depth, so the first excess, not the largest value, is where a conversion breaks."""
    if cmp.layers is None and cmp.layers_skipped:
        return CheckResult("layers", cmp.name, SKIPPED, reason=cmp.layers_skipped)
    if cmp.layers is None:
        reason = cmp.layers_error or ("hidden states were not captured: add 'layers' to --modeldiff-checks "
                                      "(or Settings(layers=True))")
        return CheckResult("layers", cmp.name, ERROR, reason=reason)
    st = cmp.layers
    rfn, rfn_max, cos_err, sqnr, iso = st.rfn_mean, st.rfn_max, st.cos_err.mean(0), st.sqnr_db, st.isolated_mean
    per_layer, first = [], None
    for i, name in enumerate(st.names):
        limit = threshold.value.for_layer(name)
        kept = st.is_kept(i)
        ok = kept or _passes(rfn[i], limit.value, CHECKS["layers"].direction)
        if not ok and first is None:
            first = i
        per_layer.append({"name": name, "rfn_mean": rfn[i], "rfn_max": rfn_max[i], "cos_err": cos_err[i],
                          "sqnr_db": sqnr[i], "isolated_rfn": None if iso is None else iso[i],
                          "threshold": limit.value, "threshold_source": limit.source, "passed": ok, "kept": kept})
    judged = [i for i in range(len(st.names)) if not per_layer[i]["kept"]]
    worst = max(judged, key=lambda i: np.nan_to_num(rfn[i], nan=np.inf))
    jump = st.largest_jump()
    result = CheckResult("layers", cmp.name, PASSED if first is None else FAILED, value=float(rfn[worst]))
    result.rows.append(Row(f"rfn, worst of {len(judged)} states ({describe(st.names[worst])})", fmt(rfn[worst]),
                           f"<= {fmt(per_layer[worst]['threshold'])}", per_layer[worst]["passed"]))
    if first is not None:
        result.rows.append(Row(f"rfn, first over its limit ({describe(st.names[first])})", fmt(rfn[first]),
                               f"<= {fmt(per_layer[first]['threshold'])}", False))
    result.extra = {"layers": per_layer, "first_offending": None if first is None else st.names[first],
                    "largest_jump": None if jump is None else st.names[jump], "kept": st.kept, "source": st.source}
    if first is not None:
        _explain_layers(result, cmp, first, jump)
    return result


def _explain_layers(result: CheckResult, cmp: Comparison, first: int, jump: int | None) -> None:
    st, per_layer = cmp.layers, result.extra["layers"]
    name = st.names[first]
    result.details.append(f"first state over its limit: {describe(name)} (rfn {fmt(st.rfn_mean[first])} > "
                          f"{fmt(per_layer[first]['threshold'])} from {per_layer[first]['threshold_source']})")
    if jump is not None:
        prev = st.rfn_mean[jump - 1]
        ratio = st.rfn_mean[jump] / prev if prev > 0 else np.inf
        result.details.append(f"largest jump: {describe(st.names[jump])}, rfn x{ratio:.3g} over "
                              f"{describe(st.names[jump - 1])} ({fmt(prev)} -> {fmt(st.rfn_mean[jump])})")
    iso = st.isolated_mean
    if iso is not None:
        own = int(np.argmax(np.nan_to_num(iso[1:], nan=np.inf))) + 1
        result.details.append(f"isolated error (each layer fed the reference's input): largest at "
                              f"{describe(st.names[own])}, rfn {fmt(iso[own])}")
    if name == EMBD:
        where = ("the token embeddings already differ: token_embd rows (vocabulary order, a shifted or "
                 "transposed tensor) or an embedding scale")
    elif name == "0":
        where = ("the error starts in the first decoder layer, where everything that all layers share shows "
                 "first: rope (freq base, scaling, Q/K permutation), norm epsilon, head counts")
    elif name == NORM:
        where = "only the final norm is off: output_norm weight or norm epsilon"
    else:
        where = (f"layers before {name} match and {describe(name)} does not: suspect that layer's own tensors "
                 "(scaled, swapped or corrupted weights)")
    tips = [where]
    if iso is None:
        tips.append("--cand-runner gguf-torch adds each layer's isolated error")
    if name.isdigit() and int(name) > 0:
        tips.append(f"--modeldiff-keep-layers {first} checks whether the layers after it are fine")
    result.hint = "; ".join(tips)
