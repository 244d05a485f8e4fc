"""Random-weight Llama checkpoints of real shapes, for time and memory benchmarks only.

The weights are random (normal, std 0.02; norms 1): right for timings and peak memory, meaningless
for any quality number. The checkpoint is written shard by shard (one shard's tensors in memory at
a time), so an 8B model is made on a machine with less RAM than the model. The tokenizer is
SmolLM2's (fixtures/demo/hf), which llama.cpp's converter recognises; a larger vocabulary than its
49,152 tokens is padded by the converter with [PAD<i>] tokens (the benchmark measures the run,
not the verdicts).

    from benchmarks.randomllama import LlamaShape, write_random_llama, convert_and_quantize
    write_random_llama(LLAMA3_8B, Path("/tmp/llama8b/hf"))
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class LlamaShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    rope_theta: float = 500000.0

    def tensors(self):
        """(name, shape) in the order the checkpoint stores them; the head is untied."""
        h, kv = self.hidden, self.hidden // self.heads * self.kv_heads
        yield "model.embed_tokens.weight", (self.vocab, h)
        for i in range(self.layers):
            p = f"model.layers.{i}."
            yield p + "input_layernorm.weight", (h,)
            yield p + "self_attn.q_proj.weight", (h, h)
            yield p + "self_attn.k_proj.weight", (kv, h)
            yield p + "self_attn.v_proj.weight", (kv, h)
            yield p + "self_attn.o_proj.weight", (h, h)
            yield p + "post_attention_layernorm.weight", (h,)
            yield p + "mlp.gate_proj.weight", (self.ffn, h)
            yield p + "mlp.up_proj.weight", (self.ffn, h)
            yield p + "mlp.down_proj.weight", (h, self.ffn)
        yield "model.norm.weight", (h,)
        yield "lm_head.weight", (self.vocab, h)

    @property
    def params(self) -> int:
        return sum(math.prod(shape) for _, shape in self.tensors())


LLAMA3_8B = LlamaShape(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256)
# ~1.08B parameters: TinyLlama's body (2048 wide, 32/4 heads, ffn 5632) with 20 layers and SmolLM2's vocabulary
LLAMA_1B = LlamaShape(hidden=2048, layers=20, heads=32, kv_heads=4, ffn=5632, vocab=49152, rope_theta=10000.0)


def write_random_llama(shape: LlamaShape, out: Path, seed: int = 0, shard_bytes: int = 2 << 30) -> Path:
    """A bf16 LlamaForCausalLM folder (config, tokenizer, sharded safetensors and their index)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    out.mkdir(parents=True, exist_ok=True)
    LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.ffn,
                num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                num_key_value_heads=shape.kv_heads, max_position_embeddings=8192, rope_theta=shape.rope_theta,
                rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                torch_dtype="bfloat16", architectures=["LlamaForCausalLM"]).to_json_file(out / "config.json")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "fixtures" / "demo" / "hf" / name, out / name)
    g = torch.Generator().manual_seed(seed)
    names = list(shape.tensors())
    shards, current, size = [], {}, 0
    for name, dims in names:  # group into shards of about shard_bytes
        nbytes = 2 * math.prod(dims)  # bf16
        if current and size + nbytes > shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = dims
        size += nbytes
    shards.append(current)
    weight_map = {}
    for k, shard in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, dims in shard.items():
            if len(dims) == 1:
                tensors[name] = torch.ones(dims, dtype=torch.bfloat16)
            else:
                tensors[name] = (torch.randn(dims, generator=g, dtype=torch.float32) * 0.02).to(torch.bfloat16)
            weight_map[name] = file
        save_file(tensors, out / file, metadata={"format": "pt"})
        del tensors
        print(f"wrote {file} ({len(shard)} tensors)", flush=True)
    total = sum((out / f).stat().st_size for f in set(weight_map.values()))
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (out / "shape.json").write_text(json.dumps({**asdict(shape), "params": shape.params}))
    return out


def convert_and_quantize(hf: Path, out: Path, qtype: str = "q4_k_m", via: str = "q8_0") -> Path:
    """llama.cpp's converter (--outtype ``via``), then its quantizer to ``qtype``; the intermediate
    file is deleted. From q8_0 the quantizer requantizes (allow_requantize): fine for random
    weights, and it keeps the disk peak at bf16 + q8_0 + the result."""
    import ctypes
    import os

    import llama_cpp

    from fixtures import build

    mid = out.with_name(out.stem + f".{via}.tmp.gguf")
    try:
        build.convert(hf, mid, via)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = build.QUANT_TYPES[qtype]
        params.nthread = os.cpu_count() or 1
        params.allow_requantize = via not in ("f32", "f16", "bf16")
        rc = llama_cpp.llama_model_quantize(str(mid).encode(), str(out).encode(), ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize({mid} -> {qtype}) returned {rc}")
    finally:
        mid.unlink(missing_ok=True)
    return out


if __name__ == "__main__":  # python benchmarks/randomllama.py 8b|1b OUT_DIR
    shape = {"8b": LLAMA3_8B, "1b": LLAMA_1B}[sys.argv[1]]
    folder = Path(sys.argv[2])
    write_random_llama(shape, folder / "hf")
    convert_and_quantize(folder / "hf", folder / "model-q4_k_m.gguf")
    subprocess.run(["ls", "-la", str(folder), str(folder / "hf")])
