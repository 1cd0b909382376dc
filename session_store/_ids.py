"""The ids a store gives its sessions, channels, questions and logs: one pattern, safe as a
file name and as a database key."""
from __future__ import annotations

import os
import re
from datetime import datetime

from ._errors import BadInput

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_id(value: str, what: str = "session id") -> str:
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise BadInput(f"{what} {value!r}: expected [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return value


def new_session_id(now: datetime) -> str:
    return f"{now.strftime('%y%m%d-%H%M%S')}-{os.urandom(2).hex()}"
