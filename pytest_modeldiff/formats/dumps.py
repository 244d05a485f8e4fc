"""llama.cpp-compatible logit dumps: the files examples/model-conversion writes and reads.

Last-position files (what compare-logits.py and check-nmse.py read from ``data/``):
    {prefix}-{name}.bin          float32 logits of the last position, n_vocab values, no header
    {prefix}-{name}.txt          the same as "i: value" lines
    {prefix}-{name}-tokens.bin   int32 token ids fed to the model
    {prefix}-{name}-prompt.txt   prompt, n_tokens, token ids
prefix is "pytorch" for torch runtimes and "llamacpp" for llama.cpp; name is the model folder's
base name or the GGUF's stem. All-positions dump (ours, same raw layout):
    {prefix}-{name}-all.bin / -all-tokens.bin   every sequence's rows and ids, concatenated
    {prefix}-{name}-all.json                    n_vocab, sequence lengths and texts, model file
                                                hashes, library versions, settings
Every file is written to a temporary name and renamed (atomic.py), so an interrupted run leaves
no half file; an -all.bin whose -all.json is missing (a run killed while publishing) is refused.
A folder of such dumps (llama.cpp's data/) stands for the reference's pytorch-* dump or the
candidate's llamacpp-* dump (``dump_in_folder``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import ModelDiffError
from .atomic import AtomicFile, write_atomic
from .fields import is_int, short

DESCRIPTION_FORMAT = "pytest-modeldiff all-positions dump v1"


def write_last_position(out_dir: Path, prefix: str, name: str, logits: np.ndarray,
                        tokens: Sequence[int], prompt: str | None) -> Path:
    """The four files run-org-model.py / llama-debug --save-logits write for one prompt."""
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / f"{prefix}-{name}"
    row = np.asarray(logits, dtype=np.float32).reshape(-1)
    ids = np.asarray(tokens, dtype=np.int32)
    write_atomic(base.with_name(base.name + ".bin"), row.tobytes())
    write_atomic(base.with_name(base.name + ".txt"),
                 "".join(f"{i}: {v:.6f}\n" for i, v in enumerate(row.tolist())).encode())
    write_atomic(base.with_name(base.name + "-tokens.bin"), ids.tobytes())
    write_atomic(base.with_name(base.name + "-prompt.txt"),
                 (f"prompt: {prompt or ''}\nn_tokens: {len(ids)}\n"
                  f"token ids: {', '.join(str(int(t)) for t in ids)}\n").encode())
    return base.with_name(base.name + ".bin")


class AllPositionsWriter:
    """Streams every sequence's logits to ``{prefix}-{name}-all.bin`` and its ids to
    ``-all-tokens.bin`` (temporary files until then); ``finish`` publishes both, then the json."""

    def __init__(self, out_dir: Path, prefix: str, name: str):
        self.name = name
        self.base = out_dir / f"{prefix}-{name}-all"
        self._logits = AtomicFile(self._path(".bin"))
        try:
            self._tokens = AtomicFile(self._path("-tokens.bin"))
        except BaseException:
            self._logits.discard()
            raise
        self.lengths: list[int] = []
        self.texts: list[str | None] = []

    def _path(self, suffix: str) -> Path:
        return self.base.with_name(self.base.name + suffix)

    def add(self, logits: np.ndarray, tokens: Sequence[int], text: str | None) -> None:
        self._logits.file.write(np.ascontiguousarray(logits, dtype=np.float32).tobytes())
        self._tokens.file.write(np.asarray(tokens, dtype=np.int32).tobytes())
        self.lengths.append(len(logits))
        self.texts.append(text)

    def finish(self, n_vocab: int, metadata: dict[str, Any]) -> Path:
        """Publish the logits and ids, then their json; the old json goes first, so a run killed
        in between leaves a dump the reader refuses (no json) rather than a mixed one."""
        try:
            self._path(".json").unlink(missing_ok=True)
            self._logits.commit()
            self._tokens.commit()
        except BaseException:
            self.abort()
            raise
        meta = {"format": DESCRIPTION_FORMAT, "n_vocab": n_vocab,
                "sequence_lengths": self.lengths, "texts": self.texts, **metadata}
        write_atomic(self._path(".json"), json.dumps(meta, indent=2).encode())
        return self._path(".bin")

    def abort(self) -> None:
        """Drop what was streamed so far; files already published keep their content."""
        self._logits.discard()
        self._tokens.discard()


def companion(path: Path, suffix: str) -> Path:
    """``data/pytorch-x.bin`` -> ``data/pytorch-x{suffix}``."""
    return path.with_name(path.name[: -len(".bin")] + suffix)


DUMP_PREFIX = {"reference": "pytorch", "candidate": "llamacpp"}


def is_dump_folder(path: Path) -> bool:
    return Path(path).is_dir() and not (Path(path) / "config.json").exists() and any(Path(path).glob("*-tokens.bin"))


def dump_in_folder(folder: Path, role: str, wanted: str | None = None) -> Path:
    """The logits dump in ``folder`` for ``role``: reference -> pytorch-<model>.bin (written by
    run-org-model.py), candidate -> llamacpp-<model>.bin (llama-debug --save-logits, or ours).
    With dumps of several models, ``wanted`` (the model's name, as llama.cpp derives it from
    MODEL_PATH / CONVERTED_MODEL) picks one. Our all-positions -all.bin beats a last-position dump."""
    prefix = DUMP_PREFIX[role]
    models = sorted({p.name[len(prefix) + 1:-len(".bin")].removesuffix("-all")
                     for p in Path(folder).glob(f"{prefix}-*.bin")
                     if not p.name.endswith(("-tokens.bin", "-embeddings.bin"))
                     and companion(p, "-tokens.bin").is_file()})
    if not models:
        raise ModelDiffError(f"{folder}: no {prefix}-<model>.bin logits dump with its -tokens.bin here; the {role} "
                             f"of a dump folder is its {prefix} dump (llama.cpp writes data/{prefix}-<model>.bin)")
    if wanted in models:
        models = [wanted]
    if len(models) > 1:
        raise ModelDiffError(f"{folder}: {prefix} dumps of several models ({', '.join(models)}); pass the .bin file or "
                             "name the model with MODEL_PATH / CONVERTED_MODEL as llama.cpp's scripts do")
    full = Path(folder) / f"{prefix}-{models[0]}-all.bin"
    return full if full.is_file() else Path(folder) / f"{prefix}-{models[0]}.bin"


def model_name(path: str) -> str:
    """llama.cpp's get_model_name_from_env_path: base name, .gguf removed."""
    name = os.path.basename(os.path.normpath(path))
    return name[:-5] if name.endswith(".gguf") else name


