"""ralph's version, as its installed metadata says (`ralph --version`, `ralph mcp`'s
serverInfo). Read only when asked: importlib.metadata costs a command that does not
already load it ~20 ms."""
from __future__ import annotations


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as installed
    try:
        return installed("ralph")
    except PackageNotFoundError:   # run from a checkout that was never installed
        return "unknown (not installed)"
