"""The store's YAML: PyYAML (imported only when needed) for what people and agents write,
and a fast dialect of its own for what the store writes: block mappings and lists of
plain scalars, strings as JSON strings (which YAML reads as double-quoted scalars).
`dump_plain` writes it, `parse_yaml` reads it without PyYAML (any other YAML goes to
PyYAML, so a hand-edited file reads as it always did)."""
from __future__ import annotations

import json
import re
import reprlib

from ._errors import BadInput

# YAML 1.1 reads unquoted yes/no/on/off/true/false as booleans
BOOLEAN_HINT = "(YAML reads unquoted yes/no/on/off/true/false as booleans: quote the value)"


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


def parse_yaml(text: str | bytes, source: str):
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return _pyyaml_load(text, source)   # PyYAML names what is wrong
    try:
        return load_plain(text)
    except (NotPlain, ValueError, RecursionError):   # PyYAML reads it, or names the error
        return _pyyaml_load(text, source)


def _pyyaml_load(text: str | bytes, source: str):
    """yaml.safe_load, refusing duplicate keys (PyYAML keeps the last one silently: a
    second `type:` in a signal, a second `backend:` in a config would win unseen)."""
    import yaml
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        duplicate = _duplicate_key(loader, node)
        if duplicate:
            raise BadInput(f"{source}: {duplicate}")
        return loader.construct_document(node)
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
    finally:
        loader.dispose()


_MERGE = "tag:yaml.org,2002:merge"   # `<<: *base`: its keys may be overridden


def _duplicate_key(loader, root) -> str | None:
    """'$.path: duplicate key NAME (line N)' for the first mapping that repeats a key,
    else None. Each node is visited once (an alias is not walked again: an alias bomb
    costs its size in nodes, not in leaves); keys compare as the mapping would (1, 1.0
    and true are one key)."""
    from yaml import MappingNode, ScalarNode, SequenceNode
    todo, seen = [(root, "$")], set()
    while todo:
        node, path = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, SequenceNode):
            todo += [(item, f"{path}[{i}]") for i, item in enumerate(node.value)]
        elif isinstance(node, MappingNode):
            keys: set = set()
            for key_node, value_node in node.value:
                if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE:
                    continue   # a complex key is refused when built; merged keys may repeat
                key = loader.construct_object(key_node)
                if key in keys:
                    named = key if isinstance(key, str) and _PLAIN_KEY.match(key) else shown(key)
                    return f"{path}: duplicate key {named} (line {key_node.start_mark.line + 1})"
                keys.add(key)
                todo.append((value_node, path + _path_part(key)))
    return None


def _path_part(key) -> str:
    """A key in a `$.path`, as the store's errors write it: `.name` or `['odd key']`."""
    return f".{key}" if isinstance(key, str) and _PLAIN_KEY.match(key) else f"[{shown(key)}]"


def dump_yaml(data) -> str:
    """YAML as people read it best (PyYAML's block style): config snapshots, CLI output,
    files holding what others wrote (any YAML value). The store's own files: dump_plain."""
    import yaml
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False, allow_unicode=True, width=100)


# --- plain documents, fast ---

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_YAML11_WORDS = {"yes", "no", "on", "off", "true", "false", "null"}
# what JSON leaves as is but YAML refuses (non-printable) or folds (its line breaks)
_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")


def _quoted(text: str) -> str:
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'   # what json.dumps gives, at a fraction of its cost
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(text, ensure_ascii=False))


def dump_plain(data: dict) -> str:
    """The store's own documents (plain data: str keys; str, int, float, bool, None, lists
    and dicts) as block YAML, an order of magnitude faster than PyYAML's pure-Python
    representer, which cost more than a millisecond per metadata write. Strings are
    written as JSON strings, which YAML reads as double-quoted scalars."""
    out: list[str] = []
    _mapping(data, "", out)
    return "\n".join(out) + "\n"


_KEYS: dict[str, str] = {}   # a document's keys, as written: field names, mostly


def _key(k: str) -> str:
    written = _KEYS.get(k)
    if written is None:
        written = k if _PLAIN_KEY.match(k) and k.lower() not in _YAML11_WORDS else _quoted(k)
        if len(_KEYS) < 4096:
            _KEYS[k] = written
    return written


def _scalar(v) -> str:
    kind = type(v)
    if kind is str:
        return _quoted(v)
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
        elif isinstance(v, (dict, list)):
            out.append(f"{pad}{_key(k)}: {_flow(v)}")
        else:
            out.append(f"{pad}{_key(k)}: {_scalar(v)}")


def _sequence(items: list, pad: str, out: list[str]) -> None:
    for v in items:
        if isinstance(v, dict) and v:
            start = len(out)
            _mapping(v, pad + "  ", out)
            out[start] = f"{pad}- {out[start][len(pad) + 2:]}"
        else:
            out.append(f"{pad}- {_flow(v)}")


