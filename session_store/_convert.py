"""Plain data <-> the store's and the config's dataclasses, strictly: a wrong type, a
missing required key, an unknown key or an unknown enum value is an error naming its
`$.path`.

Written here rather than taken from cattrs (and on dataclasses rather than attrs): the
two libraries cost every command ~30 ms of imports, more than the work of `ralph signal`,
and the few types used (str, int, float, bool, datetime, enums, dataclasses, `X | None`,
`list[X]`, `dict[str, X]`) need little.
Paths read as cattrs wrote them: `$.a.b`, `$.list[0]`, `$.mapping['key']`.
"""
from __future__ import annotations

import dataclasses
import enum
import sys
import types
from datetime import datetime, timezone

from ._errors import BadInput
from ._schema import BOOLEAN_HINT, shown

_WRONG = object()   # what a value that failed to build becomes (its error is listed)
_PLAIN = frozenset({str, int, float, bool, type(None)})


def structure(data, cls, source: str):
    """Build `cls` from plain data; BadInput naming `source` and the first mistake's path."""
    if data is None:
        data = {}
    errors: list[str] = []
    obj = _fields(data, cls, "$", errors, lenient=False)
    if errors:
        raise BadInput(f"{source}: {errors[0]}")
    return obj


def structure_each(data, cls) -> tuple[object, list[str]]:
    """Build `cls` from what is right in `data`, field by field, and list every mistake
    (`$.path: what`, one line each): a wrong field keeps its default, so checks on the
    values can run over the rest in the same pass. For dataclasses whose every field
    has a default (a config)."""
    errors: list[str] = []
    if data is None:
        data = {}   # an empty file
    return _fields(data, cls, "$", errors, lenient=True), errors


