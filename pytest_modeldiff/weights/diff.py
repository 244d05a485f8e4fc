"""Weight-level diff: every tensor of a candidate checkpoint against the reference's, before (or
without) running either model.

Names are paired as stored when both files use the same naming, else through gguf-py's tensor-name
map (mapping.py), with llama.cpp's rope permutation of Q/K undone and tied output heads resolved.
Each pair is streamed a chunk of rows at a time into additive moments (weightmetrics.py) and per-row
and per-column norms, so memory stays at a few chunks whatever the model size. A tensor whose change
exceeds the usual error of its storage type gets a likely cause ("scaled by 1.02", "rows permuted").

    diff = compare_weights("hf_model", "model-q8_0.gguf")
    for t in diff.worst(5): print(t.name, t.metrics["rel"], t.cause)
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import Keys

from ..errors import ModelDiffError
from ..formats import architectures, mapping
from ..formats.quant_types import TENSOR_TYPE_ERROR, weight_limits
from ..metrics import weights as wm
from .files import TensorMeta, WeightReader, open_weights

UNCHANGED, MODIFIED, ADDED, REMOVED, SHAPE_CHANGED = "unchanged", "modified", "added", "removed", "shape-changed"
WORST_TENSORS = 10  # tensors named in the summary, a failure and the report's "worst" list
# elements per step: 1 MB of float64 per array, so the passes run in cache (2-3x faster than 1 << 20)
CHUNK_ELEMENTS = 1 << 17


@dataclass
class TensorDiff:
    name: str  # GGUF name when the two files name tensors differently, else the stored name
    ref_name: str | None  # as stored in each file; None when absent
    cand_name: str | None
    status: str
    ref_shape: tuple | None = None
    cand_shape: tuple | None = None
    ref_type: str | None = None
    cand_type: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    usual_rel: float = 0.0  # usual relative error of the candidate's storage type (registry)
    note: str = ""  # tied head, made or dropped by the converter, no GGUF name
    expected: bool = False  # an added/removed tensor the converter makes or drops on purpose
    cause: str = ""  # likely cause, for a change beyond the type's usual error

    @property
    def group(self) -> str:
        return mapping.tensor_group(self.name)[0]

    @property
    def layer(self) -> int | None:
        return mapping.tensor_group(self.name)[1]

    @property
    def rel(self) -> float:
        return self.metrics.get("rel", math.nan)

    def to_dict(self) -> dict:
        return {"name": self.name, "ref_name": self.ref_name, "cand_name": self.cand_name, "status": self.status,
                "group": self.group, "layer": self.layer, "ref_shape": self.ref_shape, "cand_shape": self.cand_shape,
                "ref_type": self.ref_type, "cand_type": self.cand_type, "usual_rel": self.usual_rel,
                **self.metrics, "note": self.note or None, "expected": self.expected, "cause": self.cause or None}


@dataclass
class WeightDiff:
    reference: Path
    candidate: Path
    naming: str  # how names were paired
    tensors: list[TensorDiff]
    bytes_read: int = 0
    seconds: float = 0.0

    def by_status(self, status: str) -> list[TensorDiff]:
        return [t for t in self.tensors if t.status == status]

    def compared(self) -> list[TensorDiff]:
        return [t for t in self.tensors if t.metrics]

    def worst(self, n: int = WORST_TENSORS) -> list[TensorDiff]:
        """The n compared tensors with the largest relative change, NaN first."""
        return sorted(self.compared(), key=lambda t: -np.nan_to_num(t.rel, nan=np.inf))[:n]

    def frozen(self) -> list[str]:
        """Tensors identical bit for bit (frozen in a fine-tune, or lossless in a conversion)."""
        return [t.name for t in self.by_status(UNCHANGED)]

    def groups(self) -> dict[str, dict]:
        """Per layer type (embedding, attention, mlp, norm, output, other): tensors, modified, mean and max rel."""
        out: dict[str, dict] = {}
        for t in self.compared():
            g = out.setdefault(t.group, {"tensors": 0, "modified": 0, "rels": []})
            g["tensors"] += 1
            g["modified"] += t.status == MODIFIED
            g["rels"].append(t.rel)
        return {name: {"tensors": g["tensors"], "modified": g["modified"], "mean_rel": float(np.mean(g["rels"])),
                       "max_rel": float(np.max(g["rels"]))} for name, g in out.items()}

    def layers(self) -> dict[int, float]:
        """Mean relative change of each decoder layer's tensors, by layer index."""
        rels: dict[int, list[float]] = {}
        for t in self.compared():
            if t.layer is not None:
                rels.setdefault(t.layer, []).append(t.rel)
        return {layer: float(np.mean(v)) for layer, v in sorted(rels.items())}

    def patterns(self) -> list[str]:
        return change_patterns(self)

    def to_dict(self) -> dict:
        return {"reference": str(self.reference), "candidate": str(self.candidate), "naming": self.naming,
                "bytes_read": self.bytes_read, "seconds": self.seconds, "groups": self.groups(),
                "layers": {str(k): v for k, v in self.layers().items()}, "patterns": self.patterns(),
                "frozen": self.frozen(), "worst": [t.name for t in self.worst()],
                "tensors": [t.to_dict() for t in self.tensors]}


