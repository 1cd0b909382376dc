"""`@record`: the store's attrs classes, made by `attrs.define`, with one repr for all.

attrs writes each class's methods as source and compiles it at import. The __repr__ it
writes is an f-string over every field, which Python 3.11 compiles slowly: ~0.4 ms a
class, ~8 ms of the start of each command that reads the store's records. This repr reads
the fields when it is called, and prints what attrs' would."""
from __future__ import annotations

from typing import dataclass_transform

import attrs


@dataclass_transform(field_specifiers=(attrs.field,))
def record(cls):
    cls = attrs.define(cls, repr=False)
    cls.__repr__ = _repr
    return cls


def _repr(self) -> str:
    fields = ", ".join(f"{a.name}={getattr(self, a.name)!r}" for a in attrs.fields(type(self)))
    return f"{type(self).__qualname__}({fields})"