class NotPlain(Exception):
    """The text is not in dump_plain's dialect (PyYAML reads it instead)."""


# besides _UNSAFE (what dump_plain escapes: what YAML refuses, or folds in a quoted string),
# the control characters JSON escapes too (a tab, a CR): none is in the dialect
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f]")
_PLAIN_INT = re.compile(r"-?(?:0|[1-9][0-9]*)\Z")
_PLAIN_FLOAT = re.compile(r"-?[0-9]+\.[0-9]+(?:e[-+][0-9]+)?\Z")   # as PyYAML's resolver
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # JSON pairs them, YAML does not
_KEY_LINE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*):(?: (.+))?\Z')   # key: scalar, or key:
_JSON = json.JSONDecoder()
_WORDS = {"null": None, "true": True, "false": False}


def load_plain(text: str) -> dict:
    """What PyYAML reads from `text`, when `text` is in dump_plain's dialect (a mapping at
    the top); else NotPlain. Anything it accepts, PyYAML reads the same."""
    if not text.endswith("\n") or _CONTROL.search(text) or _UNSAFE.search(text):
        raise NotPlain
    lines = text[:-1].split("\n")
    indents = [len(line) - len(line.lstrip(" ")) for line in lines]
    end, data = _load_mapping(lines, indents, 0, 0)
    if end != len(lines):
        raise NotPlain
    return data


def _load_mapping(lines: list[str], indents: list[int], i: int, indent: int) -> tuple[int, dict]:
    out: dict = {}
    n, key_line = len(lines), _KEY_LINE.match
    while i < n and indents[i] >= indent:
        if indents[i] != indent:
            raise NotPlain
        m = key_line(lines[i], indent)   # the common line, `key: scalar` or `key:`
        if m is not None:
            key, rest = m.group(1, 2)
            if key.lower() in _YAML11_WORDS:
                raise NotPlain
        else:
            key, rest = _load_quoted_key(lines[i][indent:])
        if key in out:
            raise NotPlain   # PyYAML's reading refuses it, naming the key's path
        if rest is None:   # a block below
            i, out[key] = _load_block(lines, indents, i + 1, indent + 2)
        else:
            out[key] = _load_scalar(rest)
            i += 1
    return i, out


def _load_block(lines: list[str], indents: list[int], i: int, indent: int) -> tuple[int, object]:
    if i >= len(lines) or indents[i] != indent:
        raise NotPlain   # `key:` with nothing below is null in YAML: not written so here
    if not lines[i].startswith("- ", indent):
        return _load_mapping(lines, indents, i, indent)
    items: list = []
    while i < len(lines) and indents[i] == indent and lines[i].startswith("- ", indent):
        body = lines[i][indent + 2:]
        if _KEY_LINE.match(body) or (body.startswith('"') and _quoted_key(body) is not None):
            # the item's mapping starts on its line
            lines[i], indents[i] = " " * (indent + 2) + body, indent + 2
            i, item = _load_mapping(lines, indents, i, indent + 2)
        else:
            item, i = _load_scalar(body), i + 1
        items.append(item)
    return i, items


def _load_quoted_key(body: str) -> tuple[str, str | None]:
    """(a JSON-quoted key, the scalar after it, or None when a block follows)."""
    found = _quoted_key(body) if body.startswith('"') else None
    if found is None:
        raise NotPlain
    key, end = found
    rest = body[end + 1:]
    if not rest:
        return key, None
    if not rest.startswith(" "):
        raise NotPlain
    return key, rest[1:]


def _quoted_key(body: str) -> tuple[str, int] | None:
    """A JSON-quoted key and where it ends, when `body` starts with one and a colon."""
    try:
        key, end = _JSON.raw_decode(body)
    except ValueError:
        return None
    if not isinstance(key, str) or body[end:end + 1] != ":" or _SURROGATE_ESCAPE.search(
            body[:end]) or body[end + 1:end + 2] not in ("", " "):
        return None
    return key, end


def _load_scalar(text: str):
    if text[:1] == '"' and text[-1] == '"' and text.count('"') == 2 and "\\" not in text:
        return text[1:-1]   # a JSON string without escapes is its own text
    if text.startswith('"') and not _SURROGATE_ESCAPE.search(text):
        try:
            value, end = _JSON.raw_decode(text)
        except ValueError:
            raise NotPlain from None
        if end == len(text) and isinstance(value, str):
            return value
        raise NotPlain
    if text in _WORDS:
        return _WORDS[text]
    if text == "{}":
        return {}
    if text == "[]":
        return []
    if _PLAIN_INT.match(text):
        return int(text)
    if _PLAIN_FLOAT.match(text):
        return float(text)
    raise NotPlain
