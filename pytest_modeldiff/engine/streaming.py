"""Layer streaming: the per-layer comparison with one decoder layer of each model in memory.

Both models are transformers skeletons on the meta device; each step materialises one module
(embedding, decoder layer i, final norm) of each model from its weight files (safetensors, or a
GGUF dequantized with gguf-py and mapped to HF names through mapping.py), runs every sequence's
hidden state through it and frees it. Peak memory is one layer of each model plus the hidden
states of all sequences (reference, candidate), whatever the model size.

Progress is saved every ``save_every_s`` seconds and on Ctrl-C (written to a temporary file,
then renamed over the checkpoint), keyed by the model files, tokens and settings; a rerun with the
same inputs resumes after the last finished layer.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from gguf import Keys

from ..errors import ModelDiffError
from ..formats import mapping
from ..formats.atomic import atomic_open
from ..formats.gguf_file import open_gguf
from ..metrics import layers
from ..metrics import logits as metrics
from ..runners.base import model_files
from ..weights.files import open_weights

DEFAULT_CHECKPOINT_DIR = Path.home() / ".cache" / "pytest-modeldiff" / "stream"


class StreamedModel:
    """A causal LM whose modules are materialised one at a time from its weight files."""

    def __init__(self, path: Path):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        self.path = Path(path)
        if not (self.path.is_dir() or self.path.suffix == ".gguf"):
            raise ModelDiffError(f"{self.path}: layer streaming reads HF folders and .gguf files only")
        self.gguf = open_gguf(self.path) if self.path.suffix == ".gguf" else None
        try:
            if self.gguf:
                self.config = AutoConfig.from_pretrained(self.path.parent, gguf_file=self.path.name,
                                                         local_files_only=True)
            else:
                self.config = AutoConfig.from_pretrained(self.path, local_files_only=True)
        except Exception as exc:
            raise ModelDiffError(f"{self.path}: transformers could not read the model config: {exc}") from None
        self.config._attn_implementation = "sdpa"  # the causal mask below works for sdpa and eager alike
        with torch.device("meta"):
            self.model = AutoModelForCausalLM.from_config(self.config, dtype=torch.float32)
        decoder = self.model.get_decoder()
        self.decoder = decoder
        if not all(hasattr(decoder, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
            raise ModelDiffError(f"{self.path}: layer streaming supports decoders with embed_tokens, layers, norm "
                                 f"and rotary_emb ({type(decoder).__name__} lacks one)")
        self.prefix = next(name for name, module in self.model.named_modules() if module is decoder)
        self.rotary = type(decoder.rotary_emb)(config=self.config)  # real buffers, not meta
        self.n_layers = len(decoder.layers)
        self.reader = open_weights(self.path)
        self._weights = self._gguf_tensor if self.gguf else self.reader.read

    def module(self, kind: str, index: int = 0):
        if kind == "embd":
            return self.decoder.embed_tokens
        return self.decoder.norm if kind == "norm" else self.decoder.layers[index]

    def load(self, module) -> None:
        import torch

        prefix = next(name for name, m in self.model.named_modules() if m is module)
        state = {name: torch.from_numpy(np.ascontiguousarray(self._weights(f"{prefix}.{name}")))
                 for name, _ in module.named_parameters()}
        module.load_state_dict(state, strict=True, assign=True)

    @staticmethod
    def unload(module) -> None:
        module.to("meta")

    def _gguf_tensor(self, hf_name: str) -> np.ndarray:
        arch = self.gguf.metadata.get(Keys.General.ARCHITECTURE, "")
        name = mapping.gguf_tensor_name(arch, self.n_layers, hf_name)
        if name is None or name not in self.gguf.tensor_names:
            raise ModelDiffError(f"{self.path}: no GGUF tensor for {hf_name} (mapped to {name})")
        c = self.config
        return mapping.to_hf_layout(arch, name, self.reader.read(name), c.num_attention_heads,
                                    getattr(c, "num_key_value_heads", None) or c.num_attention_heads)


def _apply(model: StreamedModel, module, states: list, ids: list, kind: str) -> list:
    """Run ``module`` on every sequence's state (token ids for the embedding)."""
    import torch

    out = []
    with torch.inference_mode():
        for h, seq in zip(states, ids):
            if kind == "embd":
                out.append(module(torch.tensor([seq]))[0].float().numpy())
                continue
            x = torch.from_numpy(h)[None]
            if kind == "norm":
                out.append(module(x)[0].float().numpy())
                continue
            n = x.shape[1]
            positions = torch.arange(n)[None]
            mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
            y = module(x, attention_mask=mask, position_ids=positions,
                       position_embeddings=model.rotary(x, positions))
            out.append((y[0] if isinstance(y, tuple) else y)[0].float().numpy())
    return out


def checkpoint_key(ref: StreamedModel, cand: StreamedModel, ids: Sequence[Sequence[int]], keep: int) -> str:
    """Changes with the model files (path, size, mtime), the tokens and the settings."""
    h = hashlib.sha256()
    for model in (ref, cand):
        for f in model_files(model.path):
            st = f.stat()
            h.update(f"{f.resolve()} {st.st_size} {st.st_mtime_ns}\n".encode())
    h.update(json.dumps([list(map(int, s)) for s in ids]).encode())
    h.update(f"keep={keep} v1".encode())
    return h.hexdigest()[:24]


