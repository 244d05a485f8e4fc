"""The built-in check items: one per candidate and check ("modeldiff[<candidate>]::<check>"), so
-k, -x and --junitxml work as for any test; a failure shows the check's table, not a traceback."""
from __future__ import annotations

import pytest

from .session import SESSION, Session


def check_items(session: pytest.Session, run: Session) -> list[pytest.Item]:
    """One item per candidate and selected check, and a baseline item with --modeldiff-baseline,
    collected through pytest's own collection (session.genitems), so its "collected N items"
    counts them."""
    items: list[pytest.Item] = []
    if not run.checks:
        return items
    for key, runner in run.engine.candidates.items():
        # "modeldiff[<candidate>]" stands where a test file would in pytest's progress output
        parent = ModelDiffCandidate.from_parent(session, name=f"modeldiff[{key}]", nodeid=f"modeldiff[{key}]",
                                                path=runner.path.resolve())
        parent.candidate, parent.checks, parent.baseline = key, run.checks, run.baseline is not None
        # pytest-xdist -n N --dist loadgroup (or loadscope) keeps a candidate's items on one worker:
        # its comparison is computed once, the reference once for all (the cache's file lock)
        parent.add_marker(pytest.mark.xdist_group(key))
        items.extend(session.genitems(parent))
    return items


def describe(run: Session) -> list[str]:
    """The header lines: the reference, the candidates, the items the plugin adds, the gate."""
    from ..checks.registry import GATES

    ref, n_cand = run.engine.reference, len(run.engine.candidates)
    per = len(run.checks) + (run.baseline is not None)
    added = (f"adds {n_cand * per} test items: {n_cand} candidate(s) x {per} checks (modeldiff[<candidate>]::<check>)"
             if run.checks else "adds no test items (--modeldiff-checks none): your tests use the modeldiff fixture")
    return [f"modeldiff: reference {ref.path} ({ref.kind}, {ref.type_label()}); candidates: "
            f"{', '.join(run.engine.candidates)}",
            f"modeldiff: {added}",
            f"modeldiff: gate {run.thresholds.gate}: the default limits {GATES[run.thresholds.gate]}"]


class ModelDiffCheckFailed(Exception):
    """Carries the formatted table so repr_failure can show it without a traceback."""


class ModelDiffCandidate(pytest.Collector):
    """A candidate's items: one per check, then its baseline item."""

    candidate: str = ""
    checks: list[str] = []
    baseline: bool = False

    def collect(self):
        items = [ModelDiffItem.from_parent(self, name=check, candidate=self.candidate, check=check)
                 for check in self.checks]
        if self.baseline:
            items.append(ModelDiffBaselineItem.from_parent(self, name="baseline", candidate=self.candidate,
                                                           check="baseline"))
        return items


class ModelDiffItem(pytest.Item):
    def __init__(self, *, candidate: str, check: str, **kwargs):
        super().__init__(**kwargs)
        self.candidate = candidate
        self.check = check

    def runtest(self) -> None:
        from ..checks.results import ERROR, FAILED, SKIPPED
        from ..report.text import failure_message

        state = self.config.stash[SESSION]
        cmp = state.subject(self.candidate, self.check)
        result = state.result(self.candidate, self.check)
        self.user_properties += junit_properties(result, cmp)
        if result.status == SKIPPED:
            pytest.skip(f"modeldiff {self.check}: {result.reason}")
        if result.status == ERROR:
            pytest.fail(f"modeldiff {self.check} for {cmp.candidate.path}: {result.reason}", pytrace=False)
        if result.status == FAILED:
            raise ModelDiffCheckFailed(failure_message(result, cmp))

    def repr_failure(self, excinfo, style=None):
        if excinfo.errisinstance(ModelDiffCheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"modeldiff[{self.candidate}]::{self.check}"


def junit_properties(result, cmp) -> list[tuple[str, object]]:
    """What --junitxml records for a check item: its value, threshold and status, and on the kld
    item llama-perplexity's headline statistics."""
    props = [("modeldiff_candidate", cmp.name), ("modeldiff_status", result.status)]
    if result.value is not None:
        props.append((f"modeldiff_{result.name}", result.value))
    if result.threshold is not None and isinstance(result.threshold.value, float):
        props.append((f"modeldiff_{result.name}_threshold", result.threshold.value))
    kl = getattr(cmp, "kl_stats", None) if result.name == "kld" and cmp.stats is not None else None
    if kl is not None:
        props += [(f"modeldiff_{key}", getattr(kl, key)) for key in
                  ("ppl_ref", "ppl_cand", "ppl_ratio", "kld_mean", "same_top", "rms_dp")]
        props.append(("modeldiff_kld_p99", kl.kld["p99"]))
    return props


class ModelDiffBaselineFailed(ModelDiffCheckFailed):
    pass


class ModelDiffBaselineItem(ModelDiffItem):
    """The candidate's metrics against --modeldiff-baseline, with --modeldiff-compare-fail's tolerances."""

    def runtest(self) -> None:
        import warnings

        from ..errors import ModelDiffEnvironmentWarning
        from ..report.baseline import (
            candidate_metrics,
            compare,
            environment_differences,
        )
        from ..report.data import to_json
        from ..report.text import baseline_message

        state = self.config.stash[SESSION]
        then = state.baseline["candidates"].get(self.candidate)
        if then is None:
            pytest.skip(f"modeldiff baseline: {self.candidate} is not in the baseline "
                        f"(it holds {', '.join(state.baseline['candidates']) or 'no candidate'})")
        cmp = state.comparison(self.candidate)
        report = to_json({self.candidate: (cmp, [state.result(self.candidate, c) for c in state.checks])},
                         environment=state.engine.environment())
        differences = environment_differences(report["environment"], state.baseline.get("environment", {}))
        if differences:
            warnings.warn(ModelDiffEnvironmentWarning(
                f"modeldiff baseline: the environment differs from the baseline's: {'; '.join(differences[:8])}"))
        changes = compare(candidate_metrics(report["candidates"][0]), then["metrics"], state.tolerances)
        for change in changes:
            self.user_properties.append((f"modeldiff_baseline_{change.metric}", change.baseline))
        if not all(c.passed for c in changes):
            raise ModelDiffBaselineFailed(baseline_message(cmp, changes, state.baseline, differences))

