"""Issue 8: hypothesis fuzzing of every input a user or an agent controls.

ralph.yml, `ralph emit` argv and payloads, the event schemas, answers and question ids,
session ids and signal targets (through the store and the CLI, in-process), Telegram
updates (through the bot's own update handler, with a stand-in Bot object), the event
bus's file contents, knowledge promotion records, and raw lines in a session's outbox
(what an agent can write there past its tools, read by a real engine). Pure functions run
in-process; two real sessions check what an agent can plant: garbage events on the topics
the engine reads, and symlinks in the session's work area (scratchpad, knowledge, logs)
and, where someone could, in its control plane (signals, questions, guidance, the engine's
own temp files).

A session's control plane (Session.dir) is in the state directory, its work area
(Session.work_dir) in the workspace: "nothing written anywhere" looks at both (`planes`).

Every generated case is counted (`CASES`); the last test checks that the file ran at
least 10,000 of them. tests/test_signals.py fuzzes signal files themselves: not again here.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import io
import json
import math
import os
import re
import signal as os_signal
import stat
import tempfile
import types
import typing
from datetime import datetime, timedelta, timezone
from pathlib import Path

import attrs
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import (EVIDENCE, FAST, REVIEW_OK, base_env, metadata, spawn, wait_for,
                     write_config, write_scenario)
from support.hostile import raw_controls
from ralph.engine import config as cfg
from ralph.engine import event_schemas
from ralph.engine.safe_text import printable
from ralph.engine.tools import emit
from ralph.session_store import BadInput, append_event, check_id, control_root, create, load, \
    questions, read_events, resolve_id, signals
from ralph.session_store._events import backwards
from ralph.engine.cli.common import channel_errors
from ralph.session_store._schema import dump_plain, parse_yaml
from support.disk import session_dir
from support.engines import config as engine_config
from support.engines import held_run
from support.mcp import RawMcp

HYPOTHESIS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
CASES: collections.Counter = collections.Counter()   # generated cases run, per test
BUDGET: dict[str, int] = {}                           # max_examples, per test


def budget(name: str, n: int) -> dict:
    BUDGET[name] = n
    return dict(max_examples=n, **HYPOTHESIS)


@pytest.fixture(autouse=True, scope="module")
def _no_fsync():
    """In this process only: durability is test_crash's subject, here fsync only costs
    time (the sessions run as subprocesses keep it)."""
    patch = pytest.MonkeyPatch()
    patch.setattr(os, "fsync", lambda fd: None)
    yield
    patch.undo()


def now() -> datetime:
    return datetime.now(timezone.utc)


class Hung(BaseException):
    """Not an Exception: code under test that catches Exception must not swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str):
    """Fail (instead of hanging the suite) when one case takes longer than `seconds`."""
    def expired(_signum, _frame):
        raise Hung(f"{what}: still running after {seconds}s")
    previous = os_signal.signal(os_signal.SIGALRM, expired)
    os_signal.setitimer(os_signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        os_signal.setitimer(os_signal.ITIMER_REAL, 0)
        os_signal.signal(os_signal.SIGALRM, previous)


def tree(root: Path) -> dict[str, tuple]:
    """Every path under `root` (symlinks not followed) with its kind and content."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st_ = os.lstat(p)
            if stat.S_ISREG(st_.st_mode):
                with open(p, "rb") as f:
                    out[os.path.relpath(p, root)] = ("f", f.read())
            elif stat.S_ISLNK(st_.st_mode):
                out[os.path.relpath(p, root)] = ("l", os.readlink(p))
            else:
                out[os.path.relpath(p, root)] = ("d", None)
    return out


def state_of(ws: Path) -> Path:
    """The workspace's folder in the state directory: its sessions' control planes (in
    sessions/), the file naming the workspace, the Telegram bot's state."""
    return Path(control_root(str(ws))).parent


def planes(ws: Path) -> dict[str, tuple]:
    """tree() of the workspace (keys under `ws/`) and of its folder in the state
    directory (keys under `state/`): whatever a session of `ws` may write."""
    out = {f"ws/{k}": v for k, v in tree(ws).items()}
    if state_of(ws).exists():
        out.update({f"state/{k}": v for k, v in tree(state_of(ws)).items()})
    return out


# --- generated values shared by several tests ---

HUGE_INTS = st.sampled_from([10 ** 20, -(10 ** 20), 10 ** 400, 2 ** 63, -(2 ** 63) - 1])
NUMBERS = (st.integers() | HUGE_INTS | st.floats()
           | st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 5e-324]))
SCALARS = st.none() | st.booleans() | NUMBERS | st.text(max_size=20) | st.binary(max_size=8)
JUNK = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6) | st.integers(), inner, max_size=3),
                    max_leaves=6)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | HUGE_INTS | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3), max_leaves=8)
TRAVERSAL = ["..", ".", "../x", "../../x", "../../../outside", "/etc/passwd",
             "/nonexistent-ralph-fuzz/x",
             "a/../../b", "a/b", "x\x00y", "\x00", "", " ", "a" * 64, "a" * 65, "a" * 5000,
             "s1/../s1", "s1\n", " s1", "s1 ", "-rf", ".hidden", "a\\b", "é", "ＡＢ", "٣",
             "q1/", "~", "~root", "$HOME", "`id`", "a;b", "CON", "a\u202eb", "\ud7ff"]
IDS = (st.from_regex(ID_RE, fullmatch=True) | st.text(max_size=70)
       | st.sampled_from(TRAVERSAL) | st.text(alphabet="./\\-_a1\x00", max_size=12))


# --- ralph.yml ---

MAX_SECONDS = 1e9


def _strategy_for(tp):
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and attrs.has(tp):
        return _doc_for(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*[_strategy_for(a) for a in typing.get_args(tp)])
    if tp is type(None):
        return st.none()
    if origin is list:
        return st.lists(_strategy_for(typing.get_args(tp)[0]), max_size=3)
    if origin is dict:   # (hooks: the events' names, and anything)
        key, value = typing.get_args(tp)
        names = st.sampled_from([f"{when}.{event}" for when in ("pre", "post")
                                 for event in ("session.start", "plan.ready", "nope")])
        return st.dictionaries(names | _strategy_for(key), _strategy_for(value), max_size=2)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from([m.value for m in tp]) | st.text(max_size=8)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers() | HUGE_INTS
    if tp is float:
        return NUMBERS
    if tp is str:
        return st.text(max_size=20)
    raise AssertionError(f"no strategy for {tp!r}")


def _doc_for(cls):
    hints = typing.get_type_hints(cls)   # in the namespace of the module that defines it
    good = {f.name: _strategy_for(hints[f.name]) | JUNK for f in attrs.fields(cls)}
    known = st.fixed_dictionaries({}, optional=good)
    unknown = st.dictionaries(st.text(min_size=1, max_size=8), JUNK, max_size=1)
    return st.builds(lambda k, u: {**k, **u}, known, unknown) | known


CONFIG_DOCS = st.deferred(lambda: _doc_for(cfg.Config)) | JUNK

YAML_TOKENS = [".nan", ".NaN", ".inf", "-.inf", "1e400", "1.0e400", "9" * 5000, "-" + "9" * 5000,
               "0b" + "1" * 20000, "-0b" + "1" * 20000, "0x" + "f" * 3000, "2001-13-45",
               "2001-02-30 25:61:61", "[", "{", "&a [*a]", "!!binary aGk=", "~", "yes", "0o17",
               "!!python/object/apply:os.system [id]", "'quoted'", '"\\x00"', "*undefined",
               "!!int 3.5", "!!float abc", "!!timestamp 2001-13-45", "[" * 3000, "|\n  block",
               "- a\n- b", "{a: 1, a: 2}", "? [a]\n: b", "\t", "\x00", "\ufeff", "%YAML 1.1",
               "--- \n...", "@", "`", "1_000", "0x_", "+.inf", "12:30:45", "-1", "0", "1e-400"]
TEMPLATE = (Path(cfg.__file__).parent / "ralph.yml.template").read_text()
TEMPLATE_VALUES = [i for i, line in enumerate(TEMPLATE.splitlines())
                   if re.match(r"\s*\w+: \S", line) and not line.lstrip().startswith("#")]


def _mutate_template(line_no: int, token: str) -> str:
    lines = TEMPLATE.splitlines()
    key = lines[line_no].split(":", 1)[0]
    lines[line_no] = f"{key}: {token}"
    return "\n".join(lines) + "\n"


def _bomb(section: str, field: str) -> str:
    """~600 bytes that YAML expands to 9**9 items through aliases, as `section.field`."""
    lines, prev = ["- &a [x, x, x, x, x, x, x, x, x]"], "a"
    for i in range(1, 9):
        lines.append(f"- &b{i} [" + ", ".join([f"*{prev}"] * 9) + "]")
        prev = f"b{i}"
    return "_anchors:\n" + "\n".join(f"  {line}" for line in lines) + \
        f"\n{section}:\n  {field}: *{prev}\n"


SPECIAL_CONFIGS = [
    b"", b"\n", b"null", b"[]", b"- 1\n", b"42", b"\xff\xfe\x00", b"\x00",
    b"\xef\xbb\xbfagent: {}\n",
    b"agent: !!python/object/apply:os.system [id]\n", b"agent: &a {command: [*a]}\n",
    b"agent: {command: " + b"[" * 20000 + b"]" * 20000 + b"}\n",
    b"agent: " + b"{a: " * 3000 + b"1" + b"}" * 3000 + b"\n",
    b"agent:\n  backend: demo\n---\nagent: {}\n",
    b"RObot: {telegram: {allowed_chat_ids: [1e400]}}\n",
    b"RObot: {enabled: true, telegram: {bot_token: 'x:y', allowed_chat_ids: []}}\n",
    *(_bomb(s, f).encode() for s, f in (("agent", "backend"), ("knowledge", "approval"),
                                        ("RObot", "on_timeout"), ("agent", "prompt_mode"),
                                        ("agent", "timeout_seconds"), ("agent", "command"))),
]

CONFIG_BYTES = (st.binary(max_size=300) | st.text(max_size=300).map(str.encode)
                | st.builds(_mutate_template, st.sampled_from(TEMPLATE_VALUES),
                            st.sampled_from(YAML_TOKENS) | st.text(max_size=30)).map(str.encode)
)