def stream_layers(ref_path: Path, cand_path: Path, ids: Sequence[Sequence[int]], keep: int = 0,
                  checkpoint_dir: Path | None = None, save_every_s: float = 120.0,
                  progress: Callable[[str], None] = lambda message: None) -> layers.LayerStats:
    """Per-layer statistics of ``cand_path`` against ``ref_path`` on the token sequences ``ids``."""
    ref, cand = StreamedModel(ref_path), StreamedModel(cand_path)
    layers.align((ref.n_layers, ref.config.hidden_size), (cand.n_layers, cand.config.hidden_size), ref_path, cand_path)
    layers.check_keep(keep, ref.n_layers)
    steps = [("embd", 0), *(("layer", i) for i in range(ref.n_layers)), ("norm", 0)]
    names = layers.state_names(ref.n_layers)
    path = Path(checkpoint_dir or DEFAULT_CHECKPOINT_DIR) / f"{checkpoint_key(ref, cand, ids, keep)}.npz"
    state = _Checkpoint.load(path, len(ids)) or _Checkpoint(path, len(ids))
    if state.done:
        progress(f"streaming {cand.path.name}: resuming after {describe_step(steps[state.done - 1])} "
                 f"({state.done}/{len(steps)} steps done, from {path})")
    last_save, started = time.monotonic(), time.monotonic()
    try:
        for step in range(state.done, len(steps)):
            kind, index = steps[step]
            ref_module, cand_module = ref.module(kind, index), cand.module(kind, index)
            ref.load(ref_module)
            new_ref = _apply(ref, ref_module, state.ref, ids, kind)
            ref.unload(ref_module)
            cand.load(cand_module)
            kept = step <= keep and keep > 0  # states 0..keep are the reference's (exllamav2's layer swap)
            new_cand = new_ref if kept else _apply(cand, cand_module, state.cand, ids, kind)
            isolated = _apply(cand, cand_module, state.ref, ids, kind)  # this layer on the reference's input
            cand.unload(cand_module)
            state.add(step, new_ref, new_cand, isolated)
            elapsed = time.monotonic() - started
            left = elapsed / (step + 1 - state.resumed_at) * (len(steps) - step - 1)
            progress(f"streaming {cand.path.name}: {describe_step(steps[step])} done ({step + 1}/{len(steps)}, "
                     f"~{left:.0f} s left)")
            if time.monotonic() - last_save >= save_every_s and step + 1 < len(steps):
                state.save()
                last_save = time.monotonic()
    except KeyboardInterrupt:
        state.save()  # Ctrl-C: keep the finished layers for the next run
        raise
    stats = state.stats(names, keep)
    path.unlink(missing_ok=True)
    return stats


def describe_step(step: tuple[str, int]) -> str:
    kind, index = step
    return layers.describe(str(index) if kind == "layer" else kind)


class _Checkpoint:
    """Hidden states after the last finished step and the per-state moments so far."""

    def __init__(self, path: Path, n_seq: int):
        self.path, self.n_seq = path, n_seq
        self.done = self.resumed_at = 0
        self.ref: list = [None] * n_seq
        self.cand: list = [None] * n_seq
        self.moments: list[tuple[np.ndarray, ...]] = []  # per step: sq_diff, sq_ref, cos, isolated rfn (per seq)

    def add(self, step: int, new_ref: list, new_cand: list, isolated: list) -> None:
        per_seq = [(*metrics.hidden_moments(r, c), metrics.relative_frobenius(r, i))
                   for r, c, i in zip(new_ref, new_cand, isolated)]
        self.moments.append(tuple(np.concatenate(part) for part in zip(*per_seq)))
        self.ref, self.cand, self.done = new_ref, new_cand, step + 1

    def stats(self, names: list[str], keep: int) -> layers.LayerStats:
        sq_diff, sq_ref, cos, iso = (np.stack(part, axis=1) for part in zip(*self.moments))  # (n_seq, n_states)
        return layers.LayerStats(names=names, rfn=metrics.rfn_from_moments(sq_diff, sq_ref), cos_err=1.0 - cos,
                                 sq_diff=sq_diff.sum(0), sq_ref=sq_ref.sum(0), isolated_rfn=iso, kept=keep,
                                 source="streamed")

    def save(self) -> None:
        if not self.done:
            return
        arrays = {"done": np.array(self.done)}
        for i in range(self.n_seq):
            arrays[f"ref{i}"], arrays[f"cand{i}"] = self.ref[i], self.cand[i]
        for k, part in enumerate(zip(*self.moments)):
            arrays[f"moments{k}"] = np.stack(part)
        with atomic_open(self.path) as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: Path, n_seq: int) -> "_Checkpoint | None":
        if not path.is_file():
            return None
        try:
            with np.load(path) as data:
                state = cls(path, n_seq)
                state.done = state.resumed_at = int(data["done"])
                state.ref = [data[f"ref{i}"] for i in range(n_seq)]
                state.cand = [data[f"cand{i}"] for i in range(n_seq)]
                state.moments = list(zip(*(data[f"moments{k}"] for k in range(4))))
        except Exception:  # unreadable or from another layout: start over, it is only a cache
            path.unlink(missing_ok=True)
            return None
        return state
