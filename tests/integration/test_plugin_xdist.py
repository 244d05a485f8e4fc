"""pytest-xdist: candidates spread over workers (-n 2 --dist loadgroup) that share one reference
cache; the cache's file lock makes the first worker compute the reference and the others read it."""
import shutil

import pytest

pytest.importorskip("xdist")

# every reference pass in any worker appends its pid here
CONFTEST = """
import os
from pytest_modeldiff.engine.store import ReferenceStore

real = ReferenceStore.run.__func__

def logged(cls, *args, **kwargs):
    with open(os.environ["REF_RUNS"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    return real(cls, *args, **kwargs)

ReferenceStore.run = classmethod(logged)
"""


def test_workers_share_one_reference_pass(pytester, demo_ref, demo_cand, tmp_path, monkeypatch):
    candidates = []
    for name in ("a-q8_0", "b-q8_0"):  # one candidate per worker
        shutil.copy(demo_cand, tmp_path / f"{name}.gguf")
        candidates.append(f"--cand-model={tmp_path / name}.gguf")
    runs = tmp_path / "ref-runs.txt"
    monkeypatch.setenv("REF_RUNS", str(runs))
    pytester.makeconftest(CONFTEST)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", f"--ref-model={demo_ref}", *candidates,
        "--modeldiff-checks=kld,tokens", f"--modeldiff-ref-cache={tmp_path / 'cache'}", "--eval-length=32", "-v")
    result.assert_outcomes(passed=4)
    # both workers took a candidate; fnmatch_lines would also demand an order, which is the scheduler's
    passed_by = {line.split("]")[0].lstrip("[")
                 for line in result.outlines if line.startswith("[gw") and "PASSED" in line}
    assert passed_by == {"gw0", "gw1"}, result.outlines
    assert len(runs.read_text().split()) == 1, "the reference ran once, in one worker"
    assert len(list((tmp_path / "cache").glob("*.mdref"))) == 1
