"""What a run is asked to do: evaluation input, devices, outputs (validated at creation)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelDiffUsageError


@dataclass
class Settings:
    eval_text: Path | None = None
    eval_dataset: Path | None = None
    eval_column: str = "text"
    eval_rows: int = 8
    eval_length: int = 256
    device: str = "cpu"
    ref_dtype: str = "auto"  # the torch reference's precision: auto (float32 if it fits), float32, bfloat16, float16
    threads: int | None = None
    dump_dir: Path | None = None
    ref_runner: str | None = None
    cand_runner: str | None = None
    logits: bool = True  # run the models for the logit metrics
    layers: bool = True  # capture hidden states for the per-layer comparison
    keep_layers: int = 0  # the candidate takes the reference's state after its first K layers
    stream_layers: bool = False  # the reference runs one layer at a time from its weight files (streamed runner)
    checkpoint_dir: Path | None = None  # where streaming saves its progress (default: a cache dir)
    topk_max: int = 5  # top-K accuracy and agreement for K = 1..topk_max (exllamav2's --topk_max)
    llama_perplexity_compat: bool = False  # llama-perplexity's chunks, BOS and scored second half
    ref_cache: Path | None = None  # folder of reference caches (refcache.py); None: always run the reference
    isolate: str = "auto"  # llama.cpp candidates' isolated per-layer error from a gguf-torch pass: auto/always/never
    attribution: bool = False  # KLD added by each layer's candidate weights alone (reference with one layer swapped)
    long_context: int | None = None  # tokens of the long-context probe; None: from the metadata, 0: off

    def __post_init__(self):
        for name, low in (("eval_rows", 1), ("eval_length", 2), ("threads", 1), ("keep_layers", 0), ("topk_max", 1),
                          ("long_context", 0)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < low):
                option = f"--{'' if name.startswith('eval_') else 'modeldiff-'}{name.replace('_', '-')}"
                raise ModelDiffUsageError(f"{option} must be an integer >= {low}, got {value!r}")
        if self.llama_perplexity_compat and not (self.eval_text or self.eval_dataset):
            raise ModelDiffUsageError("--modeldiff-llama-perplexity-compat evaluates a text like llama-perplexity's "
                                      "-f FILE: give --eval-text FILE (or --eval-dataset)")
        if self.ref_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ModelDiffUsageError(f"--ref-dtype: {self.ref_dtype!r} is not auto, float32, bfloat16 or float16")
        if self.isolate not in ("auto", "always", "never"):
            raise ModelDiffUsageError(f"--modeldiff-isolate must be auto, always or never, got {self.isolate!r}")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ModelDiffUsageError(f"--modeldiff-device: {self.device!r} is not cpu or cuda")

    def describe(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}
