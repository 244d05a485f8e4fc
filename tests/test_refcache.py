"""The reference cache: its precision floor, reuse, corruption, staleness, concurrent writers,
and the cache file as --ref-model."""
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from pytest_modeldiff import compare
from pytest_modeldiff.engine import ModelDiff, Settings
from pytest_modeldiff.errors import ModelDiffError
from pytest_modeldiff.evaldata import EvalSequence
from pytest_modeldiff.refcache import ModelDiffCacheWarning, ReferenceCache, encode_rows, write_cache

CHECKS = ["kld", "max_abs", "layers"]


def test_encoding_error_is_at_most_half_a_step():
    rows = np.random.default_rng(0).normal(0, 5, (4, 1000)).astype(np.float32)
    rows[1] = 3.0  # a constant row decodes exactly
    low, scale, codes = encode_rows(rows)
    decoded = low[:, None] + scale[:, None] * codes.astype(np.float32)
    assert np.all(np.abs(decoded - rows) <= scale[:, None] / 2 + 1e-6 * np.abs(rows).max())  # + float32 rounding
    assert np.array_equal(decoded[1], rows[1])
    assert codes.max() == 65535 and codes.min() == 0


def write_small(path: Path, n_vocab=50, hidden=False) -> list:
    rng = np.random.default_rng(1)
    seqs = [EvalSequence([1, 2, 3, 4], "text", "a"), EvalSequence([5, 6, 7], None, "b", scored=(1, 2))]
    rows = [rng.normal(size=(4, n_vocab)).astype(np.float32), rng.normal(size=(2, n_vocab)).astype(np.float32)]
    states = [rng.normal(size=(3, 4, 8)).astype(np.float32), rng.normal(size=(3, 3, 8)).astype(np.float32)]
    write_cache(path, {"model_path": "m", "model_sha256": "x"}, seqs, rows.__getitem__,
                states.__getitem__ if hidden else None)
    return rows, states


def test_round_trip_keeps_ids_positions_and_values(tmp_path):
    path = tmp_path / "r.mdref"
    rows, states = write_small(path, hidden=True)
    cache = ReferenceCache(path)
    assert [s["ids"] for s in cache.sequences] == [[1, 2, 3, 4], [5, 6, 7]]
    assert [s["first"] for s in cache.sequences] == [0, 1] and cache.sequences[1]["scored"] == [1, 2]
    assert np.allclose(cache.logits(0), rows[0], atol=1e-3) and cache.logits(1).shape == (2, 50)
    assert cache.has_hidden and np.allclose(cache.hidden(1), states[1], atol=2e-3)
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:-100], "truncated reference cache"),
    (lambda b: b[:-40] + bytes([b[-40] ^ 1]) + b[-39:], "checksum mismatch"),
    (lambda b: b"NOTMDREF" + b[8:], "not a pytest-modeldiff reference cache"),
])
def test_damaged_files_are_named_errors(tmp_path, damage, message):
    path = tmp_path / "r.mdref"
    write_small(path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ModelDiffError, match=f"{path}.*{message}|{message}"):
        ReferenceCache(path)


def test_floor_reuse_and_the_cache_as_reference(tiny, tmp_path):
    """The cache is built once, reused without running the reference, and its own KLD against
    the reference it stands for is the documented floor (< 1e-7)."""
    cache_dir = tmp_path / "cache"
    first = compare(tiny / "hf", [tiny / "tiny-q8_0.gguf"], checks=CHECKS, ref_cache=cache_dir, eval_length=64)
    entry = next(cache_dir.glob("hf-*.mdref"))
    md = ModelDiff(tiny / "hf", [tiny / "tiny-q8_0.gguf"], Settings(ref_cache=cache_dir, eval_length=64))
    try:
        again = md.compare("tiny-q8_0")
        assert again.timings["reference_forward_s"] == 0.0  # read from the cache, no forward pass
        assert md.reference.model is None  # the reference model was never loaded
    finally:
        md.close()
    assert again.stats.kld.mean() == pytest.approx(first["tiny-q8_0"].comparison.stats.kld.mean(), rel=1e-3)
    floor = compare(tiny / "hf", [entry], checks=CHECKS, eval_length=64)
    floor_cmp = floor[entry.stem].comparison
    assert floor_cmp.stats.kld.mean() < 1e-7 and floor[entry.stem].result("layers").value < 1e-3
    as_ref = compare(entry, [tiny / "tiny-q8_0.gguf"], checks=[*CHECKS, "tokens", "vocab", "metadata"])
    results = {r.name: r for r in as_ref["tiny-q8_0"].results}
    assert results["kld"].value == pytest.approx(first["tiny-q8_0"].result("kld").value, rel=1e-3)
    assert results["tokens"].status == "skipped"  # the cache holds ids, not a tokenizer
    assert results["vocab"].status == results["metadata"].status == "passed"


def test_corrupt_entry_is_reported_and_rebuilt(tiny, tmp_path):
    cache_dir = tmp_path / "cache"
    compare(tiny / "hf", [tiny / "tiny-q8_0.gguf"], checks=["kld"], ref_cache=cache_dir, eval_length=32)
    entry = next(cache_dir.glob("*.mdref"))
    data = bytearray(entry.read_bytes())
    data[-100] ^= 0xFF
    entry.write_bytes(bytes(data))
    with pytest.warns(ModelDiffCacheWarning, match="checksum mismatch.*rebuilding"):
        compare(tiny / "hf", [tiny / "tiny-q8_0.gguf"], checks=["kld"], ref_cache=cache_dir, eval_length=32)
    ReferenceCache(entry)  # intact again


def test_changed_model_removes_its_stale_entry(demo_ref, demo_cand, tmp_path):
    model = tmp_path / "hf"
    shutil.copytree(demo_ref, model)
    cache_dir = tmp_path / "cache"
    compare(model, [demo_cand], checks=["kld"], ref_cache=cache_dir, eval_length=16)
    old = next(cache_dir.glob("*.mdref"))
    config = model / "config.json"
    config.write_text(config.read_text().replace("{", '{\n  "comment": "edited",', 1))  # new content hash
    with pytest.warns(ModelDiffCacheWarning, match="stale reference cache removed"):
        compare(model, [demo_cand], checks=["kld"], ref_cache=cache_dir, eval_length=16)
    assert not old.exists() and len(list(cache_dir.glob("*.mdref"))) == 1


CONCURRENT = """
import sys
from pathlib import Path
from pytest_modeldiff import compare
r = compare(sys.argv[1], [sys.argv[2]], checks=["kld"], ref_cache=Path(sys.argv[3]), eval_length=32,
            progress=lambda m: print(m, flush=True))
print("KLD", r.candidates[next(iter(r.candidates))].result("kld").value)
"""


def test_concurrent_workers_compute_the_entry_once(demo_ref, demo_cand, tmp_path):
    """Two processes (as pytest-xdist workers would): one computes under the lock, the other waits and reads."""
    cache_dir = tmp_path / "cache"
    script = tmp_path / "worker.py"
    script.write_text(CONCURRENT)
    procs = [subprocess.Popen([sys.executable, str(script), str(demo_ref), str(demo_cand), str(cache_dir)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-1000:] for o in outs]
    text = [o[0] for o in outs]
    assert sum("outputs cached in" in t for t in text) == 1 and sum("outputs from the cache" in t for t in text) == 1
    assert len({t.split("KLD")[-1] for t in text}) == 1  # the writer too compares against the cached values
    assert len(list(cache_dir.glob("*.mdref"))) == 1 and not list(cache_dir.glob(".*.tmp"))


def test_plugin_uses_the_cache_and_takes_it_as_ref_model(pytester, demo_ref, demo_cand, tmp_path):
    cache_dir = tmp_path / "cache"
    args = ["-p", "no:cacheprovider", f"--cand-model={demo_cand}", "--modeldiff-checks=kld,tokens",
            f"--modeldiff-ref-cache={cache_dir}", "-v"]
    pytester.runpytest(f"--ref-model={demo_ref}", *args).assert_outcomes(passed=2)
    entry = next(cache_dir.glob("*.mdref"))
    result = pytester.runpytest(f"--ref-model={entry}", *args, "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*modeldiff: reference *refcache*", "*SKIPPED*tokens*"])
    with warnings.catch_warnings():
        result = pytester.runpytest(f"--ref-model={demo_ref}", *args[:-2], "--modeldiff-ref-cache=none", "-v")
    result.assert_outcomes(passed=2)
