"""Issue 17, `ralph web` over HTTP (the live feed is in test_web_feed.py, the browser in
test_web_browser.py): who may read and act, ids and names from URLs never leave the
workspace, the Telegram token never leaves the server, answers and signals follow the
CLI's rules, and a resume starts a real engine. Every test talks to a real `ralph web`
subprocess on a loopback port."""
from __future__ import annotations

import http.client
import json
import os
import select
import shutil
import socket
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import yaml

from _web import SID, ask, client, now, peak_rss, store_session
from support import (EVIDENCE, FAST, base_env, metadata, ralph, session_dir, signal_files,
                     wait_for, work_dir, write_config, write_scenario)

WEB_TOKEN = "web-token-0123456789abcdef"
TG_TOKEN_ENV = "123456:TELEGRAM-FROM-ENV-SECRET"
TG_TOKEN_CONFIG = "654321:TELEGRAM-FROM-CONFIG-SECRET"

TWO_ITERATIONS = [
    {"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": {
        "tasks": [{"id": "t1", "title": "first"}]}}]},
    {"role": "planner", "iteration": 2, "emit": [{"topic": "plan.ready", "json": {
        "tasks": [{"id": "t2", "title": "second"}]}}]},
    {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE"}]},
    {"role": "executor", "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
    {"role": "reviewer", "emit": [{"topic": "review.done", "payload": "tests: pass, build: pass"}]},
]


# --- who may use it ---

def test_a_public_address_needs_a_token_and_a_taken_port_is_refused(workspace):
    for host in ("0.0.0.0", "192.0.2.1", "::", "example.org"):
        r = ralph(workspace, "web", "--host", host, "--port", "0")
        assert r.returncode == 2, (host, r.stderr)
        assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "RALPH_WEB_TOKEN" in r.stderr and "Traceback" not in r.stderr
    r = ralph(workspace, "web", "--host", "0.0.0.0", "--port", "0",
              env=base_env(RALPH_WEB_TOKEN="short"))
    assert r.returncode == 2 and "at least 16" in r.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        r = ralph(workspace, "web", "--port", taken.getsockname()[1])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "cannot listen there" in r.stderr


def test_with_a_token_every_api_request_needs_it(workspace, web):
    session = store_session(workspace)
    server = web("--host", "0.0.0.0", env=base_env(RALPH_WEB_TOKEN=WEB_TOKEN))
    assert WEB_TOKEN not in server.first_line
    server.url = f"http://127.0.0.1:{server.port}"
    assert server.token == WEB_TOKEN
    with client(server, "") as anon, client(server, "wrong-token-0123456789") as wrong, \
            client(server) as good:
        page = anon.get("/")
        assert page.status_code == 200 and WEB_TOKEN not in page.text   # no data in it
        for c in (anon, wrong):
            assert c.get("/api/sessions").status_code == 401
            assert c.get(f"/api/sessions/{SID}/stream").status_code == 401
            assert c.post(f"/api/sessions/{SID}/signals",
                          json={"type": "info", "message": "x"}).status_code == 401
        assert [v["session_id"] for v in good.get("/api/sessions").json()] == [SID]
        other = good.post(f"/api/sessions/{SID}/signals", json={"type": "info", "message": "x"},
                          headers={"Origin": "http://evil.example"})
        assert other.status_code == 403
        assert good.post(f"/api/sessions/{SID}/signals",
                         json={"type": "info", "message": "hello"}).status_code == 200
    inputs = list(signal_files(session.dir, "inputs").values())
    assert len(inputs) == 1 and inputs[0]["message"] == "hello"


def test_on_loopback_a_change_needs_this_pages_origin_and_host(workspace, web):
    session = store_session(workspace)
    server = web()
    url = f"/api/sessions/{SID}/signals"
    with httpx.Client(base_url=server.url, headers={"X-Ralph-Token": server.token},
                      trust_env=False, timeout=30) as c:   # the token, and no Origin
        body = {"type": "pause", "message": "stop"}
        assert c.post(url, json=body).status_code == 403                       # no Origin
        assert c.post(url, json=body, headers={"Origin": "http://evil.example"}).status_code == 403
        assert c.post(url, json=body, headers={"Origin": "null"}).status_code == 403
        form = c.post(url, content="type=pause", headers={
            "Origin": server.url, "Content-Type": "application/x-www-form-urlencoded"})
        assert form.status_code == 403
        # a DNS-rebinding page reaches 127.0.0.1 under its own name: refused
        assert c.get("/api/sessions", headers={"Host": f"evil.example:{server.port}"}
                     ).status_code == 403
        assert signal_files(session.dir, "inputs") == {}
        ok = c.post(url, json=body, headers={"Origin": server.url})
        assert ok.status_code == 200, ok.text
        assert ok.headers["x-frame-options"] == "DENY"
        assert "default-src 'self'" in ok.headers["content-security-policy"]
    assert list(signal_files(session.dir, "inputs")) == [ok.json()["signal"]]


def test_ids_and_names_from_urls_never_leave_the_workspace(workspace, tmp_path, web):
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    from ralph.session_store import control_root, work_root
    session = store_session(workspace)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "metadata.yaml").write_text((Path(session.dir) / "metadata.yaml").read_text())
    (outside / "secret.txt").write_text("OUTSIDE-SECRET\n")
    (outside / "control.txt").write_text("control\n")
    logs = Path(session.iteration(1).logs)   # in the work area, which agents write
    (logs / "0001-planner.stdout").write_text("planner output\n")
    # an agent's links, planted where it may write: a run's log, a work area
    (logs / "0002-planner.stdout").symlink_to(outside / "secret.txt")
    (Path(work_root(str(workspace))) / "evil").symlink_to(outside)
    # ... and, in another session's work area, its iteration linked to a folder it chose,
    # where a logs/ is (as /var has /var/log)
    (outside / "logs").mkdir()
    (outside / "logs/0001-planner.stdout").write_text("OUTSIDE-SECRET\n")
    linked = Path(store_session(workspace, "w2").iteration(1).work_dir)
    shutil.rmtree(linked)
    linked.symlink_to(outside)
    # and a session in the control plane that is a link: the server stays robust there too
    (Path(control_root(str(workspace))) / "evil").symlink_to(outside)
    seen = []

    class Record(FileSystemEventHandler):
        def on_any_event(self, event):
            seen.append((event.event_type, event.src_path))
    observer = Observer()
    observer.schedule(Record(), str(outside), recursive=True)
    observer.start()
    control = outside / "control.txt"

    def read_control():   # inotify keeps order: once this open is seen, every earlier one is
        before = len(seen)
        control.read_text()
        wait_for(lambda: any(p == str(control) for _t, p in seen[before:]), timeout=10)
    try:
        read_control()
        seen.clear()
        server = web()
        s = f"/api/sessions/{SID}"
        gets = ["/api/sessions/..", "/api/sessions/%2e%2e", "/api/sessions/../../outside",
                "/api/sessions/..%2f..%2foutside", "/api/sessions/evil",
                "/api/sessions/evil/iterations", "/api/sessions/evil/stream",
                "/api/sessions/%00", "/api/sessions/" + "a" * 65, "/api/sessions/.telegram",
                "/api/sessions/-x", "/api/sessions/%2Ftmp", "/s/..%2f..%2foutside", "/s/%2e%2e",
                f"{s}/iterations/1/logs/..%2f..%2f..%2f..%2f..%2foutside%2fsecret.txt",
                f"{s}/iterations/1/logs/../../../metadata.yaml",
                f"{s}/iterations/1/logs/0002-planner.stdout", f"{s}/iterations/0/logs/x",
                f"{s}/iterations/99/logs/0001-planner.stdout", f"{s}/iterations/-1/logs/x",
                "/api/sessions/w2/iterations/1/logs/0001-planner.stdout",
                "/static/..%2f..%2fsecurity.py", "/static/../app.py", "/static/index.html"]
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        for path in gets:
            conn.request("GET", path, headers={"Host": server.host, "X-Ralph-Token": server.token})
            r = conn.getresponse()
            body = r.read().decode(errors="replace")
            assert r.status == 404, (path, r.status, body)
            assert "OUTSIDE-SECRET" not in body and "outside" not in body.replace(path, ""), path
        for path in (f"{s}/questions/..%2f..%2fx/answer", f"{s}/questions/../../x/answer",
                     "/api/sessions/evil/signals", "/api/sessions/..%2fevil/resume"):
            conn.request("POST", path, body=json.dumps({"text": "x", "type": "info"}),
                         headers={"Host": server.host, "Origin": server.url,
                                  "Content-Type": "application/json",
                                  "X-Ralph-Token": server.token})
            r = conn.getresponse()
            assert r.status == 404, (path, r.status, r.read())
            r.read()
        conn.close()
        with client(server) as c:
            # (in either order: newest first, and both may be of one second)
            assert sorted(v["session_id"] for v in c.get("/api/sessions").json()) == [SID, "w2"]
            assert [it["runs"] for it in c.get("/api/sessions/w2/iterations").json()] == [[]]
            log = c.get(f"{s}/iterations/1/logs/0001-planner.stdout").json()
            assert log["text"] == "planner output\n"
        read_control()
    finally:
        observer.stop()
        observer.join()
    touched = [(kind, path) for kind, path in seen if path != str(control)]
    assert touched == [], touched
    assert (outside / "secret.txt").read_text() == "OUTSIDE-SECRET\n"


