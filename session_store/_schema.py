"""The store's formats: JSON for what the store writes itself (`dump_plain`), PyYAML
(imported only when needed) for what people and agents write. `parse_yaml` reads both:
JSON first, without PyYAML; any other YAML (a hand-edited file, one written by an older
ralph in its own YAML dialect) goes to PyYAML.

JSON rather than PyYAML or a dialect of ralph's own, by bench 15 (same run): one read and
one write of a session's metadata cost 39 µs as JSON, 93 µs in the dialect ralph had,
517 µs through PyYAML's C loader and dumper, which also cost a command 16 ms to import.
JSON is YAML 1.2, so a YAML reader reads these files too; what PyYAML (YAML 1.1) would
refuse or fold inside a string is escaped, and a float is written with its dot."""
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
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except (ValueError, RecursionError):   # PyYAML reads it, or names the error
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


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# what JSON leaves as is but YAML 1.1 refuses (non-printable) or folds (its line breaks)
_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")
# a float without a dot (1e-05): YAML 1.1 reads it as a string. Strings are matched
# first, so a number's look-alike inside one is left alone
_EXPONENT = re.compile(r'"(?:[^"\\]|\\.)*"|(?<![0-9.])(-?[0-9]+)(e[-+][0-9]+)')
_HAS_EXPONENT = re.compile(r"[0-9]e[-+]")


def dump_plain(data: dict) -> str:
    """The store's own documents (plain data: str keys; str, int, float, bool, None, lists
    and dicts) as JSON that YAML 1.1 readers read alike."""
    text = _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}",
                       json.dumps(data, ensure_ascii=False, indent=1, allow_nan=False))
    if _HAS_EXPONENT.search(text):
        text = _EXPONENT.sub(lambda m: m.group(0) if m.group(1) is None
                             else f"{m.group(1)}.0{m.group(2)}", text)
    return text + "\n"


def _unique_keys(pairs: list) -> dict:
    """A JSON object; one that repeats a key is left to PyYAML, which names it."""
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("duplicate key")
    return found


def _no_constant(name: str):
    raise ValueError(f"{name} is no JSON number")
