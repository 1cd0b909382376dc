"""The engine's writes into a session's work area (`<workspace>/.ralph-sessions/<id>/`).

Agents write there, and may plant a link anywhere in it: every path the engine writes is
walked from the work area's own descriptor, one component at a time, never through a
link, so nothing the engine writes there lands outside it (an agent that swaps the whole
directory for a link only moves its own replies out of its sight). Nothing written here
is read back to decide anything: these are the agents' inputs and the humans' views.
Stdlib only.
"""
from __future__ import annotations

import errno
import os
import stat

from ._atomic import DIR_MODE, FILE_MODE, disk, durable_write_done

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KEPT = 8   # directories a work area keeps open: the current iteration's, the inbox


class WorkArea:
    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None
        # the directories reached so far (walked once, kept for the engine's lifetime: one
        # an agent swaps for a link later is still the real one, reached before)
        self._dirs: dict[str, int] = {}

    def _root(self) -> int:
        if self._fd is None:
            with disk(self.path):
                _make_dir(self.path)
                self._fd = os.open(self.path, _DIR)
        return self._fd

    def start_fresh(self) -> None:
        """A new session's work area: whatever is at its place (left by an earlier session
        of that id, or planted by an agent for a session to come) is set aside first."""
        parent, name = os.path.split(self.path)
        if os.path.lexists(self.path):
            fd = os.open(parent, _DIR)
            try:
                _set_aside(fd, name)
            finally:
                os.close(fd)
        self.close()
        self._root()

    def refresh(self, *rels: str) -> None:
        """Forget the work area, or the directories `rels` of it (default: every one kept
        open), where they are no longer at their place (the work area removed by a `git
        clean`, a directory of it removed or swapped for a link): the next write reaches
        them anew (made again, a link set aside). One lstat each. (A directory kept and
        swapped meanwhile is still the real one, renamed: the engine's writes go there,
        never through the link.)"""
        if self._fd is not None and not _still_at(self.path, self._fd):
            self.close()
            return
        for key in rels or list(self._dirs):
            fd = self._dirs.get(key)
            if fd is not None and not _still_at(os.path.join(self.path, key), fd):
                os.close(self._dirs.pop(key))

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        # a Session let go without an engine's close (a view, a channel, a command that
        # loads sessions over and over) gives its descriptors back with it
        try:
            self.close()
        except (OSError, TypeError):   # TypeError: os already torn down at exit
            pass

    def dir_fd(self, rel: str = "") -> int:
        """A new descriptor of the directory `rel` (made when missing), reached without
        following a link; the caller closes it."""
        key = "/".join(p for p in rel.split("/") if p)
        if key not in self._dirs:
            if len(self._dirs) >= _KEPT:   # the oldest goes (an iteration left behind)
                os.close(self._dirs.pop(next(iter(self._dirs))))
            self._dirs[key] = self._walk(key)
        return os.dup(self._dirs[key])

    def _walk(self, rel: str) -> int:
        fd = os.dup(self._root())
        for part in [p for p in rel.split("/") if p]:
            try:
                child = _open_dir(fd, part)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
            fd = child
        return fd

    def open_dir(self, rel: str) -> int | None:
        """A new descriptor of the directory `rel`, for a reader (a view): reached from the
        workspace without following a link and without changing anything; None where no
        directory is (missing, or a link or a file in its place). The caller closes it.
        (One this work area has reached already is that one.)"""
        key = "/".join(p for p in rel.split("/") if p)
        if key in self._dirs:
            return os.dup(self._dirs[key])
        workspace = os.path.dirname(os.path.dirname(self.path))
        parts = [*os.path.relpath(self.path, workspace).split(os.sep),
                 *(p for p in rel.split("/") if p)]
        try:
            fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        for part in parts:
            try:
                child = os.open(part, _DIR, dir_fd=fd)
            except OSError:
                return None
            finally:
                os.close(fd)
            fd = child
        return fd

    def open_file(self, path: str, readable: bool = False) -> int:
        """Open `path`, a file of this work area, for writing from its start (private, made
        when missing; `readable`: for reading too), every directory on the way walked
        without following a link: an agent that swaps `logs/` for a link does not make the
        engine write there."""
        rel = os.path.relpath(path, self.path)
        if rel.startswith(".."):
            raise ValueError(f"{path} is not under {self.path}")
        folder, name = os.path.split(rel)
        access = os.O_RDWR if readable else os.O_WRONLY
        fd = self.dir_fd(folder)
        try:
            with disk(path):
                try:
                    return os.open(name, access | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                                   | os.O_NONBLOCK | os.O_CLOEXEC, FILE_MODE, dir_fd=fd)
                except OSError as e:
                    if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                        raise
                    _set_aside(fd, name)   # a link, a FIFO, a directory planted at the name
                    return os.open(name, access | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                                   FILE_MODE, dir_fd=fd)
        finally:
            os.close(fd)

    def write(self, rel: str, data: str | bytes, kind: str = "work-area") -> str:
        """Replace the file `rel` whole (temp file, rename; no fsync: a view or a reply,
        rebuilt or asked again after a crash)."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        folder, name = os.path.split(rel)
        path = os.path.join(self.path, rel)
        with disk(path):
            fd = self.dir_fd(folder)
            try:
                write_at(fd, name, data)
            finally:
                os.close(fd)
        durable_write_done(kind, path, durable=False)
        return path

    def leads_out(self, rel: str) -> bool:
        """Whether the path `rel` of the work area passes through a link (the work area, or
        `.ralph-sessions/` above it, swapped for one too): a path-based walk or move there
        would leave the workspace. (The engine reads and moves by path only while no agent
        runs, so a check now holds.)"""
        workspace = os.path.dirname(os.path.dirname(self.path))
        here = os.path.join(self.path, rel)
        return os.path.realpath(here) != os.path.join(os.path.realpath(workspace),
                                                      os.path.relpath(here, workspace))

    def read(self, rel: str) -> bytes | None:
        folder, name = os.path.split(rel)
        try:
            fd = self.dir_fd(folder)
        except OSError:
            return None
        try:
            f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                        dir_fd=fd)
        except OSError:
            return None
        finally:
            os.close(fd)
        with os.fdopen(f, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                return None
            return file.read()

    def clear(self, folder: str) -> None:
        """Remove the files of `folder` (its subdirectories are left alone)."""
        fd = self.dir_fd(folder)
        try:
            for entry in os.scandir(fd):
                if not entry.is_dir(follow_symlinks=False):
                    _unlink(fd, entry.name)
        finally:
            os.close(fd)


def write_at(dir_fd: int, name: str, data: bytes) -> None:
    """`name` in the directory `dir_fd` replaced whole by `data`: a temp file of a name
    nobody can plant beforehand, renamed in (no fsync). OSError where a directory is at
    `name` (the caller sets it aside, if it will)."""
    tmp = f".{name}.{os.urandom(4).hex()}.tmp"
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                  FILE_MODE, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
        finally:
            os.close(out)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink(dir_fd, tmp)
        raise


def open_beneath(root: str, path: str, readable: bool = False) -> int:
    """`WorkArea(root).open_file(path)`, for a caller that holds no work area (a run's
    process, which opens its logs once)."""
    work = WorkArea(root)
    try:
        return work.open_file(path, readable)
    finally:
        work.close()


def _still_at(path: str, fd: int) -> bool:
    """Whether the directory open as `fd` is what `path` names now (no link followed)."""
    try:
        now = os.lstat(path)
    except OSError:
        return False
    then = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (then.st_dev, then.st_ino)


def _open_dir(fd: int, name: str) -> int:
    """The directory `name` in `fd`, made when missing; a link or a file planted where it
    belongs is set aside and the directory made anew."""
    try:
        return os.open(name, _DIR, dir_fd=fd)
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        _set_aside(fd, name)
    try:
        os.mkdir(name, DIR_MODE, dir_fd=fd)
    except FileExistsError:   # made meanwhile (another writer)
        pass
    return os.open(name, _DIR, dir_fd=fd)


def _make_dir(path: str) -> None:
    """The work area and `.ralph-sessions/` above it (the workspace is the user's), made
    when missing; a link or a file in the place of either is set aside."""
    parent = os.path.dirname(path)
    os.makedirs(os.path.dirname(parent), DIR_MODE, exist_ok=True)   # the workspace
    for level in (parent, path):
        if _made(level) or stat.S_ISDIR(os.lstat(level).st_mode):
            continue
        above, name = os.path.split(level)
        fd = os.open(above, _DIR)
        try:
            _set_aside(fd, name)
        finally:
            os.close(fd)
        _made(level)


def _made(path: str) -> bool:
    """mkdir; False where something is there already (another engine starting beside
    this one may have made it a moment ago: not an error)."""
    try:
        os.mkdir(path, DIR_MODE)
        return True
    except FileExistsError:
        return False


def _set_aside(dir_fd: int, name: str) -> None:
    os.rename(name, f".{name}.planted-{os.urandom(3).hex()}", src_dir_fd=dir_fd,
              dst_dir_fd=dir_fd)


def _unlink(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
