"""Baselines: a run's every metric saved to a file, and a later run (the next pull request)
compared against it, failing when a metric got worse by more than its tolerance.

    --modeldiff-save-baseline base.json                      # main branch
    --modeldiff-baseline base.json --modeldiff-compare-fail kld:10% ppl_ratio:0.002

A tolerance is METRIC:AMOUNT, AMOUNT an absolute number or a percentage of the baseline value;
"worse" follows the metric's direction in the registry (larger kld, smaller same_top). The
environment (library versions, settings, the reference's file hashes) is saved beside the numbers;
a difference is reported as a warning, since numbers from another environment move a little.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..checks.registry import CHECKS, HIGHER
from ..errors import ModelDiffError, ModelDiffUsageError
from ..formats.fields import short

FORMAT = "pytest-modeldiff baseline v1"
# Metrics a tolerance may name: every check with a threshold (its headline value).
COMPARABLE = tuple(name for name, check in CHECKS.items() if check.has_threshold)


@dataclass(frozen=True)
class Tolerance:
    metric: str
    amount: float
    relative: bool  # amount is a fraction of the baseline value
    expression: str

    def allowed(self, base: float) -> float:
        return abs(base) * self.amount if self.relative else self.amount


def parse_tolerances(expressions: list[str], source: str = "--modeldiff-compare-fail") -> list[Tolerance]:
    """"kld:10%", "ppl_ratio:0.002" (also comma or space separated); malformed ones are usage errors."""
    out = []
    for entry in expressions:
        for expression in str(entry).replace(",", " ").split():
            metric, sep, amount = expression.partition(":")
            relative = amount.endswith("%")
            try:
                value = float(amount[:-1] if relative else amount)
            except ValueError:
                value = float("nan")
            if not sep or metric not in COMPARABLE or not math.isfinite(value) or value < 0:
                why = (f"unknown metric {metric!r}; known: {', '.join(COMPARABLE)}" if sep and metric not in COMPARABLE
                       else "expected METRIC:AMOUNT or METRIC:PERCENT%, e.g. kld:10% or ppl_ratio:0.002")
                raise ModelDiffUsageError(f"{source}: {expression!r}: {why}")
            out.append(Tolerance(metric, value / 100 if relative else value, relative, expression))
    return out


def candidate_metrics(candidate: dict) -> dict[str, float]:
    """A JSON report candidate's numbers: every logit metric, each check's headline value (over
    those where both exist) and llama-perplexity's scalar statistics as ``kl.<name>``."""
    values = dict(candidate.get("metrics") or {})
    values.update({c["name"]: c["value"] for c in candidate.get("checks", []) if isinstance(c.get("value"), float)})
    for key, value in (candidate.get("kl_stats") or {}).items():
        if isinstance(value, (int, float)):
            values[f"kl.{key}"] = value
    return values


def baseline_from_report(report: dict) -> dict:
    return {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "environment": report.get("environment", {}), "reference": report.get("reference"),
            "candidates": {c["name"]: {"quant_type": c.get("quant_type"), "metrics": candidate_metrics(c)}
                           for c in report["candidates"] if "checks" in c}}


def load_baseline(path: Path) -> dict:
    """A saved baseline, its fields checked (a damaged file is a one-line error naming it, never
    a traceback in the baseline items); "nan"/"inf" metric values (report._finite) become floats."""
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ModelDiffError(f"{path}: baseline file not found (write one with --modeldiff-save-baseline)") from None
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad UTF-8 or JSON
        why = f"{type(exc).__name__}: {exc}"
        raise ModelDiffError(f"{path}: not a readable baseline ({why})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = short(data.get("format") if isinstance(data, dict) else None)
        raise ModelDiffError(f"{path}: not a pytest-modeldiff baseline (format {found}, expected {FORMAT!r})")
    problem = _baseline_problem(data)
    if problem:
        raise ModelDiffError(f"{path}: damaged baseline: {problem}")
    for entry in data["candidates"].values():
        entry["metrics"] = {name: _number(value) for name, value in entry["metrics"].items()}
    return data


_NON_FINITE = ("nan", "inf", "-inf")  # how the JSON report spells them (report._finite)


def _baseline_problem(data: dict) -> str | None:
    """What is wrong with the fields a comparison reads, None if nothing."""
    environment, candidates = data.get("environment", {}), data.get("candidates")
    if not isinstance(environment, dict) or not all(isinstance(environment.get(part, {}), dict)
                                                    for part in ("versions", "settings", "models_sha256")):
        return "environment is not an object of versions, settings and models_sha256 objects"
    if not isinstance(data.get("created", ""), str):
        return f"created is {short(data.get('created'))}, expected a date string"
    if not isinstance(candidates, dict):
        return f"candidates is {short(candidates)}, expected an object of candidate names"
    for name, entry in candidates.items():
        metrics = entry.get("metrics") if isinstance(entry, dict) else None
        if not isinstance(metrics, dict):
            return f"candidate {name!r} has no metrics object"
        bad = next((k for k, v in metrics.items() if not _is_metric_value(v)), None)
        if bad is not None:
            return (f"candidate {name!r} metric {bad!r} is {short(metrics[bad])}, expected a number, null or "
                    f"one of {', '.join(_NON_FINITE)}")
    return None


def _is_metric_value(value) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) <= sys.float_info.max  # JSON integers have no bound; floats do
    return value is None or isinstance(value, float) or value in _NON_FINITE


def _number(value) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class Change:
    metric: str
    baseline: float
    current: float
    allowed: float
    tolerance: str
    passed: bool

    @property
    def worse_by(self) -> float:
        """How much worse than the baseline (negative: better), in the metric's units."""
        delta = self.current - self.baseline
        return -delta if CHECKS[self.metric].direction == HIGHER else delta


def compare(current: dict[str, float], base: dict[str, float], tolerances: list[Tolerance]) -> list[Change]:
    """Each tolerance's metric, now against the baseline; a metric missing on either side fails
    (the baseline cannot vouch for it)."""
    out = []
    for tol in tolerances:
        now, then = current.get(tol.metric), base.get(tol.metric)
        if now is None or then is None:
            out.append(Change(tol.metric, float("nan") if then is None else then,
                              float("nan") if now is None else now, float("nan"), tol.expression, False))
            continue
        allowed = tol.allowed(then)
        change = Change(tol.metric, then, now, allowed, tol.expression, False)
        out.append(Change(tol.metric, then, now, allowed, tol.expression,
                          math.isfinite(now) and change.worse_by <= allowed))
    return out


def environment_differences(now: dict, then: dict) -> list[str]:
    """Lines naming what differs between two runs' environments (versions, settings, models)."""
    lines = []
    for part in ("versions", "settings", "models_sha256"):
        a, b = then.get(part, {}), now.get(part, {})
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                lines.append(f"{part} {key}: baseline {a.get(key)!r}, now {b.get(key)!r}")
    return lines
