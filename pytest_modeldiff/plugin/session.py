"""The run as the plugin holds it: options turned into the engine once at configure time, each
candidate's comparison and check results computed once and shared by its items, the summary and
the reports, and progress lines on the terminal."""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from .. import options
from ..checks.registry import CHECKS, parse_check_list


class Session:
    """The run's ModelDiff engine plus the results reported at the end."""

    def __init__(self, config: pytest.Config, values: dict, checks: list[str]):
        self.config = config
        self.values = values  # every option's value (options.collect)
        self.checks = checks
        self.engine = None
        self.thresholds = None  # CLI > ini > default (markers are per test)
        self.errors: dict[str, str] = {}  # candidate key -> why it could not be compared
        self.baseline: dict | None = None  # --modeldiff-baseline's content
        self.tolerances: list = []  # --modeldiff-compare-fail
        self._results: dict[tuple[str, str], object] = {}  # (candidate key, check) -> CheckResult
        self._last_progress = time.monotonic()

    @classmethod
    def from_config(cls, config: pytest.Config) -> "Session | None":
        """The run, or None when no model is given (the plugin then only validates markers).
        Bad options and input known before any model runs are one usage error (exit 4)."""
        from ..errors import ModelDiffError

        try:
            values = options.collect(lambda o: config.getoption(o.dest), lambda o: _ini(config, o))
            if options.model_paths(values) == (None, []):
                return None
            return cls._start(config, values)
        except ModelDiffError as exc:
            raise pytest.UsageError(str(exc)) from None

    @classmethod
    def _start(cls, config: pytest.Config, values: dict) -> "Session":
        from ..checks.thresholds import Thresholds
        from ..engine.modeldiff import ModelDiff
        from ..engine.settings import Settings
        from ..errors import ModelDiffUsageError
        from ..report.baseline import load_baseline, parse_tolerances

        ref, candidates = options.require_models(values)
        checks = parse_check_list(values["checks"] or " ".join(CHECKS), "--modeldiff-checks")
        settings = Settings(**options.settings_fields(values, checks))
        run = cls(config, values, checks)
        run.tolerances = parse_tolerances(values["compare_fail"])
        if run.tolerances and not values["baseline"]:
            raise ModelDiffUsageError("--modeldiff-compare-fail needs --modeldiff-baseline FILE to compare with")
        run.baseline = load_baseline(Path(values["baseline"])) if values["baseline"] else None
        run.thresholds = Thresholds(values["thresholds"], config.getini(options.THRESHOLDS_INI), gate=values["gate"])
        run.engine = ModelDiff(ref, candidates, settings, run.progress)
        run.engine.prepare()
        return run

    @property
    def full_report(self) -> bool:
        """Every candidate's tables in the summary: -v or --modeldiff-report=full."""
        return self.values.get("report") == "full" or self.config.option.verbose > 0

    def progress(self, message: str) -> None:
        """At most one line every 5 s, the first after 5 s (always with -v): long runs show they
        are moving, short ones stay quiet."""
        now = time.monotonic()
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and (self.config.option.verbose > 0 or now - self._last_progress > 5.0):
            self._last_progress = now
            # to the terminal, not into the running test's captured output
            capture = self.config.pluginmanager.get_plugin("capturemanager")  # None under -p no:capture
            with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                if reporter._tw.width_of_current_line and not reporter.currentfspath:  # -q: after bare dots
                    reporter._tw.line()
                reporter.write_line(f"modeldiff: {message}")

    def comparison(self, key: str):
        """The candidate's comparison. A failure is reported once - in full by the first test that
        needs it (one line for bad input), as one line by the others - and not retried."""
        from ..errors import ModelDiffError

        if key not in self.errors:
            try:
                return self.engine.compare(key)
            except ModelDiffError as exc:
                self.errors[key] = str(exc)
            except Exception as exc:
                self.errors[key] = (f"comparison failed: {type(exc).__name__}: {exc} "
                                    f"(traceback in the first failing test)")
                raise
        pytest.fail(self.errors[key], pytrace=False)

    def subject(self, key: str, check: str):
        """What ``check`` reads: the weight files' diff (no model runs) or the full comparison."""
        return self.engine.weights(key) if CHECKS[check].reads == "weights" else self.comparison(key)

    def result(self, key: str, check: str):
        """One built-in check of one candidate (CLI > ini > default thresholds), computed once for
        its test item and the end-of-run summary and JSON."""
        from ..checks.run import run_check

        if (key, check) not in self._results:
            subject = self.subject(key, check)
            self._results[key, check] = run_check(check, subject, self.thresholds.resolve(subject.quant_class))
        return self._results[key, check]

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def _ini(config: pytest.Config, option: options.Option) -> tuple[str, Path | None] | None:
    """An option's ini value and the folder its paths are relative to; None when unset."""
    if not option.ini:
        return None
    value = config.getini(option.ini)
    if value in ("", None, []):
        return None
    return value, config.inipath.parent if config.inipath else None


SESSION = pytest.StashKey[Session]()
