"""The built-in checks: each turns a Comparison (and its threshold) into a CheckResult.

Formulas live in metrics.py; here is only what is compared, over which positions, and what a
failure should tell the user (worst positions, a hint). Register new checks in registry.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import klstats, mapping, metrics
from .engine import TOPK_KEPT, Comparison, PositionStats, WeightComparison
from .layers import EMBD, NORM, describe
from .registry import CHECKS, HIGHER, WeightLimits
from .runners.base import VocabInfo
from .thresholds import PER_TENSOR_TYPE, Threshold
from .weightdiff import WORST_TENSORS

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


# --------------------------------------------------------------------------- exact checks
def check_tokens(cmp: Comparison, threshold=None) -> CheckResult:
    result = CheckResult("tokens", cmp.name, PASSED)
    if not cmp.token_diffs:
        return CheckResult("tokens", cmp.name, SKIPPED, reason="no text both sides can tokenize "
                           "(dumps without a prompt file carry token ids only)")
    for diff in cmp.token_diffs:
        at = diff.first_mismatch
        result.rows.append(Row(f"tokens '{diff.label}'", f"{len(diff.ref_ids)} vs {len(diff.cand_ids)} ids",
                               "identical", at is None))
        if at is None:
            continue
        result.status = FAILED
        ref_id = diff.ref_ids[at] if at < len(diff.ref_ids) else None
        cand_id = diff.cand_ids[at] if at < len(diff.cand_ids) else None
        before = "".join(cmp.reference.piece(i) for i in diff.ref_ids[max(0, at - 5):at])
        after = "".join(cmp.reference.piece(i) for i in diff.ref_ids[at:at + 5])
        result.details.append(
            f"'{diff.label}': first difference at token {at}: reference {_tok(cmp.reference, ref_id)} "
            f"vs candidate {_tok(cmp.candidate, cand_id)}; text around it: {before!r} | {after!r}")
    if result.status == FAILED:
        result.hint = ("the candidate tokenizes the same text differently: check tokenizer.ggml.pre "
                       "(pre-tokenizer), merges, special tokens and tokenizer.ggml.add_bos_token; "
                       "logit metrics still use the reference's ids for both models")
        result.hint = _transformers_version_hint(cmp.reference) + result.hint
    return result


def _transformers_version_hint(reference) -> str:
    """llama.cpp's scripts warn the same way: a model saved by a newer transformers than the one
    installed is the usual cause of a token mismatch (new tokenizer code, new pre-tokenizers)."""
    declared = reference.declared_transformers_version()
    if not declared:
        return ""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import InvalidVersion, Version

    try:
        installed = version("transformers")
        newer = Version(declared) > Version(installed)
    except (PackageNotFoundError, InvalidVersion):
        return ""
    return (f"the reference's config.json was written by transformers {declared}, newer than the installed "
            f"{installed}: install that version (pip install transformers=={declared}) and run again; ") if newer else ""


def _tok(runner, token_id) -> str:
    return "<end of sequence>" if token_id is None else f"{token_id} {runner.piece(token_id)!r}"


def check_vocab(cmp: Comparison, threshold=None) -> CheckResult:
    ref, cand = cmp.reference.vocab(), cmp.candidate.vocab()
    if ref is None or cand is None:
        side = cmp.reference if ref is None else cmp.candidate
        return CheckResult("vocab", cmp.name, SKIPPED, reason=f"{side.path} carries no vocabulary ({side.kind})")
    rows, details = compare_vocab(ref, cand)
    result = CheckResult("vocab", cmp.name, PASSED, rows, details)
    if not all(r.passed for r in rows):
        result.status = FAILED
        result.hint = ("re-convert with the tokenizer files that belong to the reference; special ids and "
                       "add-bos/eos flags come from tokenizer_config.json / generation_config.json")
    return result


def compare_vocab(ref: VocabInfo, cand: VocabInfo) -> tuple[list[Row], list[str]]:
    """Rows (token strings, size, merges, scores, special ids, flags) and the first differences.
    Extra candidate entries named [PAD<n>] are the converter's padding up to vocab_size."""
    rows, details = [], []
    common = min(len(ref.tokens), len(cand.tokens))
    differing = [i for i in range(common) if ref.tokens[i] != cand.tokens[i]]
    extra = [t for t in cand.tokens[common:] if not (t.startswith("[PAD") and t.endswith("]"))]
    rows.append(Row("token strings", f"{len(differing)} differ of {common}", "0", not differing))
    rows.append(Row("vocabulary size", f"{len(ref.tokens)} vs {len(cand.tokens)}", "equal (padding allowed)",
                    not extra and len(ref.tokens) == common))
    details += [f"token {i}: reference {ref.tokens[i]!r} vs candidate {cand.tokens[i]!r}" for i in differing[:5]]
    for name, a, b, same in (("merges", ref.merges, cand.merges, lambda x, y: x == y),
                             ("scores", ref.scores, cand.scores, lambda x, y: abs(x - y) <= 1e-6 * max(1.0, abs(x)))):
        if a is None or b is None:
            continue
        bad = next((i for i, (x, y) in enumerate(zip(a, b)) if not same(x, y)), None)
        rows.append(Row(name, f"{len(a)} vs {len(b)}", "identical", bad is None and len(a) == len(b)))
        if bad is not None:
            details.append(f"{name[:-1]} {bad}: reference {a[bad]!r} vs candidate {b[bad]!r}")
    for name in ("bos", "eos", "unk", "pad"):
        a, b = ref.special.get(name), cand.special.get(name)
        if a is not None and b is not None:
            rows.append(Row(f"{name} id", f"{a} vs {b}", "equal", a == b))
    for name in ("add_bos", "add_eos"):
        a, b = getattr(ref, name), getattr(cand, name)
        if a is not None and b is not None:
            rows.append(Row(f"{name} flag", f"{a} vs {b}", "equal", a == b))
    return rows, details


