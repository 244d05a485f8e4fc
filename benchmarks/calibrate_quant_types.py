"""Calibrate the weights check's per-storage-type limits and the logit checks' per-class defaults
from real quantizer output: every file type llama.cpp's quantizer makes without an importance
matrix, made from a real model's f32 GGUF, compared with the f32 HF reference.

    python benchmarks/calibrate_quant_types.py                          # tiny, SmolLM2-135M, Gemma-3-270M
    python benchmarks/calibrate_quant_types.py --models smollm2 --no-logits
    python benchmarks/calibrate_quant_types.py --print results.json     # the tables of an earlier run

Per model: the quantizer writes each file type (fallback types inside the K-quant mixes included:
SmolLM2's 576-wide rows are not a multiple of 256, so its mixes hold Q5_0, Q5_1, Q4_1, Q8_0 ...);
the weights diff (pytest_modeldiff.weights.diff.compare_weights) measures every tensor, and per
storage type the table lists the largest ||d||/||ref||, the largest |gain - 1| (least-squares gain
<ref, cand>/||ref||^2) and the smallest cosine, with how many tensors the current limits fail.
Tensors the candidate stores exactly (F32 norms) are left out of the storage-type table; Gemma's
norms (stored as 1 + w by the converter) only match once the weights diff knows that convention.
Then one plugin run per model (default thresholds, 4 x 256 tokens of fixtures/text, as
fixtures/scoreboard.py runs it) gives every file type's logit metrics: the worse of the
all-positions and last-position scopes, and each check's verdict.

Results (and the quantized files, reused by later runs) go to --out (default
~/.cache/pytest-modeldiff/calibration); --json writes the measurements.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fixtures import build  # noqa: E402

# Every file type llama.cpp's quantizer makes without an importance matrix (IQ1/IQ2/Q2_K_S need
# one; TQ1_0/TQ2_0 are for ternary models; MXFP4/NVFP4 for models trained in them).
FTYPES = ("F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1", "Q4_0",
          "IQ4_NL", "IQ4_XS", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K")
DEFAULT_OUT = build.CACHE / "calibration"
LOGIT_CHECKS = ("kld", "kld_p99", "nmse", "max_abs", "top10", "same_top", "ppl_ratio", "rms_dp", "prob_mse",
                "topk_acc_drop", "layers")
HIGHER = ("top10", "same_top")


def models(names: list[str]) -> dict[str, tuple[Path, Path]]:
    """name -> (HF reference folder, f32 GGUF), from the cached fixture sets."""
    out = {}
    for name in names:
        if name == "tiny":  # Gaussian weights, 256-wide rows: every K-quant without fallbacks
            folder = build.tiny_set()
            out[name] = (folder / "hf", folder / "tiny-f32.gguf")
        elif name == "smollm2":
            folder = build.smollm2_set()
            out[name] = (folder / build.SMOLLM2_HF, folder / "smollm2-f32.gguf")
        elif name == "gemma":
            from fixtures import gemma

            folder = gemma.gemma_base()
            out[name] = (folder / gemma.GEMMA_HF, folder / "gemma3-f32.gguf")
        else:
            raise SystemExit(f"unknown model {name!r}: tiny, smollm2, gemma")
    return out


def quantize(src: Path, dst: Path, ftype: str) -> float:
    """llama_model_quantize with gguf.LlamaFileType's id for ``ftype``; seconds taken (0: reused)."""
    import gguf
    import llama_cpp

    if dst.exists():
        return 0.0
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(gguf.LlamaFileType[f"MOSTLY_{ftype}"])
    params.nthread = min(os.cpu_count() or 1, 4)
    tmp = dst.with_suffix(".tmp")
    started = time.monotonic()
    with build._quiet_stderr():
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {ftype}) returned {rc}")
    os.replace(tmp, dst)
    return time.monotonic() - started


def measure_weights(hf: Path, gguf_path: Path) -> list[dict]:
    from pytest_modeldiff.formats.quant_types import weight_limits
    from pytest_modeldiff.weights.diff import compare_weights

    rows = []
    for t in compare_weights(hf, gguf_path).compared():
        limits = weight_limits(t.ref_type, t.cand_type)
        rows.append({"name": t.name, "ref_type": t.ref_type, "cand_type": t.cand_type, "usual": limits.usual,
                     "rel": t.metrics["rel"], "gain": t.metrics["gain"], "cos": t.metrics["cos"],
                     "passes": limits.passes(t.metrics)})
    return rows


