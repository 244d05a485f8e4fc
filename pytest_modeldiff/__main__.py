"""Command line without pytest: the same engine, checks and report.

    python -m pytest_modeldiff --ref-model hf_model --cand-model model-q8_0.gguf [--json report.json]

--ref-model / --cand-model default to $MODEL_PATH / $CONVERTED_MODEL (llama.cpp's scripts).
Exit status: 0 all checks passed, 1 a check failed, 2 bad input or options.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .registry import CHECKS, RUNNERS, parse_check_list


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pytest_modeldiff", description=__doc__.split("\n\n")[0])
    env_ref, env_cand = os.environ.get("MODEL_PATH"), os.environ.get("CONVERTED_MODEL")
    p.add_argument("--ref-model", required=not env_ref, default=env_ref, metavar="PATH")
    p.add_argument("--cand-model", required=not env_cand, action="append", metavar="PATH")
    p.add_argument("--ref-runner", choices=RUNNERS)
    p.add_argument("--cand-runner", choices=RUNNERS)
    p.add_argument("--eval-text", type=Path, metavar="FILE")
    p.add_argument("--eval-dataset", type=Path, metavar="FILE.parquet")
    p.add_argument("--eval-column")
    p.add_argument("--eval-rows", type=int)
    p.add_argument("--eval-length", type=int)
    p.add_argument("--threshold", "--modeldiff-threshold", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--checks", default=",".join(CHECKS), help="comma-separated subset of: " + ", ".join(CHECKS))
    p.add_argument("--dump-dir", "--modeldiff-dump-dir", type=Path, metavar="DIR")
    p.add_argument("--json", "--modeldiff-json", type=Path, metavar="PATH")
    p.add_argument("--csv", "--modeldiff-csv", type=Path, metavar="PATH")
    p.add_argument("--topk-max", "--modeldiff-topk-max", type=int, metavar="K")
    p.add_argument("--device", "--modeldiff-device", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int)
    p.add_argument("--markdown", "--modeldiff-markdown", type=Path, metavar="PATH")
    p.add_argument("--html", "--modeldiff-html", type=Path, metavar="PATH")
    p.add_argument("--llama-perplexity-compat", "--modeldiff-llama-perplexity-compat", action="store_true",
                   default=None, help="llama-perplexity's chunks, BOS and scored second half")
    p.add_argument("--ref-cache", "--modeldiff-ref-cache", metavar="DIR|none",
                   help="reference cache folder (default: $MODELDIFF_REF_CACHE, else ~/.cache/pytest-modeldiff/reference)")
    args = p.parse_args(argv)
    args.cand_model = args.cand_model or [env_cand]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from .api import compare
    from .errors import ModelDiffError

    given = {k: v for k, v in dict(
        eval_text=args.eval_text, eval_dataset=args.eval_dataset, eval_column=args.eval_column,
        eval_rows=args.eval_rows, eval_length=args.eval_length, device=args.device, threads=args.threads,
        dump_dir=args.dump_dir, ref_runner=args.ref_runner, cand_runner=args.cand_runner,
        topk_max=args.topk_max, llama_perplexity_compat=args.llama_perplexity_compat).items() if v is not None}
    from .refcache import reference_cache_dir

    given["ref_cache"] = reference_cache_dir(args.ref_cache)
    try:
        from .thresholds import Thresholds

        report = compare(args.ref_model, args.cand_model, checks=parse_check_list(args.checks, "--checks"),
                         thresholds=Thresholds(args.threshold), progress=_progress(), **given)
    except ModelDiffError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{report}\n")
    if args.json:
        report.write_json(args.json)
    if args.csv:
        report.write_csv(args.csv)
    if args.markdown or args.html:
        from .pages import write_html, write_markdown

        data = report.to_json()
        if args.markdown:
            write_markdown(args.markdown, data)
        if args.html:
            write_html(args.html, data)
    if any(c.error for c in report):
        return 2
    return 0 if report.passed else 1


def _progress(every_s: float = 1.0):
    """Progress lines on stderr, at most one per ``every_s`` seconds."""
    last = [-every_s]

    def show(message: str) -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            print(f"modeldiff: {message}", file=sys.stderr)

    return show


if __name__ == "__main__":
    sys.exit(main())