def test_the_telegram_token_never_reaches_a_page_or_a_log(workspace, web):
    """An agent put both tokens (the config's and the environment's) into its log and onto
    the bus; the server shows neither, anywhere."""
    scenario = write_scenario(workspace, [
        {"role": "planner", "iteration": 1, "stdout": f"tokens {TG_TOKEN_ENV} {TG_TOKEN_CONFIG}",
         "emit": [{"topic": "plan.ready", "json": {"tasks": [{"id": "t1", "title": "one"}]}},
                  {"topic": "human.progress", "payload": f"leak {TG_TOKEN_ENV} {TG_TOKEN_CONFIG}"}]},
        {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE"}]},
        {"role": "executor", "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
        {"role": "reviewer", "emit": [{"topic": "review.done", "payload": "tests: pass, build: pass"}]}])
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)},
                             "RObot": {"telegram": {"bot_token": TG_TOKEN_CONFIG}}})
    done = ralph(workspace, "session", "start", "token test", "--id", SID, env=base_env(**FAST))
    assert done.returncode == 0, done.stderr
    log = next((work_dir(session_dir(workspace, SID)) / "iterations/1/logs").glob(
        "*planner.stdout"))
    assert TG_TOKEN_ENV in log.read_text()   # the agent did put it there
    server = web(env=base_env(RALPH_TELEGRAM_BOT_TOKEN=TG_TOKEN_ENV))
    s = f"/api/sessions/{SID}"
    bodies = []
    with client(server) as c:
        for path in ("/", f"/s/{SID}", "/static/app.js", "/static/session.js", "/static/util.js",
                     "/static/style.css", "/api/sessions", s, f"{s}/diagram", f"{s}/iterations",
                     "/api/sessions/nope", f"{s}/iterations/1/logs/nope"):
            bodies.append(c.get(path).text)
        for it in c.get(f"{s}/iterations").json():
            for run in it["runs"]:
                for name in run["files"]:
                    bodies.append(c.get(f"{s}/iterations/{it['iteration']}/logs/{name}").text)
        bodies.append(c.post(f"{s}/questions/q1/answer", json={"text": TG_TOKEN_ENV}).text)
        with c.stream("GET", f"{s}/stream") as stream:
            got = ""
            for chunk in stream.iter_text():
                got += chunk
                if "event: snapshot" in got:
                    break
            bodies.append(got)
    out, err = server.stop()
    everything = "\n".join(bodies + [out, err, server.first_line])
    for token in (TG_TOKEN_ENV, TG_TOKEN_CONFIG):
        assert token not in everything
        assert "*" * len(token) in everything    # masked where the agent put it
    assert "leak" in everything and "tokens" in everything


