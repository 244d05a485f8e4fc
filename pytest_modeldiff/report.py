"""Human and machine output: failure messages, the terminal summary, the JSON and CSV reports."""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Iterable

from .atomic import write_atomic
from .checks import EXACT_CHECKS, FAILED, CheckResult, Row, fmt, logit_metric_values
from .engine import Comparison, Pair
from .klstats import kld_histogram


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
            f"PPL(base) {s.ppl_ref:.4f} ± {s.ppl_ref_se:.4f}, PPL(Q)/PPL(base) {s.ppl_ratio:.5f} ± {s.ppl_ratio_se:.5f}",
            f"  KLD mean {fmt(s.kld_mean)} ± {fmt(s.kld_se)}, median {fmt(s.kld['median'])}, p99 {fmt(s.kld['p99'])}, "
            f"max {fmt(s.kld['max'])}",
            f"  same top {100 * s.same_top:.3f} ± {100 * s.same_top_se:.3f} %, RMS Δp {100 * s.rms_dp:.3f} ± "
            f"{100 * s.rms_dp_se:.3f} %"]


def verdict(result: CheckResult, cmp: Comparison) -> str:
    word = {"passed": "PASSED", "failed": "FAILED", "skipped": "SKIPPED", "error": "ERROR"}[result.status]
    return (f"modeldiff {result.name} {word}: {cmp.candidate.path.name} ({cmp.candidate.kind}, "
            f"{cmp.quant_type} -> class {cmp.quant_class}) vs reference {cmp.reference.path.name}")


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
                        *((c.metric, fmt(c.baseline), fmt(c.current), fmt(c.worse_by), f"<= {fmt(c.allowed)} ({c.tolerance})",
                           "ok" if c.passed else "FAIL") for c in changes)])]
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
    head = (f"{cmp.candidate.path.name} ({cmp.candidate.kind}, {cmp.quant_type}, class {cmp.quant_class}) "
            f"vs {cmp.reference.path.name}: {verdict}")
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


def to_json(comparisons: dict[str, tuple[Pair, list[CheckResult]]], errors: dict[str, str] | None = None,
            environment: dict | None = None) -> dict:
    """Every compared candidate's checks, metrics (whichever checks ran), llama-perplexity's KL
    statistics, KLD histogram and size; candidates that could not be compared carry "error".
    ``environment`` (ModelDiff.environment()) records versions, settings and model hashes."""
    out = {"format": "pytest-modeldiff report v2", "environment": environment or {}, "candidates": []}
    for cmp, results in comparisons.values():
        ran = isinstance(cmp, Comparison) and cmp.stats is not None  # else no model ran
        if "reference" not in out:
            out["reference"] = {"path": str(cmp.reference.path), "runner": cmp.reference.kind,
                                "quant_type": cmp.reference.quant_type(), "size": cmp.reference.size()}
        out["candidates"].append({
            "name": cmp.name, "path": str(cmp.candidate.path), "runner": cmp.candidate.kind,
            "quant_type": cmp.quant_type, "quant_class": cmp.quant_class, "size": cmp.candidate.size(),
            "positions": len(cmp.stats) if ran else 0,
            "sequences": len(cmp.eval.sequences) if isinstance(cmp, Comparison) else 0,
            "timings": cmp.timings if isinstance(cmp, Comparison) else {},
            "quality": cmp.quality.to_dict() if ran else None,
            "metrics": logit_metric_values(cmp) if ran else {},
            "kl_stats": cmp.kl_stats.to_dict() if ran and cmp.kl_stats is not None else None,
            "kld_histogram": kld_histogram(cmp.stats.kld) if ran else None,
            "checks": [{
                "name": r.name, "status": r.status, "value": r.value,
                # per-layer limits are in extra["layers"]
                "threshold": r.threshold.value if r.threshold and isinstance(r.threshold.value, float) else None,
                "threshold_source": None if r.threshold is None else r.threshold.source,
                "rows": [row.__dict__ for row in r.rows], "details": r.details,
                "reason": r.reason or None, **({"extra": r.extra} if r.extra else {}),
            } for r in results],
        })
    for name, message in (errors or {}).items():  # beside the weights result, if that was computed
        entry = next((c for c in out["candidates"] if c["name"] == name), None)
        if entry is None:
            out["candidates"].append({"name": name, "error": message})
        else:
            entry["error"] = message
    return _finite(out)


