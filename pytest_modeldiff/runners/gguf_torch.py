"""A GGUF's tensors dequantized with ``gguf`` and run in transformers (float32).

Same weights as the llama.cpp runner, different kernels: if a metric fails here too the error
is in the weights (conversion or quantization); if it fails only under llama.cpp, in the runtime.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

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

    def isolated_states(self, ids: Sequence[int], feed: np.ndarray) -> np.ndarray:
        """Each decoder layer's output (and the final norm's) when fed the reference's input ``feed``
        (canonical layout, layers.py): one pass, without the model's own states. For llama.cpp
        candidates, whose runtime cannot take another model's state (--modeldiff-isolate)."""
        import torch

        self.check_ids(ids, self.model.get_input_embeddings().num_embeddings)
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.model.device)
        blocks, norm = self._blocks()
        ref = torch.as_tensor(feed, device=self.model.device)[:, None]
        _, states = self._run(input_ids, blocks, norm, {i: ref[i] for i in range(len(blocks) + 1)})
        return states[:, 0].float().cpu().numpy()

    def quant_type(self) -> str:
        return self.gguf.quant_type

    def vocab(self) -> VocabInfo:
        return self.gguf.vocab()

    def hparams(self) -> dict[str, Any]:
        return self.gguf.hparams()

    def versions(self) -> dict[str, str]:
        import gguf

        return {**super().versions(), "gguf": getattr(gguf, "__version__", "?")}
