"""Read a GGUF's header: validated layout, key/values, tensor table, vocabulary, quant type.

Shared by every runner that reads a GGUF (llama.cpp, gguf-torch) so they agree on what the file
says. The walk uses gguf-py's own tables (GGUFValueType, GGML_QUANT_SIZES, LlamaFileType) but
not GGUFReader: that one builds a numpy view per vocabulary string and merge (~2.5 s for a
49k-token vocabulary, paid at every pytest start); this walk reads the same header in ~0.1 s.
tests/test_gguf_file.py checks it against GGUFReader.

The walk also enforces llama.cpp's own load-time rules (ggml/src/gguf.cpp, llama-model-loader,
load_hparams, llama-vocab): llama.cpp answers some bad files with a GGML_ASSERT that aborts the
whole process, so a file that breaks one of them is refused here first, by name. Numeric arrays
longer than SMALL_ARRAY stay numpy arrays (a Python int per element costs ~30x its bytes);
shorter ones are lists. Errors name the file and the problem.
"""
from __future__ import annotations

import math
import mmap
import re
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import Keys

from ..errors import ModelDiffError
from . import mapping
from .vocab import VocabInfo

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32  # gguf.h GGUF_DEFAULT_ALIGNMENT
MMAP_ALIGNMENT = 32  # ggml-impl.h TENSOR_ALIGNMENT: llama.cpp maps tensor data in place, asserting this
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 64  # GGML_MAX_NAME, counting the terminating NUL
MAX_STRING = MAX_ARRAY = 1 << 30  # GGUF_MAX_STRING_LENGTH, GGUF_MAX_ARRAY_ELEMENTS
MAX_LAYERS, MAX_EXPERTS = 512, 1024  # llama-hparams.h
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # anything else: GGML_ASSERT in load_hparams
SMALL_ARRAY = 256  # numeric arrays up to this length become lists

# VocabInfo.special's names and the keys llama.cpp reads them from.
SPECIAL_IDS = {"bos": Keys.Tokenizer.BOS_ID, "eos": Keys.Tokenizer.EOS_ID, "unk": Keys.Tokenizer.UNK_ID,
               "pad": Keys.Tokenizer.PAD_ID}
# Special tokens llama.cpp falls back to per tokenizer model when the file names none (llama-vocab.cpp).
DEFAULT_BOS = {"llama": 1, "bert": 101, "gpt2": 11, "hybriddna": 11, "whitespace": 11, "plamo2": 1}
DEFAULT_EOS = {"llama": 2, "gpt2": 11, "hybriddna": 11, "whitespace": 11, "t5": 1, "plamo2": 2}


def open_gguf(path: Path) -> "GGUFFile":
    """One parsed GGUFFile per file and process (the reference and a candidate may share one)."""
    path = Path(path).resolve()
    stat = path.stat() if path.exists() else None
    key = (path, stat and (stat.st_size, stat.st_mtime_ns))
    if key not in _OPEN:
        _OPEN[key] = GGUFFile(path)
    return _OPEN[key]


_OPEN: dict = {}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order (ne0 first)
    type_name: str  # GGMLQuantizationType name, "Q4_K", "F16", ...
    n_elements: int
    n_bytes: int
    offset: int  # absolute position in the file


class _Truncated(Exception):
    """The header runs past the end of the file."""


class _Invalid(Exception):
    """The file breaks a rule llama.cpp enforces at load time (the message says which)."""


