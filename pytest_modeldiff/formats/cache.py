"""The on-disk cache's plumbing: where it lives, content hashes of model files (memoized by path,
size and modification time, so a 5 GB model is hashed once), file locks shared by concurrent
workers (pytest-xdist); files are written with atomic.write_atomic (a reader never sees half a file)."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path

from .atomic import write_atomic

CACHE_DIR = Path(os.environ.get("MODELDIFF_CACHE", Path.home() / ".cache" / "pytest-modeldiff"))


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def files_sha256(files: list[Path]) -> str:
    """One hash of several files' contents (in order), each memoized in CACHE_DIR/sha256.json
    under (absolute path, size, mtime): a changed file is hashed again."""
    memo_path = CACHE_DIR / "sha256.json"
    memo = _read_memo(memo_path)
    digest, changed = hashlib.sha256(), False
    for file in files:
        st = Path(file).stat()
        key = f"{Path(file).resolve()}|{st.st_size}|{st.st_mtime_ns}"
        if key not in memo:
            memo[key], changed = file_sha256(Path(file)), True
        digest.update(memo[key].encode())
    if changed:
        try:
            with locked(memo_path):
                write_atomic(memo_path, json.dumps(memo).encode())
        except OSError:  # a read-only cache only costs the hashing next time
            pass
    return digest.hexdigest()


def _read_memo(memo_path: Path) -> dict[str, str]:
    """The memoized hashes; a missing or damaged memo only costs hashing again."""
    try:
        memo = json.loads(memo_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return {k: v for k, v in memo.items() if isinstance(v, str)} if isinstance(memo, dict) else {}


@contextmanager
def locked(path: Path):
    """An exclusive lock on ``path`` + ".lock" (held by one process at a time, released on exit,
    also when the process dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield

