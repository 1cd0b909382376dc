"""Issue 8: the crash matrix. One full scenario, every durable write of the engine.

The scenario (SCENARIO below, played by tests/_matrix_agent.py, a command agent that
runs demo-agent steps) meets, at exact points, every thing the engine writes:

  iteration 1  the planner drops an INFO for all and a STEER for the Executor (taken at
               plan_ready) and plans t1 (batch 1) and t2 (batch 2);
               t1's executor takes a STEER dropped for it with `ralph tools signals
               poll` (the engine takes it and replies through the work area's inbox),
               then asks a loop-level question (human.interact): a human answers;
               t1's reviewer asks one nobody answers: it times out (on_timeout: continue);
               t2's executor drops a malformed signal (rejected) and a PAUSE, and waits to
               be stopped: the session pauses (exit 3) and is resumed (a second process);
               t2's reviewer drops a priority STEER and waits: the engine stops it and runs
               it again with the message; it rejects t2;
               the librarian drops a stale SKIP (rejected), an APPROVE and a SKIP, and
               stages knowledge (knowledge.approval: required): the APPROVE promotes it to
               .docs/, the SKIP then has no effect
  iteration 2  the planner asks a question inside its run (`tools interact ask`: the
               engine asks it, a human answers, the engine replies), then says nothing
               is left: COMPLETE

ABORT ends a session, so it has a small scenario of its own (ABORTED): t2's executor
drops it while it runs.

An uninterrupted run, traced (RALPH_TEST_WRITE_TRACE), lists every durable write of the
engine's two processes (start, which pauses; resume, which completes). For each write the
scenario is run again in a real process that SIGKILLs itself right after that write
(RALPH_TEST_CRASH_AT_WRITE; its own trace must match the baseline's up to there), then is
resumed, as often as it takes (a resume may itself pause on the PAUSE), and checked: the
session completes; each signal is handled exactly once (processed with handling_metadata,
or rejected with its reason; guidance noted once and delivered); each answer is kept and
applied once; progress, tasks, iteration records, the path taken and the files produced
equal the uninterrupted run's; every file of the session parses. A kill right after write
N-1 is a kill right before write N, so every "before" is covered too (and the kill before
a process's first write is that process not having run: the resume after it). A write
that repeats the same code is a point once (`kept_points`): on the file store every write
of the control plane is a point, and of the local trees' writes the first of each kind in
each process; on PostgreSQL, whose engine resumes by the same code, the first commit of
each function and of each local kind in each process.

The humans are a thread of the test (Human), outside the engine and its agents' runs: they
drop the signals the agents' steps ask for (_matrix_agent.py); the first question and the
in-run one are answered the moment their files appear; the second one's channel gives up
on it (questions.mark_undeliverable, as the Telegram channel does after its retries),
which moves its deadline to now, so its timeout applies at once. The engine waits for
them (RObot.timeout_seconds is 20 s), so neither outcome races a clock, and a session
killed while a question is pending finds it answered, or timed out, on resume.

Both backends run the same scenarios, points and checks (the fixture `backend`): the file
store, and the PostgreSQL store ($RALPH_STORE_URL; each run on a database of its own in the
test cluster, see Databases). There the control plane is read through the session handle's
verbs and, for what they do not show (handled and rejected signals with their outcome),
read-only SQL (tests/_planes.py); the humans drop signals and answer through the verbs, and
a malformed signal is a row of raw bytes; each commit is a write point ("store", named by
the function that commits); the session's iteration files and work area are local files,
as on the file store. A later process's kill points start from a copy of the workspace and
of the database (CREATE DATABASE ... TEMPLATE) as the earlier process left them.

The workspaces go to /dev/shm when it is there (RALPH_TEST_SCRATCH_DIR picks another
place; see _crashkit.scratch).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import urllib.parse
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, NamedTuple

import pytest
import yaml

import _crashkit as kit
from _crashkit import KILLED, Write
from _planes import FilePlane, Plane, StorePlane, database_url
from support import (EVIDENCE, FAST, REVIEW_OK, base_env, ralph, write_config,
                     write_scenario)
from ralph.session_store import BadInput, DiskFault, questions

SID = "matrix"
OBJECTIVE = "Build a key-value store with a CLI"
AGENT = Path(__file__).resolve().parent / "_matrix_agent.py"
DROPS = ".matrix-drops"   # the agent's requests to the humans (see _matrix_agent.py)
ROOTS = (".docs", ".ralph-demo/kv")

ANSWERED = "Which database should the store use?"
ANSWER = "sqlite, in a single file"
TIMES_OUT = "Should the CLI print in colour?"
INFO_ALL = "the target is Linux only"
STEER_EXECUTOR = "keep every module under 200 lines"
PRIORITY = "rename the module kv_store"
POLLED = "log every write of the store"
IN_RUN = "Is anything left to do?"
IN_RUN_ANSWER = "no, ship it"


def _task(tid: str, batch: int = 1) -> dict:
    return {"id": tid, "title": f"task {tid}", "batch": batch,
            "description": f"the work of {tid}"}


def _build(tid: str) -> dict:
    return {"write": {f"kv/{tid}.py": f"# the module of {tid}\n"},
            "emit": [{"topic": "build.done", "payload": EVIDENCE}]}


def _stage(n: int) -> dict:
    return {"write_iteration": {f"knowledge/notes-{n}.md": f"# notes of iteration {n}\n"},
            "emit": [{"topic": "knowledge.staged", "payload": f"notes-{n}.md"}]}


SCENARIO = [
    {"role": "planner", "iteration": 1,
     "drop": [{"label": "info", "type": "INFO", "message": INFO_ALL},
              {"label": "steer", "type": "STEER", "target": "Executor",
               "message": STEER_EXECUTOR}],
     "emit": [{"topic": "plan.ready", "json": {"tasks": [_task("t1"), _task("t2", 2)]}}]},
    {"role": "planner", "ask_in_run": {"question": IN_RUN, "options": [IN_RUN_ANSWER, "no"],
                                       "timeout": 20},
     "emit": [{"topic": "LOOP_COMPLETE", "payload": "nothing left"}]},
    {"role": "executor", "task": "t1",
     "drop": [{"label": "polled", "type": "STEER", "target": "Executor", "message": POLLED}],
     "poll": True,
     "ask_once": {"text": ANSWERED, "options": [ANSWER, "postgres"]}, **_build("t1")},
    {"role": "reviewer", "task": "t1", "ask_once": {"text": TIMES_OUT, "default": "no"},
     "emit": [{"topic": "review.done", "payload": REVIEW_OK}]},
    {"role": "executor", "task": "t2", "await_stop": True,
     "drop": [{"label": "malformed", "raw": "type: [not, a, type]\nmessage: 3\n"},
              {"label": "pause", "type": "PAUSE", "message": "lunch break"}],
     **_build("t2")},
    {"role": "reviewer", "task": "t2", "await_stop": True,
     "drop": [{"label": "priority", "type": "STEER", "target": "Reviewer",
               "message": PRIORITY, "priority": True}],
     "emit": [{"topic": "review.rejected", "json": {"reason": "t2 needs docs"}}]},
    {"role": "librarian", "iteration": 1,
     "drop": [{"label": "stale", "type": "SKIP", "message": "too late", "iteration": 9},
              {"label": "approve", "type": "APPROVE", "message": "looks right",
               "iteration": 1},
              {"label": "skip", "type": "SKIP", "message": "not yet", "iteration": 1}],
     **_stage(1)},
]

CONFIG = {
    "RObot": {"timeout_seconds": 20, "on_timeout": "continue"},
    "knowledge": {"approval": "required", "timeout_seconds": 60},
}

# what the session's mailbox must hold at the end: (type, message) of each signal
PROCESSED = Counter([("INFO", INFO_ALL), ("STEER", STEER_EXECUTOR), ("PAUSE", "lunch break"),
                     ("STEER", PRIORITY), ("APPROVE", "looks right"), ("SKIP", "not yet"),
                     ("STEER", POLLED)])
REJECTED = Counter([("signal.000000-malformed.yaml", None), (None, "too late")])
ACTIONS = {"PAUSE": "paused the session", "APPROVE": "promoted the staged knowledge of "
           "iteration 1", "SKIP": "no effect: the knowledge of this iteration was decided "
           "already"}


# --- places, processes ---

@pytest.fixture(scope="module")
def root(tmp_path_factory):
    with kit.scratch_state(tmp_path_factory.mktemp("matrix"), "matrix") as path:
        yield path


def prepare(shared: Path, steps: list[dict], config: dict) -> Path:
    """The agent's scenario and the config, outside every workspace (copies share them)."""
    shared.mkdir(parents=True, exist_ok=True)
    scenario = write_scenario(shared, steps)
    config = dict(config)
    return write_config(shared, {"agent": {
        "backend": "command", "command": [sys.executable, str(AGENT), str(scenario)],
        "prompt_mode": "stdin", "timeout_seconds": 120, **config.pop("agent", {})}, **config})