# --------------------------------------------------------------------------- pairing names
class ArchitectureNotMapped(ModelDiffError):
    """The GGUF's architecture is not in formats/architectures.py: its tensors cannot be paired
    with HF's without guessing the converter's transforms (the weights check skips, saying so)."""


@dataclass
class _Side:
    """One file's tensor as the comparison reads it: in HF's row order and values, alias resolved.
    A GGUF tensor paired with an HF one has the converter's transforms undone: rope-permuted rows
    (``head_dim``), a norm stored as offset + w (``offset``); an HF tensor the converter cut keeps
    its first ``rows`` rows."""

    reader: WeightReader
    name: str
    head_dim: int | None = None  # rope-permuted rows to undo (a GGUF tensor paired with an HF one)
    offset: float = 0.0  # subtracted from the stored values (the converter added it)
    rows: int | None = None  # only the first rows compare (the converter dropped the rest)

    @property
    def meta(self) -> TensorMeta:
        meta = self.reader.meta(self.name)
        if self.rows is None:
            return meta
        return TensorMeta(meta.name, (min(self.rows, meta.shape[0]), *meta.shape[1:]), meta.type_name)

    def read(self, start: int, stop: int) -> np.ndarray:
        rows = self.reader.read(self.name, start, stop)
        if self.head_dim:
            rows = mapping.rope_rows_to_hf(rows, self.head_dim)
        return rows - np.float32(self.offset) if self.offset else rows


