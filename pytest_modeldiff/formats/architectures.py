"""What each architecture's conversion changes, and where each runtime's hidden states are read.

One entry per GGUF ``general.architecture`` the plugin knows. Everything here is derived from
llama.cpp's official converter (convert_hf_to_gguf.py 0.1.1, ``conversion/*.py``) and from the
llama.cpp graphs that run the files (``src/models/*.cpp``, ``src/llama-graph.cpp``), not guessed:

- tensor transforms the converter applies, undone before comparing a GGUF tensor with the HF one
  (weights/diff.py): Q/K rows permuted for rope (``LlamaModel.permute``, ``undo_permute = True``:
  LlamaModel and its subclasses that keep it; OlmoModel permutes weights only), RMSNorm weights
  stored as 1 + w (Gemma, Gemma2, Gemma3: every HF name ending in ``norm.weight``), token
  embedding rows cut to the tokenizer's size (Gemma3), per-expert HF tensors stacked into one
  3-D ``ffn_*_exps`` tensor (Qwen2/3-MoE, OLMoE, Mixtral; a fused HF ``experts.gate_up_proj``
  split into gate = first half, up = second half). Phi-3's fused ``qkv_proj`` and
  ``gate_up_proj`` are kept fused (``attn_qkv``, ``ffn_up``: llama.cpp splits them at run time),
  so they compare as stored. The converter drops ``lm_head.weight`` for Gemma/Gemma2 (tied).
- capture points made equal (runners/): the canonical "embd" state is the *input of decoder
  layer 0*. transformers scales Gemma's embeddings by sqrt(n_embd) inside the embedding module
  and Granite's by embedding_multiplier after it, so the HF runner reads layer 0's input; on
  llama.cpp that point is ``embd`` (build_inp_embd, which already applies Granite's
  f_embedding_scale), ``inp_scaled`` for Gemma (the graph scales after ``embd``), ``inpL`` for
  GPT-2 (token + position embeddings). Layer outputs are ``l_out-N`` (the residual stream after
  the block, = transformers' decoder layer output) and the final norm is ``result_norm`` in
  every graph listed here.
- metadata whose value the runtime takes from its own defaults when the file does not say
  (formats/mapping.py compares them): the sliding-window layer pattern (Gemma2 every 2nd layer
  global, Gemma3 every 6th, OLMo2/3 every 4th), the SWA rope base (Gemma3 10000), whether the
  router's top-k weights are renormalised (Qwen3-MoE always, ``build_moe_ffn(..., true)``),
  the query scale (Gemma2/3: 1/sqrt(head_dim), query_pre_attn_scalar is not read), and whether
  the runtime applies a sliding window at all (llama, qwen2, qwen3 and phi3 graphs do not).

An architecture missing here still gets the logit checks; the weights and layers checks skip it
with :func:`not_mapped` as the reason instead of a verdict they cannot back.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

ROPE_QK = (".attn_q.weight", ".attn_k.weight", ".attn_q.bias", ".attn_k.bias")  # LlamaModel.permute sites
ROPE_QK_WEIGHTS = (".attn_q.weight", ".attn_k.weight")  # OlmoModel: weights only


@dataclass(frozen=True)
class Architecture:
    """One GGUF architecture: the converter's transforms and the runtime's capture points."""

    name: str  # general.architecture
    hf_classes: tuple[str, ...]  # HF architectures the official converter writes as this one
    rope_permuted: tuple[str, ...] = ()  # GGUF name suffixes whose rows LlamaModel.permute reordered
    norm_offset: float = 0.0  # added by the converter to every RMSNorm weight (Gemma: 1 + w)
    norm_pattern: str = r"_norm\.weight$"  # GGUF names that norm_offset applies to
    vocab_truncated: bool = False  # token_embd rows cut to the tokenizer's size (Gemma3)
    embd_tensor: str = "embd"  # llama.cpp graph tensor holding decoder layer 0's input
    hf_embedding_scale: str = ""  # how transformers scales the embedding (documentation, capture)
    swa_applied: bool = False  # llama.cpp's graph applies a sliding window (when the file sets one)
    swa_period: int | None = None  # llama.cpp's implicit pattern: every n-th layer global
    rope_base_swa_default: float | None = None  # llama.cpp's SWA rope base when the file has none
    expert_weights_norm: bool | None = None  # llama.cpp renormalises the top-k router weights
    attn_scale_head_dim: bool = False  # llama.cpp scales queries by 1/sqrt(head_dim), always

    def undo_norm_offset(self, gguf_name: str) -> float:
        """What to subtract from a GGUF tensor to get HF's values (0.0: stored as HF stores it)."""
        return self.norm_offset if self.norm_offset and re.search(self.norm_pattern, gguf_name) else 0.0

    def rope_permutes(self, gguf_name: str) -> bool:
        return gguf_name.endswith(self.rope_permuted) if self.rope_permuted else False

    def swa_pattern(self, n_layer: int) -> list[bool] | None:
        """llama.cpp's set_swa_pattern(period): layer i slides unless i % period == period - 1."""
        if not self.swa_period:
            return None
        return [i % self.swa_period < self.swa_period - 1 for i in range(n_layer)]


