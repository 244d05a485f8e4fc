"""A GGUF's tensors dequantized with ``gguf`` and run in transformers (float32).

Same weights as the llama.cpp runner, different kernels: if a metric fails here too the error
is in the weights (conversion or quantization); if it fails only under llama.cpp, in the runtime.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..formats.gguf_file import open_gguf
from ..formats.vocab import VocabInfo
from .hf import TorchCausalLM


class GGUFTorchRunner(TorchCausalLM):
    kind = "gguf-torch"

    def __init__(self, path: Path, device: str = "cpu", threads: int | None = None):
        super().__init__(path, device, threads)
        self.gguf = open_gguf(self.path)

    def _source(self) -> tuple[Path, dict]:
        return self.path.parent, {"gguf_file": self.path.name}  # transformers dequantizes the tensors

    def quant_type(self) -> str:
        return self.gguf.quant_type

    def vocab(self) -> VocabInfo:
        return self.gguf.vocab()

    def hparams(self) -> dict[str, Any]:
        return self.gguf.hparams()

    def versions(self) -> dict[str, str]:
        import gguf

        return {**super().versions(), "gguf": getattr(gguf, "__version__", "?")}
