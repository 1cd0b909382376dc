"""ralph's own secrets (the Telegram bot token, the web view's token, any RALPH_*_TOKEN,
_KEY, _SECRET, _PASSWORD, the store's URL and its password): never in an agent's environment, argv or a
file an agent can read, and not readable from the engine's /proc/<pid>/environ either.

/proc/<pid>/environ shows the environment block the process was started with, and any
process of the same user (an agent's shell, say) may read it. The values stay usable in
os.environ (the process's own copy); the block itself is overwritten in place, through
/proc/self/mem, at the start of every command that holds one.
"""
from __future__ import annotations

import os

_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "STORE_URL")
# where libpq finds the store's password beside its URL (~/.pgpass is a file the user keeps)
_STORE_CREDENTIALS = ("PGPASSWORD", "PGPASSFILE", "PGSERVICEFILE")


def secret(name: str) -> bool:
    """A variable of ralph's own (or of its store's) that no agent gets."""
    return name in _STORE_CREDENTIALS or (
        name.startswith("RALPH_") and any(word in name for word in _SECRET_WORDS))


def hide_from_proc() -> int:
    """Overwrite the values of secret variables in this process's original environment
    block (what /proc/<pid>/environ reads); os.environ keeps them. Returns how many were
    hidden (0 where /proc cannot be written: then nothing changes)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])   # env_start, env_end (fields 50, 51)
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            block = mem.read(end - start)
            hidden = []
            offset = 0
            for item in block.split(b"\0"):
                name, eq, value = item.partition(b"=")
                if eq and value and secret(name.decode(errors="replace")):
                    mem.seek(start + offset + len(name) + 1)
                    mem.write(b"*" * len(value))
                    hidden.append(os.fsdecode(name))
                offset += len(item) + 1
    except (OSError, IndexError, ValueError):
        return 0
    for name in hidden:   # the C library's environment (what a child inherits) pointed
        if name in os.environ:   # into the block: it gets its own copy of the value again
            os.environ[name] = os.environ[name]
    return len(hidden)
