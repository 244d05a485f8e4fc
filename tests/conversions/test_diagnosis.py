"""Diagnosis on built broken conversions: the layers check names the broken layer as its suspect
(scaled, swapped and transposed tensors in an early, a middle and the last layer; llama.cpp and
gguf-torch candidates), per-layer attribution of a quantized candidate, and the long-context probe
that catches a sliding-window bug which short rows miss."""
import time

import pytest

from fixtures import diagnosis
from pytest_modeldiff.checks.layers import check_layers
from pytest_modeldiff.checks.results import FAILED, PASSED
from pytest_modeldiff.checks.run import run_check
from pytest_modeldiff.checks.thresholds import Thresholds
from pytest_modeldiff.engine.modeldiff import ModelDiff
from pytest_modeldiff.engine.settings import Settings
from pytest_modeldiff.report.text import failure_message

CASES = sorted(diagnosis.LAYERS)  # early, last, middle
KINDS = ("scaled", "swapped", "transposed")
SHORT = dict(eval_length=32, ref_cache=None, long_context=0)  # 7 built-in prompts cut to 32 tokens


@pytest.fixture(scope="module")
def diag_set():
    return diagnosis.diagnosis_set()


class Judged:
    """One ModelDiff per runner (the reference runs once); each candidate compared and judged on
    first request, so a selection of the tests runs only what it needs."""

    def __init__(self, folder, runner):
        self.runner = runner
        names = ["tiny-f16", *(f"diag-{kind}-{where}-f16" for kind in KINDS for where in CASES)]
        self.md = ModelDiff(folder / "hf", [folder / f"{n}.gguf" for n in names],
                            Settings(cand_runner=runner, **SHORT))
        self.done = {}

    def __getitem__(self, name):
        if name not in self.done:
            t0 = time.perf_counter()
            cmp = self.md.compare(name)
            result = check_layers(cmp, Thresholds().resolve(cmp.quant_class)["rfn"])
            self.done[name] = (cmp, result, failure_message(result, cmp), time.perf_counter() - t0)
        return self.done[name]


@pytest.fixture(scope="module", params=["llamacpp", "gguf-torch"])
def judged(request, diag_set):
    judged = Judged(diag_set, request.param)
    yield judged.runner, judged
    judged.md.close()


