"""Root conftest: the test suite's shared fixtures (built models) live in tests/conftest.py.

Kept at the root so `fixtures/` (the model builders) is importable from the tests.
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "fixtures"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from disk; never reach for a hub

pytest_plugins = ["pytester"]
