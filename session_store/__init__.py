"""Everything ralph keeps on disk, behind a few verbs; file formats stay private.

Imports are lazy so that `ralph emit` (which needs only the event bus) stays as fast
to start as the bare interpreter.
"""
from importlib import import_module

__all__ = [
    "BadInput", "SessionLocked", "Session", "Iteration",
    "create", "load", "list_ids", "resolve_id", "check_id", "move_file", "sessions_root",
    "append_event", "read_events", "now_iso",
    "acquire_lock", "release_lock", "running_pid",
    "SessionMetadata", "IterationMetadata", "PlannedTask", "LastTransitionRecord", "Rejection", "Assessment", "Limits", "Status", "PauseKind",
    "progress", "signals", "questions", "write_atomic", "make_dirs", "structure", "parse_yaml", "dump_yaml",
    "unstructure",
]

_WHERE = {
    "BadInput": "_errors", "SessionLocked": "_errors",
    "Session": "_session", "Iteration": "_session", "create": "_session", "load": "_session",
    "list_ids": "_session", "resolve_id": "_session", "check_id": "_session",
    "move_file": "_session", "sessions_root": "_session",
    "append_event": "_events", "read_events": "_events", "now_iso": "_events",
    "SessionMetadata": "_metadata", "IterationMetadata": "_metadata",
    "PlannedTask": "_metadata", "LastTransitionRecord": "_metadata", "Rejection": "_metadata", "Assessment": "_metadata", "Limits": "_metadata", "Status": "_metadata",
    "PauseKind": "_metadata",
    "write_atomic": "_atomic", "make_dirs": "_atomic",
    "structure": "_schema", "parse_yaml": "_schema", "dump_yaml": "_schema",
    "unstructure": "_schema",
}
_RENAMED = {"acquire_lock": ("_lock", "acquire"), "release_lock": ("_lock", "release"),
            "running_pid": ("_lock", "running_pid")}


def __getattr__(name):
    if name in ("progress", "signals", "questions"):
        return import_module(f"{__name__}._{name}")
    if name in _WHERE:
        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    if name in _RENAMED:
        module, attr = _RENAMED[name]
        return getattr(import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
