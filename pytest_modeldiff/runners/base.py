"""The runner interface: everything the comparison engine needs from a model, nothing more.

A runner is cheap to construct (it only validates the path); ``load`` does the heavy work.
Metrics, checks and the plugin only talk to this interface, so a new runtime is one new module.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Sequence

import numpy as np

from ..errors import ModelDiffError
from ..formats.dumps import model_name
from ..formats.vocab import VocabInfo


def model_files(path: Path) -> list[Path]:
    """A model folder's files, or the model file itself."""
    return sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]


@dataclass
class Forward:
    """One forward pass: logits (n_tokens, n_vocab) and, when asked, hidden states in the
    canonical layout of layers.py, (n_states, n_tokens, n_embd) float32."""

    logits: np.ndarray
    hidden: np.ndarray | None = None
    isolated: np.ndarray | None = None  # each layer's output when fed the reference's input


@dataclass
class FixedSequence:
    """A token sequence recorded by a dump or cache; text is known when it kept the prompt."""

    ids: list[int]
    text: str | None = None
    label: str = ""
    scored: tuple[int, int] | None = None  # compared positions (llama-perplexity layout), None: all


class Runner(ABC):
    kind: ClassVar[str]
    # llama.cpp's model-conversion dump prefix for this runtime ("pytorch" or "llamacpp")
    dump_prefix: ClassVar[str | None] = None
    gives_hidden: ClassVar[bool] = False  # forward() can return hidden states
    feeds_layers: ClassVar[bool] = False  # can run its layers on the reference's states
    has_weights: ClassVar[bool] = True  # its path holds weight files the weights check can read
    reports_progress: ClassVar[bool] = False  # forward_all reports its own progress (not per sequence)
    dtype: str = "auto"  # torch runners: the precision asked for (--ref-dtype); other runtimes run their own types

    def __init__(self, path: Path, device: str = "cpu", threads: int | None = None):
        self.path = Path(path)
        self.device = device
        self.threads = threads

    @property
    def name(self) -> str:
        """llama.cpp's naming: the path's base name with a trailing .gguf removed."""
        return model_name(str(self.path.absolute()))  # absolute: "." names the folder; symlinks keep their name

    def files(self) -> list[Path]:
        """The files that define the model (hashed into the dump metadata)."""
        return model_files(self.path)

    def size(self) -> dict | None:
        """Its weight files' bytes, parameters and bits per weight (None without weights)."""
        from ..weights.files import model_size

        return model_size(self.path) if self.has_weights else None

    @abstractmethod
    def load(self, max_tokens: int) -> None:
        """Load weights and tokenizer; ``max_tokens`` is the longest sequence to be run."""

    @abstractmethod
    def quant_type(self) -> str:
        """"F16", "Q4_K_M", "float32", "bfloat16", "int4" ... (see registry.quant_class)."""

    def type_label(self) -> str:
        """The type as the model runs, for people: the stored type unless the runner computes
        in another one (hf: "float32 (stored bfloat16)"). quant_type() picks the quant class."""
        return self.quant_type()

    @abstractmethod
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """float32 logits of shape (len(ids), n_vocab); dumps may return only the last row (1, n_vocab)."""

    def forward(self, ids: Sequence[int], hidden: bool = False, feed: np.ndarray | None = None,
                keep: int = 0) -> Forward:
        """Logits, plus hidden states if ``hidden`` (runners with ``gives_hidden``). Runners that
        ``feeds_layers`` also take the reference's states ``feed``: they then return each layer's
        output on the reference's input (``isolated``) and continue from the reference's state
        after the first ``keep`` layers (exllamav2's layer swap)."""
        return Forward(self.logits(ids))

    def forward_all(self, sequences: Sequence[Sequence[int]], hidden: bool = False,
                    progress: Callable[[str], None] = lambda message: None) -> Iterator[Forward]:
        """``forward`` of every sequence, in order. Runners that read their weights once for all
        sequences (streamed.py) override it; ``progress`` is theirs to report on."""
        for ids in sequences:
            yield self.forward(ids, hidden=hidden)

    def check_ids(self, ids: Sequence[int], n_vocab: int) -> None:
        """Token ids outside the model's vocabulary are bad input, not a runtime crash."""
        if not ids or min(ids) < 0 or max(ids) >= n_vocab:
            raise ModelDiffError(f"{self.path}: token ids must be 0..{n_vocab - 1} (got {len(ids)} ids, "
                                 f"range {min(ids, default=None)}..{max(ids, default=None)})")

    def require_model(self) -> None:
        """Raise ModelDiffError if this path cannot run a model (a weights-only file)."""

    def load_tokenizer(self) -> None:
        """Make tokenize/piece/vocab usable; runners that can do so without the weights override."""
        self.load(2)

    def tokenize(self, text: str) -> list[int] | None:
        """The model's own tokenization, special tokens parsed and BOS/EOS added as configured."""
        return None

    def piece(self, token_id: int) -> str:
        """Readable text of one token, for failure messages."""
        return f"<{token_id}>"

    def vocab(self) -> VocabInfo | None:
        return None

    def hparams(self) -> dict[str, Any] | None:
        return None

    def compute_dtype(self) -> tuple[str, str] | None:
        """(the dtype the model's arithmetic runs in, why that one) for runners that choose one
        (torch); None where the runtime picks per tensor (llama.cpp) or nothing runs (dumps)."""
        return None

    def layers_unmapped(self, other: "Runner") -> str | None:
        """Why this runner's hidden states cannot be paired with ``other``'s (its architecture's
        capture points are not known, formats/architectures.py), None when they can."""
        return None

    def fixed_sequences(self) -> list[FixedSequence] | None:
        """Sequences a dump was recorded on; None for runners that can run any tokens."""
        return None

    def versions(self) -> dict[str, str]:
        """Library versions that produced the logits."""
        return {}

    def declared_transformers_version(self) -> str | None:
        """The transformers version named by the model's HF config.json (the one that wrote it)."""
        return None

    def close(self) -> None:
        """Release the weights; tokenize, piece, vocab and hparams keep working."""
