"""Engine details: the shared reference store (memory or spill file) and the timings."""
import numpy as np

from pytest_modeldiff.engine import progress, store
from pytest_modeldiff.engine.modeldiff import ModelDiff


def run(ref, cand):
    md = ModelDiff(ref, [cand])
    try:
        cmp = md.compare("demo-q8_0")
        return cmp.stats, cmp.timings, md._ref_store.logits._spill is not None
    finally:
        md.close()


def test_reference_spilled_to_disk_gives_the_same_numbers(demo_ref, demo_cand, monkeypatch):
    in_memory, timings, was_spilled = run(demo_ref, demo_cand)
    assert not was_spilled
    monkeypatch.setattr(store.SpilledRows, "MEMORY_LIMIT", 1)
    spilled, _, was_spilled = run(demo_ref, demo_cand)
    assert was_spilled
    np.testing.assert_array_equal(in_memory.kld, spilled.kld)
    np.testing.assert_array_equal(in_memory.ref_top, spilled.ref_top)
    assert set(timings) == {"reference_forward_s", "reference_load_s", "candidate_forward_s",
                            "candidate_load_s", "comparison_s", "overhead_s"}
    assert timings["reference_load_s"] > 0 and timings["candidate_forward_s"] > 0
    assert 0 < timings["overhead_s"] < timings["comparison_s"]


def test_pace_reports_sequences_rate_and_eta(monkeypatch):
    from pytest_modeldiff.engine.evaldata import EvalSequence

    clock = iter([0.0, 2.0, 4.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    pace = progress.Pace([EvalSequence([0] * 100), EvalSequence([0] * 100), EvalSequence([0] * 200)])
    assert pace.step(100) == "sequence 1/3, 50 tokens/s, ETA 0:06"  # 300 tokens left at 50/s
    assert pace.step(100) == "sequence 2/3, 50 tokens/s, ETA 0:04"
