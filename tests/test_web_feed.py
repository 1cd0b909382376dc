"""Issue 17, `ralph web`'s live feed: each page's server-sent-event stream follows the
files of the sessions as they change (a note in the scratchpad of the work area, a signal
dropped, an event appended, a question asked, a session created), and the server stops at
once with streams open. Issue 21: the streams are bounded in number (one past
--max-streams is refused) and in what a slow reader makes the server hold."""
from __future__ import annotations

import json
import queue
import socket
import threading
from pathlib import Path

import httpx

from _web import SID, WebServer, ask, client, now, peak_rss, store_session
from ralph.engine.channels.web.feed import KEEPALIVE
from support import ralph, wait_for


class Stream:
    """Reads a server-sent-event stream in a thread; messages go to a queue."""

    def __init__(self, server: WebServer, path: str):
        self.messages: queue.Queue = queue.Queue()
        self.opened = threading.Event()
        self.client = client(server)
        self.thread = threading.Thread(target=self._read, args=(path,), daemon=True)
        self.thread.start()

    def _read(self, path):
        try:
            with self.client.stream("GET", path, timeout=None) as r:
                self.socket = r.extensions["network_stream"].get_extra_info("socket")
                self.opened.set()
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
            try:
                event, data = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("the stream never sent what was expected") from None
            if predicate(event, data):
                return data

    def close(self) -> None:
        """Hang up, as a closed tab does (a shutdown wakes the reader's blocked read)."""
        assert self.opened.wait(20)
        self.socket.shutdown(socket.SHUT_RDWR)
        self.thread.join(20)


def test_the_live_feed_follows_file_changes(workspace, web):
    from ralph.session_store import append_event, signals
    session = store_session(workspace)
    server = web()
    one = Stream(server, f"/api/sessions/{SID}/stream")
    everything = Stream(server, "/api/stream")
    one.wait(lambda e, d: e == "events" and d and d[0]["topic"] == "session.created")
    one.wait(lambda e, d: e == "snapshot" and d["view"]["waiting_signals"] == [])
    everything.wait(lambda e, d: e == "sessions" and [v["session_id"] for v in d] == [SID])
    # the scratchpad is in the work area, where agents write their notes: watched too. First
    # of all, so no late wakeup of an earlier write can read it, and the stream's keepalive
    # re-read would find it only after KEEPALIVE seconds
    with open(Path(session.work_dir) / "scratchpad.md", "a", encoding="utf-8") as notes:
        notes.write("an agent's note\n")
    one.wait(lambda e, d: e == "snapshot" and d["scratchpad"].endswith("an agent's note\n"),
             timeout=KEEPALIVE / 2)

    name = signals.drop(session.dir, "INFO", "hello", now=now())
    one.wait(lambda e, d: e == "snapshot" and d["view"]["waiting_signals"] == [name])
    # the engine's record of what a run's agent emitted (an agent's own `ralph emit` reaches
    # the bus only through the engine: test_web_browser follows one to the page)
    append_event(session.dir, "build.note", "from an agent", source="executor")
    one.wait(lambda e, d: e == "events" and [(x["topic"], x["source"], x["payload"]) for x in d]
             == [("build.note", "executor", "from an agent")])
    qid = ask(session, "Anything else?")
    one.wait(lambda e, d: e == "snapshot" and [q["id"] for q in d["view"]["pending_questions"]]
             == [qid])
    store_session(workspace, "w2")
    everything.wait(lambda e, d: e == "sessions" and {v["session_id"] for v in d} == {SID, "w2"})
    server.stop()   # with both streams open: it must still stop at once, exit 0


