"""Plugin behaviour through pytester: options, built-in items, markers, precedence, errors,
exit codes, terminal summary and JSON report. Runs on the committed demo pair."""
import csv
import json
import shutil

import pytest

from pytest_modeldiff.checks.registry import CHECKS
from pytest_modeldiff.formats.quant_types import TENSOR_TYPE_ERROR

N = len(CHECKS)
# the demo declares no sliding window: its long_context item is skipped (no --modeldiff-long-context)
SKIPPED_BY_DEFAULT = ("long_context",)

USER_TEST = """
import pytest

def test_tokens(modeldiff):
    modeldiff.assert_tokens_equal()

@pytest.mark.modeldiff(kld=1e-12)
def test_kld_marker_too_tight(modeldiff):
    modeldiff.assert_kld()

@pytest.mark.modeldiff(kld=1.0)
def test_kld_marker_loose(modeldiff):
    modeldiff.assert_kld()

@pytest.mark.modeldiff(kld=1e-12)
def test_argument_beats_marker(modeldiff):
    modeldiff.assert_kld(max=1.0)

def test_topk(modeldiff):
    modeldiff.assert_topk_overlap(k=5, min=0.5)
    modeldiff.assert_nmse()
    modeldiff.assert_same_top()
"""


@pytest.fixture
def run(pytester, demo_ref, demo_cand):
    def run(*args, ref=demo_ref, cand=demo_cand):
        # PATH=VALUE form: pytest takes bare path-like arguments into account for its rootdir
        extra = [] if ref is None else [f"--ref-model={ref}"]
        extra += [] if cand is None else [f"--cand-model={cand}"]
        return pytester.runpytest("-p", "no:cacheprovider", *extra, *args)
    return run


def test_without_ref_model_the_plugin_stays_out_of_the_way(pytester, run):
    pytester.makepyfile(USER_TEST)
    result = run("-rs", ref=None, cand=None)
    result.assert_outcomes(skipped=5)
    result.stdout.fnmatch_lines(["*pytest-modeldiff: no --ref-model given*"])
    assert "modeldiff summary" not in result.stdout.str()


def test_builtin_checks_run_with_no_test_file(run):
    result = run("-v")
    result.assert_outcomes(passed=N - 1, skipped=1)
    out = result.stdout.str()
    for check in CHECKS:
        assert f"modeldiff[demo-q8_0]::{check} {'SKIPPED' if check in SKIPPED_BY_DEFAULT else 'PASSED'}" in out
    # the header says what the plugin adds, before pytest's count (which includes the items)
    result.stdout.fnmatch_lines(["modeldiff: reference * (hf, float32 (stored bfloat16)); candidates: demo-q8_0",
                                 f"modeldiff: adds {N} test items: 1 candidate(s) x {N} checks*",
                                 "modeldiff: gate broken: the default limits fail conversions that are wrong*",
                                 f"*collected {N} items"])
    # -v: the full summary, every table
    result.stdout.fnmatch_lines(["*modeldiff summary (gate broken*",
                                 "modeldiff gate broken: *not a quality bar*",
                                 "demo-q8_0.gguf (llamacpp, Q8_0, class q8) vs hf: all checks passed",
                                 "metric*| value*| threshold*| status", "kld mean, all * positions*| ok",
                                 "weights: top * tensors by relative change*", "per-layer rfn (in-memory):",
                                 "candidate*| type*| size GB*| BPW*| PPL*| same top / GB*| verdict",
                                 "hf (reference)*| float32 (stored bfloat16)*",
                                 "modeldiff: PASSED: the candidate passed gate broken"])
    assert result.ret == 0


def summary_section(result) -> list[str]:
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "modeldiff summary" in line)
    return lines[start:]


def test_strict_markers_without_xdist_accept_the_candidates_group_marker(run):
    """Each candidate's items carry xdist_group; the plugin registers it, so --strict-markers runs
    without pytest-xdist do not stop at collection."""
    result = run("-p", "no:xdist", "--strict-markers", "-W", "error::pytest.PytestUnknownMarkWarning")
    result.assert_outcomes(passed=N - 1, skipped=1)


