"""The reference's outputs on disk: computed once per (model files' content, runtime, token ids),
reused by the next run and by concurrent pytest-xdist workers, and usable as ``--ref-model`` on
a machine without the reference model (like llama-perplexity's --kl-divergence-base file).

File (``<reference name>-<key>.mdref``): MAGIC, uint64 header length, a JSON header (what was
run, on which ids, vocabulary and hyper-parameters, where each array lies), the arrays, and the
sha256 of the arrays. Per sequence it keeps the logits from the first compared position to the
end, each row as uint16 codes over its own range: logit = low + scale * code, scale = (max -
low) / 65535 (llama-perplexity's base file does the same over a fixed 16-nat window of log
probabilities, clamping below it; a row's own range clamps nothing, so raw logits - max |diff|,
NMSE - survive too). The error is uniform, at most scale / 2 (~1.5e-4 for a 20-logit range):
the KLD of a reference against its own cache is ~1e-8 (tests/test_refcache.py measures it;
README). Hidden states, when captured, are float16 (rfn floor ~2e-4).

Writes go to a temporary file renamed into place; a reader that finds a bad magic, header, size
or checksum reports the file as corrupt and the caller rebuilds it.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .cache import CACHE_DIR
from .errors import ModelDiffError

MAGIC = b"MDREF\x00v1"
SUFFIX = ".mdref"
FORMAT = "pytest-modeldiff reference cache v1"
ALIGN = 64


class ModelDiffCacheWarning(UserWarning):
    """A reference cache file was corrupt or stale and is being rebuilt."""


def reference_cache_dir(option: str | None) -> Path | None:
    """--modeldiff-ref-cache, else $MODELDIFF_REF_CACHE, else CACHE_DIR/reference; "none": off."""
    value = option or os.environ.get("MODELDIFF_REF_CACHE") or str(CACHE_DIR / "reference")
    return None if value.strip().lower() == "none" else Path(value).expanduser()


def cache_path(directory: Path, runner, sequences, device: str) -> tuple[Path, str]:
    """The entry for this reference, runtime and token ids; and the model files' hash."""
    from .cache import files_sha256

    model_hash = files_sha256(runner.files())
    key = hashlib.sha256(json.dumps({
        "model": model_hash, "runner": runner.kind, "versions": runner.versions(), "device": device,
        "sequences": [[list(map(int, s.ids)), s.scored] for s in sequences]}).encode()).hexdigest()
    return Path(directory) / f"{runner.name}-{key[:16]}{SUFFIX}", model_hash


class ReferenceCache:
    """A cache file opened for reading (arrays memory-mapped, checksum verified on open)."""

    def __init__(self, path: Path, verify: bool = True):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                magic = f.read(8)
                if magic != MAGIC:
                    raise ModelDiffError(f"{self.path}: not a pytest-modeldiff reference cache (magic {magic!r})")
                (n,) = struct.unpack("<Q", f.read(8))
                self.header = json.loads(f.read(n).decode())
        except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
            raise ModelDiffError(f"{self.path}: unreadable reference cache ({exc})") from None
        if self.header.get("format") != FORMAT:
            raise ModelDiffError(f"{self.path}: reference cache format {self.header.get('format')!r}, expected {FORMAT!r}")
        start, size = self.header["data_offset"], self.header["data_bytes"]
        if self.path.stat().st_size != start + size + 32:
            raise ModelDiffError(f"{self.path}: truncated reference cache ({self.path.stat().st_size} bytes, "
                                 f"expected {start + size + 32})")
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r", offset=start, shape=(size,))
        if verify:
            with open(self.path, "rb") as f:
                f.seek(start + size)
                stored = f.read(32)
            if hashlib.sha256(self._data).digest() != stored:
                raise ModelDiffError(f"{self.path}: reference cache checksum mismatch (the file is corrupt)")

    @property
    def sequences(self) -> list[dict]:
        """Per sequence: ids, text, label, scored, first (first cached position), array offsets."""
        return self.header["sequences"]

    @property
    def has_hidden(self) -> bool:
        return all(s.get("hidden_shape") for s in self.sequences)

    def _array(self, offset: int, dtype, shape) -> np.ndarray:
        count = int(np.prod(shape))
        return self._data[offset: offset + count * np.dtype(dtype).itemsize].view(dtype).reshape(shape)

    def logits(self, i: int) -> np.ndarray:
        """float32 logits of sequence i from its first cached position to its end."""
        s, n_vocab = self.sequences[i], self.header["n_vocab"]
        rows = len(s["ids"]) - s["first"]
        low, scale = self._array(s["range_offset"], np.float32, (2, rows))
        codes = self._array(s["logits_offset"], np.uint16, (rows, n_vocab))
        return low[:, None] + scale[:, None] * codes.astype(np.float32)

    def hidden(self, i: int) -> np.ndarray | None:
        s = self.sequences[i]
        if not s.get("hidden_shape"):
            return None
        return self._array(s["hidden_offset"], np.float16, tuple(s["hidden_shape"])).astype(np.float32)


