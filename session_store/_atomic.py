"""Durable writes: every whole-file write is temp, fsync, rename, fsync of the directory.

Every write also passes through `durable_write_done`, the one place that tests hook to
trace or kill the process at a chosen write (RALPH_TEST_* variables, which only tests
set). A few files the store can rebuild (the plan's views, a task in progress) are
written atomically without fsync: a kill leaves the old or the new one all the same; only
a power loss may take them back, and then they are rebuilt or redone. `fsyncs` counts
what the disk is asked to flush (the benchmarks report it).
"""
from __future__ import annotations

import errno
import itertools
import os
import signal
import stat
import threading
from contextlib import contextmanager

from ._errors import DiskFault

FILE_MODE = 0o600
DIR_MODE = 0o700

_temp_serial = itertools.count()   # next() is atomic under the GIL
_write_count = 0
durable_writes = 0   # of them, those made durable (fsync'd), for the benchmarks
fsyncs = 0


def fsync(fd: int) -> None:
    global fsyncs
    fsyncs += 1
    os.fsync(fd)


def durable_write_done(kind: str, path: str, durable: bool = True) -> None:
    """Count a write; tests may trace it or SIGKILL this process right after it."""
    global _write_count, durable_writes
    _write_count += 1
    durable_writes += durable
    trace = os.environ.get("RALPH_TEST_WRITE_TRACE")
    if trace:
        with open(trace, "a", encoding="utf-8") as f:
            f.write(f"{_write_count} {os.getpid()} {kind} {path}\n")
    crash_at = os.environ.get("RALPH_TEST_CRASH_AT_WRITE")
    if crash_at and int(crash_at) == _write_count:
        os.kill(os.getpid(), signal.SIGKILL)
    fill_at = os.environ.get("RALPH_TEST_FILL_DISK_AT_WRITE")
    if fill_at and int(fill_at) == _write_count:
        _fill_disk(os.environ["RALPH_TEST_BALLAST"])
    eio_at = os.environ.get("RALPH_TEST_EIO_AT_WRITE")
    if eio_at and int(eio_at) == _write_count:
        # the tests' failing disk (tests/support/eio_shim.c): from now on, I/O errors
        with open(os.environ["RALPH_TEST_EIO_FLAG"], "w"):
            pass


def _fill_disk(ballast: str) -> None:
    """The tests' full disk: write `ballast` until the file system has no room left."""
    with open(ballast, "ab", buffering=0) as f:
        for size in (1 << 20, 1 << 16, 1 << 12, 1):
            chunk = b"\0" * size
            try:
                while True:
                    f.write(chunk)
            except OSError:
                pass


@contextmanager
def disk(path: str):
    """A write to `path`: the disk's refusals (full, failing, read-only) become DiskFault,
    naming the path."""
    try:
        yield
    except OSError as e:
        if e.errno in DiskFault.WHY:
            raise DiskFault(path, e.errno) from None
        raise


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def temp_name(path: str) -> str:
    """A temp file beside `path`, unique to this call: two threads (or processes) writing
    one file at once never share a temp file (the last rename wins, each whole)."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.{os.getpid()}-{threading.get_ident()}-"
                                   f"{next(_temp_serial)}.tmp")


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def make_dirs(*paths: str) -> None:
    """Create directory trees with private modes, then fsync each parent that changed,
    once: an iteration's five subdirectories cost one flush of their parent, not five."""
    changed: set[str] = set()
    for path in paths:
        _make_tree(os.path.abspath(path), changed)
    for parent in sorted(changed, key=len, reverse=True):   # deepest first
        with disk(parent):
            fsync_dir(parent)


def _make_tree(path: str, changed: set[str]) -> None:
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    _make_tree(parent, changed)
    with disk(path):
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            return
    changed.add(parent)


def open_private(path: str) -> int:
    """Open `path` for writing from its start, as a private file of our own: never through
    a symlink or into a file linked elsewhere (whoever planted one there, an agent can
    write in the workspace), always mode 0600. Returns the fd."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, FILE_MODE)
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == os.getuid():
            os.fchmod(fd, FILE_MODE)
            return fd
        os.close(fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise
    os.unlink(path)   # the entry, not what it points to: then a fresh file of our own
    return os.open(path, flags | os.O_EXCL, FILE_MODE)


def read_nofollow(path: str, limit: int = -1) -> bytes:
    """A file's bytes; a symlink at `path` is refused (OSError ELOOP), never followed, so
    nothing outside the session is read into it."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def write_atomic(path: str, data: str | bytes, kind: str = "file", durable: bool = True) -> None:
    """Replace `path` with `data`: a reader sees the old file or the new one, never half.
    Not `durable`: no fsync (see above). A disk that refuses it leaves the old file."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    directory = os.path.dirname(os.path.abspath(path))
    tmp = temp_name(path)
    with disk(path):
        fd = open_private(tmp)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if durable:
                    fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            unlink_quietly(tmp)
            raise
        if durable:
            fsync_dir(directory)
    durable_write_done(kind, path, durable)


def create_exclusive(path: str, data: str | bytes, kind: str = "file") -> bool:
    """Create `path` with `data` only if it does not exist; False when someone else won.

    Written to a temp file first and linked into place, so the file appears whole.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    directory = os.path.dirname(os.path.abspath(path))
    tmp = temp_name(path)
    with disk(path):
        fd = open_private(tmp)
        try:
            try:
                os.write(fd, data)
                fsync(fd)
            finally:
                os.close(fd)
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            unlink_quietly(tmp)
        fsync_dir(directory)
    durable_write_done(kind, path)
    return True


def rename_durable(src: str, dst: str, kind: str = "rename") -> None:
    """Move a file and make both directory entries durable."""
    with disk(dst):
        os.rename(src, dst)
        fsync_dir(os.path.dirname(os.path.abspath(dst)))
        src_dir = os.path.dirname(os.path.abspath(src))
        if src_dir != os.path.dirname(os.path.abspath(dst)):
            fsync_dir(src_dir)
    durable_write_done(kind, dst)
