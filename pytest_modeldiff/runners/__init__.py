"""Runner registry and detection: which runtime runs a given path.

Runner modules are imported only when chosen, so listing or validating options stays light.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from ..errors import ModelDiffError, ModelDiffUsageError
from ..registry import RUNNERS
from .base import FixedSequence, Runner, VocabInfo


__all__ = ["RUNNERS", "FixedSequence", "Runner", "VocabInfo", "detect_runner", "make_runner"]


def detect_runner(path: Path) -> str:
    """hf for a folder with config.json, llamacpp for .gguf, dump for X.bin beside X-tokens.bin."""
    path = Path(path)
    if path.is_dir():
        return "hf"  # HFRunner names a missing config.json
    if path.suffix == ".gguf":
        return "llamacpp"
    if path.suffix == ".bin":
        return "dump"
    raise ModelDiffError(
        f"{path}: cannot tell how to run this file; expected a HF folder, a .gguf or a .bin logits dump "
        f"(or name the runtime with --ref-runner/--cand-runner: {', '.join(RUNNERS)})")


def make_runner(path: Path, runner: str | None = None, device: str = "cpu", threads: int | None = None) -> Runner:
    """Validate ``path`` and build its runner (auto-detected unless ``runner`` names one)."""
    if not Path(path).exists():
        raise ModelDiffError(f"{path}: no such file or directory")
    kind = runner or detect_runner(path)
    if kind not in RUNNERS:
        raise ModelDiffUsageError(f"unknown runner {kind!r}; choose from {', '.join(RUNNERS)}")
    module, cls = RUNNERS[kind].split(":")
    return getattr(importlib.import_module(module), cls)(Path(path), device=device, threads=threads)