# --- what a page may change ---

def test_answers_from_the_page_follow_the_cli_rules(workspace, web):
    session = store_session(workspace)
    first = ask(session, "Which database?", ["sqlite", "postgres"])
    second = ask(session, "Ship it?")
    server = web()
    answer = f"/api/sessions/{SID}/questions/{{}}/answer"
    with client(server) as c:
        ok = c.post(answer.format(first), json={"text": "postgres"})
        assert ok.status_code == 200, ok.text
        assert "no engine runs the session" in ok.json()["outcome"]
        late = c.post(answer.format(first), json={"text": "sqlite"})
        assert late.status_code == 409
        assert late.json() == {"error": f"question {first} is already answered",
                               "answered_by": "web", "answer": "postgres"}
        assert ralph(workspace, "session", "answer", SID, "yes", "--question", second
                     ).returncode == 0
        by_cli = c.post(answer.format(second), json={"text": "no"}).json()
        assert by_cli["answered_by"] == "cli" and by_cli["answer"] == "yes"
        assert c.post(answer.format("q-unknown"), json={"text": "x"}).status_code == 404
        assert c.post(answer.format(first), json={"text": "  "}).status_code == 400
        assert c.post(answer.format(first), json={"text": "x" * 70000}).status_code == 400
        assert c.post(answer.format(first), content=b"{not json",
                      headers={"Content-Type": "application/json"}).status_code == 400
        assert c.post(answer.format(first), json=["a list"]).status_code == 400
    from ralph.session_store import questions
    assert questions.read_answer(session.dir, first).text == "postgres"
    assert questions.read_answer(session.dir, first).channel == "web"