# the middle layer in the default run, the early and last ones in the slow tier
@pytest.mark.parametrize("where", [pytest.param("early", marks=pytest.mark.slow), "middle",
                                   pytest.param("last", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", KINDS)
def test_suspect_is_the_broken_layer(judged, kind, where):
    runner, results = judged
    cmp, result, message, _ = results[f"diag-{kind}-{where}-f16"]
    layer = str(diagnosis.LAYERS[where])
    assert result.status == FAILED, message
    assert result.extra["suspect_layer"] == layer, message
    assert f"suspect layer: layer {layer}" in message
    suspect = result.extra["suspect"]
    assert "weights" in suspect["evidence"] and suspect["tensors"], suspect
    assert all(f".{layer}." in t or f"blk.{layer}." in t for t in suspect["tensors"]), suspect
    # a llama.cpp candidate that fails gets its isolated error from a gguf-torch pass (--modeldiff-isolate auto)
    assert result.extra["isolated_source"] == "gguf-torch"
    assert "isolated error" in suspect["evidence"]
    # the hint quotes the level of the states before the suspect instead of claiming they match
    if layer != "0":
        assert "the states before it stay at rfn <=" in result.hint
    assert "layers before" not in result.hint


def test_good_conversion_has_no_suspect(judged):
    runner, results = judged
    cmp, result, message, _ = results["tiny-f16"]
    assert result.status == PASSED, message
    assert result.extra["suspect_layer"] is None
    assert cmp.layers.isolated_rfn is None or runner == "gguf-torch"  # auto: no isolated pass for a pass


def test_isolate_never_keeps_llama_cpp_without_isolated_error(diag_set):
    md = ModelDiff(diag_set / "hf", [diag_set / "diag-scaled-middle-f16.gguf"], Settings(**SHORT, isolate="never"))
    try:
        cmp = md.compare("diag-scaled-middle-f16")
        result = check_layers(cmp, Thresholds().resolve(cmp.quant_class)["rfn"])
    finally:
        md.close()
    assert result.extra["suspect_layer"] == "2" and result.extra["isolated_source"] is None
    assert result.extra["suspect"]["evidence"] == ["change point", "weights"]


@pytest.mark.slow  # ~30 s of swapped passes; the default tier keeps the broken-layer attribution test
def test_attribution_names_layers_and_sums_near_the_total(diag_set):
    md = ModelDiff(diag_set / "hf", [diag_set / "tiny-q4_k_m.gguf"], Settings(**SHORT, attribution=True))
    try:
        cmp = md.compare("tiny-q4_k_m")
        result = check_layers(cmp, Thresholds().resolve(cmp.quant_class)["rfn"])
    finally:
        md.close()
    table = result.extra["attribution"]
    assert [u["name"] for u in table["units"]] == ["embd", "0", "1", "2", "3", "norm", "head"]
    assert all(u["kld"] >= 0 for u in table["units"]) and table["total_kld"] > 0
    assert 0.3 < table["sum_kld"] / table["total_kld"] < 3  # the parts roughly add up to the whole
    assert table["seconds"] > 0 and cmp.timings["attribution_s"] == table["seconds"]
    assert any(r.metric.startswith("attribution: most KLD from") for r in result.rows)


def test_attribution_isolates_a_broken_layer(diag_set):
    md = ModelDiff(diag_set / "hf", [diag_set / "diag-scaled-middle-f16.gguf"],
                   Settings(**SHORT, attribution=True, cand_runner="gguf-torch"))
    try:
        cmp = md.compare("diag-scaled-middle-f16")
    finally:
        md.close()
    table = cmp.attribution
    assert table["largest"]["name"] == "2" and table["largest"]["share"] > 0.9, table


@pytest.fixture(scope="module")
def sliding():
    return diagnosis.sliding_set()


@pytest.mark.parametrize("runner", ["llamacpp"])
def test_long_context_probe_catches_a_sliding_window_bug_short_rows_miss(sliding, runner):
    """Rows of 32 tokens (= the window) cannot see a wrong window; the probe's default length is
    twice the window from the reference's metadata, and its late buckets degrade."""
    md = ModelDiff(sliding / "hf", [sliding / "sliding-f32.gguf", sliding / "broken-sliding-window-f32.gguf"],
                   Settings(eval_length=diagnosis.SLIDING_WINDOW, ref_cache=None, layers=False, cand_runner=runner))
    try:
        good, bad = md.compare("sliding-f32"), md.compare("broken-sliding-window-f32")
        results = {}
        for cmp in (good, bad):
            th = Thresholds().resolve(cmp.quant_class)
            results[cmp.name] = {name: run_check(name, cmp, th) for name in ("kld", "long_context")}
    finally:
        md.close()
    assert good.long_context["length"] == 2 * diagnosis.SLIDING_WINDOW
    assert good.long_context["source"] == f"twice the sliding window {diagnosis.SLIDING_WINDOW}"
    assert results["sliding-f32"]["kld"].status == PASSED and results["sliding-f32"]["long_context"].status == PASSED
    assert results["broken-sliding-window-f32"]["kld"].status == PASSED  # the short rows miss it
    probe = results["broken-sliding-window-f32"]["long_context"]
    assert probe.status == FAILED, failure_message(probe, bad)
    buckets = bad.long_context["buckets"]
    assert buckets[0]["stop"] == diagnosis.SLIDING_WINDOW and buckets[0]["kld_mean"] < 1e-4
    assert all(b["kld_mean"] > 0.01 for b in buckets[1:])
