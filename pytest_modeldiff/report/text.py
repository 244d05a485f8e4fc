"""Text for people: failure messages, the terminal summary, per-layer and weight tables."""
from __future__ import annotations

from typing import Iterable

from ..checks.results import FAILED, CheckResult, Row, fmt
from ..checks.run import EXACT_CHECKS
from ..engine.records import Comparison, Pair
from .data import CANDIDATE_COLUMNS, candidate_rows, cell


def table(rows: Iterable[Row]) -> list[str]:
    """``metric | value | threshold | status`` with aligned columns."""
    return _aligned([("metric", "value", "threshold", "status"),
                     *((r.metric, r.value, r.threshold, "ok" if r.passed else "FAIL") for r in rows)])


def _aligned(lines: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = [" | ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return out


def layer_table(result: CheckResult) -> list[str]:
    """One row per layer state; the first one over its limit is marked."""
    extra = result.extra
    isolated = any(row["isolated_rfn"] is not None for row in extra["layers"])
    head = ("layer", "rfn mean", "rfn max", "cos err", "SQNR dB", *(("isolated rfn",) if isolated else ()),
            "threshold", "status")
    lines = [head]
    for row in extra["layers"]:
        status = "kept" if row["kept"] else "ok" if row["passed"] else "FAIL"
        if row["name"] == extra.get("suspect_layer"):
            status += "  <- suspect"
        if row["name"] == extra["first_offending"]:
            status += "  <- first over its limit"
        elif row["name"] == extra["largest_jump"] and not row["kept"]:
            status += "  <- largest jump"
        lines.append((row["name"], fmt(row["rfn_mean"]), fmt(row["rfn_max"]), fmt(row["cos_err"]),
                      f"{row['sqnr_db']:.1f}", *((fmt(row["isolated_rfn"]),) if isolated else ()),
                      f"<= {fmt(row['threshold'])}", status))
    return _aligned(lines)


def weights_table(result: CheckResult) -> list[str]:
    """The tensors with the largest relative change (WeightDiff.worst), with their limits and likely cause."""
    report = result.extra["weights"]
    by_name = {t["name"]: t for t in report["tensors"]}
    n_compared = sum(t.get("rel") is not None for t in report["tensors"])
    lines = [("tensor", "layer", "type", "||d||/||ref||", "1 - cos", "gain", "limit", "status")]
    for t in (by_name[name] for name in report["worst"]):
        status = "ok" if t["passed"] else "FAIL" + (f"  {t['cause']}" if t["cause"] else "")
        lines.append((t["name"], "" if t["layer"] is None else str(t["layer"]), f"{t['ref_type']}->{t['cand_type']}",
                      fmt(t["rel"]), fmt(1.0 - t["cos"]), f"{t['gain']:.5g}", f"<= {fmt(t['limit_rel'])}", status))
    head = (f"weights: top {len(report['worst'])} of {n_compared} tensors by relative change "
            f"({report['naming']}; limits: {result.extra['limits_source']})")
    patterns = f"change pattern: {'; '.join(report['patterns'])}" if report["patterns"] else ""
    return [head, *_aligned(lines), *([patterns] if patterns else [])]


def quality_table(cmp: Comparison) -> list[str]:
    """Both models side by side on the next tokens (exllamav2 model_diff's summary)."""
    q = getattr(cmp, "quality", None)  # a weights-only comparison has none
    if q is None:
        return []
    if q.positions == 0:
        return [f"next-token quality: no position has a next token; probability MSE {fmt(q.prob_mse)}"]
    lines = [(f"next-token quality ({q.positions} positions)", "reference", "candidate", "change"),
             ("perplexity", fmt(q.ref_ppl), fmt(q.cand_ppl), f"{(q.cand_ppl / q.ref_ppl - 1) * 100:+.2f} %")]
    lines += [(f"top-{k} accuracy", f"{r:.4f}", f"{c:.4f}", f"{c - r:+.4f}")
              for k, (r, c) in enumerate(zip(q.ref_accuracy, q.cand_accuracy), start=1)]
    lines += [(f"top-{k} agreement (ordered)", "", f"{a:.4f}", "") for k, a in enumerate(q.agreement, start=1)]
    lines.append(("probability MSE", "", fmt(q.prob_mse), ""))
    return _aligned(lines)


def kl_summary(cmp: Pair) -> list[str]:
    """llama-perplexity's headline statistics in three lines (the full ladder is in the reports)."""
    s = getattr(cmp, "kl_stats", None)
    if s is None:
        return []
    return [f"llama-perplexity statistics over {s.tokens} next tokens: PPL(Q) {s.ppl_cand:.4f} ± {s.ppl_cand_se:.4f}, "
            f"PPL(base) {s.ppl_ref:.4f} ± {s.ppl_ref_se:.4f}, "
            f"PPL(Q)/PPL(base) {s.ppl_ratio:.5f} ± {s.ppl_ratio_se:.5f}",
            f"  KLD mean {fmt(s.kld_mean)} ± {fmt(s.kld_se)}, median {fmt(s.kld['median'])}, p99 {fmt(s.kld['p99'])}, "
            f"max {fmt(s.kld['max'])}",
            f"  same top {100 * s.same_top:.3f} ± {100 * s.same_top_se:.3f} %, RMS Δp {100 * s.rms_dp:.3f} ± "
            f"{100 * s.rms_dp_se:.3f} %"]


def verdict(result: CheckResult, cmp: Comparison) -> str:
    word = {"passed": "PASSED", "failed": "FAILED", "skipped": "SKIPPED", "error": "ERROR"}[result.status]
    return (f"modeldiff {result.name} {word}: {cmp.candidate.path.name} ({cmp.candidate.kind}, "
            f"{cmp.candidate.type_label()} -> class {cmp.quant_class}) vs reference {cmp.reference.path.name}")


def failure_message(result: CheckResult, cmp: Comparison) -> str:
    """Verdict line, table, where the threshold came from, worst positions or mismatches, hint."""
    lines = [verdict(result, cmp), *table(result.rows)]
    if result.threshold is not None:
        lines.append(f"threshold {result.threshold.value:g} from {result.threshold.source}")
    if result.name == "topk_acc_drop":
        lines += quality_table(cmp)
    if "layers" in result.extra:
        sources = sorted({row["threshold_source"] for row in result.extra["layers"]})
        lines += [f"per-layer rfn ({result.extra['source']}, thresholds from {', '.join(sources)}):",
                  *layer_table(result)]
    if result.details:
        lines.append("differences:" if result.name in EXACT_CHECKS else "where:" if result.name == "layers" else
                     "tensors over their limits:" if result.name == "weights" else "worst positions:")
        lines += [f"  {d}" for d in result.details]
    if result.hint:
        lines.append(f"hint: {result.hint}")
    return "\n".join(lines)


def baseline_message(cmp: Pair, changes: list, baseline: dict, differences: list[str]) -> str:
    """The baseline item's failure: which metrics got worse than the baseline, by how much."""
    worse = [c.metric for c in changes if not c.passed]
    lines = [f"modeldiff baseline FAILED: {cmp.candidate.path.name} got worse than the baseline "
             f"({baseline.get('created', '?')}) in {', '.join(worse)}",
             *_aligned([("metric", "baseline", "now", "worse by", "allowed", "status"),
                        *((c.metric, fmt(c.baseline), fmt(c.current), fmt(c.worse_by),
                           f"<= {fmt(c.allowed)} ({c.tolerance})", "ok" if c.passed else "FAIL") for c in changes)])]
    if differences:
        lines += ["the environment differs from the baseline's (numbers may move a little for that alone):",
                  *(f"  {d}" for d in differences[:10])]
    lines.append("hint: if the change is intended, record a new baseline with --modeldiff-save-baseline; a metric "
                 "missing on one side (nan) was not computed there - select its check with --modeldiff-checks")
    return "\n".join(lines)


def summary(cmp: Pair, results: list[CheckResult], error: str | None = None) -> list[str]:
    """One table per candidate for the terminal summary (``cmp`` is a WeightComparison when only
    the weights were compared; ``error`` says why the models were not compared, if so: such a
    candidate never reads as passed)."""
    failed = [r.name for r in results if r.status == FAILED]
    verdict = f"FAILED {', '.join(failed)}" if failed else "all checks passed"
    if error:
        verdict = f"NOT COMPARED ({error.splitlines()[0][:160]})" + (f"; FAILED {', '.join(failed)}" if failed else "")
    head = (f"{cmp.candidate.path.name} ({cmp.candidate.kind}, {cmp.candidate.type_label()}, class "
            f"{cmp.quant_class}) vs {cmp.reference.path.name}: {verdict}")
    rows = []
    for r in results:
        if r.rows and r.name not in EXACT_CHECKS:  # logit checks: one row per scope
            rows += r.rows
        elif r.status in ("skipped", "error"):
            rows.append(Row(r.name, r.status, r.reason[:60], r.status == "skipped"))
        else:
            rows.append(Row(r.name, f"{sum(x.passed for x in r.rows)}/{len(r.rows)} equal", "all equal",
                            r.status != FAILED))
    lines = [head, *table(rows), *quality_table(cmp), *kl_summary(cmp)]
    for r in results:
        if "layers" in r.extra:
            lines += [f"per-layer rfn ({r.extra['source']}):", *layer_table(r)]
        if "weights" in r.extra:
            lines += weights_table(r)
    return lines


def candidate_table(report: dict) -> list[str]:
    """The terminal's multi-candidate table (one row per candidate)."""
    rows = candidate_rows(report)
    return _aligned([tuple(h for h, _ in CANDIDATE_COLUMNS), *(tuple(cell(v) for v in row) for row in rows)])
