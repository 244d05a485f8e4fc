"""The architecture matrix (fixtures/archs.py): per family a tiny random model converted with
llama.cpp's official converter and quantized with its quantizer. Correct conversions pass every
default check; each family's characteristic conversion bug fails the check that names it; a family
formats/architectures.py does not map gets the logit checks and skips weights/layers, saying why.

The default tier runs Gemma3 and Qwen3-MoE at q4_k_m (the quant most likely to be judged wrongly),
their bugs and the unmapped family (about 4 minutes on 2 cores, builds included); the rest is
marked slow: pytest -m slow tests/conversions/test_architectures.py (about 25 minutes).
"""
import json
import os
from pathlib import Path

import pytest

from fixtures.archs import BUGS, FAMILIES, QUANTS, family_set
from pytest_modeldiff.checks.results import FAILED, PASSED, SKIPPED
from pytest_modeldiff.checks.run import run_checks
from pytest_modeldiff.checks.thresholds import Thresholds
from pytest_modeldiff.engine.modeldiff import ModelDiff
from pytest_modeldiff.engine.settings import Settings

FAST_FAMILIES = ("gemma3", "qwen3moe")
FAST_QUANTS = ("q4_k_m",)
MAPPED = [name for name, family in FAMILIES.items() if family.mapped]
UNMAPPED = [name for name, family in FAMILIES.items() if not family.mapped]
LOGIT_CHECKS = ("kld", "nmse", "max_abs", "top10", "same_top", "kld_p99", "ppl_ratio", "rms_dp", "prob_mse",
                "topk_acc_drop")


def _tier(family: str, quant: str | None = None):
    fast = family in FAST_FAMILIES and (quant is None or quant in FAST_QUANTS)
    return [] if fast else [pytest.mark.slow]


@pytest.fixture(scope="module")
def matrix():
    """family -> checks of a candidate file, computed on first request; one ModelDiff (one
    reference run) per family."""
    diffs: dict[str, ModelDiff] = {}
    results: dict[tuple[str, str], dict] = {}

    def checks(family: str, stem: str) -> dict:
        if (family, stem) not in results:
            if family not in diffs:
                folder = family_set(family)
                files = [folder / f"{family}-{q}.gguf" for q in QUANTS]
                files += [folder / f"broken-{bug}-f32.gguf" for bug in FAMILIES[family].bugs]
                diffs[family] = ModelDiff(folder / "hf", files, Settings())
            cmp = diffs[family].compare(stem)
            results[family, stem] = {r.name: r for r in run_checks(cmp, Thresholds().resolve(cmp.quant_class))}
            measured.append(_measured(family, stem, cmp, results[family, stem]))
        return results[family, stem]

    measured: list[dict] = []
    yield checks
    for md in diffs.values():
        md.close()
    if os.environ.get("MODELDIFF_ARCH_TABLE"):  # what README's architecture table is made from
        Path(os.environ["MODELDIFF_ARCH_TABLE"]).write_text(json.dumps(measured, indent=1))


def _measured(family: str, stem: str, cmp, results: dict) -> dict:
    weights = cmp.weights_of().diff
    compared = weights.compared() if weights else []
    return {"family": family, "stem": stem, "status": {name: r.status for name, r in results.items()},
            "weight_rel": max((t.rel for t in compared), default=None),
            "weight_gain": max((abs(t.metrics["gain"] - 1) for t in compared), default=None),
            "layer_rfn": float(cmp.layers.rfn_mean.max()) if cmp.layers is not None else None}


@pytest.mark.parametrize("family, quant", [pytest.param(f, q, marks=_tier(f, q), id=f"{f}-{q}")
                                           for f in MAPPED for q in QUANTS])
def test_correct_conversion_passes_every_default_check(matrix, family, quant):
    results = matrix(family, f"{family}-{quant}")
    failed = {name: [(row.metric, row.value, row.threshold) for row in r.rows] + r.details[:3]
              for name, r in results.items() if r.status != PASSED and not no_window(r)}
    assert not failed


