class BadInput(Exception):
    """Input a user or agent controls is wrong: one line, exit code 2, nothing changed."""


class SessionLocked(BadInput):
    """Another live engine holds the session's lock."""


class RunOver(BadInput):
    """An event from an agent run that is over (finished, stopped, timed out, or of an
    engine that is gone): refused, recorded as refused, never acted upon."""


class UnknownSession(BadInput):
    """No session of that id in the workspace."""


class UnknownQuestion(BadInput):
    """No question of that id in the session."""


class AlreadyAnswered(BadInput):
    """The question has its one answer already (the first answer wins); nothing changed."""


class QuestionCancelled(BadInput):
    """The question was cancelled: it takes no answer."""
