"""The end of the run: the summary section (report/summary.py), the report files and the
verdict line, computed from results the items already made."""
from __future__ import annotations

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
    """The summary section (report/summary.py: the gate, the candidates table, what failed and
    why; with -v or --modeldiff-report=full every candidate's tables first), every report file
    asked for, each announced with its path, and the verdict line."""
    from ..report.data import to_json
    from ..report.summary import quality_checker, summary_lines, verdict_line, write_reports, written_lines

    results = _all_results(state)
    gate = state.thresholds.gate
    terminalreporter.section(f"modeldiff summary (gate {gate}; thresholds from marker > CLI > ini > default)")
    data = to_json(results, state.errors, state.engine.environment(), gate=gate)
    lines = summary_lines(results, state.errors, data, gate, state.full_report,
                          quality_checker(state.thresholds, results))
    lines += written_lines(write_reports(state.values, results, data))
    lines.append(verdict_line(data, gate))
    for text, markup in lines:
        terminalreporter.write_line(text, **markup)
