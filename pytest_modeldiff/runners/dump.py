"""Logits recorded earlier: llama.cpp model-conversion dumps (data/pytorch-*.bin,
data/llamacpp-*.bin with their -tokens.bin) or our own all-positions dumps."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import ModelDiffError
from ..formats.dumps import companion, read_description, read_dump
from . import MODEL_ENV
from .base import FixedSequence, Runner

# quant labels as they appear in GGUF file names: model-q4_k_m, model-Q8_0, model-bf16 ...
_QUANT_IN_NAME = re.compile(r"(?:^|[-_.])((?:b?f(?:16|32))|(?:i?q\d(?:_[a-z0-9]+)*))$", re.IGNORECASE)


class DumpRunner(Runner):
    kind = "dump"
    has_weights = False

    def __init__(self, path: Path, device: str = "cpu", threads: int | None = None):
        super().__init__(path, device, threads)
        if self.path.suffix != ".bin":
            raise ModelDiffError(f"{self.path}: a logits dump must be a .bin file")
        self.rows, seqs, texts, self.n_vocab = read_dump(self.path)
        self.sequences = [FixedSequence(ids, text) for ids, text in zip(seqs, texts)]
        self._meta_quant = (read_description(self.path) or {}).get("quant_type")

    @property
    def name(self) -> str:
        return self.path.name[: -len(".bin")]

    def files(self) -> list[Path]:
        return [self.path, companion(self.path, "-tokens.bin")]

    def load(self, max_tokens: int) -> None:
        pass

    def quant_type(self) -> str:
        if self._meta_quant:
            return self._meta_quant
        match = _QUANT_IN_NAME.search(self.name.removesuffix("-all"))
        return match.group(1).upper() if match else "GUESSED"

    def fixed_sequences(self) -> list[FixedSequence]:
        return self.sequences

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        ids = list(ids)
        start = 0
        for seq in self.sequences:
            n_rows = len(seq.ids) if self.n_vocab else 1
            if seq.ids == ids:
                return np.asarray(self.rows[start:start + n_rows], dtype=np.float32)
            start += n_rows
        raise ModelDiffError(
            f"{self.path}: was recorded on other tokens than the {len(ids)} asked for; "
            "logit metrics need both sides to see the same ids (see the tokens check)")

    def declared_transformers_version(self) -> str | None:
        """As llama.cpp's compare scripts do: the original model's folder is $MODEL_PATH."""
        folder = os.environ.get(MODEL_ENV["reference"])
        if not folder:
            return None
        try:
            version = json.loads((Path(folder) / "config.json").read_text()).get("transformers_version")
        except (OSError, ValueError, AttributeError, RecursionError):  # only a hint: no config, no hint
            return None
        return version if isinstance(version, str) else None

    def tokenize(self, text: str) -> list[int] | None:
        return next((s.ids for s in self.sequences if s.text == text), None)
