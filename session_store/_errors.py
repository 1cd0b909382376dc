class BadInput(Exception):
    """Input a user or agent controls is wrong: one line, exit code 2, nothing changed."""


class SessionLocked(BadInput):
    """Another live engine holds the session's lock."""


class RunOver(BadInput):
    """An event from an agent run that is over (finished, stopped, timed out, or of an
    engine that is gone): refused, recorded as refused, never acted upon."""
