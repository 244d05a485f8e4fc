"""pytest hooks, options and fixtures - nothing else. Imports nothing heavy at import time:
the engine (and torch, transformers, llama_cpp behind it) loads only when --ref-model is given.

    pytest --ref-model path/to/hf_model --cand-model model-q8_0.gguf [--cand-model ...]
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

from .registry import CHECKS, LOGIT_CHECKS, RUNNERS, parse_check_list  # plain tables, no heavy imports

CHECK_NAMES = tuple(CHECKS)
RUNNER_NAMES = tuple(RUNNERS)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("modeldiff", "model conversion checks (pytest-modeldiff)")
    group.addoption("--ref-model", metavar="PATH",
                    help="reference model: HF folder, .gguf, logits dump or dump folder (default: $MODEL_PATH)")
    group.addoption("--cand-model", metavar="PATH", action="append", default=[],
                    help="candidate model to check against the reference (repeatable; default: $CONVERTED_MODEL)")
    group.addoption("--ref-runner", choices=RUNNER_NAMES, help="runtime for the reference (default: from the path)")
    group.addoption("--cand-runner", choices=RUNNER_NAMES, help="runtime for the candidates (default: from the path)")
    group.addoption("--eval-text", metavar="FILE", help="evaluate on this UTF-8 text instead of the built-in prompts")
    group.addoption("--eval-dataset", metavar="FILE.parquet", help="evaluate on a parquet dataset's text column")
    group.addoption("--eval-column", metavar="NAME", help="text column of --eval-dataset (default: text)")
    group.addoption("--eval-rows", type=int, metavar="N", help="sequences cut from --eval-text/--eval-dataset (default 8)")
    group.addoption("--eval-length", type=int, metavar="N", help="tokens per sequence (default 256)")
    group.addoption("--modeldiff-threshold", metavar="KEY=VALUE", action="append", default=[],
                    help="threshold for a check, e.g. kld=0.02 (repeatable; markers take precedence)")
    group.addoption("--modeldiff-checks", metavar="LIST",
                    help=f"built-in checks to run as tests, comma-separated, or 'none' (default: all of {','.join(CHECK_NAMES)})")
    group.addoption("--modeldiff-dump-dir", metavar="DIR", help="write llama.cpp-compatible logit and token dumps here")
    group.addoption("--modeldiff-json", metavar="PATH", help="write every candidate's metrics, thresholds and verdicts")
    group.addoption("--modeldiff-csv", metavar="PATH", help="the same numbers as CSV: a row per candidate and metric or layer")
    group.addoption("--modeldiff-topk-max", type=int, metavar="K",
                    help="top-K accuracy and agreement for K = 1..K (default 5)")
    group.addoption("--modeldiff-device", choices=("cpu", "cuda"), help="device for torch runners and llama.cpp offload")
    group.addoption("--modeldiff-threads", type=int, metavar="N", help="CPU threads per model (default: all cores)")
    group.addoption("--modeldiff-keep-layers", type=int, metavar="K",
                    help="the candidate takes the reference's hidden state after its first K layers (torch candidates)")
    group.addoption("--modeldiff-stream-layers", action="store_true", default=None,
                    help="per-layer comparison one decoder layer at a time from the weight files (models larger than RAM)")
    group.addoption("--modeldiff-checkpoint-dir", metavar="DIR",
                    help="where --modeldiff-stream-layers saves its progress (default: ~/.cache/pytest-modeldiff/stream)")
    group.addoption("--modeldiff-llama-perplexity-compat", action="store_true", default=None,
                    help="llama-perplexity's layout: --eval-text cut into --eval-length (n_ctx) chunks, BOS first, "
                         "the second half scored, so the statistics match its --kl-divergence output")
    group.addoption("--modeldiff-markdown", metavar="PATH",
                    help="write a Markdown report (also appended to $GITHUB_STEP_SUMMARY when that is set)")
    group.addoption("--modeldiff-html", metavar="PATH", help="write a self-contained HTML report with tables and plots")
    group.addoption("--modeldiff-save-baseline", metavar="FILE", help="save every metric, model hashes and versions")
    group.addoption("--modeldiff-baseline", metavar="FILE",
                    help="compare with a saved baseline: one baseline item per candidate (see --modeldiff-compare-fail)")
    group.addoption("--modeldiff-compare-fail", metavar="METRIC:TOL", nargs="+", action="extend", default=[],
                    help="fail the baseline item when METRIC got worse than the baseline by more than TOL "
                         "(absolute, or a percentage of the baseline: kld:10%% ppl_ratio:0.002)")
    group.addoption("--modeldiff-ref-cache", metavar="DIR|none",
                    help="reuse the reference's outputs from this cache folder (default: $MODELDIFF_REF_CACHE, "
                         "else ~/.cache/pytest-modeldiff/reference; 'none' turns it off)")
    parser.addini("modeldiff_thresholds", "KEY=VALUE thresholds, one per line", type="linelist", default=[])
    parser.addini("modeldiff_markdown", "default for --modeldiff-markdown", default="")
    parser.addini("modeldiff_html", "default for --modeldiff-html", default="")
    parser.addini("modeldiff_compare_fail", "default for --modeldiff-compare-fail", default="")
    parser.addini("modeldiff_checks", "built-in checks to run (comma-separated, or none)", default="")
    parser.addini("modeldiff_dump_dir", "default for --modeldiff-dump-dir", default="")
    parser.addini("modeldiff_json", "default for --modeldiff-json", default="")
    parser.addini("modeldiff_csv", "default for --modeldiff-csv", default="")
    parser.addini("modeldiff_device", "default for --modeldiff-device", default="")
    parser.addini("modeldiff_eval_text", "default for --eval-text", default="")
    parser.addini("modeldiff_eval_length", "default for --eval-length", default="")
    parser.addini("modeldiff_eval_rows", "default for --eval-rows", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "modeldiff(**thresholds): thresholds for this test's modeldiff assertions, "
                   "e.g. @pytest.mark.modeldiff(kld=0.01, top10=0.9)")
    ref, candidates = model_paths(config)
    if ref:
        config.stash[_STATE] = _State.from_config(config)
    elif candidates:
        given = "--cand-model" if config.getoption("--cand-model") else f"CONVERTED_MODEL={candidates[0]}"
        raise pytest.UsageError(f"{given} needs a reference to compare against: give --ref-model PATH "
                                "(HF folder, .gguf, logits dump or .mdref cache) or set MODEL_PATH")


def model_paths(config: pytest.Config) -> tuple[str | None, list[str]]:
    """--ref-model / --cand-model, else llama.cpp's model-conversion variables MODEL_PATH (the
    original model) and CONVERTED_MODEL (the GGUF), so its scripts' set-up works unchanged."""
    ref = config.getoption("--ref-model") or os.environ.get("MODEL_PATH") or None
    cands = config.getoption("--cand-model") or ([os.environ["CONVERTED_MODEL"]] if os.environ.get("CONVERTED_MODEL") else [])
    return ref, cands


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None:
        state.close()


