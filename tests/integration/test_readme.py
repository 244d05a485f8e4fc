"""The README's examples run, and its check table is the registry's."""
import re
from pathlib import Path

from pytest_modeldiff.checks.registry import CHECKS, HIGHER, LOWER
from pytest_modeldiff.formats.quant_types import QUANT_CLASSES, TENSOR_TYPE_ERROR, TENSOR_TYPE_GAIN, weight_limits

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
CLASSES = [c for c in QUANT_CLASSES if c != "q1"]  # q1 takes q2's limits


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README, re.S)


def test_check_table_matches_registry():
    table = README.split("<!-- checks-table")[1].split("<!-- end checks-table -->")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith(("| check", "| ---"))]
    assert [r.split("|")[1].strip() for r in rows] == list(CHECKS)
    for row in rows:
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        check = CHECKS[cells[0]]
        assert cells[1] == check.title.replace("\\|", "|")
        assert cells[2] == {LOWER: "<=", HIGHER: ">="}.get(check.direction, "equal")
        if check.has_threshold and check.defaults:
            assert [float(c) for c in cells[3:]] == [check.defaults[c] for c in CLASSES], cells[0]
        elif check.has_threshold:  # judged per tensor type: the weight-types table
            assert cells[3:] == ["per tensor type (below)"] + [""] * (len(CLASSES) - 1), cells[0]


def quality_table() -> list[str]:
    """The README's quality-gate table, from the registry."""
    from pytest_modeldiff.checks.registry import QUALITY_CHECKS

    rows = ["| check | pass if | " + " | ".join(CLASSES) + " |", "| --- " * (len(CLASSES) + 2) + "|"]
    for name in QUALITY_CHECKS:
        check = CHECKS[name]
        rows.append(f"| {name} | {'<=' if check.direction == LOWER else '>='} | "
                    + " | ".join(f"{check.quality[c]:g}" for c in CLASSES) + " |")
    return rows


def quality_measured_table() -> list[str]:
    """The README's table of the measurements the quality gate is derived from."""
    from pytest_modeldiff.checks.registry import QUALITY_CHECKS, QUALITY_MEASURED

    rows = ["| model, text | class | " + " | ".join(QUALITY_CHECKS) + " |", "| --- " * (len(QUALITY_CHECKS) + 2) + "|"]
    for source, by_class in QUALITY_MEASURED.items():
        rows += [f"| {source} | {quant} | " + " | ".join(f"{values[k]:.4g}" for k in QUALITY_CHECKS) + " |"
                 for quant, values in by_class.items()]
    return rows


def readme_block(name: str) -> list[str]:
    return [line for line in README.split(f"<!-- {name}:")[1].split(f"<!-- end {name} -->")[0].splitlines()
            if line.startswith("|")]


def test_quality_gate_tables_match_registry():
    assert readme_block("quality-table") == quality_table()
    assert readme_block("quality-measured") == quality_measured_table()


def test_quality_gate_is_never_looser_than_broken():
    for check in CHECKS.values():
        for quant, value in check.quality.items():
            assert (value <= check.defaults[quant]) if check.direction == LOWER else (value >= check.defaults[quant])


def test_weight_type_table_matches_registry():
    table = README.split("<!-- weight-types")[1].split("<!-- end weight-types -->")[0]
    head, _, values = [line for line in table.splitlines() if line.startswith("| ")]
    types = [c.strip() for c in head.split("|")[2:-1]]
    assert types == [t for t in TENSOR_TYPE_ERROR if t != "F64"]
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", values)[2:-1]]
    assert [float(c) for c in cells] == [TENSOR_TYPE_ERROR[t] for t in types]


