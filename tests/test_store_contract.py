"""The store's contract, for every backend: the Session handle's verbs as the engine uses
them (append and read by seq; once and done, the exactly-once primitive), under
concurrent callers in real processes and under kill -9 at each durable step of an append.

Parametrised by the fixture `store`: "file" and "postgres" (a throwaway cluster, see
conftest's postgres_cluster). A backend joins by adding its adapter to BACKENDS: making a
session, opening a new handle on it as the next engine would, naming it to a child
process, and the kill points of its append.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from ralph import session_store
from ralph.session_store import create, load
from ralph.session_store._events import complete_size   # the file backend's own (FileStore)

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


class FileStore:
    """The file backend: a session directory, its bus events.jsonl."""

    name = "file"
    torn_lines = True   # a kill mid-append can leave half a line (cut off by the next)

    def __init__(self, tmp_path, request):
        self.workspace = tmp_path / "ws"
        self.workspace.mkdir()

    def new(self, sid: str = "s1"):
        return create(str(self.workspace), "contract", now=NOW, session_id=sid)

    def reopen(self, session):
        """A new handle on the session: the next engine's, after a crash."""
        return load(str(self.workspace), session.id)

    def spec(self, session) -> dict:
        """What a child process needs to open the session (see CHILD)."""
        return {"backend": self.name, "workspace": str(self.workspace), "id": session.id}

    def tear(self, session, key: str) -> None:
        """Half of a record with dedupe key `key` left as the last line (a torn append)."""
        line = json.dumps({"seq": 99, "topic": "t", "payload": None, "once": key})
        with open(os.path.join(session.dir, "events.jsonl"), "ab") as f:
            f.write(line[:len(line) // 2].encode())

    def sessions(self):
        """The workspace's sessions as a channel sees them (by id, buses by seq)."""
        return session_store.open_sessions(str(self.workspace))

    def channel_files(self, channel: str):
        return session_store.open_channel(str(self.workspace), channel)

    def torn(self, session) -> bool:
        """Whether the bus ends in a torn line."""
        path = os.path.join(session.dir, "events.jsonl")
        return complete_size(session.dir) < os.path.getsize(path)


class PostgresStore(FileStore):
    """The PostgreSQL backend, chosen as a user chooses it ($RALPH_STORE_URL): the same
    verbs, over a database of the test's own (a schema)."""

    name = "postgres"
    torn_lines = False   # a transaction commits whole or not at all

    def __init__(self, tmp_path, request):
        super().__init__(tmp_path, request)
        self.url = request.getfixturevalue("postgres_url")
        request.getfixturevalue("monkeypatch").setenv("RALPH_STORE_URL", self.url)

    def spec(self, session) -> dict:
        return {**super().spec(session), "url": self.url}

    def tear(self, session, key: str) -> None:
        """A writer killed inside its transaction, its keyed row inserted, not committed."""
        r = subprocess.run([sys.executable, "-c", PG_CHILD, json.dumps(self.spec(session)),
                            key, "in_transaction"], env=os.environ,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)

    def torn(self, session) -> bool:
        return False


BACKENDS = {"file": FileStore, "postgres": PostgresStore}


@pytest.fixture(params=list(BACKENDS))
def store(request, tmp_path):
    return BACKENDS[request.param](tmp_path, request)


def records(session) -> list[dict]:
    return session.events_after(0)


def keyed(session, key: str) -> list[dict]:
    return [r for r in records(session) if r.get("once") == key]


def assert_seqs_whole(session) -> None:
    seqs = [r["seq"] for r in records(session)]
    assert seqs == list(range(1, len(seqs) + 1)), seqs


# --- append and read by seq ---

def test_append_returns_the_record_with_the_next_seq_and_reads_give_them_in_order(store):
    s = store.new()
    appended = [s.append_event("t", {"i": i}) for i in range(5)]
    assert [r["seq"] for r in appended] == [2, 3, 4, 5, 6]   # 1: session.created
    got = records(store.reopen(s))
    assert [r["seq"] for r in got] == [1, 2, 3, 4, 5, 6]
    assert [r["payload"] for r in got[1:]] == [{"i": i} for i in range(5)]
    assert all(r["source"] == "engine" and r["state"] == "PLANNING" for r in got)


def test_reads_by_seq_get_only_what_came_after(store):
    s = store.new()
    reader = s.reader()
    s.append_event("a")
    other = store.reopen(s)
    other.append_event("b")
    assert [r["topic"] for r in reader.read_new()] == ["a", "b"]
    assert reader.read_new() == []
    assert [r["topic"] for r in s.events_after(2)] == ["b"] and s.events_after(3) == []
    assert s.last_seq() == other.last_seq() == 3
    assert [r["seq"] for r in s.tail(2)] == [2, 3]
    assert s.last_event(lambda r: r["topic"] == "a")["seq"] == 2


# --- once and done ---

def test_once_is_true_exactly_once_for_a_key(store):
    s = store.new()
    assert not s.done("k")
    assert s.once("k", "t", {"n": 1}) is True
    assert s.done("k")
    assert s.once("k", "t", {"n": 2}) is False
    assert s.once("j", "t") is True   # another key is another thing
    [record] = keyed(s, "k")
    assert record["payload"] == {"n": 1} and record["topic"] == "t"
    assert_seqs_whole(s)


def test_once_keeps_the_records_fields(store):
    s = store.new()
    s.once("k", "t", {"x": 1}, source="executor", ts="2026-11-22T12:00:00+00:00",
           run="r1", via=[0, 10])
    [r] = keyed(s, "k")
    assert (r["source"], r["ts"], r["run"], r["via"]) == (
        "executor", "2026-11-22T12:00:00+00:00", "r1", [0, 10])


def test_a_key_is_done_for_every_handle_whenever_it_was_opened(store):
    s = store.new()
    early = store.reopen(s)   # opened (and its index read) before the key was recorded
    assert not early.done("k")
    assert s.once("k", "t")
    assert early.done("k") and store.reopen(s).done("k")
    assert early.once("k", "t") is False and store.reopen(s).once("k", "t") is False
    assert len(keyed(s, "k")) == 1


def test_only_the_records_own_key_counts(store):
    """A payload that says `once` is an agent's words, not a key; a plain append has none."""
    s = store.new()
    s.append_event("t", {"once": "k"})
    s.append_event("t", "once: k")
    assert not s.done("k") and s.once("k", "t")


def test_a_bad_key_is_refused(store):
    s = store.new()
    for key in ("", None, 3):
        with pytest.raises(session_store.BadInput):
            s.once(key, "t")


def test_a_torn_last_line_is_no_done_key(store):
    s = store.new()
    store.tear(s, "k")
    assert store.torn(s) is store.torn_lines
    nxt = store.reopen(s)
    assert not nxt.done("k")
    assert nxt.once("k", "t") is True   # the torn line is cut off, the record written whole
    assert len(keyed(nxt, "k")) == 1 and nxt.done("k")
    assert_seqs_whole(nxt)


def test_many_keys_stay_cheap_to_ask(store):
    """The index is read once, then caught up: asking is not a scan of the bus."""
    s = store.new()
    for i in range(300):
        assert s.once(f"k{i}", "t")
    fresh = store.reopen(s)
    assert all(fresh.done(f"k{i}") for i in range(300)) and not fresh.done("k300")
    assert fresh.once("k300", "t") and fresh.done("k300") and s.done("k300")
    if store.name == "file":   # caught up from the offset it had read to, not read again
        index = fresh._once_index()
        offset = index.offset
        assert fresh.once("k301", "t") and index.offset > offset and "k301" in index.keys


# --- concurrent callers: real processes ---

def _race(spec: dict, keys: list[str], barrier, results) -> None:
    s = _open(spec)
    barrier.wait()
    results.put([(key, s.once(key, "race", {"pid": os.getpid()})) for key in keys])


def _open(spec: dict):
    return load(spec["workspace"], spec["id"])   # (the store's URL is in the environment)


def test_concurrent_processes_one_wins_each_key(store):
    s = store.new()
    ctx = multiprocessing.get_context("fork")
    n, keys = 6, [f"k{i}" for i in range(10)]
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(store.spec(s), keys, barrier, results))
             for _ in range(n)]
    for p in procs:
        p.start()
    won = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for key in keys:
        assert sum(ok for result in won for k, ok in result if k == key) == 1, key
        assert len(keyed(s, key)) == 1, key
    assert_seqs_whole(s)


