"""--modeldiff-llama-perplexity-compat against llama.cpp's own llama-perplexity (built from the
llama.cpp source in the llama-cpp-python sdist): same model, same text, same numbers."""
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_modeldiff import compare

ROOT = Path(__file__).resolve().parents[2]
TEXT = ROOT / "README.md"  # any text of more than 2 x n_ctx tokens
N_CTX, CHUNKS = 128, 4

pytestmark = pytest.mark.slow  # builds llama-perplexity from source: ~5 minutes on 2 cores, once


@pytest.fixture(scope="module")
def llama_perplexity() -> Path:
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed: llama-perplexity cannot be built here")
    from fixtures import build

    return build.llama_perplexity()


def run_llama_perplexity(binary: Path, ref: Path, cand: Path, base: Path) -> tuple[str, str]:
    # -fa off: llama-perplexity turns flash attention on by default, the llamacpp runner runs without
    common = ["-c", str(N_CTX), "-b", str(N_CTX), "-t", "2", "-fa", "off"]
    first = subprocess.run([str(binary), "-m", str(ref), "-f", str(TEXT), "--chunks", str(CHUNKS),
                            "--kl-divergence-base", str(base), *common], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    second = subprocess.run([str(binary), "-m", str(cand), "--kl-divergence-base", str(base), "--kl-divergence",
                             *common], capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    return first.stdout + first.stderr, second.stdout + second.stderr


def number(label: str, text: str) -> float:
    """The value after the last "label:" (the final statistics come after the per-chunk lines)."""
    return float(re.findall(re.escape(label) + r"\s*[:=]\s*(-?[\d.]+)", text)[-1])


def test_statistics_agree_with_llama_perplexity(tiny, tmp_path, llama_perplexity):
    ref, cand = tiny / "tiny-f32.gguf", tiny / "tiny-q4_k_m.gguf"
    base_log, kl_log = run_llama_perplexity(llama_perplexity, ref, cand, tmp_path / "base.kld")
    report = compare(ref, [cand], checks=["kld", "ppl_ratio", "kld_p99", "rms_dp", "same_top"], eval_text=TEXT,
                     eval_length=N_CTX, eval_rows=CHUNKS, llama_perplexity_compat=True)
    ours = report["tiny-q4_k_m"].comparison.kl_stats
    scored = CHUNKS * (N_CTX - 1 - N_CTX // 2)
    assert ours.tokens == scored == (int(re.search(r"computing over (\d+) chunks", kl_log).group(1))
                                     * (N_CTX - 1 - N_CTX // 2))
    # the same llama.cpp kernels: PPL(Q) to the printed digits; the base file stores log
    # probabilities in 16 bits, which moves llama-perplexity's KLD and PPL(base) a little
    assert ours.ppl_ref == pytest.approx(number("Final estimate: PPL", base_log), rel=1e-5)
    assert ours.ppl_cand == pytest.approx(number("Mean PPL(Q)", kl_log), rel=1e-5)
    # its own ln ratio takes PPL(base) from the 16-bit file (clamped 16 nats below the top, which
    # this random model's unlikely next tokens reach): compare with the two runs' float PPLs
    assert ours.ln_ppl_ratio == pytest.approx(
        math.log(number("Mean PPL(Q)", kl_log) / number("Final estimate: PPL", base_log)), abs=1e-5)
    assert ours.kld_mean == pytest.approx(number("Mean    KLD", kl_log), rel=0.01)
    assert ours.kld["median"] == pytest.approx(number("Median  KLD", kl_log), rel=0.01)
    assert ours.kld["p99"] == pytest.approx(number("99.0%   KLD", kl_log), rel=0.02)
    assert ours.kld["max"] == pytest.approx(number("Maximum KLD", kl_log), rel=0.02)
    assert 100 * ours.same_top == pytest.approx(number("Same top p", kl_log), abs=100 / scored + 1e-3)
    assert 100 * ours.rms_dp == pytest.approx(number("RMS Δp", kl_log), abs=2e-3)


def test_compat_layout_is_llama_perplexity_s(tiny):
    """Chunks of n_ctx, the scored second half only; the summary names the scored positions."""
    report = compare(tiny / "hf", [tiny / "tiny-q8_0.gguf"], checks=["kld", "ppl_ratio"], eval_text=TEXT,
                     eval_length=64, eval_rows=3, llama_perplexity_compat=True)
    cmp = report["tiny-q8_0"].comparison
    assert [len(s.ids) for s in cmp.eval.sequences] == [64, 64, 64]
    assert sorted(set(cmp.stats.pos.tolist())) == list(range(32, 63))
    assert report["tiny-q8_0"].result("kld").rows[0].metric == "kld mean, 93 scored positions"
    assert report["tiny-q8_0"].result("ppl_ratio").rows[0].metric == "PPL(cand) / PPL(ref), 93 next tokens"
