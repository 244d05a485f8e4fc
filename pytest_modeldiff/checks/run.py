"""Running the built-in checks: each turns a Comparison (and its threshold) into a CheckResult.

Formulas live in metrics/; the check families (exact.py, logits.py, layers.py, weights.py) hold
what is compared, over which positions, and what a failure should tell the user (worst
positions, a hint). Register new checks in registry.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .exact import check_metadata, check_tokens, check_vocab
from .layers import check_layers
from .logits import check_logits, check_topk_acc_drop
from .long_context import check_long_context
from .registry import CHECKS
from .results import CheckResult
from .thresholds import Threshold
from .weights import check_weights

if TYPE_CHECKING:  # records of the engine, which runs the checks: no import at run time
    from ..engine.records import Comparison, WeightComparison

EXACT_CHECKS = {"tokens": check_tokens, "vocab": check_vocab, "metadata": check_metadata}


OWN_FUNCTION_CHECKS = {"topk_acc_drop": check_topk_acc_drop, "layers": check_layers}


def run_check(name: str, cmp: Comparison | WeightComparison, thresholds: dict[str, Threshold]) -> CheckResult:
    """``cmp`` is the candidate's Comparison, or for checks that read weight files (registry
    ``reads="weights"``) its WeightComparison, which needs no model run."""
    if CHECKS[name].reads == "weights":
        return check_weights(cmp.weights, thresholds)
    if name in EXACT_CHECKS:
        return EXACT_CHECKS[name](cmp)
    if name == "long_context":
        return check_long_context(cmp, thresholds[CHECKS[name].threshold_key], thresholds["kld"])
    if name in OWN_FUNCTION_CHECKS:
        return OWN_FUNCTION_CHECKS[name](cmp, thresholds[CHECKS[name].threshold_key])
    return check_logits(name, cmp, thresholds[name])


def run_checks(cmp: Comparison, thresholds: dict[str, Threshold]) -> list[CheckResult]:
    return [run_check(name, cmp, thresholds) for name in CHECKS]
