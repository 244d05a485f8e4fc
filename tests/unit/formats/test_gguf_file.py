"""Our GGUF header walk: agrees with gguf-py's GGUFReader, enforces llama.cpp's load-time rules
with one-line errors, keeps memory near the file size; a llama.cpp abort becomes a ModelDiffError.

GGUFs are written byte by byte here (gguf_bytes) so a test can break any single rule, including
the ones gguf-py's GGUFWriter refuses to write (duplicate keys, bad offsets, alignment 0).
"""
import math
import re
import struct
import tracemalloc

import gguf
import numpy as np
import pytest

from pytest_modeldiff.errors import ModelDiffError
from pytest_modeldiff.formats.gguf_file import GGUFFile
from pytest_modeldiff.runners import llamacpp
from pytest_modeldiff.runners.llamacpp import LlamaCppRunner

T = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType
CODES = {T.UINT8: "B", T.INT8: "b", T.UINT16: "H", T.INT16: "h", T.UINT32: "I", T.INT32: "i", T.FLOAT32: "f",
         T.BOOL: "?", T.UINT64: "Q", T.INT64: "q", T.FLOAT64: "d"}


# --------------------------------------------------------------------------- writing GGUFs byte by byte
def pack_value(kind: int, value) -> bytes:
    """One GGUF value; an array is (item type, items), items a list or a numpy array."""
    if kind == T.STRING:
        raw = value if isinstance(value, bytes) else value.encode()
        return struct.pack("<Q", len(raw)) + raw
    if kind == T.ARRAY:
        item, items = value
        head = struct.pack("<IQ", item, len(items))
        if item in CODES and isinstance(items, np.ndarray):
            return head + np.asarray(items, dtype="<" + CODES[item].replace("?", "B")).tobytes()
        return head + b"".join(pack_value(item, x) for x in items)
    if kind not in CODES:
        return struct.pack("<I", value)  # an invalid type id: some payload for the reader to refuse
    return struct.pack("<" + CODES[kind], value)


def tensor_bytes(shape, qtype) -> int:
    block, size = gguf.GGML_QUANT_SIZES[Q(qtype)]
    return math.prod(shape) // block * size


def gguf_bytes(kvs, tensors, alignment=32, version=3, offsets=None) -> bytes:
    """kvs: [(key, type, value)]; tensors: [(name, shape (ne0 first), type id, data bytes)]. Tensor
    data is laid out as llama.cpp expects (packed, each padded to ``alignment``) unless ``offsets``
    says otherwise."""
    out = [b"GGUF", struct.pack("<IQQ", version, len(tensors), len(kvs))]
    out += [pack_value(T.STRING, key) + struct.pack("<I", kind) + pack_value(kind, value)
            for key, kind, value in kvs]
    layout, end = [], 0
    for name, shape, qtype, data in tensors:
        layout.append(end)
        end += len(data) + (-len(data) % alignment)
    offsets = layout if offsets is None else offsets
    for (name, shape, qtype, data), offset in zip(tensors, offsets):
        info = struct.pack(f"<I{len(shape)}qIQ", len(shape), *shape, qtype, offset)
        out.append(pack_value(T.STRING, name) + info)
    header = b"".join(out)
    start = len(header) + (-len(header) % alignment)
    end = max((offset + len(data) for (_, _, _, data), offset in zip(tensors, offsets)), default=0)
    blob = bytearray(header + bytes(start - len(header) + max(end, 0)))
    for (_, _, _, data), offset in zip(tensors, offsets):
        blob[start + offset:start + offset + len(data)] = data
    return bytes(blob)


