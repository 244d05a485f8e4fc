"""Evaluation input: built-in prompts, --eval-text, parquet datasets; errors name the file."""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pytest_modeldiff.engine import evaldata
from pytest_modeldiff.engine.modeldiff import ModelDiff
from pytest_modeldiff.engine.settings import Settings
from pytest_modeldiff.errors import ModelDiffError

TEXT = "The quick brown fox jumps over the lazy dog. " * 200


def fake_tokenize(text):  # one id per character: easy to reason about
    return [ord(c) % 1000 for c in text]


def test_builtin_prompts_cover_the_categories_and_fill_special_tokens():
    labels = {label for label, _ in evaldata.BUILTIN_PROMPTS}
    assert {"prose", "code", "numbers", "whitespace", "non-english", "special tokens"} <= labels
    assert evaldata.BUILTIN_PROMPTS[0][1] == "Hello, my name is"  # llama.cpp's default prompt
    inp = evaldata.builtin_input(fake_tokenize, 32, "<s>", "</s>")
    special = dict(inp.texts)["special tokens"]
    assert special.startswith("<s>user") and "{bos}" not in special
    assert all(len(seq.ids) <= 32 for seq in inp.sequences)


def test_chunking_rows_length_and_bos():
    inp = evaldata.chunked_input(TEXT, fake_tokenize, rows=3, length=10, bos_id=999, label="t")
    assert [len(s.ids) for s in inp.sequences] == [10, 10, 10]
    assert all(s.ids[0] == 999 for s in inp.sequences)
    assert inp.sequences[1].ids[1:] == fake_tokenize(TEXT)[9:18]
    with pytest.raises(ModelDiffError, match="too little text"):
        evaldata.chunked_input("a", fake_tokenize, rows=3, length=10, bos_id=None, label="tiny.txt")


def test_parquet_reading_and_errors(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"content": ["first row", None, "second row"], "n": [1, 2, 3]}), path)
    assert evaldata.read_parquet_rows(path, "content", 10_000) == ["first row", "second row"]
    with pytest.raises(ModelDiffError, match=r"d.parquet: no column 'text'; columns are \['content', 'n'\]"):
        evaldata.read_parquet_rows(path, "text", 100)
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(ModelDiffError, match="bad.parquet: not a readable parquet file"):
        evaldata.read_parquet_rows(tmp_path / "bad.parquet", "text", 100)


def test_dataset_layout_is_exllamav2s_get_tokens():
    """Rows tokenized one by one without special tokens, concatenated, the first rows x length ids
    cut into rows; exllamav2 inserts no BOS (our tokenizer's leading BOS is dropped)."""
    rows = ["abc", "defgh", "ij", "klmnopq"]
    with_bos = lambda text: [999] + fake_tokenize(text)  # noqa: E731 - a tokenizer that adds BOS
    inp = evaldata.dataset_input(rows, with_bos, rows=2, length=4, bos_id=999, label="d")
    stream = fake_tokenize("abcdefghij")
    assert [s.ids for s in inp.sequences] == [stream[:4], stream[4:8]]
    assert inp.texts == [("d", "abc\n\ndefgh")], "rows used, for the tokens check"
    short = evaldata.dataset_input(rows, fake_tokenize, rows=3, length=8, bos_id=None, label="d")
    assert [len(s.ids) for s in short.sequences] == [8, 8], "17 ids: a third row of 1 id is dropped"
    with pytest.raises(ModelDiffError, match="d: too little text"):
        evaldata.dataset_input(["a"], fake_tokenize, rows=1, length=4, bos_id=None, label="d")


def test_text_file_errors(tmp_path):
    with pytest.raises(ModelDiffError, match="missing.txt: --eval-text file not found"):
        evaldata.read_text_file(tmp_path / "missing.txt")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ModelDiffError, match="latin1.txt: --eval-text is not UTF-8"):
        evaldata.read_text_file(tmp_path / "latin1.txt")


@pytest.mark.parametrize("source", ["text", "parquet"])
def test_engine_cuts_text_and_dataset_into_sequences(demo_ref, demo_cand, tmp_path, source):
    if source == "text":
        (tmp_path / "eval.txt").write_text(TEXT)
        settings = Settings(eval_text=tmp_path / "eval.txt", eval_rows=2, eval_length=24)
    else:
        pq.write_table(pa.table({"text": [TEXT[:500], TEXT[500:1500]]}), tmp_path / "eval.parquet")
        settings = Settings(eval_dataset=tmp_path / "eval.parquet", eval_rows=2, eval_length=24)
    md = ModelDiff(demo_ref, [demo_cand], settings)
    try:
        cmp = md.compare("demo-q8_0")
        assert [len(s.ids) for s in cmp.eval.sequences] == [24, 24]
        assert len(cmp.stats) == 48 and len(cmp.token_diffs) == 1
        assert cmp.token_diffs[0].first_mismatch is None
    finally:
        md.close()
