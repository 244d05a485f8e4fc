"""The precision floor of each --ref-dtype choice: the KLD (and top-1 agreement, max |diff|) that
running the reference in bfloat16 or float16 adds by itself, against the same checkpoint run in
float32, on the real-model tier's text (SmolLM2-135M-Instruct, f32 checkpoint, 4 x 256 tokens).

    python benchmarks/ref_dtype.py [HF_FOLDER] [--rows 4] [--length 256]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fixtures.build import EVAL_TEXT, smollm2_set  # noqa: E402
from pytest_modeldiff import compare  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="HF folder (default: the SmolLM2 fixture's)")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    args = parser.parse_args()
    model = Path(args.model) if args.model else smollm2_set() / "SmolLM2-135M-Instruct"
    print(f"{model}: reference in each dtype vs the same checkpoint in float32 (hf runner), "
          f"{args.rows} x {args.length} tokens of {EVAL_TEXT.name}")
    print("| reference dtype | KLD mean | KLD p99 | KLD max | same top-1 | max abs diff | seconds |")
    print("|---|---|---|---|---|---|---|")
    for dtype in ("float32", "bfloat16", "float16"):
        t0 = time.perf_counter()
        report = compare(model, model, checks=["kld"], ref_dtype=dtype, cand_runner="hf",
                         eval_text=EVAL_TEXT, eval_rows=args.rows, eval_length=args.length, ref_cache=None)
        cmp = next(iter(report)).comparison
        kld, q = cmp.stats.kld, cmp.quality
        print(f"| {dtype} | {kld.mean():.3g} | {float(sorted(kld)[int(0.99 * (len(kld) - 1))]):.3g} | "
              f"{kld.max():.3g} | {100 * q.agreement[0]:.2f} % | {cmp.stats.max_abs.max():.3g} | "
              f"{time.perf_counter() - t0:.1f} |")


if __name__ == "__main__":
    main()
