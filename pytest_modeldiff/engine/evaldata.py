"""Evaluation input: the built-in prompt set, a text file, or a parquet dataset.

Two things come out: ``texts`` for the tokens check (each side tokenizes them itself) and
``sequences`` of *reference* token ids, which are fed to both models for every logit metric, so
a tokenizer bug shows as a tokens failure and never as (or hidden in) a logit difference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import ModelDiffError

# First is llama.cpp's default conversion-check prompt, so the last-position dump matches theirs.
BUILTIN_PROMPTS: list[tuple[str, str]] = [
    ("llama.cpp default", "Hello, my name is"),
    ("prose", "The committee met on a grey Tuesday morning to review the harbour plans. After two "
              "hours of debate, they agreed that the old lighthouse would be restored rather than "
              "demolished, and that the fishing boats would keep their moorings along the north wall."),
    ("code", "def fibonacci(n: int) -> list[int]:\n    \"\"\"Return the first n numbers.\"\"\"\n"
             "    seq = [0, 1]\n    while len(seq) < n:\n        seq.append(seq[-1] + seq[-2])\n"
             "    return seq[:n]\n\nif __name__ == \"__main__\":\n    print(fibonacci(10))\n"),
    ("numbers", "In 1969, 3 astronauts flew 384,400 km; pi = 3.14159265, e = 2.71828, 0x1F = 31, "
                "1e-5 < 0.001, 2026-11-21 12:34:56, +44 20 7946 0958, 99.9% of 1,234,567.89."),
    ("whitespace", "a  b   c    d\n\n\nfour    spaces\tand\ttabs\n        indented\n \n  \n\t\t\nend  "),
    ("non-english", "Der schnelle braune Fuchs springt. Съешь же ещё этих мягких французских булок. "
                    "東京は日本の首都です。 Café naïve façade — «ça va?» 😀🚀 مرحبا بالعالم"),
    ("special tokens", "{bos}user\nWhat is the capital of France?{eos}\n{bos}assistant\nParis.{eos}"),
]


@dataclass
class EvalSequence:
    ids: list[int]  # reference-tokenizer ids fed to both models
    text: str | None = None
    label: str = ""
    scored: tuple[int, int] | None = None  # compared positions [start, stop); None: every position

    def compared(self, n_rows: int):
        """Positions whose logits are compared when a runner returned the last ``n_rows`` rows."""
        import numpy as np

        start, stop = self.scored or (0, len(self.ids))
        return np.arange(max(start, len(self.ids) - n_rows), stop)


@dataclass
class EvalInput:
    texts: list[tuple[str, str]] = field(default_factory=list)  # (label, text) for the tokens check
    sequences: list[EvalSequence] = field(default_factory=list)


def fill_special(text: str, bos: str | None, eos: str | None) -> str:
    """Insert the reference tokenizer's own special-token strings into a template prompt."""
    return text.replace("{bos}", bos or "").replace("{eos}", eos or "")


def builtin_input(tokenize: Callable[[str], list[int]], max_length: int,
                  bos: str | None, eos: str | None) -> EvalInput:
    texts = [(label, fill_special(text, bos, eos)) for label, text in BUILTIN_PROMPTS]
    sequences = []
    for label, text in texts:
        ids = tokenize(text)
        # a cut sequence no longer stands for its whole text (a dump of it must not claim it)
        sequences.append(EvalSequence(ids[:max_length], text if len(ids) <= max_length else None, label))
    return EvalInput(texts, sequences)


