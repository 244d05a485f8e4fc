"""The comparison as one Python call, without pytest: the same engine, checks and result objects
that the plugin reports, for notebooks and other harnesses.

    from . import compare
    report = compare("hf_model", ["model-q8_0.gguf"], checks=["kld", "tokens"], eval_length=128)
    report.passed                          # every selected check passed for every candidate
    report["model-q8_0"].result("kld")     # a CheckResult: status, value, threshold, rows, details
    report["model-q8_0"].comparison        # per-position numbers, quality, per-layer stats
    print(report)                          # the terminal summary and failure messages
    report.write_json("report.json"); report.write_csv("report.csv")
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from .checks.registry import CHECKS, DEFAULT_GATE, LOGIT_CHECKS
from .checks.results import FAILED, CheckResult
from .checks.run import run_check
from .checks.thresholds import Thresholds
from .engine.modeldiff import ModelDiff
from .engine.records import Comparison, Pair, WeightComparison
from .engine.settings import Settings
from .errors import ModelDiffError, ModelDiffUsageError


@dataclass
class CandidateReport:
    name: str
    comparison: Comparison | None  # None when only the weights were compared, or on error
    results: list[CheckResult] = field(default_factory=list)
    error: str | None = None  # why the candidate could not be compared (bad input)
    weights: WeightComparison | None = None  # the weights check's tensor-by-tensor diff

    @property
    def subject(self) -> Pair:
        return self.comparison or self.weights

    @property
    def passed(self) -> bool:
        return self.error is None and all(r.ok for r in self.results)

    def result(self, check: str) -> CheckResult:
        return next(r for r in self.results if r.name == check)

    def __str__(self) -> str:
        from .report.text import failure_message, summary

        parts = [f"{self.name}: not compared: {self.error}"] if self.error else []
        if self.subject is not None and self.results:
            parts += ["\n".join(summary(self.subject, self.results)),
                      *(failure_message(r, self.weights if r.name == "weights" else self.comparison)
                        for r in self.results if r.status == FAILED)]
        return "\n\n".join(parts)


@dataclass
class Report:
    candidates: dict[str, CandidateReport]
    environment: dict = field(default_factory=dict)  # versions, settings, model hashes (ModelDiff.environment)
    thresholds: Thresholds | None = None  # what judged the checks (its .gate: which default table)

    @property
    def gate(self) -> str:
        return self.thresholds.gate if self.thresholds is not None else DEFAULT_GATE

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.candidates.values())

    def __getitem__(self, name: str) -> CandidateReport:
        return self.candidates[name]

    def __iter__(self) -> Iterator[CandidateReport]:
        return iter(self.candidates.values())

    def __str__(self) -> str:
        return "\n\n".join(str(c) for c in self)

    def to_json(self) -> dict:
        from .report.data import to_json

        return to_json({c.name: (c.subject, c.results) for c in self if c.results},
                       {c.name: c.error for c in self if c.error is not None}, self.environment, gate=self.gate)

    def write_json(self, path: str | Path) -> None:
        from .report.data import write_json

        write_json(Path(path), self.to_json())

    def write_csv(self, path: str | Path) -> None:
        from .report.data import write_csv

        write_csv(Path(path), self.to_json())


def compare(reference: str | Path, candidates: str | Path | Sequence[str | Path], *,
            checks: Sequence[str] | None = None, thresholds: Mapping[str, object] | Thresholds | None = None,
            progress: Callable[[str], None] | None = None, gate: str | None = None, **settings) -> Report:
    """Compare each candidate with the reference and run the built-in ``checks`` (default: all).

    ``thresholds`` take the marker's form ({"kld": 0.01, "rfn": {"0-3": 0.02}}) and override the
    defaults for the candidate's quant class (a ``Thresholds`` with CLI/ini entries also works);
    ``gate`` picks the defaults: "broken" (default: the conversion is wrong) or "quality";
    ``settings`` are ``Settings`` fields (eval_text, eval_length, device, topk_max, ...).
    Bad options raise ModelDiffUsageError, a missing or unreadable file ModelDiffError naming it;
    a candidate whose comparison fails later (its runtime cannot load it) is reported with its
    error and the others still run.
    """
    if isinstance(candidates, (str, Path)):
        candidates = [candidates]
    names = list(CHECKS) if checks is None else list(checks)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ModelDiffUsageError(f"compare(checks=...): unknown check(s) {', '.join(unknown)}; "
                                  f"known: {', '.join(CHECKS)}")
    unknown = [k for k in settings if k not in Settings.__dataclass_fields__]
    if unknown:
        raise ModelDiffUsageError(f"compare(): unknown setting(s) {', '.join(unknown)}; "
                                  f"known: {', '.join(Settings.__dataclass_fields__)}")
    settings.setdefault("logits", bool(set(names) & set(LOGIT_CHECKS)))
    settings.setdefault("layers", "layers" in names)
    if "long_context" not in names:
        settings.setdefault("long_context", 0)  # its sequence is run for its check only
    if not isinstance(thresholds, Thresholds):
        thresholds = Thresholds(given=thresholds, gate=gate)
    elif gate is not None:
        thresholds = thresholds.with_gate(gate)
    engine = ModelDiff(reference, candidates, Settings(**settings), progress)
    from_weights = [n for n in names if CHECKS[n].reads == "weights"]
    from_models = [n for n in names if n not in from_weights]
    try:
        out = {}
        for key in engine.candidates:
            report = out[key] = CandidateReport(key, None)
            if from_weights:  # first: it needs no model, and a model that cannot load keeps this result
                report.weights = engine.weights(key)
                limits = thresholds.resolve(report.weights.quant_class)
                report.results += [run_check(name, report.weights, limits) for name in from_weights]
            if not from_models:
                continue
            try:
                report.comparison = engine.compare(key)
            except ModelDiffUsageError:
                raise
            except ModelDiffError as exc:
                report.error = str(exc)
                continue
            limits = thresholds.resolve(report.comparison.quant_class)
            report.results += [run_check(name, report.comparison, limits) for name in from_models]
        return Report(out, engine.environment(), thresholds)
    finally:
        engine.close()  # models and the reference spill file, also on Ctrl-C
