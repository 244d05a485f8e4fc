"""Every option, once: flag, ini key, parser, where its value goes, help text.

The pytest plugin (plugin/__init__.py) and the command line (__main__.py) build their parsers from
this table, so both take the same spellings and both --help texts describe every option. Parsers
run at option time (argparse reports a bad value with the flag's name); ini values go through the
same parsers. ``collect`` turns parsed values into the run's settings, once for both front ends.
Plain tables: nothing heavy is imported here (the plugin is loaded by every pytest run).
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .checks.registry import CHECKS, DEFAULT_GATE, GATES
from .errors import ModelDiffUsageError
from .runners import MODEL_ENV, RUNNERS


def at_least(low: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except (TypeError, ValueError):
            number = None
        if number is None or number < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value!r}")
        return number

    parse.__name__ = f"integer >= {low}"
    return parse


@dataclass(frozen=True)
class Option:
    flag: str
    help: str
    dest: str  # a Settings field when ``setting``, else a name the front ends read themselves
    parse: Callable[[str], Any] | None = None  # None: the string itself
    ini: str | None = None  # the ini twin (paths in it are relative to the ini file)
    metavar: str | None = None
    action: str | None = None  # "append" (repeatable), "extend" (several values), "store_true"
    choices: tuple[str, ...] | None = None
    setting: bool = True
    path: bool = False

    def argparse_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"dest": self.dest, "help": self.help}
        if self.action == "store_true":
            return {**kwargs, "action": "store_true", "default": None}
        if self.action in ("append", "extend"):
            kwargs.update(action=self.action, default=[])
            if self.action == "extend":
                kwargs["nargs"] = "+"
        if self.parse is not None:
            kwargs["type"] = self.parse
        if self.choices:
            kwargs["choices"] = self.choices
        if self.metavar:
            kwargs["metavar"] = self.metavar
        return kwargs


OPTIONS = (
    # the models
    Option("--ref-model", "reference model: HF folder, .gguf, logits dump, dump folder or .mdref cache "
           f"(default: ${MODEL_ENV['reference']})", "ref_model", metavar="PATH", setting=False),
    Option("--cand-model", "candidate model to check against the reference (repeatable; default: "
           f"${MODEL_ENV['candidate']})", "cand_model", metavar="PATH", action="append", setting=False),
    Option("--ref-runner", "runtime for the reference (default: from the path)", "ref_runner", choices=tuple(RUNNERS)),
    Option("--cand-runner", "runtime for the candidates (default: from the path)", "cand_runner",
           choices=tuple(RUNNERS)),
    # what they run on
    Option("--eval-text", "evaluate on this UTF-8 text instead of the built-in prompts", "eval_text",
           ini="modeldiff_eval_text", metavar="FILE", path=True),
    Option("--eval-dataset", "evaluate on a parquet dataset's text column", "eval_dataset", metavar="FILE.parquet",
           path=True),
    Option("--eval-column", "text column of --eval-dataset (default: text)", "eval_column", metavar="NAME"),
    Option("--eval-rows", "sequences cut from --eval-text/--eval-dataset (default 8)", "eval_rows", at_least(1),
           ini="modeldiff_eval_rows", metavar="N"),
    Option("--eval-length", "tokens per sequence (default 256)", "eval_length", at_least(2),
           ini="modeldiff_eval_length", metavar="N"),
    Option("--modeldiff-llama-perplexity-compat", "llama-perplexity's layout: --eval-text cut into --eval-length "
           "(n_ctx) chunks, BOS first, the second half scored, so the statistics match its --kl-divergence output",
           "llama_perplexity_compat", action="store_true"),
    # what is checked and how strictly
    Option("--modeldiff-checks", "built-in checks to run as tests, comma-separated, or 'none' (default: all of "
           f"{','.join(CHECKS)})", "checks", ini="modeldiff_checks", metavar="LIST", setting=False),
    Option("--modeldiff-threshold", "threshold for a check, e.g. kld=0.02 (repeatable; markers take precedence; "
           "ini: modeldiff_thresholds, one per line)", "thresholds", metavar="KEY=VALUE", action="append",
           setting=False),
    Option("--modeldiff-gate", "which default limits: 'broken' fails conversions that are wrong (loose, about 2x "
           "the worst correct conversion of the quant class; not a quality bar), 'quality' fails conversions worse "
           f"than a correct quantizer makes that class (default: {DEFAULT_GATE}; numbers in the README)", "gate",
           ini="modeldiff_gate", choices=tuple(GATES), setting=False),
    Option("--modeldiff-topk-max", "top-K accuracy and agreement for K = 1..K (default 5)", "topk_max", at_least(1),
           metavar="K"),
    Option("--modeldiff-keep-layers", "the candidate takes the reference's hidden state after its first K layers "
           "(torch candidates)", "keep_layers", at_least(0), metavar="K"),
    Option("--modeldiff-stream-layers", "models larger than RAM: run the reference one decoder layer at a time "
           "from its weight files (every check still runs)", "stream_layers", action="store_true"),
    Option("--modeldiff-checkpoint-dir", "where the streamed reference saves its progress (default: "
           "~/.cache/pytest-modeldiff/stream)", "checkpoint_dir", metavar="DIR", path=True),
    Option("--modeldiff-isolate", "isolated per-layer error of llama.cpp candidates (each layer fed the reference's "
           "input) from a gguf-torch pass over the same GGUF: auto (when the layers check fails), always, never "
           "(default auto)", "isolate", ini="modeldiff_isolate", choices=("auto", "always", "never")),
    Option("--modeldiff-attribution", "per-layer quality attribution: the KLD added by each layer's candidate weights "
           "alone (the reference with that one layer swapped for the candidate's dequantized layer); one forward "
           "pass per layer and sequence", "attribution", action="store_true"),
    Option("--modeldiff-long-context", "add one sequence of N tokens and report KLD by position bucket (sliding "
           "window, rope scaling and context bugs show only past a length); default: twice the model's sliding "
           "window if it has one, 0 turns it off", "long_context", at_least(0), ini="modeldiff_long_context",
           metavar="N"),
    # where it runs
    Option("--modeldiff-device", "device for torch runners and llama.cpp offload (default cpu)", "device",
           ini="modeldiff_device", choices=("cpu", "cuda")),
    Option("--ref-dtype", "precision of a torch reference: float32 when it fits the memory it may use, else the "
           "checkpoint's own 16-bit type (auto, the default), or float32, bfloat16, float16; the summary and JSON say "
           "which ran and why", "ref_dtype", ini="modeldiff_ref_dtype",
           choices=("auto", "float32", "bfloat16", "float16")),
    Option("--modeldiff-threads", "CPU threads per model (default: all cores)", "threads", at_least(1), metavar="N"),
    Option("--modeldiff-ref-cache", "reuse the reference's outputs from this cache folder (default: "
           "$MODELDIFF_REF_CACHE, else ~/.cache/pytest-modeldiff/reference; 'none' turns it off)", "ref_cache",
           metavar="DIR|none", setting=False),
    # what is written
    Option("--modeldiff-dump-dir", "write llama.cpp-compatible logit and token dumps here", "dump_dir",
           ini="modeldiff_dump_dir", metavar="DIR", path=True),
    Option("--modeldiff-json", "write every candidate's metrics, thresholds and verdicts", "json",
           ini="modeldiff_json", metavar="PATH", setting=False, path=True),
    Option("--modeldiff-csv", "the same numbers as CSV: a row per candidate and metric or layer", "csv",
           ini="modeldiff_csv", metavar="PATH", setting=False, path=True),
    Option("--modeldiff-markdown", "write a Markdown report (also appended to $GITHUB_STEP_SUMMARY when that is "
           "set)", "markdown", ini="modeldiff_markdown", metavar="PATH", setting=False, path=True),
    Option("--modeldiff-html", "write a self-contained HTML report with tables and plots", "html",
           ini="modeldiff_html", metavar="PATH", setting=False, path=True),
    Option("--modeldiff-report", "terminal summary: 'short' (the candidates table and, per failing candidate, what "
           "failed and why) or 'full' (also every check's table, per-layer and weight tables; -v implies full) "
           "(default: short)", "report", ini="modeldiff_report", choices=("short", "full"), setting=False),
    # baselines
    Option("--modeldiff-save-baseline", "save every metric, model hashes and versions", "save_baseline",
           metavar="FILE", setting=False),
    Option("--modeldiff-baseline", "compare with a saved baseline: one baseline item per candidate (see "
           "--modeldiff-compare-fail)", "baseline", metavar="FILE", setting=False),
    Option("--modeldiff-compare-fail", "fail the baseline item when METRIC got worse than the baseline by more "
           "than TOL (absolute, or a percentage of the baseline: kld:10%% ppl_ratio:0.002)", "compare_fail",
           ini="modeldiff_compare_fail", metavar="METRIC:TOL", action="extend", setting=False),
)
BY_DEST = {option.dest: option for option in OPTIONS}
THRESHOLDS_INI = "modeldiff_thresholds"  # a line list: KEY=VALUE per line


def add_to(add: Callable[..., Any]) -> None:
    """Declare every option with ``add(flag, **argparse kwargs)``: an argparse parser's
    add_argument or a pytest option group's addoption."""
    for option in OPTIONS:
        add(option.flag, **option.argparse_kwargs())


