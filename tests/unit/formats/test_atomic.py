"""Atomic writes: concurrent writers of one path, an exception or a SIGKILL mid-write, and the
cleanup of temporaries left by dead processes."""
import os
import signal
import subprocess
import sys

import pytest

from pytest_modeldiff.formats.atomic import atomic_open, remove_stale_temporaries, temporary_path, write_atomic


def temporaries(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def temporary_of(target, pid):
    """The temporary name process ``pid`` of this host would use for ``target``."""
    return target.with_name(temporary_path(target).name.replace(f".{os.getpid()}.", f".{pid}.", 1))


def dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_bytes_and_text_round_trip_leaving_no_temporary(tmp_path):
    write_atomic(tmp_path / "sub" / "a.bin", b"\x00\xff")
    write_atomic(tmp_path / "sub" / "b.md", "µ report\n")
    assert (tmp_path / "sub" / "a.bin").read_bytes() == b"\x00\xff"
    assert (tmp_path / "sub" / "b.md").read_bytes() == "µ report\n".encode("utf-8")
    assert temporaries(tmp_path / "sub") == []


def test_an_exception_mid_write_changes_nothing(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="disk on fire"):
        with atomic_open(target) as f:
            f.write(b"new, half")
            raise RuntimeError("disk on fire")
    assert target.read_text() == "old" and temporaries(tmp_path) == []
    with pytest.raises(KeyboardInterrupt):
        with atomic_open(tmp_path / "absent.json", "w") as f:
            f.write("x")
            raise KeyboardInterrupt
    assert not (tmp_path / "absent.json").exists() and temporaries(tmp_path) == []


def test_stale_temporaries_of_dead_processes_go_live_ones_stay(tmp_path):
    target = tmp_path / "x-all.bin"
    dead, live = temporary_of(target, dead_pid()), temporary_of(target, os.getppid())
    other_target = temporary_of(tmp_path / "y.bin", dead_pid())
    other_host = tmp_path / f".{target.name}.00000000.{dead_pid()}.0123abcd.tmp"
    for path in (dead, live, other_target, other_host):
        path.write_bytes(b"half")
    write_atomic(target, b"whole")
    assert target.read_bytes() == b"whole"
    assert not dead.exists()
    assert live.exists() and other_target.exists() and other_host.exists()  # not this target's, or not ours
    assert remove_stale_temporaries(tmp_path / "y.bin") == [other_target]


WRITER = """
import sys
from pathlib import Path
from pytest_modeldiff.formats.atomic import write_atomic
target, tag = Path(sys.argv[1]), sys.argv[2]
for i in range(100):
    write_atomic(target, (tag * 100_000 + str(i)).encode())
"""


def test_two_processes_writing_one_path_never_fail_and_leave_one_version(tmp_path):
    """As two runs sharing --modeldiff-dump-dir or a report path: every write succeeds, every read
    sees one whole version, and no temporary is left."""
    target = tmp_path / "report.json"
    target.write_bytes(b"A" * 100_000 + b"0")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(target), tag], stderr=subprocess.PIPE,
                                text=True) for tag in "AB"]
    reads = 0
    while any(w.poll() is None for w in writers):
        data = target.read_bytes()
        assert len(set(data[:100_000])) == 1 and data[100_000:].isdigit(), "a reader saw a mixed or half file"
        reads += 1
    errors = [w.stderr.read() for w in writers]
    assert [w.returncode for w in writers] == [0, 0], errors
    final = target.read_bytes()
    assert final in (b"A" * 100_000 + b"99", b"B" * 100_000 + b"99")
    assert temporaries(tmp_path) == [] and reads > 0


SLOW_WRITER = """
import sys, time
from pathlib import Path
from pytest_modeldiff.formats.atomic import atomic_open
with atomic_open(Path(sys.argv[1])) as f:
    for i in range(1000):
        f.write(b"n" * 1_000_000)
        f.flush()
        if i == 2:
            print("writing", flush=True)
        time.sleep(0.01)
"""


def test_a_process_killed_mid_write_leaves_the_old_file_and_its_temporary_is_cleaned_up(tmp_path):
    target = tmp_path / "ref.mdref"
    target.write_bytes(b"old")
    child = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(target)], stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline() == "writing\n"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    assert target.read_bytes() == b"old"
    left = temporaries(tmp_path)  # .{name}.{host}.{pid}.{random}.tmp
    assert [name.split(".")[-3] for name in left] == [str(child.pid)]
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and temporaries(tmp_path) == []
