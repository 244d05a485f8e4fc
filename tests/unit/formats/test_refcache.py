"""The reference cache: its precision floor, reuse, corruption, staleness, concurrent writers,
and the cache file as --ref-model."""
import copy
import hashlib
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pytest_modeldiff import compare
from pytest_modeldiff.engine.evaldata import EvalSequence
from pytest_modeldiff.engine.modeldiff import ModelDiff
from pytest_modeldiff.engine.settings import Settings
from pytest_modeldiff.errors import ModelDiffCacheWarning, ModelDiffError
from pytest_modeldiff.formats.refcache import MAGIC, ReferenceCache, encode_rows, open_valid, remove_stale, write_cache

CHECKS = ["kld", "max_abs", "layers"]


def test_encoding_error_is_at_most_half_a_step():
    rows = np.random.default_rng(0).normal(0, 5, (4, 1000)).astype(np.float32)
    rows[1] = 3.0  # a constant row decodes exactly
    low, scale, codes = encode_rows(rows)
    decoded = low[:, None] + scale[:, None] * codes.astype(np.float32)
    assert np.all(np.abs(decoded - rows) <= scale[:, None] / 2 + 1e-6 * np.abs(rows).max())  # + float32 rounding
    assert np.array_equal(decoded[1], rows[1])
    assert codes.max() == 65535 and codes.min() == 0


def small_inputs(n_vocab=50, hidden=False):
    """(sequences, logits_of, hidden_of) of two short sequences, the second scored from position 1."""
    rng = np.random.default_rng(1)
    seqs = [EvalSequence([1, 2, 3, 4], "text", "a"), EvalSequence([5, 6, 7], None, "b", scored=(1, 2))]
    rows = [rng.normal(size=(4, n_vocab)).astype(np.float32), rng.normal(size=(2, n_vocab)).astype(np.float32)]
    states = [rng.normal(size=(3, 4, 8)).astype(np.float32), rng.normal(size=(3, 3, 8)).astype(np.float32)]
    return seqs, rows.__getitem__, states.__getitem__ if hidden else None


def write_small(path: Path, n_vocab=50, hidden=False) -> list:
    seqs, logits_of, hidden_of = small_inputs(n_vocab, hidden)
    write_cache(path, {"model_path": "m", "model_sha256": "x"}, seqs, logits_of, hidden_of)
    states = small_inputs(n_vocab, True)[2]
    return [logits_of(i) for i in range(2)], [states(i) for i in range(2)]


def test_round_trip_keeps_ids_positions_and_values(tmp_path):
    path = tmp_path / "r.mdref"
    rows, states = write_small(path, hidden=True)
    cache = ReferenceCache(path)
    assert [s["ids"] for s in cache.sequences] == [[1, 2, 3, 4], [5, 6, 7]]
    assert [s["first"] for s in cache.sequences] == [0, 1] and cache.sequences[1]["scored"] == [1, 2]
    assert np.allclose(cache.logits(0), rows[0], atol=1e-3) and cache.logits(1).shape == (2, 50)
    assert cache.has_hidden and np.allclose(cache.hidden(1), states[1], atol=2e-3)
    assert not list(tmp_path.glob("*.tmp"))


def test_hidden_states_beyond_float16_range_keep_their_precision(tmp_path):
    """Gemma's residual stream reaches 1e5 and more: plain float16 would store inf (rfn NaN); each
    state is scaled by a power of two instead, so its relative error stays float16's."""
    seqs, logits_of, _ = small_inputs(50, False)
    rng = np.random.default_rng(1)
    states = [rng.normal(size=(3, len(s.ids), 8)).astype(np.float32) * np.array([1.0, 3e5, 7e6])[:, None, None]
              for s in seqs]
    path = tmp_path / "big.mdref"
    write_cache(path, {"model_path": "m", "model_sha256": "x"}, seqs, logits_of, lambda i: states[i])
    cache = ReferenceCache(path)
    for i in range(2):
        got = cache.hidden(i)
        assert np.isfinite(got).all()
        diff, ref = (got - states[i]).reshape(3, -1), states[i].reshape(3, -1)
        rel = np.linalg.norm(diff, axis=1) / np.linalg.norm(ref, axis=1)
        assert (rel < 1e-3).all(), rel
    assert cache.sequences[0]["hidden_scale"][0] == 1.0 and cache.sequences[0]["hidden_scale"][2] >= 2 ** 8


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


def split(raw: bytes) -> tuple[dict, bytes]:
    """A cache file's header and data (between the header's padding and the checksum)."""
    (n,) = struct.unpack("<Q", raw[8:16])
    header = json.loads(raw[16:16 + n])
    return header, raw[header["data_offset"]:-32]


def assemble(text: bytes, data_offset: int, data: bytes, trailer: bytes | None = None) -> bytes:
    """A cache file around header ``text``: the length field fixed, the data at ``data_offset``
    (or right after the header if that is too short), the checksum recomputed unless given."""
    head = MAGIC + struct.pack("<Q", len(text)) + text
    body = head + b"\0" * max(0, data_offset - len(head)) + data
    return body + (trailer if trailer is not None else hashlib.sha256(body).digest())