def test_default_summary_is_the_candidates_table_and_the_verdict(run, tmp_path):
    """No per-check, per-layer or weight table by default: the gate, one candidates table, the
    files written, the verdict; --modeldiff-report=full (or -v) shows them."""
    result = run(f"--modeldiff-json={tmp_path / 'r.json'}")
    result.assert_outcomes(passed=N - len(SKIPPED_BY_DEFAULT), skipped=len(SKIPPED_BY_DEFAULT))
    lines = summary_section(result)
    assert len(lines) <= 14, "\n".join(lines)  # 1 candidate: 7 lines of table and gate, 3 files, verdict
    text = "\n".join(lines)
    assert "per-layer rfn" not in text and "layer | rfn mean" not in text and "weights: top" not in text
    assert "metric" not in text and "next-token quality" not in text
    result.stdout.fnmatch_lines(["*modeldiff summary (gate broken*",
                                 "modeldiff gate broken: the default limits fail conversions that are wrong*",
                                 "candidates (KL columns*",
                                 "candidate*| type*| size GB*| PPL*| PPL ratio*| KLD mean*| KLD p99*| verdict",
                                 "hf (reference)*| float32 (stored bfloat16)*", "demo-q8_0*| Q8_0*| pass",
                                 f"modeldiff: JSON report written to {tmp_path / 'r.json'}",
                                 "modeldiff: PASSED: the candidate passed gate broken", "*15 passed*"])
    full = run("--modeldiff-report=full", "--modeldiff-checks=layers,kld")
    full.stdout.fnmatch_lines(["demo-q8_0.gguf (llamacpp, Q8_0, class q8) vs hf: all checks passed",
                               "per-layer rfn (in-memory):", "layer | rfn mean*"])


def test_quality_gate_is_named_and_its_limits_apply(run, tmp_path):
    report = tmp_path / "r.json"
    result = run("--modeldiff-gate=quality", "--modeldiff-checks=kld,ppl_ratio", f"--modeldiff-json={report}")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["modeldiff: gate quality: the default limits fail conversions worse than a *",
                                 "*modeldiff summary (gate quality*", "modeldiff gate quality: *",
                                 "modeldiff: PASSED: the candidate passed gate quality"])
    data = json.loads(report.read_text())
    assert data["gate"] == "quality"
    assert {c["threshold_source"] for c in data["candidates"][0]["checks"]} == {"default (q8, gate quality)"}
    bad = run("--modeldiff-gate=strict")
    assert bad.ret == 4
    bad.stderr.fnmatch_lines(["*argument --modeldiff-gate: invalid choice: 'strict'*"])


def test_cli_threshold_fails_with_table_source_and_hint(run, tmp_path):
    report = tmp_path / "report.json"
    result = run("--modeldiff-threshold", "kld=1e-9", "--modeldiff-json", str(report))
    result.assert_outcomes(passed=N - 2, failed=1, skipped=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*modeldiff kld FAILED: demo-q8_0.gguf (llamacpp, Q8_0 -> class q8) vs reference hf",
        "metric*| value*| threshold*| status",
        "kld mean, all * positions*<= 1.000e-09*| FAIL",
        "threshold 1e-09 from --modeldiff-threshold",
        "worst positions:",
        "  sequence '*' position * after *: kld *",
        "hint: *",
    ])
    data = json.loads(report.read_text())
    (cand,) = data["candidates"]
    checks = {c["name"]: c for c in cand["checks"]}
    assert set(checks) == set(CHECKS)
    assert checks["kld"]["status"] == "failed" and checks["kld"]["threshold"] == 1e-9
    assert checks["kld"]["threshold_source"] == "--modeldiff-threshold"
    assert checks["nmse"]["status"] == "passed" and checks["nmse"]["threshold_source"] == "default (q8)"
    assert 0 < checks["kld"]["value"] < 0.01
    assert data["reference"]["runner"] == "hf" and cand["quant_type"] == "Q8_0"
    assert data["reference"]["quant_type"] == "bfloat16" and data["reference"]["type"] == "float32 (stored bfloat16)"
    # the summary says what failed and why, then the verdict
    result.stdout.fnmatch_lines([
        "demo-q8_0 FAILED (llamacpp, Q8_0, class q8): kld",
        "  kld: kld mean, all * positions: *, limit <= 1.000e-09 (threshold from --modeldiff-threshold)",
        "    sequence '*' position * after *: kld *",
        "    hint: *",
        "modeldiff: FAILED: 1 of 1 candidates failed gate broken: demo-q8_0 (kld)"])


