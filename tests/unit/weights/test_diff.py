"""Weight diff: pairing across formats, statuses, likely causes, patterns, the check's verdicts,
and reading checkpoints bigger than the memory the process may use."""
import subprocess
import sys
import textwrap

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file

from pytest_modeldiff.checks.results import FAILED, PASSED
from pytest_modeldiff.checks.thresholds import Thresholds
from pytest_modeldiff.checks.weights import check_weights
from pytest_modeldiff.engine.modeldiff import ModelDiff
from pytest_modeldiff.weights.diff import compare_weights

RNG = np.random.default_rng(0)


def diff_of(tmp_path, ref: dict, cand: dict):
    save_file(ref, tmp_path / "ref.safetensors")
    save_file(cand, tmp_path / "cand.safetensors")
    return {t.name: t for t in compare_weights(tmp_path / "ref.safetensors", tmp_path / "cand.safetensors").tensors}


def weights_result(ref, cand, thresholds=None):
    md = ModelDiff(ref, [cand])
    wc = md.weights(next(iter(md.candidates)))
    return check_weights(wc, Thresholds(given=thresholds).resolve(wc.quant_class))


# --------------------------------------------------------------------------- real conversions
def test_scaled_layer_found_at_its_tensors_with_its_factor(tiny):
    result = weights_result(tiny / "hf", tiny / "broken-layer-scaled-f16.gguf")
    assert result.status == FAILED
    tensors = {t["name"]: t for t in result.extra["weights"]["tensors"]}
    failing = {name for name, t in tensors.items() if not t["passed"]}
    assert failing == {f"blk.1.{n}.weight" for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                                     "ffn_up", "ffn_down")}
    for name in failing:
        # scaled by 1.03 in f32, then stored in f16
        assert tensors[name]["gain"] == pytest.approx(1.03, abs=5e-4) and tensors[name]["cause"] == "scaled by 1.03"
    assert any("blk.1.attn_q.weight [attention, layer 1]" in d and "scaled by 1.03" in d for d in result.details)
    assert result.extra["weights"]["patterns"][0].startswith("focused: layer(s) 1 ")


def test_unpermuted_qk_found(tiny):
    result = weights_result(tiny / "hf", tiny / "broken-qk-unpermuted-f16.gguf")
    tensors = {t["name"]: t for t in result.extra["weights"]["tensors"]}
    failing = {name for name, t in tensors.items() if not t["passed"]}
    assert failing == {f"blk.{i}.attn_{x}.weight" for i in range(4) for x in "qk"}
    assert all(tensors[n]["cause"].startswith("Q/K rows not permuted for rope") for n in failing)
    assert "convert_hf_to_gguf.py" in result.hint


@pytest.mark.parametrize("quant", ["f16", "q8_0", "q4_k_m", "bf16", "f32"])
def test_correct_conversions_pass_with_defaults(tiny, quant):
    result = weights_result(tiny / "hf", tiny / f"tiny-{quant}.gguf")
    assert result.status == PASSED, result.rows
    types = {t["cand_type"] for t in result.extra["weights"]["tensors"]}
    assert "F32" in types  # the norms: judged as exact, not by the file's quant type


def test_two_ggufs(tiny):
    assert weights_result(tiny / "tiny-f32.gguf", tiny / "tiny-q8_0.gguf").status == PASSED
    diff = compare_weights(tiny / "tiny-f16.gguf", tiny / "broken-qk-unpermuted-f16.gguf")
    assert diff.naming == "names as stored"
    assert {t.cause for t in diff.worst(8)} == {"Q/K rows not permuted for rope "
                                                "(llama.cpp's LlamaModel.permute was not applied)"}


def test_chunk_size_does_not_change_the_numbers(tiny):
    whole = compare_weights(tiny / "hf", tiny / "tiny-q8_0.gguf")
    chunked = compare_weights(tiny / "hf", tiny / "tiny-q8_0.gguf", chunk_elements=1000)  # Q/K: whole heads
    for a, b in zip(whole.tensors, chunked.tensors):
        assert a.name == b.name and a.metrics["rel"] == pytest.approx(b.metrics["rel"], rel=1e-9)


def test_a_user_threshold_replaces_the_type_limits(demo_ref, demo_cand):
    assert weights_result(demo_ref, demo_cand).status == PASSED
    strict = weights_result(demo_ref, demo_cand, {"weight_rel": 1e-4})
    assert strict.status == FAILED and strict.extra["limits_source"] == "compare(thresholds=...)"
    assert any("within Q8_0's usual error" in d and "over the threshold from compare(thresholds=...)" in d
               for d in strict.details)


