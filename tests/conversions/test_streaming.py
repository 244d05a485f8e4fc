"""Streaming (--modeldiff-stream-layers): the reference run one module at a time from its files
gives the in-memory reference's numbers (logits, hidden states, every check), from sharded
checkpoints and GGUFs; it resumes after Ctrl-C or a hard kill without redoing finished layers; bad
files and architectures it cannot reproduce are errors that name the file."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pytest_modeldiff.checks.run import run_checks
from pytest_modeldiff.checks.thresholds import Thresholds
from pytest_modeldiff.engine import diagnosis
from pytest_modeldiff.engine.modeldiff import ModelDiff
from pytest_modeldiff.engine.settings import Settings
from pytest_modeldiff.errors import ModelDiffError
from pytest_modeldiff.runners import streaming

IDS = [list(range(1, 60)), list(range(100, 180, 2))]


@pytest.fixture(scope="module")
def sharded_ref(tiny, tmp_path_factory):
    """The tiny reference saved as a sharded checkpoint (model.safetensors.index.json)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("sharded")
    AutoModelForCausalLM.from_pretrained(tiny / "hf").save_pretrained(out, max_shard_size="300KB")
    AutoTokenizer.from_pretrained(tiny / "hf").save_pretrained(out)
    assert (out / "model.safetensors.index.json").is_file() and len(list(out.glob("*.safetensors"))) > 2
    return out


def compared(ref, cand, tmp_path, **settings):
    """(reference store, comparison, check results) of one candidate; the engine stays open."""
    messages = []
    md = ModelDiff(ref, [cand], Settings(checkpoint_dir=tmp_path / "ckpt", **settings), progress=messages.append)
    cmp = md.compare(next(iter(md.candidates)))
    results = {r.name: r for r in run_checks(cmp, Thresholds().resolve(cmp.quant_class))}
    return md, cmp, results, messages


@pytest.mark.parametrize("cand", ["tiny-q4_k_m", "broken-layer-scaled-f16"])
def test_streamed_reference_gives_the_in_memory_numbers(tiny, sharded_ref, tmp_path, cand):
    md, cmp, results, _ = compared(sharded_ref, tiny / f"{cand}.gguf", tmp_path)
    smd, scmp, sresults, messages = compared(sharded_ref, tiny / f"{cand}.gguf", tmp_path, stream_layers=True)
    try:
        assert (md.reference.kind, smd.reference.kind) == ("hf", "streamed")
        ref, sref = md._reference(), smd._reference()
        for i in range(len(ref.positions)):  # float32 both ways: equal up to the head's summation order
            np.testing.assert_allclose(sref.rows(i), ref.rows(i), rtol=0, atol=1e-4)
            np.testing.assert_allclose(sref.hidden(i), ref.hidden(i), rtol=0, atol=1e-5)
        assert scmp.layers.source == "streamed"
        assert {k: r.status for k, r in sresults.items()} == {k: r.status for k, r in results.items()}
        for name, r in results.items():
            if r.value is not None:
                assert sresults[name].value == pytest.approx(r.value, rel=1e-4, abs=1e-7), name
        np.testing.assert_allclose(scmp.layers.rfn, cmp.layers.rfn, rtol=1e-4, atol=1e-7)
        steps = [m.split(": ", 1)[1].split(" done")[0] for m in messages if " done (" in m and "streaming" in m]
        assert steps == ["embedding", "layer 0", "layer 1", "layer 2", "layer 3", "final norm"]
        assert not list((tmp_path / "ckpt").glob("*")), "a finished run leaves no checkpoint"
    finally:
        md.close()
        smd.close()


def test_streamed_isolated_pass_matches_gguf_torch(tiny, tmp_path):
    """The layers check's isolated error of a llama.cpp candidate, one layer at a time."""
    md, cmp, _, _ = compared(tiny / "hf", tiny / "broken-layer-scaled-f16.gguf", tmp_path, logits=False)
    try:
        store, sequences = md._reference(), cmp.eval.sequences
        in_memory = diagnosis.isolated_pass(store, tiny / "broken-layer-scaled-f16.gguf", sequences)
        streamed = streaming.isolated_pass(store, tiny / "broken-layer-scaled-f16.gguf", sequences)
        np.testing.assert_allclose(streamed, in_memory, rtol=1e-4, atol=1e-7)
    finally:
        md.close()


def test_a_gguf_reference_streams_like_gguf_torch(tiny, tmp_path):
    from pytest_modeldiff.runners.gguf_torch import GGUFTorchRunner

    model = streaming.StreamedModel(tiny / "tiny-q8_0.gguf")
    forwards = streaming.stream_forward(model, IDS, hidden=True, checkpoint_dir=tmp_path)
    runner = GGUFTorchRunner(tiny / "tiny-q8_0.gguf")
    runner.load(100)
    for ids, fwd in zip(IDS, forwards):
        expected = runner.forward(ids, hidden=True)
        np.testing.assert_allclose(fwd.logits, expected.logits, rtol=0, atol=1e-4)
        np.testing.assert_allclose(fwd.hidden, expected.hidden, rtol=0, atol=1e-5)