def _check_config(raw) -> cfg.Config | None:
    """parse returns a sane Config or a one-file, `$.path` BadInput; nothing else."""
    with time_limit(10, "config.parse"):
        try:
            config = cfg.parse(raw, "ralph.yml", channels=channel_errors)
        except BadInput as e:
            message = str(e)
            first = message.splitlines()[0]
            assert first.startswith("ralph.yml: "), message[:300]
            assert "$" in first or "not valid YAML" in first, message[:300]
            assert len(message) < 4000, message[:300]
            return None
    _assert_sane(config, "$")
    return config


def _assert_sane(obj, path: str) -> None:
    if attrs.has(type(obj)):
        for f in attrs.fields(type(obj)):
            _assert_sane(getattr(obj, f.name), f"{path}.{f.name}")
    elif isinstance(obj, float):
        assert math.isfinite(obj), f"{path} = {obj} accepted"
        if path.endswith("_seconds"):
            assert 0 <= obj <= MAX_SECONDS, f"{path} = {obj} accepted"
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            _assert_sane(item, f"{path}[{i}]")


@settings(**budget("config_data", 1200))
@given(doc=CONFIG_DOCS)
def test_config_parse_of_generated_mappings(doc):
    CASES["config_data"] += 1
    try:
        text = yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:
        text = json.dumps(doc, default=str)
    config = _check_config(text)
    if config is not None:   # a valid config is a fixed point
        again = cfg.parse(yaml.safe_dump(cfg.to_data(config)), "ralph.yml")
        assert cfg.to_data(again) == cfg.to_data(config)


@settings(**budget("config_bytes", 1000))
@given(raw=CONFIG_BYTES)
def test_config_parse_of_generated_bytes(raw):
    CASES["config_bytes"] += 1
    _check_config(raw)


@pytest.mark.parametrize("raw", SPECIAL_CONFIGS)
def test_config_parse_of_hostile_files(raw):
    """Deep nesting, alias bombs in every kind of field, tags, BOMs, NUL bytes."""
    _check_config(raw)


@pytest.mark.parametrize("text, where", [
    ("RObot: {timeout_seconds: .nan}", "$.RObot.timeout_seconds"),
    ("RObot: {timeout_seconds: .inf}", "$.RObot.timeout_seconds"),
    ("knowledge: {timeout_seconds: 1.0e+12}", "$.knowledge.timeout_seconds"),
    ("agent: {timeout_seconds: -.inf}", "$.agent.timeout_seconds"),
    ("event_loop: {max_cost_usd: .nan}", "$.event_loop.max_cost_usd"),
    ("event_loop: {max_iterations: -" + "9" * 5000 + "}", "not valid YAML"),
    ("event_loop: {max_iterations: -0b" + "1" * 20000 + "}", "$.event_loop.max_iterations"),
    ("fallback: {no_progress_minutes: .nan}", "$.fallback.no_progress_minutes"),
    ("knowledge: {approval: 2001-13-45}", "not valid YAML"),
    (_bomb("agent", "backend"), "$.agent.backend"),
])
def test_config_refuses_what_would_crash_a_session_later(text, where):
    """NaN, infinite or absurd durations used to pass and crash the engine at the first
    deadline (timedelta(seconds=nan)); huge digit strings and impossible dates escaped as
    ValueError; an alias bomb in an enum field hung `ralph validate` printing it."""
    with time_limit(10, "config.parse"):
        with pytest.raises(BadInput) as e:
            cfg.parse(text, "ralph.yml", channels=channel_errors)
    assert where in str(e.value) and str(e.value).startswith("ralph.yml: ")
    assert len(str(e.value)) < 1000


# --- `ralph emit` and the event schemas ---

TOPICS = (st.from_regex(emit.TOPIC, fullmatch=True) | st.text(max_size=30)
          | st.sampled_from(["blocker", "confidence", "build.done", "plan.ready", "LOOP_COMPLETE",
                             "human.interact", "a" * 201, ".x", "x.", "x..y", "-x", "x y",
                             "x\n", "--json", "-h", "", "é.x", "blocker.x"]))
BLOCKER = st.fixed_dictionaries(
    {"type": st.text(max_size=10), "timestamp": st.sampled_from(
        ["2025-01-01T00:00:00Z", "2025-01-01", "nope", "", "2025-13-01T00:00:00"]),
     "attempting": st.text(max_size=10), "cause": st.text(max_size=10),
     "attempted_resolution": st.lists(st.text(max_size=5), max_size=2),
     "interpretation": st.text(max_size=10)},
    optional={"project": st.none() | st.text(max_size=5), "issue": st.integers() | st.text(),
              "extra": JSONISH})
CONFIDENCE = st.dictionaries(
    st.sampled_from(event_schemas.UNIT_FIELDS + ("complexity", "approaches", "missing", "other")),
    NUMBERS | st.lists(st.text(max_size=5), max_size=2) | JSONISH, max_size=4)
PAYLOADS = (JSONISH | BLOCKER | CONFIDENCE
            | st.builds(lambda d, k, v: {**d, k: v}, BLOCKER, st.sampled_from(
                list(event_schemas.BLOCKER_FIELDS)), JSONISH))


def _json_text(value) -> str:
    return json.dumps(value)   # NaN and Infinity as Python writes them: not JSON


JSON_TEXTS = (PAYLOADS.map(_json_text) | st.text(max_size=40)
              | st.sampled_from(["NaN", "Infinity", "-Infinity", '{"risk": NaN}',
                                 '{"complexity": Infinity}', "[" * 100000, "{\"a\":" * 50000,
                                 "1" * 5000, "", " ", "null", '"\\ud800"', '{"a": 1, "a": 2}',
                                 "\ufeff{}", "[1,]", "{'a': 1}", '{"x": 1e999}', '"\\ud800"',
                                 '{"a": "\\udfff"}', '"\\ud83d\\ude00"']))
ARGV = st.one_of(
    st.lists(st.text(max_size=20) | st.sampled_from(["--json", "--json=", "-h", "--help",
                                                     "bad \udcff byte", '"\\ud800"']),
             max_size=5),
    st.tuples(TOPICS, st.text(max_size=40)).map(list),
    st.tuples(TOPICS).map(list),
    st.tuples(TOPICS, JSON_TEXTS).map(lambda t: [t[0], "--json", t[1]]),
    st.tuples(TOPICS, JSON_TEXTS).map(lambda t: [t[0], "--json=" + t[1]]),
    st.tuples(st.sampled_from(["blocker", "confidence"]), JSON_TEXTS).map(
        lambda t: [t[0], "--json", t[1]]),
    st.tuples(TOPICS, st.text(max_size=10), JSON_TEXTS).map(lambda t: [t[0], t[1], "--json", t[2]]),
)


def _asks_for_help(argv: list[str]) -> bool:
    it = iter(argv)
    for arg in it:
        if arg == "--json":
            next(it, None)
        elif arg in ("-h", "--help"):
            return True
    return False


@settings(**budget("emit_argv", 1600))
@given(argv=ARGV)
def test_emit_parse_args_returns_or_says_why(argv):
    CASES["emit_argv"] += 1
    out = io.StringIO()
    with time_limit(10, "emit.parse_args"), contextlib.redirect_stdout(out):
        try:
            topic, payload = emit.parse_args(argv)
            emit.check(topic, payload, "--json")
        except emit.EmitError as e:
            assert str(e).strip() and len(str(e)) < 2000
            return
        except SystemExit as e:
            assert e.code == 0 and _asks_for_help(argv), argv
            assert emit.USAGE in out.getvalue()
            return
    assert not _asks_for_help(argv)
    assert emit.TOPIC.fullmatch(topic) and len(topic) <= 200
    json.dumps(payload, allow_nan=False)   # what lands on the bus is standard JSON
    if topic in event_schemas.VALIDATORS:
        assert event_schemas.VALIDATORS[topic](payload) is None


@pytest.mark.parametrize("argv", [["x", "--json", "[" * 100000], ["x", "--json", "NaN"],
                                  ["x", "--json", '{"a": -Infinity}'],
                                  ["confidence", "--json", '{"complexity": Infinity}'],
                                  ["confidence", "--json", '{"complexity": NaN}']])
def test_emit_refuses_deep_json_and_non_json_numbers(argv):
    """A deeply nested --json raised RecursionError (a traceback for the agent); NaN and
    Infinity were written to the bus, which then was not JSON for other readers."""
    with pytest.raises(emit.EmitError):
        emit.parse_args(argv)


@settings(**budget("event_schemas", 1500))
@given(payload=PAYLOADS | JUNK)
def test_event_schema_validators_never_raise(payload):
    CASES["event_schemas"] += 1
    for name, validate in event_schemas.VALIDATORS.items():
        problem = validate(payload)
        assert problem is None or (isinstance(problem, str) and problem.startswith("$")), problem
        if problem is None and name == "confidence":
            for key, value in payload.items():
                if key in ("approaches", "missing"):
                    assert all(isinstance(v, str) for v in value)
                else:
                    assert type(value) is int or (type(value) is float and math.isfinite(value)), \
                        (key, value)
        if problem is None and name == "blocker":
            assert all(k in payload for k in event_schemas.BLOCKER_REQUIRED)


# --- the store's own files: JSON that YAML readers read alike ---

PLAIN_SCALARS = (st.none() | st.booleans() | st.integers(-10**30, 10**30)
                 | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30))
PLAIN_DOCS = st.dictionaries(st.text(max_size=12), st.recursive(
    PLAIN_SCALARS, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=20),
    min_size=1, max_size=6)


@settings(**budget("plain_round_trip", 800))
@given(doc=PLAIN_DOCS)
def test_the_stores_files_read_back_what_it_wrote_and_pyyaml_reads_the_same(doc):
    CASES["plain_round_trip"] += 1
    text = dump_plain(doc)
    assert parse_yaml(text, "f") == doc
    assert yaml.safe_load(text) == doc   # YAML 1.1 too: escapes, floats with their dot


@settings(**budget("plain_edits", 1500))
@given(doc=PLAIN_DOCS, at=st.integers(0, 10**6), cut=st.integers(0, 3),
       insert=st.sampled_from(["", " ", "  ", "\n", ":", "- ", "#", '"', "\\", "\t", "~",
                               "\x85", "\u2028", "yes", "1_0", "0o7", "{a: 1}", "[1]", "&a",
                               "*a", "!!str ", "\ufeff", "---\n", "\\ud83d\\ude00", "NaN",
                               ', "a": 1', "1e5"]))
