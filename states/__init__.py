"""The six states of a session, and the work done in each (one module per state).

Only the names live here so that the store and the machine can share them without
importing any state's work.
"""
import enum
from importlib import import_module


class State(enum.Enum):
    PLANNING = "PLANNING"
    EXECUTING_BATCH = "EXECUTING_BATCH"
    REVIEWING_BATCH = "REVIEWING_BATCH"
    KNOWLEDGE_APPROVAL = "KNOWLEDGE_APPROVAL"
    PAUSED = "PAUSED"
    COMPLETE = "COMPLETE"

    def __str__(self) -> str:
        return self.value


def work_for(state: State):
    """The `run(engine)` function of a state's module: it does the work, returns (trigger, reason)."""
    return import_module(f"states.{state.value.lower()}").run
