"""Seeded fuzzing of every file the plugin reads back (issue 15: bad input never gives a false
verdict, a traceback or an abort). Valid files are built from small arrays with the package's own
writers (no model), then mutated a few hundred times - byte flips, truncations, insertions, JSON
field type swaps, deep nesting - and read back through the runners that consume them. Each case
ends in one of: the same data as the original (the mutation hit bytes the reader ignores), data
the format cannot tell from real data (a flipped logit in a headerless llama.cpp dump, a changed
number in a baseline), or a one-line ModelDiffError naming the file; never another exception.
A reference cache has a checksum over every byte: there, any raw mutation must be an error."""
import hashlib
import json
import random
import struct
from pathlib import Path

import numpy as np
import pytest

from pytest_modeldiff.engine.evaldata import EvalSequence
from pytest_modeldiff.errors import ModelDiffError
from pytest_modeldiff.formats import dumps
from pytest_modeldiff.formats.refcache import MAGIC, write_cache
from pytest_modeldiff.report.baseline import (
    baseline_from_report,
    compare,
    environment_differences,
    load_baseline,
    parse_tolerances,
)
from pytest_modeldiff.report.data import write_json
from pytest_modeldiff.runners.dump import DumpRunner
from pytest_modeldiff.runners.refcache import RefCacheRunner

SEED = 15
CASES = 120  # per file set
N_VOCAB = 16

# ---- valid files, from the package's writers


def build_all_positions_dump(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    writer = dumps.AllPositionsWriter(folder, "llamacpp", "m-q8_0")
    writer.add(rng.normal(size=(4, N_VOCAB)), [1, 2, 3, 4], "first text")
    writer.add(rng.normal(size=(3, N_VOCAB)), [5, 6, 7], None)
    return writer.finish(N_VOCAB, {"quant_type": "Q8_0", "versions": {"numpy": np.__version__}})


def build_last_position_dump(folder: Path) -> Path:
    row = np.random.default_rng(1).normal(size=N_VOCAB)
    return dumps.write_last_position(folder, "pytorch", "m", row, [1, 2, 3], "Hello, my name is")


def build_reference_cache(folder: Path) -> Path:
    rng = np.random.default_rng(2)
    seqs = [EvalSequence([1, 2, 3, 4], "text", "a"), EvalSequence([5, 6, 7], None, "b", scored=(1, 3))]
    rows = [rng.normal(size=(4, N_VOCAB)), rng.normal(size=(2, N_VOCAB))]
    states = [rng.normal(size=(2, 4, 8)), rng.normal(size=(2, 3, 8))]
    vocab = {"tokens": [f"t{i}" for i in range(N_VOCAB)], "add_bos": True}
    header = {"model_path": "m", "model_sha256": "x", "quant_type": "F32", "versions": {"torch": "2"},
              "hparams": {"n_layer": 1}, "vocab": vocab}
    path = folder / "ref.mdref"
    write_cache(path, header, seqs, rows.__getitem__, states.__getitem__)
    return path


def build_baseline(folder: Path) -> Path:
    environment = {"versions": {"torch": "2"}, "settings": {"eval_length": 64}, "models_sha256": {}}
    candidate = {"name": "c", "quant_type": "Q8_0", "metrics": {"kld": 0.01, "nmse": "nan"},
                 "checks": [{"name": "kld", "value": 0.01}], "kl_stats": {"ppl_ratio": 1.001}}
    report = {"environment": environment, "reference": {"path": "r"}, "candidates": [candidate]}
    path = folder / "base.json"
    write_json(path, baseline_from_report(report))
    return path


# ---- readers: each reads like the plugin does and returns what a comparison would use


def read_dump(path: Path):
    runner = DumpRunner(path)
    rows = [runner.logits(seq.ids) for seq in runner.fixed_sequences()]
    return ([r.tobytes() for r in rows], [(s.ids, s.text) for s in runner.sequences], runner.n_vocab,
            runner.quant_type())


def read_cache(path: Path):
    runner = RefCacheRunner(path)
    arrays = [runner.forward(s.ids, hidden=runner.gives_hidden) for s in runner.fixed_sequences()]
    arrays = [(f.logits.tobytes(), None if f.hidden is None else f.hidden.tobytes()) for f in arrays]
    return (arrays, [(s.ids, s.text, s.label, s.scored) for s in runner.sequences], runner.quant_type(),
            runner.vocab(), runner.piece(3), runner.hparams(), runner.versions())


def read_baseline(path: Path):
    data = load_baseline(path)
    tolerances = parse_tolerances(["kld:10%", "nmse:1%"])
    for entry in data["candidates"].values():
        compare(entry["metrics"], entry["metrics"], tolerances)
    environment_differences({}, data.get("environment", {}))
    return json.dumps(data, sort_keys=True)


# ---- mutations: (name, bytes -> bytes)


def flip(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return b"\x00"
    at = rng.randrange(len(data))
    return data[:at] + bytes([data[at] ^ rng.randrange(1, 256)]) + data[at + 1:]


def truncate(rng: random.Random, data: bytes) -> bytes:
    return data[:rng.randrange(len(data))] if data else data


def insert(rng: random.Random, data: bytes) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 17))) + data[at:]


REPLACEMENTS = [None, True, False, 0, -1, 1.5, 10**30, "", "x", [], {}, [1, "a"], {"a": None}, "nan"]


def json_paths(value, path=()):
    """Every (path to a value) in a JSON document, containers included."""
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield from json_paths(child, (*path, key))


def at(document, path):
    for key in path:
        document = document[key]
    return document


def replaced(document, path, new):
    if not path:
        return new
    at(document, path[:-1])[path[-1]] = new
    return document