def test_the_list_puts_who_waits_on_a_human_first_with_how_many_and_how_long(workspace, web):
    """Sessions with pending questions lead, the longest wait first; each says how many
    questions wait and since when the oldest has; an answered question no longer counts."""
    from ralph.session_store import questions
    store_session(workspace, "quiet")
    recent, long_ago = store_session(workspace, "recent"), store_session(workspace, "long-ago")
    ask(long_ago, "Which database?", minutes_ago=12)
    ask(long_ago, "Ship it?", minutes_ago=1)
    ask(recent, "Which region?", minutes_ago=3)
    server = web()
    with client(server) as c:
        listed = c.get("/api/sessions").json()
        assert [v["session_id"] for v in listed] == ["long-ago", "recent", "quiet"]
        assert [v["questions_pending"] for v in listed] == [2, 1, 0]
        assert 12 * 60 <= listed[0]["oldest_question_age_seconds"] < 13 * 60
        assert 3 * 60 <= listed[1]["oldest_question_age_seconds"] < 4 * 60
        oldest = datetime.fromisoformat(listed[0]["oldest_question_asked_at"])
        assert timedelta(minutes=12) <= now() - oldest < timedelta(minutes=13)
        assert listed[2]["oldest_question_asked_at"] is None
        assert listed[2]["oldest_question_age_seconds"] is None
        [region] = questions.pending(recent.dir)
        assert ralph(workspace, "session", "answer", "recent", "eu", "--question",
                     region.id).returncode == 0
        listed = {v["session_id"]: v for v in c.get("/api/sessions").json()}
        assert listed["recent"]["questions_pending"] == 0
        assert listed["recent"]["oldest_question_asked_at"] is None
    # `ralph session list` orders and says the same
    first = ralph(workspace, "session", "list").stdout.splitlines()[1]   # under the header
    assert first.startswith("long-ago") and "2 questions waiting, the oldest for 12m" in first


def _post_chunked(server, path: str, total: int) -> tuple[int, bytes]:
    """POST `total` bytes with no length (chunked), as fast as the server takes them, until
    it answers or closes; (bytes sent, its reply)."""
    piece = b" " * (64 << 10)
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    sent, reply = 0, b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {server.host}\r\nOrigin: {server.url}\r\n"
                     f"X-Ralph-Token: {server.token}\r\nContent-Type: application/json\r\n"
                     f"Transfer-Encoding: chunked\r\n\r\n".encode())
        try:
            while sent < total and not select.select([sock], [], [], 0)[0]:
                sock.sendall(chunk)
                sent += len(piece)
            if sent >= total:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass   # closed on the rest of the body
        try:
            while data := sock.recv(1 << 16):
                reply += data
        except ConnectionResetError:   # what had arrived is read first
            pass
    return sent, reply


