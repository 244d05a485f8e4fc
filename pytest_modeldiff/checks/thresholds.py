"""The one place thresholds are parsed and resolved: marker > CLI > ini > default (a Python
caller's ``thresholds=`` mapping sits where the CLI would, above it). The gate
(``--modeldiff-gate``, registry.GATES) picks which default table: "broken" (the conversion is
wrong) or "quality" (worse than a correct quantizer makes that class).

Every value remembers where it came from, so a failure can say "threshold 0.01 (from
@pytest.mark.modeldiff)" and a typo can say which option or marker held it.

Per-layer keys (rfn) also take layer patterns: ``rfn=0.05`` (every layer), in a marker
``rfn={"0-3": 0.02, "*": 0.05}``, on the command line or in the ini ``rfn[0-3]=0.02``. A layer
gets the most specific pattern of the highest-precedence source that names it, so a marker
that only sets "0-3" leaves the other layers to the CLI, ini or default.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from ..errors import ModelDiffUsageError
from ..metrics.layers import EMBD, NORM
from .registry import BY_THRESHOLD_KEY, DEFAULT_GATE, GATES, HIGHER, THRESHOLD_KEYS


@dataclass(frozen=True)
class Threshold:
    value: float | None  # a LayerLimits for per-layer keys; None: judged per tensor type (weights)
    source: str  # "marker", "--modeldiff-threshold", "ini modeldiff_thresholds", "default (q8)"


@dataclass(frozen=True)
class LayerLimits:
    """Per-layer limits: (source, {pattern: value}) in precedence order, the default last."""

    sources: tuple[tuple[str, tuple[tuple[str, float], ...]], ...]

    def for_layer(self, name: str) -> Threshold:
        for source, patterns in self.sources:
            matches = [(span, value) for pattern, value in patterns if (span := pattern_span(pattern, name))]
            if matches:
                return Threshold(min(matches)[1], source)
        raise KeyError(name)  # unreachable: the default holds "*"


def _number(key: str, raw, source: str) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ModelDiffUsageError(f"threshold {key}={raw!r} in {source} is not a number") from None
    if math.isnan(value) or value < 0:
        raise ModelDiffUsageError(f"threshold {key}={raw!r} in {source} must be a number >= 0")
    if BY_THRESHOLD_KEY[key].direction == HIGHER and value > 1:
        raise ModelDiffUsageError(f"threshold {key}={raw!r} in {source} is a fraction and must be <= 1")
    return value


def validate(values: Mapping[str, object], source: str) -> dict[str, float | dict[str, float]]:
    """Check keys against the registry and values for type and range; name ``source`` on error.
    Per-layer keys become {pattern: value} mappings."""
    out: dict = {}
    for key, raw in values.items():
        if key not in THRESHOLD_KEYS:
            raise ModelDiffUsageError(
                f"unknown threshold key {key!r} in {source}; known keys: {', '.join(THRESHOLD_KEYS)}")
        if not BY_THRESHOLD_KEY[key].per_layer:
            if isinstance(raw, Mapping):
                raise ModelDiffUsageError(f"threshold {key} in {source} takes one number, not a mapping")
            out[key] = _number(key, raw, source)
            continue
        patterns = {}
        for pattern, value in (raw.items() if isinstance(raw, Mapping) else [("*", raw)]):
            try:
                pattern = parse_layer_pattern(pattern)
            except ValueError as exc:
                raise ModelDiffUsageError(f"threshold {key} in {source}: {exc}") from None
            patterns[pattern] = _number(key, value, source)
        out[key] = patterns
    return out


_KEY = re.compile(r"(\w+)(?:\[([^\]]+)\])?$")


def parse_assignments(entries: Iterable[str], source: str) -> dict:
    """Parse ``KEY=VALUE`` / ``KEY[PATTERN]=VALUE`` strings (CLI repeats, ini lines; commas and
    spaces also separate)."""
    pairs: dict = {}
    for entry in entries:
        for item in str(entry).replace(",", " ").split():
            key, sep, value = item.partition("=")
            match = _KEY.match(key.strip())
            if not sep or not match or not value:
                raise ModelDiffUsageError(f"{source}: expected KEY=VALUE or KEY[LAYERS]=VALUE, got {item!r}")
            name, pattern = match.groups()
            if pattern is None:
                pairs[name] = value.strip()
            elif name in BY_THRESHOLD_KEY and not BY_THRESHOLD_KEY[name].per_layer:
                raise ModelDiffUsageError(f"{source}: {name} has no per-layer form, got {item!r}")
            else:
                previous = pairs.get(name)
                patterns = previous if isinstance(previous, dict) else ({"*": previous} if previous else {})
                pairs[name] = {**patterns, pattern: value.strip()}
    return validate(pairs, source)


def parse_layer_pattern(pattern) -> str:
    """Validate a threshold pattern: "*", "embd", "norm", "5", "0-3" (inclusive); ints allowed."""
    text = str(pattern).strip()
    if text in ("*", EMBD, NORM):
        return text
    if re.fullmatch(r"\d+", text):
        return str(int(text))
    match = re.fullmatch(r"(\d+)\s*-\s*(\d+)", text)
    if match and int(match.group(1)) <= int(match.group(2)):
        return f"{int(match.group(1))}-{int(match.group(2))}"
    raise ValueError(f"layer pattern {pattern!r}: expected '*', 'embd', 'norm', a layer index or a range like '0-3'")


def pattern_span(pattern: str, name: str) -> int | None:
    """How many states ``pattern`` covers if it matches state ``name`` (smaller = more specific),
    else None. "*" counts as covering everything."""
    if pattern == "*":
        return 1 << 30
    if pattern in (EMBD, NORM) or pattern.isdigit():
        return 1 if pattern == name else None
    low, high = map(int, pattern.split("-"))
    return high - low + 1 if name.isdigit() and low <= int(name) <= high else None


# The weights check's default: no number per quant class, each tensor judged by its storage type.
PER_TENSOR_TYPE = "default (each tensor's storage type, registry.TENSOR_TYPE_ERROR)"


class Thresholds:
    """The run's thresholds below the marker: a Python caller's ``given`` mapping (the marker's
    form, see ``api.compare``), CLI and ini; ``resolve`` adds the marker and the defaults."""

    GIVEN = "compare(thresholds=...)"
    CLI = "--modeldiff-threshold"
    INI = "ini modeldiff_thresholds"

    def __init__(self, cli: Iterable[str] = (), ini: Iterable[str] = (), given: Mapping | None = None,
                 gate: str | None = None):
        self.gate = gate or DEFAULT_GATE
        if self.gate not in GATES:
            raise ModelDiffUsageError(f"unknown gate {self.gate!r}; known gates: {', '.join(GATES)}")
        self.given = validate(given or {}, self.GIVEN)
        self.cli = parse_assignments(cli, self.CLI)
        self.ini = parse_assignments(ini, self.INI)

    def with_gate(self, gate: str) -> "Thresholds":
        """The same given, CLI and ini limits over another gate's defaults."""
        other = Thresholds(gate=gate)
        other.given, other.cli, other.ini = self.given, self.cli, self.ini
        return other

    def resolve(self, quant_class: str, marker: Mapping | None = None) -> dict[str, Threshold]:
        """Threshold for every threshold key: marker > given > CLI > ini > the gate's default for
        ``quant_class`` (its source reads "default (q8)", or "default (q8, gate quality)")."""
        layers = ((marker or {}, "marker"), (self.given, self.GIVEN), (self.cli, self.CLI), (self.ini, self.INI))
        resolved = {}
        for key in THRESHOLD_KEYS:
            limit = BY_THRESHOLD_KEY[key]
            value = limit.default_for(quant_class, self.gate)
            label = quant_class if self.gate == DEFAULT_GATE else f"{quant_class}, gate {self.gate}"
            default = Threshold(value, f"default ({label})" if value is not None else PER_TENSOR_TYPE)
            given = [(source, layer[key]) for layer, source in layers if key in layer]
            if limit.per_layer:
                sources = tuple((source, tuple(patterns.items())) for source, patterns in given)
                limits = LayerLimits(sources + ((default.source, (("*", default.value),)),))
                resolved[key] = Threshold(limits, given[0][0] if given else default.source)
            else:
                resolved[key] = Threshold(given[0][1], given[0][0]) if given else default
        return resolved
