"""Read a GGUF's header: validated layout, key/values, tensor table, vocabulary, quant type.

Shared by every runner that reads a GGUF (llama.cpp, gguf-torch) so they agree on what the file
says. The walk uses gguf-py's own tables (GGUFValueType, GGML_QUANT_SIZES, LlamaFileType) but
not GGUFReader: that one builds a numpy view per vocabulary string and merge (~2.5 s for a
49k-token vocabulary, paid at every pytest start); this walk reads the same header in ~0.1 s.
tests/test_gguf_file.py checks it against GGUFReader. Errors name the file and the problem.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from . import mapping
from .errors import ModelDiffError
from .runners.base import VocabInfo

GGUF_MAGIC = b"GGUF"


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


class GGUFFile:
    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelDiffError(f"{self.path}: no such GGUF file")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ModelDiffError(f"{self.path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        size = self.path.stat().st_size
        try:
            self.metadata, self.tensors = _read_header(self.path)
        except (struct.error, ValueError, KeyError, UnicodeDecodeError, IndexError) as exc:
            raise ModelDiffError(f"{self.path}: truncated or corrupt GGUF, the file has {size} bytes "
                                 f"(header: {exc})") from None
        end = max((t.offset + t.n_bytes for t in self.tensors), default=0)
        if end > size:
            raise ModelDiffError(f"{self.path}: truncated GGUF, tensor data needs {end} bytes, the file has {size} bytes")

    @cached_property
    def tensor_names(self) -> set[str]:
        return {t.name for t in self.tensors}

    @property
    def quant_type(self) -> str:
        """general.file_type as a llama.cpp name ("Q4_K_M", "F16"), or the commonest tensor type."""
        import gguf

        file_type = self.metadata.get("general.file_type")
        if file_type is not None:
            try:
                return gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
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
        import gguf
        import numpy as np

        info = self.by_name.get(name)
        if info is None:
            raise ModelDiffError(f"{self.path}: no tensor {name!r}")
        qtype = gguf.GGMLQuantizationType[info.type_name]
        shape = tuple(reversed(info.shape))
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

        def token_id(name: str):
            value = meta.get(f"tokenizer.ggml.{name}_token_id")
            return None if value is None else int(value)

        return VocabInfo(
            tokens=list(meta.get("tokenizer.ggml.tokens", [])),
            merges=list(meta["tokenizer.ggml.merges"]) if "tokenizer.ggml.merges" in meta else None,
            scores=[float(x) for x in meta["tokenizer.ggml.scores"]] if "tokenizer.ggml.scores" in meta else None,
            special={name: token_id(name) for name in ("bos", "eos", "unk", "pad")},
            add_bos=_flag(meta.get("tokenizer.ggml.add_bos_token")),
            add_eos=_flag(meta.get("tokenizer.ggml.add_eos_token")),
        )


def _flag(value) -> bool | None:
    return None if value is None else bool(value)


def _read_header(path: Path) -> tuple[dict[str, Any], list[TensorInfo]]:
    """Walk GGUF v2/v3 (little-endian): magic, version, counts, key/values, tensor infos."""
    import gguf

    vt = gguf.GGUFValueType
    scalar = {vt.UINT8: "B", vt.INT8: "b", vt.UINT16: "H", vt.INT16: "h", vt.UINT32: "I", vt.INT32: "i",
              vt.FLOAT32: "f", vt.BOOL: "?", vt.UINT64: "Q", vt.INT64: "q", vt.FLOAT64: "d"}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        pos = 4

        def take(fmt: str):
            nonlocal pos
            values = struct.unpack_from("<" + fmt, buf, pos)
            pos += struct.calcsize("<" + fmt)
            return values[0] if len(values) == 1 else values

        def string() -> str:
            nonlocal pos
            n = take("Q")
            if pos + n > len(buf):
                raise ValueError(f"string of {n} bytes runs past the end of the file")
            pos += n
            return buf[pos - n:pos].decode("utf-8", errors="replace")

        def value(kind: int):
            if kind == vt.STRING:
                return string()
            if kind == vt.ARRAY:
                item, count = take("I"), take("Q")
                if item == vt.STRING:
                    return [string() for _ in range(count)]
                if item == vt.ARRAY:
                    return [value(vt.ARRAY) for _ in range(count)]
                return list(take(f"{count}{scalar[vt(item)]}")) if count else []
            return take(scalar[vt(kind)])

        version = take("I")
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version} (big-endian file?)")
        n_tensors, n_kv = take("Q"), take("Q")
        metadata = {}
        for _ in range(n_kv):
            key = string()
            metadata[key] = value(take("I"))
        infos = []
        for _ in range(n_tensors):
            name, n_dims = string(), take("I")
            shape = tuple(take("Q") for _ in range(n_dims))
            qtype, offset = gguf.GGMLQuantizationType(take("I")), take("Q")
            infos.append((name, shape, qtype, offset))
        alignment = int(metadata.get("general.alignment", 32))
        data_start = pos + (-pos % alignment)
    tensors = []
    for name, shape, qtype, offset in infos:
        n_elements = 1
        for dim in shape:
            n_elements *= dim
        block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        tensors.append(TensorInfo(name, shape, qtype.name, n_elements, n_elements // block * block_bytes,
                                  data_start + offset))
    return metadata, tensors
