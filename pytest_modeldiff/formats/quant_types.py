"""Quantization types: the quant class each GGUF file type, tensor type or HF dtype belongs to
(default thresholds are set per class), and the usual error of each tensor storage type (the
weights check judges every tensor by its own type's). Plain tables: no heavy imports."""
from __future__ import annotations

from dataclasses import dataclass

QUANT_CLASSES = ("f32", "f16", "bf16", "q8", "q6", "q5", "q4_k", "q4", "q3", "q2", "q1")


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
    ("Q4_K", "q4_k"), ("IQ4_XS", "q4_k"), ("Q4", "q4"), ("IQ4", "q4"), ("MXFP4", "q4"), ("NVFP4", "q4"),
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
