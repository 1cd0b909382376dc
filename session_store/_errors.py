import errno


class BadInput(Exception):
    """Input a user or agent controls is wrong: one line, exit code 2, nothing changed."""


class SessionLocked(BadInput):
    """Another live engine holds the session's lock."""


class RunOver(BadInput):
    """An event from an agent run that is over (finished, stopped, timed out, or of an
    engine that is gone): refused, recorded as refused, never acted upon."""


class StaleMetadata(BadInput):
    """Another writer saved the session's metadata since this handle read it: nothing
    written (the store's compare-and-set; under the run lease it never happens)."""


class StoreUnreachable(BadInput):
    """The store's database did not answer within its reconnect window: one line, and the
    engine stops resumably (nothing half-written: a transaction is whole or absent)."""


class UnknownSession(BadInput):
    """No session of that id in the workspace."""


class UnknownQuestion(BadInput):
    """No question of that id in the session."""


class AlreadyAnswered(BadInput):
    """The question has its one answer already (the first answer wins); nothing changed."""


class QuestionCancelled(BadInput):
    """The question was cancelled: it takes no answer."""


class DiskFault(Exception):
    """The disk refused a write: full, over quota, failing or read-only. What was being
    written is left as it was (temp files removed); the engine pauses on it (exit 3), a
    one-shot command exits 2."""

    WHY = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded",
           errno.EIO: "I/O error", errno.EROFS: "read-only file system"}

    def __init__(self, path: str, errno_: int):
        self.path, self.errno = path, errno_
        super().__init__(f"{self.WHY.get(errno_, 'disk error')} on {path}")
