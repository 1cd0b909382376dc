"""Everything ralph keeps on disk, behind a few verbs; file names and formats stay here.

Imports are lazy so that `ralph emit` (which needs only the event bus) stays as fast
to start as the bare interpreter.
"""
from importlib import import_module

_WHERE = {
    "BadInput": "_errors", "SessionLocked": "_errors", "RunOver": "_errors", "DiskFault": "_errors",
    "StaleMetadata": "_errors", "StoreUnreachable": "_errors",
    "UnknownSession": "_errors", "UnknownQuestion": "_errors", "AlreadyAnswered": "_errors",
    "QuestionCancelled": "_errors",
    "Lease": "_lock",
    "WorkArea": "_work", "open_beneath": "_work", "OutboxLine": "_outbox",
    "hold_engine_lock": "_outbox", "holds_engine_lock": "_outbox", "run_inbox": "_outbox",
    "RunChannel": "_runs", "SetAside": "_runs", "leftover_channels": "_runs",
    "state_root": "_places", "control_root": "_places", "work_root": "_places",
    "worktree_root": "_places",
    "State": "_types", "Status": "_types", "PauseKind": "_types", "ROLES": "_types",
    "Session": "_session", "EventReader": "_events",
    "SessionQuestions": "files._handles", "SessionSignals": "files._handles",
    "create": "_open", "load": "_open", "load_work_area": "_open", "list_ids": "_open",
    "resolve_id": "_open", "open_sessions": "_open", "open_channel": "_open",
    "check_id": "_ids", "new_session_id": "_ids",
    "sessions_root": "_session", "store_url": "_places",
    "Sessions": "files._channels", "ChannelFiles": "files._channels", "Held": "_interface",
    "Watching": "_watch", "watch": "_watch",
    "Iteration": "_iteration", "Attempt": "_iteration", "RunFiles": "_iteration",
    "append_event": "_events", "read_events": "_events", "now_iso": "_events",
    "tail_events": "_events", "REFUSED": "_events", "Change": "_interface",
    "SessionMetadata": "_metadata", "IterationMetadata": "_metadata",
    "PlannedTask": "_metadata", "LastTransitionRecord": "_metadata", "Rejection": "_metadata",
    "Assessment": "_metadata", "Limits": "_metadata", "Observations": "_metadata",
    "TaskCounts": "_progress", "LimitWait": "_metadata", "GitInfo": "_metadata",
    "InterruptedRun": "_metadata", "FailedRun": "_metadata",
    "QuotaReading": "_quota", "check_account": "_quota",
    "ACCOUNT_NAME": "_quota", "WINDOW_NAME": "_quota",
    "keep_bounded": "_runlog", "MAX_LOG_BYTES": "_runlog",
    "write_atomic": "_atomic", "make_dirs": "_atomic", "read_nofollow": "_atomic",
    "parse_yaml": "_schema", "dump_yaml": "_schema", "dump_plain": "_schema", "shown": "_schema",
    "structure": "_codec", "unstructure": "_codec", "structure_each": "_codec",
}
_RENAMED = {"acquire_lock": ("_lock", "acquire"), "running_pid": ("_lock", "running_pid")}
_MODULES = ("progress", "signals", "questions", "outbox", "runs")

__all__ = sorted([*_WHERE, *_RENAMED, *_MODULES])


def __getattr__(name):
    if name in _MODULES:
        return import_module(f"{__name__}._{name}")
    if name in _WHERE:
        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    if name in _RENAMED:
        module, attr = _RENAMED[name]
        return getattr(import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