def test_a_workspace_without_sessions_yet_is_followed_from_its_first(workspace, web):
    """Its sessions' control root (in the state directory) is made with the first session,
    and the work root (in the workspace) may be there already, e.g. left by an older ralph:
    each is seen made, and followed from then on (not at the next keepalive)."""
    from ralph.session_store import control_root, work_root
    assert not Path(control_root(str(workspace))).exists()
    Path(work_root(str(workspace))).mkdir()
    server = web()
    everything = Stream(server, "/api/stream")
    everything.wait(lambda e, d: e == "sessions" and d == [])
    store_session(workspace)
    everything.wait(lambda e, d: e == "sessions" and [v["session_id"] for v in d] == [SID],
                    timeout=KEEPALIVE / 2)
    store_session(workspace, "w2")
    everything.wait(lambda e, d: e == "sessions" and len(d) == 2, timeout=KEEPALIVE / 2)


def test_live_streams_are_bounded_in_number(workspace, web):
    store_session(workspace)
    r = ralph(workspace, "web", "--max-streams", "0")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    server = web("--max-streams", "2")
    listing = Stream(server, "/api/stream")
    one = Stream(server, f"/api/sessions/{SID}/stream")
    listing.wait(lambda e, d: e == "sessions")
    one.wait(lambda e, d: e == "snapshot")
    with client(server) as c:
        for path in ("/api/stream", f"/api/sessions/{SID}/stream"):
            with c.stream("GET", path) as extra:
                assert extra.status_code == 503
                assert extra.headers["retry-after"] == "10"
                assert json.loads(extra.read()) == {"error": (
                    "refused: 2 live streams are open, the most this server keeps "
                    "(ralph web --max-streams)")}
        assert c.get(f"/api/sessions/{SID}").status_code == 200   # the rest still answers
        listing.close()   # a page closed: its stream is free again

        def reopened() -> bool:
            with c.stream("GET", "/api/stream") as again:
                return again.status_code == 200
        wait_for(reopened)


class SlowReader:
    """A stream whose reader reads nothing (a tiny receive buffer), until `drain`."""

    def __init__(self, server: WebServer, path: str):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(60)
        self.sock.connect(("127.0.0.1", server.port))
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {server.host}\r\n"
                          f"X-Ralph-Token: {server.token}\r\n\r\n".encode())
        self.sock.recv(1, socket.MSG_PEEK)   # the stream is open: the server has answered

    def drain(self, until: bytes) -> bytes:
        """Everything the server sends, up to the message holding `until`."""
        got = bytearray()
        while until not in got[-(1 << 20):]:
            data = self.sock.recv(1 << 16)
            assert data, "the server closed the stream"
            got += data
        self.sock.close()
        return bytes(got)


def test_a_slow_reader_holds_back_its_own_stream_not_the_servers_memory(workspace, web):
    """Two pages that read nothing while 48 MiB are appended to the bus (3,072 events of
    16 KiB, straight through the store, as an agent with the bus in reach could): the
    server's peak memory grows by little, and each page, when it reads at last, is sent
    the events cut to a few kB, the newest of them, and told of the ones it missed."""
    from ralph.session_store import append_event
    session = store_session(workspace)
    server = web()
    path = f"/api/sessions/{SID}/stream"
    slow = [SlowReader(server, path) for _ in range(2)]
    fast = Stream(server, path)
    fast.wait(lambda e, d: e == "snapshot")
    before = peak_rss(server.proc.pid)
    payload = "x" * (16 << 10)
    for _ in range(3072):
        append_event(session.dir, "agent.output", payload, source="executor")
    append_event(session.dir, "test.end", "the last one", source="executor")
    fast.wait(lambda e, d: e == "events" and any(x["topic"] == "test.end" for x in d))
    sent = [reader.drain(b'"topic": "test.end"') for reader in slow]
    grew = peak_rss(server.proc.pid) - before
    assert grew < 32 << 20, f"the server's peak RSS grew by {grew >> 20} MiB"
    for got in sent:
        assert len(got) < 8 << 20, len(got)      # of 48 MiB appended
        assert b"events came faster than this page is sent them: the newest" in got
        assert b'"truncated": true' in got and payload.encode() not in got