def read_dump(path: Path) -> tuple[np.ndarray, list[list[int]], list[str | None], int | None]:
    """(logits rows float32 memmap, per-sequence token ids, texts, n_vocab or None if unknown).

    n_vocab is only known from our -all.json; a llama.cpp dump holds one last-position row, so
    its length *is* n_vocab. Every error names the file and the problem.
    """
    path = Path(path)
    tokens_path = companion(path, "-tokens.bin")
    logits, ids = _values(path, np.float32), _values(tokens_path, np.int32).tolist()
    if not ids:
        raise ModelDiffError(f"{tokens_path}: no token ids (empty file)")
    meta = read_description(path)
    if meta is not None:
        return _all_positions(path, logits, ids, meta)
    if path.name.endswith("-all.bin") and not companion(path, "-prompt.txt").is_file():
        raise ModelDiffError(f"{path}: all-positions dump without its {companion(path, '.json').name} "
                             "(an interrupted run?); dump it again")
    if logits.size == 0:
        raise ModelDiffError(f"{path}: empty dump")
    _check_ids(tokens_path, ids, logits.size)
    return logits.reshape(1, -1), [ids], [_prompt_text(companion(path, "-prompt.txt"))], None


def _values(path: Path, dtype) -> np.ndarray:
    """A headerless file of 4-byte values (memory-mapped)."""
    try:
        if not path.is_file():
            raise ModelDiffError(f"{path}: dump file missing (a dump is X.bin plus X-tokens.bin)")
        size = path.stat().st_size
        if size % 4:
            raise ModelDiffError(f"{path}: {size} bytes is not a whole number of 4-byte values")
        return np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
    except (OSError, ValueError) as exc:
        raise ModelDiffError(f"{path}: unreadable dump file ({exc})") from None


