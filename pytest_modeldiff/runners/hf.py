"""Reference runner: a Hugging Face checkpoint folder run by transformers (float32 unless --ref-dtype or
the memory it may use says otherwise)."""
from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import ModelDiffError
from ..formats import mapping
from ..formats.vocab import VocabInfo
from ..weights.files import open_weights
from .base import Forward, Runner

# float32 weights plus activations, the autograd-free forward's buffers and the allocator's slack
# (measured: SmolLM2-135M in float32 peaks 1.47x its 0.54 GB of weights above the imports, 256-token
# sequences with hidden states captured)
FLOAT32_FOOTPRINT = 1.5
# Architectures whose buffers (rope's inv_freq) transformers computes in float32 whatever the load
# dtype: a 16-bit checkpoint loaded as stored and upcast afterwards has exactly the float32 load's
# weights, without transformers holding the mapped 16-bit shards and the float32 copies at once
# (1.08B bf16 Llama: peak 6.39 -> 5.82 GB). Others (Gemma's embedding scale is a buffer made in
# the load dtype) load in float32 directly.
UPCAST_AFTER_LOAD = ("llama", "mistral", "qwen2")


def resolve_dtype(requested: str, stored: str | None, params: int | None,
                  available: int | None) -> tuple[str, str]:
    """(dtype to run in, why): ``auto`` runs float32 when ``params`` float32 weights (times
    FLOAT32_FOOTPRINT) fit the ``available`` bytes, else the checkpoint's own 16-bit type
    (bfloat16 for anything else); an explicit choice is taken as given."""
    if requested != "auto":
        return requested, "--ref-dtype"
    need = None if params is None else FLOAT32_FOOTPRINT * 4 * params
    if need is None or available is None or need <= available:
        return "float32", "auto: float32 fits"
    stored = {"f16": "float16", "bf16": "bfloat16"}.get(str(stored).lower(), str(stored).lower())
    own = stored if stored in ("bfloat16", "float16") else "bfloat16"
    return own, (f"auto: float32 needs ~{need / 1e9:.1f} GB, {available / 1e9:.1f} GB available; "
                 f"{own} {'as stored' if own == stored else 'instead'}")


