"""The reference cache through the plugin: --modeldiff-ref-cache fills it, a cache entry serves as
--ref-model, --modeldiff-ref-cache=none leaves it alone."""
import warnings


def test_plugin_uses_the_cache_and_takes_it_as_ref_model(pytester, demo_ref, demo_cand, tmp_path):
    cache_dir = tmp_path / "cache"
    args = ["-p", "no:cacheprovider", f"--cand-model={demo_cand}", "--modeldiff-checks=kld,tokens",
            f"--modeldiff-ref-cache={cache_dir}", "-v"]
    pytester.runpytest(f"--ref-model={demo_ref}", *args).assert_outcomes(passed=2)
    entry = next(cache_dir.glob("*.mdref"))
    result = pytester.runpytest(f"--ref-model={entry}", *args, "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*modeldiff: reference *refcache*", "*SKIPPED*tokens*"])
    with warnings.catch_warnings():
        result = pytester.runpytest(f"--ref-model={demo_ref}", *args[:-2], "--modeldiff-ref-cache=none", "-v")
    result.assert_outcomes(passed=2)
