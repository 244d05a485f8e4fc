"""compare(): the comparison without pytest, returning the plugin's result objects."""
import json

import pytest

from pytest_modeldiff import compare
from pytest_modeldiff.checks.registry import CHECKS
from pytest_modeldiff.checks.results import FAILED, PASSED, SKIPPED, CheckResult
from pytest_modeldiff.errors import ModelDiffError, ModelDiffUsageError


def test_compare_returns_check_results_and_the_comparison(demo_ref, demo_cand):
    report = compare(demo_ref, demo_cand, eval_length=64)
    cand = report["demo-q8_0"]
    assert report.passed and cand.passed and [r.name for r in cand.results] == list(CHECKS)
    assert all(isinstance(r, CheckResult) and r.status == (SKIPPED if r.name == "long_context" else PASSED)
               for r in cand.results)  # the demo declares no sliding window: no long-context probe by default
    q = cand.comparison.quality
    assert q.positions > 0 and q.ref_ppl > 1 and len(q.ref_accuracy) == 5
    assert "next-token quality" in str(report) and "all checks passed" in str(report)


def test_thresholds_and_settings_reach_the_checks(demo_ref, demo_cand):
    report = compare(demo_ref, [demo_cand], checks=["kld", "topk_acc_drop"], thresholds={"kld": 1e-12},
                     topk_max=3, eval_length=32)
    cand = report["demo-q8_0"]
    kld = cand.result("kld")
    assert not report.passed and kld.status == FAILED
    assert (kld.threshold.value, kld.threshold.source) == (1e-12, "compare(thresholds=...)")
    assert cand.result("topk_acc_drop").threshold.source == "default (q8)"
    assert len(cand.comparison.quality.agreement) == 3
    assert cand.comparison.layers is None, "no layers check selected: hidden states are not captured"
    assert "modeldiff kld FAILED" in str(report)


def test_bad_options_and_files_raise_one_line_errors(demo_ref, demo_cand, tmp_path):
    with pytest.raises(ModelDiffUsageError, match="unknown check.*kdl"):
        compare(demo_ref, demo_cand, checks=["kdl"])
    with pytest.raises(ModelDiffUsageError, match="unknown setting.*eval_lenght"):
        compare(demo_ref, demo_cand, eval_lenght=3)
    with pytest.raises(ModelDiffUsageError, match="unknown threshold key 'kdl' in compare"):
        compare(demo_ref, demo_cand, thresholds={"kdl": 1})
    with pytest.raises(ModelDiffError, match="missing.gguf: no such file"):
        compare(demo_ref, tmp_path / "missing.gguf")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(demo_cand.read_bytes()[:100_000])
    with pytest.raises(ModelDiffError, match="broken.gguf: truncated or corrupt GGUF"):
        compare(demo_ref, [demo_cand, broken], checks=["kld"])


def test_assertion_helpers_for_probability_mse_and_top_k_accuracy(demo_ref, demo_cand):
    from pytest_modeldiff.assertions import ModelDiffAssertions
    from pytest_modeldiff.checks.thresholds import Thresholds

    cmp = compare(demo_ref, demo_cand, checks=["prob_mse"], eval_length=32)["demo-q8_0"].comparison
    helpers = ModelDiffAssertions(cmp, Thresholds().resolve(cmp.quant_class))
    assert helpers.assert_prob_mse().status == PASSED and helpers.assert_topk_accuracy().status == PASSED
    with pytest.raises(AssertionError, match=r"modeldiff prob_mse FAILED(.|\n)*threshold 1e-15 from argument"):
        helpers.assert_prob_mse(max=1e-15)
    # the random demo model predicts the same few next tokens with both weights: no drop at all
    assert helpers.assert_topk_accuracy(max_drop=0.0).value == 0.0


def test_weights_only_compare_runs_no_model_and_reports_every_tensor(tiny, tmp_path):
    report = compare(tiny / "hf", [tiny / "tiny-q8_0.gguf", tiny / "broken-qk-unpermuted-f16.gguf"], checks=["weights"])
    good, bad = report["tiny-q8_0"], report["broken-qk-unpermuted-f16"]
    assert good.comparison is None and good.passed and good.weights.diff.naming.startswith("HF names mapped")
    assert not bad.passed and "Q/K rows not permuted for rope" in str(bad)
    report.write_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())["candidates"]
    assert [c["positions"] for c in data] == [0, 0]
    tensors = data[1]["checks"][0]["extra"]["weights"]["tensors"]
    assert len(tensors) == 39 and sum(not t["passed"] for t in tensors) == 8


def test_a_model_that_cannot_load_keeps_its_weights_result(demo_ref, demo_cand, tmp_path):
    from fixtures.broken import rewrite_gguf

    rewrite_gguf(demo_cand, tmp_path / "cand.gguf", drop={"blk.0.ffn_up.weight"})
    report = compare(demo_ref, tmp_path / "cand.gguf", checks=["weights", "kld"])
    cand = report["cand"]
    assert cand.error and "cand.gguf" in cand.error and cand.comparison is None
    weights = cand.result("weights")
    assert weights.status == FAILED
    assert any(d.startswith("blk.0.ffn_up.weight [mlp, layer 0]: removed: missing in the candidate")
               for d in weights.details)
    assert "not compared" in str(report) and "modeldiff weights FAILED" in str(report)
    data = report.to_json()["candidates"][0]
    assert data["error"] == cand.error and data["checks"][0]["status"] == FAILED


def test_chat_template_reaches_the_vocab_check_from_both_files(demo_ref, demo_cand, tmp_path):
    """HF side from tokenizer_config.json (or chat_template.jinja), GGUF side from
    tokenizer.chat_template: missing, then changed, then identical."""
    import json
    import shutil

    from fixtures.broken import rewrite_gguf

    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    ref = tmp_path / "hf"
    shutil.copytree(demo_ref, ref)
    config = json.loads((ref / "tokenizer_config.json").read_text())
    (ref / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))

    def vocab(cand):
        result = compare(ref, [cand], checks=["vocab"])[cand.stem].result("vocab")
        return result.status, {r.metric: r.value for r in result.rows}.get("chat template"), result.details

    assert vocab(demo_cand) == ("failed", "missing in the candidate", [
        f"chat template: the reference has one ({len(template)} characters), the candidate has no "
        "tokenizer.chat_template"])
    changed = tmp_path / "changed.gguf"
    rewrite_gguf(demo_cand, changed, set_kv={"tokenizer.chat_template": template.replace(": ", " said: ")})
    status, value, details = vocab(changed)
    assert (status, value) == ("failed", "changed")
    assert details[-1] == ("sample conversation, rendered line 1: reference 'system: You are a helpful assistant.' "
                           "vs candidate 'system said: You are a helpful assistant.'")
    same = tmp_path / "same.gguf"
    rewrite_gguf(demo_cand, same, set_kv={"tokenizer.chat_template": template})
    (ref / "chat_template.jinja").write_text(template)  # transformers' newer place wins over the config
    (ref / "tokenizer_config.json").write_text(json.dumps(config))
    assert vocab(same) == ("passed", f"{len(template)} characters", [])