def test_a_body_past_the_limit_is_refused_as_it_streams(workspace, web):
    """A chunked POST of 300 MB has no length to be refused by: it is cut off where it
    passes 1 MiB (413, the connection closed on the rest), and the server's peak memory
    does not grow by the body."""
    session = store_session(workspace)
    server = web()
    path, total = f"/api/sessions/{SID}/signals", 300 << 20
    before = peak_rss(server.proc.pid)
    sent, reply = _post_chunked(server, path, total)
    grew = peak_rss(server.proc.pid) - before
    assert sent < total // 2, sent                 # the rest was never taken
    assert grew < 32 << 20, f"the server's peak RSS grew by {grew >> 20} MiB"
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:300]
    assert b"a request body has at most 1048576 bytes" in reply
    assert b"connection: close" in reply.lower()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.putrequest("POST", path, skip_host=True)   # a length past the limit, and no body:
    for name, value in (("Host", server.host), ("Origin", server.url),   # refused at once
                        ("X-Ralph-Token", server.token), ("Content-Type", "application/json"),
                        ("Content-Length", str(total))):
        conn.putheader(name, value)
    conn.endheaders()
    assert conn.getresponse().status == 413
    conn.close()
    with client(server) as c:
        assert c.post(path, json={"type": "info", "message": "x" * 60000}).status_code == 200
    assert len(signal_files(session.dir, "inputs")) == 1


def test_signals_from_the_page_are_checked_like_the_cli(workspace, web):
    from ralph import session_store
    session = store_session(workspace)
    finished = store_session(workspace, "done1")
    finished.metadata.status = session_store.Status.COMPLETED
    finished.save(now())
    server = web()
    with client(server) as c:
        url = f"/api/sessions/{SID}/signals"
        assert c.post(url, json={"type": "explode"}).status_code == 400
        assert c.post(url, json={"type": "steer", "target": "Nobody"}).status_code == 400
        assert c.post(url, json={"type": "info", "message": 5}).status_code == 400
        steer = c.post(url, json={"type": "steer", "message": "use sqlite", "target": "Executor",
                                  "priority": True})
        assert steer.status_code == 200, steer.text
        approve = c.post(url, json={"type": "approve"})
        assert approve.status_code == 200
        gone = c.post("/api/sessions/done1/signals", json={"type": "pause"})
        assert gone.status_code == 409 and "completed" in gone.json()["error"]
        assert c.post("/api/sessions/done1/resume", json={}).status_code == 409
        for bad in ({"max_iterations": "abc"}, {"max_iterations": -1}, {"max_iterations": 1.5},
                    {"max_runtime": "nan"}, {"max_cost": 0}, {"max_iterations": True}):
            r = c.post(f"/api/sessions/{SID}/resume", json=bad)
            assert r.status_code == 400, (bad, r.text)
    inputs = Path(session.dir) / "signals/inputs"
    approve, steer = sorted((yaml.safe_load(p.read_text()) for p in inputs.iterdir()),
                            key=lambda doc: doc["type"])
    assert steer["type"] == "STEER" and steer["target"] == "Executor" and steer["priority"]
    assert approve["type"] == "APPROVE" and approve["iteration"] == 1


def test_resume_from_the_page_starts_an_engine_of_its_own(workspace, web):
    from ralph.session_store import sessions_root
    scenario = write_scenario(workspace, TWO_ITERATIONS)
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)}})
    first = ralph(workspace, "session", "start", "two iterations", "--id", SID,
                  "--max-iterations", "1", env=base_env(**FAST))
    assert first.returncode == 5, first.stderr      # paused by the limit
    server = web(env=base_env(**FAST))
    with client(server) as c:
        r = c.post(f"/api/sessions/{SID}/resume",
                   json={"message": "go on, and mind the cache", "max_iterations": 3})
        assert r.status_code == 200, r.text
        log = Path(r.json()["log"])   # the channel's log, in the control root: not the agents'
        assert log.parent == Path(sessions_root(str(workspace))) / ".web"
        sd = session_dir(workspace, SID)
        wait_for(lambda: metadata(sd)["status"] == "completed", timeout=60)
        assert metadata(sd)["limits"]["max_iterations"] == 3
        assert "go on, and mind the cache" in (work_dir(sd) / "scratchpad.md").read_text()
        again = c.post(f"/api/sessions/{SID}/resume", json={})
        assert again.status_code == 409
    assert f"ralph web: resume {SID}" in log.read_text()
    assert oct(log.stat().st_mode & 0o777) == "0o600"


def test_web_is_off_the_path_of_every_other_command():
    code = ("import sys, engine.cli.parser, engine.cli.workspace; "
            "print([m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn') "
            "or m.startswith('ralph.engine.channels')])")
    out = subprocess.run([sys.executable, "-c", code], env=base_env(), capture_output=True,
                         text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0 and out.stdout.strip() == "[]", out