def check_metadata(cmp: Comparison, threshold=None) -> CheckResult:
    ref, cand = cmp.reference.hparams(), cmp.candidate.hparams()
    if ref is None or cand is None:
        side = cmp.reference if ref is None else cmp.candidate
        return CheckResult("metadata", cmp.name, SKIPPED, reason=f"{side.path} carries no hyper-parameters ({side.kind})")
    diffs = {key: (a, b) for key, a, b in mapping.compare(ref, cand)}
    result = CheckResult("metadata", cmp.name, FAILED if diffs else PASSED)
    for key in sorted(set(ref) | set(cand)):
        if key in ref:
            result.rows.append(Row(key, f"{ref[key]} vs {cand.get(key, 'missing')}", "equal", key not in diffs))
    if diffs:
        result.hint = ("the candidate's architecture metadata differs from the reference config; fix the "
                       "converter or the config (llama.cpp can patch a value with --override-kv)")
    return result


# --------------------------------------------------------------------------- logit checks
@dataclass(frozen=True)
class LogitMetric:
    """How a logit check aggregates per-position values over a set of positions."""

    label: str
    aggregate: Callable[[PositionStats, int], float]
    per_position: Callable[[PositionStats], np.ndarray] | None  # for "worst positions"
    next_token: bool = False  # uses the next token: only positions that have one count


def topk_overlap_metric(k: int) -> LogitMetric:
    return LogitMetric(f"top-{k} overlap", lambda s, v: float(s.overlap(k).mean()), lambda s: -s.overlap(k))


def topk_agreement_metric(k: int, label: str = "") -> LogitMetric:
    return LogitMetric(label or f"top-{k} ordered agreement", lambda s, v: float(s.agreement(k).mean()),
                       lambda s: -s.agreement(k))


