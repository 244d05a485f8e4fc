"""A weights-only file (.safetensors, torch .pt/.pth/.bin, .npz, .npy): the weights check reads it,
nothing runs. Lets the plugin, the CLI and compare() diff any two checkpoints (a fine-tune against
its base, two exports of one model) with ``--modeldiff-checks weights``."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..errors import ModelDiffError
from ..weights.files import open_weights
from .base import Runner


class WeightsRunner(Runner):
    kind = "weights"

    def __init__(self, path: Path, device: str = "cpu", threads: int | None = None):
        super().__init__(path, device, threads)
        self.reader = open_weights(self.path)  # validates the file now, not at the first check

    def require_model(self):
        raise ModelDiffError(f"{self.path}: a weights-only file cannot run a model; compare it with "
                             "--modeldiff-checks weights (or compare(..., checks=['weights']))")

    def load(self, max_tokens: int) -> None:
        self.require_model()

    def logits(self, ids: Sequence[int]):
        self.require_model()

    def quant_type(self) -> str:
        return self.reader.dominant_type()