def unstructure(obj):
    """Dataclass instances as dicts (fields in order), enums as values, times as ISO 8601."""
    kind = type(obj)
    if kind in _PLAIN:
        return obj
    if hasattr(kind, "__dataclass_fields__"):
        out = {}
        for f in _fields_of(kind):
            value = getattr(obj, f[0])
            out[f[0]] = value if type(value) in _PLAIN else unstructure(value)
        return out
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, dict):
        return {k: unstructure(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [unstructure(v) for v in obj]
    return obj


# --- how each field is built: worked out once per class, then only run ---

_FIELDS: dict[type, tuple] = {}
_BUILDERS: dict[object, object] = {}


def _fields_of(cls) -> tuple:
    """(name, builder, required, dataclass it is or is Optional of, optional) per field."""
    found = _FIELDS.get(cls)
    if found is None:
        # the annotations are strings (postponed evaluation); read as typing would, in the
        # class's module, without importing typing (2 ms of every command)
        names = vars(sys.modules[cls.__module__])
        rows = []
        for f in dataclasses.fields(cls):
            tp = eval(f.type, names) if isinstance(f.type, str) else f.type
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            rows.append((f.name, _builder(tp), required, _class_of(tp), _optional(tp)))
        found = _FIELDS[cls] = tuple(rows)
    return found


def _builder(tp):
    """A function (value, path, errors) -> `value` as `tp`, or _WRONG with its mistakes
    appended to `errors`."""
    found = _BUILDERS.get(tp)
    if found is not None:
        return found
    if _is_class(tp):
        def build(value, path, errors):
            return _fields(value, tp, path, errors, lenient=False)
    elif isinstance(tp, types.UnionType):   # X | None, the only union the store uses
        (inner,) = [_builder(t) for t in tp.__args__ if t is not type(None)]

        def build(value, path, errors):
            return None if value is None else inner(value, path, errors)
    elif getattr(tp, "__origin__", None) is list:
        item = _builder(tp.__args__[0])

        def build(value, path, errors):
            return _list(value, item, path, errors)
    elif getattr(tp, "__origin__", None) is dict:
        key, item = (_builder(t) for t in tp.__args__)

        def build(value, path, errors):
            return _dict(value, key, item, path, errors)
    else:
        check = _scalar(tp)

        def build(value, path, errors):
            try:
                return check(value)
            except (TypeError, ValueError, OverflowError) as e:
                errors.append(f"{path}: {e}")
                return _WRONG
    _BUILDERS[tp] = build
    return build


def _fields(data, cls, path: str, errors: list[str], lenient: bool):
    """A dataclass instance. Strict: any mistake makes it _WRONG. Lenient (a config): a
    wrong field keeps its default, and each unknown key is its own line with a suggestion."""
    if not isinstance(data, dict):
        errors.append(f"{path}: expected a mapping, got {_kind(data)}")
        return _WRONG if not lenient else cls()
    fields = _fields_of(cls)
    if lenient:   # a person's file: its mistakes in the file's order
        by_name = {f[0]: f for f in fields}
        fields = [by_name[k] for k in data if k in by_name] + [f for f in fields if f[0] not in data]
    values, wrong = {}, False
    for name, build, required, inner, optional in fields:
        if name not in data:
            if required:
                errors.append(f"{path}.{name}: required key missing")
                wrong = True
            continue
        value = data[name]
        if lenient and inner is not None and not (value is None and optional):
            if isinstance(value, dict):
                values[name] = _fields(value, inner, f"{path}.{name}", errors, lenient)
            else:   # keeps its default
                errors.append(f"{path}.{name}: expected a mapping, got {_kind(value)}")
            continue
        built = build(value, f"{path}.{name}", errors)
        if built is _WRONG:
            wrong = True
        else:
            values[name] = built
    if len(data) > len(values):   # keys no field has, or wrong fields
        names = [f[0] for f in _fields_of(cls)]
        extra = [k for k in data if k not in names]
        if extra and lenient:   # said after the fields' errors, as cattrs ordered them
            errors += [f"{path}: unknown key {k if isinstance(k, str) else shown(k)}"
                       + _did_you_mean(k, names) for k in extra]
        elif extra:
            keys = sorted(k if isinstance(k, str) else shown(k) for k in extra)
            errors.append(f"{path}: unknown key {', '.join(keys)}")
            wrong = True
    if wrong and not lenient:
        return _WRONG
    return cls(**values)


def _list(value, item, path: str, errors: list[str]):
    if not isinstance(value, list):
        errors.append(f"{path}: expected a list, got {_kind(value)}")
        return _WRONG
    out = [item(v, f"{path}[{i}]", errors) for i, v in enumerate(value)]
    return _WRONG if any(v is _WRONG for v in out) else out


def _dict(value, key_type, item, path: str, errors: list[str]):
    if not isinstance(value, dict):
        errors.append(f"{path}: expected a mapping, got {_kind(value)}")
        return _WRONG
    out = {}
    for k, v in value.items():
        where = f"{path}[{shown(k)}]"
        key, built = key_type(k, where, errors), item(v, where, errors)
        if key is _WRONG or built is _WRONG:
            return _WRONG
        out[key] = built
    return out


def _scalar(tp):
    """A check (value -> value as `tp`, or TypeError/ValueError saying what is wrong)."""
    if tp is str or tp is int or tp is bool:
        name = {str: "a string", int: "an integer", bool: "a boolean"}[tp]

        def check(value):
            if type(value) is tp:
                return value
            if type(value) is bool:
                raise TypeError(f"expected {name}, got a boolean"
                                + (f" {BOOLEAN_HINT}" if tp is str else ""))
            if not isinstance(value, tp):
                raise TypeError(f"expected {name}, got {type(value).__name__}")
            return value
        return check
    if tp is float:
        return _float
    if tp is datetime:
        return _datetime
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return lambda value: _enum(value, tp)
    if tp is object:
        return lambda value: value
    raise TypeError(f"the store cannot build a {tp!r}")   # a new field type: add it above


def _float(value):
    if type(value) is float:
        return value
    if type(value) is bool or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _datetime(value):
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise TypeError(f"expected an ISO 8601 time, got {type(value).__name__}")
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _enum(value, cls):
    # only scalars reach Enum(): its own error shows repr(value), which never ends for
    # an alias bomb
    if isinstance(value, (str, int, float)):
        try:
            return cls(value)
        except (ValueError, TypeError):
            pass
    allowed = ", ".join(str(m.value) for m in cls)
    hint = f" {BOOLEAN_HINT}" if type(value) is bool else ""
    raise ValueError(f"expected one of {allowed}, got {shown(value)}{hint}")


def _is_class(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _class_of(tp):
    """The dataclass `tp` is, or is Optional of; else None."""
    candidates = tp.__args__ if isinstance(tp, types.UnionType) else (tp,)
    return next((c for c in candidates if _is_class(c)), None)


def _optional(tp) -> bool:
    return isinstance(tp, types.UnionType) and type(None) in tp.__args__


def _did_you_mean(key, names: list[str]) -> str:
    if not isinstance(key, str):
        return ""
    import difflib   # only when a key is wrong
    close = difflib.get_close_matches(key, names, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {int: "an integer", float: "a number", str: "a string", list: "a list"}.get(
        type(value), type(value).__name__)
