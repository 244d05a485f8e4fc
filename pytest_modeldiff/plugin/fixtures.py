"""The ``modeldiff`` fixture (assertion helpers per candidate, tests parametrized over the
candidates) and the ``@pytest.mark.modeldiff(**thresholds)`` marker."""
from __future__ import annotations

import pytest

from .session import SESSION


def marker_thresholds(item: pytest.Item) -> dict[str, float]:
    from ..checks.thresholds import validate
    from ..errors import ModelDiffUsageError

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
    state = request.config.stash.get(SESSION, None)
    if state is None:
        pytest.skip("pytest-modeldiff: no --ref-model given")
    from ..assertions import ModelDiffAssertions
    from ..formats.quant_types import quant_class

    key = modeldiff_candidate
    marker = marker_thresholds(request.node)
    limits = state.thresholds.resolve(quant_class(state.engine.candidates[key].quant_type()), marker)
    return ModelDiffAssertions(lambda: state.comparison(key), limits, weights=lambda: state.engine.weights(key))