def collect(given: Callable[[Option], Any], ini: Callable[[Option], tuple[str, Path | None] | None]) -> dict:
    """Every option's value by ``dest``: the flag's (``given``), else its ini twin's (``ini`` gives
    the raw text and the folder its paths are relative to) run through the option's parser, else
    None (or [] for repeatable options). A bad ini value raises ModelDiffUsageError."""
    values: dict[str, Any] = {}
    for option in OPTIONS:
        value = given(option)
        if value in (None, []) and option.ini and (raw := ini(option)) is not None:
            text, base = raw
            value = _from_ini(option, text, base)
        if option.path and value not in (None, []) and not isinstance(value, Path):
            value = Path(value)
        values[option.dest] = [] if value is None and option.action in ("append", "extend") else value
    return values


def _from_ini(option: Option, text: str, base: Path | None) -> Any:
    if option.action == "extend":
        return text.split()
    if option.path:
        return (base / text) if base else Path(text)
    if option.choices and text not in option.choices:
        raise ModelDiffUsageError(f"ini {option.ini} (for {option.flag}): {text!r} is not one of "
                                  f"{', '.join(option.choices)}")
    if option.parse is None:
        return text
    try:
        return option.parse(text)
    except argparse.ArgumentTypeError as exc:
        raise ModelDiffUsageError(f"ini {option.ini} (for {option.flag}): {exc}") from None


