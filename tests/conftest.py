"""Shared test fixtures: the committed demo pair and the cached tiny conversion set."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "fixtures" / "demo"


@pytest.fixture(scope="session")
def demo_ref() -> Path:
    return DEMO / "hf"


@pytest.fixture(scope="session")
def demo_cand() -> Path:
    return DEMO / "demo-q8_0.gguf"


@pytest.fixture(scope="session")
def tiny() -> Path:
    """Tiny Llama + llama.cpp conversions and broken variants (built once, cached on disk)."""
    import build

    return build.tiny_set()
