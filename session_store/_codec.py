"""Plain data <-> the store's and the config's attrs classes, through one cattrs
Converter, strictly: a wrong type, a missing required key, an unknown key or an unknown
enum value is an error naming its `$.path` (`$.a.b`, `$.list[0]`, `$.mapping['key']`,
as cattrs.transform_error spells them).

Imported only by what reads or writes typed records (`ralph status`, the engine, ...):
attrs and cattrs cost ~35 ms of imports, which agents' hot paths (`emit`, `progress`,
`signals poll`, `mcp`) never pay (session_store's imports are lazy).
"""
from __future__ import annotations

import enum
import functools
import types
from datetime import datetime, timezone

import attrs
import cattrs
from cattrs.cols import list_structure_factory, mapping_structure_factory
from cattrs.errors import ForbiddenExtraKeysError

from ._errors import BadInput
from ._schema import BOOLEAN_HINT, shown


def structure(data, cls, source: str):
    """Build `cls` from plain data; BadInput naming `source` and the first mistake's path.
    Data the store wrote is right: it is built by the converter without detailed
    validation, whose code is half as long to generate (a typed command builds each class
    once); what fails there is built again by the detailed one, which names the path."""
    data = {} if data is None else data
    try:
        return _fast.structure(data, cls)
    except Exception:
        pass
    try:
        return _detailed().structure(data, cls)
    except Exception as e:
        raise BadInput(f"{source}: {_lines(e, '$')[0]}") from None


def structure_each(data, cls) -> tuple[object, list[str]]:
    """Build `cls` from what is right in `data`, field by field, and list every mistake
    (`$.path: what`, one line each): a wrong field keeps its default, so checks on the
    values can run over the rest in the same pass. For classes whose every field has a
    default (a config)."""
    errors: list[str] = []
    return _each({} if data is None else data, cls, "$", errors), errors


def unstructure(obj):
    """attrs instances as dicts (fields in order), enums as values, times as ISO 8601."""
    return _fast.unstructure(obj)   # detailed validation is structuring's alone


def _each(data, cls, path: str, errors: list[str]):
    """A person's file: its mistakes in the file's order, then each unknown key on a line
    of its own with a suggestion. Field by field, as cattrs builds nothing of a class
    with one wrong field (and names its unknown keys together, without suggestions)."""
    if not isinstance(data, dict):
        errors.append(f"{path}: expected a mapping, got {_kind(data)}")
        return cls()
    fields = {a.name: a for a in attrs.fields(attrs.resolve_types(cls))}
    values = {}
    for key, value in data.items():
        field = fields.get(key)
        if field is None:
            continue
        where = f"{path}.{key}"
        inner = _class_of(field.type)
        if inner is not None and not (value is None and _optional(field.type)):
            if isinstance(value, dict):
                values[key] = _each(value, inner, where, errors)
            else:   # keeps its default
                errors.append(f"{where}: expected a mapping, got {_kind(value)}")
            continue
        try:
            values[key] = _detailed().structure(value, field.type)
        except Exception as e:
            errors += _lines(e, where)
    errors += [f"{path}: unknown key {k if isinstance(k, str) else shown(k)}"
               + _did_you_mean(k, list(fields)) for k in data if k not in fields]
    return cls(**values)


def _lines(exc: Exception, path: str) -> list[str]:
    """cattrs' nested errors as `$.path: what` lines (transform_error says `what @ path`;
    the NUL marks where `what` ends, whatever the path's keys hold)."""
    return [f"{where}: {what}" for what, _, where in
            (line.partition("\0 @ ") for line in cattrs.transform_error(exc, path, _what))]


def _what(exc: BaseException, _type) -> str:
    if isinstance(exc, ForbiddenExtraKeysError):
        keys = sorted(k if isinstance(k, str) else shown(k) for k in exc.extra_fields)
        what = f"unknown key {', '.join(keys)}"
    elif isinstance(exc, KeyError):
        what = "required key missing"
    else:   # the hooks below say what they expected
        what = str(exc)
    return what.replace("\0", "\\x00") + "\0"


# --- the hooks: strict where cattrs would coerce (int("3"), str(3), bool("no")) ---

def _strict(tp, name: str):
    def check(value, _):
        if type(value) is tp:
            return value
        if type(value) is bool:
            raise TypeError(f"expected {name}, got a boolean"
                            + (f" {BOOLEAN_HINT}" if tp is str else ""))
        if not isinstance(value, tp):
            raise TypeError(f"expected {name}, got {type(value).__name__}")
        return value
    return check


def _float(value, _):
    if type(value) is float:
        return value
    if type(value) is bool or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _datetime(value, _):
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


def _only(kind: type, name: str, build):
    """`build`, for a value of `kind` only (cattrs would take any iterable as a list)."""
    def check(value, tp):
        if not isinstance(value, kind):
            raise TypeError(f"expected {name}, got {_kind(value)}")
        return build(value, tp)
    return check


def _origin_is(kind: type):
    return lambda tp: getattr(tp, "__origin__", None) is kind


def _strict_converter(detailed: bool) -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=detailed)
    for tp, name in ((str, "a string"), (int, "an integer"), (bool, "a boolean")):
        converter.register_structure_hook(tp, _strict(tp, name))
    converter.register_structure_hook(float, _float)
    converter.register_structure_hook(datetime, _datetime)
    converter.register_unstructure_hook(datetime, datetime.isoformat)
    converter.register_structure_hook_func(
        lambda tp: isinstance(tp, type) and issubclass(tp, enum.Enum), _enum)
    converter.register_structure_hook_factory(
        _origin_is(list), lambda tp: _only(list, "a list", list_structure_factory(tp, converter)))
    converter.register_structure_hook_factory(
        _origin_is(dict),
        lambda tp: _only(dict, "a mapping", mapping_structure_factory(tp, converter)))
    converter.register_structure_hook_factory(
        attrs.has,
        lambda cls: _only(dict, "a mapping", converter.gen_structure_attrs_fromdict(cls)))
    return converter


_fast = _strict_converter(detailed=False)   # for data that is right: the store's own


@functools.cache
def _detailed() -> cattrs.Converter:
    """The converter that names every mistake's path: made at the first mistake, or for a
    person's file (a typed command that reads only the store's files never pays for it)."""
    return _strict_converter(detailed=True)


def _class_of(tp):
    """The attrs class `tp` is, or is Optional of; else None."""
    candidates = tp.__args__ if isinstance(tp, types.UnionType) else (tp,)
    return next((c for c in candidates if isinstance(c, type) and attrs.has(c)), None)


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
