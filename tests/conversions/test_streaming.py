"""Layer streaming: same numbers as the in-memory comparison, sharded checkpoints, and resuming
after Ctrl-C or a hard kill without redoing finished layers."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pytest_modeldiff.engine import streaming
from pytest_modeldiff.engine.modeldiff import ModelDiff
from pytest_modeldiff.engine.settings import Settings

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


def layer_stats(ref, cand, tmp_path, **settings):
    md = ModelDiff(ref, [cand], Settings(checkpoint_dir=tmp_path / "ckpt", **settings))
    try:
        cmp = md.compare(next(iter(md.candidates)))
        assert cmp.layers_error is None, cmp.layers_error
        return cmp.layers
    finally:
        md.close()


@pytest.mark.parametrize("cand, keep", [("tiny-q4_k_m", 0), ("broken-layer-scaled-f16", 0), ("tiny-q8_0", 2)])
def test_streaming_matches_in_memory(tiny, sharded_ref, tmp_path, cand, keep):
    in_memory = layer_stats(sharded_ref, tiny / f"{cand}.gguf", tmp_path, cand_runner="gguf-torch", keep_layers=keep)
    streamed = layer_stats(sharded_ref, tiny / f"{cand}.gguf", tmp_path, stream_layers=True, logits=False,
                           keep_layers=keep)
    assert (in_memory.source, streamed.source) == ("in-memory", "streamed")
    np.testing.assert_allclose(streamed.rfn, in_memory.rfn, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(streamed.isolated_rfn, in_memory.isolated_rfn, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(streamed.cos_err, in_memory.cos_err, rtol=1e-4, atol=1e-12)
    assert streamed.kept == keep and not list((tmp_path / "ckpt").glob("*")), "a finished run leaves no checkpoint"


def test_resumes_after_ctrl_c_without_redoing_layers(tiny, tmp_path):
    ref, cand = tiny / "hf", tiny / "broken-layer-scaled-f16.gguf"
    complete = streaming.stream_layers(ref, cand, IDS, checkpoint_dir=tmp_path / "a")

    def interrupt_after_layer_1(message):
        if "layer 1 done" in message:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        streaming.stream_layers(ref, cand, IDS, checkpoint_dir=tmp_path / "b", save_every_s=1e9,
                                progress=interrupt_after_layer_1)
    assert len(list((tmp_path / "b").glob("*.npz"))) == 1 and not list((tmp_path / "b").glob("*.tmp"))
    messages = []
    resumed = streaming.stream_layers(ref, cand, IDS, checkpoint_dir=tmp_path / "b", progress=messages.append)
    assert messages[0].startswith("streaming broken-layer-scaled-f16.gguf: resuming after layer 1 (3/6 steps done")
    assert [m.split(": ")[1].split(" done")[0] for m in messages[1:]] == ["layer 2", "layer 3", "final norm"]
    np.testing.assert_array_equal(resumed.rfn, complete.rfn)
    np.testing.assert_array_equal(resumed.isolated_rfn, complete.isolated_rfn)


KILLED_RUN = """
import os, signal, sys
from pytest_modeldiff.engine import streaming

def kill_during_layer_2(message):
    if "layer 2 done" in message:
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no exception handlers

streaming.stream_layers(sys.argv[1], sys.argv[2], {ids}, checkpoint_dir=sys.argv[3], save_every_s=0,
                        progress=kill_during_layer_2)
"""


def test_resumes_after_being_killed(tiny, tmp_path):
    ref, cand = tiny / "hf", tiny / "tiny-q4_k_m.gguf"
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(KILLED_RUN.format(ids=IDS)))
    proc = subprocess.run([sys.executable, str(script), str(ref), str(cand), str(tmp_path / "ckpt")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    messages = []
    resumed = streaming.stream_layers(ref, cand, IDS, checkpoint_dir=tmp_path / "ckpt", progress=messages.append)
    assert "resuming after layer 1 (3/6 steps done" in messages[0]  # saved after every step; killed in step 4
    complete = streaming.stream_layers(ref, cand, IDS, checkpoint_dir=tmp_path / "fresh")
    np.testing.assert_array_equal(resumed.rfn, complete.rfn)


def test_a_corrupt_checkpoint_is_discarded(tiny, tmp_path):
    ref, cand = tiny / "hf", tiny / "tiny-q8_0.gguf"
    key = streaming.checkpoint_key(streaming.StreamedModel(ref), streaming.StreamedModel(cand), IDS, 0)
    (tmp_path / f"{key}.npz").write_bytes(b"not a checkpoint")
    messages = []
    stats = streaming.stream_layers(ref, cand, IDS, checkpoint_dir=tmp_path, progress=messages.append)
    assert not any("resuming" in m for m in messages) and stats.rfn.shape == (2, 6)