def start(ws: Path, config: Path, **env):
    return ralph(ws, "session", "start", OBJECTIVE, "--id", SID, "-c", config,
                 env=base_env(**FAST, **env))


def resume(ws: Path, **env):
    return ralph(ws, "session", "resume", SID,
                 env=base_env(**FAST, **env))


# --- the backends: where a run's control plane is, and how it is copied ---

class Files:
    """The file store: the control plane is files beside the workspace's (in the state
    directory), copied with it (kit.copy_workspace); a run's store is None."""

    name = "file"

    def new(self, label: str) -> None:
        return None

    def copy(self, store: None, label: str, ws: Path) -> None:
        return None

    def remove(self, store: None) -> None:
        pass

    def env(self, store: None) -> dict:
        return {}

    def plane(self, ws: Path, store: None) -> Plane:
        return FilePlane(ws, SID)

    def creation(self, writes: list[Write]) -> list[Write]:
        return kit.creation(writes)


class Databases:
    """The PostgreSQL store: each run's control plane is a database of its own in the
    test cluster (a run's store is its URL), named `<prefix>_<label>`; a later process's
    kill points each start from a copy (CREATE DATABASE ... TEMPLATE) of the database as
    the uninterrupted run's earlier process left it: no connection to it is open then
    (that process exited, the humans' connection is closed). The local files (iteration
    files, work area) are copied with the workspace, as on the file store. The cluster's
    user must be allowed to create databases (the test cluster's and .ci/run's is its
    superuser)."""

    name = "postgres"

    def __init__(self, url: str):
        self.url = url
        self.prefix = f"ralph_matrix_{os.urandom(3).hex()}"

    def _admin(self, sql: str) -> None:
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql)

    def _name(self, label: str) -> str:
        return f"{self.prefix}_{re.sub(r'[^a-z0-9]', '_', label.lower())}"

    def new(self, label: str) -> str:
        self._admin(f"CREATE DATABASE {self._name(label)}")
        return database_url(self.url, self._name(label))

    def copy(self, store: str, label: str, ws: Path) -> str:
        """A copy of `store` for the workspace `ws` (a copy of the one that ran on it)."""
        import psycopg
        source = urllib.parse.urlsplit(store).path.lstrip("/")
        self._admin(f"CREATE DATABASE {self._name(label)} TEMPLATE {source}")
        copied = database_url(self.url, self._name(label))
        with psycopg.connect(copied, autocommit=True) as conn:
            # the session's local areas are in the copied workspace (as kit.copy_workspace
            # says where the copied control planes' workspace is)
            conn.execute("UPDATE ralph_sessions SET workspace = %s", (os.path.abspath(ws),))
        return copied

    def remove(self, store: str) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {urllib.parse.urlsplit(store).path.lstrip('/')}"
                    " WITH (FORCE)")

    def remove_all(self) -> None:
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as conn:
            names = [r[0] for r in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", (self.prefix + "%",))]
            for name in names:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def env(self, store: str) -> dict:
        return {"RALPH_STORE_URL": store}   # the engine's store

    def plane(self, ws: Path, store: str) -> Plane:
        return StorePlane(ws, SID, store)

    def creation(self, writes: list[Write]) -> list[Write]:
        """The writes before the session's row is committed (its local areas first)."""
        first = next((i for i, w in enumerate(writes) if w.kind == "store"), len(writes))
        return writes[:first]


Backend = Files | Databases


@pytest.fixture(scope="module", params=["file", "postgres"])
def backend(request):
    if request.param == "file":
        yield Files()
        return
    url, _root = request.getfixturevalue("postgres_cluster")
    databases = Databases(url)
    try:
        yield databases
    finally:
        databases.remove_all()


class Human(threading.Thread):
    """The humans, acting on the session from outside its engine and its agents' runs: the
    signals an agent's step asks for are dropped (each once, in the order asked; see
    _matrix_agent.py); the ANSWERED question gets ANSWER, the IN_RUN one IN_RUN_ANSWER, as
    soon as its file appears; the TIMES_OUT one is never answered, and its channel gives
    up delivering it (its deadline moves to now). Anything else asked is a failure
    (recorded in `unexpected`). `plane`: the session's control plane they act on (the
    files, by default)."""

    def __init__(self, ws: Path, plane: Plane | None = None):
        super().__init__(daemon=True)
        self.ws = ws
        self.plane = plane or FilePlane(ws, SID)
        self.dropped_at = datetime.min.replace(tzinfo=timezone.utc)
        self.seen: set[str] = set()
        self.dropped: set[str] = set()
        self.unexpected: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.01):
            try:
                self.drop_asked()
                self.say_what_was_asked()
                self.tick()
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.unexpected.append(f"{type(e).__name__}: {e}")

    def drop_asked(self) -> None:
        """Drop each signal an agent asked for and mark it done (`<label>.done`), once; on a
        full disk (tests/test_disk_faults.py), mark it failed (`<label>.failed`): the
        agent's run fails, and the step's next run asks again."""
        folder = self.ws / DROPS
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            return
        for name in names:
            label = name[:-len(".json")]
            if not name.endswith(".json") or (folder / f"{label}.done").exists() \
                    or (folder / f"{label}.failed").exists():
                continue
            try:
                if label not in self.dropped:
                    spec = json.loads((folder / name).read_text())
                    try:
                        self.drop(spec)
                    except DiskFault:
                        (folder / f"{label}.failed").touch()
                        return
                    self.dropped.add(label)
                (folder / f"{label}.done").touch()
            except OSError:   # the workspace's disk is full too: at the next look
                return

    def say_what_was_asked(self) -> None:
        """Answer each agent's `<id>.ask` (has a question with this text been asked?) with
        `<id>.asked`, yes or no, from the control plane as it is now."""
        folder = self.ws / DROPS
        try:
            asks = [folder / n for n in os.listdir(folder) if n.endswith(".ask")]
        except FileNotFoundError:
            return
        for ask in asks:
            said = ask.with_suffix(".asked")
            if said.exists():
                continue
            try:
                texts = {q.text for q in self.plane.questions()}
            except FileNotFoundError:   # no question yet
                texts = set()
            tmp = ask.with_suffix(".asked-tmp")
            try:
                tmp.write_text("yes" if ask.read_text() in texts else "no")
                tmp.replace(said)
            except OSError:   # the workspace's disk is full: at the next look
                return

    def drop(self, spec: dict) -> None:
        # names start with the time in ms: each drop a ms after the last keeps them in order
        self.dropped_at = max(datetime.now(timezone.utc),
                              self.dropped_at + timedelta(milliseconds=1))
        self.plane.drop(spec, self.dropped_at)

    def tick(self) -> None:
        try:
            qids = self.plane.question_ids()
        except FileNotFoundError:
            return
        for qid in qids:
            if qid in self.seen:
                continue
            q = self.plane.question(qid)
            self.seen.add(qid)
            if q.status is not questions.QuestionStatus.PENDING:
                continue
            now = datetime.now(timezone.utc)
            try:
                if q.kind == "approval":
                    try:
                        self.plane.answer(q.id, "allow", now)
                    except BadInput:
                        pass
                elif q.text in (ANSWERED, IN_RUN):
                    try:
                        self.plane.answer(q.id, ANSWER if q.text == ANSWERED else IN_RUN_ANSWER,
                                          now)
                    except BadInput:
                        pass
                elif q.text == TIMES_OUT:
                    self.plane.mark_undeliverable(q.id, now)
                else:
                    self.unexpected.append(q.text)
            except DiskFault:   # the disk is full (tests/test_disk_faults.py): later
                self.seen.discard(qid)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.join(5)
        self.plane.close()
        assert not self.unexpected, f"unexpected questions or errors: {self.unexpected}"


