"""Runtimes behind one small interface (base.py): a reference or candidate is a HF folder run by
transformers (hf.py), a GGUF run by llama.cpp (llamacpp.py) or dequantized into transformers
(gguf_torch.py), a HF folder or GGUF run one layer at a time from its files (streamed.py, on streaming.py), a
logits dump (dump.py), a reference cache (refcache.py) or a weights-only file
(weights.py). Adding a runtime adds a module and a row below; metrics, checks and the plugin do
not change. This face holds only the table, so the plugin can list runners without importing one.
"""

RUNNERS = {
    "hf": "pytest_modeldiff.runners.hf:HFRunner",
    "llamacpp": "pytest_modeldiff.runners.llamacpp:LlamaCppRunner",
    "gguf-torch": "pytest_modeldiff.runners.gguf_torch:GGUFTorchRunner",
    "streamed": "pytest_modeldiff.runners.streamed:streamed_runner",
    "dump": "pytest_modeldiff.runners.dump:DumpRunner",
    "weights": "pytest_modeldiff.runners.weights:WeightsRunner",
    "refcache": "pytest_modeldiff.runners.refcache:RefCacheRunner",
}

# llama.cpp's model-conversion scripts name the two models by environment variable; they are the
# defaults for --ref-model / --cand-model and pick a model's dump out of a data/ folder.
MODEL_ENV = {"reference": "MODEL_PATH", "candidate": "CONVERTED_MODEL"}