def test_an_edited_store_file_reads_as_json_else_as_pyyaml_does(doc, at, cut, insert):
    """An edited file (a person's, or a torn one): read as JSON while it is JSON without a
    repeated key; otherwise as PyYAML reads it; or refused in one line (BadInput)."""
    CASES["plain_edits"] += 1
    text = dump_plain(doc)
    at %= len(text) + 1
    text = text[:at] + insert + text[at + cut:]
    try:
        got = parse_yaml(text, "f")
    except BadInput as e:
        assert "\n" not in str(e) and str(e).startswith("f: ")
        return
    try:
        pairs = json.loads(text, object_pairs_hook=lambda p: p, parse_constant=_refuse)
    except (ValueError, RecursionError):
        pairs = None
    if pairs is not None and _no_repeats(pairs):
        assert got == json.loads(text), text
    else:   # PyYAML as the store runs it: its C loader
        assert got == yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)), text


def _refuse(name):
    raise ValueError(name)


def _no_repeats(value) -> bool:
    if isinstance(value, list) and all(isinstance(p, tuple) and len(p) == 2 for p in value) \
            and value:
        keys = [k for k, _ in value]
        return len(set(keys)) == len(keys) and all(_no_repeats(v) for _, v in value)
    if isinstance(value, list):
        return all(_no_repeats(v) for v in value)
    return True


# mappings as (key, value) pairs, so that a key can repeat; a value is a scalar's YAML
# text, a mapping, or a list of mappings
DUP_KEYS = st.sampled_from(["a", "b", "type", '"a b"', "1", "1.0"])
DUP_SCALARS = st.sampled_from(['"x"', "1", "yes", "~", "[1, 2]", '"\\u00e9"'])
DUP_TREES = st.recursive(
    st.lists(st.tuples(DUP_KEYS, DUP_SCALARS), min_size=1, max_size=4),
    lambda inner: st.lists(st.tuples(DUP_KEYS, DUP_SCALARS | inner | st.tuples(
        inner, inner)), min_size=1, max_size=4), max_leaves=12)


def _render(pairs, pad: str, out: list[str], path: str, repeats: set) -> None:
    """Block YAML of `pairs` into `out`; `repeats` gets (path, key, line) of each key
    met again in its mapping."""
    seen = set()
    for key, value in pairs:
        name = yaml.safe_load(f"{key}: 0")   # as YAML reads the key: "1" and "1.0" are one
        (name,) = name
        if name in seen:
            shown_key = name if isinstance(name, str) and re.fullmatch(r"\w+", name) \
                and not name[0].isdigit() else repr(name)
            repeats.add((path, shown_key, len(out) + 1))
        seen.add(name)
        part = f".{name}" if isinstance(name, str) and re.fullmatch(r"[A-Za-z_]\w*", name) \
            else f"[{name!r}]"
        if isinstance(value, str):
            out.append(f"{pad}{key}: {value}")
        elif isinstance(value, tuple):   # a list of two mappings
            out.append(f"{pad}{key}:")
            for i, item in enumerate(value):
                start = len(out)
                _render(item, pad + "    ", out, f"{path}{part}[{i}]", repeats)
                out[start] = f"{pad}  - {out[start].lstrip()}"
        else:
            out.append(f"{pad}{key}:")
            _render(value, pad + "  ", out, path + part, repeats)


@settings(**budget("duplicate_keys", 800))
@given(tree=DUP_TREES)
def test_a_key_repeated_in_any_mapping_is_refused_with_its_path(tree):
    """PyYAML keeps the last of equal keys, silently; the store's reader (signals,
    questions, answers, the config) refuses the document, naming the mapping's path, the
    key and the line of its repeat."""
    CASES["duplicate_keys"] += 1
    out, repeats = [], set()
    _render(tree, "", out, "$", repeats)
    text = "\n".join(out) + "\n"
    if not repeats:
        assert parse_yaml(text, "f") == yaml.safe_load(text), text
        return
    with pytest.raises(BadInput) as e:
        parse_yaml(text, "f")
    said = re.fullmatch(r"f: (\$.*?): duplicate key (.+) \(line (\d+)\)", str(e.value))
    assert said and (said[1], said[2], int(said[3])) in repeats, (str(e.value), repeats, text)


# --- answers and question ids ---

