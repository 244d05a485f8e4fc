"""Root conftest: the test suite's shared fixtures (built models) live in tests/conftest.py.

Kept at the root so pytest puts the repository root on ``sys.path`` (rootdir conftest, prepend
import mode): the test models' package ``fixtures`` is then importable (``from fixtures import build``).
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from disk; never reach for a hub

pytest_plugins = ["pytester"]
