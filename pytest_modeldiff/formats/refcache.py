"""The reference's outputs on disk: computed once per (model files' content, runtime, token ids),
reused by the next run and by concurrent pytest-xdist workers, and usable as ``--ref-model`` on
a machine without the reference model (like llama-perplexity's --kl-divergence-base file).

File (``<reference name>-<key>.mdref``): MAGIC, uint64 header length, a JSON header (what was
run, on which ids, vocabulary and hyper-parameters, where each array lies), the arrays, and the
sha256 of everything before it (v1 covered only the arrays: a damaged header - a sequence's
offset - went unnoticed and blamed the candidate). Per sequence it keeps the logits from the
first compared position to the end, each row as uint16 codes over its own range: logit = low +
scale * code, scale = (max - low) / 65535 (llama-perplexity's base file does the same over a
fixed 16-nat window of log probabilities, clamping below it; a row's own range clamps nothing,
so raw logits - max |diff|, NMSE - survive too). The error is uniform, at most scale / 2
(~1.5e-4 for a 20-logit range): the KLD of a reference against its own cache is ~1e-8
(tests/unit/formats/test_refcache.py measures it; README). Hidden states, when captured, are float16 (rfn
floor ~2e-4), each state divided by a power of two (``hidden_scale``) that keeps it inside float16's
range: Gemma's residual stream exceeds 65504, which plain float16 turns into inf.

Writes go to a temporary file renamed into place (atomic.py); a reader that finds a bad magic,
header field, size or checksum raises ModelDiffError naming the file (and nothing else), and the
caller warns and rebuilds it; a v1 file is rebuilt the same way.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import warnings
from dataclasses import fields
from pathlib import Path

import numpy as np

from ..errors import ModelDiffCacheWarning, ModelDiffError
from .atomic import atomic_open
from .cache import CACHE_DIR
from .fields import is_int, short

MAGIC = b"MDREF\x00v2"
SUFFIX = ".mdref"
FORMAT = "pytest-modeldiff reference cache v2"
ALIGN = 64



def reference_cache_dir(option: str | None) -> Path | None:
    """--modeldiff-ref-cache, else $MODELDIFF_REF_CACHE, else CACHE_DIR/reference; "none": off."""
    value = option or os.environ.get("MODELDIFF_REF_CACHE") or str(CACHE_DIR / "reference")
    return None if value.strip().lower() == "none" else Path(value).expanduser()


def cache_path(directory: Path, runner, sequences, device: str) -> tuple[Path, str]:
    """The entry for this reference, runtime and token ids; and the model files' hash. The key holds
    no path or time, only contents (the files' sha256, the ids) and what computed them, so an entry
    made on another machine is found wherever the model lies there and whatever its folder's name:
    an entry with the key under another name (``<name>-<key>``) is used as it is."""
    from .cache import files_sha256

    model_hash = files_sha256(runner.files())
    key = hashlib.sha256(json.dumps({
        "model": model_hash, "runner": runner.kind, "versions": runner.versions(), "device": device,
        "dtype": runner.compute_dtype() and runner.compute_dtype()[0],
        "sequences": [[list(map(int, s.ids)), s.scored] for s in sequences]}).encode()).hexdigest()
    path = Path(directory) / f"{runner.name}-{key[:16]}{SUFFIX}"
    if not path.exists():
        path = next(iter(sorted(Path(directory).glob(f"*-{key[:16]}{SUFFIX}"))), path)
    return path, model_hash


class ReferenceCache:
    """A cache file opened for reading (arrays memory-mapped, checksum verified on open)."""

    def __init__(self, path: Path, verify: bool = True):
        self.path = Path(path)
        try:
            self._open(verify)
        except ModelDiffError:
            raise
        except (OSError, ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError,
                MemoryError, struct.error) as exc:  # a safety net: _open checks each field first
            why = f"{type(exc).__name__}: {exc}"
            raise ModelDiffError(f"{self.path}: unreadable reference cache ({why})") from None

    def _open(self, verify: bool) -> None:
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            magic = f.read(8)
            if magic != MAGIC:
                raise ModelDiffError(f"{self.path}: {_describe_magic(magic)}")
            if size < 16 + 32:
                raise ModelDiffError(f"{self.path}: truncated reference cache ({size} bytes)")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 16:
                raise ModelDiffError(f"{self.path}: truncated reference cache ({size} bytes, header of {n})")
            self.header = _parse_header(self.path, f.read(n), size)
        start, data_bytes = self.header["data_offset"], self.header["data_bytes"]
        if data_bytes:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r", offset=start, shape=(data_bytes,))
        else:
            self._data = np.zeros(0, np.uint8)
        if verify:
            self._verify(start, data_bytes)

    def _verify(self, start: int, data_bytes: int) -> None:
        """The sha256 trailer covers everything before it: magic, header length, header, data."""
        digest = hashlib.sha256()
        with open(self.path, "rb") as f:
            digest.update(f.read(start))
            digest.update(self._data)
            f.seek(start + data_bytes)
            stored = f.read(32)
        if digest.digest() != stored:
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
        states = self._array(s["hidden_offset"], np.float16, tuple(s["hidden_shape"])).astype(np.float32)
        return states * np.asarray(s["hidden_scale"], np.float32).reshape(-1, *[1] * (states.ndim - 1))


def _describe_magic(magic: bytes) -> str:
    if magic[:7] == MAGIC[:7]:  # b"MDREF\0v" + version
        found, expected = magic[6:].decode("ascii", "replace"), MAGIC[6:].decode()
        return f"reference cache format {found} (another pytest-modeldiff version), expected {expected}"
    return f"not a pytest-modeldiff reference cache (magic {magic!r})"


def _parse_header(path: Path, raw: bytes, file_size: int) -> dict:
    """The JSON header, every field the reader uses checked, so that a damaged header is a named
    error here and never a wrong array or an exception later."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # ValueError: bad UTF-8 or JSON
        raise ModelDiffError(f"{path}: unreadable reference cache header ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise ModelDiffError(f"{path}: reference cache header is not a JSON object")
    if header.get("format") != FORMAT:
        found = short(header.get("format"))
        raise ModelDiffError(f"{path}: reference cache format {found}, expected {FORMAT!r}")
    start, data_bytes = header.get("data_offset"), header.get("data_bytes")
    if not (is_int(start, 16 + len(raw)) and is_int(data_bytes, 0)):
        raise ModelDiffError(f"{path}: bad reference cache header: data_offset {short(start)} and data_bytes "
                             f"{short(data_bytes)}, expected integers placing the data after the header")
    expected = start + data_bytes + 32
    if file_size != expected:
        what = "truncated reference cache" if file_size < expected else "reference cache too long"
        raise ModelDiffError(f"{path}: {what} ({file_size} bytes, expected {expected})")
    problem = _sequences_problem(header, data_bytes)
    if problem:
        raise ModelDiffError(f"{path}: bad reference cache header: {problem}")
    return header


def _sequences_problem(header: dict, data_bytes: int) -> str | None:
    """What is wrong with n_vocab or the sequences' fields and array places, None if nothing."""
    n_vocab, sequences = header.get("n_vocab"), header.get("sequences")
    if not is_int(n_vocab, 1):
        return f"n_vocab {short(n_vocab)}, expected a positive integer"
    if not isinstance(sequences, list) or not sequences:
        return "sequences is not a non-empty list"
    for i, s in enumerate(sequences):
        problem = _sequence_problem(s, n_vocab, data_bytes)
        if problem:
            return f"sequence {i}: {problem}"
    return None


def _sequence_problem(s, n_vocab: int, data_bytes: int) -> str | None:
    if not isinstance(s, dict):
        return "not a JSON object"
    ids, first, scored = s.get("ids"), s.get("first"), s.get("scored", "missing")
    if not isinstance(ids, list) or not ids or not all(is_int(t, 0) for t in ids):
        return "ids is not a non-empty list of token ids"
    if not (isinstance(s.get("text", 0), (str, type(None))) and isinstance(s.get("label"), str)):
        return "text (a string or null) or label (a string) missing or of another type"
    if not (scored is None or isinstance(scored, list) and len(scored) == 2 and is_int(scored[0], 0)
            and is_int(scored[1], scored[0]) and scored[1] <= len(ids)):
        return f"scored {short(scored)}, expected null or [start, stop] within the ids"
    if not (is_int(first, 0) and first <= len(ids)):
        return f"first {short(first)}, expected a position within the ids"
    rows = len(ids) - first
    arrays = [("range_offset", 8 * rows), ("logits_offset", 2 * rows * n_vocab)]
    shape = s.get("hidden_shape")
    if shape:
        if not isinstance(shape, list) or not all(is_int(d, 0) for d in shape):
            return f"hidden_shape {short(shape)}, expected a list of sizes"
        arrays.append(("hidden_offset", 2 * math.prod(shape)))
        scale = s.get("hidden_scale")  # entries written before it held float16 overflow (inf): rebuilt
        if not (isinstance(scale, list) and len(scale) == shape[0] and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in scale)):
            return f"hidden_scale {short(scale)}, expected one positive number per state"
    for field, nbytes in arrays:
        offset = s.get(field)
        if not (is_int(offset, 0) and offset + nbytes <= data_bytes):
            return f"{field} {short(offset)}, expected an integer placing {nbytes} bytes within the data"
    return None


def write_cache(path: Path, header: dict, sequences, logits_of, hidden_of=None) -> None:
    """Write the reference's outputs atomically: header, arrays, checksum. ``logits_of(i)`` gives
    sequence i's logits from its first compared position to its end, ``hidden_of(i)`` its hidden
    states; both are asked twice (layout, then data), so they should be cheap views."""
    seq_meta, data_bytes, n_vocab = _layout(sequences, logits_of, hidden_of)
    head = _head(header, seq_meta, n_vocab, data_bytes)
    digest = hashlib.sha256(head)
    with atomic_open(path) as f:
        f.write(head)
        written = 0
        for i, entry in enumerate(seq_meta):
            for at, array in _arrays(entry, logits_of(i), hidden_of(i) if "hidden_shape" in entry else None):
                data = np.ascontiguousarray(array).tobytes()
                for chunk in (b"\0" * (at - written), data):
                    digest.update(chunk)
                    f.write(chunk)
                written = at + len(data)
        pad = b"\0" * (data_bytes - written)
        digest.update(pad)
        f.write(pad + digest.digest())


def _layout(sequences, logits_of, hidden_of) -> tuple[list[dict], int, int]:
    """Per sequence its header entry (ids, text, arrays' offsets); the data's size; n_vocab."""
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
            entry["hidden_scale"] = hidden_scale(hidden).tolist()
            entry["hidden_offset"], offset = offset, _aligned(offset + 2 * hidden.size)
        seq_meta.append(entry)
        n_vocab = rows.shape[-1]
    return seq_meta, offset, n_vocab


def _head(header: dict, seq_meta: list[dict], n_vocab: int, data_bytes: int) -> bytes:
    """MAGIC, the header's length, the header, zeros up to the data (data_offset)."""
    body = {**header, "format": FORMAT, "n_vocab": n_vocab, "sequences": seq_meta, "data_bytes": data_bytes,
            "precision": "logits: uint16 codes over each row's range (error <= range / 131070); hidden states: float16"}
    text = json.dumps(body).encode()
    body["data_offset"] = _aligned(16 + len(text) + 64)  # room for the offset's own digits
    text = json.dumps(body).encode()
    head = MAGIC + struct.pack("<Q", len(text)) + text
    return head + b"\0" * (body["data_offset"] - len(head))


def _arrays(entry: dict, rows, hidden) -> list[tuple[int, np.ndarray]]:
    """(offset in the data, array) of one sequence, in file order."""
    low, scale, codes = encode_rows(rows)
    parts = [(entry["range_offset"], np.stack([low, scale])), (entry["logits_offset"], codes)]
    if hidden is not None:
        scale = np.asarray(entry["hidden_scale"], np.float32).reshape(-1, *[1] * (np.ndim(hidden) - 1))
        parts.append((entry["hidden_offset"], (np.asarray(hidden, np.float32) / scale).astype(np.float16)))
    return parts


FLOAT16_ROOM = 32768.0  # largest magnitude a state is scaled down to (float16's maximum is 65504)


def hidden_scale(hidden) -> np.ndarray:
    """Per state the power of two that brings its largest magnitude within FLOAT16_ROOM (1 when it
    fits): a power of two keeps float16's relative precision, so the rfn floor does not change."""
    hidden = np.asarray(hidden, np.float32)
    peak = np.abs(hidden.reshape(len(hidden), -1)).max(axis=1) if hidden.size else np.zeros(len(hidden))
    peak = np.where(np.isfinite(peak), peak, 0.0)
    return np.exp2(np.maximum(0.0, np.ceil(np.log2(np.maximum(peak, 1e-30) / FLOAT16_ROOM))))


ENCODE_ROWS = 16  # rows per step: the float64 temporaries stay in cache (elementwise: same codes)


def encode_rows(rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row (low, scale, uint16 codes) with logit ~= low + scale * code over the row's range."""
    if len(rows) > ENCODE_ROWS:
        parts = [_encode(rows[i:i + ENCODE_ROWS]) for i in range(0, len(rows), ENCODE_ROWS)]
        return tuple(np.concatenate(x) for x in zip(*parts))
    return _encode(rows)


def _encode(rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
            if header.get("model_path") == model_path and header.get("model_sha256") != model_hash:
                other.unlink(missing_ok=True)
                removed.append(other)
        except (ModelDiffError, OSError):  # unreadable (its own run rebuilds it) or not ours to remove
            continue
    if removed:
        warnings.warn(ModelDiffCacheWarning(
            f"{model_path} changed since {', '.join(p.name for p in removed)} was written: stale reference cache "
            "removed"), stacklevel=2)
    return removed


def header_for(runner, model_hash: str, device: str) -> dict:
    """What a cache entry records about the reference that produced it."""
    vocab = runner.vocab()
    return {"model_path": str(Path(runner.path).resolve()), "model_name": runner.name, "model_sha256": model_hash,
            "runner": runner.kind, "quant_type": runner.quant_type(), "type": runner.type_label(), "device": device,
            "compute_dtype": runner.compute_dtype() and runner.compute_dtype()[0],
            "versions": runner.versions(), "vocab": _as_dict(vocab) if vocab else None, "hparams": runner.hparams()}


def _as_dict(vocab) -> dict:
    """asdict without its deep copy of every token string (0.2-0.5 s for a 49k vocabulary):
    the fields are lists, dicts and scalars, which json writes as they are."""
    return {f.name: getattr(vocab, f.name) for f in fields(vocab)}
