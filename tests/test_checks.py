"""Exact checks on hand-made values (the end-to-end cases are in test_conversions.py)."""
from pytest_modeldiff.checks import compare_vocab
from pytest_modeldiff.runners.base import VocabInfo

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
    assert set(rows) == {"token strings", "vocabulary size", "merges", "scores", "bos id", "add_bos flag", "add_eos flag"}


def test_each_difference_is_named():
    cand = VocabInfo(tokens=["<s>", "b", "a", "ab", "extra"], merges=["a c"], scores=[0.0, -1.0, -2.5, -3.0],
                     special={"bos": 3}, add_bos=False, add_eos=False)
    rows, details = rows_of(cand)
    failed = {k for k, r in rows.items() if not r.passed}
    assert failed == {"token strings", "vocabulary size", "merges", "scores", "bos id", "add_bos flag"}
    assert rows["token strings"].value == "2 differ of 4"
    assert details == ["token 1: reference 'a' vs candidate 'b'", "token 2: reference 'b' vs candidate 'a'",
                       "merge 0: reference 'a b' vs candidate 'a c'", "score 2: reference -2.0 vs candidate -2.5"]
