"""The comparison engine: plain Python, no pytest. Runs the reference once and each candidate on
the same token ids, one sequence at a time, and keeps per-position metrics (never every
sequence's full-vocabulary logits at once).

    md = ModelDiff("hf_model", ["model-q8_0.gguf"])
    cmp = md.compare("model-q8_0")
    results = run_checks(cmp, md.thresholds.resolve(cmp.quant_class))
"""
from __future__ import annotations

import os
import platform
import tempfile
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import dumps, evaldata, layers, metrics, refcache
from .cache import files_sha256, locked
from .errors import ModelDiffError, ModelDiffUsageError
from .klstats import KLStats, kl_stats
from .quality import Quality, measure_quality
from .registry import quant_class
from .runners import Runner, make_runner
from .thresholds import Thresholds
from .weightdiff import WeightDiff, compare_weights

TOPK_KEPT = 20  # top ids kept per position (at least): any top-k overlap/agreement with k <= 20


@dataclass
class Settings:
    eval_text: Path | None = None
    eval_dataset: Path | None = None
    eval_column: str = "text"
    eval_rows: int = 8
    eval_length: int = 256
    device: str = "cpu"
    threads: int | None = None
    dump_dir: Path | None = None
    ref_runner: str | None = None
    cand_runner: str | None = None
    logits: bool = True  # run the models for the logit metrics
    layers: bool = True  # capture hidden states for the per-layer comparison
    keep_layers: int = 0  # the candidate takes the reference's state after its first K layers
    stream_layers: bool = False  # per-layer comparison one layer at a time from the weight files
    checkpoint_dir: Path | None = None  # where streaming saves its progress (default: a cache dir)
    topk_max: int = 5  # top-K accuracy and agreement for K = 1..topk_max (exllamav2's --topk_max)
    llama_perplexity_compat: bool = False  # llama-perplexity's chunks, BOS and scored second half
    ref_cache: Path | None = None  # folder of reference caches (refcache.py); None: always run the reference

    def __post_init__(self):
        for name, low in (("eval_rows", 1), ("eval_length", 2), ("threads", 1), ("keep_layers", 0), ("topk_max", 1)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < low):
                option = f"--{'' if name.startswith('eval_') else 'modeldiff-'}{name.replace('_', '-')}"
                raise ModelDiffUsageError(f"{option} must be an integer >= {low}, got {value!r}")
        if self.llama_perplexity_compat and not (self.eval_text or self.eval_dataset):
            raise ModelDiffUsageError("--modeldiff-llama-perplexity-compat evaluates a text like llama-perplexity's "
                                      "-f FILE: give --eval-text FILE (or --eval-dataset)")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ModelDiffUsageError(f"--modeldiff-device: {self.device!r} is not cpu or cuda")

    def describe(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


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


class ModelDiff:
    """One reference, any number of candidates; comparisons are computed on first request."""

    def __init__(self, ref: str | Path, candidates: Sequence[str | Path], settings: Settings | None = None,
                 thresholds: Thresholds | None = None, progress: Callable[[str], None] | None = None):
        self.settings = settings or Settings()
        self.thresholds = thresholds or Thresholds()
        self.progress = progress or (lambda message: None)
        s = self.settings
        self.reference = make_runner(Path(ref), s.ref_runner, s.device, s.threads, role="reference")
        self.candidates: dict[str, Runner] = {}
        for path in candidates:
            runner = make_runner(Path(path), s.cand_runner, s.device, s.threads, role="candidate")
            key, n = runner.name, 2
            while key in self.candidates:  # two files with one stem: keep both, distinguishable
                key, n = f"{runner.name}-{n}", n + 1
            self.candidates[key] = runner
            if s.keep_layers and not s.stream_layers and not runner.feeds_layers:
                raise ModelDiffUsageError(
                    f"--modeldiff-keep-layers: {runner.path} runs in {runner.kind}, which cannot take another "
                    "model's hidden state; use --cand-runner gguf-torch (or hf) for it")
        self._eval: evaldata.EvalInput | None = None
        self._ref_load_seconds = 0.0
        self._ref_store: _ReferenceStore | None = None
        self._comparisons: dict[str, Comparison] = {}
        self._weights: dict[str, WeightComparison] = {}
        self._environment: dict | None = None

    # -- evaluation input and the reference pass ------------------------------------------
    def prepare(self) -> None:
        """Read and tokenize the evaluation input now, before any model runs, so a bad text or
        dataset is one usage error, not a failed item per check and candidate. Nothing to do when
        no model will run (the weights check alone; weights-only files report that per check)."""
        if not (self.settings.logits or self.settings.layers):
            return
        try:
            for runner in (self.reference, *self.candidates.values()):
                runner.require_model()
        except ModelDiffError:
            return
        self.eval_input()

    def eval_input(self) -> evaldata.EvalInput:
        if self._eval is None:
            self._eval = self._build_eval_input()
        return self._eval

    def _build_eval_input(self) -> evaldata.EvalInput:
        s, ref = self.settings, self.reference
        recorded = ref.fixed_sequences()
        dumps_among = [c for c in self.candidates.values() if c.fixed_sequences()]
        if recorded is None and dumps_among:
            if len(dumps_among) < len(self.candidates) or any(
                    [q.ids for q in c.fixed_sequences()] != [q.ids for q in dumps_among[0].fixed_sequences()]
                    for c in dumps_among):
                raise ModelDiffUsageError(
                    f"{dumps_among[0].path}: a logits dump fixes the tokens it was recorded on; compare it in a "
                    "run of its own (or with dumps of the same tokens), not beside models that run any text")
            recorded = dumps_among[0].fixed_sequences()  # the reference runs the recorded ids
        if recorded:
            return evaldata.EvalInput(
                [(seq.label or f"recorded {i}", seq.text) for i, seq in enumerate(recorded) if seq.text is not None],
                [evaldata.EvalSequence(seq.ids, seq.text, seq.label or f"recorded {i}", seq.scored)
                 for i, seq in enumerate(recorded)])
        t0 = time.perf_counter()
        ref.load_tokenizer()  # its tokenizer defines the evaluation ids
        self._ref_load_seconds = time.perf_counter() - t0
        vocab = ref.vocab()
        bos_id = vocab.special.get("bos") if vocab and vocab.add_bos else None
        if s.llama_perplexity_compat:
            source = s.eval_text or s.eval_dataset
            text = (evaldata.read_text_file(s.eval_text) if s.eval_text else "\n\n".join(
                evaldata.read_parquet_rows(s.eval_dataset, s.eval_column, 40 * s.eval_rows * s.eval_length)))
            return evaldata.perplexity_input(text, ref.tokenize, s.eval_length, s.eval_rows, bos_id, source.name)
        if s.eval_dataset:
            rows = evaldata.read_parquet_rows(s.eval_dataset, s.eval_column, 40 * s.eval_rows * s.eval_length)
            return evaldata.dataset_input(rows, ref.tokenize, s.eval_rows, s.eval_length, bos_id, s.eval_dataset.name)
        if s.eval_text:
            text = evaldata.read_text_file(s.eval_text)
            return evaldata.chunked_input(text, ref.tokenize, s.eval_rows, s.eval_length, bos_id, s.eval_text.name)

        def special(name):
            token_id = vocab.special.get(name) if vocab else None
            return vocab.tokens[token_id] if token_id is not None and token_id < len(vocab.tokens) else None

        return evaldata.builtin_input(ref.tokenize, s.eval_length, special("bos"), special("eos"))

    def _reference(self) -> "_ReferenceStore":
        if self._ref_store is None:
            dumping = bool(self.settings.dump_dir and self.reference.dump_prefix)
            if self.settings.ref_cache and not dumping and self.reference.has_weights:
                self._ref_store = self._cached_reference()
            else:
                self._ref_store = self._run_reference()
            if dumping:
                self._finish_dumps(self.reference, self._ref_store.writer, self._ref_store.last_row,
                                   self.reference.quant_type())
        return self._ref_store

    def _run_reference(self) -> "_ReferenceStore":
        return _ReferenceStore.run(self.reference, self.eval_input().sequences,
                                   lambda: self._dump_writer(self.reference, self.reference.name),
                                   self.progress, hidden=self._in_memory_layers())

    def _cached_reference(self) -> "_ReferenceStore":
        """The reference's outputs from the cache, else run and cached; one process at a time
        per entry (file lock), so pytest-xdist workers compute it once."""
        ref, sequences = self.reference, self.eval_input().sequences
        path, model_hash = refcache.cache_path(self.settings.ref_cache, ref, sequences, self.settings.device)
        need_hidden = self._in_memory_layers() and ref.gives_hidden
        with locked(path):
            entry = refcache.open_valid(path, need_hidden)
            if entry is not None:
                self.progress(f"reference {ref.name}: outputs from the cache {path}")
                return _ReferenceStore.from_cache(entry, need_hidden)
            store = self._run_reference()
            try:
                refcache.write_cache(path, refcache.header_for(ref, model_hash, self.settings.device), sequences,
                                     store.rows, store.hidden if store.has_hidden else None)
            finally:
                store.close()
            refcache.remove_stale(path, str(Path(ref.path).resolve()), model_hash)
            self.progress(f"reference {ref.name}: outputs cached in {path}")
            # compared from the cache like every later run, so the numbers do not depend on who wrote it
            return _ReferenceStore.from_cache(refcache.ReferenceCache(path, verify=False), need_hidden,
                                              load_seconds=store.load_seconds, seconds=store.seconds)

    def _in_memory_layers(self) -> bool:
        return self.settings.layers and not self.settings.stream_layers

    # -- candidates ------------------------------------------------------------------------
    def compare(self, key: str) -> Comparison:
        if key not in self._comparisons:
            cmp = self._compare(self.candidates[key])
            cmp.weights_of = lambda: self.weights(key)
            self._comparisons[key] = cmp
        return self._comparisons[key]

    def weights(self, key: str) -> WeightComparison:
        """The candidate's weight files against the reference's, tensor by tensor; runs no model."""
        if key not in self._weights:
            cand = self.candidates[key]
            qtype = cand.quant_type()
            wc = WeightComparison(self.reference, cand, qtype, quant_class(qtype))
            without = next((r for r in (self.reference, cand) if not r.has_weights), None)
            if without is not None:
                wc.skipped = f"{without.path} is a {without.kind} and holds no weights"
            else:
                try:
                    wc.diff = compare_weights(self.reference.path, cand.path, self.progress)
                except ModelDiffError as exc:
                    wc.error = str(exc)
            self._weights[key] = wc
        return self._weights[key]

    def computed(self) -> dict[str, Comparison]:
        """The comparisons made so far (the report covers these)."""
        return dict(self._comparisons)

    def computed_weights(self) -> dict[str, WeightComparison]:
        return dict(self._weights)

    def compare_all(self) -> dict[str, Comparison]:
        return {key: self.compare(key) for key in self.candidates}

    def _compare(self, cand: Runner) -> Comparison:
        started = time.perf_counter()
        self.reference.require_model()
        cand.require_model()
        eval_input = self.eval_input()
        run_models = self.settings.logits or self._in_memory_layers()
        first_use = self._ref_store is None
        ref_store = self._reference() if run_models else None
        t0 = time.perf_counter()
        if run_models:
            cand.load(max(len(seq.ids) for seq in eval_input.sequences))
        else:  # the tokens check still needs both tokenizers (dumps fix the ids: the reference's may not be loaded)
            self.reference.load_tokenizer()
            cand.load_tokenizer()
        cand_load = time.perf_counter() - t0
        qtype = cand.quant_type()
        cmp = Comparison(self.reference, cand, qtype, quant_class(qtype), eval_input, topk_max=self.settings.topk_max)
        cmp.token_diffs = [
            TokenDiff(label, text, ref_ids, cand_ids)
            for label, text in eval_input.texts
            if (ref_ids := self.reference.tokenize(text)) is not None
            and (cand_ids := cand.tokenize(text)) is not None
        ]
        cand_seconds = self._run_candidate(cmp, ref_store) if run_models else 0.0
        if not run_models:
            cmp.error = "logit metrics not computed: the selected checks (--modeldiff-checks) need none"
        if self.settings.layers and self.settings.stream_layers:
            self._stream_layers(cmp, eval_input)
        cand.close()  # weights are not needed any more; tokenizer and vocab stay available
        total = time.perf_counter() - started
        # The reference pass is shared: it is charged to the candidate compared first.
        ref_seconds = ref_store.seconds if ref_store else 0.0
        ref_load_s = (ref_store.load_seconds if ref_store else 0.0) + self._ref_load_seconds
        ref_forward, ref_load = (ref_seconds, ref_load_s) if first_use else (0.0, 0.0)
        cmp.timings = {
            "reference_forward_s": ref_seconds, "reference_load_s": ref_load_s,
            "candidate_forward_s": cand_seconds, "candidate_load_s": cand_load, "comparison_s": total,
            "overhead_s": max(0.0, total - cand_seconds - cand_load - ref_forward - ref_load),
        }
        return cmp

    def _run_candidate(self, cmp: Comparison, ref_store: "_ReferenceStore") -> float:
        """The candidate's forward pass over every sequence: position stats, in-memory layer stats
        and dumps. Returns the candidate's forward seconds."""
        cand, sequences = cmp.candidate, cmp.eval.sequences
        writer = self._dump_writer(cand, self._dump_name(cand))
        parts, cand_seconds, last_row = [], 0.0, None
        hidden = self._in_memory_layers() and self._layers_possible(cmp, ref_store)
        acc, pace = None, Pace(sequences)
        try:
            for i, seq in enumerate(sequences):
                ref_hidden = ref_store.hidden(i) if hidden else None
                t0 = time.perf_counter()
                fwd = cand.forward(seq.ids, hidden=hidden, keep=self.settings.keep_layers,
                                   feed=ref_hidden if cand.feeds_layers else None)
                cand_seconds += time.perf_counter() - t0
                cand_rows, ref_rows = fwd.logits, ref_store.rows(i)
                if cand_rows.shape[-1] != ref_rows.shape[-1]:
                    raise ModelDiffError(
                        f"vocabulary size mismatch: {cand.path} gives {cand_rows.shape[-1]} logits per "
                        f"position, {self.reference.path} gives {ref_rows.shape[-1]}")
                # the reference kept the rows at its compared positions; a last-position dump holds one row
                ref_positions = ref_store.positions[i]
                positions = np.intersect1d(ref_positions, seq.compared(len(cand_rows)))
                if not len(positions):
                    raise ModelDiffError(f"{cand.path}: its logits cover none of the compared positions of "
                                         f"sequence {seq.label!r} (a last-position dump cannot be compared here)")
                ref_at = positions - ref_positions[0]
                cand_at = positions - (len(seq.ids) - len(cand_rows))
                parts.append(PositionStats.measure(i, seq.ids, positions, ref_rows[ref_at], cand_rows[cand_at],
                                                   max(TOPK_KEPT, self.settings.topk_max)))
                if hidden and cmp.layers_error is None:
                    acc = self._add_layers(cmp, acc, ref_hidden, fwd)
                if writer:
                    writer.add(cand_rows, seq.ids, seq.text)
                if i == 0:
                    last_row = cand_rows[-1]
                self.progress(f"{cand.name}: {pace.step(len(seq.ids))}")
        except ModelDiffError as exc:
            cmp.error = str(exc)
            if writer:
                writer.abort()
            writer = None
        except BaseException:  # Ctrl-C or a runtime crash: no half-written dump survives
            if writer:
                writer.abort()
            raise
        if parts and cmp.error is None:
            cmp.stats = PositionStats.concat(parts)
            cmp.n_vocab = int(ref_store.n_vocab)
        if hidden and cmp.layers_error is None:  # a failed run leaves no partial layer numbers
            cmp.layers_error = cmp.error
            cmp.layers = acc.finish("in-memory") if cmp.error is None else None
        if writer:
            self._finish_dumps(cand, writer, last_row, cmp.quant_type)
        return cand_seconds

    def _stream_layers(self, cmp: Comparison, eval_input) -> None:
        from . import streaming

        s = self.settings
        try:
            cmp.layers = streaming.stream_layers(
                self.reference.path, cmp.candidate.path, [seq.ids for seq in eval_input.sequences], s.keep_layers,
                s.checkpoint_dir, progress=self.progress)
        except ModelDiffError as exc:
            cmp.layers_error = str(exc)

    def _layers_possible(self, cmp: Comparison, ref_store: "_ReferenceStore") -> bool:
        """Both sides must give hidden states, else the layers check is skipped, saying why."""
        for runner, states in ((self.reference, ref_store.has_hidden), (cmp.candidate, cmp.candidate.gives_hidden)):
            if not states:
                cmp.layers_skipped = (f"{runner.path} runs in {runner.kind}, which gives no hidden states; "
                                      "per-layer comparison needs hf, gguf-torch or llamacpp on both sides")
                return False
        try:  # before the candidate runs
            layers.check_keep(self.settings.keep_layers, ref_store.depth[0])
        except ModelDiffError as exc:
            cmp.layers_error = str(exc)
            return False
        return True

    def _add_layers(self, cmp: Comparison, acc, ref_hidden: np.ndarray, fwd) -> "layers.LayerAccumulator | None":
        try:
            layers.align(layers.depth(ref_hidden), layers.depth(fwd.hidden), self.reference.path, cmp.candidate.path)
        except ModelDiffError as exc:
            cmp.layers_error = str(exc)
            return None
        acc = acc or layers.LayerAccumulator(layers.state_names(layers.depth(ref_hidden)[0]),
                                             kept=self.settings.keep_layers)
        acc.add(ref_hidden, fwd.hidden, fwd.isolated)
        return acc

    # -- dumps -------------------------------------------------------------------------------
    def _dump_name(self, cand: Runner) -> str:
        """The candidate's key; suffixed if it would overwrite the reference's dump files."""
        key = next(k for k, r in self.candidates.items() if r is cand)
        clash = cand.dump_prefix == self.reference.dump_prefix and key == self.reference.name
        return f"{key}-candidate" if clash else key

    def _dump_writer(self, runner: Runner, name: str) -> dumps.AllPositionsWriter | None:
        if not self.settings.dump_dir or not runner.dump_prefix:
            return None
        return dumps.AllPositionsWriter(Path(self.settings.dump_dir), runner.dump_prefix, name)

    def _finish_dumps(self, runner: Runner, writer, last_row, qtype: str) -> None:
        first = self.eval_input().sequences[0]
        dumps.write_last_position(Path(self.settings.dump_dir), runner.dump_prefix, writer.name,
                                  last_row, first.ids, first.text)
        writer.finish(len(last_row), {
            "model": str(runner.path), "runner": runner.kind, "quant_type": qtype,
            "model_files_sha256": {str(p): files_sha256([p]) for p in runner.files()},
            "versions": {"python": platform.python_version(), "numpy": np.__version__, **runner.versions()},
            "settings": self.settings.describe(),
        })

    def environment(self) -> dict:
        """What produced the numbers: library versions, settings, the models' file hashes (computed
        once per run: the files do not change under it)."""
        if self._environment is None:
            self._environment = self._describe_environment()
        return self._environment

    def _describe_environment(self) -> dict:
        import importlib.metadata

        runners = [self.reference, *self.candidates.values()]
        versions = {"python": platform.python_version(), "numpy": np.__version__,
                    "pytest-modeldiff": importlib.metadata.version("pytest-modeldiff")}
        for runner in runners:
            versions.update(runner.versions())
        where = ("dump_dir", "checkpoint_dir", "ref_cache")  # where outputs go, not what was computed
        settings = {k: v for k, v in self.settings.describe().items() if k not in where}
        return {"versions": versions, "settings": settings,
                "models_sha256": {"reference": files_sha256(self.reference.files()),
                                  **{key: files_sha256(r.files()) for key, r in self.candidates.items()}}}

    def close(self) -> None:
        for runner in [self.reference, *self.candidates.values()]:
            runner.close()
        if self._ref_store is not None:
            self._ref_store.close()


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


class _ReferenceStore:
    """The reference's logits (and hidden states) for every sequence, so several candidates reuse
    one reference pass."""

    def __init__(self):
        self.logits = _Rows()  # per sequence: the rows at its compared positions
        self.positions: list[np.ndarray] = []
        self.states = _Rows()
        self.has_hidden = False
        self.depth = (0, 0)  # (decoder layers, width) of the hidden states
        self.n_vocab = 0
        self.seconds = 0.0  # forward time
        self.load_seconds = 0.0
        self.writer = None
        self.last_row = None
        self.cache: refcache.ReferenceCache | None = None  # outputs read from a cache entry instead

    @classmethod
    def run(cls, runner: Runner, sequences, make_writer, progress, hidden: bool = False) -> "_ReferenceStore":
        store = cls()
        store.has_hidden = hidden = hidden and runner.gives_hidden
        t0 = time.perf_counter()
        runner.load(max(len(seq.ids) for seq in sequences))
        store.load_seconds = time.perf_counter() - t0
        store.writer = writer = make_writer()  # only once the model loaded: no stray .tmp on failure
        pace = Pace(sequences)
        try:
            for i, seq in enumerate(sequences):
                t0 = time.perf_counter()
                fwd = runner.forward(seq.ids, hidden=hidden)
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
                progress(f"reference {runner.name}: {pace.step(len(seq.ids))}")
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
                   seconds: float = 0.0) -> "_ReferenceStore":
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


class _Rows:
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
