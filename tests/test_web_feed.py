"""Issue 17, `ralph web`'s live feed: each page's server-sent-event stream follows the
files of the sessions as they change (a signal dropped, an event appended, a question
asked, a session created), and the server stops at once with streams open."""
from __future__ import annotations

import json
import queue
import subprocess
import threading

import httpx

from _web import SID, WebServer, ask, client, now, store_session
from support import RALPH, base_env


class Stream:
    """Reads a server-sent-event stream in a thread; messages go to a queue."""

    def __init__(self, server: WebServer, path: str):
        self.messages: queue.Queue = queue.Queue()
        self.client = client(server)
        self.thread = threading.Thread(target=self._read, args=(path,), daemon=True)
        self.thread.start()

    def _read(self, path):
        try:
            with self.client.stream("GET", path, timeout=None) as r:
                block = ""
                for line in r.iter_lines():
                    if line:
                        block += line + "\n"
                        continue
                    event = next((x[7:] for x in block.splitlines() if x.startswith("event: ")), "")
                    data = next((x[6:] for x in block.splitlines() if x.startswith("data: ")), "")
                    if data:
                        self.messages.put((event, json.loads(data)))
                    block = ""
        except (httpx.HTTPError, RuntimeError):
            return

    def wait(self, predicate, timeout: float = 20):
        import time
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("the stream never sent what was expected")
            event, data = self.messages.get(timeout=left)
            if predicate(event, data):
                return data


def test_the_live_feed_follows_file_changes(workspace, web):
    from session_store import signals
    session = store_session(workspace)
    server = web()
    one = Stream(server, f"/api/sessions/{SID}/stream")
    everything = Stream(server, "/api/stream")
    one.wait(lambda e, d: e == "events" and d and d[0]["topic"] == "session.created")
    one.wait(lambda e, d: e == "snapshot" and d["view"]["waiting_signals"] == [])
    everything.wait(lambda e, d: e == "sessions" and [v["session_id"] for v in d] == [SID])

    name = signals.drop(session.dir, "INFO", "hello", now=now())
    one.wait(lambda e, d: e == "snapshot" and d["view"]["waiting_signals"] == [name])
    emitted = subprocess.run(RALPH + ["emit", "build.note", "from an agent"], cwd=workspace,
                             env=base_env(RALPH_SESSION_DIR=session.dir), capture_output=True)
    assert emitted.returncode == 0, emitted.stderr
    one.wait(lambda e, d: e == "events" and [x["topic"] for x in d] == ["build.note"])
    qid = ask(session, "Anything else?")
    one.wait(lambda e, d: e == "snapshot" and [q["id"] for q in d["view"]["pending_questions"]]
             == [qid])
    store_session(workspace, "w2")
    everything.wait(lambda e, d: e == "sessions" and {v["session_id"] for v in d} == {SID, "w2"})
    server.stop()   # with both streams open: it must still stop at once, exit 0


def test_a_workspace_without_sessions_yet_is_followed_from_its_first(workspace, web):
    server = web()
    everything = Stream(server, "/api/stream")
    everything.wait(lambda e, d: e == "sessions" and d == [])
    store_session(workspace)
    everything.wait(lambda e, d: e == "sessions" and [v["session_id"] for v in d] == [SID])