def test_a_shifted_offset_with_a_consistent_length_is_caught_by_the_checksum(tmp_path):
    """v1's checksum covered the arrays only: this file was read without complaint, and sequence
    1's logits came from the wrong place (KLD 2.8 on a candidate that deserved 1e-4)."""
    path = tmp_path / "r.mdref"
    rows, _ = write_small(path)
    raw = path.read_bytes()
    header, data = split(raw)
    header["sequences"][1]["logits_offset"] -= 64
    path.write_bytes(assemble(json.dumps(header).encode(), header["data_offset"], data, trailer=raw[-32:]))
    assert not np.allclose(ReferenceCache(path, verify=False).logits(1), rows[1], atol=1e-3)  # what v1 used
    with pytest.raises(ModelDiffError, match=f"{path}: reference cache checksum mismatch"):
        ReferenceCache(path)


def test_a_flipped_header_byte_is_reported_and_the_entry_removed_for_a_rebuild(tmp_path):
    path = tmp_path / "r.mdref"
    write_small(path)
    raw = bytearray(path.read_bytes())
    raw[raw.index(b'"label": "a"') + len(b'"label": "')] ^= 0x02  # "c": valid, only the checksum tells
    path.write_bytes(bytes(raw))
    with pytest.warns(ModelDiffCacheWarning, match=f"{path}: reference cache checksum mismatch.*rebuilding"):
        assert open_valid(path, need_hidden=False) is None
    assert not path.exists()
    rows, _ = write_small(path)
    assert np.allclose(open_valid(path, need_hidden=False).logits(1), rows[1], atol=1e-3)


def test_a_v1_file_is_rebuilt(tmp_path):
    path = tmp_path / "r.mdref"
    write_small(path)
    path.write_bytes(b"MDREF\x00v1" + path.read_bytes()[8:])
    with pytest.warns(ModelDiffCacheWarning, match=r"reference cache format v1 .*expected v2; rebuilding it"):
        assert open_valid(path, need_hidden=False) is None
    assert not path.exists()


MISSING = object()
NESTED = json.loads("[" * 900 + "]" * 900)


def field(name, value, seq=None):
    """A header mutation: set (or with value MISSING, delete) a field, of sequence ``seq`` if given;
    the data moves behind a header that grew past it."""
    def mutate(header):
        target = header if seq is None else header["sequences"][seq]
        if value is MISSING:
            del target[name]
        else:
            target[name] = value
        text = json.dumps(header).encode()
        if name != "data_offset" and 16 + len(text) > header["data_offset"]:
            header["data_offset"] = (16 + len(text) + 127) // 64 * 64
            text = json.dumps(header).encode()
        return text
    return mutate


def cases(name, values, seq=None) -> dict:
    def label(value):
        return "missing" if value is MISSING else "nested" if value is NESTED else repr(value)[:24]
    return {f"{name} {label(v)}": field(name, v, seq) for v in values}


MALFORMED_HEADERS = {
    "not JSON": lambda h: b"{",
    "not UTF-8": lambda h: json.dumps(h).encode().replace(b'"text"', b'"\xfftext"', 1),
    "not an object": lambda h: b"[1, 2]",
    "nested past the recursion limit": lambda h: b"[" * 100_000 + b"]" * 100_000,
    "empty": lambda h: b"",
    **cases("format", (MISSING, "pytest-modeldiff reference cache v1", 2)),
    **cases("data_offset", ("64", -1, 0, True, 1.5, 10**30, None)),
    **cases("data_bytes", (-1, "0", 10**30, None, 2.0)),
    **cases("n_vocab", (0, -5, "50", True, 50.0, None, 10**30, NESTED)),
    **cases("sequences", (MISSING, {}, [], [1], ["x"], [None], NESTED)),
    **cases("ids", (MISSING, [], ["a"], [-1], [True], "1234", [1.0], NESTED), seq=0),
    **cases("text", (5, NESTED), seq=0),
    **cases("label", (None, MISSING), seq=1),
    **cases("scored", ([1], [2, 1], ["a", "b"], [0, 99], "x", [-1, 2]), seq=1),
    **cases("first", (-1, 99, "0", None, 1.5, MISSING), seq=0),
    **cases("range_offset", (10**30, -64, None, "0", MISSING), seq=1),
    **cases("logits_offset", (10**30, 10**6, -1, [0]), seq=0),
    **cases("hidden_shape", ("x", [-1, 4, 8], [10**20, 10**20], [1.5], NESTED), seq=0),
    **cases("hidden_offset", (MISSING,), seq=1),
}


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("mutate", MALFORMED_HEADERS.values(), ids=MALFORMED_HEADERS.keys())
def test_every_malformed_header_is_a_named_error(tmp_path, mutate, verify):
    """With a valid checksum over it (so the header checks themselves are tested, as for
    remove_stale's verify=False): a ModelDiffError naming the file, never another exception."""
    path = tmp_path / "r.mdref"
    write_small(path, hidden=True)
    header, data = split(path.read_bytes())
    mutated = copy.deepcopy(header)
    text = mutate(mutated)
    at = mutated.get("data_offset")
    at = at if type(at) is int and 0 <= at < 10**6 else header["data_offset"]
    path.write_bytes(assemble(text, at, data))
    with pytest.raises(ModelDiffError, match=f"^{path}: "):
        ReferenceCache(path, verify=verify)