def test_marker_beats_cli_beats_ini(pytester, run):
    pytester.makeini("[pytest]\nmodeldiff_thresholds =\n    nmse=1e-12\n")
    pytester.makepyfile(USER_TEST)
    result = run("--modeldiff-checks", "none", "--modeldiff-threshold", "kld=1e-12", "--modeldiff-threshold", "nmse=1")
    # kld: marker 1e-12 fails, marker 1.0 wins over the CLI's 1e-12, an argument wins over a marker;
    # nmse: CLI 1 wins over ini 1e-12
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*test_kld_marker_too_tight[[]demo-q8_0[]]*", "*threshold 1e-12 from marker*"])


def test_ini_threshold_applies_when_no_cli(pytester, run):
    pytester.makeini("[pytest]\nmodeldiff_thresholds = max_abs=1e-6\n")
    result = run("-k", "max_abs")
    result.assert_outcomes(failed=1, deselected=N - 1)
    result.stdout.fnmatch_lines(["*threshold 1e-06 from ini modeldiff_thresholds*"])


def test_unknown_marker_key_is_an_error_naming_the_key(pytester, run):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.modeldiff(kdl=0.1)
        def test_x(modeldiff):
            modeldiff.assert_kld()
    """)
    for args in ((), ("--modeldiff-checks", "none")):
        result = run(*args, ref=None, cand=None) if not args else run(*args)
        result.assert_outcomes(errors=1)
        result.stdout.fnmatch_lines(["*unknown threshold key 'kdl' in @pytest.mark.modeldiff on *test_x*known keys*"])
        assert "Traceback" not in result.stdout.str()


@pytest.mark.parametrize("args, message", [
    (["--modeldiff-threshold", "kdl=1"], "ERROR: unknown threshold key 'kdl' in --modeldiff-threshold*"),
    (["--modeldiff-checks", "kld,bogus"], "ERROR: --modeldiff-checks: unknown check(s) bogus*"),
    # parsed at option time (options.py): pytest's usage line, then the option and the problem
    (["--eval-length", "0"], "*error: argument --eval-length: must be an integer >= 2, got '0'"),
    (["--modeldiff-threads=-1"], "*error: argument --modeldiff-threads: must be an integer >= 1, got '-1'"),
    (["--modeldiff-topk-max=0"], "*error: argument --modeldiff-topk-max: must be an integer >= 1, got '0'"),
    (["--modeldiff-eval-rows=x"], "*error: unrecognized arguments: --modeldiff-eval-rows=x*"),
    (["--eval-rows=x"], "*error: argument --eval-rows: must be an integer >= 1, got 'x'"),
])
def test_usage_errors_exit_4_with_one_line(run, args, message):
    result = run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_missing_and_wrong_files_are_named(run, tmp_path, demo_cand):
    result = run(cand=tmp_path / "nope.gguf")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {tmp_path / 'nope.gguf'}: no such file or directory"])

    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04 this is a zip")
    result = run(cand=fake)
    result.stderr.fnmatch_lines([f"ERROR: {fake}: not a GGUF file (starts with b'PK\\x03\\x04', expected b'GGUF')"])

    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(demo_cand.read_bytes()[: demo_cand.stat().st_size // 2])
    result = run(cand=truncated)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {truncated}: truncated GGUF, tensor data needs * bytes, "
                                 "the file has * bytes"])

    result = run(cand=None)
    result.stderr.fnmatch_lines(["ERROR: --ref-model needs at least one --cand-model*"])


def test_llama_cpp_environment_variables_name_the_models(pytester, demo_ref, demo_cand, monkeypatch):
    monkeypatch.setenv("MODEL_PATH", str(demo_ref))
    monkeypatch.setenv("CONVERTED_MODEL", str(demo_cand))
    result = pytester.runpytest("-p", "no:cacheprovider", "--modeldiff-checks=tokens,kld")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"modeldiff: reference {demo_ref} (hf, float32 (stored bfloat16)); "
                                 "candidates: demo-q8_0", "modeldiff: adds 2 test items: *"])

    monkeypatch.setenv("CONVERTED_MODEL", "/nonexistent/model.gguf")  # an option beats the variable
    result = pytester.runpytest("-p", "no:cacheprovider", "--modeldiff-checks=kld", f"--cand-model={demo_cand}")
    result.assert_outcomes(passed=1)

    monkeypatch.delenv("CONVERTED_MODEL")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: MODEL_PATH={demo_ref} needs at least one --cand-model (or CONVERTED_MODEL)*"])


def test_csv_report_and_topk_max(run, tmp_path):
    path = tmp_path / "report.csv"
    result = run("--modeldiff-checks=topk_acc_drop,prob_mse", "--modeldiff-topk-max=7", f"--modeldiff-csv={path}",
                 "--modeldiff-report=full")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["next-token quality (* positions) | reference | candidate | change",
                                 "top-7 accuracy * | * | * | *", f"modeldiff: CSV report written to {path}"])
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["metric"] for r in rows if r["metric"].endswith("_accuracy")] == [f"top{k}_accuracy" for k in range(1, 8)]
    assert [(r["check"], r["status"]) for r in rows if r["check"]] == [("topk_acc_drop", "passed"),
                                                                       ("prob_mse", "passed")]


def test_two_candidates_parametrize_tests_and_items(pytester, run, demo_ref, demo_cand, tmp_path):
    second = tmp_path / "copy-q8_0.gguf"
    shutil.copy(demo_cand, second)
    pytester.makepyfile("def test_t(modeldiff):\n    modeldiff.assert_kld()\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-v", f"--ref-model={demo_ref}",
                                f"--cand-model={demo_cand}", f"--cand-model={second}")
    result.assert_outcomes(passed=2 * N, skipped=2)
    result.stdout.fnmatch_lines(["*test_t[[]demo-q8_0[]] PASSED*", "*test_t[[]copy-q8_0[]] PASSED*",
                                 "*modeldiff[[]copy-q8_0[]]::same_top PASSED*"])


def test_dump_dir_writes_llama_cpp_files(run, tmp_path):
    out = tmp_path / "data"
    result = run("--modeldiff-dump-dir", str(out), "--modeldiff-checks", "kld")
    result.assert_outcomes(passed=1)
    names = {p.name for p in out.iterdir()}
    for prefix in ("pytorch-hf", "llamacpp-demo-q8_0"):
        assert {f"{prefix}.bin", f"{prefix}.txt", f"{prefix}-tokens.bin", f"{prefix}-prompt.txt",
                f"{prefix}-all.bin", f"{prefix}-all-tokens.bin", f"{prefix}-all.json"} <= names
    assert not [n for n in names if n.endswith(".tmp")]
    meta = json.loads((out / "llamacpp-demo-q8_0-all.json").read_text())
    assert meta["n_vocab"] == 49152 and len(meta["model_files_sha256"]) == 1
    assert "llama-cpp-python" in meta["versions"] and meta["settings"]["eval_length"] == 256


def test_dump_candidate_with_nan_and_wrong_size(pytester, run, tmp_path, demo_ref):
    import numpy as np

    tokens = np.array([19556, 28, 957, 1462, 314], dtype=np.int32)
    (tmp_path / "llamacpp-bad-tokens.bin").write_bytes(tokens.tobytes())
    logits = np.zeros(49152, dtype=np.float32)
    logits[7] = np.nan
    (tmp_path / "llamacpp-bad.bin").write_bytes(logits.tobytes())
    report = tmp_path / "r.json"
    result = run("--modeldiff-checks", "kld,vocab", f"--modeldiff-json={report}", cand=tmp_path / "llamacpp-bad.bin")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*the candidate produced NaN/Inf logits at 1 of 1 positions*"])
    checks = {c["name"]: c for c in json.loads(report.read_text())["candidates"][0]["checks"]}  # strict JSON
    assert checks["kld"]["value"] == "nan" and checks["kld"]["status"] == "failed"

    (tmp_path / "llamacpp-bad.bin").write_bytes(np.zeros(49153, dtype=np.float32).tobytes())
    result = run("--modeldiff-checks", "kld", f"--modeldiff-json={report}", cand=tmp_path / "llamacpp-bad.bin")
    result.assert_outcomes(failed=1)
    (entry,) = json.loads(report.read_text())["candidates"]
    kld = next(c for c in entry["checks"] if c["name"] == "kld")
    assert kld["status"] == "error" and kld["reason"].startswith("vocabulary size mismatch: ")
    result.stdout.fnmatch_lines(["*vocabulary size mismatch: *llamacpp-bad.bin gives 49153 logits per position, "
                                 "*hf gives 49152*"])
    assert "Traceback" not in result.stdout.str()


def test_dump_names_follow_candidate_keys_and_dumps_do_not_mix_with_models(run, tmp_path, demo_ref, demo_cand,
                                                                           pytester):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        shutil.copy(demo_cand, tmp_path / folder / "m.gguf")
    out = tmp_path / "data"
    result = pytester.runpytest("-p", "no:cacheprovider", f"--ref-model={demo_ref}",
                                f"--cand-model={tmp_path / 'a/m.gguf'}", f"--cand-model={tmp_path / 'b/m.gguf'}",
                                f"--modeldiff-dump-dir={out}", "--modeldiff-checks=kld")
    result.assert_outcomes(passed=2)
    assert {"llamacpp-m.bin", "llamacpp-m-2.bin", "llamacpp-m-all.json",
            "llamacpp-m-2-all.json"} <= {p.name for p in out.iterdir()}

    mixed = pytester.runpytest("-p", "no:cacheprovider", f"--ref-model={demo_ref}", f"--cand-model={demo_cand}",
                               f"--cand-model={out / 'llamacpp-m.bin'}")
    assert mixed.ret == 4  # known before any model runs: a usage error, not a failed item per check
    mixed.stderr.fnmatch_lines(["ERROR: *llamacpp-m.bin: a logits dump fixes the tokens it was recorded on*"])


LAYER_TEST = """
import pytest

