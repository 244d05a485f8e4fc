"""modeldiff: compare a reference model with converted candidates without pytest - the same
engine, checks, options, summary and reports as the pytest plugin.

    modeldiff --ref-model hf_model --cand-model model-q8_0.gguf [--modeldiff-json report.json]

(``python -m pytest_modeldiff`` is the same program.) --ref-model / --cand-model default to
$MODEL_PATH / $CONVERTED_MODEL (llama.cpp's scripts).
"""
from __future__ import annotations

import argparse
import sys
import textwrap
import time

from . import options
from .checks.registry import CHECKS, GATES, parse_check_list
from .errors import ModelDiffUsageError
from .options import BY_DEST

PROG = "modeldiff"  # pyproject's [project.scripts] name; `python -m pytest_modeldiff` says the same
EXIT_PASSED, EXIT_FAILED, EXIT_ERROR = 0, 1, 2
EPILOG = "gates (--modeldiff-gate):\n" + "\n".join(
    textwrap.fill(f"{name}: {text}", 100, initial_indent="  ", subsequent_indent="    ")
    for name, text in GATES.items())
EPILOG += f"""

output: progress on stderr; on stdout the gate, the candidates table, per failing candidate what
failed and why (-v or --modeldiff-report full: every candidate's check, per-layer and weight tables
and full failure messages first), the report files written and a verdict line.

exit status: {EXIT_PASSED} every candidate passed every selected check; {EXIT_FAILED} a check failed;
{EXIT_ERROR} bad options or input (a missing or unreadable file, a bad value), or a candidate could
not be compared. The pytest plugin takes the same options: pytest --ref-model ... --cand-model ..."""


def parse_args(argv=None) -> argparse.Namespace:
    """The plugin's options (options.OPTIONS), with the same spellings and help, plus -v."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].replace("\n", " "),
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="the full summary, as --modeldiff-report full (pytest's -v does the same)")
    options.add_to(parser.add_argument)
    return parser.parse_args(argv)


PYTEST_ONLY = ("save_baseline", "baseline", "compare_fail")  # baseline items are pytest items


def main(argv=None) -> int:
    args = parse_args(argv)
    from .api import compare
    from .checks.thresholds import Thresholds
    from .errors import ModelDiffError

    values = options.collect(lambda o: getattr(args, o.dest), lambda o: None)
    try:
        given = [BY_DEST[d].flag for d in PYTEST_ONLY if values[d]]
        if given:
            raise ModelDiffUsageError(f"{', '.join(given)}: baselines are compared by the pytest plugin; "
                                      "run pytest with the same options")
        ref, candidates = options.require_models(values)
        checks = parse_check_list(values["checks"] or ",".join(CHECKS), "--modeldiff-checks")
        thresholds = Thresholds(values["thresholds"], gate=values["gate"])
        report = compare(ref, candidates, checks=checks, thresholds=thresholds, progress=_progress(),
                         **options.settings_fields(values, checks))
    except ModelDiffError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print("\n".join(summary(report, values, full=args.verbose or values["report"] == "full")))
    if any(c.error for c in report):
        return EXIT_ERROR
    return EXIT_PASSED if report.passed else EXIT_FAILED


def summary(report, values: dict, full: bool) -> list[str]:
    """What the plugin's terminal summary shows (report/summary.py), the report files written and
    the verdict; with ``full`` the failure messages of the failed checks first, as pytest shows them."""
    from .checks.results import FAILED
    from .report.summary import quality_checker, summary_lines, verdict_line, write_reports, written_lines
    from .report.text import failure_message

    results = {c.name: (c.subject, c.results) for c in report if c.results}
    errors = {c.name: c.error for c in report if c.error is not None}
    data = report.to_json()
    lines = []
    if full:
        for cand in report:
            for r in cand.results:
                if r.status == FAILED:
                    lines += [failure_message(r, cand.weights if r.name == "weights" else cand.comparison), ""]
    found = summary_lines(results, errors, data, report.gate, full, quality_checker(report.thresholds, results))
    found += written_lines(write_reports(values, results, data))
    found.append(verdict_line(data, report.gate))
    return lines + [text for text, _ in found]


def _progress(every_s: float = 1.0):
    """Progress lines on stderr, at most one per ``every_s`` seconds."""
    last = [-every_s]

    def show(message: str) -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            print(f"{PROG}: {message}", file=sys.stderr)

    return show


if __name__ == "__main__":
    sys.exit(main())
