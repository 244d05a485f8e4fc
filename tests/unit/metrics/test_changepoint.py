"""The change point of an rfn profile (metrics/layers.py departures) and the suspect layer it
gives with weight evidence (checks/layers.py), on rfn profiles measured on SmolLM2-135M f16
conversions in llama.cpp (built-in prompts) with one tensor of layer 9 scaled."""
import numpy as np
import pytest

from pytest_modeldiff.checks.layers import _suspect
from pytest_modeldiff.metrics.layers import DEPARTS, LayerStats, departures, isolated_departures, state_names

# states: embd, layers 0..29, norm
GOOD_F16 = [0.000205, 0.000398, 0.000369, 0.000434, 0.000452, 0.000474, 0.00049, 0.000507, 0.000523, 0.000551,
            0.000754, 0.000736, 0.000254, 0.000254, 0.000255, 0.000256, 0.000256, 0.000257, 0.000258, 0.000259,
            0.000261, 0.000262, 0.000265, 0.00027, 0.000276, 0.000282, 0.000287, 0.000295, 0.00031, 0.000819,
            0.00107, 0.000933]
ATTN_V9 = [0.000205, 0.000398, 0.000369, 0.000434, 0.000452, 0.000474, 0.00049, 0.000507, 0.000523, 0.000551,
           0.0121, 0.0127, 0.00105, 0.00106, 0.00108, 0.00111, 0.00112, 0.00116, 0.00119, 0.00121, 0.00127, 0.00133,
           0.00143, 0.00155, 0.00172, 0.00185, 0.00201, 0.00219, 0.0024, 0.00589, 0.00868, 0.0105]
ATTN_NORM9 = [0.000205, 0.000398, 0.000369, 0.000434, 0.000452, 0.000474, 0.00049, 0.000507, 0.000523, 0.000551,
              0.0131, 0.0137, 0.000893, 0.000907, 0.000927, 0.000951, 0.000969, 0.00101, 0.00103, 0.00106, 0.00112,
              0.00119, 0.00129, 0.00142, 0.00161, 0.00176, 0.00192, 0.00211, 0.00234, 0.00547, 0.00831, 0.0108]
FFN_DOWN9 = [0.000205, 0.000398, 0.000369, 0.000434, 0.000452, 0.000474, 0.00049, 0.000507, 0.000523, 0.000551,
             0.0081, 0.00628, 0.00616, 0.00616, 0.00616, 0.00617, 0.00617, 0.00617, 0.00618, 0.00618, 0.00618,
             0.00617, 0.00617, 0.00616, 0.00616, 0.00616, 0.00614, 0.00614, 0.00616, 0.0146, 0.0146, 0.00532]
GOOD_Q4_K_M = [0, 0.0403, 0.0358, 0.0384, 0.0425, 0.0473, 0.0493, 0.0531, 0.0571, 0.0603, 0.0801, 0.0882, 0.046,
               0.0461, 0.0461, 0.0462, 0.0463, 0.0464, 0.0464, 0.0465, 0.0467, 0.0469, 0.0472, 0.0476, 0.0481, 0.0488,
               0.0495, 0.0504, 0.052, 0.1, 0.138, 0.14]
NAMES = state_names(30)


def stats(rfn, iso=None):
    rfn = np.asarray([rfn])
    return LayerStats(NAMES, rfn, np.zeros_like(rfn), np.ones(rfn.shape[1]), np.ones(rfn.shape[1]),
                      None if iso is None else np.asarray([iso]))


@pytest.mark.parametrize("profile", [ATTN_V9, ATTN_NORM9, FFN_DOWN9], ids=["attn_v x0.9", "attn_norm x1.05",
                                                                         "ffn_down x1.01"])
def test_a_scaled_tensor_departs_at_its_layer(profile):
    dep = departures(profile, floor=2.1e-4)
    assert NAMES[dep.largest()] == "9" and dep.ratio[NAMES.index("9")] > 10


@pytest.mark.parametrize("profile,floor", [(GOOD_F16, 2.1e-4), (GOOD_Q4_K_M, 0.077)], ids=["f16", "q4_k_m"])
def test_healthy_profiles_do_not_depart(profile, floor):
    """Nothing reaches DEPARTS: the f16 embedding (rfn 2e-4) is judged against f16's own error, not
    against the tiny increments after it; the x2.6 of layer 28 is SmolLM2's own (every conversion)."""
    dep = departures(profile, floor=floor)
    assert np.nanmax(dep.ratio) < DEPARTS, dep.ratio


def test_zero_states_are_skipped_and_the_first_non_zero_is_judged_against_the_floor():
    dep = departures([0.0, 0.0, 0.05, 0.051, 0.052], floor=2.1e-4)
    assert dep.first == 2 and np.isnan(dep.ratio[:2]).all() and dep.ratio[2] == pytest.approx(0.05 / 2.1e-4)
    assert departures([0.0, 0.0, 0.0]).first is None


def test_non_finite_state_departs_infinitely():
    dep = departures([1e-4, 2e-4, np.nan, np.nan])
    assert dep.largest() == 2 and np.isinf(dep.ratio[2])


def test_suspect_prefers_the_layer_whose_weights_agree():
    """ffn_down x1.01: the change point and the weights name layer 9; the evidence fails the check."""
    s = _suspect(stats(FFN_DOWN9), {"9": ["blk.9.ffn_down.weight"]}, floor=2.1e-4)
    assert s["layer"] == "9" and s["evidence"] == ["change point", "weights"] and s["fails"]
    assert _suspect(stats(GOOD_F16), {}, floor=2.1e-4) is None
    # weights out of limit where nothing departs accuse no layer
    assert _suspect(stats(GOOD_F16), {"20": ["blk.20.attn_q.weight"]}, floor=2.1e-4) is None


def test_isolated_error_names_the_layer_first():
    iso = np.full(32, 1e-4)
    iso[NAMES.index("9")] = 5e-3
    assert isolated_departures(iso)[NAMES.index("9")] == pytest.approx(50)
    s = _suspect(stats(FFN_DOWN9, iso), {}, floor=2.1e-4)
    assert s["layer"] == "9" and s["evidence"] == ["isolated error", "change point"] and not s["fails"]
