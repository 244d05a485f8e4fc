"""The torch reference's precision: resolve_dtype's choice, and what a run reports and caches."""
import pytest

from pytest_modeldiff import compare
from pytest_modeldiff.runners.hf import FLOAT32_FOOTPRINT, resolve_dtype

GB = 10**9


def test_auto_runs_float32_when_it_fits():
    params = 10**9
    assert resolve_dtype("auto", "bfloat16", params, int(FLOAT32_FOOTPRINT * 4 * params)) == ("float32",
                                                                                             "auto: float32 fits")
    assert resolve_dtype("auto", "bfloat16", params, None)[0] == "float32", "unknown memory: the exact choice"
    assert resolve_dtype("auto", None, None, 1)[0] == "float32", "unknown size: the exact choice"


@pytest.mark.parametrize(("stored", "chosen"), [("bfloat16", "bfloat16"), ("float16", "float16"), ("F16", "float16"),
                                                ("BF16", "bfloat16"), ("float32", "bfloat16"), ("Q4_K_M", "bfloat16")])
def test_auto_falls_back_to_the_checkpoints_own_16_bit_type(stored, chosen):
    dtype, why = resolve_dtype("auto", stored, 8 * 10**9, 24 * GB)
    assert dtype == chosen
    assert why.startswith("auto: float32 needs ~48.0 GB, 24.0 GB available")


def test_an_explicit_choice_is_taken_as_given():
    assert resolve_dtype("bfloat16", "float32", 10, 10**12) == ("bfloat16", "--ref-dtype")
    assert resolve_dtype("float32", "bfloat16", 8 * 10**9, GB) == ("float32", "--ref-dtype")


def test_the_run_reports_and_caches_the_dtype_it_ran(demo_ref, demo_cand, tmp_path):
    """The demo reference is stored in bfloat16: auto runs float32, bfloat16 runs bfloat16 (its
    logits differ, so a reference cache entry is per dtype)."""
    runs = {}
    for dtype in ("auto", "bfloat16"):
        report = compare(demo_ref, demo_cand, checks=["kld"], eval_length=32, ref_dtype=dtype,
                         ref_cache=tmp_path / "cache")
        cmp = report["demo-q8_0"].comparison
        runs[dtype] = (cmp.reference.compute_dtype(), cmp.stats.kld.mean())
        assert report.to_json()["reference"]["dtype"] == runs[dtype][0][0]
    assert runs["auto"][0] == ("float32", "auto: float32 fits")
    assert runs["bfloat16"][0] == ("bfloat16", "--ref-dtype")
    assert runs["auto"][1] != runs["bfloat16"][1]
    assert len(list((tmp_path / "cache").glob("*.mdref"))) == 2


def test_a_16_bit_llama_upcast_after_loading_has_the_float32_loads_numbers(demo_ref):
    """UPCAST_AFTER_LOAD: loaded as stored (bfloat16) and upcast, bit for bit the float32 load."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from pytest_modeldiff.runners.hf import HFRunner

    runner = HFRunner(demo_ref)
    assert runner.quant_type() == "bfloat16" and runner._model_arguments()["dtype"] == torch.bfloat16
    runner.load(64)
    assert runner.model.dtype == torch.float32
    direct = AutoModelForCausalLM.from_pretrained(demo_ref, dtype=torch.float32)
    ids = list(range(100, 164))
    with torch.inference_mode():
        expected = direct(input_ids=torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_array_equal(runner.logits(ids), expected)
    assert all(torch.equal(a, b) for a, b in zip(runner.model.buffers(), direct.buffers()))
