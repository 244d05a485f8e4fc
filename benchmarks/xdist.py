#!/usr/bin/env python
"""Four candidates spread over pytest-xdist workers against the same run in one process:

    python benchmarks/xdist.py                       # -n 0 against -n 2 --dist loadgroup
    python benchmarks/xdist.py --rows 8 --length 512

Model: SmolLM2-135M f32 GGUF (the reference, built by perplexity.py into its --work-dir) against
q8_0, q6_k, q4_k_m and q4_0 quantized from it (built here once, llama.cpp's quantizer). Each
configuration runs as a fresh `pytest` process with an empty reference cache (so it computes the
reference once, under the cache's lock) and OMP_WAIT_POLICY=PASSIVE; -n 0 gives each model 2
threads, -n 2 gives each worker 1 (the machine's 2 cores either way). Wall time of the whole
process (under xdist the summary and report files are not written: see the README).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TYPES = ("q8_0", "q6_k", "q4_k_m", "q4_0")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "pytest-modeldiff" / "bench-perplexity")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--length", type=int, default=256)
    args = ap.parse_args()
    work = args.work_dir
    ref = work / "smol-f32.gguf"
    if not ref.exists():
        raise SystemExit(f"{ref} missing: run benchmarks/perplexity.py first (it builds it)")
    sys.path.insert(0, str(ROOT))
    from fixtures.build import quantize

    cands = []
    for qtype in TYPES:
        out = work / f"smol-{qtype}.gguf"
        if not out.exists():
            quantize(ref, out, qtype)
        cands.append(out)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, extra in (("-n 0", ["-n", "0", "--modeldiff-threads", "2"]),
                             ("-n 2", ["-n", "2", "--dist", "loadgroup", "--modeldiff-threads", "1"])):
            command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--ref-model={ref}",
                       *[f"--cand-model={c}" for c in cands], f"--eval-text={work / 'text.txt'}",
                       f"--eval-rows={args.rows}", f"--eval-length={args.length}",
                       f"--modeldiff-ref-cache={Path(tmp) / ('cache' + label[-1])}",
                       *extra]
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp)
            wall = time.perf_counter() - t0
            results[label] = (wall, load, done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "")
            print(f"{label}: {wall:.1f} s (load average before: {load:.2f}) {results[label][2]}", flush=True)
    ratio = results["-n 2"][0] / results["-n 0"][0]
    print(f"4 candidates, {args.rows} x {args.length} tokens: -n 2 / -n 0 = {ratio:.2f}")


if __name__ == "__main__":
    main()
