"""pytest-modeldiff: check that a converted or quantized model still computes what the original does.

Without pytest: ``from pytest_modeldiff import compare`` (one call, see api.py) or the engine
itself, ``from pytest_modeldiff import ModelDiff``; ``compare_weights`` diffs two checkpoints'
tensors without running them (weights/diff.py).
"""
__version__ = "0.1.0"

__all__ = ["compare", "compare_weights", "ModelDiff", "Settings", "Thresholds", "__version__"]


def __getattr__(name):  # keep `import pytest_modeldiff` (and the pytest plugin) light
    if name == "compare":
        from .api import compare

        return compare
    if name == "ModelDiff":
        from .engine.modeldiff import ModelDiff

        return ModelDiff
    if name == "Settings":
        from .engine.settings import Settings

        return Settings
    if name == "compare_weights":
        from .weights.diff import compare_weights

        return compare_weights
    if name == "Thresholds":
        from .checks.thresholds import Thresholds

        return Thresholds
    raise AttributeError(name)
