"""Seeded fuzzing of the GGUF header walk: whatever a file holds, GGUFFile either reads it (and
every consumer of what it read works) or raises a ModelDiffError that names the file. Never a
traceback of another kind: a GGUF is user input, and pytest must report it, not crash on it.

Mutations: rewrites of the header's numeric fields (counts, lengths, type ids, dimensions,
offsets) with boundary values, bit flips, truncations, spliced or dropped header bytes, and
key/values rewritten as one-element arrays, huge arrays or values of the wrong type.
"""
import json
import math
import random
import struct
from dataclasses import asdict

import numpy as np
import pytest

from pytest_modeldiff.errors import ModelDiffError
from pytest_modeldiff.formats.gguf_file import GGUFFile

from .test_gguf_file import CODES, T, gguf_bytes, set_kv, small_model

SIZES = {kind: struct.calcsize("<" + code) for kind, code in CODES.items()}
INTERESTING = (0, 1, 2, 3, 4, 7, 8, 9, 12, 13, 31, 32, 33, 63, 64, 255, 256, 511, 512, 513, 2**16,
               2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1)


def header_fields(data: bytes) -> tuple[list[tuple[int, str, str]], int]:
    """(offset, struct format, what) of every count, length, type id, scalar value, dimension and
    data offset in a valid GGUF's header (the first few items of each array), and the header's end."""
    fields, pos = [(4, "<I", "version"), (8, "<q", "tensor count"), (16, "<q", "key/value count")], 24

    def take(fmt, what):
        nonlocal pos
        fields.append((pos, fmt, what))
        value = struct.unpack_from(fmt, data, pos)[0]
        pos += struct.calcsize(fmt)
        return value

    def string(what, record=True):
        nonlocal pos
        if record:
            length = take("<Q", f"{what} length")
            pos += length
        else:
            pos += 8 + struct.unpack_from("<Q", data, pos)[0]

    def value(kind, what, record=True):
        nonlocal pos
        if kind == T.STRING:
            return string(what, record)
        if kind == T.ARRAY:
            item, count = take("<I", f"{what} item type"), take("<Q", f"{what} count")
            for i in range(count):
                if item != T.STRING and i >= 3:
                    pos += (count - i) * SIZES[item]
                    break
                value(item, what, record=i < 3)
            return None
        if record:
            take("<" + CODES[kind], f"{what} value")
        else:
            pos += SIZES[kind]

    n_tensors, n_kv = struct.unpack_from("<qq", data, 8)
    for _ in range(n_kv):
        string("key")
        value(take("<I", "value type"), "value")
    for _ in range(n_tensors):
        string("tensor name")
        for _ in range(take("<I", "dimension count")):
            take("<q", "dimension")
        take("<I", "tensor type")
        take("<Q", "tensor offset")
    return fields, pos


def rewrite_field(data: bytearray, rng: random.Random, fields) -> str:
    offset, fmt, what = rng.choice(fields)
    size = struct.calcsize(fmt)
    old = int.from_bytes(data[offset:offset + size], "little") if fmt[-1] not in "fd" else 0
    new = rng.choice([*INTERESTING, old + 1, old - 1, old * 2, old + 32, rng.getrandbits(8 * size)])
    new_bytes = (new % 2 ** (8 * size)).to_bytes(size, "little")
    if fmt[-1] in "fd":
        new_bytes = struct.pack(fmt, rng.choice([math.nan, math.inf, -math.inf, -1.0, 0.0, 1e30, -1e-5]))
    data[offset:offset + size] = new_bytes
    return f"{what} at {offset} := {new_bytes.hex()}"