class _State:
    """The run's ModelDiff engine plus the results reported at the end."""

    def __init__(self, config: pytest.Config, engine, checks: list[str]):
        self.config = config
        self.engine = engine
        self.checks = checks
        self.errors: dict[str, str] = {}  # candidate key -> why it could not be compared
        self.baseline: dict | None = None  # --modeldiff-baseline's content
        self.tolerances: list = []  # --modeldiff-compare-fail
        self._results: dict[tuple[str, str], object] = {}  # (candidate key, check) -> CheckResult
        self._last_progress = 0.0

    @classmethod
    def from_config(cls, config: pytest.Config) -> "_State":
        from .baseline import load_baseline, parse_tolerances
        from .engine import ModelDiff, Settings
        from .errors import ModelDiffError, ModelDiffUsageError
        from .refcache import reference_cache_dir
        from .thresholds import Thresholds

        def opt(name: str, ini: str | None = None, cast=str, is_path=False):
            """The option, else its ini twin (paths relative to the ini file), else None."""
            value, base = config.getoption(name), None
            if value is None and ini and config.getini(ini) not in ("", None):
                value, base = config.getini(ini), config.inipath.parent if config.inipath else None
            if value is None:
                return None
            if is_path:
                return base / value if base else Path(value)
            try:
                return cast(value)
            except ValueError:
                raise pytest.UsageError(f"{name} / ini {ini}: {value!r} is not a valid {cast.__name__}") from None

        def given(value, default):
            return default if value is None else value

        ref, candidates = model_paths(config)
        if not candidates:
            given = "--ref-model" if config.getoption("--ref-model") else f"MODEL_PATH={ref}"
            raise pytest.UsageError(f"{given} needs at least one --cand-model (or CONVERTED_MODEL) to compare against it")
        try:
            checks = parse_check_list(config.getoption("--modeldiff-checks") or config.getini("modeldiff_checks")
                                      or " ".join(CHECKS), "--modeldiff-checks")
            settings = Settings(
                eval_text=opt("--eval-text", "modeldiff_eval_text", is_path=True),
                eval_dataset=opt("--eval-dataset", is_path=True),
                eval_column=given(opt("--eval-column"), Settings.eval_column),
                eval_rows=given(opt("--eval-rows", "modeldiff_eval_rows", int), Settings.eval_rows),
                eval_length=given(opt("--eval-length", "modeldiff_eval_length", int), Settings.eval_length),
                device=given(opt("--modeldiff-device", "modeldiff_device"), Settings.device),
                threads=opt("--modeldiff-threads", cast=int),
                dump_dir=opt("--modeldiff-dump-dir", "modeldiff_dump_dir", is_path=True),
                ref_runner=config.getoption("--ref-runner"),
                cand_runner=config.getoption("--cand-runner"),
                # no built-in checks selected: user tests may need anything
                logits=not checks or bool(set(checks) & set(LOGIT_CHECKS)),
                layers=not checks or "layers" in checks,
                keep_layers=given(opt("--modeldiff-keep-layers", cast=int), Settings.keep_layers),
                stream_layers=bool(config.getoption("--modeldiff-stream-layers")),
                checkpoint_dir=opt("--modeldiff-checkpoint-dir", is_path=True),
                topk_max=given(opt("--modeldiff-topk-max", cast=int), Settings.topk_max),
                llama_perplexity_compat=bool(config.getoption("--modeldiff-llama-perplexity-compat")),
                ref_cache=reference_cache_dir(config.getoption("--modeldiff-ref-cache")),
            )
            if settings.device.startswith("cuda"):
                import torch

                if not torch.cuda.is_available():
                    raise ModelDiffError(f"--modeldiff-device cuda: torch {torch.__version__} sees no CUDA device; use cpu")
            state = cls(config, None, checks)
            state.tolerances = parse_tolerances(config.getoption("--modeldiff-compare-fail")
                                                or [config.getini("modeldiff_compare_fail")])
            baseline = config.getoption("--modeldiff-baseline")
            if state.tolerances and not baseline:
                raise ModelDiffUsageError("--modeldiff-compare-fail needs --modeldiff-baseline FILE to compare with")
            state.baseline = load_baseline(Path(baseline)) if baseline else None
            thresholds = Thresholds(config.getoption("--modeldiff-threshold"), config.getini("modeldiff_thresholds"))
            state.engine = ModelDiff(ref, candidates, settings, thresholds, state.progress)
            state.engine.prepare()
        except ModelDiffError as exc:
            raise pytest.UsageError(str(exc)) from None
        return state

    def progress(self, message: str) -> None:
        """At most one line every 2 s (always with -v): long runs show they are moving."""
        now = time.monotonic()
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and (self.config.option.verbose > 0 or now - self._last_progress > 2.0):
            self._last_progress = now
            # to the terminal, not into the running test's captured output
            capture = self.config.pluginmanager.get_plugin("capturemanager")  # None under -p no:capture
            with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                if reporter._tw.width_of_current_line and not reporter.currentfspath:  # -q: after bare dots
                    reporter._tw.line()
                reporter.write_line(f"modeldiff: {message}")

    def comparison(self, key: str):
        """The candidate's comparison. A failure is reported once - in full by the first test that
        needs it (one line for bad input), as one line by the others - and not retried."""
        from .errors import ModelDiffError

        if key not in self.errors:
            try:
                return self.engine.compare(key)
            except ModelDiffError as exc:
                self.errors[key] = str(exc)
            except Exception as exc:
                self.errors[key] = f"comparison failed: {type(exc).__name__}: {exc} (traceback in the first failing test)"
                raise
        pytest.fail(self.errors[key], pytrace=False)

    def subject(self, key: str, check: str):
        """What ``check`` reads: the weight files' diff (no model runs) or the full comparison."""
        return self.engine.weights(key) if CHECKS[check].reads == "weights" else self.comparison(key)

    def result(self, key: str, check: str):
        """One built-in check of one candidate (CLI > ini > default thresholds), computed once for
        its test item and the end-of-run summary and JSON."""
        from .checks import run_check

        if (key, check) not in self._results:
            subject = self.subject(key, check)
            self._results[key, check] = run_check(check, subject, self.engine.thresholds.resolve(subject.quant_class))
        return self._results[key, check]

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