# --- the checks ---

_MASKS = [(re.compile(r"signal\.\d{6}-\d{6}-\d{3}-[0-9a-f]{8}\.yaml"), "signal.*.yaml"),
          (re.compile(r"q\d{6}-\d{6}-[0-9a-f]{4}"), "q*"),
          (re.compile(r"\.creating-(\S+)-\d+"), r".creating-\1-*"),
          (re.compile(r"inbox/r[0-9a-f]{16}\.json"), "inbox/r*.json")]


def masked(w: Write) -> tuple[str, str]:
    path = w.path
    for pattern, sub in _MASKS:
        path = pattern.sub(sub, path)
    return w.kind, path


def check_parses(ws: Path, plane: Plane | None = None) -> None:
    """Every file of the session (its control plane and its work area) parses as what it
    is; no temp file is left behind; every question and answer reads strictly."""
    plane = plane or FilePlane(ws, SID)
    sd = kit.session_dir(ws, SID)
    for p in [*sd.rglob("*"), *kit.work_area(ws, SID).rglob("*")]:
        if p.is_dir() or p.name in ("session.lock", "engine.lock"):
            continue
        rel = str(p)
        assert not p.name.startswith("."), f"a temp file is left: {rel}"
        if p.suffix == ".yaml" or p.name.endswith(".yaml.taken"):
            doc = yaml.safe_load(p.read_bytes())
            assert isinstance(doc, (dict, list)) or doc is None, rel
        elif p.suffix == ".jsonl":   # the bus, the outbox
            for line in p.read_text().splitlines():
                assert isinstance(json.loads(line), dict), rel
        elif p.suffix == ".json":    # the engine's replies
            assert isinstance(json.loads(p.read_text()), dict), rel
        elif p.name == "progress.md":   # a view, whole (a kill may leave it one change behind)
            assert p.read_text().startswith("# Progress — iteration "), rel
    for qid in plane.question_ids():
        plane.question(qid)
        plane.read_answer(qid)