def mutate_bytes(base: bytes, rng: random.Random, fields, header_end: int) -> tuple[bytes, str]:
    data = bytearray(base)
    op = rng.choice(["field", "field", "field", "fields", "flip", "truncate", "splice"])
    if op in ("field", "fields"):
        count = 1 if op == "field" else rng.randint(2, 4)
        what = "; ".join(rewrite_field(data, rng, fields) for _ in range(count))
        return bytes(data), what
    if op == "flip":
        spots = [rng.randrange(header_end if rng.random() < 0.9 else len(data))
                 for _ in range(rng.randint(1, 8))]
        for spot in spots:
            data[spot] ^= 1 << rng.randrange(8)
        return bytes(data), f"bits flipped at {spots}"
    if op == "truncate":
        cut = rng.randrange(header_end + 64 if rng.random() < 0.8 else len(data))
        return bytes(data[:cut]), f"cut at {cut}"
    start = rng.randrange(24, header_end)
    length = rng.randint(1, 64)
    if rng.random() < 0.5:
        return bytes(data[:start] + data[start + length:]), f"{length} bytes dropped at {start}"
    repeated = data[:start] + data[start:start + length] + data[start:]
    return bytes(repeated), f"{length} bytes repeated at {start}"


def random_scalar(kind, rng: random.Random):
    """A boundary value of one numeric type."""
    if kind in (T.FLOAT32, T.FLOAT64):
        return rng.choice([math.nan, math.inf, -1.0, 0.0, 1e-5, 3.5])
    if kind == T.BOOL:
        return rng.random() < 0.5
    bits, signed = 8 * SIZES[kind], CODES[kind].islower()
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return rng.choice([low, high, 0, 1, 2])


def random_value(rng: random.Random):
    """(type, value) of any kind: scalars, strings, one-element and empty arrays, a huge array."""
    kind = rng.choice([*CODES, T.STRING, T.ARRAY, T.ARRAY, T.ARRAY])
    if kind == T.STRING:
        return kind, rng.choice(["", "llama", "x" * 300, b"\xff\xfe not utf-8"])
    if kind != T.ARRAY:
        return kind, random_scalar(kind, rng)
    item = rng.choice([*CODES, T.STRING])
    if item == T.STRING:
        return kind, (item, rng.choice([["one"], [], ["a", "a"], [""] * 3]))
    length = rng.choice([1, 1, 0, 2, 2_000_000])  # one-element, empty, two, huge
    return kind, (item, np.full(length, random_scalar(item, rng), dtype="<" + CODES[item].replace("?", "B")))


def mutate_spec(rng: random.Random) -> tuple[bytes, str]:
    """A small model with one key/value rewritten or added (any type, any key that matters)."""
    kvs, tensors = small_model()
    keys = [k for k, _, _ in kvs] + ["general.alignment", "llama.rope.scaling.type", "llama.expert_count",
                                     "llama.attention.layer_norm_epsilon", "test.new"]
    key = rng.choice(keys)
    kind, value = random_value(rng)
    return gguf_bytes(set_kv(kvs, key, kind, value), tensors), f"{key} := {kind.name} {str(value)[:60]}"


def use_everything(g: GGUFFile) -> None:
    """What the runners, checks and reports do with a parsed file."""
    json.dumps(g.hparams())
    json.dumps(asdict(g.vocab()))
    assert isinstance(g.quant_type, str)
    if g.tensors:
        g.read_tensor(g.tensors[0].name, 0, 2)


def check(path, data: bytes, what: str, failures: list) -> None:
    path.write_bytes(data)
    try:
        use_everything(GGUFFile(path))
    except ModelDiffError as exc:
        if str(path) not in str(exc) or "\n" in str(exc):
            failures.append(f"{what}: message {str(exc)[:200]!r}")
    except Exception as exc:  # noqa: BLE001 - the point: nothing else may come out
        failures.append(f"{what}: {type(exc).__name__}: {str(exc)[:200]}")


@pytest.mark.parametrize("source", ["small", "demo"])
def test_fuzzed_gguf_is_read_or_refused_by_name(tmp_path, demo_cand, source):
    base = gguf_bytes(*small_model()) if source == "small" else demo_cand.read_bytes()
    fields, header_end = header_fields(base)
    failures: list[str] = []
    n = 400 if source == "small" else 60
    for seed in range(n):
        rng = random.Random(seed)
        if source == "small" and seed % 4 == 3:
            data, what = mutate_spec(rng)
        else:
            data, what = mutate_bytes(base, rng, fields, header_end)
        check(tmp_path / "fuzz.gguf", data, f"seed {seed} ({what})", failures)
    assert not failures, f"{len(failures)} of {n} mutations escaped:\n" + "\n".join(failures[:8])
