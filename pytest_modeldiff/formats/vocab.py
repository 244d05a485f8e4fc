"""A model's vocabulary as the vocab check compares it, whichever file it came from (a GGUF's
tokenizer.ggml.* keys, a HF tokenizer, a reference cache's header)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class VocabInfo:
    tokens: list[str]
    merges: list[str] | None = None  # BPE merges "a b"
    scores: list[float] | None = None  # SentencePiece / Unigram piece scores
    special: dict[str, int | None] = field(default_factory=dict)  # bos, eos, unk, pad
    add_bos: bool | None = None
    add_eos: bool | None = None
