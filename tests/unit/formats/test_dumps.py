"""llama.cpp-compatible dumps: llama.cpp's own scripts read ours unchanged, and the dump runner
reads both theirs and ours back."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import transformers

from pytest_modeldiff import compare
from pytest_modeldiff.checks.results import FAILED, PASSED, SKIPPED
from pytest_modeldiff.checks.run import run_checks
from pytest_modeldiff.checks.thresholds import Thresholds
from pytest_modeldiff.engine.modeldiff import ModelDiff
from pytest_modeldiff.engine.settings import Settings
from pytest_modeldiff.errors import ModelDiffError
from pytest_modeldiff.formats import dumps
from pytest_modeldiff.runners.dump import DumpRunner


@pytest.fixture(scope="module")
def dumped(tmp_path_factory, demo_ref, demo_cand):
    data = tmp_path_factory.mktemp("run") / "data"
    md = ModelDiff(demo_ref, [demo_cand], Settings(dump_dir=data))
    md.compare("demo-q8_0")
    md.close()
    return data


def test_llama_cpp_compare_scripts_accept_our_dumps(dumped, demo_ref, demo_cand):
    from fixtures import build

    scripts = build.llama_cpp_scripts()
    env = {**os.environ, "MODEL_PATH": str(demo_ref), "CONVERTED_MODEL": str(demo_cand)}
    cwd = dumped.parent  # the scripts read ./data/
    compare = subprocess.run([sys.executable, str(scripts / "causal" / "compare-logits.py")],
                             cwd=cwd, env=env, capture_output=True, text=True)
    assert compare.returncode == 0, compare.stdout + compare.stderr
    assert "All 5 tokens match" in compare.stdout and "OK: Lightweight model check successful" in compare.stdout
    nmse = subprocess.run([sys.executable, str(scripts / "utils" / "check-nmse.py"), "-m", str(demo_ref)],
                          cwd=cwd, env=env, capture_output=True, text=True)
    assert nmse.returncode == 0, nmse.stdout + nmse.stderr
    assert "RESULT: PASS" in nmse.stdout


def test_dump_files_and_formats(dumped):
    row = np.fromfile(dumped / "pytorch-hf.bin", dtype=np.float32)
    assert row.shape == (49152,)
    first_txt = (dumped / "pytorch-hf.txt").read_text().splitlines()[0]
    assert first_txt == f"0: {row[0]:.6f}"
    prompt = (dumped / "pytorch-hf-prompt.txt").read_text()
    assert prompt.startswith("prompt: Hello, my name is\nn_tokens: 5\ntoken ids: ")
    logits, seqs, texts, n_vocab = dumps.read_dump(dumped / "llamacpp-demo-q8_0-all.bin")
    assert n_vocab == 49152 and len(seqs) == 7 and logits.shape == (sum(map(len, seqs)), 49152)
    assert texts[0] == "Hello, my name is"
    meta = json.loads((dumped / "pytorch-hf-all.json").read_text())
    assert set(meta) >= {"n_vocab", "sequence_lengths", "model_files_sha256", "versions", "settings"}


@pytest.mark.parametrize("cand", ["llamacpp-demo-q8_0.bin", "llamacpp-demo-q8_0-all.bin"])
def test_dumps_as_candidates_against_the_live_reference(dumped, demo_ref, cand):
    md = ModelDiff(demo_ref, [dumped / cand])
    try:
        cmp = md.compare(cand[:-4])
        assert cmp.quant_type == "Q8_0"
        results = {r.name: r for r in run_checks(cmp, Thresholds().resolve(cmp.quant_class))}
        assert results["kld"].status == PASSED and results["tokens"].status == PASSED
        assert results["vocab"].status == SKIPPED and "carries no vocabulary" in results["vocab"].reason
        if cand.endswith("-all.bin"):  # ours: every position of the 7 built-in prompts
            assert len(cmp.eval.sequences) == 7 and len(cmp.stats) == sum(len(s.ids) for s in cmp.eval.sequences)
        else:  # llama.cpp's: one prompt, last position only
            assert len(cmp.eval.sequences) == 1 and len(cmp.stats) == 1
    finally:
        md.close()


def test_two_llama_cpp_dumps_compare_without_any_model(dumped):
    md = ModelDiff(dumped / "pytorch-hf.bin", [dumped / "llamacpp-demo-q8_0.bin"])
    cmp = md.compare("llamacpp-demo-q8_0")
    results = {r.name: r.status for r in run_checks(cmp, Thresholds().resolve(cmp.quant_class))}
    assert results["tokens"] == PASSED and results["nmse"] == PASSED and len(cmp.stats) == 1


def test_bad_dumps_name_the_file_and_the_problem(tmp_path, dumped):
    bad = tmp_path / "x.bin"
    bad.write_bytes(b"\0" * 10)
    (tmp_path / "x-tokens.bin").write_bytes(b"\0" * 8)
    with pytest.raises(ModelDiffError, match=r"x.bin: 10 bytes is not a whole number of 4-byte values"):
        dumps.read_dump(bad)
    (tmp_path / "y.bin").write_bytes(b"\0" * 8)
    with pytest.raises(ModelDiffError, match=r"y-tokens.bin: dump file missing"):
        dumps.read_dump(tmp_path / "y.bin")
    # an all-positions dump cut short no longer matches its json
    for suffix in ("-all-tokens.bin", "-all.json"):
        (tmp_path / f"z{suffix}").write_bytes((dumped / f"pytorch-hf{suffix}").read_bytes())
    (tmp_path / "z-all.bin").write_bytes((dumped / "pytorch-hf-all.bin").read_bytes()[:-4 * 49152])
    with pytest.raises(ModelDiffError, match=r"z-all.bin: \d+ floats is not \d+ positions x 49152 vocabulary"):
        dumps.read_dump(tmp_path / "z-all.bin")


def test_assertions_skip_what_a_dump_cannot_answer_and_fail_with_the_table(dumped, demo_ref):
    import unittest

    from pytest_modeldiff.assertions import ModelDiffAssertions

    md = ModelDiff(demo_ref, [dumped / "llamacpp-demo-q8_0-all.bin"])
    try:
        cmp = md.compare("llamacpp-demo-q8_0-all")
        helpers = ModelDiffAssertions(cmp, Thresholds().resolve(cmp.quant_class))
        with pytest.raises(unittest.SkipTest, match="modeldiff vocab: .* carries no vocabulary"):
            helpers.assert_vocab_equal()
        helpers.assert_kld()
        with pytest.raises(AssertionError, match=r"(?s)kld mean, all \d+ positions.*threshold 1e-12 from argument"):
            helpers.assert_kld(max=1e-12)
        with pytest.raises(AssertionError, match=r"top-3 overlap"):
            helpers.assert_topk_overlap(k=3, min=1.0)
        with pytest.raises(ValueError, match="k must be between 1 and 20"):
            helpers.assert_topk_overlap(k=50)
        helpers.assert_topk_agreement(k=1, min=0.9)
        with pytest.raises(AssertionError, match=r"top-5 ordered agreement"):
            helpers.assert_topk_agreement(k=5, min=1.0)
    finally:
        md.close()


@pytest.fixture(scope="module")
def llama_cpp_data(tmp_path_factory, dumped, demo_ref):
    """data/ as llama.cpp's model-conversion workflow leaves it: pytorch-hf.* written by its own
    run-org-model.py, and the candidate's last-position llamacpp-* files (llama-debug
    --save-logits is not built here; ours have its format, which compare-logits.py accepts above)."""
    from fixtures import build

    cwd = tmp_path_factory.mktemp("llama-cpp-workflow")
    env = {**os.environ, "MODEL_PATH": str(demo_ref), "HF_HUB_OFFLINE": "1"}
    org = subprocess.run([sys.executable, str(build.llama_cpp_scripts() / "causal" / "run-org-model.py"),
                          "--device", "cpu"],
                         cwd=cwd, env=env, capture_output=True, text=True)
    assert org.returncode == 0, org.stdout + org.stderr
    for f in dumped.glob("llamacpp-demo-q8_0*"):
        if "-all" not in f.name:
            shutil.copy(f, cwd / "data")
    return cwd / "data"


def test_a_llama_cpp_data_folder_is_both_reference_and_candidate(llama_cpp_data):
    assert sorted(p.name for p in llama_cpp_data.glob("*-tokens.bin")) == ["llamacpp-demo-q8_0-tokens.bin",
                                                                           "pytorch-hf-tokens.bin"]
    report = compare(llama_cpp_data, llama_cpp_data)
    cand = report["llamacpp-demo-q8_0"]
    assert cand.comparison.reference.path == llama_cpp_data / "pytorch-hf.bin"
    assert cand.comparison.candidate.path == llama_cpp_data / "llamacpp-demo-q8_0.bin"
    statuses = {r.name: r.status for r in cand.results}
    assert statuses["tokens"] == statuses["kld"] == statuses["nmse"] == PASSED
    assert statuses["topk_acc_drop"] == SKIPPED, "one last-position row per dump: no next tokens"


def test_a_folder_with_several_models_needs_the_llama_cpp_variables(llama_cpp_data, tmp_path, monkeypatch, demo_ref):
    folder = tmp_path / "data"
    shutil.copytree(llama_cpp_data, folder)
    for f in list(folder.glob("pytorch-hf*")):
        shutil.copy(f, folder / f.name.replace("pytorch-hf", "pytorch-other"))
    monkeypatch.delenv("MODEL_PATH", raising=False)
    with pytest.raises(ModelDiffError, match=r"pytorch dumps of several models \(hf, other\); pass the .bin file"):
        ModelDiff(folder, [folder])
    monkeypatch.setenv("MODEL_PATH", str(demo_ref))  # .../hf: llama.cpp's model name "hf"
    assert ModelDiff(folder, [folder]).reference.path == folder / "pytorch-hf.bin"
    only_reference = tmp_path / "ref-only"
    only_reference.mkdir()
    for f in folder.glob("pytorch-hf*"):
        shutil.copy(f, only_reference)
    with pytest.raises(ModelDiffError, match=r"ref-only: no llamacpp-<model>.bin logits dump with its -tokens.bin"):
        ModelDiff(only_reference, [only_reference])


def test_a_token_mismatch_names_a_newer_transformers_from_the_reference_config(llama_cpp_data, tmp_path, demo_ref,
                                                                               monkeypatch):
    newer = tmp_path / "hf"
    shutil.copytree(demo_ref, newer)
    config = json.loads((newer / "config.json").read_text())
    (newer / "config.json").write_text(json.dumps({**config, "transformers_version": "99.1.0"}))
    row = np.fromfile(llama_cpp_data / "llamacpp-demo-q8_0.bin", dtype=np.float32)
    ids = np.fromfile(llama_cpp_data / "llamacpp-demo-q8_0-tokens.bin", dtype=np.int32).tolist()
    cand = dumps.write_last_position(tmp_path / "other", "llamacpp", "retokenized", row, ids[1:], "Hello, my name is")

    for reference in (newer, llama_cpp_data / "pytorch-hf.bin"):  # a HF folder; a dump with MODEL_PATH set
        monkeypatch.setenv("MODEL_PATH", str(newer))
        tokens = compare(reference, cand, checks=["tokens"])["llamacpp-retokenized"].result("tokens")
        assert tokens.status == FAILED
        assert tokens.hint.startswith("the reference's config.json was written by transformers 99.1.0, newer than "
                                      f"the installed {transformers.__version__}: install that version "
                                      "(pip install transformers==99.1.0)")
    same = tmp_path / "same"  # written by the installed version: no such hint
    shutil.copytree(demo_ref, same)
    (same / "config.json").write_text(json.dumps({**config, "transformers_version": transformers.__version__}))
    monkeypatch.setenv("MODEL_PATH", str(same))
    tokens = compare(llama_cpp_data / "pytorch-hf.bin", cand,
                     checks=["tokens"])["llamacpp-retokenized"].result("tokens")
    assert tokens.status == FAILED and "transformers" not in tokens.hint


def small_dump(folder, name="m-q8_0", quant_type="Q8_0"):
    """An all-positions dump of two sequences over an 8-token vocabulary, no model needed."""
    rng = np.random.default_rng(0)
    writer = dumps.AllPositionsWriter(folder, "llamacpp", name)
    writer.add(rng.normal(size=(3, 8)), [1, 2, 3], "abc")
    writer.add(rng.normal(size=(2, 8)), [4, 5], None)
    return writer.finish(8, {"quant_type": quant_type})


def test_the_streaming_writer_publishes_whole_dumps_only(tmp_path):
    path = small_dump(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    writer = dumps.AllPositionsWriter(tmp_path, "llamacpp", "m-q8_0")
    writer.add(np.zeros((4, 8)), [0, 0, 0, 0], "other")
    writer.abort()  # an error or Ctrl-C mid-run: the old dump stays whole
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    logits, seqs, texts, n_vocab = dumps.read_dump(path)
    assert logits.shape == (5, 8) and seqs == [[1, 2, 3], [4, 5]] and texts == ["abc", None] and n_vocab == 8


def description(folder, **fields):
    path = small_dump(folder)
    meta_path = dumps.companion(path, ".json")
    meta = json.loads(meta_path.read_text())
    meta.update(fields)
    meta_path.write_text(json.dumps(meta))
    return path


@pytest.mark.parametrize("fields, problem", [
    ({"n_vocab": "8"}, "n_vocab is '8', expected a positive integer"),
    ({"n_vocab": 0}, "n_vocab is 0, expected a positive integer"),
    ({"n_vocab": True}, "n_vocab is True, expected a positive integer"),
    ({"sequence_lengths": [3, 2.0]}, r"sequence_lengths is \[3, 2.0\], expected a non-empty list of pos"),
    ({"sequence_lengths": {"a": 1}}, "sequence_lengths is {'a': 1}, expected a non-empty list"),
    ({"texts": ["abc"]}, r"texts is \['abc'\], expected null or a list of 2 strings or nulls, one per seq"),
    ({"texts": ["abc", 5]}, "texts is .*, expected null or a list of 2 strings"),
    ({"quant_type": ["Q8_0"]}, r"quant_type is \['Q8_0'\], expected a string"),
    ({"format": "other"}, "format is 'other', expected 'pytest-modeldiff all-positions dump v1'"),
    ({"n_vocab": json.loads("[" * 900 + "]" * 900)}, r"n_vocab is \[\[\[...\]\]\], expected a positive int"),
])
def test_a_bad_dump_description_names_the_file_field_and_expectation(tmp_path, fields, problem):
    path = description(tmp_path, **fields)
    with pytest.raises(ModelDiffError, match=f"^{dumps.companion(path, '.json')}: {problem}"):
        dumps.read_dump(path)
    with pytest.raises(ModelDiffError, match=f"^{dumps.companion(path, '.json')}: "):
        DumpRunner(path)


@pytest.mark.parametrize("content, problem", [
    (b"[" * 100_000 + b"]" * 100_000, "RecursionError"), (b"\xff{}", "UnicodeDecodeError"),
    (b"{", "JSONDecodeError"), (b"[1, 2]", "the content is \\[1, 2\\], expected a JSON object"),
])
def test_an_unreadable_dump_description_is_a_named_error(tmp_path, content, problem):
    path = small_dump(tmp_path)
    dumps.companion(path, ".json").write_bytes(content)
    with pytest.raises(ModelDiffError, match=f"^{dumps.companion(path, '.json')}: .*{problem}"):
        dumps.read_dump(path)


def test_dump_inputs_that_would_mislead_are_named_errors(tmp_path):
    path = small_dump(tmp_path)
    dumps.companion(path, ".json").unlink()  # a run killed between publishing the arrays and their json
    with pytest.raises(ModelDiffError, match=f"^{path}: all-positions dump without its {path.stem}.json"):
        dumps.read_dump(path)
    last = dumps.write_last_position(tmp_path, "pytorch", "m", np.zeros(8), [1, 2, 9], "a prompt")
    with pytest.raises(ModelDiffError, match=r"pytorch-m-tokens.bin: token id 9 outside the vocabulary "
                                             r"of the logits \(expected 0 <= id < 8\)"):
        dumps.read_dump(last)
    dumps.write_last_position(tmp_path, "pytorch", "m", np.zeros(8), [1, 2, 3], "a prompt")
    assert dumps.read_dump(last)[2] == ["a prompt"]
    dumps.companion(last, "-prompt.txt").write_bytes(b"prompt: caf\xe9\nn_tokens: 3\n")  # Latin-1, not UTF-8
    with pytest.raises(ModelDiffError, match=r"pytorch-m-prompt.txt: not UTF-8 text \(byte 11: invalid "
                                             r"continuation byte\); expected 'prompt: TEXT' as llama.cpp"):
        dumps.read_dump(last)