@dataclass
class _ExpertSide:
    """HF's per-expert tensors as the one 3-D tensor the converter stacks them into (expert
    order on the first axis), or one half of a fused (E, 2 n_ff, n_embd) gate_up tensor."""

    reader: WeightReader
    name: str  # the merged HF name the tensor map knows
    parts: list[str]  # per-expert tensor names in expert order, or [the fused tensor]
    half: int | None = None  # fused gate_up: 0 = gate (first half of axis 1), 1 = up
    head_dim = None
    offset = 0.0

    @property
    def meta(self) -> TensorMeta:
        first = self.reader.meta(self.parts[0])
        if self.half is None:
            return TensorMeta(self.name, (len(self.parts), *first.shape), first.type_name)
        return TensorMeta(self.name, (first.shape[0], first.shape[1] // 2, *first.shape[2:]), first.type_name)

    def read(self, start: int, stop: int) -> np.ndarray:
        if self.half is None:
            return np.stack([self.reader.read(name) for name in self.parts[start:stop]])
        rows = self.reader.read(self.parts[0], start, stop)
        n = rows.shape[1] // 2
        return rows[:, :n] if self.half == 0 else rows[:, n:]


def _merge_experts(names: list[str]) -> tuple[list[str], dict[str, tuple[list[str], int | None]]]:
    """HF names with each expert group replaced by its merged name, and merged name -> (parts, half)."""
    groups: dict[str, dict[int, str]] = {}
    merged: dict[str, tuple[list[str], int | None]] = {}
    out = []
    for name in names:
        parts = architectures.expert_parts(name)
        fused = architectures.fused_gate_up(name)
        if parts is not None:
            if parts[0] not in groups:
                groups[parts[0]] = {}
                out.append(parts[0])
            groups[parts[0]][parts[1]] = name
        elif fused is not None:
            for half, merged_name in enumerate(fused):
                merged[merged_name] = ([name], half)
                out.append(merged_name)
        else:
            out.append(name)
    for merged_name, by_index in groups.items():
        if sorted(by_index) == list(range(len(by_index))):
            merged[merged_name] = ([by_index[i] for i in range(len(by_index))], None)
        else:  # a gap in the expert numbers: compare them one by one (and report them unpaired)
            out.remove(merged_name)
            out.extend(by_index.values())
    return out, merged


def pair_tensors(ref: WeightReader,
                 cand: WeightReader) -> tuple[str, list[tuple[str, _Side | _ExpertSide | None,
                                                             _Side | _ExpertSide | None, str]]]:
    """(how names were paired, [(name, reference side, candidate side, note)]) in the reference's
    order, then the candidate's own tensors. A GGUF paired with an HF checkpoint needs its
    architecture in formats/architectures.py (else ArchitectureNotMapped)."""
    naming = "names as stored"
    key_of = {"ref": {n: (n, "") for n in [*ref.tensors, *ref.aliases]},
              "cand": {n: (n, "") for n in [*cand.tensors, *cand.aliases]}}
    gguf_side, entry, merged = None, None, {}
    if ref.naming != cand.naming:
        gguf_side, hf_role = (cand, "ref") if cand.naming == "gguf" else (ref, "cand")
        arch = gguf_side.config.get(Keys.General.ARCHITECTURE, "")
        entry = architectures.architecture(arch)
        if entry is None:
            raise ArchitectureNotMapped(architectures.not_mapped(arch, "weights"))
        n_layers = int(gguf_side.config.get(Keys.LLM.BLOCK_COUNT.format(arch=arch), 0))
        naming = f"HF names mapped to GGUF names by gguf-py's tensor map (arch {arch})"
        names, merged = _merge_experts(list(key_of[hf_role]))
        key_of[hf_role] = {}
        for name in names:
            mapped = mapping.gguf_tensor_name(arch, n_layers, name)
            if mapped and name in merged and not mapped.endswith((".weight", ".bias")):
                mapped += ".weight"
            key_of[hf_role][name] = (mapped, "") if mapped else (name, f"gguf-py has no GGUF name for it (arch {arch})")

    def side(reader: WeightReader, name: str, other: str | None):
        if reader is gguf_side:
            arch, n_head, n_head_kv = _gguf_heads(reader)
            head_dim = mapping.rope_head_dim(arch, name, reader.meta(name).shape[0], n_head, n_head_kv)
            return _Side(reader, name, head_dim, entry.undo_norm_offset(name))
        if name in merged:
            parts, half = merged[name]
            return _ExpertSide(reader, name, parts, half)
        if (gguf_side is not None and entry.vocab_truncated and other == "token_embd.weight"
                and other in gguf_side.tensors):
            return _Side(reader, name, rows=gguf_side.tensors[other].shape[0])
        return _Side(reader, name)

    def index(role: str, reader: WeightReader) -> dict[str, tuple[str, bool, str]]:
        out = {}
        for name, (key, note) in key_of[role].items():
            out.setdefault(key, (name, name in reader.aliases, note))
        return out

    refs, cands = index("ref", ref), index("cand", cand)
    pairs = []
    for key in dict.fromkeys([*refs, *cands]):
        r, c = refs.get(key), cands.get(key)
        r_real, c_real = r is not None and not r[1], c is not None and not c[1]
        if not (r_real or c_real):
            continue  # tied on both sides, or a tie the other side has no tensor for
        notes = [n for n in (r and r[2], c and c[2]) if n]
        if r_real and c is not None and c[1]:
            notes.append(f"the candidate ties it to {cand.aliases[c[0]]}")
        if c_real and r is not None and r[1]:
            notes.append(f"the reference ties it to {ref.aliases[r[0]]}")
        r_side = side(ref, r[0], c and c[0]) if r else None
        c_side = side(cand, c[0], r and r[0]) if c else None
        for s, other in ((r_side, c_side), (c_side, r_side)):
            if isinstance(s, _Side) and s.rows is not None and other is not None and s.rows < s.reader.meta(
                    s.name).shape[0]:
                notes.append(f"rows beyond the tokenizer's {s.rows} cut by the converter ({entry.name})")
            if isinstance(s, _ExpertSide):
                notes.append(f"{len(s.parts)} per-expert tensors stacked as the converter does" if s.half is None
                             else f"{'gate' if s.half == 0 else 'up'} half of the fused {s.parts[0]}")
            if getattr(s, "offset", 0.0):
                notes.append(f"stored as {s.offset:g} + w ({entry.name}): {s.offset:g} subtracted")
        pairs.append((key, r_side, c_side, "; ".join(notes)))
    return naming, pairs


def _gguf_heads(reader: WeightReader) -> tuple[str, int, int]:
    """(architecture, attention heads, KV heads) from a GGUF's metadata."""
    meta = reader.config
    arch = meta.get(Keys.General.ARCHITECTURE, "")

    def count(key: str, default: int) -> int:
        """A head count; per-layer arrays (llama.cpp allows them) count by their largest layer."""
        value = mapping._coerce(meta.get(key, default), int)
        value = max((v for v in value if isinstance(v, int)), default=0) if isinstance(value, list) else value
        return value if isinstance(value, int) and value > 0 else default

    n_head = count(Keys.Attention.HEAD_COUNT.format(arch=arch), 0)
    return arch, n_head, count(Keys.Attention.HEAD_COUNT_KV.format(arch=arch), n_head)


# --------------------------------------------------------------------------- comparing
def compare_weights(reference: str | Path, candidate: str | Path, progress: Callable[[str], None] | None = None,
                    chunk_elements: int = CHUNK_ELEMENTS) -> WeightDiff:
    """Every tensor of ``candidate`` against ``reference`` (any two files open_weights reads)."""
    progress = progress or (lambda message: None)
    ref, cand = open_weights(reference), open_weights(candidate)
    naming, pairs = pair_tensors(ref, cand)
    diff = WeightDiff(Path(reference), Path(candidate), naming, [])
    started = time.monotonic()
    total = sum(s.meta.n_elements for _, s, c, _ in pairs if s and c) or 1
    done = 0
    try:
        for i, (name, r, c, note) in enumerate(pairs):
            diff.tensors.append(_compare_pair(name, r, c, note, chunk_elements))
            if r and c:
                done += r.meta.n_elements
                diff.bytes_read += r.meta.n_bytes + c.meta.n_bytes
            elapsed = time.monotonic() - started
            progress(f"weights {Path(candidate).name}: {i + 1}/{len(pairs)} tensors ({done / total:.0%} of the "
                     f"elements, ~{elapsed / max(done, 1) * (total - done):.0f} s left)")
            ref.release()
            cand.release()
    finally:
        ref.release()
        cand.release()
    diff.seconds = time.monotonic() - started
    return diff


def _compare_pair(name: str, r: _Side | None, c: _Side | None, note: str, chunk_elements: int) -> TensorDiff:
    t = TensorDiff(name, r and r.name, c and c.name, MODIFIED, r and r.meta.shape, c and c.meta.shape,
                   r and r.meta.type_name, c and c.meta.type_name, note=note)
    if c is None:
        t.status, t.expected = REMOVED, r.name.endswith(mapping.DROPPED_BY_CONVERTER)  # the stored HF name
        t.cause = ("dropped by llama.cpp's converter (a buffer, not a weight)" if t.expected
                   else "missing in the candidate")
        return t
    if r is None:
        t.status, t.expected = ADDED, name in mapping.MADE_BY_CONVERTER
        t.cause = "made by llama.cpp's converter from the config" if t.expected else "not in the reference"
        return t
    if t.ref_shape != t.cand_shape:
        t.status, t.cause = SHAPE_CHANGED, _shape_cause(t.ref_shape, t.cand_shape)
        return t
    limits = weight_limits(t.ref_type, t.cand_type)
    t.usual_rel = limits.usual
    stats = _stream(r, c, chunk_elements)
    t.metrics = wm.summary(stats.moments)
    t.status = UNCHANGED if stats.moments.changed == 0 else MODIFIED
    if not limits.passes(t.metrics):
        t.cause = _likely_cause(t, stats, r, c, limits)
    return t


@dataclass
class _Stats:
    moments: wm.Moments
    row_sq: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # per row: sum r^2, sum c^2, sum d^2
    col_sq: tuple[np.ndarray, np.ndarray] | None  # per column: sum r^2, sum c^2


def _stream(r: _Side, c: _Side, chunk_elements: int) -> _Stats:
    shape = r.meta.shape
    n_rows = shape[0] if shape else 1
    per_row = max(1, int(np.prod(shape[1:], dtype=np.int64))) if len(shape) > 1 else 1
    multiple = math.lcm(r.head_dim or 1, c.head_dim or 1)
    step = max(1, chunk_elements // per_row)
    step = -(-step // multiple) * multiple
    total = wm.Moments()
    matrix = len(shape) > 1
    rows_r, rows_c, rows_d = (np.zeros(n_rows) for _ in range(3)) if matrix else (None, None, None)
    cols_r, cols_c = (np.zeros(per_row) for _ in range(2)) if matrix else (None, None)
    for start in range(0, n_rows, step):
        stop = min(n_rows, start + step)
        a, b = r.read(start, stop), c.read(start, stop)
        shape2d = (stop - start, -1) if matrix else (1, -1)  # a 1-D tensor is one row
        m, *sums = wm.chunk_stats(a.reshape(shape2d), b.reshape(shape2d))
        total = total + m
        if matrix:
            rows_r[start:stop], rows_c[start:stop], rows_d[start:stop] = sums[:3]
            cols_r += sums[3]
            cols_c += sums[4]
    return _Stats(total, (rows_r, rows_c, rows_d) if matrix else None, (cols_r, cols_c) if matrix else None)


# --------------------------------------------------------------------------- likely causes
def _shape_cause(ref_shape: tuple, cand_shape: tuple) -> str:
    if tuple(reversed(ref_shape)) == tuple(cand_shape):
        return f"transposed: {ref_shape} -> {cand_shape}"
    if len(ref_shape) == len(cand_shape) and ref_shape[1:] == cand_shape[1:]:
        return (f"{cand_shape[0] - ref_shape[0]:+d} rows ({ref_shape[0]} -> {cand_shape[0]}): a resized vocabulary "
                "or a different head count")
    return f"shape {ref_shape} -> {cand_shape}"


def _likely_cause(t: TensorDiff, stats: _Stats, r: _Side, c: _Side, limits) -> str:
    """The first explanation that fits, from the cheapest evidence (moments, row and column norms)
    to re-reading the tensor in another row order (Q/K only)."""
    m, mt = stats.moments, t.metrics
    tolerance = limits.rel
    if m.nonfinite:
        return f"{m.nonfinite} NaN/Inf values"
    if m.sum_c2 == 0:
        return "all zeros (the data was never written?)"
    if mt["residual_after_gain"] <= tolerance:
        g = mt["gain"]
        return "negated (sign flipped)" if g < 0 else f"scaled by {g:.4g}"
    if mt["residual_after_offset"] <= tolerance:
        return _offset_cause(mt["mean_diff"], r, c)
    if stats.row_sq is not None:
        rows_r, rows_c, rows_d = stats.row_sq
        cols_r, cols_c = stats.col_sq
        order = _rope_order(t, r, c, tolerance)
        if order:
            return order
        def same(a, b, sort=False):
            return wm.norms_rel(a, b, sort) <= tolerance

        if same(rows_r, rows_c, sort=True) and same(cols_r, cols_c) and not same(rows_r, rows_c):
            moved = int(np.count_nonzero(rows_d > (tolerance ** 2) * np.maximum(rows_r, 1e-30)))
            return f"rows permuted ({moved} of {len(rows_r)} rows moved)"
        if same(cols_r, cols_c, sort=True) and same(rows_r, rows_c) and not same(cols_r, cols_c):
            return "columns permuted"
        if len(rows_r) == len(cols_r) and same(rows_r, cols_c) and same(cols_r, rows_c):
            return "transposed (a square matrix stored the other way round)"
        if same(rows_r, rows_c, sort=True) and same(cols_r, cols_c, sort=True):
            return "rows and columns permuted"
        top = np.argsort(-rows_d, kind="stable")
        k = int(np.searchsorted(np.cumsum(rows_d[top]), 0.9 * rows_d.sum())) + 1
        if k <= max(1, len(rows_d) // 20):
            return f"{k} of {len(rows_d)} rows carry 90 % of the change (worst rows: {', '.join(map(str, top[:3]))})"
    like = _resembles(t.rel, limits.usual) if mt["changed_fraction"] > 0.5 else ""  # rounding moves most values
    if like:
        return f"an error like {like}'s rounding: the values went through {like}"
    factor = t.rel / t.usual_rel if t.usual_rel else math.inf
    return (f"{factor:.3g}x the usual {t.cand_type} error: different or corrupted data" if math.isfinite(factor)
            else f"changed, while {t.cand_type} stores {t.ref_type} exactly: different or corrupted data")


def _offset_cause(shift: float, r, c) -> str:
    """A constant shift, read against the architecture's norm convention (architectures.py)."""
    offset = next((s.offset for s in (c, r) if s.offset), 0.0)
    text = f"offset by {shift:+.4g}"
    if offset and abs(abs(shift) - offset) <= 1e-3 * offset:
        gguf = next(s for s in (c, r) if s.offset)
        missing = (shift < 0) == (gguf is c)  # the GGUF's values, with the converter's offset taken off, are low
        return (f"{text}: the norm is stored as w, without the converter's +{offset:g} (this architecture stores "
                f"{offset:g} + w and llama.cpp uses it as stored)" if missing
                else f"{text}: the converter's +{offset:g} was applied twice")
    return f"{text} (e.g. a norm stored as 1 + w, Gemma's convention)" if abs(abs(shift) - 1.0) <= 1e-3 else text


def _resembles(rel: float, usual: float) -> str:
    """A coarser storage type whose usual error is within 1.5x of ``rel``, if any."""
    for type_name, error in sorted(TENSOR_TYPE_ERROR.items(), key=lambda item: item[1]):
        if error > usual and error / 1.5 <= rel <= error * 1.5:
            return type_name
    return ""


def _rope_order(t: TensorDiff, r: _Side, c: _Side, tolerance: float) -> str:
    """Q/K rows in the other rope layout: the converter's permutation missing or applied twice."""
    gguf = next((side.reader for side in (c, r) if side.reader.naming == "gguf"), None)
    if gguf is None or not t.name.endswith(mapping.ROPE_PERMUTED):
        return ""
    arch, n_head, n_head_kv = _gguf_heads(gguf)
    n = n_head if ".attn_q." in t.name else n_head_kv
    head_dim = t.ref_shape[0] // n if n else 0
    if head_dim < 2 or head_dim % 2 or head_dim * n != t.ref_shape[0]:
        return ""
    a, b = r.read(0, r.meta.shape[0]), c.read(0, c.meta.shape[0])
    if mapping.rope_head_dim(arch, t.name, t.ref_shape[0], n_head, n_head_kv) is None:  # kept in HF's order
        fixes = ((mapping.rope_rows_to_hf, f"Q/K rows permuted for rope (LlamaModel.permute) in {arch}, whose "
                                           "converter keeps HF's row order"),
                 (mapping.rope_rows_to_gguf, "Q/K rows in the other rope order"))
    else:
        fixes = ((mapping.rope_rows_to_gguf, "Q/K rows not permuted for rope (llama.cpp's LlamaModel.permute "
                                             "was not applied)"),
                 (mapping.rope_rows_to_hf, "Q/K rows permuted for rope twice"))
    for fix, text in fixes:
        if wm.relative_change(wm.moments(a, fix(b, head_dim))) <= tolerance:
            return text
    return ""


# --------------------------------------------------------------------------- patterns
def change_patterns(diff: WeightDiff) -> list[str]:
    """Where the change sits, in words (fine-tune vs base, or a conversion): uniform, gradient,
    inverse gradient, focused, sparse, attention-/MLP-/embedding-heavy, identical."""
    compared = diff.compared()
    if not compared:
        return []
    if all(t.status == UNCHANGED for t in compared):
        return ["identical: every compared tensor is bit-for-bit equal"]
    out = []
    per_layer = diff.layers()
    values = np.array(list(per_layer.values()))
    if len(values) >= 3 and values.max() > 0:
        median = float(np.median(values))
        hot = [layer for layer, v in per_layer.items() if v > 3 * median]
        ranks = np.argsort(np.argsort(values))
        rho = float(np.corrcoef(np.arange(len(values)), ranks)[0, 1]) if values.std() > 0 else 0.0
        if hot and len(hot) <= max(1, len(values) // 4):
            out.append(f"focused: layer(s) {', '.join(map(str, hot))} changed over 3x the median layer")
        elif values.std() <= 0.25 * values.mean():
            out.append("uniform: every layer changed about as much")
        elif rho >= 0.8:
            out.append("gradient: the change grows with depth")
        elif rho <= -0.8:
            out.append("inverse gradient: the change shrinks with depth")
    modified = [t for t in compared if t.status == MODIFIED]
    fraction = float(np.mean([t.metrics["changed_fraction"] for t in modified])) if modified else 0.0
    if modified and fraction < 0.1:
        out.append(f"sparse: {fraction:.1%} of the elements of modified tensors changed")
    groups = diff.groups()
    attention, mlp = groups.get("attention", {}).get("mean_rel", 0.0), groups.get("mlp", {}).get("mean_rel", 0.0)
    if attention > 2 * mlp:
        out.append("attention-heavy: attention tensors changed over 2x the MLP's")
    elif mlp > 2 * attention:
        out.append("MLP-heavy: MLP tensors changed over 2x attention's")
    embedding = max(groups.get(g, {}).get("mean_rel", 0.0) for g in ("embedding", "output"))
    if embedding > 2 * max(attention, mlp):
        out.append("embedding-heavy: embedding/output changed over 2x the decoder blocks")
    return out
