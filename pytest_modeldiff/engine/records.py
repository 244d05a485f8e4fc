"""What a comparison produces: token differences, per-position statistics and the
reference/candidate pair records that checks and reports read."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Sequence

import numpy as np

from ..metrics import layers
from ..metrics import logits as metrics
from ..metrics.klstats import KLStats, kl_stats
from ..metrics.quality import Quality, measure_quality
from ..runners.base import Runner
from ..weights.diff import WeightDiff
from . import evaldata
from .settings import Settings

TOPK_KEPT = 20  # top ids kept per position (at least): any top-k overlap/agreement with k <= 20


@dataclass
class TokenDiff:
    label: str
    text: str
    ref_ids: list[int]
    cand_ids: list[int]

    @property
    def first_mismatch(self) -> int | None:
        for i, (a, b) in enumerate(zip(self.ref_ids, self.cand_ids)):
            if a != b:
                return i
        return None if len(self.ref_ids) == len(self.cand_ids) else min(len(self.ref_ids), len(self.cand_ids))


@dataclass
class PositionStats:
    """One entry per compared position, concatenated over sequences."""

    seq: np.ndarray  # sequence index
    pos: np.ndarray  # position in the sequence (predicting token pos + 1)
    is_last: np.ndarray
    finite: np.ndarray  # candidate logits all finite
    target: np.ndarray  # the next token's id (the token fed at pos + 1), -1 at a sequence's end
    ref_rank: np.ndarray  # logits above the target's (metrics.target_rank); -1 without a target
    cand_rank: np.ndarray  # (n_vocab for NaN/Inf candidate rows: never a hit)
    ref_nll: np.ndarray  # -log p(target), NaN without a target
    cand_nll: np.ndarray
    ref_confidence: np.ndarray  # the reference's top-1 probability, max_i p_i
    kld: np.ndarray
    prob_mse: np.ndarray  # mean over the vocabulary of (p - q)^2
    max_abs: np.ndarray
    max_abs_id: np.ndarray  # vocabulary id of the largest difference
    sse: np.ndarray
    ref_sum: np.ndarray
    ref_sumsq: np.ndarray
    ref_top: np.ndarray  # (n, TOPK_KEPT) ids, best first
    cand_top: np.ndarray

    ROWS_PER_CHUNK = 16  # ~6 MB of float64 per side: the passes below then run in cache (3x faster)

    @classmethod
    def measure(cls, seq: int, ids: Sequence[int], positions: np.ndarray, ref: np.ndarray, cand: np.ndarray,
                keep_top: int = TOPK_KEPT):
        """Rows ``ref[j]``, ``cand[j]`` are the logits at ``positions[j]`` of the sequence ``ids``."""
        step = cls.ROWS_PER_CHUNK
        ids = np.asarray(ids, dtype=np.int64)
        targets = np.append(ids[1:], -1)[positions]  # what each position predicts; none after the last
        return cls.concat([cls._measure_rows(seq, positions[i:i + step], targets[i:i + step], len(ids),
                                             ref[i:i + step], cand[i:i + step], keep_top)
                           for i in range(0, len(positions), step)])

    @classmethod
    def _measure_rows(cls, seq, positions, targets, n_tokens, ref, cand, keep_top):
        import torch

        r32, c32 = metrics._2d(ref, torch.float32), metrics._2d(cand, torch.float32)  # ranks and top ids
        r, c = r32.double(), c32.double()  # one float64 copy each, shared below
        sse, ref_sum, ref_sumsq = metrics.logit_moments(r, c)
        finite = np.isfinite(sse)  # the reference is checked finite, so this flags NaN/Inf candidate rows
        max_abs, max_abs_id = metrics.max_abs_diff(r, c)
        log_p, log_q = torch.log_softmax(r, -1), torch.log_softmax(c, -1)
        kld, prob_mse = metrics.kl_and_prob_mse(log_p, log_q)
        ref_confidence = log_p.max(-1).values.exp().numpy()
        has = targets >= 0
        ref_rank, cand_rank = np.full(len(targets), -1), np.full(len(targets), -1)
        ref_nll, cand_nll = np.full(len(targets), np.nan), np.full(len(targets), np.nan)
        if has.any():
            t = targets[has]
            ref_rank[has], cand_rank[has] = metrics.target_rank(r32[has], t), metrics.target_rank(c32[has], t)
            ref_nll[has] = metrics.nll_from_log_probs(log_p[has], t)
            cand_nll[has] = metrics.nll_from_log_probs(log_q[has], t)
            cand_rank[has & ~finite] = r.shape[-1]
            cand_nll[has & ~finite] = np.nan
        return cls(
            seq=np.full(len(positions), seq), pos=positions, is_last=positions == n_tokens - 1,
            finite=finite, target=targets, ref_rank=ref_rank, cand_rank=cand_rank, ref_nll=ref_nll, cand_nll=cand_nll,
            ref_confidence=ref_confidence,
            kld=np.where(finite, kld, np.nan), prob_mse=np.where(finite, prob_mse, np.nan),
            max_abs=np.where(finite, max_abs, np.nan), max_abs_id=max_abs_id,
            sse=sse, ref_sum=ref_sum, ref_sumsq=ref_sumsq,
            ref_top=metrics.top_k_ids(r32, keep_top), cand_top=metrics.top_k_ids(c32, keep_top))

    @classmethod
    def concat(cls, parts: list["PositionStats"]) -> "PositionStats":
        return cls(**{f: np.concatenate([getattr(p, f) for p in parts]) for f in cls.__dataclass_fields__})

    def overlap(self, k: int) -> np.ndarray:
        """|topk(ref) & topk(cand)| / k per position, from the kept top ids."""
        return metrics.overlap_of_ids(self.ref_top[:, :k], self.cand_top[:, :k])

    def agreement(self, k: int) -> np.ndarray:
        """1.0 per position where the first k ids agree in order (k = 1: same top-1)."""
        return metrics.agreement_of_ids(self.ref_top[:, :k], self.cand_top[:, :k])

    def select(self, mask: np.ndarray) -> "PositionStats":
        return PositionStats(**{f: getattr(self, f)[mask] for f in self.__dataclass_fields__})

    def __len__(self) -> int:
        return len(self.seq)


@dataclass
class Pair:
    """A candidate against the reference: what every verdict and summary line names."""

    reference: Runner
    candidate: Runner
    quant_type: str
    quant_class: str

    @property
    def name(self) -> str:
        return self.candidate.name


@dataclass
class WeightComparison(Pair):
    """The weights check's input: the two checkpoints' tensor-by-tensor diff (no model runs)."""

    diff: WeightDiff | None = None
    error: str | None = None  # a weight file could not be read
    skipped: str | None = None  # a side holds no weights (a logits dump)

    @property
    def weights(self) -> "WeightComparison":
        """Itself: the weights check reads ``.weights`` of either record."""
        return self


@dataclass
class Comparison(Pair):
    """Everything the checks need about one candidate against the reference."""

    eval: evaldata.EvalInput
    token_diffs: list[TokenDiff] = field(default_factory=list)
    stats: PositionStats | None = None
    n_vocab: int = 0
    error: str | None = None  # why the logit metrics could not be computed
    layers: layers.LayerStats | None = None
    layers_error: str | None = None  # why the per-layer comparison failed
    layers_skipped: str | None = None  # why it does not apply (a side gives no hidden states)
    timings: dict[str, float] = field(default_factory=dict)
    topk_max: int = Settings.topk_max
    weights_of: Callable[[], WeightComparison] | None = None  # set by ModelDiff: its cached weight diff
    # set by ModelDiff for candidates whose runner gives no isolated error (llama.cpp): runs the
    # GGUF in gguf-torch on the reference's states, filling layers.isolated_rfn (--modeldiff-isolate)
    isolate_of: Callable[[], None] | None = None
    isolate: str = "auto"  # --modeldiff-isolate: auto (when the layers check fails), always, never
    isolate_error: str | None = None  # why the isolated pass could not run
    attribution: dict | None = None  # --modeldiff-attribution: KLD added by each layer's weights alone
    long_context: dict | None = None  # --modeldiff-long-context: KLD by position bucket of one long sequence

    @property
    def weights(self) -> WeightComparison:
        return self.weights_of()

    @cached_property  # asked for once the comparison is complete
    def quality(self) -> Quality | None:
        """Perplexity, top-K accuracy and agreement, probability MSE (None without logit metrics)."""
        return None if self.stats is None else measure_quality(self.stats, self.topk_max)

    @cached_property
    def kl_stats(self) -> KLStats | None:
        """llama-perplexity's KL-divergence statistics over the positions with a next token
        (None without logit metrics or without such positions)."""
        if self.stats is None:
            return None
        s = self.stats.select(self.stats.target >= 0)
        return kl_stats(s.ref_nll, s.cand_nll, s.kld, s.agreement(1), s.ref_confidence)

    def context(self, seq: int, pos: int, width: int = 6) -> str:
        """The last few input tokens up to ``pos`` of sequence ``seq``, decoded."""
        ids = self.eval.sequences[seq].ids[max(0, pos - width + 1): pos + 1]
        return "".join(self.reference.piece(i) for i in ids)