def write_cache(path: Path, header: dict, sequences, logits_of, hidden_of=None) -> None:
    """Write the reference's outputs atomically: header, arrays, checksum. ``logits_of(i)`` gives
    sequence i's logits from its first compared position to its end, ``hidden_of(i)`` its hidden
    states; both are asked twice (layout, then data), so they should be cheap views."""
    seq_meta, offset, n_vocab = [], 0, 0
    for i, seq in enumerate(sequences):
        rows = logits_of(i)
        hidden = hidden_of(i) if hidden_of else None
        entry = {"ids": list(map(int, seq.ids)), "text": seq.text, "label": seq.label,
                 "scored": list(seq.scored) if seq.scored else None, "first": len(seq.ids) - len(rows)}
        entry["range_offset"], offset = offset, _aligned(offset + 8 * len(rows))
        entry["logits_offset"], offset = offset, _aligned(offset + 2 * rows.size)
        if hidden is not None:
            entry["hidden_shape"] = list(hidden.shape)
            entry["hidden_offset"], offset = offset, _aligned(offset + 2 * hidden.size)
        seq_meta.append(entry)
        n_vocab = rows.shape[-1]
    body = {**header, "format": FORMAT, "n_vocab": n_vocab, "sequences": seq_meta, "data_bytes": offset,
            "precision": "logits: uint16 codes over each row's range (error <= range / 131070); hidden states: float16"}
    text = json.dumps(body).encode()
    body["data_offset"] = _aligned(16 + len(text) + 64)  # room for the offset's own digits
    text = json.dumps(body).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<Q", len(text)) + text)
            f.write(b"\0" * (body["data_offset"] - f.tell()))
            written = 0
            for i, entry in enumerate(seq_meta):
                low, scale, codes = encode_rows(logits_of(i))
                parts = [(entry["range_offset"], np.stack([low, scale])), (entry["logits_offset"], codes)]
                if "hidden_shape" in entry:
                    parts.append((entry["hidden_offset"], np.asarray(hidden_of(i)).astype(np.float16)))
                for at, array in parts:
                    pad = b"\0" * (at - written)
                    data = np.ascontiguousarray(array).tobytes()
                    digest.update(pad)
                    digest.update(data)
                    f.write(pad + data)
                    written = at + len(data)
            pad = b"\0" * (offset - written)
            digest.update(pad)
            f.write(pad + digest.digest())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def encode_rows(rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row (low, scale, uint16 codes) with logit ~= low + scale * code over the row's range."""
    rows = np.asarray(rows, dtype=np.float64)  # the codes are the nearest ones to the float32 decode
    low = rows.min(axis=-1).astype(np.float32)
    scale = ((rows.max(axis=-1) - low) / 65535.0).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0))
    codes = np.clip(np.rint((rows - low[:, None]) / scale[:, None]), 0, 65535).astype(np.uint16)
    return low, scale, codes


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def open_valid(path: Path, need_hidden: bool) -> ReferenceCache | None:
    """The entry at ``path`` if it exists, is intact and holds what is needed; a corrupt one is
    reported (ModelDiffCacheWarning) and removed, so the caller rebuilds it."""
    if not path.exists():
        return None
    try:
        entry = ReferenceCache(path)
    except ModelDiffError as exc:
        warnings.warn(ModelDiffCacheWarning(f"{exc}; rebuilding it"), stacklevel=2)
        path.unlink(missing_ok=True)
        return None
    return entry if entry.has_hidden or not need_hidden else None


def remove_stale(path: Path, model_path: str, model_hash: str) -> list[Path]:
    """Remove other entries of the same reference path written from other model files (the
    model changed since): they can never be used again."""
    removed = []
    for other in path.parent.glob(f"*{SUFFIX}"):
        if other == path:
            continue
        try:
            header = ReferenceCache(other, verify=False).header
        except (ModelDiffError, OSError):
            continue
        if header.get("model_path") == model_path and header.get("model_sha256") != model_hash:
            other.unlink(missing_ok=True)
            removed.append(other)
    if removed:
        warnings.warn(ModelDiffCacheWarning(
            f"{model_path} changed since {', '.join(p.name for p in removed)} was written: stale reference cache "
            "removed"), stacklevel=2)
    return removed


def header_for(runner, model_hash: str, device: str) -> dict:
    """What a cache entry records about the reference that produced it."""
    vocab = runner.vocab()
    return {"model_path": str(Path(runner.path).resolve()), "model_name": runner.name, "model_sha256": model_hash,
            "runner": runner.kind, "quant_type": runner.quant_type(), "device": device,
            "versions": runner.versions(), "vocab": asdict(vocab) if vocab else None, "hparams": runner.hparams()}
