"""Peak RSS and wall time of a full default-check run, reference in memory vs --modeldiff-stream-layers.

    python benchmarks/streaming.py                          # the 1.08B random Llama pair (built once)
    python benchmarks/streaming.py --shape 8b --modes streamed --eval-rows 2 --eval-length 128   # = llama8b.py

The pair is a random-weight Llama (benchmarks/randomllama.py: bf16 sharded safetensors) and its
Q4_K_M GGUF (llama.cpp's converter to q8_0, then its quantizer), built once under --work-dir.
Random weights: the figures are for time and memory only. Each mode runs the `modeldiff` command
(every default check: tokens, vocab, metadata, weights, the logit checks, layers) in a fresh
process under `/usr/bin/time -v` (peak RSS = the process's maximum resident set) and under
`flock /tmp/bench.lock`, so benchmarks of other users of the machine do not overlap with it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.randomllama import LLAMA3_8B, LLAMA_1B, convert_and_quantize, write_random_llama  # noqa: E402

SHAPES = {"1b": LLAMA_1B, "8b": LLAMA3_8B}


def build(shape_name: str, work: Path) -> tuple[Path, Path]:
    hf, gguf = work / "hf", work / "model-q4_k_m.gguf"
    if not gguf.is_file():
        t0 = time.perf_counter()
        write_random_llama(SHAPES[shape_name], hf)
        t1 = time.perf_counter()
        convert_and_quantize(hf, gguf)
        print(f"built in {t1 - t0:.0f} s (safetensors) + {time.perf_counter() - t1:.0f} s (convert, quantize)",
              flush=True)
    return hf, gguf


def run(hf: Path, gguf: Path, streamed: bool, extra: list[str]) -> dict:
    """One `modeldiff` run; its wall time, peak RSS, load average before it and per-step timings."""
    with tempfile.TemporaryDirectory(prefix="modeldiff-bench-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = ["flock", "/tmp/bench.lock", "/usr/bin/time", "-v", sys.executable, "-m", "pytest_modeldiff",
               f"--ref-model={hf}", f"--cand-model={gguf}", "--modeldiff-ref-cache=none",
               f"--modeldiff-checkpoint-dir={tmp}/ckpt", f"--modeldiff-json={report}", *extra]
        if streamed:
            cmd.append("--modeldiff-stream-layers")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
        load = os.getloadavg()
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode not in (0, 1):  # 1: a check failed (random weights fail vocab, maybe more)
            raise RuntimeError(f"modeldiff failed ({out.returncode}):\n{out.stderr[-4000:]}")
        wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", out.stderr).group(1)
        peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr).group(1))
        cand = json.loads(report.read_text())["candidates"][0]
        failed = [c["name"] for c in cand.get("checks", []) if c["status"] in ("failed", "error")]
        return {"mode": "streamed" if streamed else "in memory", "wall": wall, "peak_rss_gb": round(peak_kb / 2**20, 2),
                "load_before": [round(x, 2) for x in load], "failed": failed,
                "timings": {k: round(v, 1) for k, v in cand.get("timings", {}).items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPES, default="1b")
    ap.add_argument("--work-dir", type=Path, help="where the pair is built (default /tmp/modeldiff-<shape>)")
    ap.add_argument("--modes", default="in-memory,streamed")
    ap.add_argument("--eval-rows", type=int)
    ap.add_argument("--eval-length", type=int)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    work = args.work_dir or Path(f"/tmp/modeldiff-{args.shape}")
    hf, gguf = build(args.shape, work)
    extra = []
    if args.eval_rows or args.eval_length:  # a text cut into rows x length tokens (the README as the text)
        extra += [f"--eval-text={ROOT / 'README.md'}", f"--eval-rows={args.eval_rows or 8}",
                  f"--eval-length={args.eval_length or 256}"]
    shape = SHAPES[args.shape]
    files = {"bf16 safetensors GB": sum(p.stat().st_size for p in hf.glob("*.safetensors")) / 2**30,
             "q4_k_m GGUF GB": gguf.stat().st_size / 2**30, "params": shape.params}
    as_run = 4 * shape.params / 2**30 + files["q4_k_m GGUF GB"]  # the float32 reference + the candidate file
    print(json.dumps(files), flush=True)
    rows = []
    for mode in args.modes.split(","):
        row = run(hf, gguf, mode == "streamed", extra)
        row["peak / (f32 reference + candidate file)"] = round(row["peak_rss_gb"] / as_run, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"files": files, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
