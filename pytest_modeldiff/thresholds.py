"""The one place thresholds are parsed and resolved: marker > CLI > ini > default.

Every value remembers where it came from, so a failure can say "threshold 0.01 (from
@pytest.mark.modeldiff)" and a typo can say which option or marker held it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from .errors import ModelDiffUsageError
from .registry import CHECKS, HIGHER, THRESHOLD_KEYS


@dataclass(frozen=True)
class Threshold:
    value: float
    source: str  # "marker", "--modeldiff-threshold", "ini modeldiff_thresholds", "default (q8)"


def validate(values: Mapping[str, object], source: str) -> dict[str, float]:
    """Check keys against the registry and values for type and range; name ``source`` on error."""
    out: dict[str, float] = {}
    for key, raw in values.items():
        if key not in THRESHOLD_KEYS:
            raise ModelDiffUsageError(
                f"unknown threshold key {key!r} in {source}; known keys: {', '.join(THRESHOLD_KEYS)}"
            )
        try:
            value = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ModelDiffUsageError(f"threshold {key}={raw!r} in {source} is not a number") from None
        if math.isnan(value) or value < 0:
            raise ModelDiffUsageError(f"threshold {key}={raw!r} in {source} must be a number >= 0")
        if CHECKS[key].direction == HIGHER and value > 1:
            raise ModelDiffUsageError(f"threshold {key}={raw!r} in {source} is a fraction and must be <= 1")
        out[key] = value
    return out


def parse_assignments(entries: Iterable[str], source: str) -> dict[str, float]:
    """Parse ``KEY=VALUE`` strings (CLI repeats, ini lines; commas also separate)."""
    pairs: dict[str, str] = {}
    for entry in entries:
        for item in str(entry).replace(",", " ").split():
            key, sep, value = item.partition("=")
            if not sep or not key or not value:
                raise ModelDiffUsageError(f"{source}: expected KEY=VALUE, got {item!r}")
            pairs[key.strip()] = value.strip()
    return validate(pairs, source)


class Thresholds:
    """CLI and ini thresholds of one run; ``resolve`` adds the marker and the defaults."""

    CLI = "--modeldiff-threshold"
    INI = "ini modeldiff_thresholds"

    def __init__(self, cli: Iterable[str] = (), ini: Iterable[str] = ()):
        self.cli = parse_assignments(cli, self.CLI)
        self.ini = parse_assignments(ini, self.INI)

    def resolve(self, quant_class: str, marker: Mapping[str, float] | None = None) -> dict[str, Threshold]:
        """Threshold for every threshold key: marker > CLI > ini > default for ``quant_class``."""
        marker = marker or {}
        resolved = {}
        for key in THRESHOLD_KEYS:
            for layer, source in ((marker, "marker"), (self.cli, self.CLI), (self.ini, self.INI)):
                if key in layer:
                    resolved[key] = Threshold(layer[key], source)
                    break
            else:
                resolved[key] = Threshold(CHECKS[key].default_for(quant_class), f"default ({quant_class})")
        return resolved
