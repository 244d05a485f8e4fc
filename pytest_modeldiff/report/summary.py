"""The end-of-run summary, the same for the pytest plugin and the command line: which gate ran,
the candidates table, per failing candidate what failed and why, and the verdict line; with
``full`` (pytest -v, --modeldiff-report=full) every candidate's check, quality, per-layer and
weight tables first.

Lines come as (text, markup) with markup for pytest's terminal writer ({"red": True}, ...); the
command line prints the text alone.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable

from ..checks.registry import CHECKS, DEFAULT_GATE, GATES
from ..checks.results import ERROR, FAILED, CheckResult
from .data import CANDIDATE_COLUMNS, cell, failures
from .text import _aligned, summary

Line = tuple[str, dict]

# The candidates table's columns by default (all of CANDIDATE_COLUMNS with full)
SHORT_COLUMNS = ("candidate", "type", "size GB", "PPL", "PPL ratio", "KLD mean", "KLD p99", "same top", "NMSE",
                 "verdict")
NOTE_PPL_RATIO = 1.10  # a passing candidate more than 10 % worse in perplexity gets a note
DETAILS_PER_CHECK = 2  # worst positions / mismatches shown per failed check (all of them in pytest's failures)


def gate_line(gate: str) -> str:
    """Which default limits ran and what passing them means."""
    other = next(g for g in GATES if g != gate)
    return (f"modeldiff gate {gate}: the default limits {GATES[gate]}; --modeldiff-gate {other} "
            f"{'judges quality' if other == 'quality' else 'only fails wrong conversions'}")


def candidates_table(data: dict, full: bool) -> list[str]:
    """The candidates table: the reference's row first, then one row per compared candidate."""
    from .data import candidate_rows

    keep = [i for i, (heading, _) in enumerate(CANDIDATE_COLUMNS) if full or heading in SHORT_COLUMNS]
    rows = candidate_rows(data)
    return _aligned([tuple(CANDIDATE_COLUMNS[i][0] for i in keep),
                     *(tuple(cell(row[i]) for i in keep) for row in rows)])


def why(result: CheckResult) -> list[str]:
    """A failed (or errored) check in a few lines: the rows over their limits, where the limit
    came from, the first details and the hint."""
    if result.status == ERROR:
        return [f"  {result.name}: error: {result.reason}"]
    source = f" (threshold from {result.threshold.source})" if result.threshold is not None else ""
    bad = [row for row in result.rows if not row.passed]
    lines = [f"  {result.name}: {row.metric}: {row.value}, limit {row.threshold}{source if i == 0 else ''}"
             for i, row in enumerate(bad)] or [f"  {result.name}: failed{source}"]
    lines += [f"    {d[:200]}" for d in result.details[:DETAILS_PER_CHECK]]
    if len(result.details) > DETAILS_PER_CHECK:
        lines.append(f"    ... {len(result.details) - DETAILS_PER_CHECK} more in the full failure message "
                     "(pytest's failures section; -v for the command line)")
    if result.hint:
        lines.append(f"    hint: {result.hint}")
    return lines


def summary_lines(results: dict, errors: dict[str, str], data: dict, gate: str, full: bool,
                  quality_failures: Callable[[str], list[str]] | None = None) -> list[Line]:
    """Everything above the report files and the verdict. ``results``: {candidate key: (the
    Comparison or WeightComparison, [CheckResult])}; ``quality_failures(key)``: the checks the
    quality gate would fail for a candidate that passed the broken gate."""
    out: list[Line] = [(gate_line(gate), {"bold": True})]
    if full:
        for key, (cmp, checks) in results.items():
            out += [(line, {}) for line in summary(cmp, checks, errors.get(key))]
            out.append(("", {}))
    compared = [c for c in data["candidates"] if "checks" in c]
    if compared:
        out.append(("candidates" + (" (KL columns: llama-perplexity's statistics over the next tokens)"
                                    if any(c.get("kl_stats") for c in compared) else "") + ":", {}))
        out += [(line, {}) for line in candidates_table(data, full)]
    for key, (cmp, checks) in results.items():
        failed = [r for r in checks if r.status in (FAILED, ERROR)]
        if failed:
            out.append((f"{key} FAILED ({cmp.candidate.kind}, {cmp.candidate.type_label()}, class {cmp.quant_class}): "
                        f"{', '.join(r.name for r in failed)}", {"red": True, "bold": True}))
            for r in failed:
                out += [(line, {}) for line in why(r)]
    for key, message in errors.items():
        out.append((f"{key}: not compared: {message}", {"red": True}))
    for key in results:  # passed, but lossy: say so (the gates judge by quant class)
        entry = _entry(data, key)
        if failures(entry):
            continue
        ratio = (entry.get("kl_stats") or {}).get("ppl_ratio")
        notes = [f"its PPL is {100 * (ratio - 1):+.1f} % over the reference's"] if isinstance(ratio, float) and \
            ratio > NOTE_PPL_RATIO else []
        names = quality_failures(key) if gate == DEFAULT_GATE and quality_failures is not None else []
        if names:
            notes.append(f"gate quality would fail {', '.join(names)} (worse than a correct quantizer makes class "
                         f"{entry.get('quant_class')})")
        if notes:
            out.append((f"note: {key} passed gate {gate}, but {'; '.join(notes)}", {"yellow": True}))
    return out


