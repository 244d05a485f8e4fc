"""Next-token quality (perplexity, top-K accuracy and agreement, probability MSE) from the
per-position numbers, against a hand-computed example with ties and against torch."""
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pytest_modeldiff.engine.records import PositionStats
from pytest_modeldiff.metrics.quality import measure_quality

# One sequence of 4 tokens over a vocabulary of 4: positions 0..2 predict ids[1..3], position 3 has
# no next token. Reference / candidate logits per position, and where the target ranks.
IDS = [0, 3, 2, 1]
REF = np.array([[0.0, 2.0, 1.0, 2.0],    # target 3: tied for the top            -> rank 0
                [3.0, 2.0, 2.0, 1.0],    # target 2: tied behind id 0             -> rank 1
                [1.0, 4.0, 2.0, 3.0],    # target 1: the top                      -> rank 0
                [9.0, 0.0, 0.0, 0.0]])   # no target
CAND = np.array([[0.0, 2.0, 1.0, 1.5],   # target 3 behind id 1                   -> rank 1
                 [3.0, 1.0, 2.0, 1.0],   # target 2 second                         -> rank 1
                 [4.0, 1.0, 2.0, 3.0],   # target 1 last                           -> rank 3
                 [0.0, 0.0, 0.0, 9.0]])


def stats(topk_kept=4):
    return PositionStats.measure(0, IDS, np.arange(4), REF.astype(np.float32), CAND.astype(np.float32), topk_kept)


def test_targets_and_ranks_by_hand():
    s = stats()
    np.testing.assert_array_equal(s.target, [3, 2, 1, -1])
    np.testing.assert_array_equal(s.ref_rank, [0, 1, 0, -1])
    np.testing.assert_array_equal(s.cand_rank, [1, 1, 3, -1])


def test_quality_by_hand_with_ties():
    q = measure_quality(stats(), topk_max=4)
    assert q.positions == 3  # the last position has no next token
    assert q.ref_accuracy == pytest.approx([2 / 3, 1, 1, 1])
    assert q.cand_accuracy == pytest.approx([0, 2 / 3, 2 / 3, 1])
    assert q.accuracy_drop == pytest.approx([2 / 3, 1 / 3, 1 / 3, 0])
    # ordered agreement, ties by lower id: ref tops [1, 3, 2, 0], [0, 1, 2, 3], [1, 3, 2, 0];
    # cand tops [1, 3, 2, 0], [0, 2, 1, 3], [0, 3, 2, 1]
    assert q.agreement == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])


def test_perplexity_and_prob_mse_against_torch():
    q = measure_quality(stats(), topk_max=2)
    targets = torch.tensor(IDS[1:])
    for logits, ppl in ((REF, q.ref_ppl), (CAND, q.cand_ppl)):
        nll = F.cross_entropy(torch.tensor(logits[:3], dtype=torch.float64), targets)
        assert ppl == pytest.approx(math.exp(nll.item()), rel=1e-6)
    # every position, including the last (exllamav2's mse_loss over all softmaxes)
    expected = F.mse_loss(torch.softmax(torch.tensor(REF), -1), torch.softmax(torch.tensor(CAND), -1)).item()
    assert q.prob_mse == pytest.approx(expected, rel=1e-6)


def test_a_last_position_dump_has_no_targets():
    s = PositionStats.measure(0, IDS, np.array([3]), REF[3:].astype(np.float32), CAND[3:].astype(np.float32))
    q = measure_quality(s, topk_max=5)
    assert (q.positions, q.ref_ppl, q.ref_accuracy, q.agreement) == (0, None, [], [])
    assert q.prob_mse > 0


def test_nan_candidate_rows_never_count_as_hits():
    cand = CAND.astype(np.float32).copy()
    cand[0] = np.nan
    s = PositionStats.measure(0, IDS, np.arange(4), REF.astype(np.float32), cand)
    assert s.cand_rank[0] == 4 and np.isnan(s.cand_nll[0])
    q = measure_quality(s, topk_max=4)
    assert q.cand_accuracy[3] == pytest.approx(2 / 3) and math.isnan(q.cand_ppl)


def test_the_engine_gives_exllamav2_model_diff_numbers(demo_ref, demo_cand, tmp_path):
    """Both models' logits from the dumps, run through exllamav2 model_diff.py's own formulas
    (logits[:-1] against input_ids[1:], torch.topk, mse_loss per row averaged over rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pytest_modeldiff import compare
    from pytest_modeldiff.formats import dumps

    text = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    pq.write_table(pa.table({"text": text.split("\n\n")}), tmp_path / "eval.parquet")
    report = compare(demo_ref, demo_cand, checks=["prob_mse"], eval_dataset=tmp_path / "eval.parquet",
                     eval_rows=3, eval_length=40, topk_max=4, dump_dir=tmp_path / "data")
    q = report["demo-q8_0"].comparison.quality
    a, seqs, _, _ = dumps.read_dump(tmp_path / "data" / "pytorch-hf-all.bin")
    b, _, _, _ = dumps.read_dump(tmp_path / "data" / "llamacpp-demo-q8_0-all.bin")
    assert [len(s) for s in seqs] == [40, 40, 40]
    ids = torch.tensor(seqs)
    x = (torch.tensor(np.array(a)).view(3, 40, -1), torch.tensor(np.array(b)).view(3, 40, -1))
    targets = ids[:, 1:].reshape(-1, 1)
    ppl, acc = [], []
    for logits in x:
        log_probs = F.log_softmax(logits[:, :-1].double(), dim=-1)
        ppl.append(math.exp(-log_probs.gather(-1, ids[:, 1:].unsqueeze(-1)).mean().item()))
        top = torch.topk(logits[:, :-1], 4, dim=-1).indices.view(-1, 4)
        acc.append([torch.eq(targets, top[:, :k]).any(1).float().mean().item() for k in range(1, 5)])
    top_a = torch.topk(x[0][:, :-1], 4, dim=-1).indices.view(-1, 4)
    top_b = torch.topk(x[1][:, :-1], 4, dim=-1).indices.view(-1, 4)
    agreement = [torch.eq(top_a[:, :k], top_b[:, :k]).all(1).float().mean().item() for k in range(1, 5)]
    mse = np.mean([F.mse_loss(torch.softmax(x[0][r].double(), -1), torch.softmax(x[1][r].double(), -1)).item()
                   for r in range(3)])
    assert (q.ref_ppl, q.cand_ppl) == pytest.approx(tuple(ppl), rel=1e-9)
    assert (q.ref_accuracy, q.cand_accuracy) == (pytest.approx(acc[0]), pytest.approx(acc[1]))
    assert q.agreement == pytest.approx(agreement)
    assert q.prob_mse == pytest.approx(mse, rel=1e-9)
