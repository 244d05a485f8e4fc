"""`modeldiff` / `python -m pytest_modeldiff`: the engine without pytest, the plugin's options,
summary (candidates table, what failed and why, files written, verdict) and exit codes 0/1/2."""
import json
import os
import subprocess
import sys
from pathlib import Path


def run(*args):
    return subprocess.run([sys.executable, "-m", "pytest_modeldiff", *map(str, args)], capture_output=True, text=True)


def test_cli_passes_and_fails_with_exit_codes(demo_ref, demo_cand, tmp_path):
    ok = run("--ref-model", demo_ref, "--cand-model", demo_cand, "--modeldiff-checks", "tokens,kld",
             "--modeldiff-json", tmp_path / "r.json")
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[0].startswith("modeldiff gate broken: the default limits fail conversions that are wrong")
    assert lines[2].startswith("candidate ") and "| verdict" in lines[2]
    assert lines[4].startswith("hf (reference)") and "float32 (stored bfloat16)" in lines[4]
    assert lines[5].startswith("demo-q8_0 ") and lines[5].endswith("| pass")
    assert lines[-2:] == [f"modeldiff: JSON report written to {tmp_path / 'r.json'}",
                          "modeldiff: PASSED: the candidate passed gate broken"]
    assert "metric" not in ok.stdout  # the per-check tables only with -v
    assert [c["name"]
            for c in json.loads((tmp_path / "r.json").read_text())["candidates"][0]["checks"]] == ["tokens", "kld"]
    bad = run("--ref-model", demo_ref, "--cand-model", demo_cand, "--modeldiff-checks", "kld",
              "--modeldiff-threshold", "kld=1e-12", "-v")
    assert bad.returncode == 1
    # -v: the failure message as pytest shows it, every table, then the summary's end
    assert "modeldiff kld FAILED" in bad.stdout and "threshold 1e-12 from --modeldiff-threshold" in bad.stdout
    assert "demo-q8_0.gguf (llamacpp, Q8_0, class q8) vs hf: FAILED kld" in bad.stdout
    assert "demo-q8_0 FAILED (llamacpp, Q8_0, class q8): kld" in bad.stdout
    assert bad.stdout.splitlines()[-1] == "modeldiff: FAILED: 1 of 1 candidates failed gate broken: demo-q8_0 (kld)"


def test_cli_help_names_one_program_and_documents_exit_codes():
    from pytest_modeldiff.__main__ import PROG

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'\n{PROG} = "pytest_modeldiff.__main__:main"' in pyproject
    result = run("--help")
    assert result.returncode == 0 and result.stdout.startswith(f"usage: {PROG} [-h] [-v]")
    text = " ".join(result.stdout.split())
    assert "exit status: 0 every candidate passed every selected check; 1 a check failed; 2 bad options" in text
    assert "broken: fail conversions that are wrong" in text and "quality: fail conversions worse than" in text
    assert "--modeldiff-gate {broken,quality}" in text and "--modeldiff-report {short,full}" in text


def test_cli_bad_input_exits_2_with_one_line(demo_ref, tmp_path):
    result = run("--ref-model", demo_ref, "--cand-model", tmp_path / "missing.gguf")
    assert result.returncode == 2
    assert result.stderr.strip() == f"modeldiff: error: {tmp_path / 'missing.gguf'}: no such file or directory"


def test_cli_validates_settings(demo_ref, demo_cand):
    result = run("--ref-model", demo_ref, "--cand-model", demo_cand, "--eval-length", "0")
    # parsed at option time, by the same table as the plugin's options
    assert result.returncode == 2 and result.stderr.strip().endswith(
        "error: argument --eval-length: must be an integer >= 2, got '0'")


def test_cli_takes_the_llama_cpp_variables_and_writes_csv(demo_ref, demo_cand, tmp_path):
    env = {**os.environ, "MODEL_PATH": str(demo_ref), "CONVERTED_MODEL": str(demo_cand)}
    result = subprocess.run([sys.executable, "-m", "pytest_modeldiff", "--modeldiff-checks", "kld,topk_acc_drop",
                             "--modeldiff-topk-max", "2", "--modeldiff-csv", str(tmp_path / "r.csv")],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert "modeldiff: PASSED: the candidate passed gate broken" in result.stdout
    assert f"modeldiff: CSV report written to {tmp_path / 'r.csv'}" in result.stdout
    metrics = [line.split(",")[3] for line in (tmp_path / "r.csv").read_text().splitlines()[1:]]
    assert metrics == ["kld", "topk_acc_drop", "perplexity", "top1_accuracy", "top2_accuracy", "top1_agreement",
                       "top2_agreement", "prob_mse"]
