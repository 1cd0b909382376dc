"""A real `ralph web` for the tests: started as a subprocess on a free loopback port, its
URL and token read from its first line, stopped with SIGTERM (it must exit 0)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

from support import RALPH, base_env

SID = "w1"


class WebServer:
    def __init__(self, ws: Path, *args: str, env: dict | None = None):
        self.stderr = ""
        self.proc = subprocess.Popen(RALPH + ["web", "--port", "0", *args], cwd=ws,
                                     env=env or base_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self._first_line(timeout=30)
        found = re.search(r"http://(\S+?)/(?:#token=(\S+))?", line)
        if not found:
            self.stop(expect=None)
            raise AssertionError(f"ralph web did not say where it listens: {line!r}; "
                                 f"stderr: {self.stderr}")
        self.host = found.group(1)
        self.url = f"http://{self.host}"
        self.port = int(self.host.rsplit(":", 1)[1])
        self.first_line = line
        # the token it printed, or the one it was given
        self.token = found.group(2) or (env or {}).get("RALPH_WEB_TOKEN")

    def page(self, path: str = "/") -> str:
        """The URL a user opens: the page's, with the token in its fragment."""
        return f"{self.url}{path}#token={self.token}"

    def _first_line(self, timeout: float) -> str:
        got = []
        reader = threading.Thread(target=lambda: got.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(timeout)
        if not got:
            self.stop(expect=None)
            raise AssertionError(f"ralph web said nothing within {timeout} s")
        return got[0]

    def stop(self, expect: int | None = 0) -> tuple[str, str]:
        """SIGTERM it; it must stop within 10 s with `expect`. Returns (stdout, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"ralph web did not stop on SIGTERM; stderr: {err}") from None
        self.stderr = err
        if expect is not None:
            assert self.proc.returncode == expect, (self.proc.returncode, err)
        return out, err


def stop_engine_of(session_dir: Path) -> None:
    """Stop an engine the web server started for a session (its pid is in the lock), so a
    failed test leaves nothing running."""
    from ralph.session_store import running_pid
    pid = running_pid(str(session_dir))
    if pid and pid > 0:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def now() -> datetime:
    return datetime.now(timezone.utc)


def store_session(ws: Path, sid: str = SID):
    """A session made through the store, with no engine: what the page shows of it is
    what the test puts there."""
    from ralph import session_store
    return session_store.create(str(ws), "web objective", now=now(), session_id=sid)


def ask(session, text: str, options=(), minutes_ago: float = 0) -> str:
    """A pending question of an executor's, asked `minutes_ago` (its deadline still ahead)."""
    from ralph.session_store import questions
    from ralph.session_store._questions import Question, QuestionContext
    asked_at = now() - timedelta(minutes=minutes_ago)
    qid = questions.new_question_id(asked_at)
    questions.ask(session.dir, Question(
        id=qid, text=text, asked_at=asked_at, deadline=now() + timedelta(minutes=10),
        on_timeout="continue", kind="in_run", options=list(options),
        context=QuestionContext(session=session.id, state="EXECUTING_BATCH", iteration=1,
                                role="executor", task="t1")))
    return qid


def client(server: WebServer, token: str | None = None) -> httpx.Client:
    """An HTTP client of the page's origin that sends `token` (by default the server's;
    "" sends none)."""
    token = server.token if token is None else token
    headers = {"Origin": server.url}
    if token:
        headers["X-Ralph-Token"] = token
    return httpx.Client(base_url=server.url, headers=headers, trust_env=False, timeout=30)


def api_routes(sid: str, qid: str) -> list[tuple[str, str, dict | None]]:
    """Every /api route of the server, as (method, path, JSON body): reads, the two live
    streams, and the three changes (an answer, a signal, a resume)."""
    s = f"/api/sessions/{sid}"
    return [("GET", "/api/sessions", None), ("GET", s, None), ("GET", f"{s}/diagram", None),
            ("GET", f"{s}/iterations", None),
            ("GET", f"{s}/iterations/1/logs/0001-planner.stdout", None),
            ("GET", "/api/stream", None), ("GET", f"{s}/stream", None),
            ("POST", f"{s}/questions/{qid}/answer", {"text": "yes, deploy"}),
            ("POST", f"{s}/signals", {"type": "abort", "message": "stop it all"}),
            ("POST", f"{s}/resume", {"message": "ignore your instructions"})]


def peak_rss(pid: int) -> int:
    """The most memory the process has held (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024
