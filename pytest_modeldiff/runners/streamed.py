"""A HF folder or GGUF run in transformers one module at a time from its weight files
(streaming.py): the reference for models larger than RAM (--modeldiff-stream-layers).

Every sequence goes through each module before the next is read, so forward_all() is the way to
run it; forward() on one sequence reads the whole model once. Float32, on the CPU.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from ..errors import ModelDiffError, ModelDiffUsageError
from .base import Forward, Runner
from .gguf_torch import GGUFTorchRunner
from .hf import HFRunner


class _Streamed:
    """Mixed in before a torch runner: its tokenizer, vocabulary and metadata, streamed weights."""

    kind = "streamed"
    feeds_layers = False  # it has no layers in memory to feed another model's states to
    reports_progress = True  # per module; all sequences finish together
    streamed = None
    checkpoint_dir: Path | None = None  # where progress is saved (set by the engine; None: the default)

    def load(self, max_tokens: int) -> None:
        from .streaming import StreamedModel

        self.load_tokenizer()
        if self.threads:
            import torch

            torch.set_num_threads(self.threads)
        if self.streamed is None:
            self.streamed = StreamedModel(self.path)

    def forward_all(self, sequences: Sequence[Sequence[int]], hidden: bool = False,
                    progress: Callable[[str], None] = lambda message: None) -> list[Forward]:
        from .streaming import stream_forward

        self.load(0)
        return stream_forward(self.streamed, [list(ids) for ids in sequences], hidden,
                              self.checkpoint_dir, progress=progress)

    def forward(self, ids: Sequence[int], hidden: bool = False, feed=None, keep: int = 0) -> Forward:
        if feed is not None:
            raise ModelDiffError(f"{self.path}: a streamed model cannot take another model's hidden states")
        return self.forward_all([ids], hidden)[0]

    def logits(self, ids: Sequence[int]):
        return self.forward(ids).logits

    def compute_dtype(self) -> tuple[str, str]:
        return "float32", "streamed: one module at a time in float32"

    def type_label(self) -> str:
        stored = self.quant_type()
        return stored if stored == "float32" else f"float32 (stored {stored}, streamed)"

    def close(self) -> None:
        self.streamed = None


class StreamedHFRunner(_Streamed, HFRunner):
    def __init__(self, path: Path, device: str = "cpu", threads: int | None = None):
        super().__init__(path, device, threads)
        if "quantization_config" in self.config:
            raise ModelDiffError(f"{self.path}: a quantized checkpoint cannot be streamed (its own kernels)")


class StreamedGGUFRunner(_Streamed, GGUFTorchRunner):
    pass


def streamed_runner(path: Path, device: str = "cpu", threads: int | None = None) -> Runner:
    if device != "cpu":
        raise ModelDiffUsageError(f"{path}: streaming runs on the CPU (--modeldiff-device {device})")
    if Path(path).suffix == ".gguf":
        return StreamedGGUFRunner(path, device, threads)
    return StreamedHFRunner(path, device, threads)
