"""Per-layer comparison on the tiny model: capture in every runtime, alignment, isolated layer
error, --modeldiff-keep-layers, and the failure message that names the layer."""
import numpy as np
import pytest

from fixtures import build
from pytest_modeldiff.checks.layers import check_layers
from pytest_modeldiff.checks.results import FAILED, PASSED
from pytest_modeldiff.checks.thresholds import Thresholds
from pytest_modeldiff.engine.modeldiff import ModelDiff
from pytest_modeldiff.engine.settings import Settings
from pytest_modeldiff.errors import ModelDiffUsageError
from pytest_modeldiff.metrics import logits as metrics
from pytest_modeldiff.report.text import failure_message
from pytest_modeldiff.runners.detect import make_runner

IDS = list(range(1, 700, 3))  # 233 tokens


def compare(tiny, cand, **settings):
    md = ModelDiff(tiny / "hf", [tiny / f"{cand}.gguf"], Settings(**settings))
    try:
        cmp = md.compare(cand)
        return cmp, check_layers(cmp, Thresholds().resolve(cmp.quant_class)["rfn"])
    finally:
        md.close()


def test_llama_cpp_capture_agrees_with_gguf_torch_on_f32(tiny):
    """Same f32 weights, two runtimes: equal embeddings, layer outputs within the f16 KV cache's
    rounding (llama.cpp keeps K/V in f16: 2^-11 relative per element)."""
    states = {}
    for kind in ("llamacpp", "gguf-torch"):
        runner = make_runner(tiny / "tiny-f32.gguf", kind)
        runner.load(len(IDS))
        fwd = runner.forward(IDS, hidden=True)
        states[kind] = fwd.hidden
        np.testing.assert_array_equal(fwd.logits, runner.logits(IDS))  # one pass gives both
        runner.close()
    assert states["llamacpp"].shape == states["gguf-torch"].shape == (6, len(IDS), 256)
    rfn = metrics.relative_frobenius(states["gguf-torch"], states["llamacpp"])
    assert rfn[0] == 0.0
    assert np.all(rfn[1:] < 1e-3) and np.all(rfn[1:] > 0), rfn


def test_transformers_hidden_states_are_the_canonical_layout(tiny):
    """embd, each layer's raw output, final norm: the norm state is RMSNorm(last layer output)."""
    import torch

    runner = make_runner(tiny / "hf")
    runner.load(len(IDS))
    states = runner.forward(IDS, hidden=True).hidden
    model = runner.model.model
    with torch.inference_mode():
        embd = model.embed_tokens(torch.tensor([IDS]))[0].numpy()
        normed = model.norm(torch.from_numpy(states[-2])[None])[0].numpy()
    np.testing.assert_array_equal(states[0], embd)
    np.testing.assert_allclose(states[-1], normed, rtol=1e-6, atol=1e-6)
    assert not np.allclose(states[-1], states[-2])


def test_gguf_torch_localises_the_scaled_layer_and_isolates_it(tiny):
    cmp, result = compare(tiny, "broken-layer-scaled-f16", cand_runner="gguf-torch")
    assert result.status == FAILED and result.extra["first_offending"] == "1"
    iso = cmp.layers.isolated_mean
    assert iso[2] > 0.03  # layer 1 (state index 2) fed the reference's input is still wrong
    assert np.all(np.delete(iso, 2) < 1e-3), iso  # every other layer alone is fine
    message = failure_message(result, cmp)
    assert "1     |" in message and "<- first over its limit" in message and "<- suspect" in message
    assert result.extra["suspect_layer"] == "1"
    assert result.extra["suspect"]["evidence"] == ["isolated error", "change point", "weights"]
    assert "suspect: layer 1 (rfn " in message and "the median layer's (gguf-torch)" in message
    assert "hint: the states before it stay at rfn <= " in message and "layer 1 departs from that level" in message


def test_keep_layers_hands_the_reference_state_to_later_layers(tiny):
    """Q/K unpermuted breaks every layer; keeping 2 layers, states up to layer 1 are the
    reference's and the error starts again at layer 2."""
    cmp, result = compare(tiny, "broken-qk-unpermuted-f16", cand_runner="gguf-torch", keep_layers=2)
    np.testing.assert_array_equal(cmp.layers.rfn_mean[:3], 0.0)
    assert result.extra["first_offending"] == "2" and [r["kept"] for r in result.extra["layers"]][:4] == [
        True, True, True, False]


def test_keep_layers_needs_a_torch_candidate(tiny):
    with pytest.raises(ModelDiffUsageError, match="runs in llamacpp, which cannot take another model's hidden"):
        ModelDiff(tiny / "hf", [tiny / "tiny-f16.gguf"], Settings(keep_layers=1))


def test_layer_counts_that_differ_are_refused_clearly(tiny, tmp_path):
    shallow = build.build_hf(build.TinySpec(layers=3), tmp_path / "shallow")
    md = ModelDiff(tiny / "hf", [shallow], Settings())
    try:
        cmp = md.compare("shallow")
        result = check_layers(cmp, Thresholds().resolve(cmp.quant_class)["rfn"])
    finally:
        md.close()
    assert result.status == "error"
    assert "cannot align layers" in result.reason and "4 decoder layers of width 256" in result.reason
    assert "3 of width 256" in result.reason


def test_marker_style_limits_per_layer(tiny):
    """A loose limit for layer 1 alone moves the first offending layer past it."""
    cmp, _ = compare(tiny, "broken-layer-scaled-f16")
    limits = Thresholds().resolve(cmp.quant_class, {"rfn": {"1": 0.1}})["rfn"]
    result = check_layers(cmp, limits)
    assert result.extra["first_offending"] == "2"
    limits = Thresholds().resolve(cmp.quant_class, {"rfn": {"*": 0.1}})["rfn"]
    assert check_layers(cmp, limits).status == PASSED
