"""Unit tests, mirroring the package: a module's functions on hand-made values, small files written
here or the committed demo pair."""