def available_memory(device: str) -> int | None:
    """Bytes the model may use: free device memory on CUDA, else the host's available memory
    (MemAvailable, capped by a cgroup limit); None when unknown."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0] if torch.cuda.is_available() else None
    found = []
    try:
        meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
        found.append(int(meminfo["MemAvailable"].split()[0]) * 1024)
    except (OSError, KeyError, ValueError):
        pass
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        used = int(open("/sys/fs/cgroup/memory.current").read())
        if limit.isdigit():
            found.append(int(limit) - used)
    except (OSError, ValueError):
        pass
    if not found and hasattr(os, "sysconf"):
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError):
            pass
    return min(found) if found else None


class TorchCausalLM(Runner):
    """Shared by every runner that ends in a transformers causal LM (hf, gguf-torch)."""

    dump_prefix = "pytorch"
    gives_hidden = feeds_layers = True
    model = tokenizer = None

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        return self.forward(ids).logits

    def forward(self, ids: Sequence[int], hidden: bool = False, feed: np.ndarray | None = None,
                keep: int = 0) -> Forward:
        import torch

        self.check_ids(ids, self.model.get_input_embeddings().num_embeddings)
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.model.device)
        if not hidden:
            with torch.inference_mode():
                return Forward(self.model(input_ids=input_ids, use_cache=False).logits[0].float().cpu().numpy())
        blocks, norm = self._blocks()
        ref = None if feed is None else torch.as_tensor(feed, device=self.model.device)[:, None]
        # pass 1: the model's own states; after ``keep`` layers it continues from the reference's
        swaps = {keep: ref[keep]} if ref is not None and keep else {}
        logits, states = self._run(input_ids, blocks, norm, swaps)
        if keep:
            states[: keep + 1] = ref[: keep + 1]
        isolated = None
        if ref is not None:  # pass 2: every layer (and the norm) fed the reference's input
            _, isolated = self._run(input_ids, blocks, norm, {i: ref[i] for i in range(len(blocks) + 1)})
        to_numpy = lambda t: None if t is None else t[:, 0].float().cpu().numpy()
        return Forward(logits, to_numpy(states), to_numpy(isolated))

    def _blocks(self):
        """The decoder layers and the final norm, which the canonical layout is defined by."""
        decoder = self.model.get_decoder() if hasattr(self.model, "get_decoder") else None
        blocks, norm = getattr(decoder, "layers", None), getattr(decoder, "norm", None)
        if blocks is None or norm is None:
            raise ModelDiffError(f"{self.path}: per-layer comparison needs a decoder with .layers and .norm "
                                 f"({type(self.model).__name__} has none)")
        return blocks, norm

    def _run(self, input_ids, blocks, norm, swaps: dict):
        """One pass capturing every decoder layer's output and the final norm's output.
        ``swaps`` maps a block index (len(blocks) = the norm) to the input it gets instead."""
        import torch

        outputs: dict[int, torch.Tensor] = {}

        def swap_input(index):
            def hook(module, args, kwargs):
                if index == 0:  # "embd" is layer 0's own input, scaled as the model scales it (Gemma, Granite)
                    outputs[-1] = (args[0] if args else kwargs["hidden_states"]).detach()
                if index not in swaps:
                    return None
                if args:
                    return (swaps[index].to(args[0].dtype), *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": swaps[index].to(kwargs["hidden_states"].dtype)}
            return hook

        def keep_output(index):
            def hook(module, args, kwargs, out):
                outputs[index] = (out[0] if isinstance(out, tuple) else out).detach()
            return hook

        handles = []
        try:
            for index, module in [*enumerate(blocks), (len(blocks), norm)]:
                handles.append(module.register_forward_pre_hook(swap_input(index), with_kwargs=True))
                handles.append(module.register_forward_hook(keep_output(index), with_kwargs=True))
            with torch.inference_mode():
                out = self.model(input_ids=input_ids, use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        # not output_hidden_states: its last entry is already normed. The embedding state is taken at
        # decoder layer 0's input, before any swap (formats/architectures.py: transformers scales
        # Gemma's embedding inside the embedding module and Granite's after it; both runtimes' canonical
        # "embd" is what layer 0 receives)
        states = torch.stack([outputs[i] for i in range(-1, len(blocks) + 1)]).float()
        return out.logits[0].float().cpu().numpy(), states

    def _source(self) -> tuple[Path, dict]:
        """Where from_pretrained finds this model and its tokenizer: (folder, extra arguments)."""
        return self.path, {}

    def _model_arguments(self) -> dict:
        import torch

        return {"dtype": getattr(torch, self.compute_dtype()[0])}

    @cached_property
    def _dtype(self) -> tuple[str, str]:
        size = self.size() if self.dtype == "auto" else None
        return resolve_dtype(self.dtype, self.quant_type(), size and size["params"],
                             available_memory(self.device) if size else None)

    def compute_dtype(self) -> tuple[str, str] | None:
        return self._dtype

    def load_tokenizer(self) -> None:
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            folder, extra = self._source()
            try:
                self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, **extra)
            except Exception as exc:
                raise ModelDiffError(f"{self.path}: transformers could not load the tokenizer: {exc}") from None

    def load(self, max_tokens: int) -> None:
        self.load_tokenizer()
        self.load_weights()

    def load_weights(self) -> None:
        """The model alone: the diagnosis passes feed it the reference's ids and states, so a
        tokenizer transformers cannot build from a GGUF (Gemma's) does not stop them."""
        if self.model is not None:
            return
        import torch
        from transformers import AutoModelForCausalLM

        if self.threads:
            torch.set_num_threads(self.threads)
        (folder, extra), arguments = self._source(), self._model_arguments()
        try:
            self.model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                              **extra, **arguments).eval()
        except Exception as exc:
            raise ModelDiffError(f"{self.path}: transformers could not load the model: {exc}") from None
        if "device_map" not in arguments:  # else transformers placed it
            self.model.to(self.device)
        if self.compute_dtype()[0] == "float32" and self.model.dtype != torch.float32:
            self.model.float()  # loaded as stored (_model_arguments): parameter by parameter to float32

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text).input_ids)

    def piece(self, token_id: int) -> str:
        return self.tokenizer.decode([int(token_id)])

    def versions(self) -> dict[str, str]:
        import torch
        import transformers

        return {"torch": torch.__version__, "transformers": transformers.__version__}

    def _special_flags(self) -> tuple[bool, bool]:
        """(adds bos, adds eos), observed rather than read: tokenizer configs disagree on where
        the flags live, the behaviour is what matters."""
        tok = self.tokenizer
        with_special, plain = tok("a").input_ids, tok("a", add_special_tokens=False).input_ids
        extra = len(with_special) - len(plain)
        adds_bos = extra > 0 and tok.bos_token_id is not None and with_special[0] == tok.bos_token_id
        adds_eos = extra > 0 and tok.eos_token_id is not None and with_special[-1] == tok.eos_token_id
        return adds_bos, adds_eos

    def close(self) -> None:
        self.model = None