def check_humans_and_signals(ws: Path, in_run_may_time_out: bool = False,
                             plane: Plane | None = None) -> None:
    """Each signal handled exactly once, each answer kept and applied once.
    `in_run_may_time_out`: the humans could not answer the in-run question in time (the
    control plane's disk was full while the run waited: tests/test_disk_faults.py), so
    it timed out once, and its answer, kept, reached the next prompt as a late one."""
    plane = plane or FilePlane(ws, SID)
    mailbox = plane.mailbox()
    assert not mailbox.waiting, "signals left in inputs/"
    assert not mailbox.unfinished, "a take or a rejection never finished"
    handled = Counter()
    polled_by = None
    for doc in mailbox.processed:
        hm = doc["handling_metadata"]
        if doc["message"] == POLLED:
            # taken by the executor's poll; or by the engine, when a crash came between the
            # poll's take and its handled mark (it then reaches the executor's next prompt)
            polled_by = hm["handled_by"]
            assert polled_by in ("Ralph-Executor", "Ralph-Orchestrator"), doc
        else:
            assert hm["handled_by"] == "Ralph-Orchestrator", doc
        assert hm["handled_at"] and hm["action_taken"], doc
        handled[(doc["type"], doc["message"])] += 1
        if doc["type"] in ACTIONS:
            assert hm["action_taken"] == ACTIONS[doc["type"]], doc
    assert handled == PROCESSED, handled
    rejected = Counter()
    for doc in mailbox.rejected:
        assert doc["rejection"]["reason"], doc
        rejected[(doc["name"] if doc["name"] == "signal.000000-malformed.yaml" else None,
                  doc.get("message") if doc.get("type") == "SKIP" else None)] += 1
    assert rejected == REJECTED, rejected
    pad = (kit.work_area(ws, SID) / "scratchpad.md").read_text()
    for message in (INFO_ALL, STEER_EXECUTOR, PRIORITY):
        assert pad.count(message) == 1, f"{message!r} noted {pad.count(message)} times:\n{pad}"
    noted = 1 if polled_by == "Ralph-Orchestrator" else 0   # a poll's take is not noted
    assert pad.count(POLLED) == noted, f"{POLLED!r} noted {pad.count(POLLED)} times:\n{pad}"
    assert plane.guidance() == [], "guidance never delivered"

    asked = {q.text: q for q in plane.questions()}
    assert sorted(asked) == sorted([ANSWERED, TIMES_OUT, IN_RUN]), list(asked)
    assert len(plane.question_ids()) == 3, "a question was asked twice"
    a, b, c = asked[ANSWERED], asked[TIMES_OUT], asked[IN_RUN]
    assert a.status is questions.QuestionStatus.ANSWERED
    assert plane.read_answer(a.id).text == ANSWER
    assert b.status is questions.QuestionStatus.TIMED_OUT
    assert plane.read_answer(b.id) is None
    assert plane.metadata()["pending_question"] is None
    everyone = plane.records()
    bus = [r for r in everyone if r["source"] == "engine"]

    def count(topic, qid):
        return sum(1 for r in bus if r["topic"] == topic and r["payload"].get("id") == qid)
    assert count("human.question", a.id) == 1 and count("human.question", b.id) == 1
    assert count("human.response", a.id) == 1, "the answer applied more than once, or never"
    assert count("human.timeout", b.id) == 1, "the timeout applied more than once, or never"
    assert count("human.response", b.id) == 0 and count("human.timeout", a.id) == 0
    # the in-run question: asked by the planner's run (its record is the run's), answered
    # once, its answer recorded once (by the engine: to the asker, or to the next run)
    assert plane.read_answer(c.id).text == IN_RUN_ANSWER
    assert [r["source"] for r in everyone if r["topic"] == "human.question"
            and r["payload"].get("id") == c.id] == ["planner"], "asked more than once, or never"
    late = in_run_may_time_out and c.status is questions.QuestionStatus.TIMED_OUT
    assert c.kind == "in_run" and (late or c.status is questions.QuestionStatus.ANSWERED), c
    assert count("human.response", c.id) == (0 if late else 1), \
        "the in-run answer applied more than once, or never"
    assert count("human.timeout", c.id) == (1 if late else 0), "the timeout applied twice"
    if late:
        assert c.late_answer_delivered and pad.count(f"late answer to {c.id}") == 1, pad
    # the answer and the timeout reached the prompt of the run that finished each task
    logs = kit.work_area(ws, SID) / "iterations" / "1" / "logs"
    t1 = sorted(logs.glob("*-executor-t1.prompt.md"))[-1].read_text()
    r1 = sorted(logs.glob("*-reviewer-t1.prompt.md"))[-1].read_text()
    assert ANSWER in t1 and "human.response" in t1, t1
    assert "human.timeout" in r1 and TIMES_OUT in r1, r1