LOGIT_METRICS = {
    "kld": LogitMetric("kld mean", lambda s, v: float(np.mean(s.kld)), lambda s: s.kld),  # NaN rows -> NaN
    "nmse": LogitMetric("nmse", lambda s, v: metrics.nmse_pooled(s.sse, s.ref_sum, s.ref_sumsq, v), None),
    "max_abs": LogitMetric("max |diff|", lambda s, v: float(np.max(s.max_abs)), lambda s: s.max_abs),
    "top10": topk_overlap_metric(10),
    "same_top": topk_agreement_metric(1, "same top-1"),
    "prob_mse": LogitMetric("probability MSE", lambda s, v: float(np.mean(s.prob_mse)), lambda s: s.prob_mse),
    "kld_p99": LogitMetric("kld 99th percentile", lambda s, v: klstats.kld_percentile(s.kld, 0.99), lambda s: s.kld),
    "ppl_ratio": LogitMetric("PPL(cand) / PPL(ref)", lambda s, v: klstats.ppl_ratio(s.ref_nll, s.cand_nll),
                             lambda s: s.cand_nll - s.ref_nll, next_token=True),
    "rms_dp": LogitMetric("RMS dp", lambda s, v: klstats.rms_dp(s.ref_nll, s.cand_nll),
                          lambda s: np.abs(klstats.dp(s.ref_nll, s.cand_nll)), next_token=True),
}


def logit_metric_values(cmp: Comparison) -> dict[str, float]:
    """Every logit metric over all compared positions (each next-token metric over those with a
    next token), whichever checks were selected: the numbers reports and baselines keep."""
    values = {}
    if cmp.stats is None:
        return values
    for name, metric in LOGIT_METRICS.items():
        scopes = _scopes(cmp.stats, metric.next_token)
        if scopes:
            values[name] = metric.aggregate(scopes[0][1], cmp.n_vocab)
    return values


def _scopes(stats: PositionStats, next_token: bool = False) -> list[tuple[str, PositionStats]]:
    """All compared positions, and the last position of each sequence (llama.cpp's single-vector
    view) when those are compared; metrics of the next token take the positions that have one."""
    if next_token:
        with_next = stats.select(stats.target >= 0)
        return [(f"{len(with_next)} next tokens", with_next)] if len(with_next) else []
    last = stats.select(stats.is_last)
    n_seq = len(np.unique(stats.seq))
    if len(last) == len(stats):
        return [(f"last position of {n_seq} sequences", stats)]
    if not len(last):  # llama-perplexity's scored positions stop before the last
        return [(f"{len(stats)} scored positions", stats)]
    return [(f"all {len(stats)} positions", stats), (f"last position of {n_seq} sequences", last)]


def _passes(value: float, threshold: float, direction: str) -> bool:
    if not np.isfinite(value):  # NaN/Inf logits never pass
        return False
    return value >= threshold if direction == HIGHER else value <= threshold


def check_logits(name: str, cmp: Comparison, threshold: Threshold, metric: LogitMetric | None = None) -> CheckResult:
    """Evaluate a registered logit check (``metric`` may replace its aggregation, e.g. top-k with
    another k) over all positions and over the last positions; both must pass."""
    check, metric = CHECKS[name], metric or LOGIT_METRICS[name]
    if cmp.error:
        return CheckResult(name, cmp.name, ERROR, reason=cmp.error, threshold=threshold)
    stats = cmp.stats
    symbol = ">=" if check.direction == HIGHER else "<="
    scopes = _scopes(stats, metric.next_token)
    if not scopes:
        return CheckResult(name, cmp.name, SKIPPED, threshold=threshold, reason=(
            "no position has a next token to predict (a last-position dump holds one row per prompt)"))
    result = CheckResult(name, cmp.name, PASSED, threshold=threshold)
    for scope, subset in scopes:
        value = metric.aggregate(subset, cmp.n_vocab)
        ok = _passes(value, threshold.value, check.direction)
        result.rows.append(Row(f"{metric.label}, {scope}", fmt(value), f"{symbol} {fmt(threshold.value)}", ok))
        if result.value is None:
            result.value = value
        if not ok:
            result.status = FAILED
    if name == "nmse":
        result.extra = {"nmse_db": metrics.nmse_db(result.value), "verdict": metrics.nmse_verdict(result.value)}
        result.rows[0].value += f" ({result.extra['nmse_db']:.1f} dB, {result.extra['verdict']})"
    if name == "kld" and stats.finite.all():
        result.extra = {"median": float(np.median(stats.kld)), "max": float(np.max(stats.kld))}
        result.rows[0].value += f" (median {fmt(result.extra['median'])}, max {fmt(result.extra['max'])})"
    if result.status == FAILED:
        _explain(result, cmp, metric)
    return result


