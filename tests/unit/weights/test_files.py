"""Weight readers: every format gives the same names, shapes, types and row slices; bad files
give one clear error naming the file."""
import json

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from pytest_modeldiff.errors import ModelDiffError
from pytest_modeldiff.weights.files import open_weights

RNG = np.random.default_rng(0)
TENSORS = {"model.embed_tokens.weight": RNG.normal(size=(40, 8)).astype(np.float32),
           "model.layers.0.mlp.up_proj.weight": RNG.normal(size=(16, 8)).astype(np.float32),
           "model.norm.weight": RNG.normal(size=(8,)).astype(np.float32)}


def assert_reads_tensors(reader, expected=TENSORS, type_name="F32"):
    assert list(reader.tensors) == list(expected)
    for name, array in expected.items():
        meta = reader.tensors[name]
        assert (meta.shape, meta.type_name) == (array.shape, type_name)
        np.testing.assert_array_equal(reader.read(name), array)
        np.testing.assert_array_equal(reader.read(name, 2, 5), array[2:5])


def test_safetensors_single_and_sharded(tmp_path):
    save_file(TENSORS, tmp_path / "model.safetensors")
    assert_reads_tensors(open_weights(tmp_path / "model.safetensors"))
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    names = list(TENSORS)
    save_file({n: TENSORS[n] for n in names[:2]}, sharded / "model-00001-of-00002.safetensors")
    save_file({n: TENSORS[n] for n in names[2:]}, sharded / "model-00002-of-00002.safetensors")
    index = {n: f"model-0000{1 if i < 2 else 2}-of-00002.safetensors" for i, n in enumerate(names)}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    reader = open_weights(sharded)
    assert_reads_tensors(reader)
    assert len(reader.files) == 2


def test_bfloat16_safetensors_go_through_torch(tmp_path):
    from safetensors.torch import save_file as save_torch

    t = torch.from_numpy(TENSORS["model.layers.0.mlp.up_proj.weight"]).bfloat16()
    save_torch({"w": t}, tmp_path / "m.safetensors")
    reader = open_weights(tmp_path / "m.safetensors")
    assert reader.tensors["w"].type_name == "BF16"
    np.testing.assert_array_equal(reader.read("w"), t.float().numpy())


def test_torch_checkpoints(tmp_path):
    state = {k: torch.from_numpy(v) for k, v in TENSORS.items()}
    torch.save(state, tmp_path / "model.pt")
    assert_reads_tensors(open_weights(tmp_path / "model.pt"))
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "ckpt.pth")  # a training checkpoint
    assert_reads_tensors(open_weights(tmp_path / "ckpt.pth"))
    folder = tmp_path / "hf"
    folder.mkdir()
    torch.save(state, folder / "pytorch_model.bin")
    assert_reads_tensors(open_weights(folder))


def test_numpy_files(tmp_path):
    np.savez(tmp_path / "w.npz", **TENSORS)
    assert_reads_tensors(open_weights(tmp_path / "w.npz"))
    np.save(tmp_path / "emb.npy", TENSORS["model.embed_tokens.weight"])
    assert_reads_tensors(open_weights(tmp_path / "emb.npy"), {"emb": TENSORS["model.embed_tokens.weight"]})


def test_gguf_rows_match_gguf_py(tiny):
    path = tiny / "tiny-q4_k_m.gguf"
    reader = open_weights(path)
    for tensor in gguf.GGUFReader(path).tensors[:8]:
        whole = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        meta = reader.tensors[tensor.name]
        assert meta.type_name == tensor.tensor_type.name and meta.shape == whole.shape
        np.testing.assert_array_equal(reader.read(tensor.name), whole)
        np.testing.assert_array_equal(reader.read(tensor.name, 1, 3), whole[1:3])


def test_tied_output_heads_are_aliases(demo_ref, demo_cand):
    assert open_weights(demo_ref).aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    gguf_reader = open_weights(demo_cand)
    assert gguf_reader.aliases == {"output.weight": "token_embd.weight"}
    np.testing.assert_array_equal(gguf_reader.read("output.weight", 0, 4), gguf_reader.read("token_embd.weight", 0, 4))


def test_bad_files_name_the_file_and_the_problem(tmp_path):
    cases = {}
    (tmp_path / "cut.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":")
    cases["cut.safetensors"] = "not a readable safetensors file"
    (tmp_path / "legacy.pt").write_bytes(b"\x80\x02}q\x00.")
    cases["legacy.pt"] = "not a torch zip checkpoint"
    torch.save({"w": torch.ones(2), "obj": np.dtype("float32")}, tmp_path / "pickled.pt")
    cases["pickled.pt"] = "torch.load(weights_only=True) cannot read it"
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04garbage")
    cases["bad.npz"] = "not a readable .npz file"
    (tmp_path / "w.txt").write_text("x")
    cases["w.txt"] = "not a weight file this tool reads"
    empty = tmp_path / "empty"
    empty.mkdir()
    cases["empty"] = "no weights found"
    cases["missing.safetensors"] = "no such file or directory"
    for name, problem in cases.items():
        with pytest.raises(ModelDiffError) as err:
            open_weights(tmp_path / name)
        assert str(tmp_path / name) in str(err.value) and problem in str(err.value), name


def test_index_naming_absent_shards(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "gone.safetensors"}}))
    with pytest.raises(ModelDiffError, match="names shard files that do not exist: .*gone.safetensors"):
        open_weights(tmp_path)
