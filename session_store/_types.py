"""The vocabulary every layer shares: the machine's states, a session's status, why it
paused. It lives at the bottom so that the store records them without knowing the layers
above it."""
from __future__ import annotations

import enum

ROLES = ("planner", "executor", "reviewer", "librarian", "questioner")


class State(enum.Enum):
    PLANNING = "PLANNING"
    EXECUTING_BATCH = "EXECUTING_BATCH"
    REVIEWING_BATCH = "REVIEWING_BATCH"
    KNOWLEDGE_APPROVAL = "KNOWLEDGE_APPROVAL"
    PAUSED = "PAUSED"
    COMPLETE = "COMPLETE"

    def __str__(self) -> str:
        return self.value


class Status(enum.Enum):
    ACTIVE = "active"
    PAUSED = "paused"
    COMPLETED = "completed"
    ABORTED = "aborted"


class PauseKind(enum.Enum):
    SIGNAL = "signal"      # a PAUSE signal: exit 3
    LIMIT = "limit"        # max iterations / runtime / cost: exit 5
    QUESTION = "question"  # unanswered question with on_timeout: pause: exit 3
    FAILURE = "failure"    # the work cannot go on without a human: exit 3
    BLOCKER = "blocker"    # the same blocker three times: exit 3
    USAGE_LIMIT = "usage_limit"   # the agent CLI's usage limit, on_limit: pause: exit 3
    HOOK = "hook"          # a lifecycle hook failed with on_error: pause: exit 3
