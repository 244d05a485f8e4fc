#!/usr/bin/env python
"""Weight diff throughput and memory on a multi-GB checkpoint: compare_weights' MB/s against a plain
sequential read of the same files, and its peak RSS against the largest tensor.

    python benchmarks/weights.py                       # build once (~3 GB float32 Llama), then f16 and q8_0
    python benchmarks/weights.py --pairs q8_0 --json /tmp/weights.json
    python benchmarks/weights.py --work-dir /tmp/wbench --hidden 256 --layers 2   # a quick smoke run
    python benchmarks/weights.py --cold                # drop the page cache first (needs root, may be refused)

The model is a random-weight LlamaForCausalLM (float32, hidden 2048, ffn 5632, 12 layers, 16 heads,
4 KV heads, the 49,152-token vocabulary of fixtures/demo's tokenizer, untied head, normal(0, 0.02)
weights, seed 0): 2.97 GB of safetensors, saved by transformers in 1 GB shards with
model.safetensors.index.json. llama.cpp's converter turns it into an F16 GGUF and llama.cpp's
quantizer turns that into Q8_0 (fixtures/build.py's convert and quantize). Everything is built once,
in its own subprocess, into a temporary folder renamed into place under --work-dir, and reused.

Per pair (HF folder vs one GGUF), each step in a fresh subprocess, so its peak RSS is its own:
1. plain read: every file of the pair (all shards and the GGUF) read front to back with 16 MB
   f.readinto calls into one reused buffer. The files are read once untimed first, then timed.
2. compare_weights(hf, gguf): wall time of the whole call (headers included); bytes are
   diff.bytes_read, both sides' on-disk tensor bytes; peak RSS is ru_maxrss of that subprocess.
Both are page-cache-warm measurements: compare_weights runs right after the plain read of the same
files, so it finds them cached too. With --cold, both steps start by writing 3 to
/proc/sys/vm/drop_caches (and skip the warm-up read); where that is refused (not root, a container)
the refusal is printed and both steps stay warm.

The parent process imports neither numpy nor torch and builds nothing itself: ru_maxrss carries the
peak of the process a child was forked from across exec, so a big parent would inflate it. VmHWM
(the child's own high-water mark) is printed beside it as a cross-check, with the peaks of anonymous
and file-backed RSS sampled every 20 ms (a memory-mapped safetensors tensor's pages count as file
RSS while the tensor is compared: page cache, not the process's own memory). The baseline is the
ru_maxrss of a child that only imports pytest_modeldiff.weightdiff; subtract it for the diff's own
memory. The largest tensor is max(n_elements) x 4 bytes (float32) over the reference's tensors.
MB = 2**20 bytes, GB = 2**30 bytes. The subprocesses run with OMP_WAIT_POLICY=PASSIVE.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MB, GB = 2**20, 2**30
READ_BLOCK = 16 * MB
VOCAB = 49152  # fixtures/demo/hf/tokenizer.json's


# --------------------------------------------------------------------------- building (in a subprocess)
def model_folder(work: Path, hidden: int, layers: int) -> Path:
    return work / f"llama-h{hidden}-l{layers}-v{VOCAB}-f32"


def build_model(folder: Path, hidden: int, layers: int) -> None:
    """HF folder (sharded safetensors) and its F16 GGUF, built in a temporary folder renamed into place."""
    sys.path.insert(0, str(ROOT))
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fixtures import build

    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        t0 = time.perf_counter()
        heads = max(1, hidden // 128)
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=max(1, heads // 4), max_position_embeddings=2048,
                             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2)
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            for param in model.parameters():
                if param.ndim == 2:
                    param.normal_(0.0, 0.02)
        model.save_pretrained(tmp / "hf", max_shard_size="1GB")
        del model
        for name in build.TOKENIZER_FILES:
            shutil.copy(build.DEMO_DIR / "hf" / name, tmp / "hf" / name)
        t1 = time.perf_counter()
        build.convert(tmp / "hf", tmp / "model-f16.gguf", "f16")
        t2 = time.perf_counter()
        info = {"hidden": hidden, "layers": layers, "vocab": VOCAB, "hf_build_s": round(t1 - t0, 1),
                "convert_f16_s": round(t2 - t1, 1), "quantize_s": {}}
        (tmp / "build-info.json").write_text(json.dumps(info, indent=2) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_quant(folder: Path, qtype: str) -> None:
    """model-QTYPE.gguf from the F16 GGUF with llama.cpp's quantizer (from an F32 GGUF if that fails)."""
    sys.path.insert(0, str(ROOT))
    from fixtures import build

    dst = folder / f"model-{qtype}.gguf"
    tmp = folder / f".model-{qtype}.gguf.tmp"
    t0 = time.perf_counter()
    source = "f16"
    try:
        build.quantize(folder / "model-f16.gguf", tmp, qtype)
    except RuntimeError as exc:
        print(f"quantizing {qtype} from the F16 GGUF failed ({exc}); retrying from an F32 GGUF", file=sys.stderr)
        source = "f32"
        f32 = folder / ".model-f32.gguf.tmp"
        try:
            build.convert(folder / "hf", f32, "f32")
            build.quantize(f32, tmp, qtype)
        finally:
            f32.unlink(missing_ok=True)
    os.replace(tmp, dst)
    info_path = folder / "build-info.json"
    info = json.loads(info_path.read_text())
    info["quantize_s"][qtype] = {"seconds": round(time.perf_counter() - t0, 1), "from": source}
    info_path.write_text(json.dumps(info, indent=2) + "\n")


