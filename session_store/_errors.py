class BadInput(Exception):
    """Input a user or agent controls is wrong: one line, exit code 2, nothing changed."""


class SessionLocked(BadInput):
    """Another live engine holds the session's lock."""
