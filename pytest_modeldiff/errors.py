"""User-facing errors: one line that names the file (or option) and the problem."""


class ModelDiffError(Exception):
    """Bad input or environment. Reported as a one-line pytest error, never a traceback."""


class ModelDiffUsageError(ModelDiffError):
    """A bad option, ini value or marker argument (names the key and where it came from)."""
