"""Threshold parsing and precedence: marker > CLI > ini > default; errors name key and source."""
import pytest

from pytest_modeldiff.checks.registry import BY_THRESHOLD_KEY, CHECKS, THRESHOLD_KEYS
from pytest_modeldiff.checks.thresholds import Thresholds, parse_assignments, validate
from pytest_modeldiff.errors import ModelDiffUsageError
from pytest_modeldiff.formats.quant_types import (
    GAIN_MARGIN,
    QUANT_CLASSES,
    TENSOR_TYPE_ERROR,
    TENSOR_TYPE_GAIN,
    quant_class,
    usual_weight_error,
    weight_limits,
)


def test_precedence_marker_cli_ini_default():
    t = Thresholds(cli=["kld=0.2", "nmse=0.3"], ini=["kld=0.5", "nmse=0.6", "max_abs=7"])
    resolved = t.resolve("q4", marker={"kld": 0.1})
    assert (resolved["kld"].value, resolved["kld"].source) == (0.1, "marker")
    assert (resolved["nmse"].value, resolved["nmse"].source) == (0.3, "--modeldiff-threshold")
    assert (resolved["max_abs"].value, resolved["max_abs"].source) == (7.0, "ini modeldiff_thresholds")
    assert resolved["top10"].value == CHECKS["top10"].defaults["q4"]
    assert resolved["top10"].source == "default (q4)"


def test_defaults_follow_the_candidate_class():
    t = Thresholds()
    assert t.resolve("f16")["kld"].value < t.resolve("q8")["kld"].value < t.resolve("q4_k")["kld"].value \
        < t.resolve("q4")["kld"].value
    assert t.resolve("f16")["same_top"].value > t.resolve("q4")["same_top"].value


@pytest.mark.parametrize("entries, message", [
    (["kdl=0.1"], "unknown threshold key 'kdl' in --modeldiff-threshold"),
    (["kld=abc"], "threshold kld='abc' in --modeldiff-threshold is not a number"),
    (["kld"], "expected KEY=VALUE"),
    (["kld=-1"], "must be a number >= 0"),
    (["top10=1.5"], "is a fraction and must be <= 1"),
])
def test_bad_cli_values_name_key_and_source(entries, message):
    with pytest.raises(ModelDiffUsageError, match=message.replace("(", r"\(")):
        parse_assignments(entries, "--modeldiff-threshold")


def test_ini_lines_and_commas():
    assert parse_assignments(["kld=0.1, nmse=0.2", "top10=0.5"], "ini") == {"kld": 0.1, "nmse": 0.2, "top10": 0.5}


def test_marker_validation_names_marker():
    with pytest.raises(ModelDiffUsageError, match="in @pytest.mark.modeldiff on t.py::x; known keys"):
        validate({"kdl": 0.1}, "@pytest.mark.modeldiff on t.py::x")


@pytest.mark.parametrize("label, cls", [
    ("F32", "f32"), ("F16", "f16"), ("BF16", "bf16"), ("Q8_0", "q8"), ("Q6_K", "q6"), ("Q5_K_M", "q5"),
    ("Q4_K_M", "q4_k"), ("Q4_K_S", "q4_k"), ("Q4_0", "q4"), ("Q4_1", "q4"), ("IQ4_XS", "q4"), ("IQ4_NL", "q4"),
    ("Q3_K_S", "q3"), ("Q2_K", "q2"), ("IQ1_M", "q1"),
    ("float32", "f32"), ("bfloat16", "bf16"), ("float16", "f16"), ("int8", "q8"), ("int4", "q4"),
    ("GUESSED", "q2"), ("something-new", "q2"),
])
def test_quant_class(label, cls):
    assert quant_class(label) == cls


def test_every_threshold_check_has_a_default_for_every_class():
    """...except the weights keys, whose default comes from each tensor's storage type."""
    for key in THRESHOLD_KEYS:
        limit = BY_THRESHOLD_KEY[key]
        if limit.check == "weights":
            assert not limit.defaults
            continue
        assert set(QUANT_CLASSES) <= set(limit.defaults), key


def test_weight_keys_default_per_tensor_type_and_take_one_number():
    resolved = Thresholds(["weight_cos=0.99"]).resolve("q4", marker={"weight_rel": 0.05})
    assert (resolved["weight_rel"].value, resolved["weight_rel"].source) == (0.05, "marker")
    assert (resolved["weight_cos"].value, resolved["weight_cos"].source) == (0.99, "--modeldiff-threshold")
    assert resolved["weight_gain"].value is None and "storage type" in resolved["weight_gain"].source
    with pytest.raises(ModelDiffUsageError, match="weight_cos.*fraction and must be <= 1"):
        Thresholds(["weight_cos=1.5"])


