"""Assertion helpers over one comparison: what the ``modeldiff`` fixture hands to user tests.

Plain Python (raises AssertionError), so notebooks and other harnesses can use it too. Each
helper takes an explicit limit or falls back to the resolved threshold (marker > CLI > ini >
default) and fails with the same table as the built-in checks.
"""
from __future__ import annotations

from . import checks
from .compare import Comparison
from .report import failure_message
from .thresholds import Threshold, validate


class ModelDiffAssertions:
    def __init__(self, comparison: Comparison, thresholds: dict[str, Threshold]):
        self.comparison = comparison
        self.thresholds = thresholds

    def check(self, name: str, limit: float | None = None) -> checks.CheckResult:
        """Run one registered check; ``limit`` overrides its threshold for this call."""
        thresholds = dict(self.thresholds)
        if limit is not None:
            thresholds[name] = Threshold(validate({name: limit}, "the assertion argument")[name], "argument")
        return checks.run_check(name, self.comparison, thresholds)

    def _assert(self, name: str, limit: float | None = None) -> checks.CheckResult:
        __tracebackhide__ = True
        result = self.check(name, limit)
        if result.status in (checks.FAILED, checks.ERROR):
            message = failure_message(result, self.comparison)
            raise AssertionError(message if result.status == checks.FAILED else f"{message}\n{result.reason}")
        return result

    def assert_tokens_equal(self):
        __tracebackhide__ = True
        return self._assert("tokens")

    def assert_vocab_equal(self):
        __tracebackhide__ = True
        return self._assert("vocab")

    def assert_metadata_equal(self):
        __tracebackhide__ = True
        return self._assert("metadata")

    def assert_kld(self, max: float | None = None):
        """Mean KL(ref || cand) <= max, over all positions and over last positions."""
        __tracebackhide__ = True
        return self._assert("kld", max)

    def assert_nmse(self, max: float | None = None):
        __tracebackhide__ = True
        return self._assert("nmse", max)

    def assert_max_abs(self, max: float | None = None):
        __tracebackhide__ = True
        return self._assert("max_abs", max)

    def assert_same_top(self, min: float | None = None):
        __tracebackhide__ = True
        return self._assert("same_top", min)

    def assert_topk_overlap(self, k: int = 10, min: float | None = None):
        """Mean |topk(ref) & topk(cand)| / k >= min (the top10 threshold unless given), k <= 20."""
        __tracebackhide__ = True
        if not 1 <= k <= checks.TOPK_KEPT:
            raise ValueError(f"assert_topk_overlap: k must be between 1 and {checks.TOPK_KEPT}, got {k}")
        if k == 10:
            return self._assert("top10", min)
        limit = self.thresholds["top10"] if min is None else Threshold(validate({"top10": min}, "argument")["top10"], "argument")
        result = checks.check_logits("top10", self.comparison, limit, checks.topk_overlap_metric(k))
        if result.status != checks.PASSED:
            raise AssertionError(failure_message(result, self.comparison) + (f"\n{result.reason}" if result.reason else ""))
        return result
