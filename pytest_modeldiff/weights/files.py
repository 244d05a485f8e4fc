"""Weight readers: a checkpoint's tensors by name, read a slice of rows at a time.

Every reader gives one view of its file(s): ``tensors`` (name -> TensorMeta: numpy/HF shape and
storage type in GGML's names, "F32", "BF16", "Q4_K" ...) and ``read(name, start, stop)``, rows
[start, stop) of the first axis as float32. Nothing reads a whole model: a safetensors tensor is
sliced from the memory-mapped file (the mapping is dropped after each tensor), a GGUF tensor's rows
are dequantized with gguf-py from their own byte range, torch zip checkpoints load with mmap=True,
a .npz member is read when its tensor is asked for and dropped at the next.

    reader = open_weights("hf_model")      # folder, .safetensors, .gguf, .pt/.pth/.bin, .npz, .npy
    for name, meta in reader.tensors.items():
        rows = reader.read(name, 0, 1024)
"""
from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelDiffError
from ..formats.mapping import TIED_OUTPUT

TORCH_SUFFIXES = (".pt", ".pth", ".bin")
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's zip format (a llama.cpp logits dump never starts with it)


@dataclass(frozen=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]  # numpy order (HF's: out_features first)
    type_name: str  # storage type, GGML's names: F32, F16, BF16, Q8_0, Q4_K, I8 ...

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def n_bytes(self) -> int:
        """Bytes the tensor takes in its file: GGML block sizes, else the element size."""
        import gguf

        qtype = gguf.GGMLQuantizationType.__members__.get(self.type_name)
        if qtype is not None:
            block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            return self.n_elements // block * block_bytes
        return self.n_elements * _ELEMENT_BYTES.get(self.type_name, 1)


_ELEMENT_BYTES = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2}