@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A workspace with session s1 and a pending question q1."""
    ws = tmp_path_factory.mktemp("fuzzstore")
    session = create(str(ws), "fuzz objective", now=now(), session_id="s1")
    _ask(session.dir, "q1")
    return ws


def _ask(session_dir: str, qid: str, text: str = "Which one?") -> questions.Question:
    t = now()
    return questions.ask(session_dir, questions.Question(
        id=qid, text=text, asked_at=t, deadline=t + timedelta(hours=1), on_timeout="continue",
        context=questions.QuestionContext(session="s1", state="PLANNING", iteration=1)))


ANSWER_TEXTS = (st.text() | st.text(alphabet=st.characters(max_codepoint=0x20), max_size=50)
                | st.builds(lambda c, n: c * n, st.characters(), st.sampled_from([5000, 70_000]))
                | st.sampled_from(["", "\x00", "\r\n", "\r", "\u2028", "\u2029", "\x85", "\ufeff",
                                   "---", "...", "null", "~", "yes", "0x1F", "1e400", ".nan",
                                   "!!python/object/apply:os.system [id]", "&a", "*a", "'", '"',
                                   "\\", " lead and trail ", "\t", "#", "- item", "key: value",
                                   "\U0010ffff", "\ue000", "%", "@", "`", "|", ">", "\x7f",
                                   "\x1b[31mred\x1b[0m", "a\x00b\nc"]))
_answer_no = iter(range(10 ** 9))


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


@settings(**budget("answer_text", 400))
@given(text=ANSWER_TEXTS)
def test_answer_keeps_any_text_exactly_and_the_first_answer_wins(store, text):
    CASES["answer_text"] += 1
    sdir = str(session_dir(store, "s1"))
    qid = f"qa{next(_answer_no)}"
    _ask(sdir, qid)
    if not _utf8(text):   # half a surrogate pair: from argv bytes, or a JSON "\ud800"
        with pytest.raises(BadInput, match="UTF-8"):
            questions.answer(sdir, qid, text, now=now(), channel="cli")
        assert not Path(sdir, "answers", f"{qid}.yaml").exists()
        Path(sdir, "questions", f"{qid}.yaml").unlink()
        return
    result = questions.answer(sdir, qid, text, now=now(), channel="cli")
    assert result.text == text
    path = Path(sdir, "answers", f"{qid}.yaml")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert questions.read_answer(sdir, qid).text == text
    before = path.read_bytes()
    with pytest.raises(BadInput, match="already answered"):
        questions.answer(sdir, qid, "second", now=now())
    assert path.read_bytes() == before
    path.unlink()
    Path(sdir, "questions", f"{qid}.yaml").unlink()


@settings(**budget("question_ids", 800))
@given(qid=IDS)
def test_bad_question_ids_are_refused_and_write_nothing_anywhere(store, qid):
    CASES["question_ids"] += 1
    sdir = session_dir(store, "s1")
    valid = bool(ID_RE.fullmatch(qid))
    if valid:
        assert check_id(qid, "question id") == qid
    else:
        with pytest.raises(BadInput):
            check_id(qid, "question id")
    before = planes(store)
    try:
        questions.answer(str(sdir), qid, "an answer", now=now())
    except BadInput:
        pass
    else:
        assert valid and qid == "q1"   # the one question there is
        Path(sdir, "answers/q1.yaml").unlink()
    for fn in (questions.load_question, questions.read_answer):
        try:
            fn(str(sdir), qid)
        except BadInput:
            pass
    assert planes(store) == before


def test_a_question_file_naming_another_id_is_refused(tmp_path):
    """questions/<QID>.yaml whose `id` says `../../x`: saving it (a status change, a
    cancel on resume) wrote `x.yaml` outside the session; now it is not a question."""
    session = create(str(tmp_path), "o", now=now(), session_id="s1")
    q = _ask(session.dir, "q1")
    doc = yaml.safe_load(Path(session.dir, "questions/q1.yaml").read_text())
    for forged in ("../../escaped", str(tmp_path / "escaped-absolute"), "q2"):
        doc["id"] = forged
        Path(session.dir, "questions/q1.yaml").write_text(yaml.safe_dump(doc))
        with pytest.raises(BadInput):
            questions.load_question(session.dir, "q1")
        assert questions.questions(session.dir) == []
        with pytest.raises(BadInput):
            questions.answer(session.dir, "q1", "text", now=now())
        if forged != "q2":   # a path, not an id: no file is written for it
            with pytest.raises(BadInput):
                questions.save_question(session.dir, attrs.evolve(q, id=forged))
    assert not list(tmp_path.rglob("escaped*"))


def test_question_and_answer_files_with_a_duplicate_key_are_refused(tmp_path):
    """A second `text:` in an answer (or `status:` in a question) is not an answer of
    either value: refused with the path, as in every file the store reads."""
    session = create(str(tmp_path), "o", now=now(), session_id="s1")
    _ask(session.dir, "q1")
    questions.answer(session.dir, "q1", "yes", now=now(), channel="cli")
    for name, key, read in (("questions/q1.yaml", "status", questions.load_question),
                            ("answers/q1.yaml", "text", questions.read_answer)):
        path = Path(session.dir, name)
        text = path.read_text()   # JSON, as the store writes it: the key again, first
        assert text.startswith("{\n")
        path.write_text(f'{{\n "{key}": "forged",' + text[1:])
        at = next(n for n, line in enumerate(path.read_text().splitlines(), 1)
                  if line.startswith(f' "{key}": ') and n > 2)
        with pytest.raises(BadInput) as e:
            read(session.dir, "q1")
        assert str(e.value) == f"{path}: $: duplicate key {key} (line {at})"


# --- session ids and targets ---

@settings(**budget("check_id", 2000))
@given(value=IDS)
def test_check_id_accepts_exactly_the_id_pattern(value):
    CASES["check_id"] += 1
    if ID_RE.fullmatch(value):
        assert check_id(value) == value
        assert "/" not in value and "\x00" not in value and value not in (".", "..")
        assert len(value) <= 64
    else:
        with pytest.raises(BadInput) as e:
            check_id(value)
        assert "expected [A-Za-z0-9]" in str(e.value)


TARGETS = (st.sampled_from(list(signals.TARGETS)).flatmap(lambda t: st.sampled_from(
    [t, t.lower(), t.upper(), "Ralph-" + t, "ralph-" + t.lower(), "RALPH-" + t, " " + t, t + "\n",
     "Ralph-Ralph-" + t, t[:-1]])) | IDS)


@settings(**budget("targets", 1000))
@given(target=TARGETS, kind=st.sampled_from(list(signals.TYPES) + ["steer", "x", ""]))
def test_targets_are_canonical_or_refused(target, kind):
    CASES["targets"] += 1
    canonical = signals.canonical_target(target)
    assert canonical is None or canonical in signals.TARGETS
    try:
        signal = signals.validate({"type": kind, "target": target, "message": "m"})
    except BadInput as e:
        assert str(e).startswith("$.")
        return
    assert signal.target == canonical and signal.target in signals.TARGETS


@settings(**budget("session_ids", 300))
@given(sid=IDS)
def test_session_ids_never_leave_the_sessions_dir(tmp_path_factory, sid):
    """Neither the control plane (in the state directory) nor the work area (in the
    workspace) of a session is anywhere but in its own sessions directory, named by its
    id; nothing is made for an id that is refused but those directories."""
    CASES["session_ids"] += 1
    base = tmp_path_factory.getbasetemp() / "sids"
    ws = base / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    state = state_of(ws)
    before, before_state = tree(base), (tree(state) if state.exists() else {})
    root, work = Path(control_root(str(ws))), ws / ".ralph-sessions"
    made = {"ws/.ralph-sessions"}   # the sessions' directories, in both places

    def new_in_state() -> set[str]:
        return {k for k in tree(state) if k not in before_state} if state.exists() else set()
    try:
        session = create(str(ws), "o", now=now(), session_id=sid)   # "": a generated id
    except BadInput:
        assert not ID_RE.fullmatch(sid) or (root / sid).exists()
        assert {k for k in tree(base) if k not in before} <= made
        assert new_in_state() <= {"sessions", "workspace"}
    else:
        assert ID_RE.fullmatch(sid) or sid == ""
        sid = sid or session.id
        assert Path(session.dir).parent == root and Path(session.dir).name == sid
        assert os.path.realpath(session.dir) == os.path.join(os.path.realpath(root), sid)
        assert Path(session.work_dir).parent == work and Path(session.work_dir).name == sid
        assert os.path.realpath(session.work_dir) == os.path.join(os.path.realpath(work), sid)
        assert load(str(ws), sid).id == sid
        assert not [k for k in tree(base) if k not in before and not
                    k.startswith(f"ws/.ralph-sessions/{sid}/") and k not in made
                    and k != f"ws/.ralph-sessions/{sid}"]
        assert not [k for k in new_in_state() if k not in ("sessions", "workspace")
                    and not k.startswith(f"sessions/{sid}/") and k != f"sessions/{sid}"]
        import shutil
        shutil.rmtree(session.dir)
        shutil.rmtree(session.work_dir)
    for fn in (lambda: load(str(ws), sid), lambda: resolve_id(str(ws), sid)):
        try:
            fn()
        except BadInput:
            pass


@settings(**budget("cli_ids", 250))
@given(value=IDS, which=st.integers(0, 5))
def test_cli_refuses_bad_ids_and_targets_with_exit_2(store, value, which):
    from ralph.engine import cli
    CASES["cli_ids"] += 1
    ws = str(store)
    argv = [["session", "status", value], ["session", "answer", value, "text"],
            ["session", "answer", "s1", "text", f"--question={value}"],
            ["signal", "info", "m", f"--session={value}"],
            ["signal", "steer", "m", "--session=s1", f"--target={value}"],
            ["tools", "interact", "progress", "note", f"--session={value}"]][which]
    argv = argv[:2] + ["--workspace", ws] + argv[2:]
    before = planes(store)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:   # argparse: an argument it cannot take
            code = e.code
    assert code in (0, 2), (argv, code, err.getvalue())
    assert "Traceback" not in err.getvalue() and "internal error" not in err.getvalue()
    after = planes(store)
    changed = {k for k, v in after.items() if before.get(k) != v}
    changed |= {k for k in before if k not in after}
    allowed = ("state/sessions/s1/signals/inputs/", "state/sessions/s1/answers/q1.yaml",
               "state/sessions/s1/events.jsonl")   # the control plane's, nothing else
    assert all(k.startswith(allowed) for k in changed), changed
    sdir = session_dir(store, "s1")
    if code == 0 and which in (1, 2):
        (sdir / "answers/q1.yaml").unlink()
    for name in os.listdir(sdir / "signals/inputs"):
        os.unlink(sdir / "signals/inputs" / name)


NUMBER_TEXTS = st.one_of(
    st.floats().map(repr), st.integers().map(str), HUGE_INTS.map(str), st.text(max_size=8),
    st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "1e9", "1e9001", "0", "-0", "0.0",
                     "1e-400", "5e-324", "0x10", "1_000", "", " 5", "5 ", "\u0661\u0662", "1e9",
                     "1000000000.5", "999999999", "3.5", "-1", "+2"]))
NUMBER_FLAGS = {"--max-iterations": (["session", "resume", "x"], "max_iterations", None),
                "--max-runtime": (["session", "resume", "x"], "max_runtime", 1e9),
                "--max-cost": (["session", "start", "obj"], "max_cost", None),
                "--timeout": (["tools", "interact", "ask", "q"], "timeout", 86400)}
_PARSER = []


@settings(**budget("cli_numbers", 400))
@given(flag=st.sampled_from(sorted(NUMBER_FLAGS)), text=NUMBER_TEXTS)
def test_cli_number_flags_take_only_finite_positive_numbers(flag, text):
    """argparse's float() takes nan and inf: `--timeout nan` crashed `ask` with a
    traceback, `--max-runtime nan` was stored as a limit never reached."""
    from ralph.engine.cli.parser import build_parser
    CASES["cli_numbers"] += 1
    if not _PARSER:
        _PARSER.append(build_parser())
    head, dest, most = NUMBER_FLAGS[flag]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = _PARSER[0].parse_args(head + [f"{flag}={text}"])
        except SystemExit as e:
            assert e.code == 2 and "Traceback" not in err.getvalue()
            return
    value = getattr(args, dest)
    assert value > 0 and (isinstance(value, int) or math.isfinite(value)), (flag, text)
    assert most is None or value <= most


# --- `ralph mcp`: generated tool calls and raw lines, to one real server ---

def _of_run(env: dict) -> dict:
    """The RALPH_* variables of a run's environment (what its agent's tools are given)."""
    return {k: v for k, v in env.items() if k.startswith("RALPH_")}


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory):
    """A real `ralph mcp` on a session of its own, for the whole module, as the executor's
    run a real engine holds open: what its tools send reaches that engine."""
    ws = tmp_path_factory.mktemp("mcpfuzz")
    session = create(str(ws), "fuzz the MCP server", now=now(), session_id="m1")
    with held_run(session, "executor") as env:
        server = RawMcp(ws, "m1", **_of_run(env))
        yield server
        code, stderr = server.close()
        assert code == 0 and "Traceback" not in stderr, stderr


_mcp_no = iter(range(10 ** 9))
MCP_TOOLS = st.sampled_from(["emit", "ask", "progress", "signals_poll", "blocker", "status",
                             "nope"])
MCP_NAMES = st.sampled_from(["topic", "payload", "question", "options", "default",
                             "timeout_seconds", "message", "role", "trace", "extra"])
MCP_VALUES = JSONISH | st.sampled_from(
    [math.nan, math.inf, -math.inf, 1e300, -1, 0, 86401, "nan", "1e300", "build.done",
     "executor", ["a", "b"], {"type": "blocker"}, "x" * 5000])


def _no_wait(arguments: dict) -> dict:
    """`ask` waits for a human up to a valid timeout: at most 10 ms here."""
    timeout = arguments.get("timeout_seconds")
    if timeout is None or (type(timeout) in (int, float) and 0 < timeout <= 86400):
        arguments["timeout_seconds"] = 0.01
    return arguments


@settings(**budget("mcp_calls", 300))
@given(tool=MCP_TOOLS, arguments=st.dictionaries(MCP_NAMES, MCP_VALUES, max_size=4))
def test_every_generated_tool_call_gets_its_reply_in_one_line(mcp_server, tool, arguments):
    """Any arguments (NaN, infinities, 1e300, 10**400, wrong types, missing ones) to any
    tool: the call gets its own reply, a result or an error of one line naming what is
    wrong, never a bare "Error executing tool" (a crash) nor silence; the server lives."""
    CASES["mcp_calls"] += 1
    call_id = next(_mcp_no)
    if tool == "ask":
        arguments = _no_wait(arguments)
    mcp_server.send(json.dumps({"jsonrpc": "2.0", "id": call_id, "method": "tools/call",
                                "params": {"name": tool, "arguments": arguments}}))
    reply = mcp_server.reply()
    assert reply["id"] == call_id, reply
    if "error" in reply:   # what the parser refuses (10**400): JSON-RPC's own error
        assert reply["error"]["code"] in (-32700, -32600, -32602), reply
        assert "\n" not in reply["error"]["message"]
        return
    text = reply["result"]["content"][0]["text"]
    if reply["result"]["isError"]:
        assert "\n" not in text and text.startswith(f"Error executing tool {tool}: ") or \
            text == f"Unknown tool: {tool}", text


RAW_LINES = (st.binary(max_size=120).map(lambda b: b.replace(b"\n", b" "))
             | JSONISH.map(lambda v: json.dumps(v).encode())
             | st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n)
             | st.builds(lambda i, m, p: json.dumps({"jsonrpc": "2.0", "id": i, "method": m,
                                                     "params": p}).encode(),
                         st.integers(-10 ** 20, 10 ** 20) | st.text(max_size=8) | JSONISH,
                         st.text(max_size=12) | JSONISH, JSONISH))


@settings(**budget("mcp_lines", 400))
@given(line=RAW_LINES)
def test_every_generated_line_gets_one_reply(mcp_server, line):
    """Lines the SDK's client would not send: each that is not blank (JSON whitespace)
    and not a notification or response (which get none) is answered, once, with its id
    when it has one; then a ping still gets its own reply."""
    import mcp_types
    CASES["mcp_lines"] += 1
    try:
        message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except Exception:
        message = None
    silent = not line.strip(b" \t\r\n") or (
        message is not None and not isinstance(message, mcp_types.JSONRPCRequest))
    if not silent:
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError):
            doc = None
        sent_id = doc.get("id") if isinstance(doc, dict) else None
        mcp_server.send(line)
        reply = mcp_server.reply()
        if (type(sent_id) is int and abs(sent_id) < 10 ** 18) or (
                isinstance(sent_id, str) and _utf8(sent_id)):
            assert reply["id"] == sent_id, (line[:200], reply)
        else:
            assert reply["id"] in (None, sent_id), (line[:200], reply)
        if message is None:
            assert reply["error"]["code"] in (-32700, -32600), reply
    ping = f"ping-{next(_mcp_no)}"
    mcp_server.send({"jsonrpc": "2.0", "id": ping, "method": "ping"})
    assert mcp_server.reply() == {"jsonrpc": "2.0", "id": ping, "result": {}}


# --- Telegram updates, through the bot's own handler ---

TOKEN = "123456:FUZZ-MARKER-TOKEN"
ALLOWED = 111
BOT_ID = 4242


class StandInBot:
    """What the bot's Transport needs of python-telegram-bot's Bot: an id and send_message."""
    id = BOT_ID

    def __init__(self):
        self.sent: list[tuple[int, str]] = []
        self._next = 9000

    async def send_message(self, chat_id, text, **_kwargs):
        self.sent.append((chat_id, text))
        self._next += 1
        return types.SimpleNamespace(message_id=self._next, chat_id=chat_id, text=text)


COMMANDS = ["status", "tasks", "tail", "pause", "resume", "stop", "approve", "skip", "help",
            "start", "frobnicate", "", "STATUS", "status@ralph_test_bot", "tail@", "/"]
TG_TEXTS = st.one_of(
    st.text(max_size=80),
    st.tuples(st.sampled_from(COMMANDS), st.sampled_from(["", " ", " s1", " @s1", " nosuch",
                                                          " ../x", " 99999999999999999999",
                                                          " -5", "\n", " s1 s1 s1"]),
              st.text(max_size=20)).map(lambda t: f"/{t[0]}{t[1]}{t[2]}"),
    st.tuples(IDS, st.text(max_size=30)).map(lambda t: f"@{t[0]} {t[1]}"),
    st.builds(lambda c, n: c * n, st.characters(), st.integers(4000, 100_000)),
    st.sampled_from(["@s1", "@s1 /stop", "@s1 /pause why", "@nosuch hi", "@", "@@s1 x",
                     "\x00", "\u202e", " ", "\n\n", "/" * 100]))
USERS = st.fixed_dictionaries({"id": st.sampled_from([BOT_ID, ALLOWED, 7]), "is_bot": st.booleans(),
                               "first_name": st.just("Ada")})
HEADERS = st.sampled_from(["Question q1 from session s1\nWhich one?",
                           "Question q404 from session s1\n", "Question q1 from session nosuch\n",
                           "Question ../x from session ../y\n", "Question q1 from session s1",
                           "random text", ""])


def _message(draw, depth=0):
    chat = draw(st.sampled_from([ALLOWED, ALLOWED, -100123, 0, 999, 2 ** 53]))
    msg = {"message_id": draw(st.integers(1, 10 ** 6)), "date": draw(st.integers(0, 2 ** 31)),
           "chat": {"id": chat, "type": draw(st.sampled_from(["private", "group", "channel"]))}}
    if draw(st.booleans()):
        msg["from"] = draw(USERS)
    if draw(st.integers(0, 5)):
        msg["text"] = draw(TG_TEXTS) if depth == 0 else draw(HEADERS)
    if depth == 0 and draw(st.booleans()):
        reply = _message(draw, depth + 1)
        reply["message_id"] = draw(st.sampled_from([5001, 5002, 1, 77777]))
        reply["chat"] = msg["chat"]
        msg["reply_to_message"] = reply
    return msg


@st.composite
def updates(draw):
    update = {"update_id": draw(st.integers(1, 10 ** 9))}
    if draw(st.integers(0, 9)):
        update["message"] = _message(draw)
    junk = draw(st.integers(0, 4)) == 0   # one field of the wrong type, or missing
    if junk and "message" in update:
        msg = update["message"]
        where = draw(st.sampled_from(["message_id", "date", "chat", "text", "from",
                                      "reply_to_message", "update_id", "message"]))
        value = draw(JUNK)
        if where == "update_id":
            update["update_id"] = value
        elif where == "message":
            update["message"] = value
        elif draw(st.booleans()):
            msg.pop(where, None)
        else:
            msg[where] = value
    return update, junk


@pytest.fixture(scope="module")
def telegram_ws(tmp_path_factory):
    from ralph.engine.channels.telegram.commands import Commands
    from ralph.engine.channels.telegram.inbox import Inbox
    from ralph.engine.channels.telegram.settings import Log
    from ralph.engine.channels.telegram.state import BotState
    from ralph.engine.channels.telegram.transport import Transport
    from ralph.session_store import ChannelFiles, Sessions
    ws = tmp_path_factory.mktemp("tgfuzz")
    session = create(str(ws), "telegram fuzz", now=now(), session_id="s1")
    _ask(session.dir, "q1")
    outside = tmp_path_factory.mktemp("tgoutside")
    (outside / "victim.txt").write_text("outside\n")
    logs: list[str] = []
    log = Log(TOKEN, logs.append)
    bot = StandInBot()

    async def never_sleep(_seconds):
        return True   # a failed send is not retried here: the bot is "stopping"

    files = ChannelFiles(str(ws), "telegram")   # where the bot keeps its state
    state = BotState(files, Sessions(str(ws)), log)
    state.remember(ALLOWED, 5001, "s1", "q1")
    commands = Commands(str(ws), log, primary="s1", files=files)
    commands.resume = lambda sid, rest: f"(resume of {sid} not started in this test)"
    inbox = Inbox(str(ws), [ALLOWED], Transport(TOKEN, "http://127.0.0.1:9", log, never_sleep,
                                                bot=bot), state, commands, log, never_sleep)
    loop = asyncio.new_event_loop()
    yield ws, outside, inbox, bot, logs, loop
    loop.close()


async def _handle_and_reply(inbox, update):
    await inbox.handle(update)
    if inbox.replies:
        await asyncio.gather(*list(inbox.replies))


@settings(**budget("telegram", 400))
@given(drawn=updates())
def test_telegram_updates_never_escape_the_handler(telegram_ws, drawn):
    from telegram import Update
    CASES["telegram"] += 1
    ws, outside, inbox, bot, logs, loop = telegram_ws
    data, junk = drawn
    junk = junk or not _utf8(json.dumps(data, ensure_ascii=False, default=str))
    sdir = session_dir(ws, "s1")
    before, before_outside = planes(ws), tree(outside)
    bot.sent.clear()
    try:
        update = Update.de_json(json.loads(json.dumps(data, default=str)), None)
    except Exception:
        # python-telegram-bot refuses it while decoding getUpdates' answer, inside the
        # poll loop's try: logged, and the bot polls again
        assert junk
        update = None
    if update is not None:
        message = update.message
        try:
            with time_limit(20, "telegram _handle"):
                loop.run_until_complete(_handle_and_reply(inbox, update))
        except AssertionError:
            raise
        except Exception:
            # only an update of the wrong shape may raise here: the poll loop logs it
            # ("update N failed") and confirms it, so one bad update never blocks others
            assert junk, data
        chat = getattr(message, "chat_id", None) if message is not None else None
        if chat != ALLOWED:
            assert planes(ws) == before, "a chat outside allowed_chat_ids changed the store"
            assert bot.sent == []
        else:
            assert {c for c, _t in bot.sent} <= {ALLOWED}
    assert tree(outside) == before_outside
    for path, (kind, _content) in planes(ws).items():
        assert not path.startswith("state/sessions/s1/answers/") or \
            path == "state/sessions/s1/answers/q1.yaml", path
        assert kind != "l", path
    assert not any(TOKEN.split(":")[1] in line for line in logs)
    for t in bot.sent:
        assert TOKEN.split(":")[1] not in t[1]
    # what an allowed chat did is undone, so every case starts from the same store
    for sub in ("answers", "signals/inputs"):
        for name in os.listdir(sdir / sub):
            os.unlink(sdir / sub / name)


# --- the outbox: raw lines an agent can write there, read by a real engine ---

OUTBOX_CAP = 1024   # the held engine's event_loop.max_event_bytes (the smallest it takes)
OPEN_RUN = "@RUN@"   # the run the engine holds open, put in at the test
OUTBOX_TOPICS = (st.sampled_from(["fuzz.note", "fuzz.other.x", "session.transition",
                                  "human.response", "human.timeout", "task.resume",
                                  "emit.refused", "gate.note", "cli.refused",
                                  "knowledge.promoted", "engine.crash", "signal.x"])
                 | st.text(max_size=12) | JSONISH)
OUTBOX_PAYLOADS = (JSONISH | st.integers(OUTBOX_CAP - 20, OUTBOX_CAP + 5000).map(
    lambda n: "x" * n) | st.sampled_from(["\x00\x1b[2J", "\u2028line\u2029", "\ufffd",
                                          "a\ud800", "\udfff"]))   # the last two: half a character
OUTBOX_REQUESTS = st.fixed_dictionaries(
    {"kind": st.sampled_from(["event", "event", "refusal", "poll", "ask", "ask.gone", "nope",
                              "approve", ""]) | JSONISH},
    optional={"run": st.sampled_from([OPEN_RUN, OPEN_RUN, OPEN_RUN, "0000-other",
                                      "0001-planner", "x" * 129]) | JSONISH,
              "id": st.sampled_from(["r1", "../x", "r" * 65]) | JSONISH,
              "topic": OUTBOX_TOPICS, "payload": OUTBOX_PAYLOADS,
              "role": st.sampled_from(["executor", "reviewer", "EXECUTOR"]) | JSONISH,
              "command": JSONISH, "why": JSONISH, "source": st.sampled_from(["engine", "human"]),
              "tool": st.sampled_from(["Bash", "run_shell_command", "", "x" * 201]) | JSONISH,
              "call": st.sampled_from(["git push", ""]) | JSONISH,
              "cut": st.booleans() | JSONISH}
).map(lambda r: {**r, "run": "0000-other"} if r["kind"] == "ask"
      and r.get("run") in (OPEN_RUN, None) else r)
# (the run's own questions, naming it or no run, would wait for a human: not drawn)


def _outbox_line(request: dict, ascii_only: bool) -> bytes:
    # NaN as Python writes it; half a character as "\\ud800" or as the bytes ED A0 80
    return json.dumps(request, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


OUTBOX_LINES = st.one_of(
    st.tuples(OUTBOX_REQUESTS, st.booleans()).map(lambda t: _outbox_line(*t)),
    st.binary(max_size=60),
    JSONISH.map(lambda v: json.dumps(v).encode()),
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),
    st.sampled_from([b"", b"   ", b"\r", b"\xef\xbb\xbf{}", b'{"kind": "event"', b"x" * 6000,
                     b'{"kind": "event", "run": "@RUN@", "topic": "fuzz.note", "payload": "'
                     + b"y" * 6000 + b'"}',
                     b'{"kind": "event", "run": "@RUN@", "topic": "fuzz.note", "payload": NaN}',
                     b'{"kind": "event", "run": "@RUN@", "topic": "fuzz.note", "payload": 1e999}',
                     b'{"kind": "event", "run": "@RUN@", "topic": "fuzz.note", "payload": 1'
                     + b"0" * 4400 + b"}",
                     b'{"kind": "event", "run": "@RUN@", "topic": "fuzz.note", "kind": "refusal"}'])
).map(lambda line: line.replace(b"\n", b" "))


def _no_constant(name):
    raise ValueError(name)


def _taken_as(raw: bytes, run: str):
    """What the engine records of one line in the outbox of `run` (the executor's, open):
    ("event", topic, payload, source), ("cli.refused", source), ("emit.refused", run,
    source), or None (a poll or a giving-up it answers with no record). Every record is
    the run's whose outbox the line is in, whatever the line claims. The outbox's and the
    inlet's rules (session_store/_outbox.py, engine/running/inlet.py), written out again."""
    def refused():
        return ("emit.refused", run, "executor")
    if len(raw) > OUTBOX_CAP + 4096 or not raw.strip():
        return refused()
    try:
        request = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        json.dumps(request, ensure_ascii=False).encode("utf-8")   # no half a character
    except (ValueError, RecursionError):   # UnicodeError included
        return refused()
    if not isinstance(request, dict) or request.get("kind") not in \
            ("event", "ask", "ask.gone", "poll", "refusal", "approve"):
        return refused()
    if any(request.get(k) is not None and (not isinstance(request[k], str)
                                           or len(request[k]) > 128) for k in ("id", "run")):
        return refused()
    kind, claimed = request["kind"], request.get("run")
    if claimed not in (None, run):   # a run speaks for itself only
        return refused()
    if kind == "event":
        try:
            emit.check(request.get("topic"), request.get("payload"), "payload", OUTBOX_CAP)
        except emit.EmitError:
            return refused()
        return ("event", request["topic"], request.get("payload"), "executor")
    if kind == "refusal":
        return ("cli.refused", "executor")
    if kind == "poll" and request.get("role") not in (None, "executor"):
        return refused()
    if kind == "approve" and not (
            isinstance(request.get("id"), str) and isinstance(request.get("tool"), str)
            and 0 < len(request["tool"]) <= 200 and isinstance(request.get("call"), str)
            and isinstance(request.get("cut"), bool)):
        return refused()
    # a poll answered in the inbox, a tool call no rule names (passed), a giving-up (asks
    # of the run: not drawn)
    return None


def _record_as(record: dict):
    if record["topic"] == "emit.refused":
        return ("emit.refused", record.get("run"), record["source"])
    if record["topic"] == "cli.refused":
        return ("cli.refused", record["source"])
    return ("event", record["topic"], record["payload"], record["source"])


@pytest.fixture(scope="module")
def outbox_run(tmp_path_factory):
    """The executor's run of a session, held open by a real engine (whose cap on one
    request is OUTBOX_CAP), for the whole module; at the end the session goes on."""
    ws = tmp_path_factory.mktemp("outboxfuzz")
    session = create(str(ws), "fuzz the outbox", now=now(), session_id="o1")
    with held_run(session, "executor",
                  engine_config({"event_loop": {"max_event_bytes": OUTBOX_CAP}})) as env:
        yield session, env, [read_events(session.dir)[1]]   # [the bus's offset read up to]


_outbox_no = iter(range(10 ** 9))


@settings(**budget("outbox_lines", 200))
@given(lines=st.lists(OUTBOX_LINES, min_size=1, max_size=5), torn=st.booleans())
def test_every_line_in_the_outbox_is_taken_or_refused_never_crashing_the_engine(
        outbox_run, lines, torn):
    """Whatever an agent writes straight into the outbox (garbage, not UTF-8, a torn
    line, a line past the cap, NaN, deep nesting, another run's, a topic only the engine
    or a human says, a claimed source, kinds and ids of any type): each line is recorded
    once, as the open run's event (its source the engine's, from the run it opened), as
    the run's refused verb (cli.refused), or refused as the run's (emit.refused: half a
    character and a line naming another run among them); and the engine lives on to take
    the next line."""
    from ralph.session_store import outbox
    CASES["outbox_lines"] += 1
    session, env, offset = outbox_run
    run = env["RALPH_RUN_ID"]
    lines = [line.replace(OPEN_RUN.encode(), run.encode()) for line in lines]
    # a torn last line is a line once the next appender ends it, unless it is empty
    whole = lines[:-1] if torn and not lines[-1] else lines
    wanted = [w for w in (_taken_as(line, run) for line in whole) if w is not None]
    mark = next(_outbox_no)
    with open(outbox.outbox_path(session.work_dir, run), "ab") as f:   # past the tools' checks
        f.write(b"\n".join(lines) + (b"" if torn else b"\n"))
    # a torn last line: ended by the next appender's newline (the outbox keeps it apart)
    why = outbox.post(session.work_dir, {"kind": "event", "id": f"m{mark}", "run": run,
                                         "topic": "fuzz.mark", "payload": mark})
    assert why is None, why

    def recorded():
        records, _end = read_events(session.dir, offset[0])
        return records if any(r["topic"] == "fuzz.mark" and r["payload"] == mark
                              for r in records) else None
    records = wait_for(recorded, timeout=30)   # the engine took them all, and lives
    offset[0] = read_events(session.dir, offset[0])[1]
    *taken, marked = records
    assert (marked["topic"], marked["source"], marked["run"]) == ("fuzz.mark", "executor", run)
    assert [_record_as(r) for r in taken] == wanted, (lines, taken)
    for r in taken:
        assert not (r["topic"] != "emit.refused" and r["topic"].startswith(
            emit.RESERVED_PREFIXES)) or r["topic"] == "cli.refused", r
        assert r["topic"] not in emit.RESERVED, r


HALF_A_CHARACTER = {   # lines of the executor's open run (@RUN@), each with a lone surrogate
    "taken": b'{"kind": "event", "run": "@RUN@", "topic": "fuzz.note", "payload": "a\\ud800"}',
    "refused": b'{"kind": "event", "run": "0000-other", "topic": "x.y", "payload": "\\udfff"}',
    "bad topic": b'{"kind": "event", "run": "@RUN@", "topic": "x\\ud800"}',
    "refusal": b'{"kind": "refusal", "run": "@RUN@", "command": "\\ud800", "why": "w"}',
    "not UTF-8":
        b'{"kind": "event", "run": "@RUN@", "topic": "fuzz.note", "payload": "\xed\xa0\x80"}',
}


@pytest.mark.parametrize("case", sorted(HALF_A_CHARACTER))
def test_half_a_character_in_the_outbox_never_crashes_the_engine(tmp_path, case):
    """Half a character (a JSON "\\ud800" escape, or the bytes ED A0 80) in a line, whatever
    else the line says, is refused as a line that is no request (no record could hold it
    as UTF-8; it once ended the engine, and on resume again), and the engine reading it
    lives on; the bus stays UTF-8."""
    from ralph.engine.running.inlet import Inlet, RunInfo
    from ralph.session_store import acquire_lock, outbox
    session = create(str(tmp_path), "o", now=now(), session_id="h1")
    lease = acquire_lock(session.dir, "h1")
    inlet = Inlet(session, max_bytes=OUTBOX_CAP, on_ask=lambda *_: {"refused": "no desk"},
                  on_ask_gone=lambda rid: None, on_poll=lambda role: {"signals": []},
                  on_approve=lambda *_: {"refused": "no rules"})
    inlet.start()
    try:
        inlet.open_run(RunInfo("0002-executor-t1", "executor", "t1"))
        before = read_events(session.dir)[1]
        with open(outbox.outbox_path(session.work_dir, "0002-executor-t1"), "ab") as f:
            f.write(HALF_A_CHARACTER[case].replace(b"@RUN@", b"0002-executor-t1") + b"\n")
        inlet.drain()   # on the engine's thread, as on every wakeup of a run
        [record] = read_events(session.dir, before)[0]
        assert (record["topic"], record["source"]) == ("emit.refused", "executor"), record
        assert record["payload"]["why"] in ("not UTF-8 text",
                                            "half a character (a lone surrogate escape)")
        inlet.drain()   # and lives on: the next line is the run's
        with open(outbox.outbox_path(session.work_dir, "0002-executor-t1"), "ab") as f:
            f.write(b'{"kind": "event", "run": "0002-executor-t1", "topic": "fuzz.next"}\n')
        inlet.drain()
        assert [(r["topic"], r["source"]) for r in read_events(session.dir, before)[0]] == \
            [("emit.refused", "executor"), ("fuzz.next", "executor")]
        with open(Path(session.dir, "events.jsonl"), "rb") as bus:
            bus.read().decode("utf-8")   # strict: the bus stays UTF-8
    finally:
        inlet.stop()
        lease.release()


# --- the event bus ---

RECORD_LINES = st.builds(
    lambda seq, topic, payload: json.dumps({"seq": seq, "ts": "t", "topic": topic,
                                            "payload": payload}).encode(),
    st.integers(-5, 10 ** 6) | st.sampled_from([math.inf, math.nan, 1e300, "7", None, [1], True])
    | HUGE_INTS, st.text(max_size=10), JSONISH)
GARBAGE_LINES = st.one_of(
    st.binary(max_size=100).map(lambda b: b.replace(b"\n", b"")),
    st.text(max_size=100).map(lambda t: t.replace("\n", "").encode()),
    JSONISH.map(lambda v: json.dumps(v).encode()),
    st.sampled_from([b"[" * 100000, b"{\"seq\":" * 30000, b"{\"seq\": Infinity, \"topic\": \"x\"}",
                     b"{\"seq\": -Infinity, \"topic\": \"x\"}", b"{\"seq\": NaN, \"topic\": \"x\"}",
                     b"{\"seq\": 1" + b"0" * 5000 + b", \"topic\": \"x\"}", b"\xef\xbb\xbf{}",
                     b"{\"seq\": 1, \"topic\": \"x\"", b"\x00" * 10, b"x" * 200_000,
                     b"{\"seq\": 3, \"topic\": \"big\", \"payload\": \""
                     + b"y" * 150_000 + b"\"}"]))
BUS = st.lists(RECORD_LINES | GARBAGE_LINES, max_size=8).flatmap(
    lambda lines: st.tuples(st.just(b"\n".join(lines)), st.sampled_from([b"", b"\n", b"\n\n"]),
                            st.binary(max_size=20).map(lambda b: b.replace(b"\n", b""))
                            | st.sampled_from([b"", b"{\"seq\": 9, \"topic\":"]))).map(
    lambda t: t[0] + t[1] + t[2])


@settings(**budget("read_events", 600))
@given(content=BUS, cut=st.integers(0, 10 ** 6))
def test_read_events_of_any_file_never_raises(content, cut):
    CASES["read_events"] += 1
    with tempfile.TemporaryDirectory() as d:
        Path(d, "events.jsonl").write_bytes(content)
        with time_limit(20, "read_events"):
            for offset in (0, min(cut, len(content))):
                records, end = read_events(d, offset)
                assert offset <= end <= len(content)
                assert end == offset or content[end - 1:end] == b"\n"
                for r in records:
                    assert isinstance(r, dict) and "seq" in r and "topic" in r
            # read from the end back (status, tail, resume): the same records, newest first
            assert list(backwards(d)) == read_events(d)[0][::-1]


@settings(**budget("append_event", 400))
@given(content=BUS, payload=JSONISH.filter(lambda v: _finite(v)))
def test_append_after_garbage_leaves_a_parseable_last_line(content, payload):
    CASES["append_event"] += 1
    with tempfile.TemporaryDirectory() as d:
        Path(d, "events.jsonl").write_bytes(content)
        with time_limit(20, "append_event"):
            record = append_event(d, "fuzz.appended", payload, source="test")
            second = append_event(d, "fuzz.second", None, source="test")
        data = Path(d, "events.jsonl").read_bytes()
        assert data.endswith(b"\n")
        last, before_last = data.split(b"\n")[-2], data.split(b"\n")[-3]
        assert json.loads(last) == second and json.loads(before_last) == record
        assert isinstance(record["seq"], int) and second["seq"] == record["seq"] + 1
        records, end = read_events(d)
        assert records[-2:] == [record, second] and end == len(data)


# --- what reaches a terminal or a chat (engine/safe_text.py) ---

DRIVING = st.sampled_from(["\x1b[2J", "\x1b]0;t\x07", "\x1b]52;c;eA==\x07", "\x9b", "\r",
                           "\n", "\t", "\x00", "\x7f", "\x85", "\x1c", "\u202e", "\u2066",
                           "\u200f", "\u2028", "\\x1b"])
TERMINAL_TEXT = st.lists(st.text(max_size=8) | DRIVING, max_size=12).map("".join)


@settings(**budget("printable", 1000))
@given(text=TERMINAL_TEXT | st.text(), lines=st.booleans())
def test_printable_leaves_nothing_a_terminal_obeys(text, lines):
    CASES["printable"] += 1
    shown = printable(text, lines=lines)
    assert not raw_controls(shown)
    assert shown.count("\n") == (text.count("\n") if lines else 0)
    assert printable(shown, lines=lines) == shown
    if not raw_controls(text) and (lines or not {"\n", "\t"} & set(text)):
        assert shown == text


RECORDS = st.fixed_dictionaries(
    {"seq": JSONISH, "topic": st.sampled_from(["human.progress", "session.transition",
                                               "human.timeout"]) | JSONISH},
    optional={k: JSONISH | TERMINAL_TEXT for k in ("ts", "payload", "state", "iteration", "run")}
    | {"source": st.sampled_from(["engine", "executor", "cli"]) | JSONISH | TERMINAL_TEXT,
       "payload": st.fixed_dictionaries({}, optional={
           k: JSONISH | TERMINAL_TEXT for k in ("from", "to", "trigger", "reason", "id",
                                                "policy", "delivery_failed")})})


@settings(**budget("shown_records", 1000))
@given(record=RECORDS)
def test_any_record_is_shown_as_one_safe_line_and_an_attributed_notice(record):
    CASES["shown_records"] += 1
    from ralph.engine.channels.telegram.texts import MAX_TEXT, notice_text
    from ralph.engine.views import event_line
    line = event_line(record)
    assert "\n" not in line and not raw_controls(line)
    message = notice_text("s1", record)
    if message is None:
        return
    assert not raw_controls(message.text) and len(message.text) <= MAX_TEXT
    if record["topic"] == "human.progress":   # an agent's words: quoted, under its name
        offset, length = message.quote
        head = message.text.encode("utf-16-le")[:2 * offset].decode("utf-16-le")
        assert " says, in session s1" in head and head.endswith(":\n")
        assert "\n" not in head[:-1]
        assert offset + length == len(message.text.encode("utf-16-le")) // 2
    else:                                     # ralph's own: only from the engine's records
        assert record.get("source") == "engine" and message.quote is None


def _finite(value) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return True
    except (ValueError, TypeError):
        return False


# --- knowledge promotion records ---

PATHS = st.one_of(st.sampled_from(
    ["knowledge/notes.md", "notes.md", "knowledge/../../../metadata.yaml",
     "knowledge/../../../../../outside/secret.txt", "/etc/hostname", "../outside/secret.txt",
     "../../outside/landed.md", ".docs/notes.md", ".docs/../../outside/landed.md",
     "knowledge/link.md", "knowledge/dirlink/inner.md", ".docs/sub/x.md", "knowledge/", "",
     "knowledge/notes.md/..", ".docs/../metadata.yaml", "@OUT@/landed-absolute.md",
     "@OUT@/secret.txt", "@OUT@/dir"]),
    st.text(alphabet="./ab", max_size=20))


@pytest.fixture(scope="module")
def promote_template(tmp_path_factory) -> Path:
    """A workspace and a directory outside it, copied for every case (whose session s1 is
    made in the copy: its control plane is keyed by the workspace's path)."""
    base = tmp_path_factory.mktemp("promote-template")
    ws, outside = base / "ws", base / "outside"
    ws.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("SECRET-OUTSIDE\n")
    (outside / "dir").mkdir()
    (outside / "dir" / "inner.md").write_text("SECRET-INNER\n")
    return base


@settings(**budget("promote", 150))
@given(entries=st.lists(st.tuples(PATHS, PATHS), max_size=4), forged=st.booleans())
def test_promotion_moves_only_staged_regular_files_into_the_docs(tmp_path_factory,
                                                                 promote_template, entries,
                                                                 forged):
    import shutil
    CASES["promote"] += 1
    base = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())) / "case"
    shutil.copytree(promote_template, base, symlinks=True)
    ws, outside = base / "ws", base / "outside"
    session = create(str(ws), "o", now=now(), session_id="s1")
    knowledge = Path(session.work_dir, "iterations/1/knowledge")   # the librarian's
    (knowledge / "notes.md").write_text("# notes\n")
    (knowledge / "link.md").symlink_to(outside / "secret.txt")
    (knowledge / "dirlink").symlink_to(outside / "dir")
    if forged:   # a record forged where the engine keeps it (the control plane: out of the
        # librarian's reach now, and still not trusted further)
        def at(path):   # absolute paths into this case's outside directory
            return path.replace("@OUT@", str(outside))
        record = Path(session.dir, "iterations/1/knowledge/promoted.yaml")
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(yaml.safe_dump(
            {"files": [{"staged": at(s), "promoted_to": at(p)} for s, p in entries]}))
        # and the same one where the librarian writes (where the record was before)
        Path(knowledge, "promoted.yaml").write_text(record.read_text())
    before_outside = tree(outside)

    def session_trees() -> dict:
        return {**{f"control/{k}": v for k, v in tree(Path(session.dir)).items()},
                **{f"work/{k}": v for k, v in tree(Path(session.work_dir)).items()}}
    before_session = {k: v for k, v in session_trees().items()
                      if not k.startswith(("control/iterations/1/", "work/iterations/1/"))}
    try:
        session.iteration(1).knowledge.promote(str(ws / ".docs"), str(ws),
                                               record={"why": "fuzz"})
    except BadInput:
        assert forged
    assert tree(outside) == before_outside
    after_session = session_trees()
    for k, v in before_session.items():
        if k not in ("control/metadata.yaml", "control/events.jsonl"):
            assert after_session.get(k) == v, k
    docs = tree(ws / ".docs") if (ws / ".docs").exists() else {}
    assert all(kind != "l" for kind, _ in docs.values()), docs
    assert not any(b"SECRET" in (content or b"") for _, content in docs.values())
    landed = {k for k, (kind, _) in tree(ws).items() if kind == "f"
              and not k.startswith(".ralph-sessions/") and not k.startswith(".docs/")}
    assert not landed, landed
    landed = {k for k, (kind, _) in tree(state_of(ws)).items() if kind == "f"
              and not k.startswith("sessions/s1/") and k != "workspace"}
    assert not landed, landed
    if not forged:
        assert set(docs) == {"notes.md"}
        assert (knowledge / "link.md").is_symlink()   # ignored: left where it was
    shutil.rmtree(base.parent)
    shutil.rmtree(state_of(ws))


