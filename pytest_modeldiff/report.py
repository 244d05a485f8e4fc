"""Human and machine output: failure messages, the terminal summary and the JSON report."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterable

from .checks import EXACT_CHECKS, FAILED, CheckResult, Row, fmt
from .compare import Comparison


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


def verdict(result: CheckResult, cmp: Comparison) -> str:
    word = {"passed": "PASSED", "failed": "FAILED", "skipped": "SKIPPED", "error": "ERROR"}[result.status]
    return (f"modeldiff {result.name} {word}: {cmp.candidate.path.name} ({cmp.candidate.kind}, "
            f"{cmp.quant_type} -> class {cmp.quant_class}) vs reference {cmp.reference.path.name}")


def failure_message(result: CheckResult, cmp: Comparison) -> str:
    """Verdict line, table, where the threshold came from, worst positions or mismatches, hint."""
    lines = [verdict(result, cmp), *table(result.rows)]
    if result.threshold is not None:
        lines.append(f"threshold {result.threshold.value:g} from {result.threshold.source}")
    if "layers" in result.extra:
        sources = sorted({row["threshold_source"] for row in result.extra["layers"]})
        lines += [f"per-layer rfn ({result.extra['source']}, thresholds from {', '.join(sources)}):",
                  *layer_table(result)]
    if result.details:
        lines.append("differences:" if result.name in EXACT_CHECKS else
                     "where:" if result.name == "layers" else "worst positions:")
        lines += [f"  {d}" for d in result.details]
    if result.hint:
        lines.append(f"hint: {result.hint}")
    return "\n".join(lines)


def summary(cmp: Comparison, results: list[CheckResult]) -> list[str]:
    """One table per candidate for the terminal summary."""
    failed = [r.name for r in results if r.status == FAILED]
    head = (f"{cmp.candidate.path.name} ({cmp.candidate.kind}, {cmp.quant_type}, class {cmp.quant_class}) "
            f"vs {cmp.reference.path.name}: " + (f"FAILED {', '.join(failed)}" if failed else "all checks passed"))
    rows = []
    for r in results:
        if r.rows and r.name not in EXACT_CHECKS:  # logit checks: one row per scope
            rows += r.rows
        elif r.status in ("skipped", "error"):
            rows.append(Row(r.name, r.status, r.reason[:60], r.status == "skipped"))
        else:
            rows.append(Row(r.name, f"{sum(x.passed for x in r.rows)}/{len(r.rows)} equal", "all equal",
                            r.status != FAILED))
    lines = [head, *table(rows)]
    for r in results:
        if "layers" in r.extra:
            lines += [f"per-layer rfn ({r.extra['source']}):", *layer_table(r)]
    return lines


def to_json(comparisons: dict[str, tuple[Comparison, list[CheckResult]]], errors: dict[str, str] | None = None) -> dict:
    """Every compared candidate's checks; candidates that could not be compared carry "error"."""
    out = {"format": "pytest-modeldiff report v1", "candidates": []}
    for cmp, results in comparisons.values():
        out["reference"] = {"path": str(cmp.reference.path), "runner": cmp.reference.kind,
                            "quant_type": cmp.reference.quant_type()}
        out["candidates"].append({
            "name": cmp.name, "path": str(cmp.candidate.path), "runner": cmp.candidate.kind,
            "quant_type": cmp.quant_type, "quant_class": cmp.quant_class,
            "positions": 0 if cmp.stats is None else len(cmp.stats),
            "sequences": len(cmp.eval.sequences), "timings": cmp.timings,
            "checks": [{
                "name": r.name, "status": r.status, "value": r.value,
                "threshold": None if r.threshold is None else r.threshold.value,
                "threshold_source": None if r.threshold is None else r.threshold.source,
                "rows": [row.__dict__ for row in r.rows], "details": r.details,
                "reason": r.reason or None, **({"extra": r.extra} if r.extra else {}),
            } for r in results],
        })
    for name, message in (errors or {}).items():
        out["candidates"].append({"name": name, "error": message})
    return _finite(out)


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
    _write_atomic(Path(path), json.dumps(data, indent=2, default=str, allow_nan=False))


def write_layer_plots(comparisons: dict[str, tuple[Comparison, list[CheckResult]]], json_path: Path) -> list[Path]:
    """rfn-per-layer SVG for each candidate with a layers result, next to the JSON report:
    <report stem>-rfn-<candidate>.svg."""
    from .plots import rfn_svg

    written = []
    for key, (cmp, results) in comparisons.items():
        for r in results:
            if "layers" not in r.extra:
                continue
            rows = r.extra["layers"]
            svg = rfn_svg(f"{cmp.candidate.path.name} vs {cmp.reference.path.name}: per-layer rfn",
                          [row["name"] for row in rows], [float(row["rfn_mean"]) for row in rows],
                          [row["threshold"] for row in rows], [row["isolated_rfn"] for row in rows])
            path = Path(json_path).with_name(f"{Path(json_path).stem}-rfn-{key}.svg")
            _write_atomic(path, svg)
            written.append(path)
    return written


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
