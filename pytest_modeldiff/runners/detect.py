"""Which runtime runs a given path, and building its runner (the runner modules are imported only
when chosen)."""
from __future__ import annotations

import importlib
import os
from pathlib import Path

from ..errors import ModelDiffError, ModelDiffUsageError
from ..formats.dumps import dump_in_folder, is_dump_folder, model_name
from ..weights.files import is_torch_checkpoint
from . import MODEL_ENV, RUNNERS
from .base import Runner


def detect_runner(path: Path) -> str:
    """dump for X.bin or a folder of dumps (X.bin beside X-tokens.bin), llamacpp for .gguf, refcache
    for a reference cache (.mdref), hf for
    any other folder (HFRunner names a missing config.json), weights for weights-only files
    (.safetensors, .pt/.pth, .npz/.npy, a .bin that torch.save wrote)."""
    path = Path(path)
    if is_dump_folder(path):
        return "dump"
    if path.is_dir():
        return "hf"
    if path.suffix == ".gguf":
        return "llamacpp"
    if path.suffix == ".mdref":
        return "refcache"
    if path.suffix in WEIGHTS_ONLY or (path.suffix == ".bin" and is_torch_checkpoint(path)):
        return "weights"
    if path.suffix == ".bin":
        return "dump"
    raise ModelDiffError(
        f"{path}: cannot tell how to run this file; expected a HF folder, a .gguf, a .bin logits dump or a "
        f"weights file ({', '.join(WEIGHTS_ONLY)}) (or name the runtime with --ref-runner/--cand-runner: "
        f"{', '.join(RUNNERS)})")


WEIGHTS_ONLY = (".safetensors", ".pt", ".pth", ".npz", ".npy")


def make_runner(path: Path, runner: str | None = None, device: str = "cpu", threads: int | None = None,
                role: str = "candidate") -> Runner:
    """Validate ``path`` and build its runner (auto-detected unless ``runner`` names one).
    ``role`` ("reference" or "candidate") picks the side's dump out of a dump folder."""
    if not Path(path).exists():
        raise ModelDiffError(f"{path}: no such file or directory")
    kind = runner or detect_runner(path)
    if kind not in RUNNERS:
        raise ModelDiffUsageError(f"unknown runner {kind!r}; choose from {', '.join(RUNNERS)}")
    if kind == "dump" and Path(path).is_dir():
        named = os.environ.get(MODEL_ENV[role])
        path = dump_in_folder(Path(path), role, model_name(named) if named else None)
    if device.startswith("cuda"):
        require_device(kind, device)
    module, cls = RUNNERS[kind].split(":")
    return getattr(importlib.import_module(module), cls)(Path(path), device=device, threads=threads)


TORCH_KINDS = ("hf", "gguf-torch")


def require_device(kind: str, device: str) -> None:
    """--modeldiff-device cuda must run where it says, never quietly on the CPU: torch must see a
    CUDA device (torch runners), llama-cpp-python must be built with GPU offload (llamacpp: its
    n_gpu_layers is silently ignored otherwise). Dumps, caches and weight files run nothing."""
    if kind in TORCH_KINDS:
        import torch

        if not torch.cuda.is_available():
            raise ModelDiffUsageError(f"--modeldiff-device {device}: torch {torch.__version__} sees no CUDA device "
                                      f"(the {kind} runner would run on it); use cpu")
    elif kind == "llamacpp":
        try:
            import llama_cpp
        except ImportError:
            return  # the runner names the missing package when it loads
        if not llama_cpp.llama_supports_gpu_offload():
            raise ModelDiffUsageError(
                f"--modeldiff-device {device}: llama-cpp-python {llama_cpp.__version__} was built without GPU "
                "offload, so llama.cpp would run on the CPU; reinstall it with CUDA (CMAKE_ARGS=\"-DGGML_CUDA=on\" "
                "pip install --no-binary llama-cpp-python --force-reinstall llama-cpp-python) or use cpu")
