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
Every file is written to a temporary name and renamed, so an interrupted run leaves no half dump.
A folder of such dumps (llama.cpp's data/) stands for the reference's pytorch-* dump or the
candidate's llamacpp-* dump (``dump_in_folder``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .errors import ModelDiffError


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_last_position(out_dir: Path, prefix: str, name: str, logits: np.ndarray,
                        tokens: Sequence[int], prompt: str | None) -> Path:
    """The four files run-org-model.py / llama-debug --save-logits write for one prompt."""
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / f"{prefix}-{name}"
    row = np.asarray(logits, dtype=np.float32).reshape(-1)
    ids = np.asarray(tokens, dtype=np.int32)
    _atomic_write(base.with_name(base.name + ".bin"), row.tobytes())
    _atomic_write(base.with_name(base.name + ".txt"),
                  "".join(f"{i}: {v:.6f}\n" for i, v in enumerate(row.tolist())).encode())
    _atomic_write(base.with_name(base.name + "-tokens.bin"), ids.tobytes())
    _atomic_write(base.with_name(base.name + "-prompt.txt"),
                  (f"prompt: {prompt or ''}\nn_tokens: {len(ids)}\n"
                   f"token ids: {', '.join(str(int(t)) for t in ids)}\n").encode())
    return base.with_name(base.name + ".bin")


class AllPositionsWriter:
    """Streams every sequence's logits to ``{prefix}-{name}-all.bin``; ``finish`` publishes."""

    def __init__(self, out_dir: Path, prefix: str, name: str):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.base = out_dir / f"{prefix}-{name}-all"
        self._logits = open(self._tmp(".bin"), "wb")
        self._tokens = open(self._tmp("-tokens.bin"), "wb")
        self.lengths: list[int] = []
        self.texts: list[str | None] = []

    def _tmp(self, suffix: str) -> Path:
        return self.base.with_name(self.base.name + suffix + ".tmp")

    def add(self, logits: np.ndarray, tokens: Sequence[int], text: str | None) -> None:
        self._logits.write(np.ascontiguousarray(logits, dtype=np.float32).tobytes())
        self._tokens.write(np.asarray(tokens, dtype=np.int32).tobytes())
        self.lengths.append(len(logits))
        self.texts.append(text)

    def finish(self, n_vocab: int, metadata: dict[str, Any]) -> Path:
        self._logits.close()
        self._tokens.close()
        os.replace(self._tmp(".bin"), self.base.with_name(self.base.name + ".bin"))
        os.replace(self._tmp("-tokens.bin"), self.base.with_name(self.base.name + "-tokens.bin"))
        meta = {"format": "pytest-modeldiff all-positions dump v1", "n_vocab": n_vocab,
                "sequence_lengths": self.lengths, "texts": self.texts, **metadata}
        _atomic_write(self.base.with_name(self.base.name + ".json"), json.dumps(meta, indent=2).encode())
        return self.base.with_name(self.base.name + ".bin")

    def abort(self) -> None:
        for f, suffix in ((self._logits, ".bin"), (self._tokens, "-tokens.bin")):
            f.close()
            self._tmp(suffix).unlink(missing_ok=True)


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
                     if not p.name.endswith(("-tokens.bin", "-embeddings.bin")) and companion(p, "-tokens.bin").is_file()})
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
    its length *is* n_vocab. Size errors name the file and the numbers.
    """
    path = Path(path)
    tokens_path = companion(path, "-tokens.bin")
    for p in (path, tokens_path):
        if not p.is_file():
            raise ModelDiffError(f"{p}: dump file missing (a dump is X.bin plus X-tokens.bin)")
        if p.stat().st_size % 4:
            raise ModelDiffError(f"{p}: {p.stat().st_size} bytes is not a whole number of 4-byte values")
    logits = np.memmap(path, dtype=np.float32, mode="r") if path.stat().st_size else np.zeros(0, np.float32)
    ids = np.fromfile(tokens_path, dtype=np.int32).tolist()
    if not ids:
        raise ModelDiffError(f"{tokens_path}: no token ids (empty file)")
    meta_path = companion(path, ".json")
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
            n_vocab, lengths = int(meta["n_vocab"]), [int(n) for n in meta["sequence_lengths"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelDiffError(f"{meta_path}: not a pytest-modeldiff dump description ({exc!r})") from None
        if logits.size != n_vocab * sum(lengths):
            raise ModelDiffError(
                f"{path}: {logits.size} floats is not {sum(lengths)} positions x {n_vocab} vocabulary "
                f"as {meta_path.name} says; the dump is truncated or from another run")
        if sum(lengths) != len(ids):
            raise ModelDiffError(f"{tokens_path}: {len(ids)} ids, {meta_path.name} says {sum(lengths)}")
        starts = np.cumsum([0] + lengths)
        seqs = [ids[a:b] for a, b in zip(starts[:-1], starts[1:])]
        return logits.reshape(-1, n_vocab), seqs, list(meta.get("texts") or [None] * len(seqs)), n_vocab
    if logits.size == 0:
        raise ModelDiffError(f"{path}: empty dump")
    prompt_path = companion(path, "-prompt.txt")
    text = None
    if prompt_path.is_file():
        content = prompt_path.read_text()
        end = content.rfind("\nn_tokens:")
        text = content[len("prompt: "):end] if content.startswith("prompt: ") and end >= 0 else None
    return logits.reshape(1, -1), [ids], [text], None