class HFRunner(TorchCausalLM):
    kind = "hf"

    def __init__(self, path: Path, device: str = "cpu", threads: int | None = None):
        super().__init__(path, device, threads)
        if not (self.path / "config.json").is_file():
            raise ModelDiffError(f"{self.path}: not a Hugging Face model folder (no config.json)")
        try:
            self.config = json.loads((self.path / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise ModelDiffError(f"{self.path / 'config.json'}: unreadable ({exc})") from None

    def declared_transformers_version(self) -> str | None:
        return self.config.get("transformers_version")

    def _model_arguments(self) -> dict:
        if "quantization_config" in self.config:  # quantized checkpoints keep their own dtype and placement
            return {"dtype": None, "device_map": self.device}
        stored = self.quant_type()
        if (self.compute_dtype()[0] == "float32" and stored in ("bfloat16", "float16")
                and self.config.get("model_type") in UPCAST_AFTER_LOAD):
            import torch

            return {"dtype": getattr(torch, stored)}  # upcast after loading (load(), UPCAST_AFTER_LOAD)
        return super()._model_arguments()

    def compute_dtype(self) -> tuple[str, str] | None:
        if "quantization_config" in self.config:
            return self.quant_type(), "quantized checkpoint: its own kernels and types"
        return super().compute_dtype()

    def quant_type(self) -> str:
        qc = self.config.get("quantization_config")
        if qc:
            bits = qc.get("bits") or (4 if qc.get("load_in_4bit") else 8 if qc.get("load_in_8bit") else None)
            return f"int{bits}" if bits else str(qc.get("quant_method", "quantized"))
        dtype = self.config.get("dtype") or self.config.get("torch_dtype") or self._stored_dtype()
        return str(dtype or "float32")

    def type_label(self) -> str:
        """The stored type, and the one it runs in when that differs ("float32 (stored bfloat16)")."""
        stored, (run, _) = self.quant_type(), self.compute_dtype()
        return stored if run == stored else f"{run} (stored {stored})"

    def _stored_dtype(self) -> str | None:
        """The storage type of most weights, from the weight files' headers (no weights are read)."""
        try:
            stored = open_weights(self.path).dominant_type()
        except ModelDiffError:
            return None
        return (None if stored == "GUESSED"
                else {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(stored, stored))

    def hparams(self) -> dict[str, Any]:
        return mapping.from_hf_config(self.config)

    @cached_property
    def _vocab(self) -> VocabInfo:
        tok = self.tokenizer
        tokens = tok.convert_ids_to_tokens(list(range(len(tok))))
        adds_bos, adds_eos = self._special_flags()
        return VocabInfo(
            tokens=[t if t is not None else "" for t in tokens],
            merges=self._merges(),
            scores=self._scores(),
            special={"bos": tok.bos_token_id, "eos": tok.eos_token_id,
                     "unk": tok.unk_token_id, "pad": tok.pad_token_id},
            add_bos=adds_bos,
            add_eos=adds_eos,
            chat_template=self._chat_template(),
        )

    def _chat_template(self) -> str | None:
        """The default chat template: chat_template.jinja (transformers >= 4.43 saves it there),
        else tokenizer_config.json's chat_template (a string, or named templates: "default")."""
        jinja = self.path / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8", errors="replace")
        path = self.path / "tokenizer_config.json"
        try:
            template = json.loads(path.read_text(encoding="utf-8")).get("chat_template") if path.is_file() else None
        except (OSError, ValueError, AttributeError, RecursionError):
            return None
        if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        return template if isinstance(template, str) else None

    def vocab(self) -> VocabInfo:
        return self._vocab

    @cached_property
    def _tokenizer_json(self) -> dict:
        path = self.path / "tokenizer.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def _merges(self) -> list[str] | None:
        merges = self._tokenizer_json.get("model", {}).get("merges")
        if merges is None:
            return None
        return [m if isinstance(m, str) else " ".join(m) for m in merges]


    def _scores(self) -> list[float] | None:
        """Piece scores: tokenizer.json's Unigram vocabulary, else SentencePiece's tokenizer.model."""
        model = self._tokenizer_json.get("model", {})
        if model.get("type") == "Unigram":
            return [float(score) for _, score in model["vocab"]]
        if (self.path / "tokenizer.model").is_file():
            try:
                import sentencepiece
            except ImportError:
                return None
            sp = sentencepiece.SentencePieceProcessor(model_file=str(self.path / "tokenizer.model"))
            return [sp.GetScore(i) for i in range(sp.GetPieceSize())]
        return None