def _all_positions(path: Path, logits: np.ndarray, ids: list[int], meta: dict):
    meta_path, tokens_path = companion(path, ".json"), companion(path, "-tokens.bin")
    n_vocab, lengths = meta["n_vocab"], meta["sequence_lengths"]
    if logits.size != n_vocab * sum(lengths):
        raise ModelDiffError(
            f"{path}: {logits.size} floats is not {sum(lengths)} positions x {n_vocab} vocabulary "
            f"as {meta_path.name} says; the dump is truncated or from another run")
    if sum(lengths) != len(ids):
        raise ModelDiffError(f"{tokens_path}: {len(ids)} ids, {meta_path.name} says {sum(lengths)}")
    _check_ids(tokens_path, ids, n_vocab)
    starts = np.cumsum([0] + lengths).tolist()
    seqs = [ids[a:b] for a, b in zip(starts[:-1], starts[1:])]
    return logits.reshape(-1, n_vocab), seqs, meta.get("texts") or [None] * len(seqs), n_vocab


def _check_ids(tokens_path: Path, ids: list[int], n_vocab: int) -> None:
    bad = next((t for t in ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise ModelDiffError(f"{tokens_path}: token id {bad} outside the vocabulary of the logits "
                             f"(expected 0 <= id < {n_vocab})")


def read_description(path: Path) -> dict | None:
    """The -all.json beside dump ``path`` (None if there is none), checked field by field."""
    meta_path = companion(Path(path), ".json")
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad UTF-8 or JSON
        raise ModelDiffError(f"{meta_path}: not a readable dump description ({type(exc).__name__}: "
                             f"{exc})") from None
    _check_description(meta_path, meta)
    return meta


def _check_description(meta_path: Path, meta) -> None:
    def fail(field: str, expected: str):
        value = meta.get(field) if isinstance(meta, dict) else meta
        raise ModelDiffError(f"{meta_path}: {field} is {short(value)}, expected {expected}")

    if not isinstance(meta, dict):
        fail("the content", "a JSON object")
    if meta.get("format") != DESCRIPTION_FORMAT:
        fail("format", repr(DESCRIPTION_FORMAT))
    if not is_int(meta.get("n_vocab"), 1):
        fail("n_vocab", "a positive integer")
    lengths = meta.get("sequence_lengths")
    if not isinstance(lengths, list) or not lengths or not all(is_int(n, 1) for n in lengths):
        fail("sequence_lengths", "a non-empty list of positive integers")
    texts = meta.get("texts")
    if texts is not None and not (isinstance(texts, list) and len(texts) == len(lengths)
                                  and all(t is None or isinstance(t, str) for t in texts)):
        fail("texts", f"null or a list of {len(lengths)} strings or nulls, one per sequence")
    if not isinstance(meta.get("quant_type"), (str, type(None))):
        fail("quant_type", "a string")


def _prompt_text(prompt_path: Path) -> str | None:
    """The prompt of a ``-prompt.txt`` (lines "prompt: TEXT", "n_tokens: N", "token ids: ..."),
    None if absent or in another layout."""
    if not prompt_path.is_file():
        return None
    try:
        content = prompt_path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ModelDiffError(f"{prompt_path}: unreadable prompt file ({exc})") from None
    except UnicodeDecodeError as exc:
        raise ModelDiffError(f"{prompt_path}: not UTF-8 text (byte {exc.start}: {exc.reason}); expected "
                             "'prompt: TEXT' as llama.cpp writes it") from None
    end = content.rfind("\nn_tokens:")
    return content[len("prompt: "):end] if content.startswith("prompt: ") and end >= 0 else None
