"""Candidate runner: a GGUF file run by llama.cpp through llama-cpp-python, logits at every position.

llama.cpp answers some bad files with a GGML_ASSERT that aborts the process. gguf_file.py refuses
the ones it knows; for the rest, each file is first loaded once in a child process (probe_load),
so an abort kills the child and becomes a ModelDiffError here instead of ending pytest.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import ModelDiffError
from ..formats.architectures import architecture, not_mapped
from ..formats.gguf_file import open_gguf
from ..formats.vocab import VocabInfo
from .base import Forward, Runner


class LlamaCppRunner(Runner):
    kind = "llamacpp"
    dump_prefix = "llamacpp"

    def __init__(self, path: Path, device: str = "cpu", threads: int | None = None):
        super().__init__(path, device, threads)
        self.gguf = open_gguf(self.path)
        self.arch = str(self.gguf.metadata.get("general.architecture", ""))
        self.llm = None
        self._capture: _StateCapture | None = None

    @property
    def gives_hidden(self) -> bool:
        """Only where formats/architectures.py knows which graph tensors are the canonical states
        (a reference of another architecture is then not captured for nothing)."""
        return architecture(self.arch) is not None

    def layers_unmapped(self, other) -> str | None:
        return None if architecture(self.arch) is not None else not_mapped(self.arch, "layers")

    def load_tokenizer(self) -> None:
        pass  # tokenize() opens a vocabulary-only model on demand

    def load(self, max_tokens: int) -> None:
        if self.llm is not None and not self.llm.model_params.vocab_only and self.llm.n_ctx() >= max_tokens:
            return
        self.close()
        try:
            from llama_cpp import Llama
        except ImportError:
            raise ModelDiffError(
                "the llamacpp runner needs llama-cpp-python: pip install 'pytest-modeldiff[llamacpp]'") from None
        n_ctx = max(512, max_tokens)
        load_error = probe_load(self.path, self._gpu_layers())
        try:
            self.llm = Llama(
                model_path=str(self.path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=min(n_ctx, 512),
                logits_all=True, verbose=False, seed=0,
                # read, not mapped: llama.cpp repacks K-quants for the CPU into memory of its own, and a
                # mapping would keep the file's pages resident beside that copy (8B Q4_K_M: 4.6 GB more
                # peak RSS; same logits)
                use_mmap=False,
                n_threads=self.threads or max(1, (os.cpu_count() or 2)),
                n_gpu_layers=self._gpu_layers(),
            )
        except Exception as exc:
            reason = load_error or exc  # llama-cpp-python's own message does not say why
            raise ModelDiffError(f"{self.path}: llama.cpp could not load the model: {reason}") from None

    def _gpu_layers(self) -> int:
        return -1 if self.device.startswith("cuda") else 0

    def quant_type(self) -> str:
        return self.gguf.quant_type

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        self.check_ids(ids, self.llm.n_vocab())
        self.llm.reset()
        try:
            self.llm.eval(list(ids))
        except Exception as exc:  # llama_decode failures surface as RuntimeError
            raise ModelDiffError(f"{self.path}: llama.cpp could not evaluate {len(ids)} tokens: {exc}") from None
        return np.array(self.llm.scores[: len(ids)], dtype=np.float32)

    def forward(self, ids: Sequence[int], hidden: bool = False, feed: np.ndarray | None = None,
                keep: int = 0) -> Forward:
        if not hidden:
            return Forward(self.logits(ids))
        self.check_ids(ids, self.llm.n_vocab())
        if self._capture is None:
            entry = architecture(self.arch)
            self._capture = _StateCapture(self.llm, entry.embd_tensor if entry else "embd")
        try:
            logits, states = self._capture.run(list(ids))
        except RuntimeError as exc:
            raise ModelDiffError(f"{self.path}: llama.cpp could not evaluate {len(ids)} tokens: {exc}") from None
        return Forward(logits, states)

    def _vocab_model(self):
        """The loaded model, or after ``close`` a vocabulary-only one (for failure messages)."""
        if self.llm is None:
            from llama_cpp import Llama

            probe_load(self.path, self._gpu_layers())
            try:
                self.llm = Llama(model_path=str(self.path), vocab_only=True, verbose=False)
            except Exception as exc:
                raise ModelDiffError(f"{self.path}: llama.cpp could not load the vocabulary: {exc}") from None
        return self.llm

    def tokenize(self, text: str) -> list[int]:
        # add_bos=True means "add the special tokens this model's metadata asks for"
        return list(self._vocab_model().tokenize(text.encode("utf-8"), add_bos=True, special=True))

    def piece(self, token_id: int) -> str:
        return self._vocab_model().detokenize([int(token_id)], special=True).decode("utf-8", errors="replace")

    def vocab(self) -> VocabInfo:
        return self.gguf.vocab()

    def hparams(self) -> dict[str, Any]:
        return self.gguf.hparams()

    def versions(self) -> dict[str, str]:
        import llama_cpp

        return {"llama-cpp-python": llama_cpp.__version__}

    def close(self) -> None:
        if self._capture is not None:
            self._capture.close()
            self._capture = None
        if self.llm is not None:
            self.llm.close()
            self.llm = None


# --------------------------------------------------------------------------- the load probe
PROBE_TIMEOUT_S = 600
PROBE_TEXT = "Hello, world!\n\t12 + 30 = 42."
LOAD_FAILED = 3  # the probe's exit status when llama.cpp refused the file with an error, not an abort
_PROBE_SCRIPT = f"""
import sys
from llama_cpp import Llama