def _explain(result: CheckResult, cmp: Comparison, metric: LogitMetric) -> None:
    stats = cmp.stats
    bad = int((~stats.finite).sum())
    if bad:
        first = int(np.argmin(stats.finite))
        result.details.append(f"the candidate produced NaN/Inf logits at {bad} of {len(stats)} positions "
                              f"(first: sequence {stats.seq[first]}, position {stats.pos[first]})")
    if metric.per_position is not None:
        per = np.nan_to_num(metric.per_position(stats), nan=np.inf)
        for idx in np.argsort(-per, kind="stable")[:5]:
            s, p = int(stats.seq[idx]), int(stats.pos[idx])
            ref_next, cand_next = int(stats.ref_top[idx, 0]), int(stats.cand_top[idx, 0])
            result.details.append(
                f"sequence '{cmp.eval.sequences[s].label}' position {p} after {cmp.context(s, p)!r}: "
                f"kld {fmt(stats.kld[idx])}, max|diff| {fmt(stats.max_abs[idx])}, "
                f"top-1 reference {cmp.reference.piece(ref_next)!r} vs candidate {cmp.candidate.piece(cand_next)!r}")
    result.hint = _hint(cmp)


def _hint(cmp: Comparison) -> str:
    """Point at the likely cause from where along the sequence the error sits. At position 0
    rope is the identity and attention sees one token, so a clean position 0 with errors after
    it points at rope or attention; an error already at position 0 points at weights or norms."""
    stats = cmp.stats
    kld = np.nan_to_num(stats.kld, nan=np.inf)
    first, later = kld[stats.pos == 0], kld[stats.pos > 0]
    if len(first) and len(later) and np.mean(later) > 10 * max(np.mean(first), 1e-6):
        where = ("position 0 is fine and later positions are not: suspect rope (freq base, scaling, Q/K "
                 "permutation) or attention (heads, kv heads, window, soft-capping)")
    else:
        where = ("the error is there from position 0: suspect weights (a scaled or wrong tensor, "
                 "quantization), norm epsilon or the output head")
    return (f"{where}; compare with --cand-runner gguf-torch to separate weight error (present there too) "
            f"from llama.cpp kernel error, or set the threshold with @pytest.mark.modeldiff(...) / "
            f"--modeldiff-threshold if the candidate type ({cmp.quant_type}, class {cmp.quant_class}) "
            "is expected to be this far off")


# --------------------------------------------------------------------------- next-token accuracy
def check_topk_acc_drop(cmp: Comparison, threshold: Threshold) -> CheckResult:
    """For K = 1..topk_max: reference top-K accuracy minus the candidate's, each at most the
    threshold. Accuracy is the fraction of positions whose next token is among the model's top K
    (quality.py); the drop measures lost quality, not disagreement (same_top, top10 do that)."""
    name = "topk_acc_drop"
    if cmp.error:
        return CheckResult(name, cmp.name, ERROR, reason=cmp.error, threshold=threshold)
    q = cmp.quality
    if q.positions == 0:
        return CheckResult(name, cmp.name, SKIPPED, threshold=threshold, reason=(
            "no position has a next token to predict (a last-position dump holds one row per prompt)"))
    drops = np.nan_to_num(q.accuracy_drop, nan=np.inf)
    k = int(np.argmax(drops)) + 1  # the worst K; the quality table shows every K
    ok = _passes(drops[k - 1], threshold.value, CHECKS[name].direction)
    result = CheckResult(name, cmp.name, PASSED if ok else FAILED, threshold=threshold, value=float(drops[k - 1]))
    result.rows.append(Row(f"top-{k} accuracy drop, worst of K = 1..{q.topk_max} ({fmt(q.ref_accuracy[k - 1])} -> "
                           f"{fmt(q.cand_accuracy[k - 1])} over {q.positions} next tokens)",
                           fmt(drops[k - 1]), f"<= {fmt(threshold.value)}", ok))
    if not ok:
        stats = cmp.stats
        has = stats.target >= 0
        lost = np.flatnonzero(has & (stats.ref_rank < k) & (stats.cand_rank >= k))
        found = int((has & (stats.ref_rank >= k) & (stats.cand_rank < k)).sum())
        result.details.append(f"top-{k}: the candidate misses {len(lost)} next tokens that the reference has in its "
                              f"top {k}, and finds {found} that the reference misses")
        for idx in lost[np.argsort(-stats.cand_rank[lost], kind="stable")][:5]:
            s, p = int(stats.seq[idx]), int(stats.pos[idx])
            result.details.append(
                f"sequence '{cmp.eval.sequences[s].label}' position {p} after {cmp.context(s, p)!r}: next token "
                f"{cmp.reference.piece(int(stats.target[idx]))!r} ranked {int(stats.ref_rank[idx]) + 1} by the "
                f"reference, {int(stats.cand_rank[idx]) + 1} by the candidate (kld {fmt(stats.kld[idx])})")
        result.hint = _hint(cmp)
    return result


