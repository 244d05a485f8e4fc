"""Diagnosis passes beyond the main comparison: the isolated per-layer error of a GGUF run in
gguf-torch (for llama.cpp candidates, --modeldiff-isolate), per-layer quality attribution
(--modeldiff-attribution) and the long-context probe (--modeldiff-long-context).

    isolated = isolated_pass(store, "model.gguf", sequences)          # (n_seq, n_states) rfn
    table = attribution(ref_runner, cand_torch_runner, sequences)      # KLD added per layer
    probe = bucket_kld(ref_logits, cand_logits, n_buckets=4)           # KLD by position bucket
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import ModelDiffError
from ..metrics import layers
from ..metrics import logits as metrics

LONG_BUCKETS = 4  # position buckets of the long sequence
DEGRADES = 4.0  # a later bucket's mean KLD this many times the first bucket's (and over the kld limit) fails
LONG_CAP = 8192  # the default length drawn from metadata is capped here (CPU time grows with its square)


# --------------------------------------------------------------------------- isolated error
def isolated_pass(store, path: Path, sequences, device: str = "cpu", threads: int | None = None,
                  progress: Callable[[str], None] = lambda m: None) -> np.ndarray:
    """rfn of each state when every decoder layer (and the final norm) of the GGUF ``path``,
    dequantized and run in transformers, is fed the reference's input: (n_seq, n_states)."""
    from ..runners.gguf_torch import GGUFTorchRunner

    runner = GGUFTorchRunner(Path(path), device, threads)
    try:
        runner.load_weights()
        rows = []
        for i, seq in enumerate(sequences):
            ref = store.hidden(i)
            rows.append(metrics.relative_frobenius(ref, runner.isolated_states(seq.ids, ref)))
            progress(f"{runner.name}: isolated pass (gguf-torch) {i + 1}/{len(sequences)}")
        return np.stack(rows)
    finally:
        runner.close()


# --------------------------------------------------------------------------- attribution
def _log_probs(logits) -> "object":
    import torch

    return torch.log_softmax(torch.as_tensor(logits, dtype=torch.float64), -1)


def _kld_mean(base_log_p, logits) -> float:
    import torch

    log_q = torch.log_softmax(torch.as_tensor(logits, dtype=torch.float64), -1)
    return float((base_log_p.exp() * (base_log_p - log_q)).sum(-1).mean())


def attribution(ref, cand, sequences, progress: Callable[[str], None] = lambda m: None) -> dict:
    """exllamav3's model_diff attribution: the reference with one unit (token embedding, a decoder
    layer, the final norm, the output head) replaced by the candidate's, every other unit the
    reference's own; the mean KL(ref || swapped) over every position of ``sequences`` is what that
    unit's candidate weights alone cost. Both runners are transformers models (hf / gguf-torch)
    of the same architecture, loaded. Returns {"units": [{"name", "kld", "share"}], "total_kld",
    "sum_kld", "largest", "seconds", "positions"}: which layers deserve more bits."""
    import torch

    t0 = time.perf_counter()
    rm, cm = ref.model, cand.model
    r_blocks, r_norm = ref._blocks()
    c_blocks, c_norm = cand._blocks()
    if len(r_blocks) != len(c_blocks):
        raise ModelDiffError(f"attribution: {ref.path} has {len(r_blocks)} decoder layers, {cand.path} "
                             f"{len(c_blocks)}")
    r_decoder = rm.get_decoder()
    units: list[tuple[str, Callable[[], object], Callable[[object], None], object]] = [
        (layers.EMBD, rm.get_input_embeddings, rm.set_input_embeddings, cm.get_input_embeddings())]
    for i in range(len(r_blocks)):
        units.append((str(i), (lambda i=i: r_blocks[i]), (lambda m, i=i: r_blocks.__setitem__(i, m)), c_blocks[i]))
    units.append((layers.NORM, lambda: r_decoder.norm, lambda m: setattr(r_decoder, "norm", m), c_norm))
    if rm.get_output_embeddings() is not None and cm.get_output_embeddings() is not None:
        units.append(("head", rm.get_output_embeddings, rm.set_output_embeddings, cm.get_output_embeddings()))
    inputs = [torch.tensor([list(seq.ids)], dtype=torch.long, device=rm.device) for seq in sequences]

    def run(model):
        with torch.inference_mode():
            return [model(input_ids=ids, use_cache=False).logits[0].float().cpu() for ids in inputs]

    base = [_log_probs(x) for x in run(rm)]
    weights = np.array([len(seq.ids) for seq in sequences], dtype=np.float64)

    def mean_kld(outputs) -> float:
        return float(np.average([_kld_mean(b, x) for b, x in zip(base, outputs)], weights=weights))

    rows = []
    for k, (name, get, put, theirs) in enumerate(units):
        own = get()
        put(theirs)
        try:
            rows.append({"name": name, "kld": mean_kld(run(rm))})
        finally:
            put(own)
        progress(f"attribution {cand.name}: {k + 1}/{len(units)} units")
    total = mean_kld(run(cm))
    layer_sum = sum(r["kld"] for r in rows)
    for r in rows:
        r["share"] = r["kld"] / layer_sum if layer_sum > 0 else 0.0
    largest = max((r for r in rows if r["name"] not in ("head",)), key=lambda r: r["kld"], default=None)
    return {"units": rows, "total_kld": total, "sum_kld": layer_sum, "largest": largest,
            "positions": int(weights.sum()), "sequences": len(sequences), "candidate_runner": cand.kind,
            "seconds": time.perf_counter() - t0,
            "direction": "KL(reference || reference with the unit swapped for the candidate's)"}


