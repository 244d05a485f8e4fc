"""Next-token quality of both models on the evaluation text - exllamav2 model_diff's summary:
perplexity and top-K accuracy of each model, ordered top-K agreement between them, and the
probability MSE.

Targets are the next tokens of each sequence: position t predicts token t + 1, so a sequence's
last position (and a last-position dump) has no target. Accuracy, agreement and perplexity use
the positions with a target (as exllamav2 does, on logits[:, :-1]); probability MSE uses every
position. Everything comes from the per-position numbers in ``PositionStats``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from . import logits as metrics


@dataclass(frozen=True)
class Quality:
    positions: int  # positions with a target
    topk_max: int
    ref_ppl: float | None  # None without targets
    cand_ppl: float | None
    ref_accuracy: list[float]  # top-K accuracy for K = 1..topk_max
    cand_accuracy: list[float]
    agreement: list[float]  # ordered top-K agreement for K = 1..topk_max
    prob_mse: float  # over all positions

    @property
    def accuracy_drop(self) -> list[float]:
        """Reference accuracy minus candidate accuracy per K (positive = the candidate is worse)."""
        return [r - c for r, c in zip(self.ref_accuracy, self.cand_accuracy)]

    def to_dict(self) -> dict:
        return {**asdict(self), "accuracy_drop": self.accuracy_drop}


def measure_quality(stats, topk_max: int) -> Quality:
    """Quality over ``stats`` (a PositionStats), K = 1..topk_max."""
    has = stats.target >= 0
    ks = range(1, topk_max + 1)
    if not has.any():
        return Quality(0, topk_max, None, None, [], [], [], float(np.mean(stats.prob_mse)))
    scored = stats.select(has)
    return Quality(
        positions=int(has.sum()), topk_max=topk_max,
        ref_ppl=metrics.perplexity(scored.ref_nll), cand_ppl=metrics.perplexity(scored.cand_nll),
        ref_accuracy=[metrics.topk_accuracy(scored.ref_rank, k) for k in ks],
        cand_accuracy=[metrics.topk_accuracy(scored.cand_rank, k) for k in ks],
        agreement=[float(scored.agreement(k).mean()) for k in ks],
        prob_mse=float(np.mean(stats.prob_mse)))
