"""The diagnosis options and helpers without models: option parsing, the long-context length
drawn from metadata, the long sequence, KLD by bucket and the long_context check's verdicts."""
import argparse
from types import SimpleNamespace

import numpy as np
import pytest

from pytest_modeldiff import options
from pytest_modeldiff.checks.long_context import check_long_context
from pytest_modeldiff.checks.results import FAILED, PASSED, SKIPPED
from pytest_modeldiff.checks.thresholds import Thresholds
from pytest_modeldiff.engine import diagnosis
from pytest_modeldiff.engine.evaldata import EvalSequence
from pytest_modeldiff.engine.settings import Settings
from pytest_modeldiff.errors import ModelDiffUsageError


def parse(*argv):
    parser = argparse.ArgumentParser()
    options.add_to(parser.add_argument)
    values = options.collect(lambda o: getattr(parser.parse_args(list(argv)), o.dest), lambda o: None)
    return Settings(**options.settings_fields(values, []))


def test_options_reach_the_settings():
    s = parse("--modeldiff-isolate", "never", "--modeldiff-attribution", "--modeldiff-long-context", "128")
    assert (s.isolate, s.attribution, s.long_context) == ("never", True, 128)
    s = parse()
    assert (s.isolate, s.attribution, s.long_context) == ("auto", False, None)
    with pytest.raises(ModelDiffUsageError, match="--modeldiff-isolate"):
        Settings(isolate="sometimes")
    with pytest.raises(ModelDiffUsageError, match="--modeldiff-long-context"):
        Settings(long_context=-1)


def test_long_context_runs_only_with_its_check():
    parser = argparse.ArgumentParser()
    options.add_to(parser.add_argument)
    values = options.collect(lambda o: getattr(parser.parse_args([]), o.dest), lambda o: None)
    assert options.settings_fields(values, ["kld"])["long_context"] == 0
    assert "long_context" not in options.settings_fields(values, ["kld", "long_context"])


def test_default_length_is_twice_the_sliding_window():
    assert diagnosis.default_long_context({"sliding_window": 512}, None) == (1024, "twice the sliding window 512")
    assert diagnosis.default_long_context({"n_layer": 4}, {"sliding_window": [0, 64, 64]})[0] == 128
    assert diagnosis.default_long_context({"sliding_window": 10**6})[0] == diagnosis.LONG_CAP
    assert diagnosis.default_long_context({"n_layer": 4}, None) == (0, "no sliding window in the metadata")


def test_long_sequence_repeats_the_ids_with_one_bos():
    seqs = [EvalSequence([1, 5, 6]), EvalSequence([1, 7])]
    assert diagnosis.long_sequence(seqs, 8, bos_id=1) == [1, 5, 6, 7, 5, 6, 7, 5]
    assert diagnosis.long_sequence(seqs, 4, bos_id=None) == [1, 5, 6, 1]


def test_bucket_kld_first_bucket_ends_at_the_window():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(64, 50)).astype(np.float32)
    cand = ref.copy()
    cand[32:] += rng.normal(size=(32, 50)).astype(np.float32)
    probe = diagnosis.bucket_kld(ref, cand, window=32)
    assert [(b["start"], b["stop"]) for b in probe["buckets"]] == [(0, 32), (32, 43), (43, 53), (53, 64)]
    assert probe["buckets"][0]["kld_mean"] < 1e-9 < 0.1 < min(b["kld_mean"] for b in probe["buckets"][1:])
    assert [(b["start"], b["stop"]) for b in diagnosis.bucket_kld(ref, cand)["buckets"]] == [
        (0, 16), (16, 32), (32, 48), (48, 64)]


def _cmp(probe, quant_class="f16"):
    return SimpleNamespace(long_context=probe, name="cand", error=None, quant_class=quant_class)


def _probe(*klds):
    n = len(klds)
    return {"length": 16 * n, "window": 16, "source": "test", "kld_mean": float(np.mean(klds)),
            "buckets": [{"start": 16 * i, "stop": 16 * (i + 1), "kld_mean": k, "kld_max": k}
                        for i, k in enumerate(klds)]}


@pytest.mark.parametrize("klds,status", [((1e-6, 2e-6, 3e-6), PASSED),  # clean everywhere
                                          ((1e-6, 0.5, 1.0), FAILED),  # late buckets degrade, early clean
                                          ((0.5, 0.6, 0.7), PASSED),  # bad from the start: the kld check's job
                                          ((1e-6, 5e-5, 9e-5), PASSED)])  # x90, but inside the kld limit
def test_long_context_verdicts(klds, status):
    th = Thresholds().resolve("f16")
    result = check_long_context(_cmp(_probe(*klds)), th["long_context_ratio"], th["kld"])
    assert result.status == status
    if status == FAILED:
        assert "degrades only past a length" in result.hint and "sliding window" in result.hint


def test_long_context_skipped_without_a_probe():
    th = Thresholds().resolve("f16")
    assert check_long_context(_cmp(None), th["long_context_ratio"], th["kld"]).status == SKIPPED
