"""Issue 21: `ralph web` needs a token, always. Without $RALPH_WEB_TOKEN it makes one and
prints the URL that carries it; every /api route (the reads, both live streams, the
three changes) refuses a request without it; the page holds no data; and another user of
this machine, run through setpriv, gets nothing: no token from the server's process, no
session data, no action. Against real `ralph web` subprocesses."""
from __future__ import annotations

import json
import re
from pathlib import Path

from _web import api_routes, ask, client, store_session
from support import base_env, events, metadata, signal_files
from support.users import other_user_command, run_as_other_user

SID = "hidden-session-7f3a"
OBJECTIVE = "web objective"      # store_session's
QUESTION = "Deploy to production now?"
USERS_TOKEN = "users-own-token-0123456789"
PAGES = ("/", f"/s/{SID}", "/static/app.js", "/static/session.js", "/static/util.js",
         "/static/style.css")


def _nothing_changed(session, qid: str, bus: list[dict]) -> None:
    from ralph.session_store import questions
    assert signal_files(session.dir, "inputs") == {}
    assert questions.read_answer(session.dir, qid) is None
    assert metadata(session.dir)["status"] == "active"
    assert events(session.dir) == bus


def test_without_a_token_set_one_is_made_printed_and_required(workspace, web):
    session = store_session(workspace, SID)
    qid = ask(session, QUESTION)
    bus = events(session.dir)
    server, again = web(), web()
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", server.token), server.first_line
    assert server.token != again.token                       # made anew at each start
    assert server.first_line.strip().endswith(f" on {server.page()}")
    routes = api_routes(SID, qid)
    with client(server, "") as anon, client(server, "x" * 43) as wrong, \
            client(server, again.token) as other_servers, client(server) as good:
        for method, path, body in routes:
            for c in (anon, wrong, other_servers):
                r = c.request(method, path, json=body)
                assert r.status_code == 401, (method, path, r.status_code, r.text)
                assert r.headers["www-authenticate"] == "x-ralph-token"
                assert SID not in r.text and QUESTION not in r.text
        for path in PAGES:   # the page and its scripts need no token: they hold no data
            page = anon.get(path)
            assert page.status_code == 200, path
            assert SID not in page.text.replace(path, "") and OBJECTIVE not in page.text
        _nothing_changed(session, qid, bus)
        for method, path, _body in routes:
            if method != "GET":
                continue
            with good.stream("GET", path) as r:   # the streams too: opened, then left
                assert r.status_code == (404 if "/logs/" in path else 200), (path, r.status_code)
        assert [v["session_id"] for v in good.get("/api/sessions").json()] == [SID]
    # the token is in neither the server's argv nor its environment
    for name in ("cmdline", "environ"):
        assert server.token.encode() not in Path(f"/proc/{server.proc.pid}/{name}").read_bytes()


# Run by the other user: what it can learn of the server's process, then every route.
OTHER_USER = r"""
import http.client, json, os, sys
port, pid, routes = json.loads(sys.argv[1])
found = {"proc": {}, "http": []}
for name in ("cmdline", "environ", "fd/1", "fd/2"):
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            found["proc"][name] = f.read(1 << 20).decode("latin-1")
    except OSError as e:
        found["proc"][name] = f"refused: {e.strerror}"
for method, path, body in routes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"Origin": f"http://127.0.0.1:{port}",
                          "Content-Type": "application/json"})
    r = conn.getresponse()
    try:
        text = r.read1(1 << 16).decode(errors="replace")   # a stream never ends: what came
    except TimeoutError:
        text = ""
    found["http"].append([method, path, r.status, text])
    conn.close()
print(json.dumps(found))
"""


def test_another_local_user_gets_nothing_from_the_server(workspace, web):
    """`nobody` against two servers: one with the token it made, one with the user's own
    in $RALPH_WEB_TOKEN (which the server's environment holds, readable by its user only)."""
    switch = other_user_command()
    session = store_session(workspace, SID)
    qid = ask(session, QUESTION)
    bus = events(session.dir)
    routes = api_routes(SID, qid) + [("GET", p, None) for p in PAGES]
    for server in (web(), web(env=base_env(RALPH_WEB_TOKEN=USERS_TOKEN))):
        done = run_as_other_user([*switch, "-c", OTHER_USER,
                                  json.dumps([server.port, server.proc.pid, routes])])
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        for method, path, status, text in found["http"]:
            assert status == (200 if path in PAGES else 401), (method, path, status, text)
            assert OBJECTIVE not in text and QUESTION not in text
            assert SID not in text.replace(path, ""), (path, text)
        _nothing_changed(session, qid, bus)
        assert server.token not in json.dumps(found)
        assert found["proc"]["environ"].startswith("refused")
        assert found["proc"]["fd/1"].startswith("refused")
