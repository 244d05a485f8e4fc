"""Assertion helpers over one comparison: what the ``modeldiff`` fixture hands to user tests.

Plain Python (raises AssertionError), so notebooks and other harnesses can use it too. Each
helper takes an explicit limit or falls back to the resolved threshold (marker > CLI > ini >
default) and fails with the same table as the built-in checks.
"""
from __future__ import annotations

import unittest
from typing import Callable

from .checks.layers import check_layers
from .checks.logits import check_logits, topk_agreement_metric, topk_overlap_metric
from .checks.registry import CHECKS
from .checks.results import ERROR, FAILED, SKIPPED, CheckResult
from .checks.run import EXACT_CHECKS, OWN_FUNCTION_CHECKS, run_check
from .checks.thresholds import LayerLimits, Threshold, validate
from .checks.weights import check_weights
from .engine.records import TOPK_KEPT, Comparison, WeightComparison
from .report.text import failure_message


class ModelDiffAssertions:
    def __init__(self, comparison: Comparison | Callable[[], Comparison], thresholds: dict[str, Threshold],
                 weights: WeightComparison | Callable[[], WeightComparison] | None = None):
        """``comparison`` and ``weights`` may be callables, resolved at the first assertion that needs
        them: a test that only asserts on weights runs no model."""
        self._comparison = comparison
        self._weights = weights
        self.thresholds = thresholds

    @property
    def comparison(self) -> Comparison:
        if callable(self._comparison):
            self._comparison = self._comparison()
        return self._comparison

    @property
    def weights(self) -> WeightComparison:
        """The tensor-by-tensor diff of the two models' weight files."""
        if self._weights is None:
            return self.comparison.weights
        if callable(self._weights):
            self._weights = self._weights()
        return self._weights

    def _threshold(self, name: str, limit: float | None) -> Threshold:
        if limit is None:
            return self.thresholds[name]
        return Threshold(validate({name: limit}, "the assertion argument")[name], "argument")

    def check(self, name: str, limit=None) -> CheckResult:
        """Run one registered check; ``limit`` overrides its threshold for this call."""
        if name == "weights":
            return check_weights(self.weights, {**self.thresholds, **(
                {} if limit is None else {"weight_rel": self._threshold("weight_rel", limit)})})
        if name in EXACT_CHECKS:
            return run_check(name, self.comparison, self.thresholds)
        if name == "layers":
            return check_layers(self.comparison, self._layer_limits(limit))
        if name in OWN_FUNCTION_CHECKS:
            return OWN_FUNCTION_CHECKS[name](self.comparison, self._threshold(name, limit))
        return check_logits(name, self.comparison, self._threshold(name, limit))

    def _layer_limits(self, limit) -> Threshold:
        """An argument (number or {pattern: number}) goes before the resolved per-layer limits."""
        resolved = self.thresholds[CHECKS["layers"].threshold_key]
        if limit is None:
            return resolved
        patterns = validate({"rfn": limit}, "the assertion argument")["rfn"]
        return Threshold(LayerLimits((("argument", tuple(patterns.items())), *resolved.value.sources)), "argument")

    def _verify(self, result: CheckResult) -> CheckResult:
        """Failed or not computable: AssertionError with the table. Not applicable (a dump has
        no vocabulary): unittest.SkipTest, which pytest reports as a skip, never a silent pass."""
        __tracebackhide__ = True
        if result.status == SKIPPED:
            raise unittest.SkipTest(f"modeldiff {result.name}: {result.reason}")
        if result.status in (FAILED, ERROR):
            message = failure_message(result, self.weights if result.name == "weights" else self.comparison)
            raise AssertionError(f"{message}\n{result.reason}" if result.reason else message)
        return result

    def assert_tokens_equal(self):
        __tracebackhide__ = True
        return self._verify(self.check("tokens"))

    def assert_vocab_equal(self):
        __tracebackhide__ = True
        return self._verify(self.check("vocab"))

    def assert_metadata_equal(self):
        __tracebackhide__ = True
        return self._verify(self.check("metadata"))

    def assert_kld(self, max: float | None = None):
        """Mean KL(ref || cand) <= max, over all positions and over last positions."""
        __tracebackhide__ = True
        return self._verify(self.check("kld", max))

    def assert_nmse(self, max: float | None = None):
        __tracebackhide__ = True
        return self._verify(self.check("nmse", max))

    def assert_max_abs(self, max: float | None = None):
        __tracebackhide__ = True
        return self._verify(self.check("max_abs", max))

    def assert_same_top(self, min: float | None = None):
        __tracebackhide__ = True
        return self._verify(self.check("same_top", min))

    def assert_topk_overlap(self, k: int = 10, min: float | None = None):
        """Mean |topk(ref) & topk(cand)| / k >= min (the top10 threshold unless given), 1 <= k <= 20."""
        __tracebackhide__ = True
        if not 1 <= k <= TOPK_KEPT:
            raise ValueError(f"assert_topk_overlap: k must be between 1 and {TOPK_KEPT}, got {k}")
        metric = topk_overlap_metric(k)
        return self._verify(check_logits("top10", self.comparison, self._threshold("top10", min), metric))

    def assert_topk_agreement(self, k: int = 1, min: float | None = None):
        """Fraction of positions whose first k ids agree in order >= min (same_top threshold unless
        given); exllamav2's top-K agreement, k = 1 is same_top."""
        __tracebackhide__ = True
        if not 1 <= k <= TOPK_KEPT:
            raise ValueError(f"assert_topk_agreement: k must be between 1 and {TOPK_KEPT}, got {k}")
        metric = topk_agreement_metric(k)
        return self._verify(check_logits("same_top", self.comparison, self._threshold("same_top", min), metric))

    def assert_prob_mse(self, max: float | None = None):
        """Mean (softmax(cand) - softmax(ref))^2 <= max (exllamav2's MSE)."""
        __tracebackhide__ = True
        return self._verify(self.check("prob_mse", max))

    def assert_topk_accuracy(self, max_drop: float | None = None):
        """For K = 1..topk-max: the candidate's top-K next-token accuracy is at most ``max_drop``
        below the reference's (the topk_acc_drop threshold unless given)."""
        __tracebackhide__ = True
        return self._verify(self.check("topk_acc_drop", max_drop))

    def assert_weights_close(self, rel: float | None = None, cos: float | None = None, gain: float | None = None):
        """Every tensor pair: ||cand - ref|| / ||ref|| <= rel, cosine >= cos, |gain - 1| <= gain, and no
        tensor missing, added or reshaped. A limit not given comes from weight_rel / weight_cos /
        weight_gain (marker > CLI > ini), else from the usual error of each tensor's storage type.
        Reads the weight files only: no model runs for this assertion."""
        __tracebackhide__ = True
        given = {key: self._threshold(key, value) for key, value in
                 (("weight_rel", rel), ("weight_cos", cos), ("weight_gain", gain)) if value is not None}
        return self._verify(check_weights(self.weights, {**self.thresholds, **given}))

    def assert_layer_rfn(self, max=None):
        """Every layer's mean rfn = ||h_cand - h_ref||_F / ||h_ref||_F within its limit: ``max`` is a
        number or {layer pattern: number} ("0-3", "5", "embd", "norm", "*"), else the rfn threshold
        (marker > CLI > ini > default). Fails with the per-layer table and the first offending layer."""
        __tracebackhide__ = True
        return self._verify(self.check("layers", max))