# --------------------------------------------------------------------------- statuses
def test_missing_added_and_reshaped_tensors(tmp_path):
    a, b = RNG.normal(size=(6, 4)).astype(np.float32), RNG.normal(size=(6, 4)).astype(np.float32)
    d = diff_of(tmp_path, {"a": a, "b": b, "t": a, "r": a},
                {"a": a, "extra": b, "t": np.ascontiguousarray(a.T), "r": np.vstack([a, a[:2]])})
    assert (d["a"].status, d["b"].status, d["extra"].status) == ("unchanged", "removed", "added")
    assert d["b"].cause == "missing in the candidate" and d["extra"].cause == "not in the reference"
    assert d["t"].status == "shape-changed" and d["t"].cause == "transposed: (6, 4) -> (4, 6)"
    assert d["r"].cause.startswith("+2 rows (6 -> 8)")
    result = weights_result(tmp_path / "ref.safetensors", tmp_path / "cand.safetensors")
    rows = {r.metric: r for r in result.rows}
    assert (rows["tensors removed"].value, rows["tensors added"].value,
            rows["tensors shape-changed"].value) == ("1", "1", "2")
    assert any(d.startswith("b [other]: removed: missing in the candidate") for d in result.details)


def test_converter_buffers_and_unmapped_names_across_formats(tmp_path):
    emb = RNG.normal(size=(32, 8)).astype(np.float32)
    save_file({"model.embed_tokens.weight": emb, "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32),
               "model.layers.0.adapter.weight": emb[:4]}, tmp_path / "ref.safetensors")
    writer = gguf.GGUFWriter(tmp_path / "cand.gguf", arch="llama")
    writer.add_block_count(1)
    writer.add_head_count(2)
    writer.add_tensor("token_embd.weight", emb)
    writer.add_tensor("rope_freqs.weight", np.ones(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    diff = compare_weights(tmp_path / "ref.safetensors", tmp_path / "cand.gguf")
    d = {t.ref_name or t.name: t for t in diff.tensors}
    assert "gguf-py's tensor map (arch llama)" in diff.naming
    assert (d["model.embed_tokens.weight"].status == "unchanged"
            and d["model.embed_tokens.weight"].name == "token_embd.weight")
    assert d["model.layers.0.self_attn.rotary_emb.inv_freq"].expected  # dropped on purpose
    assert d["rope_freqs.weight"].expected and d["rope_freqs.weight"].status == "added"
    unmapped = d["model.layers.0.adapter.weight"]
    assert unmapped.status == "removed" and not unmapped.expected and "no GGUF name" in unmapped.note


def test_tied_heads_pair_with_the_embedding(tmp_path, demo_ref, demo_cand):
    diff = compare_weights(demo_ref, demo_cand)  # both tied: no output tensor on either side
    assert "output.weight" not in {t.name for t in diff.tensors} and not diff.by_status("removed")
    emb = RNG.normal(size=(10, 4)).astype(np.float32)
    d = diff_of(tmp_path, {"model.embed_tokens.weight": emb, "lm_head.weight": emb}, {"model.embed_tokens.weight": emb})
    assert d["lm_head.weight"].status == "removed"  # no config.json saying the candidate ties it
    folder = tmp_path / "tied"
    folder.mkdir()
    save_file({"model.embed_tokens.weight": emb}, folder / "model.safetensors")
    (folder / "config.json").write_text('{"tie_word_embeddings": true}')
    tied = {t.name: t for t in compare_weights(tmp_path / "ref.safetensors", folder).tensors}
    assert (tied["lm_head.weight"].status == "unchanged"
            and "ties it to model.embed_tokens.weight" in tied["lm_head.weight"].note)


# --------------------------------------------------------------------------- likely causes
def test_likely_causes(tmp_path):
    w = RNG.normal(size=(64, 32)).astype(np.float32)
    sq = RNG.normal(size=(32, 32)).astype(np.float32)
    norm = RNG.uniform(0.5, 1.5, size=64).astype(np.float32)
    few = w.copy()
    few[[3, 9]] += 1.0
    nan = w.copy()
    nan[0, :3] = np.nan
    bf16 = (w.view(np.uint32) + 0x8000 & 0xFFFF0000).view(np.float32)  # rounded to bfloat16, stored as F32
    cases = {
        "scaled": (w, w * 0.98, "scaled by 0.98"),
        "negated": (w, -w, "negated (sign flipped)"),
        "zeros": (w, np.zeros_like(w), "all zeros (the data was never written?)"),
        "nan": (w, nan, "3 NaN/Inf values"),
        "offset": (norm, norm + 1, "offset by +1 (e.g. a norm stored as 1 + w, Gemma's convention)"),
        "rows": (w, np.roll(w, 1, axis=0), "rows permuted (64 of 64 rows moved)"),
        "transposed": (sq, np.ascontiguousarray(sq.T), "transposed (a square matrix stored the other way round)"),
        "columns": (w, np.roll(w, 1, axis=1), "columns permuted"),
        "few": (np.tile(w, (4, 1)), np.tile(few, (4, 1)), "8 of 256 rows carry 90 % of the change"),
        "bf16": (w, bf16, "an error like BF16's rounding: the values went through BF16"),
    }
    d = diff_of(tmp_path, {k: v[0] for k, v in cases.items()}, {k: v[1] for k, v in cases.items()})
    for name, (_, _, cause) in cases.items():
        assert d[name].cause.startswith(cause), (name, d[name].cause)


# --------------------------------------------------------------------------- patterns
def model(scale_by_layer, attn=1.0, mlp=1.0, sparse=False):
    base, tuned = {}, {}
    for layer, scale in enumerate(scale_by_layer):
        for part, weight in (("self_attn.q_proj", attn), ("mlp.up_proj", mlp)):
            name = f"model.layers.{layer}.{part}.weight"
            base[name] = RNG.normal(size=(16, 16)).astype(np.float32)
            noise = RNG.normal(size=(16, 16)).astype(np.float32) * 0.01 * scale * weight
            if sparse:
                noise *= RNG.random((16, 16)) < 0.02
            tuned[name] = base[name] + noise.astype(np.float32)
    return base, tuned


@pytest.mark.parametrize("spec, pattern", [
    (dict(scale_by_layer=[1, 1, 1, 1, 1, 1]), "uniform"),
    (dict(scale_by_layer=[1, 2, 3, 4, 5, 6]), "gradient"),
    (dict(scale_by_layer=[6, 5, 4, 3, 2, 1]), "inverse gradient"),
    (dict(scale_by_layer=[1, 1, 10, 1, 1, 1, 1, 1]), "focused: layer(s) 2 "),
    (dict(scale_by_layer=[1, 1, 1, 1], sparse=True), "sparse"),
    (dict(scale_by_layer=[1, 1, 1, 1], attn=5), "attention-heavy"),
    (dict(scale_by_layer=[1, 1, 1, 1], mlp=5), "MLP-heavy"),
])
def test_change_patterns_between_a_fine_tune_and_its_base(tmp_path, spec, pattern):
    base, tuned = model(**spec)
    save_file(base, tmp_path / "base.safetensors")
    save_file(tuned, tmp_path / "tuned.safetensors")
    patterns = compare_weights(tmp_path / "base.safetensors", tmp_path / "tuned.safetensors").patterns()
    assert any(p.startswith(pattern) for p in patterns), patterns


def test_identical_checkpoints_are_all_frozen(tmp_path):
    base, _ = model([1, 1, 1])
    save_file(base, tmp_path / "a.safetensors")
    diff = compare_weights(tmp_path / "a.safetensors", tmp_path / "a.safetensors")
    assert diff.patterns() == ["identical: every compared tensor is bit-for-bit equal"]
    assert sorted(diff.frozen()) == sorted(base)


# --------------------------------------------------------------------------- memory
MEMORY_SCRIPT = textwrap.dedent("""
    import resource, sys
    from pytest_modeldiff.weights.diff import compare_weights

    def data_kb():  # the kernel's count for RLIMIT_DATA: private writable memory
        return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmData")))

    budget = int(sys.argv[3]) << 20
    limit = data_kb() * 1024 + budget
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    try:
        bytearray(2 * budget)  # the limit bites: a whole-model read would fail like this
        raise SystemExit("the limit does not apply")
    except MemoryError:
        pass
    diff = compare_weights(sys.argv[1], sys.argv[2])
    print(len(diff.tensors), max(t.rel for t in diff.tensors), diff.bytes_read)
""")


def test_sharded_checkpoint_and_gguf_bigger_than_the_memory_limit(tmp_path):
    """RLIMIT_DATA caps the private memory (heap, anonymous maps) of a subprocess at 96 MB above
    what it uses after import; the 200 MB sharded checkpoint and the 200 MB GGUF (f32 tensors of
    8 MB) are compared without a MemoryError. Memory-mapped file pages are not private memory:
    the kernel can drop them at any time, which is what lets a model bigger than RAM be read."""
    n_layers, shape = 12, (1024, 1024)
    ref, writer = tmp_path / "ref", gguf.GGUFWriter(tmp_path / "cand.gguf", arch="llama")
    ref.mkdir()
    writer.add_block_count(n_layers)
    writer.add_head_count(8)
    weight_map = {}
    for shard in range(3):
        tensors = {}
        for layer in range(shard * 4, shard * 4 + 4):
            for hf, gg in (("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down"),
                           ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output")):
                w = np.random.default_rng(layer).normal(size=shape).astype(np.float32)
                tensors[f"model.layers.{layer}.{hf}.weight"] = w
                writer.add_tensor(f"blk.{layer}.{gg}.weight", w * np.float32(1.0001))
        name = f"model-{shard + 1:05d}-of-00003.safetensors"
        save_file(tensors, ref / name)
        weight_map.update(dict.fromkeys(tensors, name))
    (ref / "model.safetensors.index.json").write_text(__import__("json").dumps({"weight_map": weight_map}))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    budget_mb = 96
    assert (tmp_path / "cand.gguf").stat().st_size > 2 * (budget_mb << 20)
    run = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(ref), str(tmp_path / "cand.gguf"), str(budget_mb)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    n, worst, read = run.stdout.split()
    assert int(n) == 48 and float(worst) == pytest.approx(1e-4, rel=1e-2) and int(read) > 400e6
