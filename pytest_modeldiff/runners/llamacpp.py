"""Candidate runner: a GGUF file run by llama.cpp through llama-cpp-python, logits at every position."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import ModelDiffError
from ..gguf_file import open_gguf
from .base import Runner, VocabInfo


class LlamaCppRunner(Runner):
    kind = "llamacpp"
    dump_prefix = "llamacpp"

    def __init__(self, path: Path, device: str = "cpu", threads: int | None = None):
        super().__init__(path, device, threads)
        self.gguf = open_gguf(self.path)
        self.llm = None

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
        n_vocab = self.llm.n_vocab()
        if not ids or min(ids) < 0 or max(ids) >= n_vocab:
            raise ModelDiffError(f"{self.path}: token ids must be 0..{n_vocab - 1} (got {len(ids)} ids, "
                                 f"range {min(ids, default=None)}..{max(ids, default=None)})")
        self.llm.reset()
        try:
            self.llm.eval(list(ids))
        except Exception as exc:  # llama_decode failures surface as RuntimeError
            raise ModelDiffError(f"{self.path}: llama.cpp could not evaluate {len(ids)} tokens: {exc}") from None
        return np.array(self.llm.scores[: len(ids)], dtype=np.float32)

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
        if self.llm is not None:
            self.llm.close()
            self.llm = None