def header_length(n: int):
    return lambda raw: raw[:8] + struct.pack("<Q", len(raw) if n is None else n) + raw[16:]


FRAMING_DAMAGE = {"empty": lambda raw: b"", "10 bytes": lambda raw: raw[:10],
                  "20 bytes": lambda raw: raw[:20],
                  "header length 2**63": header_length(2**63), "header length 0": header_length(0),
                  "header length = file": header_length(None), "extended": lambda raw: raw + b"\0" * 64}


@pytest.mark.parametrize("damage", FRAMING_DAMAGE.values(), ids=FRAMING_DAMAGE.keys())
def test_damaged_framing_is_a_named_error(tmp_path, damage):
    path = tmp_path / "r.mdref"
    write_small(path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ModelDiffError, match=f"^{path}: "):
        ReferenceCache(path)


def test_remove_stale_survives_garbage_and_removes_only_stale_entries(tmp_path):
    current, stale = tmp_path / "ref-1.mdref", tmp_path / "ref-2.mdref"
    write_cache(current, {"model_path": "m", "model_sha256": "new"}, *small_inputs())
    write_cache(stale, {"model_path": "m", "model_sha256": "old"}, *small_inputs())
    (tmp_path / "garbage.mdref").write_bytes(b"\xff" * 100)
    (tmp_path / "empty.mdref").write_bytes(b"")
    (tmp_path / "folder.mdref").mkdir()
    header, data = split(current.read_bytes())
    (tmp_path / "bad-header.mdref").write_bytes(assemble(b"[" * 100_000, header["data_offset"], data))
    with pytest.warns(ModelDiffCacheWarning, match="stale reference cache removed"):
        assert remove_stale(current, "m", "new") == [stale]
    assert current.exists() and (tmp_path / "garbage.mdref").exists()


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


def shift_second_logits_offset(raw: bytes) -> bytes:
    """The header damage v1 missed: sequence 1's logits read 64 bytes early, the JSON length fixed."""
    header, data = split(raw)
    header["sequences"][1]["logits_offset"] -= 64
    return assemble(json.dumps(header).encode(), header["data_offset"], data, trailer=raw[-32:])


def flip_data_byte(raw: bytes) -> bytes:
    return raw[:-100] + bytes([raw[-100] ^ 0xFF]) + raw[-99:]


def test_corrupt_entry_is_reported_and_rebuilt(tiny, tmp_path):
    """Damaged arrays or a damaged header: reported, rebuilt, and the candidate's numbers are the
    intact cache's (v1 took the shifted offset and reported a KLD of 2.8 instead of 1e-4)."""
    cache_dir = tmp_path / "cache"

    def kld() -> float:
        report = compare(tiny / "hf", [tiny / "tiny-q8_0.gguf"], checks=["kld"], ref_cache=cache_dir,
                         eval_length=32)
        return report["tiny-q8_0"].result("kld").value

    intact = kld()
    entry = next(cache_dir.glob("*.mdref"))
    for damage in (flip_data_byte, shift_second_logits_offset):
        entry.write_bytes(damage(entry.read_bytes()))
        with pytest.warns(ModelDiffCacheWarning, match="checksum mismatch.*rebuilding"):
            assert kld() == pytest.approx(intact, rel=1e-6)
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


def test_an_entry_made_elsewhere_is_found_whatever_the_model_path(demo_ref, demo_cand, tmp_path):
    """The key is the files' content, not their path or time: a cache computed on one machine
    (here: one folder name) and copied to another (another path, name and mtime) is used there."""
    there = tmp_path / "big-machine" / "hf"
    shutil.copytree(demo_ref, there)
    compare(there, [demo_cand], checks=["kld"], ref_cache=tmp_path / "artefact", eval_length=16)
    here = tmp_path / "ci" / "Model-Renamed"
    shutil.copytree(demo_ref, here, copy_function=shutil.copy)  # new mtimes: hashed again
    shutil.copytree(tmp_path / "artefact", tmp_path / "ci-cache")
    messages = []
    report = compare(here, [demo_cand], checks=["kld"], ref_cache=tmp_path / "ci-cache", eval_length=16,
                     progress=messages.append)
    assert any("outputs from the cache" in m and "hf-" in m for m in messages), messages
    assert report.passed and len(list((tmp_path / "ci-cache").glob("*.mdref"))) == 1


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