# --- agents: garbage on the topics the engine reads ---

def _drawn(strategy, n: int, name: str) -> list:
    out = []

    @settings(**budget(name, n))
    @given(value=strategy)
    def collect(value):
        CASES[name] += 1
        out.append(value)
    collect()
    return out


ENGINE_TOPICS = ["confidence", "blocker", "cost", "plan.ready", "build.done", "build.blocked",
                 "task.failed", "human.progress", "verify.passed", "verify.failed",
                 "review.done", "knowledge.staged", "gate.note", "session.transition",
                 "LOOP_COMPLETE.x", "task.resume"]


def test_a_session_survives_generated_payloads_on_the_topics_it_reads(workspace):
    """The demo agent posts to the outbox without `ralph emit`'s checks, as any agent can
    write there: the engine's inlet refuses what it may not take (reserved topics, as
    emit.refused of the run), and the engine must judge whatever it takes."""
    payloads = _drawn(PAYLOADS | JUNK.filter(_finite) | st.fixed_dictionaries(
        {"usd": NUMBERS.filter(lambda v: not isinstance(v, float) or math.isfinite(v))
         | st.text(max_size=5)}) | st.fixed_dictionaries({"tasks": JUNK.filter(_finite)}),
        200, "agent_payloads")
    payloads = [p for p in payloads if _finite(p)]
    emitted = [{"topic": ENGINE_TOPICS[i % len(ENGINE_TOPICS)], "json": p}
               for i, p in enumerate(payloads)]
    emitted[100:100] = [{"topic": "cost", "json": {"usd": usd}}   # also where drawing may miss
                        for usd in (10 ** 400, 1e308, 1e308, -1, "1")]
    plan = {"topic": "plan.ready", "json": {"tasks": [{"id": "t1", "title": "T"}]}}
    steps = [
        {"role": "planner", "iteration": 1, "emit": emitted[:60] + [plan]},
        {"role": "planner", "emit": emitted[60:100] + [{"topic": "LOOP_COMPLETE"}]},
        {"role": "executor",
         "emit": emitted[100:] + [{"topic": "build.done", "payload": EVIDENCE}]},
        {"role": "reviewer", "emit": [{"topic": "review.done", "payload": REVIEW_OK}]},
    ]
    scenario = write_scenario(workspace, steps)
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)},
                             "fallback": {"enabled": True}, "RObot": {"timeout_seconds": 1}})
    proc = spawn(workspace, "session", "start", "garbage objective", "--id", "g",
                 env=base_env(**FAST))
    out, err = proc.communicate(timeout=120)
    code = proc.returncode
    for _ in range(4):   # a blocker or failure may pause it; resume until it ends
        if code not in (3, 5):
            break
        proc = spawn(workspace, "session", "resume", "g", "--max-iterations", "10",
                     env=base_env(**FAST))
        out, err = proc.communicate(timeout=120)
        code = proc.returncode
    assert code in (0, 3, 4, 5), (code, out[-2000:], err[-3000:])
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    sd = session_dir(workspace, "g")
    assert metadata(sd)["session_id"] == "g"
    records, _ = read_events(str(sd))   # (conftest's events() splits lines at U+2028 too)
    assert [e["seq"] for e in records] == list(range(1, len(records) + 1))
    emitted_payloads = [r["payload"] for r in records if r.get("source") in ("planner", "executor")]
    assert len(emitted_payloads) >= len(payloads) // 2
    # what only the engine says is the engine's alone: a run's attempt is refused, recorded
    # under the run's role
    for r in records:
        if r["topic"] in ("session.transition", "gate.note", "task.resume"):
            assert r["source"] == "engine", r
    refused = {r["payload"]["topic"] for r in records if r["topic"] == "emit.refused"}
    assert {"session.transition", "gate.note", "task.resume"} <= refused, refused