def swap_json_field(rng: random.Random, data: bytes) -> bytes:
    """A random value of the document replaced by another type (or, for a dict's, deleted)."""
    document = json.loads(data)
    path = rng.choice(list(json_paths(document)))
    parent = at(document, path[:-1]) if path else None
    if isinstance(parent, dict) and rng.random() < 0.2:
        del parent[path[-1]]
        return json.dumps(document).encode()
    return json.dumps(replaced(document, path, rng.choice(REPLACEMENTS))).encode()


def nest(rng: random.Random, data: bytes) -> bytes:
    """A random value of the document replaced by lists nested 100 to 100,000 deep."""
    document = json.loads(data)
    path = rng.choice(list(json_paths(document)))
    depth = rng.choice([100, 900, 3000, 100_000])
    text = json.dumps(replaced(document, path, "@NEST@"))
    return text.replace('"@NEST@"', "[" * depth + "]" * depth).encode()


RAW = [flip, truncate, insert]
JSON = [swap_json_field, nest]


# ---- reference cache: JSON mutations go into its header, with the length and checksum fixed


def split_cache(raw: bytes) -> tuple[bytes, int, bytes]:
    (n,) = struct.unpack("<Q", raw[8:16])
    header = raw[16:16 + n]
    start = json.loads(header)["data_offset"]
    return header, start, raw[start:-32]


def with_header(raw: bytes, mutate) -> bytes:
    """The cache with a mutated header, re-framed and re-checksummed: only its checks can tell."""
    header, start, data = split_cache(raw)
    text = mutate(header)
    head = MAGIC + struct.pack("<Q", len(text)) + text
    body = head + b"\0" * max(0, start - len(head)) + data
    return body + hashlib.sha256(body).digest()


# ---- the fuzz loop


def outcome(read, path: Path, files: list[Path], original) -> str:
    try:
        result = read(path)
    except ModelDiffError as exc:
        message = str(exc)
        assert "\n" not in message, message
        assert any(message.startswith(f"{f}: ") for f in files), f"names no file of the set: {message}"
        return "error"
    return "same" if result == original else "changed"


def fuzz(rng: random.Random, read, path: Path, files: list[Path], mutations: dict) -> dict[str, int]:
    """CASES mutations of the set's files (each restored afterwards); counts of each outcome per
    mutation kind; a reader exception other than ModelDiffError fails the test with the case."""
    original, contents = read(path), {f: f.read_bytes() for f in files}
    counts: dict[str, int] = {}
    for case in range(CASES):
        target = rng.choice([f for f in files if f in mutations])
        mutate = rng.choice(mutations[target])
        try:
            target.write_bytes(mutate(rng, contents[target]))
            result = outcome(read, path, files, original)
        except Exception as exc:
            what = f"case {case}: {mutate.__name__} of {target.name}"
            raise AssertionError(f"{what}: {type(exc).__name__}: {exc}") from exc
        finally:
            target.write_bytes(contents[target])
        key = f"{mutate.__name__}:{result}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_dumps_survive_mutation(tmp_path):
    rng = random.Random(SEED)
    full, last = build_all_positions_dump(tmp_path / "full"), build_last_position_dump(tmp_path / "last")
    full_set = [full, dumps.companion(full, "-tokens.bin"), dumps.companion(full, ".json")]
    counts = fuzz(rng, read_dump, full, full_set, {full: RAW, full_set[1]: RAW, full_set[2]: RAW + JSON})
    assert counts.get("flip:changed") and counts.get("swap_json_field:error") and counts.get("nest:error")
    last_set = [last, dumps.companion(last, "-tokens.bin"), dumps.companion(last, "-prompt.txt")]
    counts = fuzz(rng, read_dump, last, last_set, {f: RAW for f in last_set})
    assert counts.get("truncate:error") and counts.get("flip:changed")


def test_a_reference_cache_detects_every_raw_mutation(tmp_path):
    rng = random.Random(SEED + 1)
    path = build_reference_cache(tmp_path)
    counts = fuzz(rng, read_cache, path, [path], {path: RAW})
    assert set(counts) <= {"flip:error", "truncate:error", "insert:error"}, counts


def test_a_reference_cache_header_survives_mutation_behind_a_valid_checksum(tmp_path):
    """As if a writer had put wrong fields in (or remove_stale's unverified read): header checks only."""
    rng = random.Random(SEED + 2)
    path = build_reference_cache(tmp_path)

    def header_mutation(kind):
        def mutate(rng, raw):
            return with_header(raw, lambda header: kind(rng, header))
        mutate.__name__ = f"header_{kind.__name__}"
        return mutate

    mutations = [header_mutation(m) for m in (flip, swap_json_field, nest)]
    counts = fuzz(rng, read_cache, path, [path], {path: mutations})
    assert counts.get("header_swap_json_field:error") and counts.get("header_nest:error"), counts


def test_a_baseline_survives_mutation(tmp_path):
    rng = random.Random(SEED + 3)
    path = build_baseline(tmp_path)
    counts = fuzz(rng, read_baseline, path, [path], {path: RAW + JSON})
    assert all(counts.get(f"{kind}:error") for kind in ("swap_json_field", "nest", "flip")), counts


@pytest.mark.parametrize("build", [build_all_positions_dump, build_reference_cache, build_baseline])
def test_the_valid_files_read_back(tmp_path, build):
    """The fuzzers' starting point: each valid file reads back without error."""
    path = build(tmp_path)
    read = {".bin": read_dump, ".mdref": read_cache, ".json": read_baseline}[path.suffix]
    assert read(path)
