"""What an account's usage windows stood at, as its agent CLIs last said (Claude Code's
`rate_limit_event`): one reading per window, shared by every session on the account, so
one engine's reading holds the others back. The file store keeps an account's readings
in the state directory, out of the agents' reach:

    <state root>/accounts/<account>.json   {window: reading}, rewritten atomically under
                                           a flock of <account>.lock (a read-merge-write)

the PostgreSQL store in a table (postgres/_quota), for a fleet on one account.

A newer reading of a window replaces an older one; none grows: a window's reading is one
record, whatever the number of runs."""
from __future__ import annotations

import fcntl
import json
import os
import re
from datetime import datetime

from ._atomic import FILE_MODE, make_dirs, read_nofollow, write_atomic
from ._codec import structure, unstructure
from ._errors import BadInput
from ._places import state_root
from ._record import record

ACCOUNT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")
WINDOW_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
MAX_READINGS_BYTES = 1 << 16    # an account's file: a few windows, never more


@record
class QuotaReading:
    """A window of an account: `percent` used (0 to 100) when `seen_at`, resetting at
    `resets_at` (None: the CLI said no reset); `agent` and `session` say who saw it."""
    window: str
    percent: float
    resets_at: datetime | None
    seen_at: datetime
    agent: str
    session: str | None = None


def check_account(account: str) -> str:
    if not isinstance(account, str) or not ACCOUNT_NAME.fullmatch(account):
        raise BadInput(f"account {account!r}: expected letters, digits and . _ @ + - (at "
                       f"most 64, starting with a letter or digit)")
    return account


def newer(known: QuotaReading | None, new: QuotaReading) -> bool:
    return known is None or new.seen_at >= known.seen_at


def parse_readings(text: str | bytes) -> dict[str, QuotaReading]:
    """An account's readings as stored; what does not read as one is left out."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    found = {}
    for window, value in (data.items() if isinstance(data, dict) else ()):
        try:
            reading = structure(value, QuotaReading, "quota")
        except BadInput:
            continue
        if isinstance(window, str) and WINDOW_NAME.fullmatch(window):
            found[window] = reading
    return found


def dump_readings(readings: dict[str, QuotaReading]) -> str:
    return json.dumps({w: unstructure(r) for w, r in sorted(readings.items())})


def _folder() -> str:
    return os.path.join(state_root(), "accounts")


def read_account(account: str) -> dict[str, QuotaReading]:
    """The file store's readings of `account`, by window (none yet: {})."""
    path = os.path.join(_folder(), check_account(account) + ".json")
    try:
        return parse_readings(read_nofollow(path, MAX_READINGS_BYTES))
    except OSError:
        return {}


def record_reading(account: str, reading: QuotaReading) -> bool:
    """Keep `reading` as the account's latest of its window unless a newer one is there
    (another engine's): True when it was kept."""
    folder = _folder()
    make_dirs(folder)
    name = check_account(account)
    fd = os.open(os.path.join(folder, name + ".lock"),
                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)   # the read-merge-write of every engine on it
        readings = read_account(name)
        if not newer(readings.get(reading.window), reading):
            return False
        readings[reading.window] = reading
        write_atomic(os.path.join(folder, name + ".json"), dump_readings(readings), "quota")
        return True
    finally:
        os.close(fd)
