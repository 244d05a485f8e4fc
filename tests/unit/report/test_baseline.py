"""Baselines: tolerance expressions, the comparison's direction, environment differences, and the
baseline file's reader (the plugin's save / compare round trip: tests/integration/test_plugin_baseline.py)."""
import json

import pytest

from pytest_modeldiff.errors import ModelDiffError, ModelDiffUsageError
from pytest_modeldiff.report.baseline import (
    Tolerance,
    baseline_from_report,
    compare,
    environment_differences,
    load_baseline,
    parse_tolerances,
)


def test_tolerances_parse_percent_and_absolute():
    assert parse_tolerances(["kld:10%", "ppl_ratio:0.002,same_top:1%"]) == [
        Tolerance("kld", 0.1, True, "kld:10%"), Tolerance("ppl_ratio", 0.002, False, "ppl_ratio:0.002"),
        Tolerance("same_top", 0.01, True, "same_top:1%")]


@pytest.mark.parametrize("expression, message", [
    ("kld", "'kld': expected METRIC:AMOUNT"), ("kld:ten%", "'kld:ten%'"), ("kld:-1", "'kld:-1'"),
    ("klx:10%", "'klx:10%': unknown metric 'klx'"), ("tokens:1", "unknown metric 'tokens'"),
])
def test_malformed_expressions_are_usage_errors_naming_them(expression, message):
    with pytest.raises(ModelDiffUsageError, match=f"--modeldiff-compare-fail: .*{message}"):
        parse_tolerances([expression])


def test_worse_follows_the_metric_direction():
    tolerances = parse_tolerances(["kld:10%", "same_top:0.01"])
    base = {"kld": 0.1, "same_top": 0.9}
    ok = compare({"kld": 0.109, "same_top": 0.891}, base, tolerances)
    assert [c.passed for c in ok] == [True, True]
    assert ok[0].worse_by == pytest.approx(0.009) and ok[1].worse_by == pytest.approx(0.009)
    bad = compare({"kld": 0.111, "same_top": 0.95}, base, tolerances)
    assert [c.passed for c in bad] == [False, True] and bad[1].worse_by == pytest.approx(-0.05)  # better is fine
    missing = compare({}, base, tolerances[:1])
    assert missing[0].passed is False
    assert compare({"kld": float("nan")}, base, tolerances[:1])[0].passed is False


def test_environment_differences_name_the_key():
    then = {"versions": {"torch": "2.13.0"}, "settings": {"eval_length": 256}, "models_sha256": {"reference": "a"}}
    now = {"versions": {"torch": "2.14.0"}, "settings": {"eval_length": 256}, "models_sha256": {"reference": "b"}}
    assert environment_differences(now, then) == ["versions torch: baseline '2.13.0', now '2.14.0'",
                                                  "models_sha256 reference: baseline 'a', now 'b'"]


def test_load_baseline_names_the_file_and_problem(tmp_path):
    with pytest.raises(ModelDiffError, match="missing.json: baseline file not found"):
        load_baseline(tmp_path / "missing.json")
    (tmp_path / "other.json").write_text(json.dumps({"format": "pytest-modeldiff report v2"}))
    with pytest.raises(ModelDiffError, match="other.json: not a pytest-modeldiff baseline"):
        load_baseline(tmp_path / "other.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ModelDiffError, match="bad.json: not a readable baseline"):
        load_baseline(tmp_path / "bad.json")


def valid_baseline() -> dict:
    return {"format": "pytest-modeldiff baseline v1", "created": "2025-01-01T00:00:00Z",
            "environment": {"versions": {"torch": "2.13.0"}, "settings": {},
                            "models_sha256": {"reference": "a"}},
            "reference": {"path": "r"},
            "candidates": {"c": {"quant_type": "Q8_0", "metrics": {"kld": 0.1, "nmse": "nan", "n": 3,
                                                                   "kl.ppl_ratio": None}}}}


def test_saved_baseline_loads_with_non_finite_values_as_floats(tmp_path):
    path = tmp_path / "base.json"
    path.write_text(json.dumps(valid_baseline()))
    metrics = load_baseline(path)["candidates"]["c"]["metrics"]
    assert metrics["kld"] == 0.1 and metrics["n"] == 3.0 and metrics["kl.ppl_ratio"] is None
    assert metrics["nmse"] != metrics["nmse"]  # nan, which no tolerance passes
    assert compare(metrics, metrics, parse_tolerances(["nmse:1%"]))[0].passed is False


def damaged(change):
    data = valid_baseline()
    change(data)
    return data


def kld_of(value):
    return damaged(lambda d: d["candidates"]["c"]["metrics"].update(kld=value))


@pytest.mark.parametrize("data, problem", [
    (damaged(lambda d: d.update(candidates=[])), r"candidates is \[\], expected an object of candidate"),
    (damaged(lambda d: d.update(candidates={"c": "x"})), "candidate 'c' has no metrics object"),
    (damaged(lambda d: d["candidates"]["c"].update(metrics=[1])), "candidate 'c' has no metrics object"),
    (kld_of("0.1"), "candidate 'c' metric 'kld' is '0.1', expected a number, null or one of nan, inf, -inf"),
    (kld_of([0.1]), "candidate 'c' metric 'kld' is \\[0.1\\]"),
    (kld_of(True), "candidate 'c' metric 'kld' is True"),
    (kld_of(10**400), "candidate 'c' metric 'kld' is 1000"),
    (damaged(lambda d: d.update(environment=[])), "environment is not an object of versions, settings and"),
    (damaged(lambda d: d["environment"].update(versions="2.13")), "environment is not an object of versions"),
    (damaged(lambda d: d.update(created=5)), "created is 5, expected a date string"),
])
def test_a_damaged_baseline_names_the_file_and_what_was_expected(tmp_path, data, problem):
    path = tmp_path / "base.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ModelDiffError, match=f"^{path}: damaged baseline: {problem}"):
        load_baseline(path)


@pytest.mark.parametrize("content, problem", [
    (b"[" * 100_000 + b"]" * 100_000, "not a readable baseline \\(RecursionError"),
    ('{"format": "caf\u00e9"}'.encode("latin-1"), "not a readable baseline \\(UnicodeDecodeError: 'utf-8'"),
    (b"[1]", "not a pytest-modeldiff baseline \\(format None, expected 'pytest-modeldiff baseline v1'\\)"),
    (b'{"format": [1]}', "not a pytest-modeldiff baseline \\(format \\[1\\], expected"),
])
def test_an_unreadable_baseline_is_a_one_line_error(tmp_path, content, problem):
    path = tmp_path / "base.json"
    path.write_bytes(content)
    with pytest.raises(ModelDiffError, match=f"^{path}: {problem}") as error:
        load_baseline(path)
    assert "\n" not in str(error.value)


def test_baseline_keeps_every_metric_of_a_report():
    report = {"environment": {"versions": {}}, "reference": {"path": "r"}, "candidates": [
        {"name": "c", "quant_type": "Q8_0", "metrics": {"kld": 0.1, "nmse": 0.2},
         "checks": [{"name": "kld", "value": 0.1}, {"name": "tokens", "value": None}],
         "kl_stats": {"ppl_ratio": 1.01, "kld": {"p99": 0.3}}},
        {"name": "broken", "error": "could not load"}]}
    base = baseline_from_report(report)
    assert base["candidates"] == {"c": {"quant_type": "Q8_0",
                                        "metrics": {"kld": 0.1, "nmse": 0.2, "kl.ppl_ratio": 1.01}}}
