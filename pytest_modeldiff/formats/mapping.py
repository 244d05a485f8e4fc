"""The one table that maps architecture hyper-parameters between HF config.json and GGUF metadata.

Each row names a canonical key, the GGUF key (``{arch}`` is general.architecture) and the HF
config attributes that may hold it, first match wins. Both runners turn their own format into
canonical keys through this table, so the ``metadata`` check compares like with like.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Mapping

import gguf
import numpy as np
from gguf import Keys

from .architectures import ARCHITECTURES, ROPE_QK, architecture
from .fields import is_int


@dataclass(frozen=True)
class HParam:
    key: str
    gguf: str
    hf: tuple[str, ...]
    kind: type = int


HPARAMS = [
    HParam("n_layer", Keys.LLM.BLOCK_COUNT, ("num_hidden_layers", "n_layer", "num_layers")),
    HParam("n_embd", Keys.LLM.EMBEDDING_LENGTH, ("hidden_size", "n_embd", "d_model")),
    HParam("n_ff", Keys.LLM.FEED_FORWARD_LENGTH, ("intermediate_size", "n_inner", "ffn_dim")),
    HParam("n_head", Keys.Attention.HEAD_COUNT, ("num_attention_heads", "n_head")),
    HParam("n_head_kv", Keys.Attention.HEAD_COUNT_KV, ("num_key_value_heads",)),
    HParam("head_dim", Keys.Attention.KEY_LENGTH, ("head_dim",)),
    HParam("n_ctx_train", Keys.LLM.CONTEXT_LENGTH, ("max_position_embeddings", "n_positions")),
    HParam("n_vocab", Keys.LLM.VOCAB_SIZE, ("vocab_size",)),
    HParam("rope_freq_base", Keys.Rope.FREQ_BASE, ("rope_theta",), float),
    HParam("rope_scaling_type", Keys.Rope.SCALING_TYPE, ("rope_type",), str),
    HParam("rope_scaling_factor", Keys.Rope.SCALING_FACTOR, ("factor",), float),
    HParam("norm_rms_eps", Keys.Attention.LAYERNORM_RMS_EPS, ("rms_norm_eps",), float),
    HParam("norm_eps", Keys.Attention.LAYERNORM_EPS, ("layer_norm_eps", "layer_norm_epsilon"), float),
    HParam("sliding_window", Keys.Attention.SLIDING_WINDOW, ("sliding_window",)),
    HParam("attn_softcap", Keys.LLM.ATTN_LOGIT_SOFTCAPPING, ("attn_logit_softcapping",), float),
    HParam("final_softcap", Keys.LLM.FINAL_LOGIT_SOFTCAPPING, ("final_logit_softcapping",), float),
    # architecture-specific keys (formats/architectures.py): present on one side only when it matters.
    # Literal key names where gguf-py 0.17.1 (pyproject's floor) has no constant for them yet.
    HParam("rope_freq_base_swa", "{arch}.rope.freq_base_swa", ("rope_local_base_freq",), float),
    HParam("rope_dims", Keys.Rope.DIMENSION_COUNT, ()),
    HParam("expert_count", Keys.LLM.EXPERT_COUNT, ("num_experts", "num_local_experts")),
    HParam("expert_used_count", Keys.LLM.EXPERT_USED_COUNT, ("num_experts_per_tok",)),
    HParam("n_ff_exp", Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, ("moe_intermediate_size",)),
    HParam("expert_weights_norm", Keys.LLM.EXPERT_WEIGHTS_NORM, ("norm_topk_prob",), bool),
    HParam("embedding_scale", Keys.LLM.EMBEDDING_SCALE, ("embedding_multiplier",), float),
    HParam("residual_scale", Keys.LLM.RESIDUAL_SCALE, ("residual_multiplier",), float),
    HParam("attn_scale", Keys.Attention.SCALE, ("attention_multiplier",), float),
    HParam("logit_scale", Keys.LLM.LOGIT_SCALE, ("logits_scaling",), float),
]
# canonical "swa_layers": one letter per layer, S = sliding-window attention, F = full attention

# Float hyper-parameters are stored as float32 in GGUF: compare with this relative tolerance.
FLOAT_RTOL = 1e-6


def _complete(values: dict[str, Any]) -> dict[str, Any]:
    """Fill values both formats leave implicit, so a default is not reported as a mismatch."""
    if "n_head" in values:
        values.setdefault("n_head_kv", values["n_head"])
        n_head, n_embd = values["n_head"], values.get("n_embd")
        if is_int(n_head, 1) and is_int(n_embd, 1):
            values.setdefault("head_dim", n_embd // n_head)
    if "head_dim" in values and "rope_dims" not in values:
        values["rope_dims"] = values["head_dim"]  # llama.cpp's n_rot default; transformers rotates it all
    values.setdefault("rope_scaling_type", "none")
    if (values["rope_scaling_type"] in ("none", "default", "linear")
            and values.get("rope_scaling_factor") in (None, 1.0)):
        values.pop("rope_scaling_factor", None)
    if values["rope_scaling_type"] == "default":
        values["rope_scaling_type"] = "none"
    return values


def _coerce(raw, kind: type):
    """A GGUF value as ``kind`` for comparison and JSON: a per-layer array becomes one value when
    all layers agree, else a list; a value that does not convert (a string where a number belongs,
    NaN for an int) stays as it is, so the metadata check shows it rather than crashing on it."""
    if isinstance(raw, np.ndarray):
        raw = raw.tolist()
    if isinstance(raw, (list, tuple)):
        items = [_coerce(x, kind) for x in raw]
        return items[0] if items and all(x == items[0] for x in items) else items
    if isinstance(raw, np.generic):
        raw = raw.item()
    try:
        return kind(raw)
    except (TypeError, ValueError, OverflowError):
        return raw


def from_hf_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Canonical hyper-parameters from a config.json dict (transformers 4 and 5 layouts)."""
    text = config.get("text_config") or {}
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    sources = [config, text, rope]
    values: dict[str, Any] = {}
    for hp in HPARAMS:
        for source in sources:
            found = next((source[a] for a in hp.hf if source.get(a) is not None), None)
            if found is not None:
                values[hp.key] = _coerce(found, hp.kind)  # a list or a stray type must not crash
                break
    if rope.get("type") and "rope_scaling_type" not in values:
        values["rope_scaling_type"] = str(rope["type"])
    _hf_layer_attention(values, {**config, **text}, rope)
    return _complete(values)


