"""`python -m pytest_modeldiff`: the engine without pytest, same tables, exit codes 0/1/2."""
import json
import os
import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "pytest_modeldiff", *map(str, args)], capture_output=True, text=True)


def test_cli_passes_and_fails_with_exit_codes(demo_ref, demo_cand, tmp_path):
    ok = run("--ref-model", demo_ref, "--cand-model", demo_cand, "--modeldiff-checks", "tokens,kld",
             "--modeldiff-json", tmp_path / "r.json")
    assert ok.returncode == 0, ok.stderr
    assert "demo-q8_0.gguf (llamacpp, Q8_0, class q8) vs hf: all checks passed" in ok.stdout
    assert [c["name"]
            for c in json.loads((tmp_path / "r.json").read_text())["candidates"][0]["checks"]] == ["tokens", "kld"]
    bad = run("--ref-model", demo_ref, "--cand-model", demo_cand, "--modeldiff-checks", "kld",
              "--modeldiff-threshold", "kld=1e-12")
    assert (bad.returncode == 1 and "modeldiff kld FAILED" in bad.stdout
            and "threshold 1e-12 from --modeldiff-threshold" in bad.stdout)


def test_cli_bad_input_exits_2_with_one_line(demo_ref, tmp_path):
    result = run("--ref-model", demo_ref, "--cand-model", tmp_path / "missing.gguf")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path / 'missing.gguf'}: no such file or directory"


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
    assert "demo-q8_0.gguf (llamacpp, Q8_0, class q8) vs hf: all checks passed" in result.stdout
    metrics = [line.split(",")[3] for line in (tmp_path / "r.csv").read_text().splitlines()[1:]]
    assert metrics == ["kld", "topk_acc_drop", "perplexity", "top1_accuracy", "top2_accuracy", "top1_agreement",
                       "top2_agreement", "prob_mse"]
