"""Reference runner: a Hugging Face checkpoint folder run by transformers in float32."""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import mapping
from ..errors import ModelDiffError
from .base import Runner, VocabInfo


class TorchCausalLM(Runner):
    """Shared by every runner that ends in a transformers causal LM (hf, gguf-torch)."""

    dump_prefix = "pytorch"
    model = tokenizer = None

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        import torch

        n_embd_rows = self.model.get_input_embeddings().num_embeddings
        if not ids or min(ids) < 0 or max(ids) >= n_embd_rows:
            raise ModelDiffError(f"{self.path}: token ids must be 0..{n_embd_rows - 1} (got "
                                 f"{len(ids)} ids, range {min(ids, default=None)}..{max(ids, default=None)})")
        with torch.inference_mode():
            input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.model.device)
            out = self.model(input_ids=input_ids, use_cache=False)
        return out.logits[0].float().cpu().numpy()

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

    def load(self, max_tokens: int) -> None:
        if self.model is not None:
            return
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.threads:
            torch.set_num_threads(self.threads)
        quantized = "quantization_config" in self.config
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
            self.model = AutoModelForCausalLM.from_pretrained(
                self.path, local_files_only=True,
                dtype=None if quantized else torch.float32,  # quantized checkpoints keep their own
                device_map=self.device if quantized else None,
            ).eval()
        except Exception as exc:
            raise ModelDiffError(f"{self.path}: transformers could not load the model: {exc}") from None
        if not quantized:
            self.model.to(self.device)

    def quant_type(self) -> str:
        qc = self.config.get("quantization_config")
        if qc:
            bits = qc.get("bits") or (4 if qc.get("load_in_4bit") else 8 if qc.get("load_in_8bit") else None)
            return f"int{bits}" if bits else str(qc.get("quant_method", "quantized"))
        dtype = self.config.get("dtype") or self.config.get("torch_dtype") or self._safetensors_dtype()
        return str(dtype or "float32")

    def _safetensors_dtype(self) -> str | None:
        """The dtype of the first tensor in the first shard's header (no weights are read)."""
        shard = next(iter(sorted(self.path.glob("*.safetensors"))), None)
        if shard is None:
            return None
        with open(shard, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        dtype = next((v["dtype"] for k, v in header.items() if k != "__metadata__"), None)
        return {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(dtype, dtype)

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
        )

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
