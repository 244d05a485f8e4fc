"""Text for machines: the JSON and CSV reports, the candidate table's columns, plots beside them."""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from ..checks.logits import logit_metric_values
from ..checks.results import CheckResult, fmt
from ..engine.records import Comparison, Pair
from ..formats.atomic import write_atomic
from ..metrics.klstats import kld_histogram


def to_json(comparisons: dict[str, tuple[Pair, list[CheckResult]]], errors: dict[str, str] | None = None,
            environment: dict | None = None, gate: str | None = None) -> dict:
    """Every compared candidate's checks, metrics (whichever checks ran), llama-perplexity's KL
    statistics, KLD histogram and size; candidates that could not be compared carry "error".
    ``environment`` (ModelDiff.environment()) records versions, settings and model hashes."""
    from ..checks.registry import DEFAULT_GATE

    out = {"format": "pytest-modeldiff report v2", "gate": gate or DEFAULT_GATE, "environment": environment or {},
           "candidates": []}
    for cmp, results in comparisons.values():
        ran = isinstance(cmp, Comparison) and cmp.stats is not None  # else no model ran
        if "reference" not in out:
            dtype = cmp.reference.compute_dtype()
            out["reference"] = {"path": str(cmp.reference.path), "runner": cmp.reference.kind,
                                "quant_type": cmp.reference.quant_type(), "type": cmp.reference.type_label(),
                                "size": cmp.reference.size(), "dtype": dtype and dtype[0],
                                "dtype_reason": dtype and dtype[1]}
        out["candidates"].append({
            "name": cmp.name, "path": str(cmp.candidate.path), "runner": cmp.candidate.kind,
            "quant_type": cmp.quant_type, "type": cmp.candidate.type_label(), "quant_class": cmp.quant_class,
            "size": cmp.candidate.size(),
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
    ("type", lambda c: c.get("type") or c.get("quant_type")),  # as run: "float32 (stored bfloat16)"
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
        known = {"candidate": f"{Path(ref['path']).name} (reference)",
                 "type": ref.get("type") or ref.get("quant_type"),
                 "size GB": size["bytes"] / 1e9 if size else None, "BPW": size["bpw"] if size else None,
                 "PPL": first["kl_stats"]["ppl_ref"] if first else None}
        rows.append([known.get(heading) for heading, _ in CANDIDATE_COLUMNS])
    rows += [[read(c) for _, read in CANDIDATE_COLUMNS] for c in report["candidates"] if "checks" in c]
    return rows


def cell(value) -> str:
    """A table cell: numbers with 4 significant digits, nothing for unknown."""
    return "" if value is None else fmt(value) if isinstance(value, float) else str(value)


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
    layer rfn and one per tensor of the weights check (its relative change). Numbers are written
    as repr, so they read back to the JSON's exact floats."""
    rows = []
    for cand in report["candidates"]:
        def row(**cells):
            rows.append({**dict.fromkeys(CSV_COLUMNS, ""), "candidate": cand["name"],
                         "quant_type": cand.get("type") or cand.get("quant_type", ""),
                         **{k: _cell(v) for k, v in cells.items()}})

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
