"""Read GGUF metadata with ``gguf`` (gguf-py): validated header, key/values, vocabulary, quant type.

Shared by every runner that reads a GGUF (llama.cpp, gguf-torch) so they agree on what the file
says. Errors name the file and what is wrong with it, never a parser traceback.
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

from . import mapping
from .errors import ModelDiffError
from .runners.base import VocabInfo

GGUF_MAGIC = b"GGUF"


def open_gguf(path: Path) -> "GGUFFile":
    """One parsed GGUFFile per file and process: gguf-py's full parse costs ~2 s for a 49k-token
    vocabulary, and several runners (or the reference and a candidate) may read the same file."""
    path = Path(path).resolve()
    stat = path.stat() if path.exists() else None
    key = (path, stat and (stat.st_size, stat.st_mtime_ns))
    if key not in _OPEN:
        _OPEN[key] = GGUFFile(path)
    return _OPEN[key]


_OPEN: dict = {}


class GGUFFile:
    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelDiffError(f"{self.path}: no such GGUF file")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ModelDiffError(f"{self.path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        self.reader  # parse the header now (memory-mapped, cheap) so a bad file fails before any run

    @cached_property
    def reader(self):
        import gguf

        size = self.path.stat().st_size
        try:
            reader = gguf.GGUFReader(self.path)
        except Exception as exc:  # gguf raises ValueError/IndexError/struct errors on bad files
            raise ModelDiffError(f"{self.path}: truncated or corrupt GGUF, the file has {size} bytes "
                                 f"(gguf: {exc})") from None
        end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
        if end > size:
            raise ModelDiffError(f"{self.path}: truncated GGUF, tensor data needs {end} bytes, the file has {size}")
        return reader

    @cached_property
    def metadata(self) -> dict[str, Any]:
        """All key/values as Python scalars, strings and lists (GGUF.* header fields dropped)."""
        out = {}
        for key, field in self.reader.fields.items():
            if not key.startswith("GGUF."):
                out[key] = field.contents()
        return out

    @cached_property
    def tensor_names(self) -> set[str]:
        return {t.name for t in self.reader.tensors}

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
        for t in self.reader.tensors:
            if len(t.shape) > 1:
                counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + int(t.n_elements)
        return max(counts, key=counts.get) if counts else "GUESSED"

    def hparams(self) -> dict[str, Any]:
        return mapping.from_gguf_metadata(self.metadata, self.tensor_names)

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
