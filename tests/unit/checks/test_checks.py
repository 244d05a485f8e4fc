"""Checks on hand-made values (the end-to-end cases are in tests/conversions/test_conversions.py)."""
import numpy as np

from pytest_modeldiff import compare
from pytest_modeldiff.checks.exact import compare_vocab
from pytest_modeldiff.checks.results import FAILED, PASSED
from pytest_modeldiff.formats import dumps
from pytest_modeldiff.formats.vocab import VocabInfo

REF = VocabInfo(tokens=["<s>", "a", "b", "ab"], merges=["a b"], scores=[0.0, -1.0, -2.0, -3.0],
                special={"bos": 0, "eos": None}, add_bos=True, add_eos=False)


def rows_of(cand):
    rows, details = compare_vocab(REF, cand)
    return {r.metric: r for r in rows}, details


def test_identical_vocab_with_converter_padding_passes():
    cand = VocabInfo(tokens=REF.tokens + ["[PAD4]", "[PAD5]"], merges=["a b"], scores=list(REF.scores),
                     special={"bos": 0, "eos": 1}, add_bos=True, add_eos=False)
    rows, details = rows_of(cand)
    assert all(r.passed for r in rows.values()) and not details
    assert set(rows) == {"token strings", "vocabulary size", "merges", "scores", "bos id", "add_bos flag",
                         "add_eos flag"}


def test_each_difference_is_named():
    cand = VocabInfo(tokens=["<s>", "b", "a", "ab", "extra"], merges=["a c"], scores=[0.0, -1.0, -2.5, -3.0],
                     special={"bos": 3}, add_bos=False, add_eos=False)
    rows, details = rows_of(cand)
    failed = {k for k, r in rows.items() if not r.passed}
    assert failed == {"token strings", "vocabulary size", "merges", "scores", "bos id", "add_bos flag"}
    assert rows["token strings"].value == "2 differ of 4"
    assert details == ["token 1: reference 'a' vs candidate 'b'", "token 2: reference 'b' vs candidate 'a'",
                       "merge 0: reference 'a b' vs candidate 'a c'", "score 2: reference -2.0 vs candidate -2.5"]


def write_dump(folder, prefix, name, logits, ids):
    writer = dumps.AllPositionsWriter(folder, prefix, name)
    writer.add(np.asarray(logits, np.float32), ids, None)
    return writer.finish(len(logits[0]), {})


def test_topk_acc_drop_fails_naming_the_lost_positions(tmp_path):
    """Recorded logits over a 4-token vocabulary: the reference ranks each next token first, the
    candidate ranks them 2nd, 2nd and 4th."""
    ids = [0, 3, 2, 1]
    ref = [[0, 1, 0, 2], [0, 1, 2, 0], [0, 3, 2, 1], [1, 0, 0, 0]]
    cand = [[0, 2, 0, 1], [2, 1, 1.5, 0], [3, 0, 2, 1], [1, 0, 0, 0]]
    report = compare(write_dump(tmp_path, "pytorch", "ref", ref, ids),
                     write_dump(tmp_path, "llamacpp", "cand-q8_0", cand, ids), checks=["topk_acc_drop"])
    result = report["llamacpp-cand-q8_0-all"].result("topk_acc_drop")
    assert result.status == FAILED and result.value == 1.0
    assert result.rows[0].metric == "top-1 accuracy drop, worst of K = 1..5 (1 -> 0 over 3 next tokens)"
    assert result.details[0] == ("top-1: the candidate misses 3 next tokens that the reference has in its top 1, "
                                 "and finds 0 that the reference misses")
    assert result.details[1].startswith("sequence 'recorded 0' position 2 after ")
    assert "next token '<1>' ranked 1 by the reference, 4 by the candidate (kld " in result.details[1]
    assert [d.split(" position ")[1][0] for d in result.details[1:]] == ["2", "0", "1"], "worst rank first"
    assert "top-2 accuracy" in str(report) and result.hint


CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat_rows(ref_template, cand_template):
    ref = VocabInfo(tokens=REF.tokens, special={"bos": 0}, chat_template=ref_template)
    cand = VocabInfo(tokens=REF.tokens, special={"bos": 0}, chat_template=cand_template)
    rows, details = compare_vocab(ref, cand)
    return {r.metric: r for r in rows}.get("chat template"), details


