"""The long-context probe's check: KLD by position bucket of one long sequence. Sliding-window,
rope-scaling and context-length bugs show only past a length (a wrong sliding window is invisible
while every row is shorter than the window); this fails when late buckets degrade while the early
one is clean."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .results import ERROR, FAILED, PASSED, SKIPPED, CheckResult, Row, fmt
from .thresholds import Threshold

if TYPE_CHECKING:  # records of the engine, which runs the checks: no import at run time
    from ..engine.records import Comparison


def check_long_context(cmp: Comparison, threshold: Threshold, kld: Threshold) -> CheckResult:
    """``threshold``: how many times the first bucket's mean KLD a later bucket may reach;
    ``kld``: the candidate class's KLD limit, which a later bucket must also exceed to fail (a
    degradation inside the usual error is no bug)."""
    name = "long_context"
    probe = cmp.long_context
    if probe is None:
        return CheckResult(name, cmp.name, SKIPPED, reason=(
            "no long sequence: --modeldiff-long-context N (the models declare no sliding window to draw a "
            "default from)" if cmp.error is None else f"logit metrics not computed: {cmp.error.splitlines()[0]}"))
    if "skipped" in probe:
        return CheckResult(name, cmp.name, SKIPPED, reason=probe["skipped"])
    if "error" in probe:
        return CheckResult(name, cmp.name, ERROR, reason=probe["error"])
    buckets = probe["buckets"]
    early = buckets[0]["kld_mean"]
    limit = kld.value
    ratio = threshold.value
    rows, bad = [], []
    for k, b in enumerate(buckets):
        span = f"positions {b['start']}-{b['stop'] - 1}"
        if k == 0:
            rows.append(Row(f"KLD mean, {span} (early)", fmt(early), f"<= {fmt(limit)}", early <= limit))
            continue
        worse = b["kld_mean"] > limit and b["kld_mean"] > ratio * max(early, 1e-12)
        if worse:
            bad.append((k, b))
        rows.append(Row(f"KLD mean, {span}", fmt(b["kld_mean"]),
                        f"<= max({fmt(limit)}, {ratio:g} x early)", not worse))
    status = FAILED if bad and early <= limit else PASSED
    late = max(buckets[1:], key=lambda b: b["kld_mean"], default=buckets[0])
    result = CheckResult(name, cmp.name, status, rows=rows, threshold=threshold,
                         value=late["kld_mean"] / max(early, 1e-12))
    result.extra = {"long_context": probe}
    if bad and early > limit:
        result.details.append(f"every bucket is over the KLD limit from the start (early {fmt(early)}): not a "
                              "long-context problem; the kld check covers it")
    if status == FAILED:
        k, b = bad[0]
        window = probe.get("window")
        result.details.append(f"KLD mean {fmt(early)} over positions 0-{buckets[0]['stop'] - 1}, "
                              f"{fmt(b['kld_mean'])} over {b['start']}-{b['stop'] - 1} "
                              f"(x{b['kld_mean'] / max(early, 1e-12):.3g}); sequence of {probe['length']} tokens "
                              f"({probe['source']})")
        result.hint = ("the candidate degrades only past a length: compare the attention window and position "
                       "settings - sliding window (" + (f"the reference's is {window}" if window else "none declared")
                       + "), rope scaling (type, factor, original context) and the context length in the metadata")
    return result
