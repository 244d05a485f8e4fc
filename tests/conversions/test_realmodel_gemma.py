"""The second real-model tier: Gemma-3-270M from PyPI's chunk packages (fixtures/gemma.py: f32 HF
reference in transformers; llama.cpp's converter and quantizer; candidates in llama.cpp), run
through the plugin as a user runs it (fixtures/scoreboard.py), default thresholds, 4 x 256 tokens.
Gemma differs from the Llama-family SmolLM2 where conversions go wrong: RMSNorm weights stored as
1 + w, embeddings scaled by sqrt(n_embd), sliding-window layers with their own rope base, a
262,144-token vocabulary. Correct conversions pass every built-in check; each bug fails the check
that names it."""
import math
from types import SimpleNamespace

import pytest

from fixtures import scoreboard
from fixtures.gemma import BUG_QTYPES, GEMMA_BUGS, GEMMA_CONVERTED, GEMMA_QUANTIZED
from pytest_modeldiff.checks.registry import CHECKS

pytestmark = pytest.mark.realmodel
TIER = scoreboard.TIERS["gemma"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    report, markdown = scoreboard.run(tmp_path_factory.mktemp("gemma-scoreboard"), tier=TIER)
    return SimpleNamespace(candidates={c["name"]: c for c in report["candidates"]}, markdown=markdown)


def statuses(run, name: str) -> dict[str, str]:
    return {check["name"]: check["status"] for check in run.candidates[name]["checks"]}


@pytest.mark.parametrize("qtype", GEMMA_CONVERTED + GEMMA_QUANTIZED)
def test_correct_gemma_conversion_passes_every_check_with_defaults(run, qtype):
    result = statuses(run, f"gemma3-{qtype}")
    assert set(result) == set(CHECKS)
    assert {name: status for name, status in result.items() if status != "passed"} == {}


@pytest.mark.parametrize("bug", GEMMA_BUGS)
def test_gemma_bug_in_an_f16_conversion_fails_with_defaults(run, bug):
    failed = {name for name, status in statuses(run, f"broken-{bug}-f16").items() if status == "failed"}
    assert set(GEMMA_BUGS[bug]) <= failed, f"{bug}: expected {GEMMA_BUGS[bug]} to fail, failed: {failed}"


@pytest.mark.parametrize("qtype", [q for q in BUG_QTYPES if q != "f16"])
@pytest.mark.parametrize("bug", GEMMA_BUGS)
def test_gemma_bug_under_quantization_noise_fails_the_check_that_names_it(run, bug, qtype):
    failed = {name for name, status in statuses(run, f"broken-{bug}-{qtype}").items() if status == "failed"}
    assert GEMMA_BUGS[bug][0] in failed, f"{bug} in {qtype}: failed {failed}"


def test_readme_gemma_scoreboard_is_this_run(run):
    """README's Gemma table is what `python -m fixtures.scoreboard gemma` writes (same tolerances as
    SmolLM2's: means within 10 %, extremes within 50 %)."""
    fresh = [scoreboard.cells(line) for line in scoreboard.candidates_table(run.markdown)]
    readme = [scoreboard.cells(line) for line in scoreboard.readme_table(scoreboard.README.read_text(), TIER)]
    assert [row[0] for row in readme] == [row[0] for row in fresh], "rerun python -m fixtures.scoreboard gemma"
    for old, new in zip(readme[2:], fresh[2:]):
        for heading, a, b in zip(fresh[0], old, new):
            try:
                rel_tol = 0.5 if heading in scoreboard.TAIL_COLUMNS else 0.1
                same = math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=1e-4)
            except ValueError:
                same = a == b
            assert same, f"{new[0]} {heading}: README {a!r}, now {b!r}; rerun python -m fixtures.scoreboard gemma"
