"""File formats and the files the plugin reads and writes: the GGUF header (validated against
llama.cpp's load-time rules), vocabulary records, the HF <-> GGUF name and hyper-parameter mapping,
llama.cpp-compatible logit dumps, the reference cache, the cache folder's hashes and locks, and the
one atomic writer every file goes through."""