def no_window(result) -> bool:
    """The long-context probe runs by default only for models that declare a sliding window."""
    return result.name == "long_context" and result.status == SKIPPED and "no sliding window" in result.reason


@pytest.mark.parametrize("family, bug", [pytest.param(f, b, marks=_tier(f), id=f"{f}-{b}")
                                         for f in MAPPED for b in FAMILIES[f].bugs])
def test_characteristic_bug_fails_the_check_that_names_it(matrix, family, bug):
    results = matrix(family, f"broken-{bug}-f32")
    failed = {name for name, r in results.items() if r.status == FAILED}
    assert set(BUGS[bug].checks) <= failed, f"{family} {bug}: expected {BUGS[bug].checks} to fail, failed: {failed}"


@pytest.mark.parametrize("family", [pytest.param("gemma3"), pytest.param("gemma2", marks=pytest.mark.slow)])
def test_gemma_norm_without_offset_is_named_as_such(matrix, family):
    """The converter stores Gemma's norms as 1 + w: a file without the +1 fails, and says so."""
    weights = matrix(family, "broken-norm-without-offset-f32")["weights"]
    norms = [d for d in weights.details if "_norm.weight" in d]
    assert norms and all("without the converter's +1" in d for d in norms), weights.details[:3]
    assert not [d for d in weights.details if "_norm.weight" not in d and "more" not in d]  # only the norms


@pytest.mark.parametrize("family", [pytest.param("qwen3moe"), pytest.param("mixtral", marks=pytest.mark.slow)])
def test_moe_swapped_experts_are_named_as_moved_rows(matrix, family):
    weights = matrix(family, "broken-experts-swapped-f32")["weights"]
    assert any("ffn_gate_exps" in d and "rows permuted (2 of 4 rows moved)" in d for d in weights.details)


@pytest.mark.parametrize("family", UNMAPPED)
def test_unmapped_family_gets_logit_checks_and_a_clear_skip(family):
    folder = family_set(family)
    md = ModelDiff(folder / "hf", [folder / f"{family}-f16.gguf"], Settings())
    try:
        cmp = md.compare(f"{family}-f16")
        results = {r.name: r for r in run_checks(cmp, Thresholds().resolve(cmp.quant_class))}
    finally:
        md.close()
    for check in ("weights", "layers"):
        assert results[check].status == SKIPPED
        assert results[check].reason.startswith(f"{check}: architecture {family} not mapped")
    assert all(results[name].status == PASSED for name in LOGIT_CHECKS), {
        name: results[name].status for name in LOGIT_CHECKS}


@pytest.mark.slow
@pytest.mark.parametrize("family, bug, cause", [
    ("llama", "qk-unpermuted", "Q/K rows not permuted for rope (llama.cpp's LlamaModel.permute was not applied)"),
    ("olmo2", "qk-permuted", "Q/K rows permuted for rope (LlamaModel.permute) in olmo2, whose converter keeps HF's"),
    ("phi3", "gate-up-swapped", "rows permuted"),
])
def test_weights_failure_names_the_converter_step(matrix, family, bug, cause):
    weights = matrix(family, f"broken-{bug}-f32")["weights"]
    assert any(cause in d for d in weights.details), weights.details[:3]


@pytest.mark.slow
def test_granite_missing_embedding_scale_is_a_metadata_failure(matrix):
    metadata = {row.metric: row for row in matrix("granite", "broken-embedding-scale-missing-f32")["metadata"].rows}
    assert metadata["embedding_scale"].value == "4.0 vs missing" and not metadata["embedding_scale"].passed
    layers = matrix("granite", "broken-embedding-scale-missing-f32")["layers"]
    assert layers.extra["first_offending"] == "embd"  # layer 0's input: llama.cpp's embd lacks the multiplier
