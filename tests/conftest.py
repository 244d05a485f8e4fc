"""Shared test fixtures: the committed demo pair and the cached tiny conversion set."""
import os
from pathlib import Path

# pytester's in-process runs drop modules first imported inside them; extension modules cannot
# be imported twice, so everything the engine loads is imported here, outside the runs.
import llama_cpp  # noqa: F401
import pyarrow.parquet  # noqa: F401
import pytest
import tokenizers  # noqa: F401
import torch  # noqa: F401
import transformers.models.llama.modeling_llama  # noqa: F401
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

import pytest_modeldiff.assertions  # noqa: F401
import pytest_modeldiff.runners.dump  # noqa: F401
import pytest_modeldiff.runners.hf  # noqa: F401
import pytest_modeldiff.runners.llamacpp  # noqa: F401

# Tests run the reference afresh unless they test the cache (unit/formats/test_refcache.py and
# integration/test_plugin_refcache.py name their own).
os.environ["MODELDIFF_REF_CACHE"] = "none"
# Nor do they remember which files passed llama.cpp's load probe (tests/unit/runners names its own).
pytest_modeldiff.runners.llamacpp.PROBE_MEMO = None

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
    from fixtures import build

    return build.tiny_set()