def _diff(got: dict, want: dict) -> str:
    return "\n".join(f"{k}:\n  got  {got.get(k)}\n  want {want.get(k)}"
                     for k in sorted(set(got) | set(want)) if got.get(k) != want.get(k))


# --- the uninterrupted run ---

class Scenario(NamedTuple):
    name: str
    steps: list[dict]
    config: dict
    exits: tuple[int, ...]       # the exit code of each process of an uninterrupted run
    # what else a finished session must show: check(ws, plane=...)
    check: Callable[..., None]


class Baseline(NamedTuple):
    scenario: Scenario
    backend: Backend
    config: Path
    before: list[Path | None]      # per process: the workspace as the one before left it
    stores: list                   # per process: its store as the one before left it
    writes: list[list[Write]]      # per process: its durable writes
    outcome: dict


def make_baseline(root: Path, scenario: Scenario, backend: Backend) -> Baseline:
    """Run the scenario uninterrupted, tracing each process and keeping the workspace and
    its store as each process found them (so kills in a later process start from there).
    The humans act while a process runs, so the copies are of a quiet session."""
    base = root / backend.name / scenario.name
    config = prepare(base / "shared", scenario.steps, scenario.config)
    ws = base / "baseline" / "ws"
    ws.mkdir(parents=True)
    store = backend.new(f"{scenario.name}-baseline")
    plane = backend.plane(ws, store)
    before: list[Path | None] = []
    stores: list = []
    for i, code in enumerate(scenario.exits, 1):
        trace = base / "baseline" / f"trace{i}"
        env = {**backend.env(store), "RALPH_TEST_WRITE_TRACE": trace}
        if i == 1:
            before.append(None)
            stores.append(None)
        else:
            before.append(kit.copy_workspace(ws, base / f"before{i}"))
            stores.append(backend.copy(store, f"{scenario.name}-before{i}", before[-1]))
        with Human(ws, plane):
            r = start(ws, config, **env) if i == 1 else resume(ws, **env)
            assert r.returncode == code, f"process {i}: exit {r.returncode}\n{r.stdout}{r.stderr}"
    writes = [kit.read_trace(base / "baseline" / f"trace{i}", ws, SID)
              for i in range(1, len(scenario.exits) + 1)]
    for w in writes:
        assert [x.n for x in w] == list(range(1, len(w) + 1)), "one engine process each"
    result = kit.check_finished(ws, SID, ROOTS, plane)
    check_parses(ws, plane)
    scenario.check(ws, plane=plane)
    plane.close()
    return Baseline(scenario, backend, config, before, stores, writes, result)


FULL = Scenario("full", SCENARIO, CONFIG, (3, 0), check_humans_and_signals)


@pytest.fixture(scope="module")
def full(root, backend) -> Baseline:
    base = make_baseline(root, FULL, backend)
    result = base.outcome
    assert result["status"] == "completed"
    assert result["progress"] == {"1": {"t1": "x", "t2": "x"}}, result["progress"]
    assert result["tasks"] == {"total": 2, "completed": 2, "failed": 0, "pending": 0}
    decisions = {k: v["knowledge_decision"] for k, v in result["iterations"].items()}
    assert decisions == {"1": "promoted", "2": None}, decisions
    assert result["iterations"]["1"]["rejections"] == [{"task": "t2", "reason":
                                                         "review.rejected: t2 needs docs"}]
    triggers = [t[1] for t in result["transitions"]]
    assert triggers == ["plan_ready", "batch_done", "next_batch", "pause", "resume",
                        "batch_done", "iteration_reviewed", "next_iteration",
                        "objective_met"], triggers
    assert result["files"][".docs/notes-1.md"] == "# notes of iteration 1\n"
    return base


