"""A check's outcome: status, the metric | value | threshold rows, details for the message."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .thresholds import Threshold

PASSED, FAILED, SKIPPED, ERROR = "passed", "failed", "skipped", "error"


@dataclass
class Row:
    metric: str
    value: str
    threshold: str
    passed: bool


@dataclass
class CheckResult:
    name: str
    candidate: str
    status: str
    rows: list[Row] = field(default_factory=list)
    details: list[str] = field(default_factory=list)  # worst positions, mismatches
    hint: str = ""
    reason: str = ""  # for skipped / error
    value: float | None = None  # headline value (JSON report)
    threshold: Threshold | None = None
    extra: dict = field(default_factory=dict)  # more numbers for the JSON report

    @property
    def ok(self) -> bool:
        return self.status in (PASSED, SKIPPED)


def fmt(x: float) -> str:
    if x is None or not np.isfinite(x):
        return str(x)
    return f"{x:.4g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.3e}"
