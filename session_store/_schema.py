"""Strict YAML <-> attrs classes: wrong type, unknown key or unknown enum value is an
error naming the file and the `$.path`."""
from __future__ import annotations

import difflib
import enum
import json
import re
import reprlib
import types
import typing
from datetime import datetime, timezone

import attrs
import cattrs
import yaml

from ._errors import BadInput

try:
    _Loader, _Dumper = yaml.CSafeLoader, yaml.CSafeDumper
except AttributeError:  # pragma: no cover - pyyaml without libyaml
    _Loader, _Dumper = yaml.SafeLoader, yaml.SafeDumper


# YAML 1.1 reads unquoted yes/no/on/off/true/false as booleans
BOOLEAN_HINT = "(YAML reads unquoted yes/no/on/off/true/false as booleans: quote the value)"


def _strict(kind, name):
    def structure(value, _type):
        if type(value) is bool and kind is not bool:
            raise TypeError(f"expected {name}, got a boolean"
                            + (f" {BOOLEAN_HINT}" if kind is str else ""))
        if not isinstance(value, kind):
            raise TypeError(f"expected {name}, got {type(value).__name__}")
        return value
    return structure


def _structure_float(value, _type):
    if type(value) is bool or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _structure_datetime(value, _type):
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise TypeError(f"expected an ISO 8601 time, got {type(value).__name__}")
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4
_REPR.maxstring = _REPR.maxother = 60


def shown(value) -> str:
    """A value for an error message, bounded: YAML aliases make a 600-byte file a list of
    9**9 items whose full repr never ends, and an int of 5,000 digits has no str()."""
    try:
        return _REPR.repr(value)
    except Exception:
        name = type(value).__name__
        return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def _structure_enum(value, cls):
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


def make_converter() -> cattrs.Converter:
    c = cattrs.Converter(forbid_extra_keys=True)
    c.register_structure_hook(int, _strict(int, "an integer"))
    c.register_structure_hook(str, _strict(str, "a string"))
    c.register_structure_hook(bool, _strict(bool, "a boolean"))
    c.register_structure_hook(float, _structure_float)
    c.register_structure_hook(datetime, _structure_datetime)
    c.register_unstructure_hook(datetime, lambda d: d.isoformat())
    c.register_structure_hook_func(lambda t: isinstance(t, type) and issubclass(t, enum.Enum),
                                   _structure_enum)
    c.register_unstructure_hook_func(lambda t: isinstance(t, type) and issubclass(t, enum.Enum),
                                     lambda e: e.value)
    return c


converter = make_converter()


def structure_errors(exc: BaseException) -> list[str]:
    """Every error of a failed structure, as `what @ $.path`."""
    return cattrs.transform_error(exc, format_exception=lambda e, _t: _describe_msg(e))


def _describe_msg(exc: BaseException) -> str:
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):   # keys may be None, 1, [a]...
        keys = sorted(k if isinstance(k, str) else shown(k) for k in exc.extra_fields)
        return f"unknown key {', '.join(keys)}"
    if isinstance(exc, KeyError):
        return "required key missing"
    return str(exc)


def parse_yaml(text: str | bytes, source: str):
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise BadInput(f"{source}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        # the constructors' own failures: an impossible date (2001-13-45), an int of more
        # than 4,300 digits, nesting deeper than the stack
        detail = str(e).splitlines()[0][:120] if str(e) else ""
        raise BadInput(f"{source}: not valid YAML: {type(e).__name__}"
                       + (f": {detail}" if detail else "")) from None


def dump_yaml(data) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


# --- plain documents, fast ---

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_YAML11_WORDS = {"yes", "no", "on", "off", "true", "false", "null"}
# what JSON leaves as is but YAML refuses (non-printable) or folds (its line breaks)
_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")


def _quoted(text: str) -> str:
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(text, ensure_ascii=False))


def dump_plain(data: dict) -> str:
    """The store's own documents (plain data: str keys; str, int, float, bool, None, lists
    and dicts) as block YAML, an order of magnitude faster than PyYAML's pure-Python
    representer, which cost more than a millisecond per metadata write. Strings are
    written as JSON strings, which YAML reads as double-quoted scalars."""
    out: list[str] = []
    _mapping(data, "", out)
    return "\n".join(out) + "\n"


