"""Atomic file writes: the one way every file of the plugin is written (reports, dumps, caches,
checkpoints).

A reader must never see half a file, and two runs writing the same path (a shared dump folder or
report path, pytest-xdist workers) must not trip over each other. So each write goes to its own
temporary file beside the target (``.{name}.{host}.{pid}.{random}.tmp``: same folder, so the
rename stays on one file system), which is flushed and fsync'ed, then renamed over the target
(``os.replace`` is atomic: readers see the old or the new file, the last writer wins); the folder
is fsync'ed too where the platform allows, so the rename survives a power loss. Any exception
removes the temporary. A process killed outright (SIGKILL, OOM killer) cannot clean up, so every
write first removes the temporaries of its target left by dead processes of this host; a live
process's temporary (or another host's, on a shared file system) is never touched.
"""
from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_TEMPORARY = re.compile(r"\.(?P<target>.+)\.(?P<host>[0-9a-f]{8})\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp")


def temporary_path(path: Path) -> Path:
    """A fresh temporary name beside ``path`` naming this host and process (for stale cleanup)."""
    return path.with_name(f".{path.name}.{_HOST}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):  # another user's process; a pid out of range
        return True
    return True


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporaries of ``path`` left by dead processes of this host (killed mid-write)."""
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMPORARY.fullmatch(entry.name)
        if not match or match["target"] != path.name or match["host"] != _HOST or _alive(int(match["pid"])):
            continue
        try:
            os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:  # gone already (another writer cleaned it up) or not ours to remove
            pass
    return removed


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable; not every platform or file system allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicFile:
    """A temporary file beside ``path``, open for writing, that replaces ``path`` on ``commit()``
    and vanishes on ``discard()``. For writers that publish at a later time (streamed dumps);
    otherwise use ``atomic_open`` or ``write_atomic``."""

    def __init__(self, path: Path, mode: str = "wb", encoding: str | None = None):
        if mode not in ("wb", "w"):
            raise ValueError(f"atomic files are written whole: mode 'wb' or 'w', not {mode!r}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.path)
        self.temporary = temporary_path(self.path)
        text = {"encoding": encoding or "utf-8"} if mode == "w" else {}
        self.file: IO = open(self.temporary, mode.replace("w", "x"), **text)  # x: never another's file
        self.done = False

    def commit(self) -> None:
        """Flush and fsync the data, then rename it over the target; on any failure discard."""
        if self.done:
            return
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.temporary, self.path)
        except BaseException:
            self.discard()
            raise
        self.done = True
        _fsync_folder(self.path.parent)

    def discard(self) -> None:
        """Close and remove the temporary; the target keeps its old content (or stays absent)."""
        if self.done:
            return
        self.done = True
        try:
            self.file.close()
        finally:
            self.temporary.unlink(missing_ok=True)


@contextmanager
def atomic_open(path: Path, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """``with atomic_open(path) as f: f.write(...)``: the target changes only if the block ends
    without an exception. Text mode ("w") writes UTF-8 unless told otherwise."""
    target = AtomicFile(path, mode, encoding)
    try:
        yield target.file
    except BaseException:
        target.discard()
        raise
    target.commit()


def write_atomic(path: Path, data: bytes | str, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``data`` at once (str is written as ``encoding``, UTF-8 by default)."""
    if isinstance(data, str):
        data = data.encode(encoding)
    with atomic_open(path, "wb") as f:
        f.write(data)
