"""formats/architectures.py: the converter's transforms and the runtime's defaults per architecture."""
import numpy as np
import pytest

from pytest_modeldiff.formats import architectures, mapping

GEMMA3_HF = {"model_type": "gemma3_text", "num_hidden_layers": 6, "hidden_size": 256, "intermediate_size": 512,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 2048,
             "vocab_size": 49152, "rms_norm_eps": 1e-6, "sliding_window": 8, "query_pre_attn_scalar": 64,
             "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
             "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
GEMMA3_GGUF = {"general.architecture": "gemma3", "gemma3.block_count": 6, "gemma3.embedding_length": 256,
               "gemma3.feed_forward_length": 512, "gemma3.attention.head_count": 4,
               "gemma3.attention.head_count_kv": 2, "gemma3.attention.key_length": 64,
               "gemma3.context_length": 2048, "gemma3.rope.freq_base": 1000000.0, "gemma3.vocab_size": 49152,
               "gemma3.rope.freq_base_swa": 10000.0, "gemma3.attention.sliding_window": 8,
               "gemma3.attention.layer_norm_rms_epsilon": 9.999999974752427e-07}


def test_converter_transforms_by_architecture():
    llama, gemma3, qwen3, olmo = (architectures.architecture(a) for a in ("llama", "gemma3", "qwen3", "olmo"))
    assert llama.rope_permutes("blk.0.attn_q.weight") and llama.rope_permutes("blk.0.attn_k.bias")
    assert not qwen3.rope_permutes("blk.0.attn_q.weight") and not gemma3.rope_permutes("blk.0.attn_q.weight")
    assert olmo.rope_permutes("blk.0.attn_k.weight") and not olmo.rope_permutes("blk.0.attn_k.bias")
    for name in ("blk.0.attn_norm.weight", "blk.3.post_ffw_norm.weight", "blk.1.attn_q_norm.weight",
                 "output_norm.weight"):
        assert gemma3.undo_norm_offset(name) == 1.0 and llama.undo_norm_offset(name) == 0.0
    assert gemma3.undo_norm_offset("blk.0.attn_q.weight") == 0.0
    assert gemma3.embd_tensor == "inp_scaled" and llama.embd_tensor == "embd"
    assert mapping.rope_head_dim("granite", "blk.0.attn_q.weight", 256, 4, 2) == 64
    assert mapping.rope_head_dim("qwen2", "blk.0.attn_q.weight", 256, 4, 2) is None


def test_unknown_architecture_is_not_mapped_and_says_so():
    assert architectures.architecture("starcoder2") is None and architectures.architecture(None) is None
    reason = architectures.not_mapped("starcoder2", "weights")
    assert reason.startswith("weights: architecture starcoder2 not mapped") and "gemma3" in reason


def test_expert_names():
    assert architectures.expert_parts("model.layers.3.mlp.experts.12.down_proj.weight") == (
        "model.layers.3.mlp.experts.down_proj", 12)
    assert architectures.expert_parts("model.layers.3.mlp.gate.weight") is None
    assert architectures.fused_gate_up("model.layers.0.mlp.experts.gate_up_proj") == (
        "model.layers.0.mlp.experts.gate_proj", "model.layers.0.mlp.experts.up_proj")


def test_gemma3_metadata_compares_per_layer_attention():
    ref, cand = mapping.from_hf_config(GEMMA3_HF), mapping.from_gguf_metadata(GEMMA3_GGUF, set())
    assert ref["swa_layers"] == "SSSSSF" == cand["swa_layers"]  # llama.cpp's implicit pattern of 6
    assert ref["rope_freq_base"] == 1e6 and ref["rope_freq_base_swa"] == 1e4
    assert ref["attn_scale"] == cand["attn_scale"] == 0.125
    assert mapping.compare(ref, cand) == []
    other = {**GEMMA3_HF, "layer_types": ["sliding_attention", "full_attention"] * 3, "query_pre_attn_scalar": 256}
    diffs = {k: (a, b) for k, a, b in mapping.compare(mapping.from_hf_config(other), cand)}
    assert diffs["swa_layers"] == ("SFSFSF", "SSSSSF") and diffs["attn_scale"] == (1 / 16, 0.125)
    no_swa_base = {k: v for k, v in GEMMA3_GGUF.items() if k != "gemma3.rope.freq_base_swa"}
    assert mapping.from_gguf_metadata(no_swa_base, set())["rope_freq_base_swa"] == 10000.0  # llama.cpp's default


@pytest.mark.parametrize("pattern, expected", [(np.array([True, False] * 3), "SFSFSF"), (3, "SSFSSF")])
def test_a_stored_swa_pattern_wins_over_the_default(pattern, expected):
    gguf = {**GEMMA3_GGUF, "gemma3.attention.sliding_window_pattern": pattern}
    assert mapping.from_gguf_metadata(gguf, set())["swa_layers"] == expected


def test_runtime_defaults_for_moe_and_ignored_windows():
    hf = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "num_experts": 4,
          "num_experts_per_tok": 2, "moe_intermediate_size": 256, "norm_topk_prob": False,
          "use_sliding_window": False, "sliding_window": 4096}
    gguf = {"general.architecture": "qwen3moe", "qwen3moe.block_count": 2, "qwen3moe.embedding_length": 256,
            "qwen3moe.attention.head_count": 4, "qwen3moe.expert_count": 4, "qwen3moe.expert_used_count": 2,
            "qwen3moe.expert_feed_forward_length": 256}
    ref, cand = mapping.from_hf_config(hf), mapping.from_gguf_metadata(gguf, set())
    assert "sliding_window" not in ref  # switched off in the config: no window
    assert mapping.compare(ref, cand) == [("expert_weights_norm", False, True)]  # llama.cpp always renormalises
    phi3 = {"general.architecture": "phi3", "phi3.attention.sliding_window": 2047}
    assert "sliding_window" not in mapping.from_gguf_metadata(phi3, set())  # its graph applies none


def test_partial_rotary_and_granite_scales():
    hf = {"hidden_size": 256, "num_attention_heads": 4, "partial_rotary_factor": 0.25, "embedding_multiplier": 12.0}
    assert mapping.from_hf_config(hf)["rope_dims"] == 16 and mapping.from_hf_config(hf)["embedding_scale"] == 12.0
    gguf = {"general.architecture": "granite", "granite.embedding_length": 256, "granite.attention.head_count": 4}
    assert mapping.from_gguf_metadata(gguf, set())["rope_dims"] == 64