# The multi-candidate table: (heading, how to read it from a JSON candidate entry). The KL columns
# are llama-perplexity's statistics over the positions with a next token.
def _kl(key, sub=None):
    return lambda c: None if not c.get("kl_stats") else c["kl_stats"][key] if sub is None else c["kl_stats"][key][sub]


def failures(cand: dict) -> list[str]:
    """What went wrong with one candidate of the JSON report: "error" if it could not be compared,
    its failed and errored checks."""
    failed = [check["name"] for check in cand.get("checks", []) if check["status"] in ("failed", "error")]
    return (["error"] if "error" in cand else []) + failed


CANDIDATE_COLUMNS = (
    ("candidate", lambda c: c["name"]),
    ("type", lambda c: c.get("quant_type")),
    ("size GB", lambda c: c["size"]["bytes"] / 1e9 if c.get("size") else None),
    ("BPW", lambda c: c["size"]["bpw"] if c.get("size") else None),
    ("PPL", _kl("ppl_cand")),
    ("PPL ratio", _kl("ppl_ratio")),
    ("KLD mean", _kl("kld_mean")),
    ("KLD median", _kl("kld", "median")),
    ("KLD p99", _kl("kld", "p99")),
    ("KLD max", _kl("kld", "max")),
    ("same top", _kl("same_top")),
    ("RMS Δp", _kl("rms_dp")),
    ("NMSE", lambda c: c.get("metrics", {}).get("nmse")),
    ("max |diff|", lambda c: c.get("metrics", {}).get("max_abs")),
    # quality per GB: the fraction of positions whose top token survives, per GB of weights
    ("same top / GB", lambda c: c["kl_stats"]["same_top"] / (c["size"]["bytes"] / 1e9)
     if c.get("kl_stats") and c.get("size") and c["size"]["bytes"] else None),
    ("verdict", lambda c: f"FAIL: {', '.join(failures(c))}" if failures(c) else "pass"),
)


def candidate_rows(report: dict) -> list[list]:
    """One row per compared candidate in CANDIDATE_COLUMNS order (None where unknown), the
    reference first (its size and PPL)."""
    rows = []
    ref = report.get("reference")
    first = next((c for c in report["candidates"] if c.get("kl_stats")), None)
    if ref:
        size = ref.get("size")
        known = {"candidate": f"{Path(ref['path']).name} (reference)", "type": ref.get("quant_type"),
                 "size GB": size["bytes"] / 1e9 if size else None, "BPW": size["bpw"] if size else None,
                 "PPL": first["kl_stats"]["ppl_ref"] if first else None}
        rows.append([known.get(heading) for heading, _ in CANDIDATE_COLUMNS])
    rows += [[read(c) for _, read in CANDIDATE_COLUMNS] for c in report["candidates"] if "checks" in c]
    return rows


def cell(value) -> str:
    """A table cell: numbers with 4 significant digits, nothing for unknown."""
    return "" if value is None else fmt(value) if isinstance(value, float) else str(value)


def candidate_table(report: dict) -> list[str]:
    """The terminal's multi-candidate table (one row per candidate)."""
    rows = candidate_rows(report)
    return _aligned([tuple(h for h, _ in CANDIDATE_COLUMNS), *(tuple(cell(v) for v in row) for row in rows)])


