"""The reference's outputs during a run: rows kept in memory or spilled to a temporary
file, or read from the reference cache."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

from ..errors import ModelDiffError
from ..formats import refcache
from ..metrics import layers
from ..runners.base import Runner
from .progress import Pace


class ReferenceStore:
    """The reference's logits (and hidden states) for every sequence, so several candidates reuse
    one reference pass."""

    def __init__(self):
        self.logits = SpilledRows()  # per sequence: the rows at its compared positions
        self.positions: list[np.ndarray] = []
        self.states = SpilledRows()
        self.has_hidden = False
        self.depth = (0, 0)  # (decoder layers, width) of the hidden states
        self.n_vocab = 0
        self.seconds = 0.0  # forward time
        self.load_seconds = 0.0
        self.writer = None
        self.last_row = None
        self.cache: refcache.ReferenceCache | None = None  # outputs read from a cache entry instead

    @classmethod
    def run(cls, runner: Runner, sequences, make_writer, progress, hidden: bool = False) -> "ReferenceStore":
        store = cls()
        store.has_hidden = hidden = hidden and runner.gives_hidden
        t0 = time.perf_counter()
        runner.load(max(len(seq.ids) for seq in sequences))
        store.load_seconds = time.perf_counter() - t0
        store.writer = writer = make_writer()  # only once the model loaded: no stray .tmp on failure
        pace = Pace(sequences)
        try:
            t0 = time.perf_counter()
            forwards = runner.forward_all([seq.ids for seq in sequences], hidden=hidden,
                                          progress=lambda message: progress(f"reference {message}"))
            for i, (seq, fwd) in enumerate(zip(sequences, forwards)):
                store.seconds += time.perf_counter() - t0
                logits = fwd.logits
                bad = ~np.isfinite(logits).all(axis=-1)
                if bad.any():
                    raise ModelDiffError(
                        f"{runner.path}: the reference produced NaN/Inf logits at {int(bad.sum())} positions "
                        f"(first: sequence {i}, position {int(np.argmax(bad))}); the reference itself is broken")
                store.n_vocab = logits.shape[-1]
                # rows from the first compared position to the end (a cache can stand for this runner)
                compared = seq.compared(len(logits))
                first = int(compared[0]) if len(compared) else len(seq.ids) - 1
                store.positions.append(np.arange(first, len(seq.ids)))
                store.logits.add(np.asarray(logits[first - (len(seq.ids) - len(logits)):], dtype=np.float32))
                if hidden:  # kept as (n_states * n_tokens, n_embd) rows
                    store.depth = layers.depth(fwd.hidden)
                    store.states.add(fwd.hidden.reshape(-1, fwd.hidden.shape[-1]))
                if writer:
                    writer.add(logits, seq.ids, seq.text)
                if i == 0:
                    store.last_row = np.array(logits[-1])
                if not runner.reports_progress:
                    progress(f"reference {runner.name}: {pace.step(len(seq.ids))}")
                t0 = time.perf_counter()
        except BaseException:
            if writer:
                writer.abort()
            store.close()
            raise
        store.logits.finish()
        store.states.finish()
        return store

    @classmethod
    def from_cache(cls, entry: "refcache.ReferenceCache", hidden: bool, load_seconds: float = 0.0,
                   seconds: float = 0.0) -> "ReferenceStore":
        store = cls()
        store.load_seconds, store.seconds = load_seconds, seconds
        store.cache = entry
        store.n_vocab = entry.header["n_vocab"]
        store.positions = [np.arange(s["first"], len(s["ids"])) for s in entry.sequences]
        store.has_hidden = hidden and entry.has_hidden
        if store.has_hidden:
            n_states, _, width = entry.sequences[0]["hidden_shape"]
            store.depth = (n_states - 2, width)
        return store

    def rows(self, i: int) -> np.ndarray:
        """Sequence i's logits from its first compared position to its end."""
        return self.cache.logits(i) if self.cache is not None else self.logits[i]

    def hidden(self, i: int) -> np.ndarray:
        """(n_states, n_tokens, n_embd) of sequence i."""
        if self.cache is not None:
            return self.cache.hidden(i)
        n_layers, width = self.depth
        return np.asarray(self.states[i]).reshape(n_layers + 2, -1, width)

    def close(self) -> None:
        self.logits.close()
        self.states.close()


class SpilledRows:
    """A list of 2-D float32 arrays with equal row width, held in memory up to MEMORY_LIMIT bytes
    and beyond that in a temporary file (read back memory-mapped)."""

    MEMORY_LIMIT = 1 << 30

    def __init__(self):
        self.arrays: list = []  # arrays, or row counts while spilling, then memmap views
        self._size = 0
        self._spill = None  # (path, file) once spilled
        self._width = None

    def add(self, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        self._width = rows.shape[1]
        self._size += rows.nbytes
        if self._spill is None and self._size > self.MEMORY_LIMIT:
            fd, path = tempfile.mkstemp(prefix="modeldiff-ref-", suffix=".f32")
            self._spill = (path, os.fdopen(fd, "wb"))
            for held in self.arrays:
                self._spill[1].write(held.tobytes())
            self.arrays = [len(held) for held in self.arrays]
        if self._spill is None:
            self.arrays.append(rows)
        else:
            self._spill[1].write(rows.tobytes())
            self.arrays.append(len(rows))

    def finish(self) -> None:
        if self._spill is None:
            return
        path, file = self._spill
        file.close()
        rows = np.memmap(path, dtype=np.float32, mode="r").reshape(-1, self._width)
        starts = np.cumsum([0] + self.arrays)
        self.arrays = [rows[a:b] for a, b in zip(starts[:-1], starts[1:])]

    def __getitem__(self, i: int) -> np.ndarray:
        return self.arrays[i]

    def close(self) -> None:
        self.arrays = []
        if self._spill is not None:
            path, file = self._spill
            file.close()
            Path(path).unlink(missing_ok=True)
            self._spill = None