# --- kill -9 at each durable step of an append ---

# A child opens the session and calls once(key); at `point` it SIGKILLs itself:
#   before  - before the call;          locked  - holding the bus's lock, key checked;
#   torn    - half the line written;    written - the whole line, before its fsync;
#   synced  - the line fsynced, the lock released, before once returns.
CHILD = r"""
import json, os, signal, sys
spec, key, point = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
from ralph.session_store import _events, load

def die(*_args, **_kwargs):
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)

real_catch_up, real_write = _events.OnceIndex.catch_up, os.write

def catch_up(self, end=None):
    real_catch_up(self, end)
    if end is not None:   # under the lock
        die()

def write(fd, data):
    if isinstance(data, bytes) and f'"once":"{key}"'.encode() in data and data.endswith(b"\n"):
        real_write(fd, data[:len(data) // 2])
        die()
    return real_write(fd, data)

session = load(spec["workspace"], spec["id"])
if point == "before":
    die()
elif point == "locked":
    _events.OnceIndex.catch_up = catch_up
elif point == "torn":
    os.write = write
elif point == "written":
    _events.fsync = die
elif point == "synced":
    _events.durable_write_done = die
print(session.once(key, "killed", {"point": point}))
"""

# The PostgreSQL backend's steps: before the call; in_transaction - its row inserted and
# its NOTIFY queued, not committed; committed - the commit answered, before once returns.
PG_CHILD = r"""
import json, os, signal, sys
spec, key, point = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
from ralph.session_store.postgres import _db, _sessions

def die(*_args, **_kwargs):
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)

session = _sessions.PostgresSessions(os.environ["RALPH_STORE_URL"]).load(spec["id"])
real_write = _db.Database.write

def committed(self, fn):
    real_write(self, fn)
    die()

if point == "before":
    die()
elif point == "in_transaction":
    _sessions._notify = die
elif point == "committed":
    _db.Database.write = committed
print(session.once(key, "killed", {"point": point}))
"""

