"""A reference cache file (.mdref, refcache.py) as a model: the recorded token ids, logits and
hidden states, vocabulary and hyper-parameters of the reference that wrote it, so a candidate can
be checked on a machine without the reference model (like llama-perplexity's
--kl-divergence-base). No tokenizer: the tokens check is skipped."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import ModelDiffError
from ..formats.fields import short
from ..formats.refcache import SUFFIX, ReferenceCache
from ..formats.vocab import VocabInfo
from .base import FixedSequence, Forward, Runner


class RefCacheRunner(Runner):
    kind = "refcache"
    has_weights = False

    def __init__(self, path: Path, device: str = "cpu", threads: int | None = None):
        super().__init__(path, device, threads)
        if self.path.suffix != SUFFIX:
            raise ModelDiffError(f"{self.path}: a reference cache must be a {SUFFIX} file")
        self.cache = ReferenceCache(self.path)
        self.header = self.cache.header
        self.sequences = [FixedSequence(s["ids"], s["text"], s["label"], tuple(s["scored"]) if s["scored"] else None)
                          for s in self.cache.sequences]
        self._vocab = self._checked_vocab()

    def _checked_vocab(self) -> VocabInfo | None:
        """The recorded vocabulary; what the checks read of the header is checked at open (the
        checksum proves the file intact, not that its writer used these types)."""
        h, optional = self.header, (dict, type(None))
        for field, types in (("quant_type", str), ("versions", optional), ("hparams", optional),
                             ("vocab", optional)):
            if not isinstance(h.get(field), types):
                raise ModelDiffError(f"{self.path}: reference cache field {field} is {short(h.get(field))}, "
                                     f"expected {'a string' if types is str else 'an object or null'}")
        try:
            vocab = VocabInfo(**h["vocab"]) if h.get("vocab") else None
        except TypeError as exc:
            raise ModelDiffError(f"{self.path}: reference cache vocab is not a vocabulary ({exc})") from None
        if vocab and not (isinstance(vocab.tokens, list) and all(isinstance(t, str) for t in vocab.tokens)):
            raise ModelDiffError(f"{self.path}: reference cache vocab tokens are not a list of strings")
        if vocab and not isinstance(vocab.chat_template, (str, type(None))):
            raise ModelDiffError(f"{self.path}: reference cache chat template is {short(vocab.chat_template)}, "
                                 "expected a string or null")
        return vocab

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def gives_hidden(self) -> bool:
        return self.cache.has_hidden

    def load(self, max_tokens: int) -> None:
        pass

    def quant_type(self) -> str:
        return self.header["quant_type"]

    def compute_dtype(self) -> tuple[str, str] | None:
        dtype = self.header.get("compute_dtype")
        return (dtype, f"as cached in {self.path.name}") if isinstance(dtype, str) else None

    def type_label(self) -> str:
        """As the recorded reference ran ("float32 (stored bfloat16)"); older caches: the stored type."""
        label = self.header.get("type")
        return label if isinstance(label, str) else self.quant_type()

    def fixed_sequences(self) -> list[FixedSequence]:
        return self.sequences

    def _index(self, ids: Sequence[int]) -> int:
        ids = list(ids)
        for i, seq in enumerate(self.sequences):
            if seq.ids == ids:
                return i
        raise ModelDiffError(f"{self.path}: holds no sequence of these {len(ids)} token ids")

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        return self.cache.logits(self._index(ids))

    def forward(self, ids, hidden=False, feed=None, keep=0) -> Forward:
        i = self._index(ids)
        return Forward(self.cache.logits(i), self.cache.hidden(i) if hidden else None)

    def vocab(self) -> VocabInfo | None:
        return self._vocab

    def hparams(self):
        return self.header.get("hparams")

    def piece(self, token_id: int) -> str:
        tokens = self._vocab.tokens if self._vocab else []
        return tokens[token_id] if 0 <= token_id < len(tokens) else f"<{token_id}>"

    def versions(self) -> dict[str, str]:
        return dict(self.header.get("versions") or {})