# --------------------------------------------------------------------------- per-layer check
def check_layers(cmp: Comparison, threshold: Threshold) -> CheckResult:
    """Every layer's mean rfn against its limit (``threshold.value`` is a LayerLimits). The
    report names the first layer over its limit and the largest jump: error accumulates with
    depth, so the first excess, not the largest value, is where a conversion breaks."""
    if cmp.layers is None and cmp.layers_skipped:
        return CheckResult("layers", cmp.name, SKIPPED, reason=cmp.layers_skipped)
    if cmp.layers is None:
        reason = cmp.layers_error or ("hidden states were not captured: add 'layers' to --modeldiff-checks "
                                      "(or Settings(layers=True))")
        return CheckResult("layers", cmp.name, ERROR, reason=reason)
    st = cmp.layers
    rfn, rfn_max, cos_err, sqnr, iso = st.rfn_mean, st.rfn_max, st.cos_err.mean(0), st.sqnr_db, st.isolated_mean
    per_layer, first = [], None
    for i, name in enumerate(st.names):
        limit = threshold.value.for_layer(name)
        kept = st.is_kept(i)
        ok = kept or _passes(rfn[i], limit.value, CHECKS["layers"].direction)
        if not ok and first is None:
            first = i
        per_layer.append({"name": name, "rfn_mean": rfn[i], "rfn_max": rfn_max[i], "cos_err": cos_err[i],
                          "sqnr_db": sqnr[i], "isolated_rfn": None if iso is None else iso[i],
                          "threshold": limit.value, "threshold_source": limit.source, "passed": ok, "kept": kept})
    judged = [i for i in range(len(st.names)) if not per_layer[i]["kept"]]
    worst = max(judged, key=lambda i: np.nan_to_num(rfn[i], nan=np.inf))
    jump = st.largest_jump()
    result = CheckResult("layers", cmp.name, PASSED if first is None else FAILED, value=float(rfn[worst]))
    result.rows.append(Row(f"rfn, worst of {len(judged)} states ({describe(st.names[worst])})", fmt(rfn[worst]),
                           f"<= {fmt(per_layer[worst]['threshold'])}", per_layer[worst]["passed"]))
    if first is not None:
        result.rows.append(Row(f"rfn, first over its limit ({describe(st.names[first])})", fmt(rfn[first]),
                               f"<= {fmt(per_layer[first]['threshold'])}", False))
    result.extra = {"layers": per_layer, "first_offending": None if first is None else st.names[first],
                    "largest_jump": None if jump is None else st.names[jump], "kept": st.kept, "source": st.source}
    if first is not None:
        _explain_layers(result, cmp, first, jump)
    return result


