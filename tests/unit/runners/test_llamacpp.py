"""The llama.cpp runner's load probe memo (the probe itself: tests/unit/formats/test_gguf_file.py)."""
import os
import shutil

import pytest

from pytest_modeldiff.errors import ModelDiffError
from pytest_modeldiff.formats import cache
from pytest_modeldiff.runners import llamacpp


def test_a_file_that_passed_the_probe_is_not_probed_again_until_it_changes(demo_cand, tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(llamacpp, "PROBE_MEMO", "probe.json")
    monkeypatch.setattr(llamacpp, "_PROBED", {})
    model = tmp_path / "m.gguf"
    shutil.copy(demo_cand, model)
    calls = []
    real_probe = llamacpp._run_probe
    monkeypatch.setattr(llamacpp, "_run_probe", lambda *args: calls.append(args) or real_probe(*args))
    assert llamacpp.probe_load(model, 0) is None
    assert (tmp_path / "cache" / "probe.json").exists() and len(calls) == 1
    monkeypatch.setattr(llamacpp, "_PROBED", {})  # a new process
    assert llamacpp.probe_load(model, 0) is None and len(calls) == 1, "remembered across processes"
    assert llamacpp.probe_load(model, -1) is None and len(calls) == 2, "offloaded is another load"
    monkeypatch.setattr(llamacpp, "_PROBED", {})
    os.utime(model, ns=(1, 1))  # another file at the same path
    assert llamacpp.probe_load(model, 0) is None and len(calls) == 3


def test_a_failed_probe_is_not_remembered(demo_cand, tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(llamacpp, "PROBE_MEMO", "probe.json")
    monkeypatch.setattr(llamacpp, "_PROBED", {})
    monkeypatch.setattr(llamacpp, "_run_probe", lambda *args: ("crashed", None))
    with pytest.raises(ModelDiffError, match="crashed"):
        llamacpp.probe_load(demo_cand, 0)
    assert not (tmp_path / "cache" / "probe.json").exists()
