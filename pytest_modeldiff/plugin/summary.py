"""The end of the run: the summary section (a table per candidate, the candidates table, what
could not be compared) and the report files, computed from results the items already made."""
from __future__ import annotations

import os
from pathlib import Path

from ..checks.registry import CHECKS
from .session import Session


def _all_results(state: Session) -> dict:
    """The built-in checks (--modeldiff-checks, all if none) of every candidate, with CLI > ini >
    default thresholds (markers belong to the tests that carry them): the checks whose input was
    computed during the run - nothing new is read or run for the summary."""
    names = state.checks or list(CHECKS)
    comparisons, weights = state.engine.computed(), state.engine.computed_weights()
    out = {}
    for key in state.engine.candidates:
        done = [n for n in names if key in (weights if CHECKS[n].reads == "weights" else comparisons)]
        if done:
            out[key] = (comparisons.get(key) or weights[key], [state.result(key, name) for name in done])
    return out


def write_summary(terminalreporter, state: Session) -> None:
    """The summary section (a table per candidate, what could not be compared, the candidates
    table), then every report file asked for, each announced with its path."""
    from ..report.data import to_json
    from ..report.text import candidate_table, summary

    results = _all_results(state)
    terminalreporter.section("modeldiff summary (built-in checks; thresholds from CLI > ini > default)")
    for key, (cmp, checks) in results.items():
        for line in summary(cmp, checks, state.errors.get(key)):
            terminalreporter.write_line(line)
        terminalreporter.write_line("")
    for key, message in state.errors.items():
        terminalreporter.write_line(f"{key}: not compared: {message}", red=True)
    data = to_json(results, state.errors, state.engine.environment())
    if any(c.get("kl_stats") for c in data["candidates"]):
        terminalreporter.write_line("candidates (KL columns: llama-perplexity's statistics over the next tokens):")
        for line in candidate_table(data):
            terminalreporter.write_line(line)
    for kind, path in write_reports(state.values, results, data):
        terminalreporter.write_line(f"modeldiff: {kind} written to {os.path.abspath(path)}")


def write_reports(values: dict, results: dict, data: dict) -> list[tuple[str, Path]]:
    """The report files the options ask for (--modeldiff-json/-csv/-markdown/-html/-save-baseline),
    as (what, path) in the order written; plots beside the JSON come before it."""
    from ..formats.atomic import write_atomic
    from ..report.baseline import baseline_from_report
    from ..report.data import write_csv, write_json, write_layer_plots
    from ..report.pages import markdown_report, write_html

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