# --- planted symlinks: nothing outside is read in or written through ---

OUTSIDE_FILES = {"secret.txt": "SECRET-OUTSIDE-FILE\n",
                 "signal.yaml": "type: STEER\nmessage: SECRET-SIGNAL-VIA-LINK\n",
                 "guidance.json": json.dumps([{"id": "x", "type": "INFO", "target": "all",
                                               "message": "SECRET-GUIDANCE-VIA-LINK",
                                               "at": "2025-01-01T00:00:00+00:00"}]) + "\n",
                 "victim.txt": "VICTIM-UNCHANGED\n", "log-victim.txt": "LOG-VICTIM-UNCHANGED\n"}


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    for name, text in OUTSIDE_FILES.items():
        (outside / name).write_text(text)
    (outside / "dir").mkdir()
    (outside / "dir" / "inner.md").write_text("SECRET-INNER-DIR\n")
    return outside


def _assert_nothing_leaked(ws: Path, outside: Path, before: dict, *outputs: str) -> None:
    assert tree(outside) == before, "a file outside the workspace changed"
    for path, (kind, content) in planes(ws).items():
        if kind == "f":
            assert b"SECRET" not in content, path
    docs = ws / ".docs"
    if docs.exists():
        assert not [p for p in docs.rglob("*") if p.is_symlink()]
    for text in outputs:
        assert "SECRET" not in text


