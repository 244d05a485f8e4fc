"""Weight metrics: pure functions over a reference tensor r and a candidate tensor c (d = c - r).

Tensors are compared a chunk of rows at a time, so every metric is computed from additive
moments (``moments``, combined with ``+``) accumulated in float64. numpy only: reading and
comparing weights needs no torch.

    m = moments(r[:1000], c[:1000]) + moments(r[1000:], c[1000:])
    summary(m)["rel"]  # ||d|| / ||r||
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass(frozen=True)
class Moments:
    n: int = 0  # elements
    sum_d2: float = 0.0  # sum d^2
    sum_abs_d: float = 0.0  # sum |d|
    max_abs_d: float = 0.0  # max |d| (NaN if any d is NaN)
    sum_d: float = 0.0  # sum d
    sum_r2: float = 0.0  # sum r^2
    sum_c2: float = 0.0  # sum c^2
    sum_rc: float = 0.0  # sum r c
    changed: int = 0  # elements with c != r (NaN counts as changed)
    nonfinite: int = 0  # NaN/Inf elements of c

    def __add__(self, other: "Moments") -> "Moments":
        values = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        values["max_abs_d"] = max(self.max_abs_d, other.max_abs_d) if not (
            np.isnan(self.max_abs_d) or np.isnan(other.max_abs_d)) else float("nan")
        return Moments(**values)


def moments(ref: np.ndarray, cand: np.ndarray) -> Moments:
    """The additive moments of one chunk (same shape on both sides), in float64."""
    return chunk_stats(np.reshape(ref, (1, -1)), np.reshape(cand, (1, -1)))[0]


def chunk_stats(ref: np.ndarray, cand: np.ndarray) -> tuple[Moments, np.ndarray, np.ndarray, np.ndarray,
                                                              np.ndarray, np.ndarray]:
    """One pass over a chunk of rows (2-D, same shape): its Moments, and per row sum r^2, sum c^2,
    sum d^2, per column sum r^2, sum c^2 (the evidence for permuted or transposed tensors).

    float64 throughout (float32 products would lose the residual of a scaled F32 tensor, 1e-6 of
    its norm, to rounding); the sums of products are einsum loops, so the only temporaries are the
    two float64 copies and d (no r*r arrays: fewer page faults, 2x faster on small chunks)."""
    r = np.asarray(ref, dtype=np.float64)
    c = np.asarray(cand, dtype=np.float64)
    d = c - r
    rows_r, rows_c, rows_d = (np.einsum("ij,ij->i", x, x) for x in (r, c, d))
    m = dict(n=d.size, sum_d2=float(rows_d.sum()), sum_d=float(d.sum()), sum_r2=float(rows_r.sum()),
             sum_c2=float(rows_c.sum()), sum_rc=float(np.einsum("ij,ij->", r, c)),
             nonfinite=int(d.size - np.count_nonzero(np.isfinite(c))))
    cols_r, cols_c = np.einsum("ij,ij->j", r, r), np.einsum("ij,ij->j", c, c)
    abs_d = np.abs(d, out=d)  # d is not needed any more
    m.update(sum_abs_d=float(abs_d.sum()), max_abs_d=float(abs_d.max()) if d.size else 0.0,  # NaN if any d is
             changed=int(np.count_nonzero(abs_d)))  # NaN counts as changed
    return Moments(**m), rows_r, rows_c, rows_d, cols_r, cols_c


def l2(m: Moments) -> float:
    """||d||_2 = sqrt(sum d^2)."""
    return float(np.sqrt(m.sum_d2))


def l1(m: Moments) -> float:
    """||d||_1 = sum |d|."""
    return m.sum_abs_d


def mean_diff(m: Moments) -> float:
    """mean(d) = sum d / n: a shift of the whole tensor (e.g. norm weights stored as 1 + w)."""
    return m.sum_d / m.n if m.n else 0.0


def relative_change(m: Moments) -> float:
    """||d|| / ||r||: 0 for identical tensors, inf when r is all zeros and c is not."""
    if m.sum_d2 == 0:
        return 0.0
    return float(np.sqrt(m.sum_d2 / m.sum_r2)) if m.sum_r2 > 0 else float("inf")


def cosine(m: Moments) -> float:
    """<r, c> / (||r|| ||c||), computed as 1 - (||d||^2 - (||r|| - ||c||)^2) / (2 ||r|| ||c||) so that a
    value within 1e-12 of 1 is not lost to cancellation; 1 when both tensors are all zeros."""
    norm_r, norm_c = np.sqrt(m.sum_r2), np.sqrt(m.sum_c2)
    if norm_r == 0 or norm_c == 0:
        return 1.0 if norm_r == norm_c else 0.0
    return float(1.0 - (m.sum_d2 - (norm_r - norm_c) ** 2) / (2 * norm_r * norm_c))


def sqnr_db(m: Moments) -> float:
    """Signal-to-quantization-noise ratio 10 log10(||r||^2 / ||d||^2), inf for identical tensors."""
    if m.sum_d2 == 0:
        return float("inf")
    return float(10 * np.log10(m.sum_r2 / m.sum_d2)) if m.sum_r2 > 0 else float("-inf")


def changed_fraction(m: Moments) -> float:
    """Fraction of elements with c != r (bit for bit after conversion to float32)."""
    return m.changed / m.n if m.n else 0.0


def gain(m: Moments) -> float:
    """Least-squares scale g = <r, c> / ||r||^2 (c ~ g r): 1.02 for a tensor scaled by 2 %."""
    return m.sum_rc / m.sum_r2 if m.sum_r2 > 0 else float("nan")


def residual_after_gain(m: Moments) -> float:
    """||c - g r|| / ||r|| with g = gain(m): the change a scale cannot explain,
    sqrt(sum c^2 - <r, c>^2 / ||r||^2) / ||r||."""
    if m.sum_r2 <= 0:
        return float("inf")
    return float(np.sqrt(max(0.0, m.sum_c2 - m.sum_rc ** 2 / m.sum_r2) / m.sum_r2))


def residual_after_offset(m: Moments) -> float:
    """||d - mean(d)|| / ||r||: the change a constant shift cannot explain."""
    if m.sum_r2 <= 0 or not m.n:
        return float("inf")
    return float(np.sqrt(max(0.0, m.sum_d2 - m.sum_d ** 2 / m.n) / m.sum_r2))


def summary(m: Moments) -> dict[str, float]:
    """Every per-tensor metric by name (the report's and the JSON's keys)."""
    return {"l2": l2(m), "l1": l1(m), "max_abs": m.max_abs_d, "mean_diff": mean_diff(m), "cos": cosine(m),
            "rel": relative_change(m), "sqnr_db": sqnr_db(m), "changed_fraction": changed_fraction(m),
            "gain": gain(m), "residual_after_gain": residual_after_gain(m),
            "residual_after_offset": residual_after_offset(m), "nonfinite": float(m.nonfinite)}


def norms_rel(a_sq: np.ndarray, b_sq: np.ndarray, sort: bool = False) -> float:
    """|| sqrt(a_sq) - sqrt(b_sq) || / || sqrt(a_sq) || for per-row (or per-column) sums of squares;
    with ``sort``, of the sorted norms: how far two sets of rows are from being the same set. Small
    sorted and large unsorted means the rows were permuted."""
    a, b = np.sqrt(a_sq), np.sqrt(b_sq)
    if a.shape != b.shape:
        return float("inf")
    if sort:
        a, b = np.sort(a), np.sort(b)
    denom = np.linalg.norm(a)
    if denom == 0:
        return 0.0 if not b.any() else float("inf")
    return float(np.linalg.norm(a - b) / denom)
