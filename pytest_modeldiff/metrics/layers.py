"""Layer alignment and per-layer statistics: where along the network two models part ways.

Every runner reports hidden states in one canonical layout, shape (n_states, n_tokens, n_embd),
float32, one entry per layer boundary:

    index 0        "embd"     token embeddings (input of decoder layer 0)
    index i + 1    "<i>"      output of decoder layer i (the residual stream), i = 0 .. L-1
    index L + 1    "norm"     output of the final norm (input of the output head)

transformers: hidden_states[0] is the embedding and [i + 1] layer i's output for i < L - 1, but its
last entry is the *normed* output of layer L - 1, so layer outputs and the norm are taken with
forward hooks. llama.cpp: graph tensors "embd", "l_out-<i>", "result_norm" (eval callback).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelDiffError
from . import logits as metrics

# Per-layer states are named by decoder layer index plus these two.
EMBD, NORM = "embd", "norm"


def state_names(n_layers: int) -> list[str]:
    return [EMBD, *map(str, range(n_layers)), NORM]


def describe(name: str) -> str:
    return {EMBD: "embedding", NORM: "final norm"}.get(name, f"layer {name}")


def align(ref: tuple[int, int], cand: tuple[int, int], ref_path, cand_path) -> None:
    """The two models' states must pair up one to one: same (decoder layers, width)."""
    if ref != cand:
        raise ModelDiffError(
            f"cannot align layers: {ref_path} has {ref[0]} decoder layers of width {ref[1]}, "
            f"{cand_path} has {cand[0]} of width {cand[1]}; per-layer comparison needs the "
            "same architecture (run with --modeldiff-checks without 'layers' to compare logits only)")


def check_keep(keep: int, n_layers: int) -> None:
    if keep > n_layers:
        raise ModelDiffError(f"--modeldiff-keep-layers {keep}: the models have only {n_layers} decoder layers")


def depth(states: np.ndarray) -> tuple[int, int]:
    """(decoder layers, width) of a canonical (n_states, n_tokens, n_embd) array."""
    return states.shape[0] - 2, states.shape[2]


@dataclass
class LayerStats:
    """Per-state errors of one candidate, per sequence (rows) and pooled."""

    names: list[str]
    rfn: np.ndarray  # (n_seq, n_states): ||h_cand - h_ref||_F / ||h_ref||_F per sequence
    cos_err: np.ndarray  # (n_seq, n_states): 1 - mean token cosine
    sq_diff: np.ndarray  # (n_states,) pooled over sequences, for SQNR
    sq_ref: np.ndarray
    isolated_rfn: np.ndarray | None = None  # (n_seq, n_states): layer fed the reference's input
    isolated_source: str = ""  # who ran the isolated pass: "" (the candidate's own runner) or "gguf-torch"
    kept: int = 0  # --modeldiff-keep-layers: states 0..kept are the reference's own
    source: str = ""  # "in-memory" or "streamed"

    def is_kept(self, i: int) -> bool:
        """State i is the reference's own (--modeldiff-keep-layers): embd and the first kept layers."""
        return self.kept > 0 and i <= self.kept

    @property
    def rfn_mean(self) -> np.ndarray:
        return self.rfn.mean(0)

    @property
    def rfn_max(self) -> np.ndarray:
        return self.rfn.max(0)

    @property
    def sqnr_db(self) -> np.ndarray:
        return metrics.sqnr_db(self.sq_ref, self.sq_diff)

    @property
    def isolated_mean(self) -> np.ndarray | None:
        return None if self.isolated_rfn is None else self.isolated_rfn.mean(0)

    def largest_jump(self) -> int | None:
        """Index of the state whose rfn grew most over the previous one (rfn_i / rfn_{i-1}),
        among states not kept from the reference; where error starts accumulating."""
        rfn = self.rfn_mean
        best, best_ratio = None, 1.0
        for i in range(1, len(rfn)):
            if self.is_kept(i):
                continue
            prev = max(rfn[i - 1], 1e-12)
            ratio = rfn[i] / prev if np.isfinite(rfn[i]) else np.inf
            if ratio > best_ratio:
                best, best_ratio = i, ratio
        return best


@dataclass
class LayerAccumulator:
    """Collects per-sequence moments while the engine walks the sequences."""

    names: list[str]
    rows: list[tuple] = field(default_factory=list)
    isolated: list[np.ndarray] = field(default_factory=list)
    kept: int = 0

    def add(self, ref: np.ndarray, cand: np.ndarray, isolated: np.ndarray | None = None) -> None:
        sq_diff, sq_ref, cos = metrics.hidden_moments(ref, cand)
        self.rows.append((sq_diff, sq_ref, cos))
        if isolated is not None:
            self.isolated.append(metrics.relative_frobenius(ref, isolated))

    def finish(self, source: str) -> LayerStats:
        sq_diff, sq_ref, cos = (np.stack(part) for part in zip(*self.rows))
        return LayerStats(
            names=self.names, rfn=metrics.rfn_from_moments(sq_diff, sq_ref), cos_err=1.0 - cos,
            sq_diff=sq_diff.sum(0), sq_ref=sq_ref.sum(0),
            isolated_rfn=np.stack(self.isolated) if len(self.isolated) == len(self.rows) else None,
            kept=self.kept, source=source)


