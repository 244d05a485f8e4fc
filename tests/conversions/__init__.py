"""End to end on llama.cpp conversions: the tiny set (default tier), llama-perplexity (slow) and
SmolLM2-135M (realmodel)."""