def model_paths(values: dict) -> tuple[str | None, list[str]]:
    """--ref-model / --cand-model, else llama.cpp's model-conversion variables MODEL_PATH (the
    original model) and CONVERTED_MODEL (the GGUF), so its scripts' set-up works unchanged."""
    ref = values.get("ref_model") or os.environ.get(MODEL_ENV["reference"]) or None
    env_cand = os.environ.get(MODEL_ENV["candidate"])
    return ref, list(values.get("cand_model") or ([env_cand] if env_cand else []))


def require_models(values: dict) -> tuple[str, list[str]]:
    """Both sides, or a usage error that says which is missing and how to give it."""
    ref, candidates = model_paths(values)
    if ref and not candidates:
        named = "--ref-model" if values.get("ref_model") else f"{MODEL_ENV['reference']}={ref}"
        raise ModelDiffUsageError(f"{named} needs at least one --cand-model (or {MODEL_ENV['candidate']}) to "
                                  "compare against it")
    if candidates and not ref:
        named = "--cand-model" if values.get("cand_model") else f"{MODEL_ENV['candidate']}={candidates[0]}"
        raise ModelDiffUsageError(f"{named} needs a reference to compare against: give --ref-model PATH "
                                  f"(HF folder, .gguf, logits dump or .mdref cache) or set {MODEL_ENV['reference']}")
    if not ref:
        raise ModelDiffUsageError(f"give --ref-model PATH and --cand-model PATH (or set {MODEL_ENV['reference']} "
                                  f"and {MODEL_ENV['candidate']})")
    return ref, candidates


def settings_fields(values: dict, checks: list[str]) -> dict[str, Any]:
    """The Settings fields the options gave (the others keep Settings' defaults), plus what the
    chosen checks need the models to produce; no built-in check selected: user tests may need
    anything."""
    from .checks.registry import LOGIT_CHECKS
    from .formats.refcache import reference_cache_dir

    fields = {o.dest: values[o.dest] for o in OPTIONS if o.setting and values.get(o.dest) is not None}
    fields["logits"] = not checks or bool(set(checks) & set(LOGIT_CHECKS))
    fields["layers"] = not checks or "layers" in checks
    if checks and "long_context" not in checks:
        fields["long_context"] = 0  # its sequence is run for its check only
    fields["ref_cache"] = reference_cache_dir(values.get("ref_cache"))
    return fields
