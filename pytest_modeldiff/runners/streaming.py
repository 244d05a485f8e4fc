"""Streaming: a model larger than RAM run one module at a time from its weight files.

The model is a transformers skeleton on the meta device. The embedding step reads only the rows
of the tokens used; each later step materialises one module (decoder layer i, the final norm) from
its weight files (safetensors, or a GGUF dequantized with gguf-py and mapped to HF names through
mapping.py), runs every sequence through it and frees it, so each weight is read once for all
sequences. The output head is then applied in row chunks of the vocabulary (a slice of lm_head, or
of the tied embedding, at a time). Peak memory is one decoder layer, one head chunk, the logits of
a group of sequences and, when asked, their hidden states, whatever the model's size.

Only decoders whose forward pass is exactly embed_tokens -> layers -> norm -> lm_head are run
(STREAMABLE); anything else (embedding scaling, logit soft-capping or scaling, sliding windows
shorter than the sequences) is refused with a ModelDiffError rather than computed wrong.

Progress is saved every ``save_every_s`` seconds and on Ctrl-C (written to a temporary file, then
renamed over the checkpoint), keyed by the model files and the tokens; a rerun with the same
inputs resumes after the last finished layer.
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
from ..weights.files import open_weights
from .base import Forward, model_files

DEFAULT_CHECKPOINT_DIR = Path.home() / ".cache" / "pytest-modeldiff" / "stream"
# decoders whose forward is embed_tokens (unscaled) -> layers -> norm -> lm_head (no bias, no
# soft-capping): what the steps below compute. Others are refused, not approximated.
STREAMABLE = ("llama", "mistral", "qwen2")
UNSUPPORTED_CONFIG = ("final_logit_softcapping", "attn_logit_softcapping", "logit_scale", "logits_scaling",
                      "embedding_multiplier", "residual_multiplier", "attention_multiplier")
HEAD_CHUNK_ELEMENTS = 1 << 24  # a head chunk: 64 MB of float32 rows
LOGITS_BUDGET = 512 << 20  # bytes of logits computed per pass over the head (more sequences: more passes)


class StreamedModel:
    """A causal LM whose modules are materialised one at a time from its weight files."""

    def __init__(self, path: Path):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        self.path = Path(path)
        if not (self.path.is_dir() or self.path.suffix == ".gguf"):
            raise ModelDiffError(f"{self.path}: streaming reads HF folders and .gguf files only")
        self.gguf = open_gguf(self.path) if self.path.suffix == ".gguf" else None
        try:
            if self.gguf:
                self.config = AutoConfig.from_pretrained(self.path.parent, gguf_file=self.path.name,
                                                         local_files_only=True)
            else:
                self.config = AutoConfig.from_pretrained(self.path, local_files_only=True)
        except Exception as exc:
            raise ModelDiffError(f"{self.path}: transformers could not read the model config: {exc}") from None
        self._check_supported()
        self.config._attn_implementation = "sdpa"  # the causal mask below works for sdpa and eager alike
        with torch.device("meta"):
            self.model = AutoModelForCausalLM.from_config(self.config, dtype=torch.float32)
        decoder = self.model.get_decoder()
        self.decoder = decoder
        if not all(hasattr(decoder, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
            raise ModelDiffError(f"{self.path}: streaming supports decoders with embed_tokens, layers, norm "
                                 f"and rotary_emb ({type(decoder).__name__} lacks one)")
        head = self.model.get_output_embeddings()
        if type(decoder.embed_tokens) is not torch.nn.Embedding or getattr(head, "bias", None) is not None:
            raise ModelDiffError(f"{self.path}: streaming needs a plain embedding and a head without bias "
                                 f"({type(decoder.embed_tokens).__name__}, {type(head).__name__})")
        self.rotary = type(decoder.rotary_emb)(config=self.config)  # real buffers, not meta
        self.n_layers = len(decoder.layers)
        self.reader = open_weights(self.path)
        self.head_name = self.name_of(head) + ".weight"

    def _check_supported(self) -> None:
        c = self.config
        if c.model_type not in STREAMABLE:
            raise ModelDiffError(f"{self.path}: streaming runs {', '.join(STREAMABLE)} decoders only; "
                                 f"{c.model_type!r} is not verified to be embed -> layers -> norm -> head "
                                 "(embedding scaling, soft-capping, per-layer attention types)")
        odd = [f"{a}={getattr(c, a)}" for a in UNSUPPORTED_CONFIG if getattr(c, a, None) not in (None, 1, 1.0)]
        if odd:
            raise ModelDiffError(f"{self.path}: streaming does not reproduce {', '.join(odd)}")

    def sliding_window(self) -> int | None:
        """The attention window when some layer uses one (the steps below attend to every position)."""
        c = self.config
        types = getattr(c, "layer_types", None) or []
        window = getattr(c, "sliding_window", None)
        uses = "sliding_attention" in types or (not types and getattr(c, "use_sliding_window", True))
        return window if window and uses else None

    def check_lengths(self, ids: Sequence[Sequence[int]]) -> None:
        window = self.sliding_window()
        longest = max(len(seq) for seq in ids)
        if window and longest > window:
            raise ModelDiffError(f"{self.path}: a {longest}-token sequence exceeds the {window}-token sliding "
                                 "window, which streaming does not apply; use shorter sequences or run in memory")
        n_vocab = self.config.vocab_size
        if min(min(seq) for seq in ids) < 0 or max(max(seq) for seq in ids) >= n_vocab:
            raise ModelDiffError(f"{self.path}: token ids must be 0..{n_vocab - 1}")

    def name_of(self, module) -> str:
        """The module's HF name in the model (its parameters' prefix)."""
        return next(name for name, m in self.model.named_modules() if m is module)

    def module(self, kind: str, index: int = 0):
        if kind == "embd":
            return self.decoder.embed_tokens
        return self.decoder.norm if kind == "norm" else self.decoder.layers[index]

    def load(self, module) -> None:
        import torch

        if module is self.decoder.embed_tokens:
            return  # embed() reads only the rows of the tokens asked for
        prefix = self.name_of(module)
        state = {name: torch.from_numpy(np.ascontiguousarray(self.weights(f"{prefix}.{name}")))
                 for name, _ in module.named_parameters()}
        self.reader.release()  # no mapped shard stays resident
        module.load_state_dict(state, strict=True, assign=True)

    @staticmethod
    def unload(module) -> None:
        module.to("meta")

    def embed(self, ids: Sequence[int]) -> np.ndarray:
        """The embedding rows of ``ids``, read row by row (a 128k-token table is 2 GB in float32)."""
        name = self.name_of(self.decoder.embed_tokens) + ".weight"
        rows = {i: self.weights(name, i, i + 1)[0] for i in sorted(set(ids))}
        self.reader.release()
        return np.stack([rows[i] for i in ids])

    def weights(self, hf_name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) of a tensor by its HF name, float32, in HF's layout."""
        name = self.stored_name(hf_name)
        if not self.gguf or start or stop is not None:  # rows are only asked of the embedding and head: not permuted
            return self.reader.read(name, start, stop)
        c, arch = self.config, self.gguf.metadata.get(Keys.General.ARCHITECTURE, "")
        return mapping.to_hf_layout(arch, name, self.reader.read(name), c.num_attention_heads,
                                    getattr(c, "num_key_value_heads", None) or c.num_attention_heads)

    def stored_name(self, hf_name: str) -> str:
        """The tensor's name in the weight files (GGUF names through mapping.py)."""
        if not self.gguf:
            return hf_name
        name = mapping.gguf_tensor_name(self.gguf.metadata.get(Keys.General.ARCHITECTURE, ""), self.n_layers, hf_name)
        if name is None or self.reader.aliases.get(name, name) not in self.reader.tensors:
            raise ModelDiffError(f"{self.path}: no GGUF tensor for {hf_name} (mapped to {name})")
        return name

    def head(self, normed: list[np.ndarray]) -> list[np.ndarray]:
        """Logits of each sequence's normed states: the head read in row chunks of the vocabulary."""
        import torch

        n_vocab = self.reader.meta(self.stored_name(self.head_name)).shape[0]
        x = torch.from_numpy(np.concatenate(normed))
        out = torch.empty((len(x), n_vocab), dtype=torch.float32)
        step = max(1, HEAD_CHUNK_ELEMENTS // x.shape[1])
        with torch.inference_mode():
            for start in range(0, n_vocab, step):
                stop = min(n_vocab, start + step)
                rows = torch.from_numpy(np.ascontiguousarray(self.weights(self.head_name, start, stop)))
                self.reader.release()
                out[:, start:start + len(rows)] = x @ rows.T
        bounds = np.cumsum([0] + [len(h) for h in normed])
        return [out[a:b].numpy() for a, b in zip(bounds[:-1], bounds[1:])]

    def steps(self) -> list[tuple[str, int]]:
        return [("embd", 0), *(("layer", i) for i in range(self.n_layers)), ("norm", 0)]


def apply(model: StreamedModel, module, states: list, ids: list, kind: str) -> list:
    """Run ``module`` on every sequence's state (token ids for the embedding)."""
    import torch

    out = []
    with torch.inference_mode():
        for h, seq in zip(states, ids):
            if kind == "embd":
                out.append(model.embed(seq))
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


def checkpoint_key(model: StreamedModel, ids: Sequence[Sequence[int]], hidden: bool) -> str:
    """Changes with the model files (path, size, mtime), the tokens and what is kept."""
    h = hashlib.sha256()
    for f in model_files(model.path):
        st = f.stat()
        h.update(f"{f.resolve()} {st.st_size} {st.st_mtime_ns}\n".encode())
    h.update(json.dumps([list(map(int, s)) for s in ids]).encode())
    h.update(f"hidden={hidden} forward v2".encode())
    return h.hexdigest()[:24]


def stream_forward(model: StreamedModel, ids: Sequence[Sequence[int]], hidden: bool = False,
                   checkpoint_dir: Path | None = None, save_every_s: float = 120.0,
                   progress: Callable[[str], None] = lambda message: None) -> list[Forward]:
    """Every sequence of ``ids`` through ``model``, one module at a time: logits and, if ``hidden``,
    the canonical hidden states (layers.py: embd, each layer's output, the final norm)."""
    model.check_lengths(ids)
    steps = model.steps()
    path = Path(checkpoint_dir or DEFAULT_CHECKPOINT_DIR) / f"{checkpoint_key(model, ids, hidden)}.npz"
    state = _Checkpoint.load(path, len(ids), hidden) or _Checkpoint(path, len(ids), hidden)
    name = model.path.name
    if state.done:
        progress(f"streaming {name}: resuming after {describe_step(steps[state.done - 1])} "
                 f"({state.done}/{len(steps)} steps done, from {path})")
    last_save = started = time.monotonic()
    try:
        for step in range(state.done, len(steps)):
            kind, index = steps[step]
            module = model.module(kind, index)
            model.load(module)
            state.add(step, apply(model, module, state.current, ids, kind))
            model.unload(module)
            left = (time.monotonic() - started) / (step + 1 - state.resumed_at) * (len(steps) - step - 1)
            progress(f"streaming {name}: {describe_step(steps[step])} done ({step + 1}/{len(steps)}, "
                     f"~{left:.0f} s left)")
            if time.monotonic() - last_save >= save_every_s and step + 1 < len(steps):
                state.save()
                last_save = time.monotonic()
    except KeyboardInterrupt:
        state.save()  # Ctrl-C: keep the finished layers for the next run
        raise
    logits = []
    for group in _groups([len(seq) for seq in ids], model.config.vocab_size):  # the head once per group
        logits += model.head([state.current[i] for i in group])
        progress(f"streaming {name}: output head done for {group[-1] + 1}/{len(ids)} sequences")
    forwards = [Forward(rows, np.stack(states) if hidden else None) for rows, states in zip(logits, state.states)]
    path.unlink(missing_ok=True)
    return forwards


def _groups(lengths: list[int], n_vocab: int) -> list[list[int]]:
    """Consecutive sequences whose logits fit LOGITS_BUDGET together (at least one per group)."""
    groups, size = [[]], 0
    for i, n in enumerate(lengths):
        if groups[-1] and size + n * n_vocab * 4 > LOGITS_BUDGET:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += n * n_vocab * 4
    return groups


def isolated_pass(store, path: Path, sequences, progress: Callable[[str], None] = lambda m: None) -> np.ndarray:
    """The streamed twin of diagnosis.isolated_pass: rfn of each state when every decoder layer (and
    the final norm) of the GGUF ``path`` is fed the reference's input, one module in memory at a
    time: (n_seq, n_states)."""
    model = StreamedModel(path)
    ids = [seq.ids for seq in sequences]
    model.check_lengths(ids)
    depth = store.depth
    layers.align(depth, (model.n_layers, model.config.hidden_size), "the reference", path)
    steps = model.steps()
    rfn = np.zeros((len(ids), len(steps)))
    for k, (kind, index) in enumerate(steps):
        module = model.module(kind, index)
        model.load(module)
        for i in range(len(ids)):
            ref = store.hidden(i)
            out = apply(model, module, [None if k == 0 else ref[k - 1]], [ids[i]], kind)[0]
            rfn[i, k] = metrics.relative_frobenius(ref[k][None], out[None])[0]
        model.unload(module)
        progress(f"{model.path.name}: isolated pass (streamed) {describe_step(steps[k])} done ({k + 1}/{len(steps)})")
    return rfn


def describe_step(step: tuple[str, int]) -> str:
    kind, index = step
    return layers.describe(str(index) if kind == "layer" else kind)


class _Checkpoint:
    """Each sequence's state after the last finished step (all states so far when hidden)."""

    def __init__(self, path: Path, n_seq: int, hidden: bool):
        self.path, self.n_seq, self.hidden = path, n_seq, hidden
        self.done = self.resumed_at = 0
        self.states: list[list[np.ndarray]] = [[] for _ in range(n_seq)]

    @property
    def current(self) -> list:
        return [s[-1] if s else None for s in self.states]

    def add(self, step: int, new: list) -> None:
        for kept, state in zip(self.states, new):
            if not self.hidden:
                kept.clear()
            kept.append(state)
        self.done = step + 1

    def save(self) -> None:
        if not self.done:
            return
        arrays = {"done": np.array(self.done)}
        for i, states in enumerate(self.states):
            arrays[f"s{i}"] = np.stack(states)
        with atomic_open(self.path) as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: Path, n_seq: int, hidden: bool) -> "_Checkpoint | None":
        if not path.is_file():
            return None
        try:
            with np.load(path) as data:
                state = cls(path, n_seq, hidden)
                state.done = state.resumed_at = int(data["done"])
                state.states = [list(data[f"s{i}"]) for i in range(n_seq)]
        except Exception:  # unreadable or from another layout: start over, it is only a cache
            path.unlink(missing_ok=True)
            return None
        return state