# ABORT ends a session, so it has a scenario of its own: t2 drops it while it runs
ABORT_STEPS = [
    {"role": "planner", "iteration": 1,
     "emit": [{"topic": "plan.ready", "json": {"tasks": [_task("t1"), _task("t2")]}}]},
    {"role": "executor", "task": "t2", "await_stop": True,
     "drop": [{"label": "abort", "type": "ABORT", "message": "wrong objective"}],
     **_build("t2")},
    {"role": "executor", **_build("{task}")},
    {"role": "reviewer", "emit": [{"topic": "review.done", "payload": REVIEW_OK}]},
    {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE", "payload": "nothing left"}]},
]


def check_aborted(ws: Path, plane: Plane) -> None:
    sd = kit.session_dir(ws, SID)
    mailbox = plane.mailbox()
    assert not mailbox.waiting and not mailbox.unfinished and not mailbox.rejected, mailbox
    docs = mailbox.processed
    assert len(docs) == 1 and docs[0]["type"] == "ABORT", docs
    assert docs[0]["handling_metadata"]["action_taken"] == "aborted the session", docs
    assert "[F] t2: task t2 (batch 1) — Aborted by signal" in \
        (sd / "iterations" / "1" / "progress.md").read_text()
    meta = plane.metadata()
    assert meta["status"] == "aborted" and meta["completed_at"]
    assert meta["orchestrator"]["last_signal"] == docs[0]["name"]


ABORTED = Scenario("aborted", ABORT_STEPS, {}, (4,), check_aborted)


@pytest.fixture(scope="module")
def aborted(root, backend) -> Baseline:
    base = make_baseline(root, ABORTED, backend)
    assert base.outcome["status"] == "aborted"
    assert base.outcome["progress"] == {"1": {"t1": "x", "t2": "F"}}
    assert [t[1] for t in base.outcome["transitions"]] == ["plan_ready", "abort"]
    return base


# a question whose timeout pauses the session (on_timeout: pause): the pause must happen
# once, whatever the kill; the resume after it goes on without the answer
QPAUSE_STEPS = [
    {"role": "planner", "iteration": 1,
     "emit": [{"topic": "plan.ready", "json": {"tasks": [_task("t1")]}}]},
    {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE", "payload": "nothing left"}]},
    {"role": "executor", "task": "t1", "ask_once": {"text": TIMES_OUT, "default": "no"},
     **_build("t1")},
    {"role": "reviewer", "emit": [{"topic": "review.done", "payload": REVIEW_OK}]},
]


def check_question_pause(ws: Path, plane: Plane) -> None:
    [q] = plane.questions()
    assert q.text == TIMES_OUT and q.status is questions.QuestionStatus.TIMED_OUT, q
    assert q.timeout_paused, q
    bus = [r for r in plane.records() if r["source"] == "engine"]
    assert [r["payload"]["id"] for r in bus if r["topic"] == "human.timeout"] == [q.id]
    assert [r["payload"]["id"] for r in bus if r["topic"] == "human.question"] == [q.id]
    logs = kit.work_area(ws, SID) / "iterations" / "1" / "logs"
    assert "human.timeout" in sorted(logs.glob("*-executor-t1.prompt.md"))[-1].read_text()
    assert plane.guidance() == []


QPAUSE = Scenario("question-pause", QPAUSE_STEPS,
                  {"RObot": {"timeout_seconds": 20, "on_timeout": "pause"}}, (3, 0),
                  check_question_pause)


@pytest.fixture(scope="module")
def question_pause(root, backend) -> Baseline:
    base = make_baseline(root, QPAUSE, backend)
    assert [t[1] for t in base.outcome["transitions"]] == [
        "plan_ready", "pause", "resume", "batch_done", "next_iteration", "objective_met"]
    return base


# a tool call a human approves (agent.approve): whatever the kill, the call goes on only
# once allowed, each approval is decided once, and none is left open
APPROVE_STEPS = [
    {"role": "planner", "iteration": 1,
     "emit": [{"topic": "plan.ready", "json": {"tasks": [_task("t1")]}}]},
    {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE", "payload": "nothing left"}]},
    {"role": "executor", "task": "t1", "approve": {
        "tool_name": "Bash", "tool_input": {"command": "git push origin matrix"}},
     **_build("t1")},
    {"role": "reviewer", "emit": [{"topic": "review.done", "payload": REVIEW_OK}]},
]


def check_approvals(ws: Path, plane: Plane) -> None:
    asked = plane.questions()
    assert asked and all(q.kind == "approval" for q in asked), asked
    assert all(q.status is questions.QuestionStatus.ANSWERED for q in asked), asked
    bus = plane.records()
    decided = [r["payload"] for r in bus if r["topic"] == "approval.decided"]
    assert sorted(d["id"] for d in decided) == sorted(q.id for q in asked), decided
    assert {d["decision"] for d in decided} == {"allow"}, decided
    recorded = [r["payload"]["id"] for r in bus if r["topic"] == "approval.asked"]
    assert sorted(recorded) == sorted(q.id for q in asked), recorded


APPROVE = Scenario("approve", APPROVE_STEPS,
                   {"RObot": {"timeout_seconds": 20},
                    "agent": {"approve": ["Bash(git push*)"]}}, (0,), check_approvals)


@pytest.fixture(scope="module")
def approve(root, backend) -> Baseline:
    base = make_baseline(root, APPROVE, backend)
    assert [t[1] for t in base.outcome["transitions"]] == [
        "plan_ready", "batch_done", "next_iteration", "objective_met"]
    return base


# --- the matrix ---

class Point(NamedTuple):
    process: int   # 1: `session start`, 2...: the resumes of the uninterrupted run
    write: Write
    creating: bool = False   # a write of the session's creation (before it is renamed in)

    @property
    def name(self) -> str:
        return f"p{self.process}-{self.write.n:03d}"


def points_of(base: "Baseline") -> list[Point]:
    """Every write of every process of the uninterrupted run, as a point."""
    creation = set(base.backend.creation(base.writes[0]))
    return [Point(p, w, p == 1 and w in creation)
            for p, writes in enumerate(base.writes, 1) for w in writes]


def resume_to_the_end(ws: Path, scenario: Scenario, **env) -> None:
    """Resume until the session is over: its final exit code, or 2 "nothing to resume"
    when the kill came after the summary; a resume that meets a PAUSE exits 3."""
    for _ in range(len(scenario.exits) + 1):
        r = resume(ws, **env)
        if r.returncode == scenario.exits[-1]:
            return
        if r.returncode == 2 and "nothing to resume" in r.stderr:
            return
        assert r.returncode == 3 and 3 in scenario.exits, \
            f"resume exited {r.returncode}\n{r.stdout}{r.stderr}"
    raise AssertionError(f"still paused after resuming:\n{r.stdout}{r.stderr}")


def kill_at(root: Path, base: Baseline, point: Point) -> str | None:
    scenario, backend = base.scenario, base.backend
    ws = root / backend.name / scenario.name / "points" / point.name / "ws"
    trace = ws.parent / "trace"
    store = plane = None
    try:
        label = f"{scenario.name}-{point.name}"
        if point.process == 1:
            ws.mkdir(parents=True)
            store = backend.new(label)
        else:
            kit.copy_workspace(base.before[point.process - 1], ws)
            store = backend.copy(base.stores[point.process - 1], label, ws)
        env = backend.env(store)
        plane = backend.plane(ws, store)
        with Human(ws, plane):
            if point.process == 1:
                r = start(ws, base.config, RALPH_TEST_CRASH_AT_WRITE=point.write.n,
                          RALPH_TEST_WRITE_TRACE=trace, **env)
            else:
                r = resume(ws, RALPH_TEST_CRASH_AT_WRITE=point.write.n,
                           RALPH_TEST_WRITE_TRACE=trace, **env)
            assert r.returncode == KILLED, f"not killed: exit {r.returncode}\n{r.stderr}"
            got = [masked(w) for w in kit.read_trace(trace, ws, SID)]
            want = [masked(w) for w in base.writes[point.process - 1][:point.write.n]]
            assert got == want, "the run went another way than the baseline: at write " + \
                str(next(((i, g, w) for i, (g, w) in enumerate(zip(got, want), 1) if g != w),
                          f"{len(got)} writes, not {len(want)}"))
            if point.creating:
                # built aside, committed last: no session yet; starting again works
                assert not plane.exists()
                r = resume(ws, **env)
                assert r.returncode == 2 and "unknown session" in r.stderr, r.stderr
                r = start(ws, base.config, **env)
                assert r.returncode == scenario.exits[0], \
                    f"start again exited {r.returncode}\n{r.stderr}"
            else:
                kit.check_after_kill(ws, SID, plane)
            resume_to_the_end(ws, scenario, **env)
        result = kit.check_finished(ws, SID, ROOTS, plane)
        assert result == base.outcome, _diff(result, base.outcome)
        check_parses(ws, plane)
        scenario.check(ws, plane=plane)
    except Exception as e:  # noqa: BLE001 - reported per point
        return f"{backend.name} {scenario.name}: killed after write {point.write.n} of " \
               f"process {point.process} ({point.write.kind} {point.write.path}): " \
               f"{type(e).__name__}: {e}"
    finally:
        if plane is not None:
            plane.close()
    kit.remove_workspace(ws)
    shutil.rmtree(ws.parent, ignore_errors=True)
    backend.remove(store)
    return None


def choose(points: list[Point]) -> list[Point]:
    """Every point; RALPH_TEST_MATRIX_POINTS=N keeps N of them, evenly spread, and
    RALPH_TEST_MATRIX_POINTS=p2-052,p2-054 those named (for a quick look while
    developing; CI runs them all)."""
    wanted = os.environ.get("RALPH_TEST_MATRIX_POINTS", "")
    if wanted and not wanted.isdigit():
        return [pt for pt in points if pt.name in wanted.split(",")]
    if not wanted.isdigit() or int(wanted) >= len(points):
        return points
    n = int(wanted)
    return [points[i * len(points) // n] for i in range(n)]


def thinned(points: list[Point], key: Callable[[Point], object], lasts: bool = True
            ) -> list[Point]:
    """The first point of each `key` (a key of None: the point is kept whatever), and
    (`lasts`) each process's last write. A repeat of a write (the same code, for a later
    run, task or commit) proves nothing its first did not."""
    seen: set = set()
    last = {p: max(pt.write.n for pt in points if pt.process == p) if lasts else 0
            for p in {pt.process for pt in points}}
    kept = []
    for pt in points:
        k = key(pt)
        if k is not None and pt.write.n != last[pt.process]:
            if k in seen:
                continue
            seen.add(k)
        kept.append(pt)
    return kept


def kind_of(pt: Point) -> str:
    """A write's kind; on the PostgreSQL store, a commit's function."""
    return committer(pt.write) if pt.write.kind == "store" else pt.write.kind


def kept_points(points: list[Point], backend: str) -> list[Point]:
    """On the file store, every write of its control plane (each transition's record, each
    save: a kill at each is a resume from each moment of the session), and of the local
    trees' writes and the bus's index (a cache) the first of each kind in each process.
    The engine's resume is the same code on PostgreSQL, so there the first commit of each
    function in each process, and of each local kind: what only the backend does."""
    if backend == "postgres":
        return thinned(points, lambda pt: (pt.process, kind_of(pt)))
    return thinned(points, lambda pt: (pt.process, pt.write.kind)
                   if pt.write.kind in LOCAL | CACHES else None)


def run_matrix(root: Path, base: Baseline, at_least: int, select=None) -> list[Point]:
    points = points_of(base)
    if select is not None:
        points = [pt for pt in points if select(pt, base)]
    kept = kept_points(points, base.backend.name)
    chosen = choose(kept)
    began = time.monotonic()
    failures = kit.run_all(lambda pt: kill_at(root, base, pt), chosen)
    elapsed = time.monotonic() - began
    kinds = Counter(pt.write.kind for pt in chosen)
    per_process = Counter(pt.process for pt in chosen)
    print(f"\ncrash matrix ({base.backend.name}, {base.scenario.name}): {len(chosen)} of "
          f"{len(points)} write points covered ({len(kept)} kept; "
          + ", ".join(f"process {p}: {n}" for p, n in sorted(per_process.items()))
          + f") in {elapsed:.0f}s; by kind: "
          + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    assert not failures, f"{len(failures)} of {len(chosen)} points failed:\n" + \
        "\n".join(failures)
    if not os.environ.get("RALPH_TEST_MATRIX_POINTS"):
        assert len(points) >= at_least, f"only {len(points)} write points: the scenario shrank"
    return chosen


# what the full scenario writes: the kinds of write in the session's local trees (both
# backends), those of its control plane (the file store's files; the PostgreSQL store's
# commits, kind "store", by the function that commits)
LOCAL = {"progress", "iteration-metadata", "task", "plan", "report", "prompt", "review",
         "scratchpad", "knowledge-record", "knowledge-promote", "summary", "outbox-reset",
         "reply", "run-mark"}
CACHES = {"once-index"}   # rebuilt from the bus when lost (session_store/_once.py)
CONTROL = {"file": {"metadata", "event", "guidance", "signal-take", "signal-handled",
                    "signal-reject", "signal-rejected", "question", "question-status",
                    "config.yaml", "workspace"},
           "postgres": {"store"}}
COMMITS = {"PostgresSessions.create", "PostgresSession.save", "PostgresSession._append",
           "PostgresSignals.take", "PostgresSignals.mark_handled", "PostgresSignals.reject",
           "PostgresSignals._change_guidance", "PostgresQuestions.save"}
# a kind of write of the file store's control plane, as the PostgreSQL store commits it
COMMIT_OF = {"question": "PostgresQuestions.save", "event": "PostgresSession._append"}


def committer(w: Write) -> str:
    """The function that committed a write of the PostgreSQL store (its qualified name)."""
    return w.path.removeprefix("postgresql:").split(".<locals>")[0]


def is_write_of(w: Write, kind: str) -> bool:
    """Whether `w` writes a `kind` (a file store's kind of write) on either backend."""
    return w.kind == kind or w.kind == "store" and committer(w) == COMMIT_OF.get(kind)


@pytest.mark.slow
def test_kill_after_every_durable_write_of_a_full_scenario(root, full):
    chosen = run_matrix(root, full, at_least=100)
    if os.environ.get("RALPH_TEST_MATRIX_POINTS"):
        return
    kinds = {pt.write.kind for pt in chosen}
    expected = LOCAL | CONTROL[full.backend.name]
    assert expected <= kinds, expected - kinds
    commits = {committer(pt.write) for pt in chosen if pt.write.kind == "store"}
    assert commits == (COMMITS if full.backend.name == "postgres" else set()), commits
    # both trees: the work area's writes (in the workspace) are points as much as the
    # control plane's (in the state directory, or the database)
    work = {w.kind for writes in full.writes for w in writes
            if w.path.startswith(f".ralph-sessions/{SID}/")}
    assert work == {"scratchpad", "outbox-reset", "prompt", "reply"}, work


@pytest.mark.slow
def test_kill_after_every_durable_write_of_an_aborted_session(root, aborted):
    run_matrix(root, aborted, at_least=24)


def _around_the_timeout(point: Point, base: Baseline) -> bool:
    """From the question on, to the resume's transition: where the pause is decided,
    made durable, and noted on the question."""
    writes = base.writes[point.process - 1]
    if point.process == 1:
        asked = next(w.n for w in writes if is_write_of(w, "question"))
        return point.write.n >= asked
    resumed = next(w.n for w in writes if is_write_of(w, "event"))
    return point.write.n <= resumed


def _around_the_approval(point: Point, base: Baseline) -> bool:
    """From the approval's question on, until the executor's run is over."""
    writes = base.writes[0]
    asked = next(w.n for w in writes if is_write_of(w, "question"))
    reported = next(w.n for w in writes if w.kind == "report")
    return asked <= point.write.n <= reported


@pytest.mark.slow
def test_kill_around_an_approval(root, approve):
    run_matrix(root, approve, at_least=5, select=_around_the_approval)


@pytest.mark.slow
def test_kill_around_a_question_timeout_that_pauses(root, question_pause):
    # 9 on PostgreSQL: a start writes nothing in the work area before its first record
    # since each run has its own outbox (it used to rewrite the session's one)
    run_matrix(root, question_pause, at_least=9, select=_around_the_timeout)
