"""Pure formulas, no I/O: logit metrics (KLD, NMSE, top-k), llama-perplexity's KL statistics,
next-token quality, per-layer relative error and per-tensor weight error."""
