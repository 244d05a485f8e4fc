"""Every default check, streamed, on a model with Llama-3-8B's shapes (issue 19, item 4).

    python benchmarks/llama8b.py                    # build, run, report, delete the 8B files
    python benchmarks/llama8b.py --keep             # keep /tmp/modeldiff-8b for another run

Random weights, for time and memory only: the check verdicts mean nothing (random weights under
Q4_K_M fail the logit and layer limits). The model (benchmarks/
randomllama.py): hidden 4096, 32 layers, 32 heads / 8 KV heads, ffn 14336, vocabulary 128,256,
untied head, bf16 safetensors written shard by shard (16 GB); llama.cpp's converter writes a q8_0
GGUF (8.5 GB) and its quantizer requantizes it to Q4_K_M (4.9 GB), then the q8_0 file is deleted:
the disk peak is ~30 GB. The run is the `modeldiff` command with --modeldiff-stream-layers on two
128-token rows of this repository's README (benchmarks/streaming.py, under flock /tmp/bench.lock
and /usr/bin/time -v).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import streaming  # noqa: E402

NEEDED_GB = 31  # bf16 16 + q8_0 8.5 + Q4_K_M 4.9, with room


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/modeldiff-8b"))
    ap.add_argument("--eval-rows", type=int, default=2)
    ap.add_argument("--eval-length", type=int, default=128)
    ap.add_argument("--keep", action="store_true", help="keep the model files")
    args = ap.parse_args()
    if not (args.work_dir / "model-q4_k_m.gguf").is_file():
        free = shutil.disk_usage(args.work_dir.parent).free / 2**30
        if free < NEEDED_GB:
            sys.exit(f"{args.work_dir.parent}: {free:.0f} GB free, the build needs ~{NEEDED_GB} GB")
    try:
        hf, gguf = streaming.build("8b", args.work_dir)
        row = streaming.run(hf, gguf, True, [f"--eval-text={ROOT / 'README.md'}", f"--eval-rows={args.eval_rows}",
                                              f"--eval-length={args.eval_length}"])
        print(json.dumps(row, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(args.work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
