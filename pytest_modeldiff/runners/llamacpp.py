"""Candidate runner: a GGUF file run by llama.cpp through llama-cpp-python, logits at every position."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import ModelDiffError
from ..gguf_file import open_gguf
from .base import Forward, Runner, VocabInfo


class LlamaCppRunner(Runner):
    kind = "llamacpp"
    dump_prefix = "llamacpp"
    gives_hidden = True

    def __init__(self, path: Path, device: str = "cpu", threads: int | None = None):
        super().__init__(path, device, threads)
        self.gguf = open_gguf(self.path)
        self.llm = None
        self._capture: _StateCapture | None = None

    def load_tokenizer(self) -> None:
        pass  # tokenize() opens a vocabulary-only model on demand

    def load(self, max_tokens: int) -> None:
        if self.llm is not None and not self.llm.model_params.vocab_only and self.llm.n_ctx() >= max_tokens:
            return
        self.close()
        try:
            from llama_cpp import Llama
        except ImportError:
            raise ModelDiffError(
                "the llamacpp runner needs llama-cpp-python: pip install 'pytest-modeldiff[llamacpp]'") from None
        n_ctx = max(512, max_tokens)
        try:
            self.llm = Llama(
                model_path=str(self.path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=min(n_ctx, 512),
                logits_all=True, verbose=False, seed=0,
                n_threads=self.threads or max(1, (os.cpu_count() or 2)),
                n_gpu_layers=-1 if self.device.startswith("cuda") else 0,
            )
        except Exception as exc:
            raise ModelDiffError(f"{self.path}: llama.cpp could not load the model: {exc}") from None

    def quant_type(self) -> str:
        return self.gguf.quant_type

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        self.check_ids(ids, self.llm.n_vocab())
        self.llm.reset()
        try:
            self.llm.eval(list(ids))
        except Exception as exc:  # llama_decode failures surface as RuntimeError
            raise ModelDiffError(f"{self.path}: llama.cpp could not evaluate {len(ids)} tokens: {exc}") from None
        return np.array(self.llm.scores[: len(ids)], dtype=np.float32)

    def forward(self, ids: Sequence[int], hidden: bool = False, feed: np.ndarray | None = None,
                keep: int = 0) -> Forward:
        if not hidden:
            return Forward(self.logits(ids))
        self.check_ids(ids, self.llm.n_vocab())
        if self._capture is None:
            self._capture = _StateCapture(self.llm)
        try:
            logits, states = self._capture.run(list(ids))
        except RuntimeError as exc:
            raise ModelDiffError(f"{self.path}: llama.cpp could not evaluate {len(ids)} tokens: {exc}") from None
        return Forward(logits, states)

    def _vocab_model(self):
        """The loaded model, or after ``close`` a vocabulary-only one (for failure messages)."""
        if self.llm is None:
            from llama_cpp import Llama

            try:
                self.llm = Llama(model_path=str(self.path), vocab_only=True, verbose=False)
            except Exception as exc:
                raise ModelDiffError(f"{self.path}: llama.cpp could not load the vocabulary: {exc}") from None
        return self.llm

    def tokenize(self, text: str) -> list[int]:
        # add_bos=True means "add the special tokens this model's metadata asks for"
        return list(self._vocab_model().tokenize(text.encode("utf-8"), add_bos=True, special=True))

    def piece(self, token_id: int) -> str:
        return self._vocab_model().detokenize([int(token_id)], special=True).decode("utf-8", errors="replace")

    def vocab(self) -> VocabInfo:
        return self.gguf.vocab()

    def hparams(self) -> dict[str, Any]:
        return self.gguf.hparams()

    def versions(self) -> dict[str, str]:
        import llama_cpp

        return {"llama-cpp-python": llama_cpp.__version__}

    def close(self) -> None:
        if self._capture is not None:
            self._capture.close()
            self._capture = None
        if self.llm is not None:
            self.llm.close()
            self.llm = None


class _StateCapture:
    """A second llama.cpp context on the same weights whose eval callback copies out the
    canonical states (layers.py): "embd", "l_out-<i>", "result_norm". The callback asks only for
    those tensors (llama.cpp then keeps the rest of the graph fused), every position requests
    logits (otherwise the last layer runs on output rows only), and micro-batches are concatenated.
    llama-cpp-python binds neither ggml_get_name nor ggml_backend_tensor_get: declared here."""

    def __init__(self, llm):
        import ctypes

        from llama_cpp import _ggml, llama_cpp as C
        from llama_cpp._internals import LlamaBatch, LlamaContext

        ggml = _ggml.libggml
        for name, restype, argtypes in (
                ("ggml_get_name", ctypes.c_char_p, [ctypes.c_void_p]),
                ("ggml_nelements", ctypes.c_int64, [ctypes.c_void_p]),
                ("ggml_nrows", ctypes.c_int64, [ctypes.c_void_p]),
                ("ggml_nbytes", ctypes.c_size_t, [ctypes.c_void_p]),
                ("ggml_backend_tensor_get", None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t])):
            getattr(ggml, name).restype, getattr(ggml, name).argtypes = restype, argtypes
        self.ggml = ggml
        self.n_layers = C.llama_model_n_layer(llm._model.model)
        self.n_vocab = llm.n_vocab()
        self.wanted = {"embd": 0, **{f"l_out-{i}": i + 1 for i in range(self.n_layers)},
                       "result_norm": self.n_layers + 1}
        self.chunks: dict[int, list[np.ndarray]] = {}
        self.callback = C.ggml_backend_sched_eval_callback(self._on_tensor)  # kept alive with self
        params = C.llama_context_default_params()
        ctypes.memmove(ctypes.addressof(params), ctypes.addressof(llm.context_params), ctypes.sizeof(params))
        params.cb_eval = self.callback
        self.n_ctx = params.n_ctx
        self.context = LlamaContext(model=llm._model, params=params, verbose=False)
        self.batch = LlamaBatch(n_tokens=params.n_batch, embd=0, n_seq_max=1, verbose=False)

    def _on_tensor(self, tensor, ask, user_data) -> bool:
        index = self.wanted.get(self.ggml.ggml_get_name(tensor).decode("utf-8", "replace"))
        if ask or index is None:
            return index is not None
        n, rows = self.ggml.ggml_nelements(tensor), self.ggml.ggml_nrows(tensor)
        if self.ggml.ggml_nbytes(tensor) != 4 * n:  # not contiguous float32: cannot read it as such
            return False
        data = np.empty(n, dtype=np.float32)
        self.ggml.ggml_backend_tensor_get(tensor, data.ctypes.data, 0, data.nbytes)
        self.chunks.setdefault(index, []).append(data.reshape(rows, n // rows))
        return True

    def run(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        from llama_cpp import llama_cpp as C

        if len(ids) > self.n_ctx:
            raise RuntimeError(f"{len(ids)} tokens exceed the context of {self.n_ctx}")
        self.chunks = {}
        self.context.kv_cache_clear()
        self.batch.set_batch(ids, n_past=0, logits_all=True)
        self.context.decode(self.batch)
        logits = np.ctypeslib.as_array(C.llama_get_logits(self.context.ctx), shape=(len(ids), self.n_vocab)).copy()
        missing = [name for name, i in self.wanted.items() if i not in self.chunks]
        if missing:
            raise RuntimeError(f"the graph has no tensor(s) {', '.join(missing[:3])} for per-layer capture "
                               "(an architecture with other tensor names)")
        states = np.stack([np.concatenate(self.chunks[i]) for i in range(self.n_layers + 2)])
        self.chunks = {}
        return logits, states

    def close(self) -> None:
        self.batch.close()
        self.context.close()