class GGUFFile:
    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelDiffError(f"{self.path}: no such GGUF file")
        try:
            with open(self.path, "rb") as f:
                magic = f.read(4)
        except OSError as exc:
            raise ModelDiffError(f"{self.path}: cannot read the GGUF file ({exc.strerror})") from None
        if magic != GGUF_MAGIC:
            raise ModelDiffError(f"{self.path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        size = self.path.stat().st_size
        try:
            walk = _HeaderWalk(self.path)
            self.metadata, self.tensors, self.alignment = walk.metadata, walk.tensors, walk.alignment
            self.value_types = walk.value_types  # key: (GGUF type id, array item type id or None)
            _check_model(self.metadata, self.tensors)
        except _Truncated as exc:
            raise ModelDiffError(f"{self.path}: truncated or corrupt GGUF, the file has {size} bytes "
                                 f"(header: {exc})") from None
        except _Invalid as exc:
            raise ModelDiffError(f"{self.path}: {exc}") from None

    @cached_property
    def tensor_names(self) -> set[str]:
        return {t.name for t in self.tensors}

    @property
    def quant_type(self) -> str:
        """general.file_type as a llama.cpp name ("Q4_K_M", "F16"), or the commonest tensor type."""
        file_type = self.metadata.get(Keys.General.FILE_TYPE)
        if isinstance(file_type, int):
            try:
                return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
            except ValueError:
                pass
        counts: dict[str, int] = {}
        for t in self.tensors:
            if len(t.shape) > 1:
                counts[t.type_name] = counts.get(t.type_name, 0) + t.n_elements
        return max(counts, key=counts.get) if counts else "GUESSED"

    def hparams(self) -> dict[str, Any]:
        return mapping.from_gguf_metadata(self.metadata, self.tensor_names)

    @cached_property
    def by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}

    def read_tensor(self, name: str, start: int = 0, stop: int | None = None):
        """Rows [start, stop) of the first numpy axis of one tensor, dequantized to float32 with
        gguf-py, numpy shape (ne_{n-1}, ..., ne0) = HF's. Only those rows' bytes are mapped (quant
        blocks run along ne0, so every first-axis row is whole blocks)."""
        info = self.by_name.get(name)
        if info is None:
            raise ModelDiffError(f"{self.path}: no tensor {name!r}")
        qtype = gguf.GGMLQuantizationType[info.type_name]
        shape = tuple(reversed(info.shape)) or (1,)
        stop = shape[0] if stop is None else min(stop, shape[0])
        row_bytes = info.n_bytes // shape[0]
        if stop <= start:
            return np.zeros((0, *shape[1:]), dtype=np.float32)
        raw = np.memmap(self.path, dtype=np.uint8, mode="r", offset=info.offset + start * row_bytes,
                        shape=((stop - start) * row_bytes,))
        shape = (stop - start, *shape[1:])
        if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            dtype = np.float32 if qtype == gguf.GGMLQuantizationType.F32 else np.float16
            return raw.view(dtype).reshape(shape).astype(np.float32)
        ne0_rows = info.n_elements // info.shape[0]  # gguf-py dequantizes rows of whole blocks along ne0
        try:
            values = gguf.quants.dequantize(np.array(raw).reshape(-1, info.n_bytes // ne0_rows), qtype)
        except NotImplementedError:
            raise ModelDiffError(f"{self.path}: gguf {getattr(gguf, '__version__', '')} cannot dequantize "
                                 f"{info.type_name} ({name})") from None
        return np.asarray(values, dtype=np.float32).reshape(shape)

    def vocab(self) -> VocabInfo:
        meta = self.metadata

        def token_id(key: str):
            value = meta.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        def strings(key: str) -> list[str] | None:
            value = meta.get(key)
            return value if isinstance(value, list) and all(isinstance(x, str) for x in value) else None

        scores = _numbers(meta.get(Keys.Tokenizer.SCORES))
        return VocabInfo(
            tokens=strings(Keys.Tokenizer.LIST) or [],
            merges=strings(Keys.Tokenizer.MERGES),
            scores=[float(x) for x in scores] if scores is not None else None,
            special={name: token_id(key) for name, key in SPECIAL_IDS.items()},
            add_bos=_flag(meta.get(Keys.Tokenizer.ADD_BOS)),
            add_eos=_flag(meta.get(Keys.Tokenizer.ADD_EOS)),
            chat_template=meta.get(Keys.Tokenizer.CHAT_TEMPLATE) if isinstance(
                meta.get(Keys.Tokenizer.CHAT_TEMPLATE), str) else None,
        )


def _flag(value) -> bool | None:
    return bool(value) if isinstance(value, (bool, int, float)) else None


# --------------------------------------------------------------------------- the header walk
U32, U64, I64 = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<q")
# gguf.h enum gguf_type: the numeric value types by id, as struct formats (numpy reads the same codes).
NUMERIC = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
SCALAR = {kind: struct.Struct("<" + code) for kind, code in NUMERIC.items()}
ARRAY_DTYPE = {kind: np.dtype("<" + ("B" if code == "?" else code)) for kind, code in NUMERIC.items()}
TYPE_NAMES = dict(enumerate("UINT8 INT8 UINT16 INT16 UINT32 INT32 FLOAT32 BOOL STRING ARRAY UINT64 INT64 "
                            "FLOAT64".split()))
STRING, ARRAY, UINT32, BOOL = 8, 9, 4, 7


class _HeaderWalk:
    """Walk GGUF v2/v3 (little-endian): magic, version, counts, key/values, tensor infos, and
    check what gguf_init_from_file_impl checks. Every read is bounds-checked (_Truncated)."""

    def __init__(self, path: Path):
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            self.buf, self.pos, self.size = buf, 4, len(buf)
            try:
                self._walk()
            finally:
                self.buf = None

    # ---- primitive reads
    def take(self, fmt: struct.Struct):
        if self.pos + fmt.size > self.size:
            raise _Truncated(f"needs {fmt.size} more bytes at offset {self.pos}")
        value = fmt.unpack_from(self.buf, self.pos)[0]
        self.pos += fmt.size
        return value

    def raw_string(self) -> bytes:
        n = self.take(U64)
        if self.pos + n > self.size:
            raise _Truncated(f"a string of {n} bytes at offset {self.pos - 8} runs past the end of the file")
        if n > MAX_STRING:
            raise _Invalid(f"a string of {n} bytes at offset {self.pos - 8}: llama.cpp reads at most "
                           f"{MAX_STRING}")
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def string(self) -> str:
        return self.raw_string().decode("utf-8", errors="replace")

    def array(self, key: str):
        item, count = self.take(U32), self.take(U64)
        self.item_type = item
        if item == ARRAY:
            raise _Invalid(f"key {_q(key)} is an array of arrays, which llama.cpp's GGUF reader refuses")
        if item != STRING and item not in ARRAY_DTYPE:
            raise _Invalid(f"key {_q(key)} is an array of GGUF type {item}: llama.cpp knows types 0-12")
        item_bytes = 8 if item == STRING else ARRAY_DTYPE[item].itemsize  # a string takes 8 bytes at least
        if count * item_bytes > self.size - self.pos:
            raise _Truncated(f"array {_q(key)} of {count} items runs past the end of the file")
        if count > MAX_ARRAY:
            raise _Invalid(f"key {_q(key)} is an array of {count} items: llama.cpp reads at most {MAX_ARRAY}")
        if item == STRING:
            raw = [self.raw_string() for _ in range(count)]
            if key == Keys.Tokenizer.LIST:
                _check_unique_tokens(raw)
            return [w.decode("utf-8", errors="replace") for w in raw]
        values = np.frombuffer(self.buf, dtype=ARRAY_DTYPE[item], count=count, offset=self.pos).copy()
        self.pos += count * item_bytes
        if item == BOOL:
            values = values != 0
        return values.tolist() if count <= SMALL_ARRAY else values

    def value(self, key: str, kind: int):
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            return self.array(key)
        if kind not in SCALAR:
            raise _Invalid(f"key {_q(key)} has GGUF type {kind}: llama.cpp knows types 0-12")
        return self.take(SCALAR[kind])

    # ---- sections
    def _walk(self) -> None:
        version = self.take(U32)
        if version not in (2, 3):
            raise _Invalid(f"GGUF version {version}: llama.cpp reads versions 2 and 3 (a big-endian file?)")
        n_tensors, n_kv = self.take(I64), self.take(I64)
        if n_tensors < 0 or n_kv < 0:
            raise _Invalid(f"negative tensor or key/value count ({n_tensors}, {n_kv})")
        if n_tensors * 24 > self.size - self.pos:  # name length, n_dims, type, offset: 24 bytes at least
            raise _Truncated(f"{n_tensors} tensor infos cannot fit in the file")
        self.metadata = self._key_values(n_kv)
        self.alignment = self._alignment()
        infos = self._tensor_infos(n_tensors)
        data_start = self.pos + (-self.pos % self.alignment) if n_tensors else self.pos
        self.tensors = self._layout(infos, data_start)

    def _key_values(self, n_kv: int) -> dict[str, Any]:
        metadata, seen, self.value_types = {}, set(), {}
        for i in range(n_kv):
            raw_key = self.raw_string()
            key = raw_key.decode("utf-8", errors="replace")
            if not raw_key:
                raise _Invalid(f"key/value pair {i} has an empty key, which llama.cpp refuses")
            if raw_key in seen:
                raise _Invalid(f"duplicate key {_q(key)}, which llama.cpp refuses")
            seen.add(raw_key)
            kind = self.take(U32)
            metadata[key] = self.value(key, kind)
            self.value_types[key] = (kind, self.item_type if kind == ARRAY else None)
        return metadata

    def _alignment(self) -> int:
        key = Keys.General.ALIGNMENT
        if key not in self.metadata:
            return DEFAULT_ALIGNMENT
        value, (kind, _) = self.metadata[key], self.value_types[key]
        if kind != UINT32:
            raise _Invalid(f"{key} = {_short(value)} is a {TYPE_NAMES[kind]}: llama.cpp needs a UINT32")
        if value == 0 or value & (value - 1):
            raise _Invalid(f"{key} = {value}: llama.cpp needs a non-zero power of two")
        return value

    def _tensor_infos(self, n_tensors: int) -> list[tuple[str, tuple[int, ...], Any, int]]:
        infos, seen = [], set()
        for _ in range(n_tensors):
            raw_name = self.raw_string()
            name = raw_name.decode("utf-8", errors="replace")
            if len(raw_name) >= MAX_NAME:
                raise _Invalid(f"tensor name {_q(name)} has {len(raw_name)} bytes: llama.cpp allows "
                               f"{MAX_NAME - 1}")
            if raw_name in seen:
                raise _Invalid(f"duplicate tensor {_q(name)}, which llama.cpp refuses")
            seen.add(raw_name)
            n_dims = self.take(U32)
            if n_dims > MAX_DIMS:
                raise _Invalid(f"tensor {_q(name)} has {n_dims} dimensions: llama.cpp allows {MAX_DIMS}")
            shape = tuple(self.take(I64) for _ in range(n_dims))
            _check_shape(name, shape)
            type_id, offset = self.take(U32), self.take(U64)
            infos.append((name, shape, _tensor_type(gguf, name, type_id, shape), offset))
        return infos

    def _layout(self, infos, data_start: int) -> list[TensorInfo]:
        """Tensors must lie packed in header order, each padded to the alignment, start 32-byte
        aligned (llama.cpp maps them in place) and end inside the file."""
        tensors, expected = [], 0
        for name, shape, qtype, offset in infos:
            n_elements = math.prod(shape)
            block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            n_bytes = n_elements // block * block_bytes
            if offset != expected:
                raise _Invalid(f"tensor {_q(name)} has data offset {offset}, llama.cpp expects {expected} "
                               f"(tensors packed in header order, each padded to {self.alignment} bytes)")
            start = data_start + offset
            if start % MMAP_ALIGNMENT:
                raise _Invalid(f"tensor {_q(name)} data starts at byte {start}, not a multiple of "
                               f"{MMAP_ALIGNMENT}: llama.cpp maps tensors in place and needs that "
                               f"({Keys.General.ALIGNMENT} = {self.alignment})")
            expected += n_bytes + (-n_bytes % self.alignment)
            tensors.append(TensorInfo(name, shape, qtype.name, n_elements, n_bytes, start))
        end = max((t.offset + t.n_bytes for t in tensors), default=0)
        if end > self.size:
            raise _Invalid(f"truncated GGUF, tensor data needs {end} bytes, the file has {self.size} bytes")
        return tensors


def _check_shape(name: str, shape: tuple[int, ...]) -> None:
    """Every dimension >= 1 (gguf.cpp allows 0, but no model loads one) and no int64 overflow."""
    if any(dim <= 0 for dim in shape):
        raise _Invalid(f"tensor {_q(name)} has shape {list(shape)}: llama.cpp needs every dimension >= 1")
    if math.prod(shape) >= 1 << 63:
        raise _Invalid(f"tensor {_q(name)} has shape {list(shape)}: its element count overflows int64")


def _tensor_type(gguf, name: str, type_id: int, shape: tuple[int, ...]):
    """The tensor's GGMLQuantizationType, known to gguf-py, with whole blocks per row."""
    try:
        qtype = gguf.GGMLQuantizationType(type_id)
        block, _ = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise _Invalid(f"tensor {_q(name)} has type id {type_id}, which the installed gguf-py does not know "
                       "(nor, unless it is newer, llama.cpp)") from None
    ne0 = shape[0] if shape else 1
    if ne0 % block:
        raise _Invalid(f"tensor {_q(name)} is {qtype.name} with {ne0} elements per row: llama.cpp needs a "
                       f"multiple of its block size {block}")
    return qtype


# --------------------------------------------------------------------------- model-level rules
def _check_model(meta: dict[str, Any], tensors: list[TensorInfo]) -> None:
    """The hyper-parameter and vocabulary values llama.cpp asserts on (an abort, not an error)."""
    _check_norm_eps(meta)
    _check_vocab(meta)
    arch = meta.get(Keys.General.ARCHITECTURE)
    if not isinstance(arch, str):
        return  # llama.cpp refuses a missing or mistyped architecture with an error of its own
    key = Keys.Rope.SCALING_TYPE.format(arch=arch)
    scaling = meta.get(key, "linear")  # not a string: llama.cpp's own error
    if isinstance(scaling, str) and scaling not in ROPE_SCALING_TYPES:
        raise _Invalid(f"{key} = {_q(scaling)}: llama.cpp knows "
                       f"{', '.join(ROPE_SCALING_TYPES)} and aborts on anything else")
    layers = _layer_tensors(tensors)
    n_layer = _check_block_count(meta, arch, layers)
    if n_layer is None:
        return
    _check_experts(meta, arch, n_layer)
    _check_layer_sizes(meta, arch, n_layer, layers)


def _numbers(value) -> list[float] | None:
    """The numeric values of a scalar or array (None for strings, bools, string arrays)."""
    if isinstance(value, bool) or isinstance(value, str):
        return None
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, np.ndarray):
        return value.tolist() if value.dtype.kind in "iuf" else None
    if isinstance(value, list) and all(type(x) in (int, float) for x in value):
        return value
    return None


def _check_norm_eps(meta: dict[str, Any]) -> None:
    for key, value in meta.items():
        if re.search(r"norm_(rms_)?eps(ilon)?$", key):
            values = _numbers(value) or []
            if any(not math.isfinite(x) or x < 0 for x in values):
                raise _Invalid(f"{key} = {_short(value)}: llama.cpp needs a finite norm epsilon >= 0 "
                               "(GGML_ASSERT(eps >= 0.0f) aborts the process)")


def _layer_tensors(tensors: list[TensorInfo]) -> dict[int, set[str]]:
    """{layer index: tensor names without the blk.N. prefix}."""
    layers: dict[int, set[str]] = {}
    for t in tensors:
        parts = t.name.split(".", 2)
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isascii() and parts[1].isdigit():
            layers.setdefault(int(parts[1]), set()).add(parts[2])
    return layers


def _check_block_count(meta: dict[str, Any], arch: str, layers: dict[int, set[str]]) -> int | None:
    key = Keys.LLM.BLOCK_COUNT.format(arch=arch)
    values = _numbers(meta.get(key))
    if values is None or len(values) != 1 or not isinstance(values[0], int):
        return None  # missing or mistyped: llama.cpp refuses it with an error of its own
    n_layer = values[0]
    if not 0 < n_layer <= MAX_LAYERS:
        raise _Invalid(f"{key} = {n_layer}: llama.cpp needs 1 to {MAX_LAYERS} layers and aborts otherwise")
    if layers and max(layers) + 1 != n_layer:
        raise _Invalid(f"{key} = {n_layer} but the file has tensors for blocks 0 to {max(layers)}")
    # a literal: Keys.LLM.NEXTN_PREDICT_LAYERS is newer than gguf-py 0.17.1, the oldest pyproject allows
    nextn_key = f"{arch}.nextn_predict_layers"
    nextn = meta.get(nextn_key)
    if isinstance(nextn, int) and not isinstance(nextn, bool) and nextn > n_layer:
        raise _Invalid(f"{nextn_key} = {nextn} exceeds {key} = {n_layer} (llama.cpp aborts)")
    return n_layer


def _per_layer(meta: dict[str, Any], key: str, n_layer: int) -> list[float] | None:
    """A scalar-or-per-layer hyper-parameter as one value per layer (None: absent or unusable,
    which llama.cpp reports itself)."""
    values = _numbers(meta.get(key))
    if values is None:
        return None
    if len(values) == 1 and not isinstance(meta[key], (list, np.ndarray)):
        return values * n_layer
    return values if len(values) == n_layer else None


def _check_experts(meta: dict[str, Any], arch: str, n_layer: int) -> None:
    """load_hparams' GGML_ASSERTs on expert counts."""
    def count(key: str) -> int:  # not an integer: llama.cpp refuses the type itself
        value = meta.get(key.format(arch=arch))
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    # the group keys are literals: Keys.LLM.EXPERT_GROUP_COUNT and EXPERT_GROUP_USED_COUNT are newer than
    # gguf-py 0.17.1, the oldest pyproject allows
    n_expert, groups = count(Keys.LLM.EXPERT_COUNT), count("{arch}.expert_group_count")
    group_used = count("{arch}.expert_group_used_count")
    used = max(_per_layer(meta, Keys.LLM.EXPERT_USED_COUNT.format(arch=arch), n_layer) or [0])
    problem = None
    if n_expert > MAX_EXPERTS:
        problem = f"expert_count = {n_expert} exceeds {MAX_EXPERTS}"
    elif used > n_expert:
        problem = f"expert_used_count = {used} exceeds expert_count = {n_expert}"
    elif n_expert > 0 and (used <= 0 or groups >= n_expert):
        problem = f"expert_count = {n_expert} needs expert_used_count > 0 and expert_group_count < it"
    elif n_expert > 0 and groups > 1 and (n_expert % groups or not 0 < group_used < groups):
        problem = (f"expert_group_count = {groups} must divide expert_count and exceed "
                   "expert_group_used_count > 0")
    elif n_expert == 0 and groups:
        problem = f"expert_group_count = {groups} without experts"
    if problem:
        raise _Invalid(f"{arch}.{problem}: llama.cpp aborts on it (GGML_ASSERT in load_hparams)")


def _check_layer_sizes(meta: dict[str, Any], arch: str, n_layer: int, layers: dict[int, set[str]]) -> None:
    """Hyper-parameters llama.cpp turns into tensor dimensions must be > 0 where that tensor
    exists (llama.cpp refuses the shape; a 0 is also a GGML_ASSERT(ne >= 1) for virtual tensors)."""
    key = Keys.LLM.EMBEDDING_LENGTH.format(arch=arch)
    embd = _numbers(meta.get(key))
    if embd and len(embd) == 1 and embd[0] <= 0:
        raise _Invalid(f"{key} = {embd[0]}: llama.cpp needs > 0")
    needs = ((Keys.Attention.HEAD_COUNT, ("attn_q.weight", "attn_qkv.weight")),
             (Keys.Attention.HEAD_COUNT_KV, ("attn_k.weight", "attn_v.weight", "attn_qkv.weight")),
             (Keys.Attention.KEY_LENGTH, ("attn_q.weight", "attn_k.weight", "attn_qkv.weight")),
             (Keys.Attention.VALUE_LENGTH, ("attn_v.weight", "attn_qkv.weight")),
             (Keys.LLM.FEED_FORWARD_LENGTH, ("ffn_up.weight", "ffn_down.weight")))
    for template, tensors in needs:
        key = template.format(arch=arch)
        values = _per_layer(meta, key, n_layer)
        for layer in range(n_layer) if values else ():
            present = sorted(layers.get(layer, set()) & set(tensors))
            if values[layer] <= 0 and present:
                where = f"{key}[{layer}]" if isinstance(meta[key], (list, np.ndarray)) else key
                raise _Invalid(f"{where} = {values[layer]}: llama.cpp needs > 0 where a block has "
                               f"{present[0]} (block {layer})")


def _check_unique_tokens(raw: list[bytes]) -> None:
    """llama.cpp maps token text to id and asserts the map is as long as the list; it renames an
    empty token to [EMPTY_<i>] first."""
    words = [w or f"[EMPTY_{i}]".encode() for i, w in enumerate(raw)]
    if len(set(words)) == len(words):
        return
    first: dict[bytes, int] = {}
    for i, w in enumerate(words):
        if w in first:
            text = _q(w.decode("utf-8", "replace"))
            raise _Invalid(f"{Keys.Tokenizer.LIST} has {text} twice (ids {first[w]} and {i}): llama.cpp "
                           "needs unique tokens and aborts otherwise")
        first[w] = i


def _check_vocab(meta: dict[str, Any]) -> None:
    """Special token ids inside the vocabulary, and a BOS/EOS to add when the file asks for one
    (llama.cpp's tokenizer asserts it has one)."""
    tokens = meta.get(Keys.Tokenizer.LIST)
    if not isinstance(tokens, list):
        return
    if not tokens:
        raise _Invalid(f"{Keys.Tokenizer.LIST} is empty: llama.cpp needs at least one token")
    n_tokens, model = len(tokens), meta.get(Keys.Tokenizer.MODEL)
    # the ids VocabInfo reports: llama.cpp would silently use another
    for key in (Keys.Tokenizer.BOS_ID, Keys.Tokenizer.EOS_ID):
        value = meta.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value < n_tokens:
            raise _Invalid(f"{key} = {value} is outside the vocabulary of "
                           f"{n_tokens} tokens (llama.cpp would ignore it and use another token)")
    for name, add_key, id_key, defaults in (("bos", Keys.Tokenizer.ADD_BOS, Keys.Tokenizer.BOS_ID, DEFAULT_BOS),
                                            ("eos", Keys.Tokenizer.ADD_EOS, Keys.Tokenizer.EOS_ID, DEFAULT_EOS)):
        if meta.get(add_key) is not True:
            continue
        explicit = meta.get(id_key)
        fallback = defaults.get(model) if isinstance(model, str) else None
        if not isinstance(explicit, int) and (fallback is None or fallback >= n_tokens):
            raise _Invalid(f"{add_key} is true but the file names no {name.upper()} "
                           f"token ({id_key}) and tokenizer {_short(model)} has no "
                           f"default one in {n_tokens} tokens: llama.cpp aborts when it tokenizes")


def _q(text: str) -> str:
    """A key or tensor name for a one-line message (a corrupt one can be long)."""
    text = repr(text)
    return text if len(text) <= 80 else text[:77] + "..."


def _short(value) -> str:
    """A metadata value for a one-line message (floats to 7 digits: most are float32)."""
    if isinstance(value, float):
        return f"{value:.7g}"
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= 60 else text[:57] + "..."
