"""Small checks shared by the readers of our files (reference cache header, dump description,
baseline): JSON gives any type anywhere, and a damaged file must end in a one-line
ModelDiffError, not in a TypeError three calls later."""
from __future__ import annotations

import reprlib

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 40
_REPR.maxlevel = 2


def is_int(value, minimum: int = 0) -> bool:
    """A JSON integer (not a bool, not a float) of at least ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def short(value) -> str:
    """A value for a one-line message: shortened, nesting cut (never recursion-deep)."""
    return " ".join(_REPR.repr(value).split())
