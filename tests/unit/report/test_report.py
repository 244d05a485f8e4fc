"""Reports: the CSV holds the JSON's numbers (read back exactly), the summary shows both models'
next-token quality side by side."""
import csv
import json

from pytest_modeldiff import compare
from pytest_modeldiff.checks.registry import CHECKS
from pytest_modeldiff.report.data import CSV_COLUMNS


def number(cell: str):
    return None if cell == "" else float(cell)


def test_csv_parses_back_to_the_json_numbers(demo_ref, demo_cand, tmp_path):
    report = compare(demo_ref, demo_cand, eval_length=48, topk_max=3)
    report.write_json(tmp_path / "r.json")
    report.write_csv(tmp_path / "r.csv")
    data = json.loads((tmp_path / "r.json").read_text())["candidates"][0]
    with open(tmp_path / "r.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == CSV_COLUMNS
        rows = list(reader)
    assert {r["candidate"] for r in rows} == {"demo-q8_0"} and {r["quant_type"] for r in rows} == {"Q8_0"}

    checks = {c["name"]: c for c in data["checks"]}
    headline = {r["check"]: r for r in rows if r["check"] and r["metric"] == r["check"]}
    assert list(headline) == list(CHECKS)
    for name, row in headline.items():
        assert number(row["value"]) == checks[name]["value"], name
        assert number(row["threshold"]) == checks[name]["threshold"], name
        assert row["status"] == checks[name]["status"]

    layers = [r for r in rows if r["metric"] == "rfn"]
    expected = checks["layers"]["extra"]["layers"]
    assert [r["layer"] for r in layers] == [x["name"] for x in expected] == ["embd", "0", "1", "norm"]
    for row, layer in zip(layers, expected):
        assert (number(row["value"]), number(row["threshold"])) == (layer["rfn_mean"], layer["threshold"])

    tensors = [r for r in rows if r["metric"] == "weight_rel"]
    expected = checks["weights"]["extra"]["weights"]["tensors"]
    assert [r["tensor"] for r in tensors] == [t["name"] for t in expected] and len(tensors) == 20
    for row, tensor in zip(tensors, expected):
        assert (number(row["value"]), number(row["threshold"])) == (tensor["rel"], tensor["limit_rel"])
        assert row["layer"] == ("" if tensor["layer"] is None else str(tensor["layer"])) and row["status"] == "passed"

    q = data["quality"]
    quality = {r["metric"]: r for r in rows if not r["check"]}
    assert (number(quality["perplexity"]["reference"]),
            number(quality["perplexity"]["value"])) == (q["ref_ppl"], q["cand_ppl"])
    for k in (1, 2, 3):
        row = quality[f"top{k}_accuracy"]
        assert (number(row["reference"]), number(row["value"])) == (q["ref_accuracy"][k - 1], q["cand_accuracy"][k - 1])
        assert number(quality[f"top{k}_agreement"]["value"]) == q["agreement"][k - 1]
    assert "top4_accuracy" not in quality
    assert number(quality["prob_mse"]["value"]) == q["prob_mse"]


def test_summary_prints_both_models_side_by_side(demo_ref, demo_cand):
    report = compare(demo_ref, demo_cand, checks=["topk_acc_drop"], thresholds={"topk_acc_drop": 0.0}, eval_length=32)
    lines = str(report).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("next-token quality ("))
    assert lines[head].split("|")[1:] == [" reference ", " candidate ", " change"]
    assert lines[head + 2].startswith("perplexity ") and lines[head + 3].startswith("top-1 accuracy ")
    assert any(line.startswith("top-5 agreement (ordered)") for line in lines)
