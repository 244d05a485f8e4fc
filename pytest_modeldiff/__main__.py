"""Command line without pytest: the same engine, checks and report.

    python -m pytest_modeldiff --ref-model hf_model --cand-model model-q8_0.gguf [--modeldiff-json report.json]

--ref-model / --cand-model default to $MODEL_PATH / $CONVERTED_MODEL (llama.cpp's scripts).
Exit status: 0 all checks passed, 1 a check failed, 2 bad input or options. Options: the pytest
plugin's, same spellings (``pytest --help`` lists them too).
"""
from __future__ import annotations

import argparse
import sys
import time

from . import options
from .checks.registry import CHECKS, parse_check_list
from .errors import ModelDiffUsageError
from .options import BY_DEST


def parse_args(argv=None) -> argparse.Namespace:
    """The plugin's options (options.OPTIONS), with the same spellings and help."""
    parser = argparse.ArgumentParser(prog="python -m pytest_modeldiff", description=__doc__.split("\n\n")[0])
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
        report = compare(ref, candidates, checks=checks, thresholds=Thresholds(values["thresholds"]),
                         progress=_progress(), **options.settings_fields(values, checks))
    except ModelDiffError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{report}\n")
    if values["json"]:
        report.write_json(values["json"])
    if values["csv"]:
        report.write_csv(values["csv"])
    if values["markdown"] or values["html"]:
        from .report.pages import write_html, write_markdown

        data = report.to_json()
        if values["markdown"]:
            write_markdown(values["markdown"], data)
        if values["html"]:
            write_html(values["html"], data)
    if any(c.error for c in report):
        return 2
    return 0 if report.passed else 1


def _progress(every_s: float = 1.0):
    """Progress lines on stderr, at most one per ``every_s`` seconds."""
    last = [-every_s]

    def show(message: str) -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            print(f"modeldiff: {message}", file=sys.stderr)

    return show


if __name__ == "__main__":
    sys.exit(main())
