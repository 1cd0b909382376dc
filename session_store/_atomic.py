"""Durable writes: every whole-file write is temp, fsync, rename, fsync of the directory.

Every durable write also passes through `durable_write_done`, the one place that tests
hook to trace or kill the process at a chosen write (RALPH_TEST_* variables, which only
tests set).
"""
from __future__ import annotations

import os
import signal

FILE_MODE = 0o600
DIR_MODE = 0o700

_write_count = 0


def durable_write_done(kind: str, path: str) -> None:
    """Count a durable write; tests may trace it or SIGKILL this process right after it."""
    global _write_count
    _write_count += 1
    trace = os.environ.get("RALPH_TEST_WRITE_TRACE")
    if trace:
        with open(trace, "a", encoding="utf-8") as f:
            f.write(f"{_write_count} {os.getpid()} {kind} {path}\n")
    crash_at = os.environ.get("RALPH_TEST_CRASH_AT_WRITE")
    if crash_at and int(crash_at) == _write_count:
        os.kill(os.getpid(), signal.SIGKILL)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: str) -> None:
    """Create a directory tree with private modes, fsyncing each parent that changed."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    make_dirs(parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return
    fsync_dir(parent)


def write_atomic(path: str, data: str | bytes, kind: str = "file") -> None:
    """Replace `path` with `data`: a reader sees the old file or the new one, never half."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)
    durable_write_done(kind, path)


def create_exclusive(path: str, data: str | bytes, kind: str = "file") -> bool:
    """Create `path` with `data` only if it does not exist; False when someone else won.

    Written to a temp file first and linked into place, so the file appears whole.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    fsync_dir(directory)
    durable_write_done(kind, path)
    return True


def rename_durable(src: str, dst: str, kind: str = "rename") -> None:
    """Move a file and make both directory entries durable."""
    os.rename(src, dst)
    fsync_dir(os.path.dirname(os.path.abspath(dst)))
    src_dir = os.path.dirname(os.path.abspath(src))
    if src_dir != os.path.dirname(os.path.abspath(dst)):
        fsync_dir(src_dir)
    durable_write_done(kind, dst)