def test_chat_template_identical_missing_and_changed():
    row, details = chat_rows(CHAT, CHAT)
    assert row.passed and row.value == f"{len(CHAT)} characters" and not details
    assert chat_rows(None, CHAT)[0] is None  # the reference has none: nothing to carry over
    row, details = chat_rows(CHAT, None)
    assert not row.passed and row.value == "missing in the candidate"
    assert details == [f"chat template: the reference has one ({len(CHAT)} characters), the candidate has no "
                       "tokenizer.chat_template"]
    row, details = chat_rows(CHAT, CHAT.replace("<|im_end|>\n", "<|im_end|>"))
    assert not row.passed and row.value == "changed"
    assert details[0].startswith("chat template line 2: reference \"{{ m['content'] }}<|im_end|>\" vs candidate ")
    # rendered as transformers renders it: the sample conversation's second line is where they part
    assert details[1] == ("sample conversation, rendered line 2: reference 'You are a helpful assistant.<|im_end|>' "
                          "vs candidate 'You are a helpful assistant.<|im_end|><|im_start|>user'")


def test_chat_template_that_renders_the_same_still_fails_and_says_so():
    row, details = chat_rows(CHAT, CHAT.replace("m['role']", "m.role"))
    assert not row.passed and details[-1] == "sample conversation renders the same"


def test_chat_template_that_does_not_render_is_reported_not_raised():
    row, details = chat_rows(CHAT, "{% if %}")
    assert not row.passed and details[-1].startswith("sample conversation, rendered line 1: reference '<|im_start|>"
                                                     "system' vs candidate \"error: TemplateSyntaxError")


def write_dumps(folder, prefix, name, sequences):
    writer = dumps.AllPositionsWriter(folder, prefix, name)
    for s, logits in enumerate(sequences):
        writer.add(np.asarray(logits, np.float32), [s, 7 - s][:len(logits)], None)  # distinct ids per sequence
    return writer.finish(len(sequences[0][0]), {})


def test_same_top_at_the_last_positions_is_judged_by_its_upper_bound(tmp_path):
    """7 sequences of 2 positions: the candidate keeps the reference's top-1 at every first position
    and at the last position of k sequences. k = 3 (3/7 = 0.43 under 0.55, upper bound 0.77) passes;
    k = 1 (upper bound 0.52) fails; the all-positions scope is judged by its point value."""
    top0, top1 = [3, 0, 0, 0, 0, 0, 0, 0], [0, 3, 0, 0, 0, 0, 0, 0]
    ref = [[top0, top0]] * 7
    for kept, status in ((3, PASSED), (1, FAILED)):
        cand = [[top0, top0 if s < kept else top1] for s in range(7)]
        report = compare(write_dumps(tmp_path / str(kept), "pytorch", "ref", ref),
                         write_dumps(tmp_path / str(kept), "llamacpp", "cand-q4_k_m", cand),
                         checks=["same_top"], thresholds={"same_top": 0.55})
        result = report["llamacpp-cand-q4_k_m-all"].result("same_top")
        assert result.status == status, [(r.metric, r.value, r.passed) for r in result.rows]
        all_row, last_row = result.rows
        assert all_row.passed and all_row.value == f"{(7 + kept) / 14:.4g}"
        assert last_row.value.startswith(f"{kept / 7:.4g} ({kept} of 7, 95 % upper bound ")


def test_same_top_of_one_position_per_sequence_is_judged_by_its_upper_bound(tmp_path):
    """The same rule where the last positions are the only scope (one-token sequences, as in
    llama.cpp's last-position view): 3 of 7 passes a 0.55 limit, 1 of 7 fails."""
    top0, top1 = [3, 0, 0, 0, 0, 0, 0, 0], [0, 3, 0, 0, 0, 0, 0, 0]
    for kept, status in ((3, PASSED), (1, FAILED)):
        cand = [[top0 if s < kept else top1] for s in range(7)]
        report = compare(write_dumps(tmp_path / str(kept), "pytorch", "ref", [[top0]] * 7),
                         write_dumps(tmp_path / str(kept), "llamacpp", "cand-q4_k_m", cand),
                         checks=["same_top"], thresholds={"same_top": 0.55})
        result = report["llamacpp-cand-q4_k_m-all"].result("same_top")
        assert result.status == status and len(result.rows) == 1, [(r.metric, r.value) for r in result.rows]
        assert result.rows[0].metric == "same top-1, last position of 7 sequences"
        assert result.rows[0].value.startswith(f"{kept / 7:.4g} ({kept} of 7, 95 % upper bound ")