def _number(text: str) -> float | None:
    match = re.match(r"\s*([-+0-9.eE]+|nan|inf)", str(text))
    try:
        return float(match.group(1)) if match else None
    except ValueError:
        return None


def measure_logits(hf: Path, files: dict[str, Path], tokens: tuple[int, int], checks: str = "") -> dict[str, dict]:
    """One plugin run over every file: per file type each check's worst value over both scopes,
    its verdict and the KL statistics."""
    rows, length = tokens
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--rootdir={tmp}", f"--ref-model={hf}",
               *(f"--cand-model={path}" for path in files.values()), f"--eval-text={build.EVAL_TEXT}",
               f"--eval-rows={rows}", f"--eval-length={length}", f"--modeldiff-json={tmp}/report.json", "-q",
               *([f"--modeldiff-checks={checks}"] if checks else [])]
        result = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if result.returncode not in (0, 1):
            raise RuntimeError(f"plugin run exited {result.returncode}:\n{result.stdout[-3000:]}"
                               f"{result.stderr[-2000:]}")
        report = json.loads((Path(tmp) / "report.json").read_text())
    by_path = {str(path): ftype for ftype, path in files.items()}
    out = {}
    for cand in report["candidates"]:
        ftype = by_path.get(cand.get("path"), cand["name"])
        entry = {"quant_class": cand.get("quant_class"), "error": cand.get("error"), "checks": {}}
        for check in cand.get("checks", []):
            values = [v for v in (_number(row["value"]) for row in check["rows"] if not row["metric"].startswith(
                "tensors")) if v is not None]
            if check["name"] in LOGIT_CHECKS and check["name"] != "layers" and values:
                value = min(values) if check["name"] in HIGHER else max(values)
            else:
                value = check["value"]
            entry["checks"][check["name"]] = {"value": value, "status": check["status"],
                                              "threshold": check["threshold"]}
        entry["kl_stats"] = cand.get("kl_stats")
        out[ftype] = entry
    return out


def storage_table(weights: dict[str, dict[str, list[dict]]]) -> dict[str, dict[str, dict]]:
    """type -> model -> max rel, max |gain - 1|, gain range, min cos, tensors, fails (current limits)."""
    table: dict[str, dict[str, dict]] = defaultdict(dict)
    for model, by_ftype in weights.items():
        acc: dict[str, list[dict]] = defaultdict(list)
        for rows in by_ftype.values():
            for row in rows:
                if row["usual"] > 0:  # exact storage (F32 norms) is not a quant type's statistic
                    acc[row["cand_type"]].append(row)
        for qtype, rows in acc.items():
            table[qtype][model] = {
                "tensors": len(rows), "rel": max(r["rel"] for r in rows),
                "gain": max(abs(r["gain"] - 1) for r in rows),
                "gain_lo": min(r["gain"] for r in rows), "gain_hi": max(r["gain"] for r in rows),
                "cos": min(r["cos"] for r in rows), "fails": sum(not r["passes"] for r in rows)}
    return table