class WeightReader:
    """Base: subclasses fill ``tensors`` and implement ``_read``."""

    naming = "hf"  # "hf" (state-dict names) or "gguf" (blk.N.attn_q.weight)

    def __init__(self, path: Path):
        self.path = Path(path)
        self.tensors: dict[str, TensorMeta] = {}
        self.aliases: dict[str, str] = {}  # a tied tensor's name -> the stored tensor it uses
        self.config: dict = {}  # HF config.json or GGUF metadata

    def meta(self, name: str) -> TensorMeta:
        """The stored tensor ``name`` stands for (a tied name resolves to the tensor it uses)."""
        stored = self.aliases.get(name, name)
        if stored not in self.tensors:
            raise ModelDiffError(f"{self.path}: no tensor {name!r}")
        return self.tensors[stored]

    def read(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        meta = self.meta(name)
        stop = meta.shape[0] if stop is None else stop
        return np.asarray(self._read(meta.name, start, stop), dtype=np.float32)

    def dominant_type(self) -> str:
        """The storage type holding most elements ("F32", "BF16", ...), "GUESSED" without tensors."""
        counts: dict[str, int] = {}
        for meta in self.tensors.values():
            counts[meta.type_name] = counts.get(meta.type_name, 0) + meta.n_elements
        return max(counts, key=counts.get) if counts else "GUESSED"

    def _read(self, name: str, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def release(self) -> None:
        """Drop what was kept for the last tensor (mapping, decompressed member)."""

    @property
    def files(self) -> list[Path]:
        return [self.path]


# --------------------------------------------------------------------------- safetensors
# safetensors dtypes numpy cannot hold are read through torch ("pt") and converted.
_NUMPY_SAFETENSORS = {"F64", "F32", "F16", "I64", "I32", "I16", "I8", "U8", "BOOL"}


class SafetensorsReader(WeightReader):
    """One or more .safetensors files; with a sharded checkpoint's index, the index decides."""

    def __init__(self, path: Path, files: list[Path], index: dict[str, Path] | None = None):
        from safetensors import safe_open

        super().__init__(path)
        self.where: dict[str, Path] = {}
        for file in files:
            try:
                with safe_open(file, "np") as f:
                    for name in f.keys():
                        if index is None or index.get(name) == file:
                            sl = f.get_slice(name)
                            self.tensors[name] = TensorMeta(name, tuple(sl.get_shape()), sl.get_dtype())
                            self.where[name] = file
            except Exception as exc:  # safetensors raises its own error types
                raise ModelDiffError(f"{file}: not a readable safetensors file ({exc})") from None
        missing = sorted(set(index or ()) - set(self.tensors))
        if missing:
            raise ModelDiffError(f"{path}: the index names tensors its shards lack: {', '.join(missing[:5])}")
        self._open: tuple[tuple[Path, str], object] | None = None  # (file, framework), safe_open handle

    @property
    def files(self) -> list[Path]:
        return list(dict.fromkeys(self.where.values()))

    def _read(self, name, start, stop):
        from safetensors import safe_open

        meta = self.tensors[name]
        framework = "np" if meta.type_name in _NUMPY_SAFETENSORS else "pt"
        file = self.where[name]
        if self._open is None or self._open[0] != (file, framework):
            self.release()
            self._open = ((file, framework), safe_open(file, framework).__enter__())
        rows = self._open[1].get_slice(name)[start:stop]
        return rows if framework == "np" else rows.float().numpy()

    def release(self):
        if self._open is not None:
            self._open[1].__exit__(None, None, None)
            self._open = None


# --------------------------------------------------------------------------- torch checkpoints
class TorchReader(WeightReader):
    """torch.save state dicts (weights_only=True, memory-mapped); one shard loaded at a time."""

    def __init__(self, path: Path, files: list[Path]):
        super().__init__(path)
        self._files = files
        self.where: dict[str, Path] = {}
        for file in files:
            for name, tensor in self._load(file).items():
                self.tensors[name] = TensorMeta(name, tuple(tensor.shape), _torch_type(tensor.dtype))
                self.where[name] = file
        self._loaded: tuple[Path, dict] | None = None

    @property
    def files(self) -> list[Path]:
        return self._files

    @staticmethod
    def _load(file: Path) -> dict:
        import torch

        with open(file, "rb") as f:
            if f.read(4) != ZIP_MAGIC:
                raise ModelDiffError(f"{file}: not a torch zip checkpoint (legacy torch.save files cannot be "
                                     "memory-mapped; re-save it with a current torch or as safetensors)")
        try:
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:
            raise ModelDiffError(f"{file}: torch.load(weights_only=True) cannot read it ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
        for key in ("state_dict", "model"):  # training checkpoints wrap the state dict
            if isinstance(state, dict) and isinstance(state.get(key), dict):
                state = state[key]
        if not isinstance(state, dict):
            raise ModelDiffError(f"{file}: holds a {type(state).__name__}, not a state dict of tensors")
        return dict(_flatten(state))

    def _read(self, name, start, stop):
        file = self.where[name]
        if self._loaded is None or self._loaded[0] != file:
            self._loaded = (file, self._load(file))
        return self._loaded[1][name][start:stop].float().numpy()

    def release(self):
        self._loaded = None


def _flatten(state: dict, prefix: str = ""):
    import torch

    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            yield f"{prefix}{key}", value
        elif isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")


def _torch_type(dtype) -> str:
    import torch

    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
             torch.int8: "I8", torch.uint8: "U8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64"}
    return names.get(dtype, str(dtype).removeprefix("torch.").upper())


# --------------------------------------------------------------------------- numpy
class NumpyReader(WeightReader):
    """A .npy (one tensor, named by the file stem) or a .npz (one tensor per member)."""

    def __init__(self, path: Path):
        super().__init__(path)
        self._current: tuple[str, np.ndarray] | None = None
        try:
            if path.suffix == ".npy":
                array = np.load(path, mmap_mode="r")
                self.tensors[path.stem] = TensorMeta(path.stem, array.shape, _numpy_type(array.dtype))
                return
            with zipfile.ZipFile(path) as z:
                for member in z.namelist():
                    with z.open(member) as f:
                        version = np.lib.format.read_magic(f)
                        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                       else np.lib.format.read_array_header_2_0)
                        shape, _, dtype = read_header(f)
                    name = member.removesuffix(".npy")
                    self.tensors[name] = TensorMeta(name, shape, _numpy_type(dtype))
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise ModelDiffError(f"{path}: not a readable {path.suffix} file ({exc})") from None

    def _read(self, name, start, stop):
        if self._current is None or self._current[0] != name:
            self.release()
            if self.path.suffix == ".npy":
                array = np.load(self.path, mmap_mode="r")
            else:
                with np.load(self.path) as npz:
                    array = npz[name]
            self._current = (name, array)
        return self._current[1][start:stop]

    def release(self):
        self._current = None


def _numpy_type(dtype) -> str:
    dtype = np.dtype(dtype)
    return {"f": "F", "i": "I", "u": "U", "b": "BOOL"}.get(dtype.kind, dtype.kind) + (
        "" if dtype.kind == "b" else str(dtype.itemsize * 8))


# --------------------------------------------------------------------------- GGUF
class GGUFReader(WeightReader):
    naming = "gguf"

    def __init__(self, path: Path):
        from ..formats.gguf_file import open_gguf

        super().__init__(path)
        self.gguf = open_gguf(path)
        self.config = self.gguf.metadata
        for t in self.gguf.tensors:
            self.tensors[t.name] = TensorMeta(t.name, tuple(reversed(t.shape)), t.type_name)
        tied_name, embedding = TIED_OUTPUT["gguf"]
        if tied_name not in self.tensors and embedding in self.tensors:
            self.aliases[tied_name] = embedding  # llama.cpp uses token_embd as the output head

    def _read(self, name, start, stop):
        return self.gguf.read_tensor(name, start, stop)


# --------------------------------------------------------------------------- opening
def open_weights(path: str | Path) -> WeightReader:
    """The reader for a model folder (safetensors, single or sharded, or torch .bin shards) or a
    single .safetensors / .gguf / .pt / .pth / .bin / .npz / .npy file."""
    path = Path(path)
    if not path.exists():
        raise ModelDiffError(f"{path}: no such file or directory")
    if path.is_dir():
        reader = _open_folder(path)
        config = path / "config.json"
        if config.is_file():
            try:
                reader.config = json.loads(config.read_text())
            except ValueError as exc:
                raise ModelDiffError(f"{config}: not valid JSON ({exc})") from None
        tied_name, embedding = TIED_OUTPUT["hf"]
        text = reader.config.get("text_config") or {}
        tied = reader.config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        if tied and tied_name not in reader.tensors and embedding in reader.tensors:
            reader.aliases[tied_name] = embedding
        return reader
    suffix = path.suffix.lower()
    if suffix == ".gguf":
        return GGUFReader(path)
    if suffix == ".safetensors":
        return SafetensorsReader(path, [path])
    if suffix in TORCH_SUFFIXES:
        return TorchReader(path, [path])
    if suffix in (".npz", ".npy"):
        return NumpyReader(path)
    raise ModelDiffError(f"{path}: not a weight file this tool reads (a HF folder, .safetensors, .gguf, "
                         f".pt/.pth/.bin, .npz or .npy)")


def _open_folder(folder: Path) -> WeightReader:
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            try:
                weight_map = json.loads((folder / index).read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ModelDiffError(f"{folder / index}: not a sharded-checkpoint index ({exc!r})") from None
            shards = {name: folder / shard for name, shard in weight_map.items()}
            files = list(dict.fromkeys(shards.values()))
            absent = [str(p) for p in files if not p.is_file()]
            if absent:
                raise ModelDiffError(f"{folder / index}: names shard files that do not exist: {', '.join(absent[:3])}")
            return SafetensorsReader(folder, files, shards) if "safetensors" in index else TorchReader(folder, files)
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return SafetensorsReader(folder, files)
    files = sorted(p for p in folder.iterdir()
                   if p.suffix in TORCH_SUFFIXES and p.name.startswith(("pytorch_model", "model")))
    if files:
        return TorchReader(folder, files)
    raise ModelDiffError(f"{folder}: no weights found (*.safetensors, a sharded index json or pytorch_model*.bin)")


def model_size(path: str | Path) -> dict | None:
    """The weight files' bytes, the parameters they hold and bits per weight (llama.cpp's
    "file size (BPW)"); None when ``path`` holds no readable weights."""
    try:
        reader = open_weights(path)
    except ModelDiffError:
        return None
    params = sum(meta.n_elements for meta in reader.tensors.values())
    size = sum(file.stat().st_size for file in reader.files)
    return {"bytes": size, "params": params, "bpw": 8.0 * size / params if params else None}


def is_torch_checkpoint(path: Path) -> bool:
    """A .bin that torch.save wrote (zip), not a llama.cpp logits dump."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == ZIP_MAGIC
    except OSError:
        return False