def step(name):
    print(name, flush=True)  # the parent names the step the child died in

path, gpu_layers, text = sys.argv[1], int(sys.argv[2]), sys.argv[3]
step("loading")
try:
    llm = Llama(model_path=path, n_ctx=64, n_batch=16, n_ubatch=16, verbose=True, seed=0, n_threads=2,
                n_gpu_layers=gpu_layers)
except Exception:
    sys.exit({LOAD_FAILED})
try:
    step("tokenizing"); ids = llm.tokenize(text.encode(), add_bos=True, special=True)
    step("evaluating"); llm.eval(ids[:8])
    step("detokenizing"); llm.detokenize(ids, special=True)
except Exception:
    pass  # an error, not an abort: the in-process run reports it with its own message
"""
_PROBED: dict[tuple, tuple[str | None, str | None]] = {}


def probe_load(path: Path, gpu_layers: int) -> str | None:
    """Load, tokenize with and evaluate a few tokens of ``path`` in a child process, once per file
    and process: raise ModelDiffError with llama.cpp's last words if the child dies. Returns
    llama.cpp's error line when it refused the file cleanly (the in-process load then fails too,
    and llama-cpp-python's own message does not say why). A probe that times out proves nothing
    and lets the load go ahead."""
    path = Path(path).resolve()
    try:
        stat = path.stat()
    except OSError:
        return None  # gone: the load itself says so
    key = (path, stat.st_size, stat.st_mtime_ns, gpu_layers)
    if key not in _PROBED:
        memo_key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}|{gpu_layers}|{_llama_cpp_version()}"
        passed = _read_probe_memo()
        _PROBED[key] = (None, None) if memo_key in passed else _run_probe(path, gpu_layers)
        if _PROBED[key] == (None, None) and memo_key not in passed:
            _remember_probe(memo_key)
    fatal, load_error = _PROBED[key]
    if fatal:
        raise ModelDiffError(fatal)
    return load_error


# files that passed the probe, memoized like sha256.json (None: off; the test suite turns it off)
PROBE_MEMO: str | None = "llamacpp-probe.json"


def _llama_cpp_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _read_probe_memo() -> set[str]:
    """Files (path, size, mtime, offload, llama-cpp-python version) that loaded and ran cleanly in
    an earlier probe: the probe costs a full model load (seconds for a large model) on every run,
    and the same bytes in the same llama.cpp give the same answer. Only passes are kept."""
    import json

    from ..formats.cache import CACHE_DIR

    if PROBE_MEMO is None:
        return set()
    try:
        memo = json.loads((CACHE_DIR / PROBE_MEMO).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return set()
    return {k for k in memo if isinstance(k, str)} if isinstance(memo, list) else set()


def _remember_probe(memo_key: str) -> None:
    import json

    from ..formats.atomic import write_atomic
    from ..formats.cache import CACHE_DIR, locked

    if PROBE_MEMO is None:
        return
    path = CACHE_DIR / PROBE_MEMO
    try:
        with locked(path):
            write_atomic(path, json.dumps(sorted(_read_probe_memo() | {memo_key})).encode())
    except OSError:  # a read-only cache only costs the probe next time
        pass


def _run_probe(path: Path, gpu_layers: int) -> tuple[str | None, str | None]:
    """(the one-line error if the child died, llama.cpp's error line if it refused the file)."""
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # ggml would otherwise attach gdb for a backtrace
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE_SCRIPT, str(path), str(gpu_layers), PROBE_TEXT],
                              capture_output=True, env=env, timeout=PROBE_TIMEOUT_S)
    except (subprocess.TimeoutExpired, OSError):  # too slow to tell, or no interpreter to run it with
        return None, None
    log = done.stderr.decode("utf-8", "replace")
    if done.returncode in (0, LOAD_FAILED):
        reason = _log_line(log, "error loading model: ")
        return None, reason.split("error loading model: ", 1)[1] if done.returncode and reason else None
    steps = done.stdout.decode("utf-8", "replace").split()
    step = steps[-1] if steps else "starting"
    return (f"{path}: llama.cpp {_death(done.returncode)} while {step} in a probe process that runs this "
            f"file: {_last_words(log)}"), None


