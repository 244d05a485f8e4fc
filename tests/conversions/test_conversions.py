"""End to end on the tiny model: real transformers reference, llama.cpp's converter and quantizer,
llama.cpp runtime. Correct conversions pass every built-in check with defaults; each broken
conversion fails, and fails in the check that names its bug."""
import pytest

from fixtures.build import BUGS as BROKEN  # bug class -> checks that must fail it (others may fail too)
from pytest_modeldiff.checks.results import FAILED, PASSED, SKIPPED
from pytest_modeldiff.checks.run import run_checks
from pytest_modeldiff.checks.thresholds import Thresholds
from pytest_modeldiff.engine.modeldiff import ModelDiff
from pytest_modeldiff.engine.settings import Settings

CORRECT = ["f32", "f16", "bf16", "q8_0", "q4_k_m"]


@pytest.fixture(scope="module")
def tiny_results(tiny):
    files = [tiny / f"tiny-{q}.gguf" for q in CORRECT] + [tiny / f"broken-{b}-f16.gguf" for b in BROKEN]
    md = ModelDiff(tiny / "hf", files, Settings())
    results = {}
    for key, cmp in md.compare_all().items():
        results[key] = {r.name: r for r in run_checks(cmp, Thresholds().resolve(cmp.quant_class))}
    yield results
    md.close()


@pytest.mark.parametrize("qtype", CORRECT)
def test_correct_conversion_passes_with_defaults(tiny_results, qtype):
    results = tiny_results[f"tiny-{qtype}"]
    # the tiny Llama declares no sliding window: its long_context check is skipped without the option
    failed = {name: r.rows for name, r in results.items()
              if r.status != PASSED and not (name == "long_context" and r.status == SKIPPED)}
    assert not failed


@pytest.mark.parametrize("bug", BROKEN)
def test_broken_conversion_fails_with_defaults(tiny_results, bug):
    results = tiny_results[f"broken-{bug}-f16"]
    failed = {name for name, r in results.items() if r.status == FAILED}
    assert set(BROKEN[bug]) <= failed, f"{bug}: expected {BROKEN[bug]} to fail, failed: {failed}"


def test_broken_metadata_names_both_values(tiny_results):
    rows = {r.metric: r for r in tiny_results["broken-rope-base-f16"]["metadata"].rows}
    assert rows["rope_freq_base"].value == "10000.0 vs 50000.0" and not rows["rope_freq_base"].passed


def test_token_failure_names_position_ids_and_pieces(tiny_results):
    tokens = tiny_results["broken-add-bos-flipped-f16"]["tokens"]
    assert any("first difference at token 0: reference" in d and "'<|im_start|>'" in d for d in tokens.details)
    vocab = {r.metric: r for r in tiny_results["broken-add-bos-flipped-f16"]["vocab"].rows}
    assert vocab["add_bos flag"].value == "False vs True" and not vocab["add_bos flag"].passed
    swapped = tiny_results["broken-vocab-swapped-f16"]["vocab"]
    assert any(d.startswith("token 260:") for d in swapped.details)


def test_logit_failure_reports_worst_positions(tiny_results):
    kld = tiny_results["broken-qk-unpermuted-f16"]["kld"]
    assert len(kld.details) == 5 and all(d.startswith("sequence '") for d in kld.details)
    assert kld.hint.startswith("position 0 is fine and later positions are not: suspect rope")
    assert tiny_results["broken-layer-scaled-f16"]["kld"].hint.startswith("the error is there from position 0")


def test_gguf_torch_matches_transformers_on_f32_and_isolates_weight_error(tiny):
    md = ModelDiff(tiny / "hf", [tiny / "tiny-f32.gguf", tiny / "tiny-q8_0.gguf"], Settings(cand_runner="gguf-torch"))
    try:
        f32, q8 = md.compare("tiny-f32"), md.compare("tiny-q8_0")
        assert f32.candidate.kind == "gguf-torch"
        assert float(f32.stats.max_abs.max()) < 1e-4, "same f32 weights in the same framework must agree"
        assert 1e-5 < float(q8.stats.kld.mean()) < 0.01, "q8_0 weights alone give a small, non-zero error"
        results = {r.name: r.status for r in run_checks(f32, Thresholds().resolve(f32.quant_class))}
        assert results.pop("long_context") == SKIPPED  # no sliding window, no --modeldiff-long-context
        assert set(results.values()) == {PASSED}
    finally:
        md.close()


def test_any_runner_can_be_the_reference(tiny):
    """An f16 GGUF as the base for its quants (llama.cpp runs both)."""
    md = ModelDiff(tiny / "tiny-f16.gguf", [tiny / "tiny-q8_0.gguf"])
    try:
        cmp = md.compare("tiny-q8_0")
        results = {r.name: r.status for r in run_checks(cmp, Thresholds().resolve(cmp.quant_class))}
        assert results.pop("long_context") == SKIPPED  # no sliding window, no --modeldiff-long-context
        assert results == dict.fromkeys(results, PASSED) and cmp.reference.kind == "llamacpp"
        assert SKIPPED not in results.values()
    finally:
        md.close()


def test_logits_use_the_reference_ids_even_when_the_candidate_tokenizes_differently(tiny_results, tiny):
    """add-bos-flipped: llama.cpp would prepend BOS, but every logit metric ran on the reference's ids,
    so the logits agree (f16 level) while the tokens check reports the tokenizer bug."""
    results = tiny_results["broken-add-bos-flipped-f16"]
    assert results["tokens"].status == FAILED
    assert results["kld"].status == PASSED and results["kld"].value < 1e-4


@pytest.mark.parametrize("bug, layer", [("layer-scaled", "1"), ("qk-unpermuted", "0"), ("rope-base", "0"),
                                        ("norm-eps", "0")])
def test_layers_check_names_the_first_broken_layer_through_llama_cpp(tiny_results, bug, layer):
    """Layer 1's weights are scaled: layers before it match; rope/norm/QK bugs show in layer 0."""
    result = tiny_results[f"broken-{bug}-f16"]["layers"]
    assert result.extra["first_offending"] == layer
    assert result.extra["largest_jump"] == layer
    first = next(row for row in result.extra["layers"] if row["name"] == layer)
    assert not first["passed"] and all(row["passed"] for row in result.extra["layers"][:int(layer) + 1])
