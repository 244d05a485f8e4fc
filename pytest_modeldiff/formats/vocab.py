"""A model's vocabulary as the vocab check compares it, whichever file it came from (a GGUF's
tokenizer.ggml.* keys, a HF tokenizer, a reference cache's header), and its chat template: the
text itself and what it makes of a sample conversation (rendered as transformers renders it)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class VocabInfo:
    tokens: list[str]
    merges: list[str] | None = None  # BPE merges "a b"
    scores: list[float] | None = None  # SentencePiece / Unigram piece scores
    special: dict[str, int | None] = field(default_factory=dict)  # bos, eos, unk, pad
    add_bos: bool | None = None
    add_eos: bool | None = None
    chat_template: str | None = None  # tokenizer.chat_template / tokenizer_config.json / chat_template.jinja

    def special_token(self, name: str) -> str | None:
        """The text of special token ``name`` ("bos", "eos", ...), None if unset or out of range."""
        token_id = self.special.get(name)
        return self.tokens[token_id] if token_id is not None and 0 <= token_id < len(self.tokens) else None


# A conversation with every role a template usually handles, for rendering both sides' templates.
SAMPLE_CONVERSATION = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "2 + 2 = 4."},
    {"role": "user", "content": "And 3 + 3?"},
)


def render_chat(template: str, bos: str | None, eos: str | None) -> str:
    """The sample conversation through ``template`` with transformers' settings (sandboxed jinja2,
    trim_blocks, lstrip_blocks, a generation prompt); an error becomes the text "error: ...". """
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:  # jinja2 comes with torch and transformers; without it, compare the text only
        return template

    def raise_exception(message):
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(messages=list(SAMPLE_CONVERSATION), add_generation_prompt=True,
                                                bos_token=bos or "", eos_token=eos or "")
    except Exception as exc:  # a template that does not render is a finding, not a crash
        return f"error: {type(exc).__name__}: {exc}"


def first_different_line(a: str, b: str) -> tuple[int, str, str] | None:
    """(1-based line number, reference line, candidate line) where two texts first differ."""
    left, right = a.splitlines(), b.splitlines()
    for i in range(max(len(left), len(right))):
        x = left[i] if i < len(left) else "<end>"
        y = right[i] if i < len(right) else "<end>"
        if x != y:
            return i + 1, x, y
    return None