_GEMMA = dict(norm_offset=1.0, embd_tensor="inp_scaled", swa_applied=True, attn_scale_head_dim=True,
              hf_embedding_scale="sqrt(hidden_size), inside Gemma3TextScaledWordEmbedding / in GemmaModel.forward")

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    Architecture("llama", ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM"), rope_permuted=ROPE_QK),
    Architecture("granite", ("GraniteForCausalLM",), rope_permuted=ROPE_QK,
                 hf_embedding_scale="embedding_multiplier, in GraniteModel.forward (llama.cpp: in build_inp_embd)"),
    Architecture("olmo", ("OlmoForCausalLM",), rope_permuted=ROPE_QK_WEIGHTS),
    Architecture("olmo2", ("Olmo2ForCausalLM", "Olmo3ForCausalLM"), swa_applied=True, swa_period=4),
    Architecture("qwen2", ("Qwen2ForCausalLM",)),
    Architecture("qwen3", ("Qwen3ForCausalLM",)),
    Architecture("qwen2moe", ("Qwen2MoeForCausalLM",)),
    Architecture("qwen3moe", ("Qwen3MoeForCausalLM",), expert_weights_norm=True),
    Architecture("phi3", ("Phi3ForCausalLM",)),
    Architecture("gemma", ("GemmaForCausalLM",), **{**_GEMMA, "swa_applied": False}),
    Architecture("gemma2", ("Gemma2ForCausalLM",), swa_period=2, **_GEMMA),
    Architecture("gemma3", ("Gemma3ForCausalLM",), swa_period=6, rope_base_swa_default=10000.0, vocab_truncated=True,
                 **_GEMMA),
)}


def architecture(name: str | None) -> Architecture | None:
    """The entry for a GGUF general.architecture, None when the plugin does not map it."""
    return ARCHITECTURES.get(str(name)) if name else None


def not_mapped(name: str | None, check: str) -> str:
    """The skip reason of a check that needs the architecture's mapping."""
    return (f"{check}: architecture {name or '(none)'} not mapped (pytest_modeldiff/formats/architectures.py knows "
            f"{', '.join(sorted(ARCHITECTURES))}); the logit checks still ran")


# --------------------------------------------------------------------------- experts
# HF MoE checkpoints keep one tensor per expert (transformers saves them so); the converter stacks
# them on a new first axis in expert order, under the merged name the tensor map knows.
EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<index>\d+)\.(?P<kind>\w+)\.weight$")
FUSED_GATE_UP = re.compile(r"^(?P<prefix>.*\.experts)\.gate_up_proj(?:\.weight)?$")  # (E, 2 n_ff, n_embd)


def expert_parts(hf_name: str) -> tuple[str, int] | None:
    """(the merged HF name the converter maps, expert index) of one expert's tensor."""
    match = EXPERT.match(hf_name)
    return (f"{match['prefix']}.{match['kind']}", int(match["index"])) if match else None


def fused_gate_up(hf_name: str) -> tuple[str, str] | None:
    """The merged (gate, up) names of a fused gate_up expert tensor, split at half its rows."""
    match = FUSED_GATE_UP.match(hf_name)
    return (f"{match['prefix']}.gate_proj", f"{match['prefix']}.up_proj") if match else None
