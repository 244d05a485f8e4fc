"""--modeldiff-device cuda is refused, saying why, where the runtime would run on the CPU instead;
tests that need a GPU run where one exists and skip, saying why, where none does."""
import llama_cpp
import pytest
import torch

from pytest_modeldiff.errors import ModelDiffUsageError
from pytest_modeldiff.runners.detect import make_runner

NO_CUDA = "no CUDA device: torch.cuda.is_available() is False"
NO_OFFLOAD = "llama-cpp-python built without GPU offload (llama_supports_gpu_offload() is False)"


def test_cuda_without_a_cuda_device_is_a_usage_error_for_torch_runners(demo_ref, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelDiffUsageError, match=r"--modeldiff-device cuda: torch .* sees no CUDA device \(the hf"):
        make_runner(demo_ref, device="cuda")


def test_cuda_with_llama_cpp_built_without_offload_is_a_usage_error(demo_cand, monkeypatch):
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: False)
    with pytest.raises(ModelDiffUsageError, match="built without GPU offload, so llama.cpp would run on the CPU"):
        make_runner(demo_cand, device="cuda")
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)
    assert make_runner(demo_cand, device="cuda").device == "cuda"  # offload: n_gpu_layers -1


def test_cpu_needs_neither(demo_ref, demo_cand, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: False)
    assert make_runner(demo_ref).kind == "hf" and make_runner(demo_cand).kind == "llamacpp"


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_the_demo_pair_on_cuda_agrees_with_the_cpu(demo_ref, demo_cand):
    """The torch reference on the GPU (and the GGUF offloaded when llama.cpp can) against the CPU run."""
    from pytest_modeldiff import compare

    cand_device_ok = llama_cpp.llama_supports_gpu_offload()
    runs = {device: compare(demo_ref, demo_cand, checks=["kld"], device=device, ref_cache=None, eval_length=64)
            for device in ("cpu", "cuda")} if cand_device_ok else None
    if runs is None:
        pytest.skip(NO_OFFLOAD)
    cpu, gpu = (runs[d]["demo-q8_0"].comparison.stats.kld.mean() for d in ("cpu", "cuda"))
    assert runs["cuda"].passed and gpu == pytest.approx(cpu, rel=0.1, abs=1e-4)