def test_symlinks_planted_in_a_running_session_are_refused_or_ignored(workspace, tmp_path):
    outside = _outside(tmp_path)
    before = tree(outside)
    steps = [{"role": "planner", "iteration": 1, "sleep": 2, "emit": [{"topic": "plan.ready",
              "json": {"tasks": [{"id": "t1", "title": "T"}]}}]},
             {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE"}]},
             {"role": "executor", "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
             {"role": "reviewer", "emit": [{"topic": "review.done", "payload": REVIEW_OK}]},
             {"role": "librarian", "write_iteration": {"knowledge/notes.md": "# notes\n"},
              "emit": [{"topic": "knowledge.staged", "payload": "notes"}]}]
    scenario = write_scenario(workspace, steps)
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)},
                             "fallback": {"enabled": False}})
    proc = spawn(workspace, "session", "start", "symlink objective", "--id", "s",
                 env=base_env(RALPH_DEMO_SLEEP_SCALE=1))
    sd = session_dir(workspace, "s")   # the control plane (in the state directory)
    wd = workspace / ".ralph-sessions/s"   # the work area (in the workspace): the agents'
    wait_for(lambda: list(wd.glob("iterations/1/logs/*-planner.stdout")), timeout=30)
    # while the planner sleeps: links where the engine reads and writes next; in the work
    # area, what an agent can plant
    (wd / "scratchpad.md").unlink()
    (wd / "scratchpad.md").symlink_to(outside / "secret.txt")
    (wd / "iterations/1/knowledge/leak.md").symlink_to(outside / "secret.txt")
    (wd / "iterations/1/knowledge/dirlink").symlink_to(outside / "dir")
    for n in range(2, 8):   # the next agents' log files, by their predictable names
        for role in ("executor-t1", "reviewer-t1", "librarian"):
            (wd / f"iterations/1/logs/{n:04d}-{role}.stdout").symlink_to(
                outside / "log-victim.txt")
    # in the control plane, out of agents' reach: what another writer there could plant
    (sd / "signals/inputs/signal.000000-000000-000-link.yaml").symlink_to(outside / "signal.yaml")
    (sd / "guidance.yaml").symlink_to(outside / "guidance.json")
    for where in (sd / "metadata.yaml", wd / "scratchpad.md", sd / "guidance.yaml",
                  sd / "iterations/1/metadata.yaml", sd / "iterations/1/progress.md"):
        # the engine's temp files as they were named (by its pid; now its thread and a
        # serial too, and never opened through a link)
        (where.parent / f".{where.name}.{proc.pid}.tmp").symlink_to(outside / "victim.txt")
    signals.drop(str(sd), "INFO", "real guidance", now=now())   # makes it read both
    (sd / "questions/qplanted.yaml").symlink_to(outside / "secret.txt")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    _assert_nothing_leaked(workspace, outside, before, out, err)
    rejected = list((sd / "signals/rejected").iterdir())
    assert [p.name for p in rejected] == ["signal.000000-000000-000-link.yaml"]
    assert len(list((sd / "signals/processed").iterdir())) == 1
    assert "real guidance" in (wd / "scratchpad.md").read_text()
    prompts = "".join(p.read_text() for p in wd.glob("iterations/1/logs/*.prompt.md"))
    assert "real guidance" in prompts
    assert "symlink" in yaml.safe_load(rejected[0].read_text())["rejection"]["reason"]
    assert (workspace / ".docs/notes.md").read_text() == "# notes\n"
    assert sorted(p.name for p in (workspace / ".docs").iterdir()) == ["notes.md"]
    assert not (wd / "scratchpad.md").is_symlink()


