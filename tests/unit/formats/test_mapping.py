"""HF config <-> GGUF metadata hyper-parameter mapping."""
from pytest_modeldiff.formats import mapping

HF_V5 = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 512,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
         "vocab_size": 49152, "rms_norm_eps": 1e-5,
         "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}
GGUF = {"general.architecture": "llama", "llama.block_count": 4, "llama.embedding_length": 256,
        "llama.feed_forward_length": 512, "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2, "llama.context_length": 2048, "llama.vocab_size": 49152,
        "llama.rope.freq_base": 10000.0, "llama.attention.layer_norm_rms_epsilon": 9.999999747378752e-06}


def test_v5_config_and_gguf_agree():
    ref, cand = mapping.from_hf_config(HF_V5), mapping.from_gguf_metadata(GGUF, set())
    assert ref["rope_freq_base"] == 10000.0 and ref["head_dim"] == 64 and ref["rope_scaling_type"] == "none"
    assert mapping.compare(ref, cand) == []


def test_v4_layout_rope_theta_and_scaling():
    v4 = {**{k: v for k, v in HF_V5.items() if k != "rope_parameters"}, "rope_theta": 500000.0,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    values = mapping.from_hf_config(v4)
    assert values["rope_freq_base"] == 500000.0
    assert values["rope_scaling_type"] == "llama3" and values["rope_scaling_factor"] == 8.0
    gguf = {**GGUF, "llama.rope.freq_base": 500000.0}
    diffs = dict((k, (a, b)) for k, a, b in mapping.compare(values, mapping.from_gguf_metadata(gguf, set())))
    assert diffs["rope_scaling_type"] == ("llama3", "none"), "missing rope scaling must be reported"
    assert mapping.compare(values, mapping.from_gguf_metadata(gguf, {"rope_freqs.weight"})) != []


def test_mismatch_names_both_values():
    bad = {**GGUF, "llama.rope.freq_base": 50000.0, "llama.attention.layer_norm_rms_epsilon": 1e-6}
    diffs = mapping.compare(mapping.from_hf_config(HF_V5), mapping.from_gguf_metadata(bad, set()))
    assert ("rope_freq_base", 10000.0, 50000.0) in diffs
    assert any(k == "norm_rms_eps" for k, _, _ in diffs)


def test_gguf_values_of_any_shape_or_type_never_crash_and_stay_json():
    """Per-layer arrays (numpy or list), 0 heads, strings or NaN where numbers belong: the metadata
    check shows them as they are instead of raising (ZeroDivisionError, TypeError, ValueError)."""
    import json

    import numpy as np

    odd = {**GGUF, "llama.attention.head_count": 0, "llama.attention.head_count_kv": np.array([1, 1, 1, 1]),
           "llama.feed_forward_length": np.array([512, 512, 0, 512], dtype=np.int32),
           "llama.context_length": "2048", "llama.vocab_size": float("nan"),
           "llama.rope.freq_base": [10000.0],
           "general.architecture": "llama"}
    values = mapping.from_gguf_metadata(odd, set())
    assert values["n_head"] == 0 and "head_dim" not in values
    assert values["n_head_kv"] == 1 and values["n_ff"] == [512, 512, 0, 512]
    assert values["rope_freq_base"] == 10000.0
    assert values["n_ctx_train"] == 2048 and values["n_vocab"] != values["n_vocab"]  # NaN stays NaN
    json.dumps(values)
    diffs = {k for k, _, _ in mapping.compare(mapping.from_hf_config(HF_V5), values)}
    assert {"n_head", "n_ff", "n_vocab"} <= diffs


def test_zero_heads_in_a_config_do_not_divide_by_zero():
    values = mapping.from_hf_config({**HF_V5, "num_attention_heads": 0})
    assert values["n_head"] == 0 and "head_dim" not in values
