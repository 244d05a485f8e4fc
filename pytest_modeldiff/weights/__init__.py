"""Weight files and their comparison: readers for safetensors, torch checkpoints, numpy and GGUF (a
chunk of rows at a time), and the tensor-by-tensor diff with its likely causes and change patterns."""
