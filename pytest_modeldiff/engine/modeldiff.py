"""The comparison engine: plain Python, no pytest. Runs the reference once and each candidate on
the same token ids, one sequence at a time, and keeps per-position metrics (never every
sequence's full-vocabulary logits at once).

    md = ModelDiff("hf_model", ["model-q8_0.gguf"])
    cmp = md.compare("model-q8_0")
    results = run_checks(cmp, Thresholds().resolve(cmp.quant_class))  # checks/: judging is theirs
"""
from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import ModelDiffError, ModelDiffUsageError
from ..formats import dumps, refcache
from ..formats.cache import files_sha256, locked
from ..formats.quant_types import quant_class
from ..metrics import layers
from ..runners.base import Runner
from ..runners.detect import detect_runner, make_runner
from ..weights.diff import ArchitectureNotMapped, compare_weights
from . import diagnosis, evaldata
from .progress import Pace
from .records import TOPK_KEPT, Comparison, PositionStats, TokenDiff, WeightComparison
from .settings import Settings
from .store import ReferenceStore


class ModelDiff:
    """One reference, any number of candidates; comparisons are computed on first request."""

    def __init__(self, ref: str | Path, candidates: Sequence[str | Path], settings: Settings | None = None,
                 progress: Callable[[str], None] | None = None):
        self.settings = settings or Settings()
        self.progress = progress or (lambda message: None)
        s = self.settings
        self.reference = make_runner(Path(ref), self._reference_kind(Path(ref)), s.device, s.threads, role="reference")
        self.reference.dtype = s.ref_dtype
        self.reference.checkpoint_dir = s.checkpoint_dir  # streamed: where its progress is saved
        self.candidates: dict[str, Runner] = {}
        for path in candidates:
            runner = make_runner(Path(path), s.cand_runner, s.device, s.threads, role="candidate")
            key, n = runner.name, 2
            while key in self.candidates:  # two files with one stem: keep both, distinguishable
                key, n = f"{runner.name}-{n}", n + 1
            self.candidates[key] = runner
            if s.keep_layers and not runner.feeds_layers:
                raise ModelDiffUsageError(
                    f"--modeldiff-keep-layers: {runner.path} runs in {runner.kind}, which cannot take another "
                    "model's hidden state; use --cand-runner gguf-torch (or hf) for it")
        self._eval: evaldata.EvalInput | None = None
        self._ref_load_seconds = 0.0
        self._ref_store: ReferenceStore | None = None
        self._comparisons: dict[str, Comparison] = {}
        self._weights: dict[str, WeightComparison] = {}
        self._environment: dict | None = None
        self._long_ref: tuple[int, list[int], np.ndarray] | None = None  # the long-context probe's reference run

    def _reference_kind(self, path: Path) -> str | None:
        """--modeldiff-stream-layers runs a model reference (HF folder, GGUF) streamed, one layer at
        a time from its files; an explicit --ref-runner and recordings (dumps, caches) stay as they are."""
        s = self.settings
        if not s.stream_layers or s.ref_runner or not path.exists():
            return s.ref_runner
        if s.ref_dtype not in ("auto", "float32"):
            raise ModelDiffUsageError(f"--ref-dtype {s.ref_dtype}: a streamed reference runs in float32")
        return "streamed" if detect_runner(path) in ("hf", "llamacpp") else None

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

        bos, eos = (vocab.special_token("bos"), vocab.special_token("eos")) if vocab else (None, None)
        return evaldata.builtin_input(ref.tokenize, s.eval_length, bos, eos)

    def _reference(self) -> "ReferenceStore":
        if self._ref_store is None:
            dumping = bool(self.settings.dump_dir and self.reference.dump_prefix)
            if self.settings.ref_cache and not dumping and self.reference.has_weights:
                self._ref_store = self._cached_reference()
            else:
                self._ref_store = self._run_reference()
            if dumping:
                self._finish_dumps(self.reference, self._ref_store.writer, self._ref_store.last_row,
                                   self.reference.quant_type())
            # the store holds its outputs: free the weights before any candidate loads (the peak is
            # the larger model, not both); diagnosis passes that need them load them again
            self.reference.close()
        return self._ref_store

    def _run_reference(self) -> "ReferenceStore":
        return ReferenceStore.run(self.reference, self.eval_input().sequences,
                                   lambda: self._dump_writer(self.reference, self.reference.name),
                                   self.progress, hidden=self.settings.layers)

    def _cached_reference(self) -> "ReferenceStore":
        """The reference's outputs from the cache, else run and cached; one process at a time
        per entry (file lock), so pytest-xdist workers compute it once."""
        ref, sequences = self.reference, self.eval_input().sequences
        path, model_hash = refcache.cache_path(self.settings.ref_cache, ref, sequences, self.settings.device)
        need_hidden = self.settings.layers and ref.gives_hidden
        with locked(path):
            entry = refcache.open_valid(path, need_hidden)
            if entry is not None:
                self.progress(f"reference {ref.name}: outputs from the cache {path}")
                return ReferenceStore.from_cache(entry, need_hidden)
            store = self._run_reference()
            try:
                refcache.write_cache(path, refcache.header_for(ref, model_hash, self.settings.device), sequences,
                                     store.rows, store.hidden if store.has_hidden else None)
            finally:
                store.close()
            refcache.remove_stale(path, str(Path(ref.path).resolve()), model_hash)
            self.progress(f"reference {ref.name}: outputs cached in {path}")
            # compared from the cache like every later run, so the numbers do not depend on who wrote it
            return ReferenceStore.from_cache(refcache.ReferenceCache(path, verify=False), need_hidden,
                                              load_seconds=store.load_seconds, seconds=store.seconds)

    # -- candidates ------------------------------------------------------------------------
    def compare(self, key: str) -> Comparison:
        if key not in self._comparisons:
            cand = self.candidates[key]
            cmp = self._compare(cand)
            cmp.weights_of = lambda: self.weights(key)
            cmp.isolate = self.settings.isolate
            if (cmp.layers is not None and cmp.layers.isolated_rfn is None and cand.kind == "llamacpp"
                    and self.settings.isolate != "never" and self._ref_store is not None
                    and self._ref_store.has_hidden):
                cmp.isolate_of = lambda: self._isolate(cmp)
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
                except ArchitectureNotMapped as exc:  # a skip that says why, not a verdict
                    wc.skipped = str(exc)
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
        run_models = self.settings.logits or self.settings.layers
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
        if run_models and cmp.error is None:
            if self.settings.attribution:
                self._attribute(cmp)
            if self.settings.logits:
                self._long_context(cmp)
        cand.close()  # weights are not needed any more; tokenizer and vocab stay available
        total = time.perf_counter() - started
        # The reference pass is shared: it is charged to the candidate compared first.
        ref_seconds = ref_store.seconds if ref_store else 0.0
        ref_load_s = (ref_store.load_seconds if ref_store else 0.0) + self._ref_load_seconds
        ref_forward, ref_load = (ref_seconds, ref_load_s) if first_use else (0.0, 0.0)
        diagnosis_s = sum(cmp.timings.values())  # attribution_s, long_context_s: set above, timed apart
        cmp.timings.update({
            "reference_forward_s": ref_seconds, "reference_load_s": ref_load_s,
            "candidate_forward_s": cand_seconds, "candidate_load_s": cand_load, "comparison_s": total,
            "overhead_s": max(0.0, total - cand_seconds - cand_load - ref_forward - ref_load - diagnosis_s),
        })
        return cmp

    def _run_candidate(self, cmp: Comparison, ref_store: "ReferenceStore") -> float:
        """The candidate's forward pass over every sequence: position stats, in-memory layer stats
        and dumps. Returns the candidate's forward seconds."""
        cand, sequences = cmp.candidate, cmp.eval.sequences
        writer = self._dump_writer(cand, self._dump_name(cand))
        parts, cand_seconds, last_row = [], 0.0, None
        hidden = self.settings.layers and self._layers_possible(cmp, ref_store)
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
            source = "streamed" if self.reference.kind == "streamed" else "in-memory"  # the reference's states
            cmp.layers = acc.finish(source) if cmp.error is None else None
        if writer:
            self._finish_dumps(cand, writer, last_row, cmp.quant_type)
        return cand_seconds

    # -- diagnosis passes (engine/diagnosis.py) ---------------------------------------------
    def _isolate(self, cmp: Comparison) -> None:
        """The isolated per-layer error of a llama.cpp candidate from a gguf-torch pass over its GGUF
        (llama.cpp cannot take another model's hidden state); called by the layers check."""
        if cmp.layers.isolated_rfn is not None or cmp.isolate_error:
            return
        t0 = time.perf_counter()
        s = self.settings
        try:
            ref, path, sequences = self._reference(), cmp.candidate.path, cmp.eval.sequences
            if s.stream_layers:  # the dequantized candidate may not fit in memory either
                from ..runners.streaming import isolated_pass

                rfn, source = isolated_pass(ref, path, sequences, self.progress), "gguf-torch, streamed"
            else:
                rfn = diagnosis.isolated_pass(ref, path, sequences, s.device, s.threads, self.progress)
                source = "gguf-torch"
            cmp.layers.isolated_rfn, cmp.layers.isolated_source = rfn, source
        except ModelDiffError as exc:
            cmp.isolate_error = str(exc)
        cmp.timings["isolate_s"] = time.perf_counter() - t0

    def _attribute(self, cmp: Comparison) -> None:
        """--modeldiff-attribution: the KLD each unit's candidate weights add alone (diagnosis.attribution)."""
        from ..runners.gguf_torch import GGUFTorchRunner
        from ..runners.hf import TorchCausalLM

        ref, cand, s = self.reference, cmp.candidate, self.settings
        if not (isinstance(ref, TorchCausalLM) and ref.feeds_layers):
            cmp.attribution = {"error": f"the reference runs in {ref.kind}; attribution swaps transformers layers "
                                        "in memory"}
            return
        own = None
        if isinstance(cand, TorchCausalLM):
            torch_cand = cand
        elif cand.kind == "llamacpp":
            torch_cand = own = GGUFTorchRunner(cand.path, s.device, s.threads)
        else:
            cmp.attribution = {"error": f"{cand.path} runs in {cand.kind}, which has no layers to swap"}
            return
        try:
            n = max(len(seq.ids) for seq in cmp.eval.sequences)
            ref.load(n)
            torch_cand.load_weights()  # fed the reference's ids: no tokenizer needed
            cmp.attribution = diagnosis.attribution(ref, torch_cand, cmp.eval.sequences, self.progress)
        except ModelDiffError as exc:
            cmp.attribution = {"error": str(exc)}
        finally:
            if own is not None:
                own.close()
        cmp.timings["attribution_s"] = cmp.attribution.get("seconds", 0.0)

    def long_context_length(self, cand: Runner) -> tuple[int, str]:
        """--modeldiff-long-context, else a length drawn from the models' metadata (0: off)."""
        if self.settings.long_context is not None:
            return self.settings.long_context, "--modeldiff-long-context"
        try:
            return diagnosis.default_long_context(self.reference.hparams(), cand.hparams())
        except ModelDiffError:
            return 0, "no metadata"

    def _long_context(self, cmp: Comparison) -> None:
        """One long sequence through both models: KLD by position bucket (diagnosis.bucket_kld)."""
        length, why = self.long_context_length(cmp.candidate)
        if length <= 0:
            return
        ref, cand = self.reference, cmp.candidate
        fixed = next((r for r in (ref, cand) if r.fixed_sequences()), None)
        if fixed is not None:
            cmp.long_context = {"skipped": f"{fixed.path} is a recording of fixed tokens", "source": why}
            return
        t0 = time.perf_counter()
        try:
            if self._long_ref is None or self._long_ref[0] != length:
                vocab = ref.vocab()
                bos_id = vocab.special.get("bos") if vocab and vocab.add_bos else None
                ids = diagnosis.long_sequence(cmp.eval.sequences, length, bos_id)
                ref.load(length)
                self._long_ref = (length, ids, ref.logits(ids))
            _, ids, ref_logits = self._long_ref
            cand.load(length)
            cand_logits = cand.logits(ids)
            window = (ref.hparams() or {}).get("sliding_window")
            cmp.long_context = {**diagnosis.bucket_kld(ref_logits, cand_logits,
                                                       window=window if isinstance(window, int) else None),
                                "source": why}
        except ModelDiffError as exc:
            cmp.long_context = {"error": str(exc), "source": why}
        cmp.timings["long_context_s"] = time.perf_counter() - t0
        if cmp.long_context is not None:
            cmp.long_context["seconds"] = cmp.timings["long_context_s"]

    def _layers_possible(self, cmp: Comparison, ref_store: "ReferenceStore") -> bool:
        """Both sides must give hidden states, else the layers check is skipped, saying why."""
        unmapped = self.reference.layers_unmapped(cmp.candidate) or cmp.candidate.layers_unmapped(self.reference)
        if unmapped:  # capture points not known to be equal: no verdict either way
            cmp.layers_skipped = unmapped
            return False
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
