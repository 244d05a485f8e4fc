"""Checks without a number: token ids, vocabulary and model metadata."""
from __future__ import annotations

from typing import TYPE_CHECKING

from gguf import Keys

from ..formats import mapping
from ..formats.vocab import VocabInfo, first_different_line, render_chat
from .results import FAILED, PASSED, SKIPPED, CheckResult, Row

if TYPE_CHECKING:  # records of the engine, which runs the checks: no import at run time
    from ..engine.records import Comparison


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
        result.hint = (f"the candidate tokenizes the same text differently: check {Keys.Tokenizer.PRE} "
                       f"(pre-tokenizer), merges, special tokens and {Keys.Tokenizer.ADD_BOS}; "
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
            f"{installed}: install that version (pip install transformers=={declared}) and run again; "
            if newer else "")


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
        result.hint = ("re-convert with the tokenizer files that belong to the reference; special ids, "
                       "add-bos/eos flags and the chat template come from tokenizer_config.json / "
                       "generation_config.json / chat_template.jinja")
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
    if ref.chat_template is not None:
        row, detail = _compare_chat_templates(ref, cand)
        rows.append(row)
        details += detail
    return rows, details


def _compare_chat_templates(ref: VocabInfo, cand: VocabInfo) -> tuple[Row, list[str]]:
    """The reference's chat template must reach the candidate unchanged: missing or changed text
    fails, with the first differing line of the template and of a sample conversation rendered
    through both (what a chat front end would send the model)."""
    if cand.chat_template is None:
        return Row("chat template", "missing in the candidate", "identical", False), [
            f"chat template: the reference has one ({len(ref.chat_template)} characters), the candidate has no "
            f"{Keys.Tokenizer.CHAT_TEMPLATE}"]
    if cand.chat_template == ref.chat_template:
        return Row("chat template", f"{len(ref.chat_template)} characters", "identical", True), []
    details = []
    where = first_different_line(ref.chat_template, cand.chat_template)
    if where:
        details.append(f"chat template line {where[0]}: reference {where[1]!r} vs candidate {where[2]!r}")

    rendered = [render_chat(v.chat_template, v.special_token("bos"), v.special_token("eos")) for v in (ref, cand)]
    where = first_different_line(*rendered)
    details.append("sample conversation renders the same" if where is None else
                   f"sample conversation, rendered line {where[0]}: reference {where[1]!r} vs candidate {where[2]!r}")
    return Row("chat template", "changed", "identical", False), details


def check_metadata(cmp: Comparison, threshold=None) -> CheckResult:
    ref, cand = cmp.reference.hparams(), cmp.candidate.hparams()
    if ref is None or cand is None:
        side = cmp.reference if ref is None else cmp.candidate
        return CheckResult("metadata", cmp.name, SKIPPED,
                           reason=f"{side.path} carries no hyper-parameters ({side.kind})")
    diffs = {key: (a, b) for key, a, b in mapping.compare(ref, cand)}
    result = CheckResult("metadata", cmp.name, FAILED if diffs else PASSED)
    for key in sorted(set(ref) | set(cand)):
        if key in ref:
            result.rows.append(Row(key, f"{ref[key]} vs {cand.get(key, 'missing')}", "equal", key not in diffs))
    if diffs:
        result.hint = ("the candidate's architecture metadata differs from the reference config; fix the "
                       "converter or the config (llama.cpp can patch a value with --override-kv)")
    return result