# --------------------------------------------------------------------------- measuring (in subprocesses)
def drop_caches() -> str | None:
    """None when the page cache was dropped, else why not."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"


def peaks() -> dict:
    hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    return {"ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "vmhwm_mb": hwm / 1024}


class RssSampler:
    """Peak anonymous and file-backed RSS, sampled every 20 ms in a thread: VmHWM has no split, and
    the pages of a memory-mapped tensor count as (reclaimable) file RSS while it is mapped."""

    def __init__(self):
        import threading

        self.peak = {"RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for line in open("/proc/self/status"):
            key = line.split(":")[0]
            if key in self.peak:
                self.peak[key] = max(self.peak[key], int(line.split()[1]))

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()

    def mb(self) -> dict:
        return {"peak_anon_mb": self.peak["RssAnon"] / 1024, "peak_file_mb": self.peak["RssFile"] / 1024}


def pair_files(hf: Path, gguf: Path) -> list[Path]:
    index = hf / "model.safetensors.index.json"
    shards = (sorted(hf / s for s in set(json.loads(index.read_text())["weight_map"].values())) if index.is_file()
              else sorted(hf.glob("*.safetensors")))  # a small model (--hidden/--layers) fits one shard
    return [*shards, gguf]


def plain_read(files: list[Path], cold: bool) -> dict:
    buffer = bytearray(READ_BLOCK)
    view = memoryview(buffer)

    def read_all() -> int:
        total = 0
        for path in files:
            with open(path, "rb", buffering=0) as f:
                while n := f.readinto(view):
                    total += n
        return total

    refused = drop_caches() if cold else "not asked (--cold)"
    if refused:
        read_all()  # warm: the page cache holds the files, as it does for compare_weights
    t0 = time.perf_counter()
    n = read_all()
    seconds = time.perf_counter() - t0
    return {"bytes": n, "seconds": seconds, "warm": refused is not None, "cold_refused": refused if cold else None,
            **peaks()}


def run_compare(hf: Path, gguf: Path, cold: bool) -> dict:
    from pytest_modeldiff.weights.diff import compare_weights

    refused = drop_caches() if cold else None
    with RssSampler() as sampler:
        t0 = time.perf_counter()
        diff = compare_weights(hf, gguf)
        seconds = time.perf_counter() - t0
    rss = peaks()  # before anything else is opened
    from pytest_modeldiff.weights.files import open_weights

    largest = max(meta.n_elements for meta in open_weights(hf).tensors.values())
    statuses: dict[str, int] = {}
    for t in diff.tensors:
        statuses[t.status] = statuses.get(t.status, 0) + 1
    worst = diff.worst(1)
    return {"seconds": seconds, "diff_seconds": diff.seconds, "bytes_read": diff.bytes_read,
            "warm": not cold or refused is not None, "largest_tensor_mb": largest * 4 / MB,
            "n_tensors": len(diff.tensors), "statuses": statuses,
            "worst": {"name": worst[0].name, "rel": worst[0].rel, "cause": worst[0].cause} if worst else None,
            "causes": sorted({t.cause for t in diff.tensors if t.cause}), **rss, **sampler.mb()}


def worker(args) -> None:
    folder = Path(args.folder)
    if args.worker == "build":
        result = build_model(folder, args.hidden, args.layers)
    elif args.worker.startswith("quantize:"):
        result = build_quant(folder, args.worker.partition(":")[2])
    elif args.worker == "baseline":
        import pytest_modeldiff.weightdiff  # noqa: F401

        result = peaks()
    elif args.worker.startswith("read:"):
        result = plain_read(pair_files(folder / "hf", folder / f"model-{args.worker[5:]}.gguf"), args.cold)
    elif args.worker.startswith("compare:"):
        result = run_compare(folder / "hf", folder / f"model-{args.worker[8:]}.gguf", args.cold)
    else:
        raise SystemExit(f"unknown worker {args.worker!r}")
    print(json.dumps(result))


def child(args, mode: str, folder: Path) -> dict:
    cmd = [sys.executable, __file__, "--worker", mode, "--folder", str(folder), "--hidden", str(args.hidden),
           "--layers", str(args.layers)] + (["--cold"] if args.cold else [])
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, check=True)  # stderr passes through
    return json.loads(proc.stdout.strip().splitlines()[-1] or "null")


# --------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--work-dir", default=str(Path.home() / ".cache" / "pytest-modeldiff" / "bench-weights"),
                    help="where the model is built once and reused (default %(default)s)")
    ap.add_argument("--pairs", default="f16,q8_0",
                    help="GGUF types to compare with the HF folder, comma-separated "
                         "(f16, or a fixtures/build.py QUANT_TYPES name: q8_0, q4_k_m ...)")
    ap.add_argument("--hidden", type=int, default=2048, help="hidden size (ffn = 2.75 x, heads = hidden / 128)")
    ap.add_argument("--layers", type=int, default=12, help="decoder layers (12: 2.97 GB of float32 safetensors)")
    ap.add_argument("--keep", action=argparse.BooleanOptionalAction, default=True,
                    help="keep the built model for the next run (default); --no-keep deletes it afterwards")
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each measurement "
                                                        "(/proc/sys/vm/drop_caches; needs root)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one step in this process
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    work = Path(args.work_dir).expanduser()
    work.mkdir(parents=True, exist_ok=True)
    folder = model_folder(work, args.hidden, args.layers)
    pairs = [p.strip() for p in args.pairs.split(",") if p.strip()]
    try:
        if not (folder / "build-info.json").is_file():
            print(f"building {folder} (HF float32 safetensors + F16 GGUF) ...", flush=True)
            t0 = time.perf_counter()
            child(args, "build", folder)
            print(f"  built in {time.perf_counter() - t0:.0f} s", flush=True)
        for qtype in pairs:
            if not (folder / f"model-{qtype}.gguf").is_file():
                print(f"quantizing model-{qtype}.gguf ...", flush=True)
                child(args, f"quantize:{qtype}", folder)
        info = json.loads((folder / "build-info.json").read_text())
        quant = ", ".join(f"{q} {v['seconds']} s (from {v['from']})" for q, v in info["quantize_s"].items())
        print(f"model: {folder}\n  build times: HF {info['hf_build_s']} s, convert F16 {info['convert_f16_s']} s"
              + (f", quantize {quant}" if quant else ""))
        sizes = {p.name: p.stat().st_size / GB for p in sorted(folder.rglob("*"))
                 if p.suffix in (".safetensors", ".gguf")}
        print("  files: " + ", ".join(f"{name} {gb:.2f} GB" for name, gb in sizes.items()), flush=True)

        baseline = child(args, "baseline", folder)
        rows = []
        for qtype in pairs:
            read = child(args, f"read:{qtype}", folder)
            cmp = child(args, f"compare:{qtype}", folder)
            row = {"pair": f"hf f32 vs {qtype} gguf", "read": read, "compare": cmp,
                   "gb_read": cmp["bytes_read"] / GB, "plain_mb_s": read["bytes"] / MB / read["seconds"],
                   "compare_mb_s": cmp["bytes_read"] / MB / cmp["seconds"]}
            row["ratio"] = row["compare_mb_s"] / row["plain_mb_s"]
            row["rss_over_largest"] = cmp["ru_maxrss_mb"] / cmp["largest_tensor_mb"]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("read", "compare")}), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)

    warm = all(r["read"]["warm"] and r["compare"]["warm"] for r in rows)
    refused = next((r["read"]["cold_refused"] for r in rows if r["read"]["cold_refused"]), None)
    print(f"\npage cache: {'warm (files read once before timing)' if warm else 'cold (dropped before each step)'}"
          + (f"; --cold refused: {refused}" if refused else ""))
    print(f"baseline RSS (a child that only imports pytest_modeldiff.weightdiff): {baseline['ru_maxrss_mb']:.0f} MB")
    head = ["pair", "GB read", "plain read MB/s", "compare_weights MB/s", "ratio", "peak RSS MB", "largest tensor MB",
            "RSS/largest"]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        c = r["compare"]
        print(f"| {r['pair']} | {r['gb_read']:.2f} | {r['plain_mb_s']:.0f} | {r['compare_mb_s']:.0f} | "
              f"{r['ratio']:.3f} | {c['ru_maxrss_mb']:.0f} | {c['largest_tensor_mb']:.0f} | "
              f"{r['rss_over_largest']:.2f} |")
    for r in rows:
        c, rd = r["compare"], r["read"]
        print(f"\n{r['pair']}: compare_weights {c['seconds']:.1f} s ({c['diff_seconds']:.1f} s after opening), "
              f"{c['n_tensors']} tensors {c['statuses']}; "
              f"plain read {rd['bytes'] / GB:.2f} GB in {rd['seconds']:.2f} s (peak RSS {rd['ru_maxrss_mb']:.0f} MB)\n"
              f"  compare_weights memory: VmHWM {c['vmhwm_mb']:.0f} MB; "
              f"sampled peaks: anonymous {c['peak_anon_mb']:.0f} MB, "
              f"file-backed (mapped tensor pages) {c['peak_file_mb']:.0f} MB")
        if c["worst"]:
            print(f"  largest change: {c['worst']['name']} rel {c['worst']['rel']:.3g}"
                  + (f" ({c['worst']['cause']})" if c["worst"]["cause"] else ""))
        if c["causes"]:
            print(f"  causes reported: {c['causes']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"baseline": baseline, "warm": warm, "pairs": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