def test_weight_gain_table_matches_registry():
    table = README.split("<!-- weight-gains")[1].split("<!-- end weight-gains -->")[0]
    head, _, measured, limit = [line for line in table.splitlines() if line.startswith("| ")]
    types = [c.strip() for c in head.split("|")[2:-1]]
    assert types == [t for t in TENSOR_TYPE_ERROR if t in TENSOR_TYPE_GAIN]
    assert [float(c) for c in re.split(r"(?<!\\)\|", measured)[2:-1]] == [TENSOR_TYPE_GAIN[t] for t in types]
    limits = [float(f"{weight_limits('F32', t).gain:.3g}") for t in types]
    assert [float(c) for c in re.split(r"(?<!\\)\|", limit)[2:-1]] == limits


def run_example(pytester, demo_ref, demo_cand, marker: str, module: str, extra: str = ""):
    """The README's python block containing ``marker`` as a test module, run on the demo pair."""
    example = next(b for b in python_blocks() if marker in b)
    pytester.makepyfile(**{module: example + extra})
    return pytester.runpytest("-p", "no:cacheprovider", f"--ref-model={demo_ref}", f"--cand-model={demo_cand}",
                              "--modeldiff-checks=none")


def test_weights_example_runs(pytester, demo_ref, demo_cand):
    result = run_example(pytester, demo_ref, demo_cand, "def test_weights(modeldiff)", "test_readme_weights_example")
    result.assert_outcomes(passed=2)


def test_fixture_and_marker_example_runs(pytester, demo_ref, demo_cand):
    result = run_example(pytester, demo_ref, demo_cand, "def test_quality(modeldiff)", "test_my_conversion")
    result.assert_outcomes(passed=2)


def test_layer_marker_example_runs(pytester, demo_ref, demo_cand):
    result = run_example(pytester, demo_ref, demo_cand, "def test_layers(modeldiff)", "test_readme_layer_example",
                         "\n\n@pytest.mark.modeldiff(rfn={'0-3': 1e-6, '*': 0.05})\n"
                         "def test_too_tight(modeldiff):\n    modeldiff.assert_layer_rfn()\n")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*first state over its limit: layer 0 (rfn * > 1.000e-06 from marker)*"])


def test_python_api_example_runs(capsys):
    example = next(b for b in python_blocks() if "from pytest_modeldiff import ModelDiff" in b)
    exec(compile(example, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "kld passed" in out and "tokens passed" in out


def test_compare_example_runs(capsys, tmp_path, monkeypatch):
    example = next(b for b in python_blocks() if "from pytest_modeldiff import compare" in b)
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)  # it writes report.csv
    exec(compile(example.replace('"fixtures/', f'"{root}/fixtures/'), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("True ") and "next-token quality" in out and "all checks passed" in out
    assert (tmp_path / "report.csv").read_text().startswith("candidate,quant_type,check,metric,layer,")


def test_every_option_the_readme_names_exists():
    import pytest_modeldiff.options as options  # every option, once (the plugin and the CLI build on it)

    source = Path(options.__file__).read_text()
    named = set(re.findall(r"`(--(?:modeldiff|eval|ref|cand)-[a-z-]+)", README))
    assert named and {o for o in named if f'"{o}"' not in source} == set()


def test_setup_commands_name_the_demo_pair_and_the_suite():
    """Two commands, each making a fresh virtual environment; CI runs the second from the README."""
    commands = [line.strip() for line in README.split("## Set-up")[1].split("## Usage")[0].splitlines()
                if line.startswith("    python3 -m venv")]
    assert len(commands) == 2
    assert all(". .venv/bin/activate && pip install torch==2.13.0 && " in command for command in commands)
    assert "--ref-model=fixtures/demo/hf" in commands[0] and "--cand-model=fixtures/demo/demo-q8_0.gguf" in commands[0]
    assert commands[1].endswith('pip install -e ".[test]" && pytest')
    ci = Path(__file__).resolve().parents[2].joinpath(".ci/run").read_text()
    pattern = re.search(r"grep -E '(.+?)' README\.md", ci).group(1)
    assert [c for c in commands if re.match(pattern, "    " + c)] == [commands[1]]