def read_text_file(path: Path) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelDiffError(f"{path}: --eval-text file not found") from None
    except UnicodeDecodeError as exc:
        raise ModelDiffError(f"{path}: --eval-text is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise ModelDiffError(f"{path}: --eval-text file is empty")
    return text


def read_parquet_rows(path: Path, column: str, max_chars: int) -> list[str]:
    """The non-empty values of ``column``, read until ``max_chars`` characters are collected."""
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except FileNotFoundError:
        raise ModelDiffError(f"{path}: --eval-dataset file not found") from None
    except Exception as exc:
        raise ModelDiffError(f"{path}: not a readable parquet file ({exc})") from None
    if column not in parquet.schema_arrow.names:
        raise ModelDiffError(f"{path}: no column {column!r}; columns are {parquet.schema_arrow.names} "
                             "(choose one with --eval-column)")
    rows, size = [], 0
    for batch in parquet.iter_batches(columns=[column], batch_size=256):
        for value in batch.column(0).to_pylist():
            if value:
                rows.append(str(value))
                size += len(rows[-1])
        if size >= max_chars:
            break
    if not rows:
        raise ModelDiffError(f"{path}: column {column!r} holds no text")
    return rows


def dataset_input(texts: list[str], tokenize: Callable[[str], list[int]], rows: int, length: int,
                  bos_id: int | None, label: str) -> EvalInput:
    """exllamav2's evaluation layout (conversion/tokenize.py get_tokens): each dataset row is
    tokenized on its own without special tokens, the ids are concatenated, and the first
    rows x length ids are cut into ``rows`` sequences of ``length``; no BOS is inserted."""
    ids: list[int] = []
    used = 0
    for text in texts:
        row = tokenize(text)
        ids += row[1:] if bos_id is not None and row[:1] == [bos_id] else row
        used += 1
        if len(ids) >= rows * length:
            break
    sequences = [EvalSequence(ids[r * length:(r + 1) * length], None, f"{label} row {r}") for r in range(rows)
                 if len(ids[r * length:(r + 1) * length]) >= 2]
    if not sequences:
        raise ModelDiffError(f"{label}: too little text for one sequence of {length} tokens")
    return EvalInput([(label, "\n\n".join(texts[:used])[: 40 * rows * length])], sequences)


def perplexity_input(text: str, tokenize: Callable[[str], list[int]], n_ctx: int, max_chunks: int,
                     bos_id: int | None, label: str) -> EvalInput:
    """llama-perplexity's layout (tools/perplexity, perplexity() and kl_divergence()): the whole
    text tokenized once with BOS as the model adds it, cut into chunks of n_ctx tokens, each
    chunk's first token replaced by BOS when the model adds one, and only positions
    n_ctx/2 .. n_ctx-2 scored (each predicts the next token: 255 per chunk at n_ctx 512)."""
    ids = tokenize(text)
    n_chunks = min(max_chunks, len(ids) // n_ctx)
    if len(ids) < 2 * n_ctx:
        raise ModelDiffError(f"{label}: llama-perplexity needs at least {2 * n_ctx} tokens for a context of {n_ctx} "
                             f"(--eval-length); the text gives {len(ids)}")
    sequences = []
    for chunk in range(n_chunks):
        part = ids[chunk * n_ctx:(chunk + 1) * n_ctx]
        if bos_id is not None:
            part = [bos_id] + part[1:]
        sequences.append(EvalSequence(part, None, f"{label} chunk {chunk}", scored=(n_ctx // 2, n_ctx - 1)))
    return EvalInput([(label, text[: 40 * n_chunks * n_ctx])], sequences)


def chunked_input(text: str, tokenize: Callable[[str], list[int]], rows: int, length: int,
                  bos_id: int | None, label: str) -> EvalInput:
    """Tokenize once, cut into ``rows`` sequences of ``length`` tokens (exllamav2's eval layout);
    each sequence starts with BOS when the reference adds one (llama-perplexity does the same)."""
    ids = tokenize(text)
    if bos_id is not None and ids and ids[0] == bos_id:
        ids = ids[1:]
    body = length - (1 if bos_id is not None else 0)
    sequences = []
    for row in range(rows):
        chunk = ids[row * body:(row + 1) * body]
        if len(chunk) < 2:
            break
        prefix = [bos_id] if bos_id is not None else []
        sequences.append(EvalSequence(prefix + chunk, None, f"{label} row {row}"))
    if not sequences:
        raise ModelDiffError(f"{label}: too little text for one sequence of {length} tokens")
    # The tokens check compares both tokenizers on the text these sequences came from.
    return EvalInput([(label, text[: 40 * rows * length])], sequences)