def verdict_line(data: dict, gate: str) -> Line:
    """The last line: how many candidates passed the gate, and which failed what."""
    n = len(data["candidates"])
    bad = [c for c in data["candidates"] if failures(c)]
    if not bad:
        which = "the candidate" if n == 1 else f"all {n} candidates"
        return f"modeldiff: PASSED: {which} passed gate {gate}", {"green": True, "bold": True}
    names = "; ".join(f"{c['name']} ({', '.join(failures(c))})" for c in bad)
    return f"modeldiff: FAILED: {len(bad)} of {n} candidates failed gate {gate}: {names}", {"red": True, "bold": True}


def written_lines(written: Iterable[tuple[str, object]]) -> list[Line]:
    """A line per report file; the per-layer plots (two per candidate) in one line."""
    written = list(written)
    plots = [Path(path) for kind, path in written if kind == "per-layer plot"]
    out = []
    if plots:
        names = ", ".join(p.name for p in plots[:4]) + (f", ... ({len(plots)} files)" if len(plots) > 4 else "")
        out.append((f"modeldiff: per-layer plots written to {os.path.abspath(plots[0].parent)}: {names}", {}))
    return out + [(f"modeldiff: {kind} written to {os.path.abspath(path)}", {})
                  for kind, path in written if kind != "per-layer plot"]


def quality_checker(thresholds, results: dict) -> Callable[[str], list[str]]:
    """``quality_failures`` for summary_lines: reruns the checks the quality gate tightens on the
    numbers already computed (no model runs), with the run's own CLI/ini/given limits."""
    from ..checks.run import run_check

    quality = thresholds.with_gate("quality")

    def failing(key: str) -> list[str]:
        cmp, checks = results[key]
        if getattr(cmp, "stats", None) is None:  # only the weights were compared
            return []
        limits = quality.resolve(cmp.quant_class)
        return [r.name for r in checks if CHECKS[r.name].quality and r.status != FAILED
                and run_check(r.name, cmp, limits).status == FAILED]

    return failing


def _entry(data: dict, key: str) -> dict:
    return next((c for c in data["candidates"] if c["name"] == key), {})


def write_reports(values: dict, results: dict, data: dict) -> list[tuple[str, Path]]:
    """The report files the options ask for (--modeldiff-json/-csv/-markdown/-html/-save-baseline),
    as (what, path) in the order written; plots beside the JSON come before it."""
    from ..formats.atomic import write_atomic
    from .baseline import baseline_from_report
    from .data import write_csv, write_json, write_layer_plots
    from .pages import markdown_report, write_html

    written: list[tuple[str, Path]] = []
    if values["json"]:
        write_json(values["json"], data)
        written += [("per-layer plot", plot) for plot in write_layer_plots(results, values["json"])]
        written.append(("JSON report", values["json"]))
    if values["csv"]:
        write_csv(values["csv"], data)
        written.append(("CSV report", values["csv"]))
    if values["markdown"]:
        text = markdown_report(data)
        write_atomic(values["markdown"], text)
        if os.environ.get("GITHUB_STEP_SUMMARY"):  # GitHub Actions shows it on the run's page
            with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as summary_file:
                summary_file.write(text + "\n")
        written.append(("Markdown report", values["markdown"]))
    if values["html"]:
        write_html(values["html"], data)
        written.append(("HTML report", values["html"]))
    if values["save_baseline"]:
        write_json(Path(values["save_baseline"]), baseline_from_report(data))
        written.append(("baseline", values["save_baseline"]))
    return written