def _hf_layer_attention(values: dict[str, Any], config: Mapping[str, Any], rope: Mapping[str, Any]) -> None:
    """What transformers 5 keeps per layer type (rope bases, sliding layers) and per-family
    scalars, in the canonical keys; a window that is switched off is no window."""
    full, sliding = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
    if isinstance(full, Mapping) and full.get("rope_theta") is not None:
        values["rope_freq_base"] = _coerce(full["rope_theta"], float)
        if full.get("rope_type"):
            values.setdefault("rope_scaling_type", str(full["rope_type"]))
    if isinstance(sliding, Mapping) and sliding.get("rope_theta") is not None:
        values["rope_freq_base_swa"] = _coerce(sliding["rope_theta"], float)
    layer_types = config.get("layer_types")
    if config.get("use_sliding_window") is False or (
            isinstance(layer_types, list) and "sliding_attention" not in layer_types):
        values.pop("sliding_window", None)
        values.pop("rope_freq_base_swa", None)
    elif values.get("sliding_window") and isinstance(layer_types, list):
        values["swa_layers"] = "".join("S" if t == "sliding_attention" else "F" for t in layer_types)
    factor = config.get("partial_rotary_factor", rope.get("partial_rotary_factor"))
    head_dim, n_head, n_embd = values.get("head_dim"), values.get("n_head"), values.get("n_embd")
    if head_dim is None and is_int(n_head, 1) and is_int(n_embd, 1):
        head_dim = n_embd // n_head
    if isinstance(factor, (int, float)) and is_int(head_dim, 1):
        values["rope_dims"] = int(head_dim * factor)
    if config.get("query_pre_attn_scalar"):  # Gemma 2/3: queries scaled by query_pre_attn_scalar^-0.5
        values["attn_scale"] = float(config["query_pre_attn_scalar"]) ** -0.5