KILL_POINTS = {
    "file": (CHILD, {"before": False, "locked": False, "torn": False, "written": True,
                     "synced": True}),
    "postgres": (PG_CHILD, {"before": False, "in_transaction": False, "committed": True}),
}


@pytest.mark.parametrize("backend,point", [(b, p) for b, (_, points) in KILL_POINTS.items()
                                           for p in points])
def test_kill_9_at_each_step_leaves_the_key_done_iff_its_line_is_whole(
        backend, point, tmp_path, request):
    store = BACKENDS[backend](tmp_path, request)
    child, points = KILL_POINTS[backend]
    s = store.new()
    s.once("other", "t")
    r = subprocess.run([sys.executable, "-c", child, json.dumps(store.spec(s)), "k", point],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stdout, r.stderr)
    assert store.torn(s) is (point == "torn")
    nxt = store.reopen(s)
    done = points[point]
    assert nxt.done("k") is done
    assert nxt.once("k", "t", {"after": point}) is (not done)   # done again only if not done
    assert len(keyed(nxt, "k")) == 1 and nxt.done("other")
    assert_seqs_whole(nxt)
    assert store.reopen(s).once("k", "t") is False


# --- Sessions: the workspace's sessions by id, their buses by seq, wakeups as changes ---

def test_a_bus_is_read_by_seq(store):
    sessions = store.sessions()
    s = store.new("s1")
    assert sessions.ids() == ["s1"] and sessions.last_seq("s1") == 1   # session.created
    for i in range(5):
        s.append_event("human.progress", f"step {i}")
    assert [e["seq"] for e in sessions.events_after("s1", 0)] == [1, 2, 3, 4, 5, 6]
    assert [e["payload"] for e in sessions.events_after("s1", 4)] == ["step 3", "step 4"]
    assert sessions.events_after("s1", 6) == [] and sessions.last_seq("s1") == 6
    assert [e["seq"] for e in s.tail(2)] == [5, 6]


def test_a_torn_last_record_is_not_read_until_the_next_append_cuts_it(store):
    sessions = store.sessions()
    s = store.new("s1")
    store.tear(s, "k")
    assert sessions.last_seq("s1") == 1 and sessions.events_after("s1", 1) == []
    s.append_event("human.progress", "after the tear")
    assert [(e["seq"], e["payload"]) for e in sessions.events_after("s1", 1)] == \
        [(2, "after the tear")]


def test_a_watch_names_what_changed(store):
    import queue
    sessions = store.sessions()
    s1 = store.new("s1")
    changes: queue.Queue = queue.Queue()
    stop = sessions.watch(changes.put)

    def heard(what: str, sid: str) -> None:
        while True:   # (a session's own directory changing says "session" too)
            change = changes.get(timeout=10)
            if (change.what, change.session) == (what, sid):
                return
    try:
        s1.append_event("human.progress", "hello")
        heard("events", "s1")
        store.new("s2")
        heard("session", "s2")
        stop.add("s2")
        sessions.load("s2").append_event("human.progress", "there")
        heard("events", "s2")
    finally:
        stop()


# --- ChannelFiles: one process runs a channel per workspace; its state is replaced whole

def _hold_channel_lock(files, ready):
    lock = files.try_lock()   # held while this process lives
    ready.put(lock is not None)
    time.sleep(60)   # the wait is what is proven: it holds the lock until killed


