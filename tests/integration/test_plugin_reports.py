"""The plugin's reports: Markdown (and GitHub's step summary), HTML, JUnit properties, the
multi-candidate table and llama-perplexity's layout."""
import json
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_markdown_html_junit_and_the_candidate_table(pytester, tiny, tmp_path, monkeypatch):
    step_summary = tmp_path / "step-summary.md"
    step_summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    md, page, junit = tmp_path / "r.md", tmp_path / "r.html", tmp_path / "junit.xml"
    result = pytester.runpytest(
        "-p", "no:cacheprovider", f"--ref-model={tiny / 'hf'}", f"--cand-model={tiny / 'tiny-q8_0.gguf'}",
        f"--cand-model={tiny / 'tiny-q4_k_m.gguf'}", "--modeldiff-checks=kld,kld_p99,ppl_ratio,rms_dp,same_top,nmse",
        f"--modeldiff-markdown={md}", f"--modeldiff-html={page}", f"--junitxml={junit}", "--modeldiff-report=full")
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines([
        "llama-perplexity statistics over * next tokens: PPL(Q) *",
        "candidates (KL columns: llama-perplexity's statistics over the next tokens):",
        "candidate*| type*| size GB*| BPW*| PPL*| PPL ratio*| KLD mean*| same top / GB*| verdict",
        "hf (reference)*", "tiny-q8_0*| Q8_0*| pass", "tiny-q4_k_m*| Q4_K_M*| pass",
        f"modeldiff: Markdown report written to {md}", f"modeldiff: HTML report written to {page}"])
    text = md.read_text()
    assert text.startswith("## ") and "tiny-q4_k_m" in text and "KLD p99" in text
    assert step_summary.read_text() == "earlier step\n" + text + "\n"
    assert page.read_text().startswith("<!DOCTYPE html>") and page.read_text().count("<svg") >= 3
    # pytest 9.2 splits the node id into classname "modeldiff[...]" and name "kld"; 8.x kept it in name
    cases = {"::".join(filter(None, (c.get("classname"), c.get("name")))): c
             for c in ET.parse(junit).getroot().iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["modeldiff[tiny-q8_0]::kld"].iter("property")}
    assert {"modeldiff_kld", "modeldiff_kld_threshold", "modeldiff_ppl_ratio", "modeldiff_kld_p99",
            "modeldiff_same_top", "modeldiff_status"} <= set(props)
    assert float(props["modeldiff_kld"]) > 0 and props["modeldiff_status"] == "passed"


def test_llama_perplexity_compat_option_scores_the_second_half(pytester, tiny, tmp_path):
    report = tmp_path / "r.json"
    result = pytester.runpytest(
        "-p", "no:cacheprovider", f"--ref-model={tiny / 'hf'}", f"--cand-model={tiny / 'tiny-q8_0.gguf'}",
        "--modeldiff-checks=kld,ppl_ratio", "--modeldiff-llama-perplexity-compat", f"--eval-text={ROOT / 'README.md'}",
        "--eval-length=64", "--eval-rows=2", f"--modeldiff-json={report}")
    result.assert_outcomes(passed=2)
    data = json.loads(report.read_text())
    cand = data["candidates"][0]
    assert cand["kl_stats"]["tokens"] == 2 * 31 and cand["positions"] == 2 * 31
    assert data["environment"]["settings"]["llama_perplexity_compat"] is True


def test_compat_without_text_is_a_usage_error(pytester, demo_ref, demo_cand):
    result = pytester.runpytest("-p", "no:cacheprovider", f"--ref-model={demo_ref}", f"--cand-model={demo_cand}",
                                "--modeldiff-checks=kld", "--modeldiff-llama-perplexity-compat")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--modeldiff-llama-perplexity-compat evaluates a text like llama-perplexity's*"])


def test_progress_shows_rate_and_eta_outside_captured_output(pytester, demo_ref, demo_cand):
    pytester.makepyfile(test_progress_user="def test_t(modeldiff):\n    modeldiff.assert_kld()\n")
    result = pytester.runpytest("-p", "no:cacheprovider", f"--ref-model={demo_ref}", f"--cand-model={demo_cand}",
                                "--modeldiff-checks=none", "-v", "-rA")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["modeldiff: reference hf: sequence 1/7, * tokens/s, ETA *:*",
                                 "modeldiff: demo-q8_0: sequence 7/7, * tokens/s, ETA 0:00"])
    assert "Captured stdout" not in result.stdout.str()