def _explain_layers(result: CheckResult, cmp: Comparison, first: int, jump: int | None) -> None:
    st, per_layer = cmp.layers, result.extra["layers"]
    name = st.names[first]
    result.details.append(f"first state over its limit: {describe(name)} (rfn {fmt(st.rfn_mean[first])} > "
                          f"{fmt(per_layer[first]['threshold'])} from {per_layer[first]['threshold_source']})")
    if jump is not None:
        prev = st.rfn_mean[jump - 1]
        ratio = st.rfn_mean[jump] / prev if prev > 0 else np.inf
        result.details.append(f"largest jump: {describe(st.names[jump])}, rfn x{ratio:.3g} over "
                              f"{describe(st.names[jump - 1])} ({fmt(prev)} -> {fmt(st.rfn_mean[jump])})")
    iso = st.isolated_mean
    if iso is not None:
        own = int(np.argmax(np.nan_to_num(iso[1:], nan=np.inf))) + 1
        result.details.append(f"isolated error (each layer fed the reference's input): largest at "
                              f"{describe(st.names[own])}, rfn {fmt(iso[own])}")
    if name == EMBD:
        where = ("the token embeddings already differ: token_embd rows (vocabulary order, a shifted or "
                 "transposed tensor) or an embedding scale")
    elif name == "0":
        where = ("the error starts in the first decoder layer, where everything that all layers share shows "
                 "first: rope (freq base, scaling, Q/K permutation), norm epsilon, head counts")
    elif name == NORM:
        where = "only the final norm is off: output_norm weight or norm epsilon"
    else:
        where = (f"layers before {name} match and {describe(name)} does not: suspect that layer's own tensors "
                 "(scaled, swapped or corrupted weights)")
    tips = [where]
    if iso is None:
        tips.append("--cand-runner gguf-torch adds each layer's isolated error")
    if name.isdigit() and int(name) > 0:
        tips.append(f"--modeldiff-keep-layers {first} checks whether the layers after it are fine")
    result.hint = "; ".join(tips)


# --------------------------------------------------------------------------- weights check
WEIGHT_KEYS = tuple(limit.key for limit in CHECKS["weights"].limits)  # weight_rel, weight_cos, weight_gain


def check_weights(weights: WeightComparison, thresholds: dict[str, Threshold]) -> CheckResult:
    """Every tensor pair within its limits (relative change, cosine, |gain - 1|: the threshold
    when one is set, else from the usual error of the candidate's storage type); no tensor missing,
    added or reshaped unless llama.cpp's converter drops or makes it on purpose."""
    name = "weights"
    if weights.skipped:
        return CheckResult(name, weights.name, SKIPPED, reason=weights.skipped)
    if weights.error:
        return CheckResult(name, weights.name, ERROR, reason=weights.error)
    diff = weights.diff
    rel_t, cos_t, gain_t = (thresholds[key] for key in WEIGHT_KEYS)
    judged = []  # (tensor, limits or None, passed)
    for t in diff.tensors:
        if t.metrics:
            limits = WeightLimits.of(t.usual_rel, rel_t.value, cos_t.value, gain_t.value)
            judged.append((t, limits, limits.passes(t.metrics)))
        else:
            judged.append((t, None, t.expected))
    compared = [(t, lim, ok) for t, lim, ok in judged if lim is not None]
    result = CheckResult(name, weights.name, PASSED if all(ok for *_, ok in judged) else FAILED,
                         threshold=rel_t if rel_t.value is not None else None)
    n_ok = sum(ok for *_, ok in compared)
    result.rows.append(Row("tensors within their limits", f"{n_ok}/{len(compared)}", "all", n_ok == len(compared)))
    if compared:
        def worst(metric):
            return max(compared, key=lambda x: np.nan_to_num(metric(x[0].metrics), nan=np.inf))

        for label, metric, limit in (("||d||/||ref||", lambda m: m["rel"], lambda lim: lim.rel),
                                     ("1 - cosine", lambda m: 1.0 - m["cos"], lambda lim: 1.0 - lim.cos),
                                     ("|gain - 1|", lambda m: abs(m["gain"] - 1.0), lambda lim: lim.gain)):
            t, lim, _ = worst(metric)
            value = metric(t.metrics)
            result.rows.append(Row(f"largest {label}: {t.name} ({t.ref_type} -> {t.cand_type})", fmt(value),
                                   f"<= {fmt(limit(lim))}", bool(value <= limit(lim))))
        result.value = float(worst(lambda m: m["rel"])[0].rel)
    for status in ("removed", "added", "shape-changed"):
        unexpected = [t for t, _, ok in judged if t.status == status and not ok]
        result.rows.append(Row(f"tensors {status}", str(len(unexpected)), "0", not unexpected))
    source = next((t.source for t in (rel_t, cos_t, gain_t) if t.value is not None), None)
    report = diff.to_dict()
    for entry, (t, lim, ok) in zip(report["tensors"], judged):
        entry.update({"limit_rel": lim and lim.rel, "limit_cos": lim and lim.cos, "limit_gain": lim and lim.gain,
                      "passed": ok})
    result.extra = {"weights": report, "limits_source": source or PER_TENSOR_TYPE}
    if result.status == FAILED:
        _explain_weights(result, judged, source)
    return result