# --------------------------------------------------------------------------- long context
def default_long_context(*hparams: dict | None) -> tuple[int, str]:
    """(length, why) from the models' own metadata: twice the sliding window when either side
    declares one (capped at LONG_CAP), else 0 (off)."""
    for hp in hparams:
        window = (hp or {}).get("sliding_window")
        if isinstance(window, list):
            window = max((w for w in window if isinstance(w, int)), default=None)
        if isinstance(window, int) and window > 0:
            return min(2 * window, LONG_CAP), f"twice the sliding window {window}"
    return 0, "no sliding window in the metadata"


def long_sequence(sequences: Sequence, length: int, bos_id: int | None) -> list[int]:
    """``length`` ids: the evaluation sequences' ids one after another, repeated as needed, BOS
    (when the reference adds one) only at the start. Repeated text also tests that a token far back
    can still be attended to: a window that is too short shows as a late-position error."""
    pool = []
    for seq in sequences:
        ids = list(seq.ids)
        if bos_id is not None and ids and ids[0] == bos_id:
            ids = ids[1:]
        pool += ids
    if not pool:
        raise ModelDiffError("long-context probe: the evaluation sequences hold no tokens")
    head = [bos_id] if bos_id is not None else []
    body = (pool * (length // len(pool) + 1))[: length - len(head)]
    return head + body


def bucket_kld(ref_logits: np.ndarray, cand_logits: np.ndarray, n_buckets: int = LONG_BUCKETS,
               window: int | None = None) -> dict:
    """Mean KL(ref || cand) per position bucket of one sequence: ``n_buckets`` equal spans, the
    first ending at ``window`` when a sliding window shorter than the sequence is known."""
    import torch

    n = len(ref_logits)
    kld = np.empty(n)
    for a in range(0, n, 64):
        log_p = torch.log_softmax(torch.as_tensor(ref_logits[a:a + 64], dtype=torch.float64), -1)
        log_q = torch.log_softmax(torch.as_tensor(cand_logits[a:a + 64], dtype=torch.float64), -1)
        kld[a:a + 64] = metrics.kl_and_prob_mse(log_p, log_q)[0]
    if window and 0 < window < n:
        edges = [0, window, *np.linspace(window, n, n_buckets)[1:].round().astype(int).tolist()]
    else:
        edges = np.linspace(0, n, n_buckets + 1).round().astype(int).tolist()
    buckets = [{"start": int(a), "stop": int(b), "kld_mean": float(np.nanmean(kld[a:b])),
                "kld_max": float(np.nanmax(kld[a:b]))} for a, b in zip(edges, edges[1:]) if b > a]
    return {"length": n, "buckets": buckets, "window": window, "kld_mean": float(np.nanmean(kld))}