def test_one_process_at_a_time_holds_a_channels_lock(store):
    files = store.channel_files("telegram")
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Queue()
    holder = ctx.Process(target=_hold_channel_lock, args=(files, ready))
    holder.start()
    try:
        assert ready.get(timeout=30) is True
        assert files.try_lock() is None and files.lock_holder() == str(holder.pid)
        os.kill(holder.pid, signal.SIGKILL)   # the holder dies: its lock goes with it
        holder.join(10)
        lock = files.try_lock()
        assert lock is not None
        lock.release()
    finally:
        if holder.is_alive():
            holder.kill()
        holder.join(10)


def test_a_channels_state_is_replaced_whole(store):
    files = store.channel_files("telegram")
    assert files.read_state() is None
    files.write_state('{"read_seqs": {"s1": 3}}\n', "telegram-state")
    files.write_state('{"read_seqs": {"s1": 4}}\n', "telegram-state")
    assert files.read_state() == b'{"read_seqs": {"s1": 4}}\n'
    if store.name == "file":
        assert not [n for n in os.listdir(files.dir) if n.endswith(".tmp")]


# --- metadata: saved over the revision a handle read, never over another writer's ---

def test_metadata_is_saved_only_over_the_revision_read(store):
    first = store.new("s1")
    second = store.reopen(first)
    first.metadata.batch = 2
    first.save(NOW)
    second.metadata.batch = 3
    with pytest.raises(session_store.StaleMetadata, match="another writer"):
        second.save(NOW)
    again = store.reopen(first)
    assert again.metadata.batch == 2 and again.metadata.revision == first.metadata.revision
    again.metadata.batch = 4
    again.save(NOW)   # a handle that read the latest saves
    assert store.reopen(first).metadata.batch == 4


# --- questions, signals and the run's lease: verbs of the handle, no path above it ---

def test_a_question_is_asked_answered_once_and_resolved_through_the_handle(store):
    from ralph.session_store import AlreadyAnswered, questions
    Question, QuestionStatus = questions.Question, questions.QuestionStatus
    session = store.new("s1")
    asked = session.questions
    for qid in ("q1", "q2"):
        asked.ask(Question(id=qid, text="which?", asked_at=NOW, deadline=NOW,
                           on_timeout="continue", options=["red", "blue"],
                           context=questions.QuestionContext("s1", "executing_batch", 1)))
    other = store.reopen(session).questions   # the channel's handle, or the next engine's
    assert other.mark_undeliverable("q2", NOW, channel="telegram")
    assert asked.load("q2").delivery_failed
    assert other.ids() == ["q1", "q2"] and [q.id for q in other.pending()] == ["q1", "q2"]
    assert not other.has_answer("q1") and other.read_answer("q1") is None
    assert other.answer("q1", "bl", now=NOW, channel="web").text == "blue"
    with pytest.raises(AlreadyAnswered):
        other.answer("q1", "red", now=NOW)
    assert asked.has_answer("q1") and asked.read_answer("q1").channel == "web"
    assert [q.id for q in asked.pending()] == ["q2"]
    question = asked.load("q1")
    asked.resolve(question, QuestionStatus.ANSWERED, NOW)
    asked.mark_asker_gone(question)
    question.late_answer_delivered = True
    asked.save(question)
    assert other.load("q1").late_answer_delivered
    assert [(q.status, q.asker_gone) for q in other.all()][0] == (QuestionStatus.ANSWERED, True)


def test_a_signal_is_dropped_taken_once_and_its_guidance_delivered(store):
    session = store.new("s1")
    box, other = session.signals, store.reopen(session).signals
    name = other.drop("STEER", "use sqlite", now=NOW, target="Executor", priority=True)
    assert box.waiting() == [name]
    signal, reason, _raw = box.read(name)
    assert reason is None and signal.priority and signal.role == "executor"
    assert box.take(name) and not other.take(name)   # one consumer wins it
    assert box.taken_unmarked() == [name] and box.read_taken(name).message == "use sqlite"
    box.queue_guidance({"id": name, "type": "STEER", "target": "executor",
                        "message": "use sqlite", "at": NOW.isoformat()})
    box.mark_handled(signal, handled_by="Ralph-Orchestrator", action="queued", now=NOW)
    assert box.taken_unmarked() == [] and box.waiting() == []
    other.delivered([name], to="1/executor/t1")
    assert box.guidance()[0]["delivered_to"] == "1/executor/t1"
    box.forget_delivered()
    assert other.guidance() == []


def test_one_engine_holds_a_sessions_lease(store):
    session = store.new("s1")
    assert session.running_pid() is None
    lease = session.acquire_lease()
    try:
        assert store.reopen(session).running_pid() == os.getpid()
        with pytest.raises(session_store.SessionLocked):
            store.reopen(session).acquire_lease(wait_seconds=0)
    finally:
        lease.release()
    assert session.running_pid() is None
