"""Baselines through the plugin: --modeldiff-save-baseline, then --modeldiff-baseline with
--modeldiff-compare-fail passing, and failing a regression with a table; usage errors."""
import json


def test_plugin_saves_then_fails_a_regression_with_a_table(pytester, demo_ref, demo_cand, tmp_path):
    base = tmp_path / "base.json"
    args = ["-p", "no:cacheprovider", f"--ref-model={demo_ref}", f"--cand-model={demo_cand}",
            "--modeldiff-checks=kld,nmse,same_top"]
    pytester.runpytest(*args, f"--modeldiff-save-baseline={base}").assert_outcomes(passed=3)
    saved = json.loads(base.read_text())
    assert saved["candidates"]["demo-q8_0"]["metrics"]["kld"] > 0 and saved["environment"]["models_sha256"]
    result = pytester.runpytest(*args, f"--modeldiff-baseline={base}", "--modeldiff-compare-fail", "kld:10%",
                                "same_top:0.01", "-v")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*modeldiff?demo-q8_0?::baseline PASSED*"])
    saved["candidates"]["demo-q8_0"]["metrics"]["kld"] /= 2  # the candidate is now twice as far off as then
    saved["environment"]["versions"]["torch"] = "0.0"
    base.write_text(json.dumps(saved))
    result = pytester.runpytest(*args, f"--modeldiff-baseline={base}", "--modeldiff-compare-fail=kld:10% nmse:1%")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*modeldiff baseline FAILED: demo-q8_0.gguf got worse than the baseline * in kld",
                                 "metric*baseline*now*worse by*allowed*status",
                                 "kld *FAIL", "nmse *ok",
                                 "*versions torch: baseline '0.0'*", "*ModelDiffEnvironmentWarning*"])


def test_compare_fail_without_baseline_or_malformed_is_a_usage_error(pytester, demo_ref, demo_cand, tmp_path):
    args = ["-p", "no:cacheprovider", f"--ref-model={demo_ref}", f"--cand-model={demo_cand}"]
    result = pytester.runpytest(*args, "--modeldiff-compare-fail=kld:10%")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--modeldiff-compare-fail needs --modeldiff-baseline FILE*"])
    result = pytester.runpytest(*args, f"--modeldiff-baseline={tmp_path / 'none.json'}",
                                "--modeldiff-compare-fail=kld=1")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--modeldiff-compare-fail: 'kld=1': expected METRIC:AMOUNT*"])