def test_usual_weight_error_by_storage_type():
    assert usual_weight_error("F32", "F16") == TENSOR_TYPE_ERROR["F16"]
    assert usual_weight_error("BF16", "F32") == usual_weight_error("F16", "F16") == 0.0  # held exactly
    assert usual_weight_error("F32", "IQ3_S") == TENSOR_TYPE_ERROR["Q3_K"]  # not measured: its class's largest
    limits = weight_limits("F32", "Q4_K")
    assert (limits.rel == 2 * TENSOR_TYPE_ERROR["Q4_K"]
            and limits.gain == pytest.approx(GAIN_MARGIN * TENSOR_TYPE_GAIN["Q4_K"]))
    # a biased type has its own measured gain (Q5_1's ~1.02 on correct files), not a share of its error
    assert weight_limits("F32", "Q5_1").passes({"rel": 0.053, "cos": 0.9988, "gain": 1.0195})
    assert not weight_limits("F32", "Q4_K").passes({"rel": 0.04, "cos": 0.9992, "gain": 1.02})  # scaled x1.02
    assert weight_limits("F32", "IQ3_S").gain == pytest.approx(0.15 * TENSOR_TYPE_ERROR["Q3_K"])  # no gain measured
    assert weight_limits("F32", "Q8_0").gain == pytest.approx(GAIN_MARGIN * TENSOR_TYPE_GAIN["Q8_0"])
    assert weight_limits("F32", "F16").gain == 1e-3  # floor
    assert limits.cos == pytest.approx(1 / (1 + limits.rel ** 2) ** 0.5)
    assert weight_limits("F32", "F32").rel == 1e-6


def test_layer_patterns_resolve_per_layer_across_sources():
    t = Thresholds(cli=["rfn=0.1", "rfn[0-1]=0.03"], ini=["rfn[norm]=0.5"])
    limits = t.resolve("q8", marker={"rfn": {"2": 0.001, "5-9": 0.2}})["rfn"].value
    got = {name: (limits.for_layer(name).value, limits.for_layer(name).source)
           for name in ("embd", "0", "1", "2", "3", "7", "norm")}
    assert got == {
        "embd": (0.1, "--modeldiff-threshold"),  # CLI "*" (the marker has no pattern for it)
        "0": (0.03, "--modeldiff-threshold"), "1": (0.03, "--modeldiff-threshold"),  # more specific than "*"
        "2": (0.001, "marker"), "3": (0.1, "--modeldiff-threshold"), "7": (0.2, "marker"),
        "norm": (0.1, "--modeldiff-threshold"),  # CLI "*" outranks the ini's more specific pattern
    }
    default = Thresholds().resolve("f16")["rfn"]
    assert default.value.for_layer("3") == default.value.for_layer("embd")
    assert default.value.for_layer("3").value == CHECKS["layers"].defaults["f16"]


def test_layer_pattern_forms():
    assert validate({"rfn": 0.05}, "m") == {"rfn": {"*": 0.05}}
    assert validate({"rfn": {"0 - 3": 0.02, 4: 0.1, "embd": 1, "*": 0.05}}, "m") == {
        "rfn": {"0-3": 0.02, "4": 0.1, "embd": 1.0, "*": 0.05}}
    assert parse_assignments(["rfn=0.05", "rfn[2-3]=0.01"], "cli") == {"rfn": {"*": 0.05, "2-3": 0.01}}


@pytest.mark.parametrize("values, message", [
    ({"rfn": {"3-1": 0.1}}, "layer pattern '3-1': expected"),
    ({"rfn": {"first": 0.1}}, "layer pattern 'first'"),
    ({"rfn": {"*": "x"}}, "threshold rfn='x' in m is not a number"),
    ({"kld": {"*": 0.1}}, "threshold kld in m takes one number, not a mapping"),
])
def test_bad_layer_patterns_name_the_pattern(values, message):
    with pytest.raises(ModelDiffUsageError, match=message):
        validate(values, "m")


def test_per_layer_form_only_for_layer_keys():
    with pytest.raises(ModelDiffUsageError, match="kld has no per-layer form"):
        parse_assignments(["kld[0]=0.1"], "cli")


def test_the_gate_picks_the_default_table_and_keeps_the_precedence():
    broken, quality = Thresholds(), Thresholds(cli=["kld=0.3"], gate="quality")
    assert broken.gate == "broken" and broken.resolve("q4_k")["ppl_ratio"].source == "default (q4_k)"
    q = quality.resolve("q4_k", marker={"same_top": 0.5})
    assert (q["ppl_ratio"].value, q["ppl_ratio"].source) == (CHECKS["ppl_ratio"].quality["q4_k"],
                                                             "default (q4_k, gate quality)")
    assert q["ppl_ratio"].value < broken.resolve("q4_k")["ppl_ratio"].value  # tighter
    assert (q["kld"].value, q["kld"].source) == (0.3, "--modeldiff-threshold")  # CLI beats the gate's default
    assert (q["same_top"].value, q["same_top"].source) == (0.5, "marker")
    # checks the quality gate does not tighten keep the broken gate's number
    assert q["max_abs"].value == CHECKS["max_abs"].defaults["q4_k"]
    assert q["rfn"].source == "default (q4_k, gate quality)"
    assert quality.with_gate("broken").resolve("q4_k")["kld"].value == 0.3  # same CLI limits, other defaults
    with pytest.raises(ModelDiffUsageError, match="unknown gate 'strict'; known gates: broken, quality"):
        Thresholds(gate="strict")


def test_quality_gate_passes_the_measured_quantizations_with_margin():
    """Every measured correct quantization is within its class's quality limits (the rule's 1.25x)."""
    from pytest_modeldiff.checks.registry import HIGHER, QUALITY_CHECKS, QUALITY_MEASURED

    for rows in QUALITY_MEASURED.values():
        for quant, values in rows.items():
            for name in QUALITY_CHECKS:
                limit, check = CHECKS[name].quality[quant], CHECKS[name]
                assert (values[name] >= limit) if check.direction == HIGHER else (values[name] <= limit), (quant, name)