def print_tables(data: dict) -> None:
    from pytest_modeldiff.formats.quant_types import weight_limits

    table = storage_table(data["weights"])
    model_names = list(data["weights"])
    print("\n## Storage types (weights diff, tensors stored in that type, every file type)\n")
    head = "| type | " + " | ".join(f"{m}: tensors, max rel, max \\|gain-1\\| (gain range), min cos, fail"
                                    for m in model_names) + " | limit rel | limit \\|gain-1\\| | limit cos |"
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    order = {t: i for i, t in enumerate(("F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_1", "Q5_0", "Q4_K", "Q4_1",
                                         "IQ4_NL", "IQ4_XS", "Q4_0", "Q3_K", "Q2_K"))}
    for qtype in sorted(table, key=lambda t: order.get(t, 99)):
        cells = []
        for m in model_names:
            s = table[qtype].get(m)
            cells.append("" if s is None else f"{s['tensors']}, {s['rel']:.4g}, {s['gain']:.3g} "
                                              f"({s['gain_lo']:.4f}..{s['gain_hi']:.4f}), {s['cos']:.6f}, {s['fails']}")
        lim = weight_limits("F32", qtype)
        print(f"| {qtype} | " + " | ".join(cells) + f" | {lim.rel:.4g} | {lim.gain:.3g} | {lim.cos:.6f} |")
    print("\n## File types: storage-type mix and tensors over the current limits\n")
    for m in model_names:
        print(f"### {m}\n\n| file type | storage types (tensors) | weights fails |\n| --- | --- | --- |")
        for ftype, rows in data["weights"][m].items():
            mix = defaultdict(int)
            for r in rows:
                mix[r["cand_type"]] += 1
            bad = [r for r in rows if not r["passes"] and r["usual"] > 0]
            worst = ", ".join(f"{r['name']} {r['cand_type']} rel {r['rel']:.3g} gain {r['gain']:.4f}"
                              for r in sorted(bad, key=lambda r: -abs(r["gain"] - 1))[:2])
            print(f"| {ftype} | {', '.join(f'{k} {v}' for k, v in sorted(mix.items()))} | {len(bad)} {worst} |")
        print()
    for m, logits in data.get("logits", {}).items():
        print(f"\n## Logits, {m} (worse of all positions / last position; * = failed its default)\n")
        print("| file type | class | " + " | ".join(LOGIT_CHECKS) + " | failed checks |")
        print("|" + " --- |" * (len(LOGIT_CHECKS) + 3))
        for ftype, entry in logits.items():
            checks = entry["checks"]
            cells = []
            for name in LOGIT_CHECKS:
                c = checks.get(name)
                value = c and (c["value"] if isinstance(c["value"], (int, float)) else _number(c["value"]))
                cells.append("" if value is None else f"{value:.3g}{'*' if c['status'] == 'failed' else ''}")
            failed = [n for n, c in checks.items() if c["status"] in ("failed", "error")]
            print(f"| {ftype} | {entry['quant_class']} | " + " | ".join(cells) + f" | {', '.join(failed) or '-'} |")
    if data.get("durations"):
        print("\n## Durations (s)\n")
        for m, d in data["durations"].items():
            print(f"- {m}: " + ", ".join(f"{k} {v:.0f}" for k, v in d.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,smollm2,gemma")
    parser.add_argument("--ftypes", default=",".join(FTYPES))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--no-weights", action="store_true")
    parser.add_argument("--no-logits", action="store_true")
    parser.add_argument("--tokens", default="4x256", help="eval rows x length for the logit run")
    parser.add_argument("--checks", default="", help="--modeldiff-checks for the logit run (default: all)")
    parser.add_argument("--print", type=Path, dest="print_json", help="print the tables of a saved --json")
    args = parser.parse_args()
    if args.print_json:
        print_tables(json.loads(args.print_json.read_text()))
        return
    ftypes = [f.strip().upper() for f in args.ftypes.split(",") if f.strip()]
    rows, length = (int(x) for x in args.tokens.split("x"))
    data: dict = {"ftypes": ftypes, "weights": {}, "logits": {}, "durations": {}}
    for name, (hf, f32) in models(args.models.split(",")).items():
        folder = args.out / name
        folder.mkdir(parents=True, exist_ok=True)
        files, took = {}, defaultdict(float)
        for ftype in ftypes:
            files[ftype] = folder / f"{name}-{ftype.lower()}.gguf"
            took["quantize"] += quantize(f32, files[ftype], ftype)
        print(f"{name}: {len(files)} files in {folder} (quantized in {took['quantize']:.0f} s)", file=sys.stderr)
        if not args.no_weights:
            data["weights"][name] = {}
            for ftype, path in files.items():
                started = time.monotonic()
                data["weights"][name][ftype] = measure_weights(hf, path)
                took["weights"] += time.monotonic() - started
                print(f"{name} {ftype}: weights {time.monotonic() - started:.0f} s", file=sys.stderr)
        if not args.no_logits:
            started = time.monotonic()
            data["logits"][name] = measure_logits(hf, files, (rows, length), args.checks)
            took["logits"] = time.monotonic() - started
            print(f"{name}: logits {took['logits']:.0f} s", file=sys.stderr)
        data["durations"][name] = dict(took)
        if args.json:
            args.json.write_text(json.dumps(data, indent=1, default=lambda v: None if not math.isfinite(v) else v))
    print_tables(data)


if __name__ == "__main__":
    main()