def _finite(value):
    """Strict JSON: NaN/Inf (NaN logits, a perfect NMSE's -inf dB) become strings."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json(path: Path, data: dict) -> None:
    write_atomic(Path(path), json.dumps(data, indent=2, default=str, allow_nan=False))


CSV_COLUMNS = ("candidate", "quant_type", "check", "metric", "layer", "tensor", "reference", "value", "threshold",
               "status")


def csv_rows(report: dict) -> list[dict]:
    """The JSON report (``to_json``) as flat rows, in CSV_COLUMNS: per candidate one row per
    check (its headline value), one per quality metric (reference beside candidate), one per
    layer rfn and one per tensor of the weights check (its relative change). Numbers are written as repr, so they read back to the JSON's exact floats."""
    rows = []
    for cand in report["candidates"]:
        def row(**cells):
            rows.append({**dict.fromkeys(CSV_COLUMNS, ""), "candidate": cand["name"],
                         "quant_type": cand.get("quant_type", ""), **{k: _cell(v) for k, v in cells.items()}})

        if "error" in cand:
            row(status="error", metric=cand["error"])
        for check in cand.get("checks", []):
            row(check=check["name"], metric=check["name"], value=check["value"], threshold=check["threshold"],
                status=check["status"])
            for layer in check.get("extra", {}).get("layers", []):
                row(check=check["name"], metric="rfn", layer=layer["name"], value=layer["rfn_mean"],
                    threshold=layer["threshold"], status="kept" if layer["kept"] else
                    "passed" if layer["passed"] else "failed")
            for tensor in check.get("extra", {}).get("weights", {}).get("tensors", []):
                row(check=check["name"], metric="weight_rel", layer=tensor["layer"], tensor=tensor["name"],
                    value=tensor.get("rel"),
                    threshold=tensor["limit_rel"], status=("passed" if tensor["passed"] else "failed") +
                    ("" if tensor["status"] in ("modified", "unchanged") else f" ({tensor['status']})"))
        q = cand.get("quality")
        if q and q["positions"]:
            row(metric="perplexity", reference=q["ref_ppl"], value=q["cand_ppl"])
            for k, (ref, value) in enumerate(zip(q["ref_accuracy"], q["cand_accuracy"]), start=1):
                row(metric=f"top{k}_accuracy", reference=ref, value=value)
            for k, value in enumerate(q["agreement"], start=1):
                row(metric=f"top{k}_agreement", value=value)
        if q:
            row(metric="prob_mse", value=q["prob_mse"])
    return rows


def _cell(value) -> str:
    return "" if value is None else repr(value) if isinstance(value, float) else str(value)


def write_csv(path: Path, report: dict) -> None:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows(report))
    write_atomic(Path(path), out.getvalue())


def write_layer_plots(comparisons: dict[str, tuple[Comparison, list[CheckResult]]], json_path: Path) -> list[Path]:
    """Per-layer SVGs next to the JSON report, for each candidate: <report stem>-rfn-<candidate>.svg
    (the layers check's rfn) and <report stem>-weights-<candidate>.svg (the weights' mean relative
    change per decoder layer, bars)."""
    from .plots import bars_svg, rfn_svg

    written = []
    for key, (cmp, results) in comparisons.items():
        title = f"{cmp.candidate.path.name} vs {cmp.reference.path.name}"
        for r in results:
            if "layers" in r.extra:
                rows = r.extra["layers"]
                svg, kind = rfn_svg(f"{title}: per-layer rfn", [row["name"] for row in rows],
                                    [float(row["rfn_mean"]) for row in rows], [row["threshold"] for row in rows],
                                    [row["isolated_rfn"] for row in rows]), "rfn"
            elif "weights" in r.extra and r.extra["weights"]["layers"]:
                per_layer = r.extra["weights"]["layers"]
                svg, kind = bars_svg(f"{title}: weights per layer", list(per_layer), list(per_layer.values()),
                                     "mean ||d||/||ref|| of the layer's tensors"), "weights"
            else:
                continue
            path = Path(json_path).with_name(f"{Path(json_path).stem}-{kind}-{key}.svg")
            write_atomic(path, svg)
            written.append(path)
    return written