@pytest.mark.modeldiff(rfn={"0": 0.01, "*": 1.0})
def test_marker_limits_layer_0_only(modeldiff):
    modeldiff.assert_layer_rfn()

@pytest.mark.modeldiff(rfn={"1": 0.01})
def test_marker_tight_on_layer_1(modeldiff):
    modeldiff.assert_layer_rfn()

def test_argument_mapping_falls_back_to_the_default(modeldiff):
    modeldiff.assert_layer_rfn(max={"1-3": 0.1, "norm": 0.1})  # embd and layer 0: f16 default 0.01
"""


def test_layers_item_table_json_plot_and_markers(pytester, tiny, tmp_path):
    import xml.etree.ElementTree as ET

    pytester.makepyfile(LAYER_TEST)
    report = tmp_path / "out" / "report.json"
    result = pytester.runpytest("-p", "no:cacheprovider", f"--ref-model={tiny / 'hf'}",
                                f"--cand-model={tiny / 'broken-layer-scaled-f16.gguf'}", "--modeldiff-checks=layers",
                                f"--modeldiff-json={report}")
    # built-in item fails at layer 1; marker: layer 0 within 0.01 passes, layer 1 at 0.01 fails;
    # the argument's loose limits for layers 1-3 and the norm go before the resolved default
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines([
        "*modeldiff layers FAILED: broken-layer-scaled-f16.gguf (llamacpp, F16 -> class f16) vs reference hf",
        "per-layer rfn (in-memory, thresholds from default (f16)):",
        "layer | rfn mean *| rfn max *| cos err *| SQNR dB | isolated rfn | threshold | status",  # gguf-torch pass
        "1 *| FAIL  <- suspect  <- first over its limit",
        "where:", "  first state over its limit: layer 1 (rfn * > 0.01 from default (f16))",
        "  suspect: layer 1 (rfn * -> *, x* over the growth of the states before it; isolated rfn *(gguf-torch)*",
        "hint: the states before it stay at rfn <= *; layer 1 departs from that level*",
    ])
    result.stdout.fnmatch_lines(["*test_marker_tight_on_layer_1*", "*from marker*"])
    layers = next(c for c in json.loads(report.read_text())["candidates"][0]["checks"] if c["name"] == "layers")
    assert layers["extra"]["first_offending"] == "1" and len(layers["extra"]["layers"]) == 6
    assert layers["extra"]["suspect_layer"] == "1" and layers["extra"]["isolated_source"] == "gguf-torch"
    assert layers["extra"]["layers"][2]["rfn_mean"] > 0.03 and layers["extra"]["layers"][2]["passed"] is False
    plot = report.parent / "report-rfn-broken-layer-scaled-f16.svg"
    svg = ET.parse(plot).getroot()
    lines = [e for e in svg.iter() if e.tag.endswith("polyline")]
    assert [e.get("data-label") for e in lines] == ["rfn (mean over sequences)", "isolated rfn", "threshold"]
    assert len(lines[0].get("points").split()) == 6


def test_stream_layers_runs_every_check_on_a_streamed_reference(pytester, tiny, tmp_path):
    result = pytester.runpytest("-p", "no:cacheprovider", "-v", f"--ref-model={tiny / 'hf'}",
                                f"--cand-model={tiny / 'tiny-q8_0.gguf'}", "--modeldiff-stream-layers",
                                f"--modeldiff-checkpoint-dir={tmp_path}", "--modeldiff-ref-cache=none")
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes["passed"] >= 12 and "failed" not in outcomes, outcomes
    result.stdout.fnmatch_lines(["*modeldiff: reference streaming hf: layer 0 done*", "*::kld PASSED*",
                                 "per-layer rfn (streamed):"])
    bad = pytester.runpytest("-p", "no:cacheprovider", f"--ref-model={tiny / 'hf'}",
                             f"--cand-model={tiny / 'tiny-q8_0.gguf'}", "--modeldiff-keep-layers=-1")
    bad.stderr.fnmatch_lines(["*argument --modeldiff-keep-layers: must be an integer >= 0, got '-1'*"])
    assert bad.ret == 4


WEIGHT_TESTS = """
import pytest

