"""pytest-modeldiff: check that a converted or quantized model still computes what the original does.

The engine works without pytest: ``from pytest_modeldiff import ModelDiff``.
"""
__version__ = "0.1.0"

__all__ = ["ModelDiff", "Settings", "Thresholds", "__version__"]


def __getattr__(name):  # keep `import pytest_modeldiff` (and the pytest plugin) light
    if name in ("ModelDiff", "Settings"):
        from . import compare

        return getattr(compare, name)
    if name == "Thresholds":
        from .thresholds import Thresholds

        return Thresholds
    raise AttributeError(name)