def _explain_weights(result: CheckResult, judged: list, source: str | None) -> None:
    bad = [(t, lim) for t, lim, ok in judged if not ok]
    bad.sort(key=lambda x: (x[1] is not None, -np.nan_to_num(x[0].rel, nan=np.inf) if x[1] else 0))
    for t, lim in bad[:WORST_TENSORS]:
        where = f"{t.name} [{t.group}{'' if t.layer is None else f', layer {t.layer}'}]"
        if lim is None:
            shapes = f" {t.ref_shape} -> {t.cand_shape}" if t.status == "shape-changed" else ""
            result.details.append(f"{where}: {t.status}{shapes}: {t.cause}{'; ' + t.note if t.note else ''}")
            continue
        m = t.metrics
        cause = t.cause or (f"within {t.cand_type}'s usual error ({fmt(t.usual_rel)}) but over the threshold from {source}")
        result.details.append(f"{where} {t.ref_type} -> {t.cand_type}: ||d||/||ref|| {fmt(m['rel'])} (limit "
                              f"{fmt(lim.rel)}), 1 - cos {fmt(1.0 - m['cos'])}, gain {m['gain']:.5g}: likely cause: {cause}")
    if len(bad) > WORST_TENSORS:
        result.details.append(f"... and {len(bad) - WORST_TENSORS} more (every tensor is in the JSON report)")
    causes = " ".join(t.cause for t, _ in bad)
    if all(lim is not None and not t.cause for t, lim in bad):
        result.hint = (f"every failing tensor is within its storage type's usual error: the threshold from {source} "
                       "asks for more than those types can store; loosen it, or compare a wider type")
    elif "rope" in causes:
        result.hint = ("Q/K rows are in the wrong rope order: convert with llama.cpp's convert_hf_to_gguf.py, which "
                       "permutes Q/K for llama-family models, and do not permute them again")
    elif any(t.status in ("removed", "added", "shape-changed") for t, _ in bad):
        result.hint = ("the two files do not hold the same set of tensors: check the converter's tensor map for this "
                       "architecture and that both files are the same model")
    else:
        result.hint = ("a tensor changed beyond its storage type's usual error: re-convert it, or set weight_rel / "
                       "weight_cos / weight_gain (@pytest.mark.modeldiff(...), --modeldiff-threshold) if it is meant to "
                       "differ (a fine-tune is better judged by the logit checks)")


EXACT_CHECKS = {"tokens": check_tokens, "vocab": check_vocab, "metadata": check_metadata}


OWN_FUNCTION_CHECKS = {"topk_acc_drop": check_topk_acc_drop, "layers": check_layers}


def run_check(name: str, cmp: Comparison | WeightComparison, thresholds: dict[str, Threshold]) -> CheckResult:
    """``cmp`` is the candidate's Comparison, or for checks that read weight files (registry
    ``reads="weights"``) its WeightComparison, which needs no model run."""
    if CHECKS[name].reads == "weights":
        return check_weights(cmp if isinstance(cmp, WeightComparison) else cmp.weights, thresholds)
    if name in EXACT_CHECKS:
        return EXACT_CHECKS[name](cmp)
    if name in OWN_FUNCTION_CHECKS:
        return OWN_FUNCTION_CHECKS[name](cmp, thresholds[CHECKS[name].threshold_key])
    return check_logits(name, cmp, thresholds[name])


def run_checks(cmp: Comparison, thresholds: dict[str, Threshold]) -> list[CheckResult]:
    return [run_check(name, cmp, thresholds) for name in CHECKS]