_STATE = pytest.StashKey[_State]()


# ------------------------------------------------------------------------- built-in check items
class ModelDiffCheckFailed(Exception):
    """Carries the formatted table so repr_failure can show it without a traceback."""


class ModelDiffCandidate(pytest.Collector):
    def collect(self):
        return []


class ModelDiffItem(pytest.Item):
    def __init__(self, *, candidate: str, check: str, **kwargs):
        super().__init__(**kwargs)
        self.candidate = candidate
        self.check = check

    def runtest(self) -> None:
        from .checks import ERROR, FAILED, SKIPPED
        from .report import failure_message

        state = self.config.stash[_STATE]
        cmp = state.subject(self.candidate, self.check)
        result = state.result(self.candidate, self.check)
        self.user_properties += junit_properties(result, cmp)
        if result.status == SKIPPED:
            pytest.skip(f"modeldiff {self.check}: {result.reason}")
        if result.status == ERROR:
            pytest.fail(f"modeldiff {self.check} for {cmp.candidate.path}: {result.reason}", pytrace=False)
        if result.status == FAILED:
            raise ModelDiffCheckFailed(failure_message(result, cmp))

    def repr_failure(self, excinfo, style=None):
        if excinfo.errisinstance(ModelDiffCheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"modeldiff[{self.candidate}]::{self.check}"


def junit_properties(result, cmp) -> list[tuple[str, object]]:
    """What --junitxml records for a check item: its value, threshold and status, and on the kld
    item llama-perplexity's headline statistics."""
    props = [("modeldiff_candidate", cmp.name), ("modeldiff_status", result.status)]
    if result.value is not None:
        props.append((f"modeldiff_{result.name}", result.value))
    if result.threshold is not None and isinstance(result.threshold.value, float):
        props.append((f"modeldiff_{result.name}_threshold", result.threshold.value))
    kl = getattr(cmp, "kl_stats", None) if result.name == "kld" and cmp.stats is not None else None
    if kl is not None:
        props += [(f"modeldiff_{key}", getattr(kl, key)) for key in
                  ("ppl_ref", "ppl_cand", "ppl_ratio", "kld_mean", "same_top", "rms_dp")]
        props.append(("modeldiff_kld_p99", kl.kld["p99"]))
    return props


class ModelDiffBaselineFailed(ModelDiffCheckFailed):
    pass


class ModelDiffBaselineItem(ModelDiffItem):
    """The candidate's metrics against --modeldiff-baseline, with --modeldiff-compare-fail's tolerances."""

    def runtest(self) -> None:
        import warnings

        from .baseline import candidate_metrics, compare, environment_differences
        from .report import baseline_message, to_json

        state = self.config.stash[_STATE]
        then = state.baseline["candidates"].get(self.candidate)
        if then is None:
            pytest.skip(f"modeldiff baseline: {self.candidate} is not in the baseline "
                        f"(it holds {', '.join(state.baseline['candidates']) or 'no candidate'})")
        cmp = state.comparison(self.candidate)
        report = to_json({self.candidate: (cmp, [state.result(self.candidate, c) for c in state.checks])},
                         environment=state.engine.environment())
        differences = environment_differences(report["environment"], state.baseline.get("environment", {}))
        if differences:
            warnings.warn(ModelDiffEnvironmentWarning(
                f"modeldiff baseline: the environment differs from the baseline's: {'; '.join(differences[:8])}"))
        changes = compare(candidate_metrics(report["candidates"][0]), then["metrics"], state.tolerances)
        for change in changes:
            self.user_properties.append((f"modeldiff_baseline_{change.metric}", change.baseline))
        if not all(c.passed for c in changes):
            raise ModelDiffBaselineFailed(baseline_message(cmp, changes, state.baseline, differences))


class ModelDiffEnvironmentWarning(pytest.PytestWarning):
    """The baseline was recorded with other library versions, settings or model files."""


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselection sees the item list
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    state = config.stash.get(_STATE, None)
    if state is None or not state.checks:
        return
    for key, runner in state.engine.candidates.items():
        # "modeldiff[<candidate>]" stands where a test file would in pytest's progress output
        parent = ModelDiffCandidate.from_parent(session, name=f"modeldiff[{key}]", nodeid=f"modeldiff[{key}]",
                                                path=runner.path.resolve())
        items.extend(ModelDiffItem.from_parent(parent, name=check, candidate=key, check=check)
                     for check in state.checks)
        if state.baseline is not None:
            items.append(ModelDiffBaselineItem.from_parent(parent, name="baseline", candidate=key, check="baseline"))


def pytest_report_collectionfinish(config: pytest.Config, items: list) -> str | None:
    """pytest's "collected N items" counts test files only; say what the plugin added."""
    state = config.stash.get(_STATE, None)
    if state is None:
        return None
    ours = sum(isinstance(item, ModelDiffItem) for item in items)
    names = ", ".join(state.engine.candidates)
    return (f"modeldiff: reference {state.engine.reference.path} ({state.engine.reference.kind}); "
            f"candidates: {names}; {ours} built-in check items")


# ------------------------------------------------------------------------- fixtures and markers
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    state = metafunc.config.stash.get(_STATE, None)
    if "modeldiff" in metafunc.fixturenames and state is not None:
        keys = list(state.engine.candidates)
        metafunc.parametrize("modeldiff_candidate", keys, ids=keys, indirect=True)


def _marker_thresholds(item: pytest.Item) -> dict[str, float]:
    from .errors import ModelDiffUsageError
    from .thresholds import validate

    merged: dict[str, object] = {}
    for marker in reversed(list(item.iter_markers("modeldiff"))):  # closest marker wins
        if marker.args:
            pytest.fail(f"@pytest.mark.modeldiff on {item.nodeid} takes keyword thresholds only "
                        f"(e.g. kld=0.01), got positional {marker.args!r}", pytrace=False)
        merged.update(marker.kwargs)
    try:
        return validate(merged, f"@pytest.mark.modeldiff on {item.nodeid}")
    except ModelDiffUsageError as exc:
        pytest.fail(str(exc), pytrace=False)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("modeldiff") is None:
        return
    _marker_thresholds(item)  # a typo fails here, with or without --ref-model
    if _STATE not in item.config.stash:
        pytest.skip("pytest-modeldiff: no --ref-model given")


@pytest.fixture
def modeldiff_candidate(request: pytest.FixtureRequest) -> str | None:
    """Key of the candidate this test instance checks (the test is parametrized per --cand-model)."""
    return getattr(request, "param", None)


@pytest.fixture
def modeldiff(request: pytest.FixtureRequest, modeldiff_candidate: str | None):
    """Assertion helpers over the reference-vs-candidate comparison (one instance per candidate).

    modeldiff.assert_tokens_equal(), .assert_kld(max=None), .assert_nmse(), .assert_topk_overlap(k=10),
    .assert_same_top(), .assert_max_abs(), .assert_vocab_equal(), .assert_metadata_equal(),
    .assert_layer_rfn(max=None or {"0-3": 0.02, "*": 0.05}), .assert_prob_mse(max=None),
    .assert_topk_accuracy(max_drop=None), .assert_weights_close(rel=None, cos=None, gain=None);
    .comparison holds the raw per-position numbers, .comparison.quality both models' perplexity and
    top-K accuracy, .weights the tensor-by-tensor diff. Thresholds: marker > CLI > ini > default.
    The models run at the first assertion that needs them (assert_weights_close needs none).
    """
    state = request.config.stash.get(_STATE, None)
    if state is None:
        pytest.skip("pytest-modeldiff: no --ref-model given")
    from .assertions import ModelDiffAssertions
    from .registry import quant_class

    key = modeldiff_candidate
    marker = _marker_thresholds(request.node)
    limits = state.engine.thresholds.resolve(quant_class(state.engine.candidates[key].quant_type()), marker)
    return ModelDiffAssertions(lambda: state.comparison(key), limits, weights=lambda: state.engine.weights(key))


# ------------------------------------------------------------------------- reporting
def _all_results(state: _State) -> dict:
    """The built-in checks (--modeldiff-checks, all if none) of every candidate, with CLI > ini >
    default thresholds (markers belong to the tests that carry them): the checks whose input was
    computed during the run - nothing new is read or run for the summary."""
    names = state.checks or list(CHECKS)
    comparisons, weights = state.engine.computed(), state.engine.computed_weights()
    out = {}
    for key in state.engine.candidates:
        done = [n for n in names if key in (weights if CHECKS[n].reads == "weights" else comparisons)]
        if done:
            out[key] = (comparisons.get(key) or weights[key], [state.result(key, name) for name in done])
    return out


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is None or not (state.engine.computed() or state.engine.computed_weights() or state.errors):
        return
    from .atomic import write_atomic
    from .baseline import baseline_from_report
    from .pages import markdown_report, write_html
    from .report import candidate_table, summary, to_json, write_csv, write_json, write_layer_plots

    results = _all_results(state)
    terminalreporter.section("modeldiff summary (built-in checks; thresholds from CLI > ini > default)")
    for key, (cmp, checks) in results.items():
        for line in summary(cmp, checks, state.errors.get(key)):
            terminalreporter.write_line(line)
        terminalreporter.write_line("")
    for key, message in state.errors.items():
        terminalreporter.write_line(f"{key}: not compared: {message}", red=True)
    data = to_json(results, state.errors, state.engine.environment())
    if any(c.get("kl_stats") for c in data["candidates"]):
        terminalreporter.write_line("candidates (KL columns: llama-perplexity's statistics over the next tokens):")
        for line in candidate_table(data):
            terminalreporter.write_line(line)

    def written(option: str, ini: str | None, kind: str, write) -> None:
        path = config.getoption(option) or (config.getini(ini) if ini else None)
        if path:
            write(Path(path), data)
            terminalreporter.write_line(f"modeldiff: {kind} written to {os.path.abspath(path)}")

    def json_and_plots(path: Path, data: dict) -> None:
        write_json(path, data)
        for plot in write_layer_plots(results, path):
            terminalreporter.write_line(f"modeldiff: per-layer plot written to {os.path.abspath(plot)}")

    def markdown(path: Path, data: dict) -> None:
        text = markdown_report(data)
        write_atomic(path, text)
        if os.environ.get("GITHUB_STEP_SUMMARY"):  # GitHub Actions shows it on the run's page
            with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as summary_file:
                summary_file.write(text + "\n")

    def baseline(path: Path, data: dict) -> None:
        write_json(path, baseline_from_report(data))

    written("--modeldiff-json", "modeldiff_json", "JSON report", json_and_plots)
    written("--modeldiff-csv", "modeldiff_csv", "CSV report", write_csv)
    written("--modeldiff-markdown", "modeldiff_markdown", "Markdown report", markdown)
    written("--modeldiff-html", "modeldiff_html", "HTML report", write_html)
    written("--modeldiff-save-baseline", None, "baseline", baseline)