def from_gguf_metadata(metadata: Mapping[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """Canonical hyper-parameters from GGUF key/values (``{arch}`` = general.architecture)."""
    arch = str(metadata.get(Keys.General.ARCHITECTURE, "llama"))
    values: dict[str, Any] = {}
    for hp in HPARAMS:
        raw = metadata.get(hp.gguf.format(arch=arch))
        if raw is not None:
            values[hp.key] = _coerce(raw, hp.kind)
    tokens = metadata.get(Keys.Tokenizer.LIST)
    if "n_vocab" not in values and isinstance(tokens, (list, np.ndarray)):
        values["n_vocab"] = len(tokens)
    if "rope_freqs.weight" in tensor_names and "rope_scaling_type" not in values:
        values["rope_scaling_type"] = "llama3"  # llama.cpp stores Llama-3.1 scaling as a tensor
    _gguf_runtime_defaults(values, metadata, arch)
    return _complete(values)


def _gguf_runtime_defaults(values: dict[str, Any], metadata: Mapping[str, Any], arch: str) -> None:
    """The values llama.cpp uses for this architecture when the file does not set them
    (formats/architectures.py), so a default the runtime imposes is compared like a stored one."""
    entry = architecture(arch)
    if entry is None:
        return
    values.setdefault("rope_freq_base", 10000.0)  # llama_model::load_hparams' default (Gemma2's converter writes none)
    if not entry.swa_applied:  # the graph has no sliding window: neither its window nor its pattern apply
        for key in ("sliding_window", "rope_freq_base_swa"):
            values.pop(key, None)
    elif values.get("sliding_window"):
        pattern = metadata.get(f"{arch}.attention.sliding_window_pattern")  # literal: newer than gguf-py 0.17.1
        n_layer = values.get("n_layer")
        if isinstance(pattern, (list, np.ndarray)):
            values["swa_layers"] = "".join("S" if bool(x) else "F" for x in list(pattern))
        elif is_int(n_layer, 1):
            period = int(pattern) if isinstance(pattern, (int, np.integer)) else entry.swa_period
            layers = [i % period < period - 1 for i in range(n_layer)] if period else None
            if layers is not None:
                values["swa_layers"] = "".join("S" if x else "F" for x in layers)
        if entry.rope_base_swa_default is not None:
            values.setdefault("rope_freq_base_swa", entry.rope_base_swa_default)
        values.setdefault("rope_freq_base_swa", values.get("rope_freq_base"))
    if entry.expert_weights_norm is not None:
        values.setdefault("expert_weights_norm", entry.expert_weights_norm)
    if entry.attn_scale_head_dim and "attn_scale" not in values:
        head_dim = values.get("head_dim")
        if is_int(head_dim, 1):
            values["attn_scale"] = float(head_dim) ** -0.5


def compare(ref: Mapping[str, Any], cand: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, ref value, cand value) for every key that differs; keys on one side only count
    when the reference has them (a missing rope scaling factor is a classic conversion bug)."""
    diffs = []
    for key, ref_value in ref.items():
        cand_value = cand.get(key)
        if isinstance(ref_value, float) and isinstance(cand_value, float):
            if abs(ref_value - cand_value) <= FLOAT_RTOL * max(abs(ref_value), abs(cand_value)):
                continue
        elif ref_value == cand_value:
            continue
        diffs.append((key, ref_value, cand_value))
    return diffs


# --------------------------------------------------------------------------- tensor names
# Architectures whose Q/K rows llama.cpp's converter permutes for its rope layout (LlamaModel.permute,
# applied to q_proj/k_proj weights and biases): each head's [first half | second half] rows become
# interleaved pairs. Other archs keep HF's row order. formats/architectures.py says which.
ROPE_PERMUTED_ARCHS = {name for name, a in ARCHITECTURES.items() if a.rope_permuted}
ROPE_PERMUTED = ROPE_QK

# HF tensors the converter drops on purpose (ModelBase: buffers, not weights) and GGUF tensors it
# computes from the config; a weight comparison reports them without failing.
DROPPED_BY_CONVERTER = (".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias", ".attn.masked_bias",
                        ".attn.bias")
MADE_BY_CONVERTER = ("rope_freqs.weight",)

# Tied output head: a model without its own output matrix uses the token embedding (transformers'
# tie_word_embeddings; llama.cpp loads token_embd as output when output.weight is absent).
TIED_OUTPUT = {"gguf": ("output.weight", "token_embd.weight"), "hf": ("lm_head.weight", "model.embed_tokens.weight")}


def gguf_tensor_name(arch: str, n_layers: int, hf_name: str) -> str | None:
    """The GGUF name of an HF parameter, through gguf-py's own tensor-name map (None if unmapped)."""
    name_map = _tensor_name_map(arch, n_layers)
    return None if name_map is None else name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))


