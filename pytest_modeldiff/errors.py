"""Every error and warning the package raises for a user: one line that names the file (or
option) and the problem."""


class ModelDiffError(Exception):
    """Bad input or environment. Reported as a one-line pytest error, never a traceback."""


class ModelDiffUsageError(ModelDiffError):
    """A bad option, ini value or marker argument (names the key and where it came from)."""


class ModelDiffCacheWarning(UserWarning):
    """A reference cache file was corrupt or stale and is being rebuilt."""


class ModelDiffEnvironmentWarning(UserWarning):
    """The baseline was recorded with other library versions, settings or model files."""