def test_weights_close(modeldiff):
    modeldiff.assert_weights_close()

@pytest.mark.modeldiff(weight_rel=1e-5)
def test_weights_marker_too_tight(modeldiff):
    modeldiff.assert_weights_close()

def test_weights_argument(modeldiff):
    modeldiff.assert_weights_close(rel=0.5, cos=0.9, gain=0.1)
"""


def test_weights_check_runs_first_and_runs_no_model(pytester, tiny, tmp_path):
    """-x stops at the failing weights item, before any model is loaded or run; the JSON report
    has every tensor and a per-layer bar chart is written beside it."""
    import xml.etree.ElementTree as ET

    report = tmp_path / "report.json"
    result = pytester.runpytest("-p", "no:cacheprovider", "-v", "-x", f"--ref-model={tiny / 'hf'}",
                                f"--cand-model={tiny / 'broken-layer-scaled-f16.gguf'}", f"--modeldiff-json={report}")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "modeldiff[broken-layer-scaled-f16]::weights FAILED" in out and "::tokens" not in out
    assert "modeldiff: reference hf: sequence" not in out  # the reference never ran
    result.stdout.fnmatch_lines([
        "modeldiff weights FAILED: broken-layer-scaled-f16.gguf (llamacpp, F16 -> class f16) vs reference hf",
        "tensors within their limits * | 32/39 * | all * | FAIL",
        "tensors over their limits:",
        "  blk.1.attn_v.weight [[]attention, layer 1[]] F32 -> F16: *likely cause: scaled by 1.03",
        "weights: top 10 of 39 tensors by relative change*",
        "change pattern: focused: layer(s) 1 changed over 3x the median layer"])
    weights = json.loads(report.read_text())["candidates"][0]["checks"][0]
    assert weights["name"] == "weights" and len(weights["extra"]["weights"]["tensors"]) == 39
    bars = [e for e in ET.parse(tmp_path / "report-weights-broken-layer-scaled-f16.svg").getroot().iter()
            if e.tag.endswith("rect")]
    heights = {e.get("data-label"): float(e.get("height")) for e in bars}
    assert list(heights) == ["0", "1", "2", "3"] and max(heights, key=heights.get) == "1"


def test_weight_assertions_markers_and_weights_only_files(pytester, run, demo_ref, tmp_path):
    pytester.makepyfile(test_weight_helpers=WEIGHT_TESTS)
    result = run("--modeldiff-checks=none")
    result.assert_outcomes(passed=2, failed=1)
    usual = TENSOR_TYPE_ERROR["Q8_0"]  # the calibrated table, not a copy of its number
    result.stdout.fnmatch_lines([f"*within Q8_0's usual error ({usual:g}) but over the threshold from marker*",
                                 "*hint: every failing tensor is within its storage type's usual error*"])
    (pytester.path / "test_weight_helpers.py").unlink()

    import numpy as np
    from safetensors.numpy import save_file

    w = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    save_file({"w": w, "b": w[0]}, tmp_path / "base.safetensors")
    save_file({"w": w * np.float32(1.5), "b": w[0]}, tmp_path / "tuned.safetensors")
    result = run("--modeldiff-checks=weights", ref=tmp_path / "base.safetensors", cand=tmp_path / "tuned.safetensors")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*w [[]other[]] F32 -> F32: *likely cause: scaled by 1.5"])
    result = run("--modeldiff-checks=weights,kld", ref=tmp_path / "base.safetensors",
                 cand=tmp_path / "base.safetensors")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*base.safetensors: a weights-only file cannot run a model; compare it with "
                                 "--modeldiff-checks weights*"])
    # its weights check passed, but a candidate that was not compared never reads as passed
    result.stdout.fnmatch_lines(["base.safetensors *| FAIL: error",
                                 "base.safetensors: not compared: *weights-only*",
                                 "modeldiff: FAILED: 1 of 1 candidates failed gate broken: base.safetensors (error)"])
    assert "all checks passed" not in result.stdout.str() and "PASSED: " not in result.stdout.str()


def test_bad_input_known_before_any_model_runs_is_one_usage_error(pytester, demo_ref, demo_cand, tmp_path):
    """Exit 4 and one line naming the file, not a failed item per check and candidate."""
    empty, latin1 = tmp_path / "empty.txt", tmp_path / "latin1.txt"
    empty.write_text("  \n")
    latin1.write_bytes("caf\u00e9".encode("latin-1"))
    cases = {f"--eval-text={tmp_path / 'missing.txt'}": "*missing.txt: --eval-text file not found",
             f"--eval-text={empty}": "*empty.txt: --eval-text file is empty",
             f"--eval-text={latin1}": "*latin1.txt: --eval-text is not UTF-8 text*",
             f"--eval-dataset={tmp_path / 'none.parquet'}": "*none.parquet: --eval-dataset file not found"}
    for option, message in cases.items():
        result = pytester.runpytest("-p", "no:cacheprovider", f"--ref-model={demo_ref}", f"--cand-model={demo_cand}",
                                    option)
        assert result.ret == 4, option
        result.stderr.fnmatch_lines([f"ERROR: {message}"])
        assert "Traceback" not in result.stderr.str() + result.stdout.str()
    alone = pytester.runpytest("-p", "no:cacheprovider", f"--cand-model={demo_cand}")
    assert alone.ret == 4
    alone.stderr.fnmatch_lines(["ERROR: --cand-model needs a reference to compare against: give --ref-model PATH*"])