@functools.lru_cache(maxsize=8)
def _tensor_name_map(arch: str, n_layers: int):
    """gguf-py builds the map for every layer of every tensor kind: once per model, not per name."""
    arch_enum = next((a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch), None)
    return None if arch_enum is None else gguf.get_tensor_name_map(arch_enum, n_layers)


def rope_head_dim(arch: str, gguf_name: str, n_rows: int, n_head: int, n_head_kv: int) -> int | None:
    """Rows per head of a tensor whose rows the converter permuted for rope (None: HF's order kept)."""
    entry = architecture(arch)
    if entry is None or not entry.rope_permutes(gguf_name):
        return None
    return n_rows // (n_head if ".attn_q." in gguf_name else n_head_kv)


def rope_rows_to_hf(rows, head_dim: int):
    """Undo LlamaModel.permute on whole heads of rows: interleaved pairs -> [first half | second half]."""
    return rows.reshape(-1, head_dim // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def rope_rows_to_gguf(rows, head_dim: int):
    """LlamaModel.permute itself: [first half | second half] -> interleaved pairs, per head."""
    return rows.reshape(-1, 2, head_dim // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def to_hf_layout(arch: str, gguf_name: str, weight, n_head: int, n_head_kv: int):
    """Undo the converter's layout and value changes for one whole tensor (numpy, HF shape):
    the rope permutation of Q/K, a norm stored as offset + w (formats/architectures.py)."""
    head_dim = rope_head_dim(arch, gguf_name, weight.shape[0], n_head, n_head_kv)
    weight = weight if head_dim is None else rope_rows_to_hf(weight, head_dim)
    entry = architecture(arch)
    offset = entry.undo_norm_offset(gguf_name) if entry else 0.0
    return weight - np.float32(offset) if offset else weight


def tensor_group(name: str) -> tuple[str, int | None]:
    """(group, layer index) of a tensor by its GGUF or HF name: group is one of embedding,
    attention, mlp, norm, output, other; the index is None outside the decoder blocks."""
    match = re.search(r"(?:^|\.)(?:blk|layers|h|layer|blocks)\.(\d+)\.", name)
    layer = int(match.group(1)) if match else None
    for group, pattern in TENSOR_GROUPS:
        if re.search(pattern, name.lower()):
            return group, layer
    return "other", layer


# First match wins: norms before attention ("attn_norm"), the bare output head before "attn_output".
TENSOR_GROUPS = (
    ("norm", r"norm|(^|\.)ln_"),
    ("embedding", r"embed|token_embd|(^|\.)wte|(^|\.)wpe|word_embeddings"),
    ("output", r"^(lm_head|output)\."),
    ("attention", r"attn|attention|[qkvo]_proj|qkv"),
    ("mlp", r"mlp|ffn|gate|up_proj|down_proj|fc[12]|experts"),
)