# --- agents' CLIs: what they print at a usage limit, and anything else ---

LIMIT_VALUES = JSONISH | NUMBERS | st.sampled_from(
    ["rejected", "allowed", "usage_limit_reached", "rate_limit", 429, 173, True, "x" * 300])
CLI_LINES = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["rate_limit_event", "usage_limit"]),
                           "rate_limit_info": st.dictionaries(st.sampled_from(
                               ["status", "resetsAt", "rateLimitType"]), LIMIT_VALUES),
                           "resets_at": LIMIT_VALUES, "message": LIMIT_VALUES}),
    st.fixed_dictionaries({"type": st.sampled_from(["assistant", "result", "system"]),
                           "error": LIMIT_VALUES, "api_error": LIMIT_VALUES,
                           "api_error_status": LIMIT_VALUES, "is_error": LIMIT_VALUES,
                           "result": LIMIT_VALUES, "session_id": LIMIT_VALUES}),
    st.fixed_dictionaries({"type": st.sampled_from(["turn.failed", "error", "thread.started"]),
                           "message": LIMIT_VALUES, "thread_id": LIMIT_VALUES,
                           "error": st.fixed_dictionaries({"message": LIMIT_VALUES})}),
    st.fixed_dictionaries({"session_id": LIMIT_VALUES, "error": st.fixed_dictionaries(
        {"message": LIMIT_VALUES, "code": LIMIT_VALUES})}),
    st.sampled_from(["You've hit your 5-hour limit · resets 13:99pm (Mars/Base)",
                     "You\u2019ve hit your usage limit. Try again at Feb 30th, 99999 10:61 PM.",
                     "Suggested retry after 1e999s", "Please retry in -5ms",
                     "exceeded retry limit, last status: 429"]) | st.text(max_size=80))


@settings(**budget("limit_outputs", 600))
@given(lines=st.lists(CLI_LINES, max_size=5), code=st.none() | st.integers(-300, 300),
       where=st.booleans())
def test_what_a_cli_prints_never_breaks_its_presets_reading(lines, code, where):
    """Whatever an agent's CLI prints (an agent can make it print anything), reading it for
    a usage limit and a conversation's id never raises, and a reset is a plausible instant
    or none."""
    from ralph.engine.agents.presets import Claude, Codex, Demo, Gemini, RunEnd
    CASES["limit_outputs"] += 1
    text = "\n".join(json.dumps(line, default=str) if isinstance(line, dict) else str(line)
                     for line in lines)
    at = now()
    end = RunEnd(text if where else "", "" if where else text, code, at)
    for preset in (Claude(), Codex(), Gemini(), Demo(["demo"])):
        limit = preset.limit(end)
        if limit is not None:
            assert isinstance(limit.text, str)
            assert limit.until is None or (limit.until.tzinfo is not None and
                                           at - timedelta(days=2) <= limit.until
                                           <= at + timedelta(days=401)), limit
        said = preset.conversation(end)
        assert said is None or (isinstance(said, str) and not said.startswith("-"))


# --- the count ---

def test_zz_at_least_ten_thousand_generated_cases(request):
    declared = sum(BUDGET.values())
    assert declared >= 10_000, BUDGET
    ran = sum(CASES.values())
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    line = (f"test_fuzz: {ran} generated cases run ({declared} declared: "
            + ", ".join(f"{k} {CASES[k]}/{v}" for k, v in BUDGET.items()) + ")")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("\n" + line)
    if set(CASES) >= set(BUDGET):   # the whole file ran
        assert ran >= 10_000, line