# --------------------------------------------------------------------------- change points
# Where the error departs from its own noise floor. Error grows with depth at a fairly steady rate
# (each layer adds its own small error and passes the earlier one on), so the log of rfn climbs by
# similar steps; a broken layer makes one step far larger than the steps before it. Each step is
# judged against the running level (median) of the earlier steps, not against an absolute limit.
PRIOR_STEP = math.log(2.0)  # the level assumed while fewer than 3 earlier steps are known: x2 a layer
MIN_SPREAD = math.log(1.25)  # floor of the steps' spread (1.4826 MAD), so a regular run is not over-read
DEPARTS = 3.0  # a step this many times its expected growth departs on its own
AGREES = 1.5  # a lower bar for a state whose weights are out of limit (the evidence agrees)
FLOAT16_FLOOR = 2.0 ** -12  # relative rounding of a float16 value: the least error a first state shows (KV cache)


@dataclass
class Departures:
    """Per state: ``ratio`` = rfn_i / (rfn_{i-1} * expected growth), how far the state's error
    departs from the running level of the earlier ones (NaN before the first non-zero state);
    ``z`` the same log step in units of the earlier steps' spread; ``first`` the first non-zero state."""

    ratio: np.ndarray
    z: np.ndarray
    first: int | None

    def largest(self, among=None) -> int | None:
        """The state departing most (infinite first: a non-finite error), among ``among`` if given."""
        keys = [i for i in (range(len(self.ratio)) if among is None else among) if np.isfinite(self.z[i])
                or np.isinf(self.ratio[i])]
        return max(keys, key=lambda i: (self.ratio[i], self.z[i]), default=None)


def departures(rfn: np.ndarray, start: int = 0, floor: float = FLOAT16_FLOOR) -> Departures:
    """Change-point evidence along ``rfn`` from state ``start`` (states before it are the
    reference's own: --modeldiff-keep-layers).

    States whose rfn is exactly 0 (an embedding stored losslessly) carry no level: the first
    non-zero state has no earlier one to be judged against, so it is judged against ``floor``, the
    relative error its storage brings by itself (the candidate type's usual weight error, at least a
    float16 rounding: llama.cpp keeps K/V in float16). Every later state i: step
    s_i = log(rfn_i / rfn_{i-1}) against the median of the earlier steps (with PRIOR_STEP while
    fewer than 3 are known) and their spread. The first
    non-finite state departs infinitely."""
    rfn = np.asarray(rfn, dtype=np.float64)
    n = len(rfn)
    ratio, z = np.full(n, np.nan), np.full(n, np.nan)
    first = next((i for i in range(start, n) if not np.isfinite(rfn[i]) or rfn[i] > 0), None)
    if first is None:
        return Departures(ratio, z, None)
    if not np.isfinite(rfn[first]):
        ratio[first] = z[first] = np.inf
        return Departures(ratio, z, first)
    ratio[first] = rfn[first] / max(floor, 1e-300)
    z[first] = math.log(ratio[first]) / MIN_SPREAD
    steps: list[float] = []
    for i in range(first + 1, n):
        if not np.isfinite(rfn[i]):
            ratio[i] = z[i] = np.inf
            break
        step = math.log(max(rfn[i], 1e-300) / rfn[i - 1])
        known = steps if len(steps) >= 3 else [*steps, PRIOR_STEP]
        level = float(np.median(known))
        spread = max(1.4826 * float(np.median(np.abs(np.asarray(steps) - level))) if len(steps) >= 3 else 0.0,
                     MIN_SPREAD)
        ratio[i] = math.exp(step - level)
        z[i] = (step - level) / spread
        steps.append(step)
    return Departures(ratio, z, first)


def isolated_departures(iso: np.ndarray) -> np.ndarray:
    """Per state: its isolated error (the layer fed the reference's input) over the median
    isolated error of the decoder layers and the norm; the embedding has no input and is 1 unless
    it differs and the rest is exact. A layer that breaks alone stands far above the others."""
    iso = np.asarray(iso, dtype=np.float64)
    body = iso[1:]
    level = body[np.isfinite(body) & (body > 0)]
    level = float(np.median(level)) if len(level) else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        out = iso / level if level > 0 else np.where(iso > 0, np.inf, 0.0)
    return np.where(np.isfinite(iso), out, np.inf)
