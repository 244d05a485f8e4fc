"""Command line without pytest: the same engine, checks and report.

    python -m pytest_modeldiff --ref-model hf_model --cand-model model-q8_0.gguf [--json report.json]

Exit status: 0 all checks passed, 1 a check failed, 2 bad input or options.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .registry import CHECKS, RUNNERS, parse_check_list


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pytest_modeldiff", description=__doc__.split("\n\n")[0])
    p.add_argument("--ref-model", required=True, metavar="PATH")
    p.add_argument("--cand-model", required=True, action="append", metavar="PATH")
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
    p.add_argument("--device", "--modeldiff-device", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from .checks import FAILED, run_check
    from .compare import ModelDiff, Settings
    from .errors import ModelDiffError
    from .report import failure_message, summary, to_json, write_json
    from .thresholds import Thresholds

    given = {k: v for k, v in dict(
        eval_text=args.eval_text, eval_dataset=args.eval_dataset, eval_column=args.eval_column,
        eval_rows=args.eval_rows, eval_length=args.eval_length, device=args.device, threads=args.threads,
        dump_dir=args.dump_dir, ref_runner=args.ref_runner, cand_runner=args.cand_runner).items() if v is not None}
    engine = None
    try:
        names = parse_check_list(args.checks, "--checks")
        engine = ModelDiff(args.ref_model, args.cand_model, Settings(**given), Thresholds(args.threshold),
                           progress=lambda message: print(f"modeldiff: {message}", file=sys.stderr))
        reports, failed = {}, False
        for key in engine.candidates:
            cmp = engine.compare(key)
            results = [run_check(n, cmp, engine.thresholds.resolve(cmp.quant_class)) for n in names]
            reports[key] = (cmp, results)
            print("\n".join(summary(cmp, results)) + "\n")
            for result in results:
                if result.status == FAILED:
                    failed = True
                    print(failure_message(result, cmp) + "\n")
        if args.json:
            write_json(args.json, to_json(reports))
    except ModelDiffError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if engine is not None:
            engine.close()  # models and the reference spill file, also on Ctrl-C
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
