"""Progress of a pass over the sequences, for the plugin's and the CLI's progress lines."""
from __future__ import annotations

import time


class Pace:
    """Progress of a pass over the sequences: "sequence 3/8, 412 tokens/s, ETA 0:12"."""

    def __init__(self, sequences):
        self.total, self.count = len(sequences), 0
        self.tokens_left = sum(len(seq.ids) for seq in sequences)
        self.tokens_done, self.started = 0, time.perf_counter()

    def step(self, tokens: int) -> str:
        self.count += 1
        self.tokens_done, self.tokens_left = self.tokens_done + tokens, self.tokens_left - tokens
        rate = self.tokens_done / max(time.perf_counter() - self.started, 1e-9)
        eta = int(round(self.tokens_left / rate)) if rate > 0 else 0
        return f"sequence {self.count}/{self.total}, {rate:.0f} tokens/s, ETA {eta // 60}:{eta % 60:02d}"