def _death(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"crashed ({signal.Signals(-returncode).name})"
        except ValueError:
            return f"crashed (signal {-returncode})"
    return f"exited with status {returncode}"


SOURCE_LINE = r"\S*?([\w.-]+\.(?:c|cc|cpp|cu|h|m)):(\d+): "  # ggml_abort's "file:line: message"


def _last_words(log: str) -> str:
    """llama.cpp's GGML_ASSERT / GGML_ABORT line, or the C++ exception that ended it."""
    line = _log_line(log, "GGML_ASSERT") or _log_line(log, SOURCE_LINE)
    if line:
        return line
    thrown, what = _log_line(log, "terminate called"), _log_line(log, r"what\(\):")
    if thrown:
        return f"{thrown} ({what})" if what else thrown
    return _log_line(log, "error") or "no message"


def _log_line(log: str, pattern: str) -> str | None:
    """The last log line matching ``pattern``, whitespace collapsed, source paths cut to the
    file name."""
    lines = [" ".join(line.split()) for line in log.splitlines() if re.search(pattern, line)]
    return re.sub(SOURCE_LINE, r"\1:\2: ", lines[-1])[:300] if lines else None


class _StateCapture:
    """A second llama.cpp context on the same weights whose eval callback copies out the
    canonical states (layers.py): decoder layer 0's input (``embd_name``, per architecture:
    "embd", Gemma's "inp_scaled"), "l_out-<i>", "result_norm". The callback asks only for
    those tensors (llama.cpp then keeps the rest of the graph fused), every position requests
    logits (otherwise the last layer runs on output rows only), and micro-batches are concatenated.
    llama-cpp-python binds neither ggml_get_name nor ggml_backend_tensor_get: declared here."""

    def __init__(self, llm, embd_name: str = "embd"):
        import ctypes

        from llama_cpp import _ggml
        from llama_cpp import llama_cpp as C
        from llama_cpp._internals import LlamaBatch, LlamaContext

        ggml = _ggml.libggml
        for name, restype, argtypes in (
                ("ggml_get_name", ctypes.c_char_p, [ctypes.c_void_p]),
                ("ggml_nelements", ctypes.c_int64, [ctypes.c_void_p]),
                ("ggml_nrows", ctypes.c_int64, [ctypes.c_void_p]),
                ("ggml_nbytes", ctypes.c_size_t, [ctypes.c_void_p]),
                ("ggml_backend_tensor_get", None,
                 [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t])):
            getattr(ggml, name).restype, getattr(ggml, name).argtypes = restype, argtypes
        self.ggml = ggml
        self.n_layers = C.llama_model_n_layer(llm._model.model)
        self.n_vocab = llm.n_vocab()
        self.wanted = {embd_name: 0, **{f"l_out-{i}": i + 1 for i in range(self.n_layers)},
                       "result_norm": self.n_layers + 1}
        self.chunks: dict[int, list[np.ndarray]] = {}
        self.callback = C.ggml_backend_sched_eval_callback(self._on_tensor)  # kept alive with self
        params = C.llama_context_default_params()
        ctypes.memmove(ctypes.addressof(params), ctypes.addressof(llm.context_params), ctypes.sizeof(params))
        params.cb_eval = self.callback
        self.n_ctx = params.n_ctx
        self.context = LlamaContext(model=llm._model, params=params, verbose=False)
        self.batch = LlamaBatch(n_tokens=params.n_batch, embd=0, n_seq_max=1, verbose=False)

    def _on_tensor(self, tensor, ask, user_data) -> bool:
        index = self.wanted.get(self.ggml.ggml_get_name(tensor).decode("utf-8", "replace"))
        if ask or index is None:
            return index is not None
        n, rows = self.ggml.ggml_nelements(tensor), self.ggml.ggml_nrows(tensor)
        if self.ggml.ggml_nbytes(tensor) != 4 * n:  # not contiguous float32: cannot read it as such
            return False
        data = np.empty(n, dtype=np.float32)
        self.ggml.ggml_backend_tensor_get(tensor, data.ctypes.data, 0, data.nbytes)
        self.chunks.setdefault(index, []).append(data.reshape(rows, n // rows))
        return True

    def run(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        from llama_cpp import llama_cpp as C

        if len(ids) > self.n_ctx:
            raise RuntimeError(f"{len(ids)} tokens exceed the context of {self.n_ctx}")
        self.chunks = {}
        self.context.kv_cache_clear()
        self.batch.set_batch(ids, n_past=0, logits_all=True)
        self.context.decode(self.batch)
        logits = np.ctypeslib.as_array(C.llama_get_logits(self.context.ctx), shape=(len(ids), self.n_vocab)).copy()
        missing = [name for name, i in self.wanted.items() if i not in self.chunks]
        if missing:
            raise RuntimeError(f"the graph has no tensor(s) {', '.join(missing[:3])} for per-layer capture "
                               "(an architecture with other tensor names)")
        states = np.stack([np.concatenate(self.chunks[i]) for i in range(self.n_layers + 2)])
        self.chunks = {}
        return logits, states

    def close(self) -> None:
        self.batch.close()
        self.context.close()