def _key(k: str) -> str:
    if _PLAIN_KEY.match(k) and k.lower() not in _YAML11_WORDS:
        return k
    return _quoted(k)


def _scalar(v) -> str:
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        r = repr(v)
        # YAML 1.1 (PyYAML) reads 1e-05 as a string: a float needs its dot
        return r.replace("e", ".0e") if "e" in r and "." not in r else r
    if isinstance(v, str):
        return _quoted(v)
    raise TypeError(f"not plain data: {type(v).__name__}")


def _flow(v) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)}: {_flow(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_flow(x) for x in v) + "]"
    return _scalar(v)


def _mapping(data: dict, pad: str, out: list[str]) -> None:
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.append(f"{pad}{_key(k)}:")
            _mapping(v, pad + "  ", out)
        elif isinstance(v, list) and v:
            out.append(f"{pad}{_key(k)}:")
            _sequence(v, pad + "  ", out)
        else:
            out.append(f"{pad}{_key(k)}: {_flow(v)}")


def _sequence(items: list, pad: str, out: list[str]) -> None:
    for v in items:
        if isinstance(v, dict) and v:
            start = len(out)
            _mapping(v, pad + "  ", out)
            out[start] = f"{pad}- {out[start][len(pad) + 2:]}"
        else:
            out.append(f"{pad}- {_flow(v)}")


def structure(data, cls, source: str):
    """Build `cls` from plain data; BadInput naming `source` and the path otherwise."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadInput(f"{source}: $: expected a mapping, got {type(data).__name__}")
    try:
        return converter.structure(data, cls)
    except Exception as e:  # cattrs wraps every field error in a group
        errors = structure_errors(e)
        raise BadInput(f"{source}: {_path_first(errors[0])}") from None


def structure_each(data, cls) -> tuple[object, list[str]]:
    """Build `cls` from what is right in `data`, field by field, and list every mistake
    (`$.path: what`, one line each): a wrong field keeps its default, so checks on the
    values can run over the rest in the same pass. For attrs classes whose every field
    has a default (a config)."""
    errors: list[str] = []
    return _each(data, cls, "$", errors), errors


def _each(data, cls, path: str, errors: list[str]):
    if data is None and path == "$":
        data = {}   # an empty file
    if not isinstance(data, dict):
        errors.append(f"{path}: expected a mapping, got {_kind(data)}")
        return cls()
    hints = typing.get_type_hints(cls)
    names = [f.name for f in attrs.fields(cls)]
    values, unknown = {}, []
    for key, value in data.items():
        if key not in names:   # said after the fields' errors, as cattrs orders them
            unknown.append(f"{path}: unknown key {key if isinstance(key, str) else shown(key)}"
                           + _did_you_mean(key, names))
            continue
        where = f"{path}.{key}"
        inner = _attrs_class(hints[key])
        if inner is not None and isinstance(value, dict):
            values[key] = _each(value, inner, where, errors)
            continue
        if inner is not None and not (value is None and _optional(hints[key])):
            errors.append(f"{where}: expected a mapping, got {_kind(value)}")
            continue
        try:
            values[key] = converter.structure(value, hints[key])
        except Exception as e:
            for message in structure_errors(e):
                what, _, sub = message.rpartition(" @ $")
                errors.append(f"{where}{sub}: {what}" if what else f"{where}: {message}")
    errors += unknown
    return cls(**values)


def _did_you_mean(key, names: list[str]) -> str:
    close = difflib.get_close_matches(key, names, n=1) if isinstance(key, str) else []
    return f" (did you mean {close[0]}?)" if close else ""


def _attrs_class(tp):
    """The attrs class `tp` is, or is Optional of; else None."""
    candidates = typing.get_args(tp) if isinstance(tp, types.UnionType) else (tp,)
    return next((c for c in candidates if attrs.has(c)), None)


def _optional(tp) -> bool:
    return isinstance(tp, types.UnionType) and type(None) in typing.get_args(tp)


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {int: "an integer", float: "a number", str: "a string", list: "a list"}.get(
        type(value), type(value).__name__)


def _path_first(message: str) -> str:
    """'expected x @ $.a.b' -> '$.a.b: expected x'."""
    what, _, path = message.rpartition(" @ ")
    return f"{path}: {what}" if what else message


def unstructure(obj) -> dict:
    return converter.unstructure(obj)