def small_model(n_vocab=64, n_embd=32, n_layer=2):
    """(kvs, tensors) of a small valid llama-shaped GGUF with every value type, a one-element array
    and four tensor types."""
    rng = np.random.default_rng(0)
    tokens = [f"tok{i}" for i in range(n_vocab)]
    kvs = [("general.architecture", T.STRING, "llama"), ("general.name", T.STRING, "small"),
           ("llama.block_count", T.UINT32, n_layer), ("llama.context_length", T.UINT32, 128),
           ("llama.embedding_length", T.UINT32, n_embd), ("llama.feed_forward_length", T.UINT32, 64),
           ("llama.attention.head_count", T.UINT32, 2), ("llama.attention.head_count_kv", T.UINT32, 1),
           ("llama.rope.freq_base", T.FLOAT32, 10000.0),
           ("llama.attention.layer_norm_rms_epsilon", T.FLOAT32, 1e-5),
           ("general.file_type", T.UINT32, 7), ("test.u8", T.UINT8, 7), ("test.i8", T.INT8, -7),
           ("test.u16", T.UINT16, 700), ("test.i16", T.INT16, -700), ("test.i32", T.INT32, -70000),
           ("test.u64", T.UINT64, 2**40), ("test.i64", T.INT64, -(2**40)), ("test.f64", T.FLOAT64, 0.25),
           ("test.bool", T.BOOL, True), ("test.one", T.ARRAY, (T.INT32, [42])),
           ("test.bools", T.ARRAY, (T.BOOL, [True, False, True])),
           ("tokenizer.ggml.model", T.STRING, "gpt2"), ("tokenizer.ggml.tokens", T.ARRAY, (T.STRING, tokens)),
           ("tokenizer.ggml.scores", T.ARRAY, (T.FLOAT32, [float(-i) for i in range(n_vocab)])),
           ("tokenizer.ggml.token_type", T.ARRAY, (T.INT32, [1] * n_vocab)),
           ("tokenizer.ggml.merges", T.ARRAY, (T.STRING, ["t o", "to k"])),
           ("tokenizer.ggml.bos_token_id", T.UINT32, 1), ("tokenizer.ggml.eos_token_id", T.UINT32, 2),
           ("tokenizer.ggml.add_bos_token", T.BOOL, True)]

    def tensor(name, shape, qtype):
        data = rng.integers(0, 255, tensor_bytes(shape, qtype), dtype=np.uint8).tobytes()
        return name, shape, int(qtype), data

    tensors = [tensor("token_embd.weight", (n_embd, n_vocab), Q.Q8_0),
               tensor("output_norm.weight", (n_embd,), Q.F32)]
    for i in range(n_layer):
        tensors += [tensor(f"blk.{i}.attn_norm.weight", (n_embd,), Q.F32),
                    tensor(f"blk.{i}.attn_q.weight", (n_embd, n_embd), Q.F16),
                    tensor(f"blk.{i}.attn_k.weight", (n_embd, n_embd // 2), Q.Q8_0),
                    tensor(f"blk.{i}.ffn_up.weight", (256, 2), Q.Q4_K)]
    return kvs, tensors


def set_kv(kvs, key, kind, value):
    """kvs with ``key`` replaced (or added); value None drops it."""
    out = [kv for kv in kvs if kv[0] != key]
    return out if value is None else out + [(key, kind, value)]


def from_file(path):
    """(kvs, tensors) of an existing GGUF, to write a changed copy with gguf_bytes."""
    g = GGUFFile(path)
    kvs = [(k, kind, (item, v) if kind == T.ARRAY else v) for k, v in g.metadata.items()
           for kind, item in [g.value_types[k]]]
    data = path.read_bytes()
    tensors = [(t.name, t.shape, int(Q[t.type_name]), data[t.offset:t.offset + t.n_bytes]) for t in g.tensors]
    return kvs, tensors


@pytest.fixture
def write(tmp_path):
    def write(kvs, tensors, name="model.gguf", **layout):
        path = tmp_path / name
        path.write_bytes(gguf_bytes(kvs, tensors, **layout))
        return path
    return write


# --------------------------------------------------------------------------- agreement with gguf-py
def _same(ours, theirs) -> bool:
    """Exact for ints, strings and bools; float32 closeness for float lists."""
    if isinstance(ours, np.ndarray):
        ours = ours.tolist()
    if isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            return False
        if ours and isinstance(ours[0], float):
            return bool(np.allclose(ours, theirs, rtol=1e-6, atol=0, equal_nan=True))
        return ours == theirs
    if isinstance(ours, float):
        return ours == pytest.approx(theirs, rel=1e-6, nan_ok=True)
    return ours == theirs and type(ours) is type(theirs)


def _short(value) -> str:
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) < 80 else f"{text[:77]}... ({len(value)} items)"


def test_header_walk_matches_gguf_reader(tiny, demo_cand):
    types = [tiny / f"tiny-{q}.gguf" for q in ("f32", "f16", "bf16", "q8_0", "q4_k_m")]
    for path in [demo_cand, *types, tiny / "broken-add-bos-flipped-f16.gguf"]:
        ours, reader = GGUFFile(path), gguf.GGUFReader(path)
        expected = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
        assert list(ours.metadata) == list(expected), path.name
        for key, value in expected.items():
            assert _same(ours.metadata[key], value), \
                f"{path.name} {key}: ours {_short(ours.metadata[key])}, gguf-py {_short(value)}"
        assert [(t.name, t.type_name, t.n_elements, t.n_bytes, t.offset) for t in ours.tensors] == [
            (t.name, t.tensor_type.name, int(t.n_elements), int(t.n_bytes), int(t.data_offset))
            for t in reader.tensors]


def test_quant_type_names(tiny):
    assert GGUFFile(tiny / "tiny-q4_k_m.gguf").quant_type == "Q4_K_M"
    assert GGUFFile(tiny / "tiny-f32.gguf").quant_type == "F32"
    assert GGUFFile(tiny / "tiny-bf16.gguf").quant_type == "BF16"


@pytest.mark.parametrize("cut", [10, 30, 5000, 2_000_000])
def test_truncated_anywhere_is_named(demo_cand, tmp_path, cut):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(demo_cand.read_bytes()[:cut])
    with pytest.raises(ModelDiffError, match=r"cut.gguf: truncated (or corrupt )?GGUF.*the file has \d+ bytes"):
        GGUFFile(bad)


# --------------------------------------------------------------------------- a valid small file
def test_small_model_parses_every_value_type(write):
    kvs, tensors = small_model()
    g = GGUFFile(write(kvs, tensors))
    meta = g.metadata
    assert meta["test.one"] == [42], "a one-element array stays an array"
    assert (meta["test.u8"], meta["test.i8"], meta["test.i16"], meta["test.u64"], meta["test.i64"]) == (
        7, -7, -700, 2**40, -(2**40))
    assert meta["test.bools"] == [True, False, True] and meta["test.bool"] is True
    assert meta["test.f64"] == 0.25
    assert meta["tokenizer.ggml.tokens"][:2] == ["tok0", "tok1"] and g.vocab().special["bos"] == 1
    assert [t.type_name for t in g.tensors[:4]] == ["Q8_0", "F32", "F32", "F16"]
    assert g.hparams()["head_dim"] == 16
    reader = gguf.GGUFReader(g.path)
    assert reader.fields["test.one"].contents() == [42]
    assert [int(t.data_offset) for t in reader.tensors] == [t.offset for t in g.tensors]
    assert np.allclose(g.read_tensor("output_norm.weight"), reader.tensors[1].data, equal_nan=True)


def test_large_numeric_array_walks_within_a_small_multiple_of_its_size(write):
    """~50 MB of int32 in one array: a numpy copy, not 12.5M Python ints (12x the bytes traced,
    26x in resident memory)."""
    kvs, tensors = small_model()
    values = np.arange(12_500_000, dtype=np.int32)
    path = write(kvs + [("test.big", T.ARRAY, (T.INT32, values))], tensors)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        g = GGUFFile(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * size, f"peak {peak / 1e6:.0f} MB for a {size / 1e6:.0f} MB file"
    assert isinstance(g.metadata["test.big"], np.ndarray) and g.metadata["test.big"][-1] == 12_499_999


def test_per_layer_zero_heads_pass_where_a_block_has_no_attention(write):
    """Hybrid models store 0 heads for recurrent blocks; only blocks with attention need heads."""
    kvs, tensors = small_model()
    tensors = [t for t in tensors if not t[0].startswith("blk.1.attn_")]
    kvs = set_kv(kvs, "llama.attention.head_count", T.ARRAY, (T.UINT32, [2, 0]))
    g = GGUFFile(write(kvs, tensors))
    assert g.hparams()["n_head"] == [2, 0] and "head_dim" not in g.hparams()


# --------------------------------------------------------------------------- llama.cpp's rules, one by one
def _kv(key, kind, value):
    return lambda kvs, tensors: (set_kv(kvs, key, kind, value), tensors, {})


def _tensor(index, **change):
    """Change one tensor's name, shape, type or data."""
    def apply(kvs, tensors):
        name, shape, qtype, data = tensors[index]
        new = {"name": name, "shape": shape, "qtype": qtype, "data": data, **change}
        tensors = list(tensors)
        tensors[index] = (new["name"], new["shape"], new["qtype"], new["data"])
        return kvs, tensors, {}
    return apply


def _layout(**layout):
    return lambda kvs, tensors: (kvs, tensors, layout)


def _aligned(alignment):
    """A valid layout for ``alignment``, with a 16-byte tensor first so that some tensor data
    cannot start 32-byte aligned."""
    def apply(kvs, tensors):
        odd = ("rope_freqs.weight", (4,), int(Q.F32), bytes(16))
        kvs = set_kv(kvs, "general.alignment", T.UINT32, alignment)
        return kvs, [odd, *tensors], {"alignment": alignment}
    return apply


def _tokens(change):
    def apply(kvs, tensors):
        tokens = [f"tok{i}" for i in range(64)]
        change(tokens)
        return set_kv(kvs, "tokenizer.ggml.tokens", T.ARRAY, (T.STRING, tokens)), tensors, {}
    return apply


def _offsets(change):
    def apply(kvs, tensors):
        offsets, end = [], 0
        for _, _, _, data in tensors:
            offsets.append(end)
            end += len(data) + (-len(data) % 32)
        change(offsets)
        return kvs, tensors, {"offsets": offsets}
    return apply


def _experts(n_expert, used):
    def apply(kvs, tensors):
        kvs = set_kv(kvs, "llama.expert_count", T.UINT32, n_expert)
        return set_kv(kvs, "llama.expert_used_count", T.UINT32, used), tensors, {}
    return apply


RULES = {
    "version 1": (_layout(version=1), r"GGUF version 1: llama.cpp reads versions 2 and 3"),
    "alignment 0": (_kv("general.alignment", T.UINT32, 0), r"general.alignment = 0: .*non-zero power of two"),
    "alignment 48": (_kv("general.alignment", T.UINT32, 48), r"general.alignment = 48: .*power of two"),
    "alignment inf": (_kv("general.alignment", T.FLOAT32, math.inf),
                      r"general.alignment = inf is a FLOAT32: .*UINT32"),
    "alignment 1": (_aligned(1), r"tensor '[^']+' data starts at byte \d+, not a multiple of 32"),
    "alignment 16": (_aligned(16), r"not a multiple of 32: llama.cpp maps tensors in place"),
    "5 dims": (_tensor(1, shape=(32, 1, 1, 1, 1)), r"'output_norm.weight' has 5 dimensions: .*allows 4"),
    "negative dim": (_tensor(1, shape=(32, -1)), r"has shape \[32, -1\]: .*every dimension >= 1"),
    "zero dim": (_tensor(1, shape=(32, 0)), r"'output_norm.weight' has shape \[32, 0\]: .*dimension >= 1"),
    "element overflow": (_tensor(1, shape=(2**32, 2**32)), r"'output_norm.weight' .* count overflows int64"),
    "row not whole blocks": (_tensor(0, shape=(48, 64)),
                             r"'token_embd.weight' is Q8_0 with 48 elements per row: .*block size 32"),
    "removed type id": (_tensor(1, qtype=4), r"'output_norm.weight' has type id 4, which the installed gguf"),
    "type id 99": (_tensor(1, qtype=99), r"'output_norm.weight' has type id 99"),
    "duplicate tensor": (_tensor(3, name="blk.0.attn_norm.weight"), r"duplicate tensor 'blk.0.attn_norm"),
    "long tensor name": (_tensor(1, name="x" * 64), r"tensor name 'x+' has 64 bytes: llama.cpp allows 63"),
    "gap before a tensor": (_offsets(lambda o: o.__setitem__(2, o[2] + 32)),
                            r"tensor 'blk.0.attn_norm.weight' has data offset \d+, llama.cpp expects \d+"),
    "overlapping tensors": (_offsets(lambda o: o.__setitem__(3, o[2])), r"'blk.0.attn_q.weight' has data "),
    "empty key": (_kv("", T.UINT32, 1), r"has an empty key"),
    "array of arrays": (_kv("test.nested", T.ARRAY, (T.ARRAY, [(T.UINT8, [1])])),
                        r"'test.nested' is an array of arrays"),
    "value type 13": (_kv("test.bad", 13, 0), r"key 'test.bad' has GGUF type 13"),
    "negative rms eps": (_kv("llama.attention.layer_norm_rms_epsilon", T.FLOAT32, -1e-5),
                         r"layer_norm_rms_epsilon = -1e-05: llama.cpp needs a finite norm epsilon >= 0"),
    "nan rms eps": (_kv("llama.attention.layer_norm_rms_epsilon", T.FLOAT32, math.nan), r"epsilon = nan"),
    "inf layer norm eps": (_kv("llama.attention.layer_norm_epsilon", T.FLOAT64, math.inf), r"epsilon = inf"),
    "0 heads": (_kv("llama.attention.head_count", T.UINT32, 0),
                r"llama.attention.head_count = 0: llama.cpp needs > 0 where a block has attn_q.weight"),
    "0 kv heads in block 1": (_kv("llama.attention.head_count_kv", T.ARRAY, (T.UINT32, [1, 0])),
                              r"head_count_kv\[1\] = 0: .*attn_k.weight \(block 1\)"),
    "0 ffn": (_kv("llama.feed_forward_length", T.UINT32, 0), r"feed_forward_length = 0: .*ffn_up.weight"),
    "0 embedding": (_kv("llama.embedding_length", T.UINT32, 0), r"embedding_length = 0: llama.cpp needs > 0"),
    "0 blocks": (_kv("llama.block_count", T.UINT32, 0), r"block_count = 0: llama.cpp needs 1 to 512 layers"),
    "absurd blocks": (_kv("llama.block_count", T.UINT32, 4_000_000_000), r"count = 4000000000: .*1 to 512"),
    "blocks not matching": (_kv("llama.block_count", T.UINT32, 3),
                            r"block_count = 3 but the file has tensors for blocks 0 to 1"),
    "unknown rope scaling": (_kv("llama.rope.scaling.type", T.STRING, "llama3"),
                             r"rope.scaling.type = 'llama3': llama.cpp knows none, linear, yarn, longrope"),
    "more experts used than exist": (_experts(4, 8), r"expert_used_count = 8 exceeds expert_count = 4"),
    "duplicate token": (_tokens(lambda t: t.__setitem__(9, "tok3")), r"'tok3' twice \(ids 3 and 9\)"),
    "empty token named like its stand-in": (_tokens(lambda t: t.__setitem__(5, "") or
                                                    t.__setitem__(9, "[EMPTY_5]")),
                                            r"'\[EMPTY_5\]' twice \(ids 5 and 9\)"),
    "no tokens": (_kv("tokenizer.ggml.tokens", T.ARRAY, (T.STRING, [])), r"tokenizer.ggml.tokens is empty"),
    "bos outside the vocabulary": (_kv("tokenizer.ggml.bos_token_id", T.UINT32, 64),
                                   r"bos_token_id = 64 is outside the vocabulary of 64 tokens"),
    "add bos without one": (lambda kvs, t: (set_kv(set_kv(kvs, "tokenizer.ggml.bos_token_id", 0, None),
                                                   "tokenizer.ggml.model", T.STRING, "t5"), t, {}),
                            r"add_bos_token is true but the file names no BOS token"),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_llama_cpp_rule_is_enforced_by_name(write, rule):
    change, message = RULES[rule]
    kvs, tensors, layout = change(*small_model())
    path = write(kvs, tensors, name="rule.gguf", **layout)
    with pytest.raises(ModelDiffError, match=r"^\S*rule.gguf: ") as raised:
        GGUFFile(path)
    text = str(raised.value)
    assert "\n" not in text and len(text) < 300, text
    assert re.search(message, text), text


def test_duplicate_key_is_refused(write):
    """GGUFWriter cannot write one: write a placeholder key and rename it to its neighbour's name."""
    kvs, tensors = small_model()
    kvs = set_kv(kvs, "general.namf", T.STRING, "other")
    path = write(kvs, tensors)
    path.write_bytes(path.read_bytes().replace(b"general.namf", b"general.name"))
    with pytest.raises(ModelDiffError, match=r"model.gguf: duplicate key 'general.name', which llama.cpp"):
        GGUFFile(path)


def test_valid_alignment_64_is_read_at_its_offsets(write):
    kvs, tensors = small_model()
    g = GGUFFile(write(set_kv(kvs, "general.alignment", T.UINT32, 64), tensors, alignment=64))
    assert g.alignment == 64 and all(t.offset % 64 == 0 for t in g.tensors)
    assert np.array_equal(g.read_tensor("output_norm.weight").view(np.uint8).ravel(),
                          np.frombuffer(tensors[1][3], dtype=np.uint8))


# --------------------------------------------------------------------------- llama.cpp aborts that remain
def test_llama_cpp_abort_becomes_a_named_error_not_a_dead_pytest(demo_cand, tmp_path):
    """A SentencePiece tokenizer over a byte-level BPE vocabulary breaks no load-time rule, but
    llama.cpp's tokenizer then throws std::out_of_range (no <0x..> byte token) through its C API:
    std::terminate, SIGABRT. The probe process dies instead of pytest, and says why."""
    kvs, tensors = from_file(demo_cand)
    path = tmp_path / "spm-over-bpe.gguf"
    path.write_bytes(gguf_bytes(set_kv(kvs, "tokenizer.ggml.model", T.STRING, "llama"), tensors))
    GGUFFile(path)  # our rules accept it
    runner = LlamaCppRunner(path)
    with pytest.raises(ModelDiffError) as raised:
        runner.load(64)
    expected = (r"\S*spm-over-bpe.gguf: llama.cpp crashed \(SIGABRT\) while tokenizing in a probe process "
                r"that runs this file: terminate called .*std::out_of_range.*")
    assert re.fullmatch(expected, str(raised.value)), raised.value
    with pytest.raises(ModelDiffError, match=r"spm-over-bpe.gguf: llama.cpp crashed \(SIGABRT\)"):
        runner.tokenize("Hello")  # the vocabulary-only model is refused too (the probe's answer is kept)


def test_probe_runs_once_per_file_and_names_the_signal(demo_cand, monkeypatch):
    monkeypatch.setattr(llamacpp, "_PROBED", {})
    calls = []
    real_probe = llamacpp._run_probe
    monkeypatch.setattr(llamacpp, "_run_probe", lambda *args: calls.append(args) or real_probe(*args))
    assert llamacpp.probe_load(demo_cand, 0) is None and llamacpp.probe_load(demo_cand, 0) is None
    assert len(calls) == 1, "one probe per file and process"
    monkeypatch.setattr(llamacpp, "_PROBED", {})
    monkeypatch.setattr(llamacpp, "_PROBE_SCRIPT", "import os, signal\nprint('loading', flush=True)\n"
                                                   "os.kill(os.getpid(), signal.SIGSEGV)")
    with pytest.raises(ModelDiffError, match=r"demo-q8_0.gguf: llama.cpp crashed \(SIGSEGV\) while loading"):
        llamacpp.probe_load(demo_cand, 0)


def test_load_error_says_what_llama_cpp_refused(demo_cand, tmp_path):
    """llama-cpp-python's own message is only "Failed to load model from file"; the probe's log has why."""
    kvs, tensors = from_file(demo_cand)
    path = tmp_path / "no-output-norm.gguf"
    path.write_bytes(gguf_bytes(kvs, [t for t in tensors if t[0] != "output_norm.weight"]))
    with pytest.raises(ModelDiffError, match=r"no-output-norm.gguf: llama.cpp could not load the model: "
                                             r"check_tensor_dims: tensor 'output_norm.weight' not found"):
        LlamaCppRunner(path).load(64)