def test_resumes_after_ctrl_c_without_redoing_layers(tiny, tmp_path):
    model = streaming.StreamedModel(tiny / "hf")
    complete = streaming.stream_forward(model, IDS, hidden=True, checkpoint_dir=tmp_path / "a")

    def interrupt_after_layer_1(message):
        if "layer 1 done" in message:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        streaming.stream_forward(model, IDS, hidden=True, checkpoint_dir=tmp_path / "b", save_every_s=1e9,
                                 progress=interrupt_after_layer_1)
    assert len(list((tmp_path / "b").glob("*.npz"))) == 1 and not list((tmp_path / "b").glob("*.tmp"))
    messages = []
    resumed = streaming.stream_forward(model, IDS, hidden=True, checkpoint_dir=tmp_path / "b",
                                       progress=messages.append)
    assert messages[0].startswith("streaming hf: resuming after layer 1 (3/6 steps done")
    assert [m.split(": ")[1].split(" done")[0] for m in messages[1:5]] == ["layer 2", "layer 3", "final norm",
                                                                          "output head"]
    for a, b in zip(resumed, complete):
        np.testing.assert_array_equal(a.logits, b.logits)
        np.testing.assert_array_equal(a.hidden, b.hidden)


KILLED_RUN = """
import os, signal, sys
from pytest_modeldiff.runners import streaming

def kill_during_layer_2(message):
    if "layer 2 done" in message:
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no exception handlers

streaming.stream_forward(streaming.StreamedModel(sys.argv[1]), {ids}, hidden=True, checkpoint_dir=sys.argv[2],
                         save_every_s=0, progress=kill_during_layer_2)
"""


def test_resumes_after_being_killed(tiny, tmp_path):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(KILLED_RUN.format(ids=IDS)))
    proc = subprocess.run([sys.executable, str(script), str(tiny / "hf"), str(tmp_path / "ckpt")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    messages = []
    model = streaming.StreamedModel(tiny / "hf")
    resumed = streaming.stream_forward(model, IDS, hidden=True, checkpoint_dir=tmp_path / "ckpt",
                                       progress=messages.append)
    assert "resuming after layer 1 (3/6 steps done" in messages[0]  # saved after every step; killed in step 4
    complete = streaming.stream_forward(model, IDS, hidden=True, checkpoint_dir=tmp_path / "fresh")
    for a, b in zip(resumed, complete):
        np.testing.assert_array_equal(a.logits, b.logits)


def test_a_corrupt_checkpoint_is_discarded(tiny, tmp_path):
    model = streaming.StreamedModel(tiny / "hf")
    (tmp_path / f"{streaming.checkpoint_key(model, IDS, False)}.npz").write_bytes(b"not a checkpoint")
    messages = []
    forwards = streaming.stream_forward(model, IDS, checkpoint_dir=tmp_path, progress=messages.append)
    assert not any("resuming" in m for m in messages) and forwards[0].logits.shape == (59, 49152)


def test_a_missing_shard_names_the_file(sharded_ref, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in sharded_ref.iterdir():
        (broken / f.name).symlink_to(f)
    missing = sorted(broken.glob("*.safetensors"))[1]
    missing.unlink()
    with pytest.raises(ModelDiffError, match=f"names shard files that do not exist: {missing}"):
        streaming.StreamedModel(broken)


def test_a_truncated_shard_names_the_file(sharded_ref, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    shards = sorted(sharded_ref.glob("*.safetensors"))
    for f in sharded_ref.iterdir():
        if f != shards[0]:
            (broken / f.name).symlink_to(f)
    (broken / shards[0].name).write_bytes(shards[0].read_bytes()[: shards[0].stat().st_size // 2])
    with pytest.raises(ModelDiffError, match=f"{broken / shards[0].name}: not a readable safetensors file"):
        streaming.StreamedModel(broken)


@pytest.mark.parametrize("config, why", [
    ({"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "head_dim": 16,
      "final_logit_softcapping": 30.0}, "'gemma2' is not verified"),
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "logit_scale": 0.5}, "logit_scale=0.5"),
])
def test_architectures_it_cannot_reproduce_are_refused(tmp_path, config, why):
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 100, **config}))
    with pytest.raises(ModelDiffError, match=f"{tmp_path}: streaming .*{why}"):
        streaming.StreamedModel(tmp_path)


def test_a_sequence_longer_than_the_sliding_window_is_refused(tiny, tmp_path):
    model = streaming.StreamedModel(tiny / "hf")
    model.config.sliding_window = 32
    with pytest.raises(ModelDiffError, match="59-token sequence exceeds the 32-token sliding window"):
        streaming.stream_forward(model, IDS, checkpoint_dir=tmp_path)
