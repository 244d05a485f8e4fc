"""Our GGUF header walk agrees with gguf-py's GGUFReader on every file type the fixtures hold."""
import gguf
import pytest

from pytest_modeldiff.errors import ModelDiffError
from pytest_modeldiff.gguf_file import GGUFFile


def test_header_walk_matches_gguf_reader(tiny, demo_cand):
    types = [tiny / f"tiny-{q}.gguf" for q in ("f32", "f16", "bf16", "q8_0", "q4_k_m")]
    for path in [demo_cand, *types, tiny / "broken-add-bos-flipped-f16.gguf"]:
        ours, reader = GGUFFile(path), gguf.GGUFReader(path)
        expected = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
        assert ours.metadata == pytest.approx(expected), path.name
        assert [(t.name, t.type_name, t.n_elements, t.n_bytes, t.offset) for t in ours.tensors] == [
            (t.name, t.tensor_type.name, int(t.n_elements), int(t.n_bytes), int(t.data_offset)) for t in reader.tensors]


def test_quant_type_names(tiny):
    assert GGUFFile(tiny / "tiny-q4_k_m.gguf").quant_type == "Q4_K_M"
    assert GGUFFile(tiny / "tiny-f32.gguf").quant_type == "F32"
    assert GGUFFile(tiny / "tiny-bf16.gguf").quant_type == "BF16"


@pytest.mark.parametrize("cut", [10, 30, 5000, 2_000_000])
def test_truncated_anywhere_is_named(demo_cand, tmp_path, cut):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(demo_cand.read_bytes()[:cut])
    with pytest.raises(ModelDiffError, match=r"cut.gguf: truncated (or corrupt )?GGUF.*the file has \d+ bytes"):
        GGUFFile(bad)
