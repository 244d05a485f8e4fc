"""Peak RSS of the per-layer comparison, in memory vs --modeldiff-stream-layers, against model size.

    python benchmarks/streaming.py                  # three random Llamas, 4 x 256 tokens
    python benchmarks/streaming.py --sizes 512x8,1024x16 --json /tmp/streaming.json

Each size is a random float32 Llama (hidden x layers, ffn = 4 x hidden, 49k vocabulary, untied
head) built once into a temporary folder with fixtures/build.py. The comparison runs the model
against a copy of itself in a fresh subprocess, so the peak RSS (ru_maxrss) is that run's alone:
"in-memory" loads both models whole in transformers; "streamed" holds one module of each. Peak is
/proc's VmHWM, reset after the imports (ru_maxrss would carry the parent's peak across exec); the
baseline is the RSS at that point (torch, transformers, the package).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, sys, time
import torch, transformers  # baseline: the libraries, not the model
from pytest_modeldiff.metrics import layers
from pytest_modeldiff.engine import streaming
from pytest_modeldiff.runners.detect import make_runner
mode, ref, cand, ckpt = sys.argv[1:5]
ids = [list(range(1000 + 300 * s, 1000 + 300 * s + 256)) for s in range(4)]

def status(key):  # kB -> MB
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1]) / 1024

# ru_maxrss survives fork+exec (it would report the parent's peak): reset the high-water mark
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = status("VmRSS")
t0 = time.perf_counter()
if mode == "streamed":
    from pytest_modeldiff.engine import streaming
    stats = streaming.stream_layers(ref, cand, ids, checkpoint_dir=ckpt)
else:
    r, c = make_runner(ref), make_runner(cand)
    r.load(256); c.load(256)
    acc = layers.LayerAccumulator(layers.state_names(r.model.config.num_hidden_layers))
    for seq in ids:
        ref_states = r.forward(seq, hidden=True).hidden
        fwd = c.forward(seq, hidden=True, feed=ref_states)
        acc.add(ref_states, fwd.hidden, fwd.isolated)
    stats = acc.finish("in-memory")
print(json.dumps({"baseline_rss_mb": base, "peak_rss_mb": status("VmHWM"),
                  "seconds": time.perf_counter() - t0,
                  "rfn_max": None if stats is None else float(stats.rfn_mean.max())}))
"""


def weights_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors")) / 2**20


def largest_layer_mb(hidden: int, kv_ratio: float = 0.5) -> float:
    ffn = 4 * hidden
    params = hidden * hidden * (2 + 2 * kv_ratio) + 3 * hidden * ffn
    return params * 4 / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="256x8,512x8,1024x8", help="hidden x layers, comma-separated")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    from fixtures import build

    work = Path(tempfile.mkdtemp(prefix="modeldiff-stream-bench-"))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
    rows = []
    try:
        for size in args.sizes.split(","):
            hidden, n_layers = map(int, size.split("x"))
            spec = build.TinySpec(hidden=hidden, ffn=4 * hidden, layers=n_layers, heads=hidden // 64,
                                  kv_heads=hidden // 128)
            ref = build.build_hf(spec, work / f"ref-{size}")
            cand = work / f"cand-{size}"
            shutil.copytree(ref, cand)
            row = {"model": f"hidden {hidden}, {n_layers} layers", "weights_mb": round(weights_mb(ref), 1),
                   "layer_mb": round(largest_layer_mb(hidden), 1), "embedding_mb": round(49152 * hidden * 4 / 2**20, 1)}
            for mode in ("in-memory", "streamed"):
                out = subprocess.run([sys.executable, "-c", CHILD, mode, str(ref), str(cand), str(work / "ckpt")],
                                     capture_output=True, text=True, env=env, check=True)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                row["baseline_rss_mb"] = round(result["baseline_rss_mb"])
                row[f"{mode}_rss_mb"] = round(result["peak_rss_mb"])
                row[f"{mode}_s"] = round(result["seconds"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
            shutil.rmtree(ref)
            shutil.rmtree(cand)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    head = ["model", "weights (2 models) MB", "decoder layer MB", "embedding MB", "baseline RSS MB",
            "in-memory peak RSS MB", "streamed peak RSS MB", "in-memory s", "streamed s"]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print(f"| {r['model']} | {2 * r['weights_mb']:.0f} | {r['layer_mb']:.0f} | {r['embedding_mb']:.0f} | "
              f"{r['baseline_rss_mb']} | {r['in-memory_rss_mb']} | {r['streamed_rss_mb']} | {r['in-memory_s']} | "
              f"{r['streamed_s']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
