"""A fleet on one PostgreSQL store ($RALPH_STORE_URL): engines of two machines (their own
state directories, workspaces and names), seen, answered, signalled and resumed from a
third directory with no sessions of its own; the engine's faults against the database
(kill -9 of the engine, of its database backend, the database restarting mid-run)."""
from __future__ import annotations

import json
import os
import signal
import sys

import psycopg
import pytest

from support import (DONE, EVIDENCE, base_env, finish, plan, ralph, spawn, wait_for,
                     write_config, write_scenario)
from support import start as start_demo

ASKS = [plan("t1"),
        {"role": "executor", "attempt": 1, "emit": [
            {"topic": "human.interact", "json": {"text": "Which database?",
                                                 "options": ["postgres", "sqlite"]}}]},
        *DONE]
SLEEPS = [plan("t1", "t2"),
          {"role": "executor", "task": "t1", "attempt": 1, "sleep": 60,
           "emit": [{"topic": "build.done", "payload": EVIDENCE}]}, *DONE]


class Machine:
    """One machine of the fleet: its name, state directory and workspace (a directory of
    the test's), all on the test's database."""

    def __init__(self, tmp_path, url: str, name: str, **env):
        self.name = name
        self.ws = tmp_path / name / "ws"
        self.ws.mkdir(parents=True)
        self.env = base_env(RALPH_STORE_URL=url, RALPH_STATE_DIR=tmp_path / name / "state",
                            RALPH_MACHINE=name, **env)

    def ralph(self, *args, timeout: float = 120):
        return ralph(self.ws, *args, env=self.env, timeout=timeout)

    def start(self, steps, sid: str, config: dict | None = None):
        return start_demo(self.ws, steps, sid=sid, config=config, env=self.env)

    def view(self, sid: str) -> dict:
        r = self.ralph("session", "status", sid, "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def view_when_there(self, sid: str) -> dict:
        """Its view, or {} while the session is not made yet."""
        r = self.ralph("session", "status", sid, "--json")
        assert r.returncode == 0 or "unknown session" in r.stderr, r.stderr
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def topics(self, sid: str) -> list[str]:
        r = self.ralph("session", "tail", sid, "-n", "500", "--json")
        assert r.returncode == 0, r.stderr
        return [json.loads(line)["topic"] for line in r.stdout.splitlines() if line.strip()]


@pytest.fixture
def fleet(tmp_path, postgres_url):
    return lambda name, **env: Machine(tmp_path, postgres_url, name, **env)


def test_two_machines_listed_answered_signalled_and_resumed_from_a_third(fleet):
    alpha, beta, desk = fleet("alpha"), fleet("beta", RALPH_DEMO_SLEEP_SCALE=1), fleet("desk")
    asking = alpha.start(ASKS, "a", {"RObot": {"timeout_seconds": 120}})
    sleeping = beta.start(SLEEPS, "b")
    try:
        wait_for(lambda: desk.view_when_there("a").get("pending_questions"), timeout=60)
        wait_for(lambda: desk.view_when_there("b").get("state") == "EXECUTING_BATCH",
                 timeout=60)
        listed = json.loads(desk.ralph("session", "list", "--json").stdout)
        where = {v["session_id"]: (v["machine"], v["workspace"]) for v in listed}
        assert where == {"a": ("alpha", str(alpha.ws)), "b": ("beta", str(beta.ws))}
        text = desk.ralph("session", "list").stdout
        assert f"alpha:{alpha.ws}" in text and f"beta:{beta.ws}" in text

        r = desk.ralph("session", "answer", "a", "postgres")
        assert r.returncode == 0, r.stderr
        code, out, err = finish(asking)
        assert code == 0, out + err
        assert desk.view("a")["status"] == "completed"
        assert alpha.topics("a").count("human.response") == 1

        r = desk.ralph("signal", "pause", "hold on", "--session", "b")
        assert r.returncode == 0, r.stderr
        code, out, err = finish(sleeping)
        assert code == 3, out + err
        view = desk.view("b")
        assert view["status"] == "paused" and view["pause_reason"] == "hold on"
    finally:
        for proc in (asking, sleeping):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # a resume runs where the session's workspace is
    r = desk.ralph("session", "resume", "b")
    assert r.returncode == 2 and "runs on beta" in r.stderr and "resume it there" in r.stderr
    beta.env["RALPH_DEMO_SLEEP_SCALE"] = "0"
    r = beta.ralph("session", "resume", "b")
    assert r.returncode == 0, r.stdout + r.stderr
    assert desk.view("b")["status"] == "completed"


ENV_DUMP = """
import os, sys
print("ENV " + repr(sorted(os.environ.items())), flush=True)
os.execv(sys.executable, [sys.executable, "-m", "ralph.engine.demo_agent", "--script", sys.argv[1]])
"""


def test_the_stores_credentials_reach_no_agent_and_no_file(fleet, tmp_path):
    """The URL and the password beside it are ralph's secrets: no agent's environment has
    them, and no file of the session's (its work area, its local control plane) names them."""
    machine = fleet("alpha", PGPASSWORD="not-for-agents")
    scenario = write_scenario(machine.ws, [plan("t1"), *DONE])
    (machine.ws / "agent.py").write_text(ENV_DUMP)
    write_config(machine.ws, {"agent": {"backend": "command", "command": [
        sys.executable, str(machine.ws / "agent.py"), str(scenario)]}})
    r = machine.ralph("session", "start", "objective", "--id", "s")
    assert r.returncode == 0, r.stdout + r.stderr
    url = machine.env["RALPH_STORE_URL"]
    dumps = 0
    for root in (machine.ws, tmp_path / "alpha" / "state"):
        for path in root.rglob("*"):
            if path.is_file():
                text = path.read_text(errors="replace")
                dumps += "ENV [" in text
                assert url not in text and "not-for-agents" not in text, path
                assert "RALPH_STORE_URL" not in text and "PGPASSWORD" not in text, path
    assert dumps >= 3   # every run printed its environment into its log


# --- faults: the engine, its database backend, the database itself ---

def _wait_running(desk, sid: str) -> dict:
    return wait_for(lambda: (v := desk.view_when_there(sid)).get("running")
                    and v.get("state") == "EXECUTING_BATCH" and v, timeout=60)


def _transitions_whole(machine, sid: str) -> list[dict]:
    """The bus read from the store: seqs 1..n, each transition's record once."""
    r = machine.ralph("session", "tail", sid, "-n", "1000", "--json")
    records = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    assert [e["seq"] for e in records] == list(range(1, len(records) + 1))
    moves = [e for e in records if e["topic"] == "session.transition"]
    keys = [e.get("once") for e in moves]
    assert len(keys) == len(set(keys)), keys
    return moves


def test_kill_9_of_an_engine_ends_its_lease_and_resume_goes_on(fleet):
    beta, desk = fleet("beta", RALPH_DEMO_SLEEP_SCALE=1), fleet("desk")
    proc = beta.start(SLEEPS, "b")
    try:
        view = _wait_running(desk, "b")
        assert view["engine_pid"] == proc.pid
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # the lease was the engine's connection: the database ended it with the process
        view = wait_for(lambda: (v := desk.view("b"))["running"] is False and v, timeout=10)
        assert view["status"] == "active" and view["state"] == "EXECUTING_BATCH"
        assert "interrupted" in desk.ralph("session", "status", "b").stdout
    finally:
        if proc.poll() is None:
            proc.kill()
    before = len(_transitions_whole(beta, "b"))
    beta.env["RALPH_DEMO_SLEEP_SCALE"] = "0"
    r = beta.ralph("session", "resume", "b")
    assert r.returncode == 0, r.stdout + r.stderr
    assert desk.view("b")["status"] == "completed"
    assert len(_transitions_whole(beta, "b")) > before


def _terminate_backends(url: str) -> int:
    """pg_terminate_backend for every other connection to the test's database (what a
    killed backend or a restarting pooler does to the engine's connections)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'").fetchone()[0]


SHORT_SLEEP = [plan("t1", "t2"),
               {"role": "executor", "task": "t1", "attempt": 1, "sleep": 3,
                "emit": [{"topic": "build.done", "payload": EVIDENCE}]}, *DONE]


def test_the_engines_database_backends_killed_mid_run(fleet):
    beta, desk = fleet("beta", RALPH_DEMO_SLEEP_SCALE=1), fleet("desk")
    proc = beta.start(SHORT_SLEEP, "b")
    try:
        _wait_running(desk, "b")
        assert _terminate_backends(beta.env["RALPH_STORE_URL"]) >= 2   # its store, its lease
        code, out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, out + err
    assert desk.view("b")["status"] == "completed"
    assert "Traceback" not in err
    _transitions_whole(beta, "b")


@pytest.fixture
def own_cluster():
    """A cluster of the test's own (the test restarts it)."""
    import shutil
    import tempfile

    import postgres_cluster
    if postgres_cluster.bindir() is None:
        pytest.skip("PostgreSQL's server is not installed")
    root = tempfile.mkdtemp(prefix="ralph-test-postgres-")
    try:
        yield postgres_cluster.start(root), root
    finally:
        postgres_cluster.stop(root, "immediate")
        shutil.rmtree(root, ignore_errors=True)


def test_the_database_restarting_mid_run(tmp_path, own_cluster):
    import postgres_cluster
    url, root = own_cluster
    beta = Machine(tmp_path, url, "beta", RALPH_DEMO_SLEEP_SCALE=1)
    proc = beta.start(SHORT_SLEEP, "b")
    try:
        _wait_running(beta, "b")
        postgres_cluster.restart(root)
        code, out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, out + err
    assert "Traceback" not in err
    assert beta.view("b")["status"] == "completed"
    _transitions_whole(beta, "b")


def test_a_database_gone_too_long_stops_the_engine_resumably(tmp_path, own_cluster):
    import postgres_cluster
    url, root = own_cluster
    beta = Machine(tmp_path, url, "beta", RALPH_DEMO_SLEEP_SCALE=1,
                   RALPH_STORE_RECONNECT_SECONDS=2)
    proc = beta.start(SHORT_SLEEP, "b")
    try:
        _wait_running(beta, "b")
        postgres_cluster.stop(root)
        code, out, err = finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 3, out + err
    said = [line for line in (out + err).splitlines() if "cannot reach the store" in line]
    assert len(said) == 1 and "ralph session resume b" in said[0], out + err
    assert "Traceback" not in err
    postgres_cluster.start(root, port=int(url.rsplit(":", 1)[1].split("/")[0]))
    beta.env["RALPH_DEMO_SLEEP_SCALE"] = "0"
    r = beta.ralph("session", "resume", "b")
    assert r.returncode == 0, r.stdout + r.stderr
    assert beta.view("b")["status"] == "completed"
    _transitions_whole(beta, "b")


# --- one web page for the fleet ---

def test_one_web_page_sees_and_steers_every_machines_sessions(fleet, monkeypatch):
    """`ralph web` in a directory with no sessions of its own lists the fleet's, follows
    them live (NOTIFY wakes its feed: no file of theirs is on this machine) and drops a
    signal into another machine's session."""
    from _web import WebServer, client, now
    from test_web_feed import Stream
    from ralph import session_store
    alpha, beta, desk = fleet("alpha"), fleet("beta"), fleet("desk")

    def made_on(machine, sid):
        for name in ("RALPH_STORE_URL", "RALPH_STATE_DIR", "RALPH_MACHINE"):
            monkeypatch.setenv(name, str(machine.env[name]))
        return session_store.create(str(machine.ws), f"objective {sid}", now=now(),
                                    session_id=sid)
    a = made_on(alpha, "a")
    server = WebServer(desk.ws, env=desk.env)
    try:
        with client(server) as c:
            [listed] = c.get("/api/sessions").json()
            assert (listed["session_id"], listed["machine"]) == ("a", "alpha")
        everything = Stream(server, "/api/stream")
        one = Stream(server, "/api/sessions/a/stream")
        everything.wait(lambda e, d: e == "sessions" and [v["session_id"] for v in d] == ["a"])
        one.wait(lambda e, d: e == "events" and d and d[0]["topic"] == "session.created")
        made_on(beta, "b")   # on another machine: heard, not found by a re-read
        everything.wait(lambda e, d: e == "sessions" and {v["session_id"] for v in d}
                        == {"a", "b"}, timeout=5)
        a.append_event("build.note", "from alpha's engine", source="executor")
        one.wait(lambda e, d: e == "events" and [x["payload"] for x in d]
                 == ["from alpha's engine"], timeout=5)
        with client(server) as c:
            r = c.post("/api/sessions/b/signals", json={"type": "info", "message": "hello b"})
            assert r.status_code == 200, r.text
        signal_, _, _ = session_store.load(str(beta.ws), "b").signals.read(
            session_store.load(str(beta.ws), "b").signals.waiting()[0])
        assert signal_.message == "hello b"
    finally:
        server.stop()


POLLING_AGENT = """
import os, subprocess, sys, time
ws = os.environ["RALPH_WORKSPACE"]
polled = os.path.join(ws, "polled.json")
if os.environ["RALPH_ROLE"] == "executor" and os.environ.get("RALPH_TASK_ID") == "t1" \\
        and not os.path.exists(polled):
    open(os.path.join(ws, "ready"), "w").close()
    while not os.path.exists(os.path.join(ws, "dropped")):
        time.sleep(0.05)   # poll: until the test dropped the signals
    out = subprocess.run([sys.executable, "-m", "ralph.engine", "tools", "signals", "poll",
                          "--json"], capture_output=True, text=True, check=True).stdout
    with open(polled, "w") as f:
        f.write(out)
os.execv(sys.executable, [sys.executable, "-m", "ralph.engine.demo_agent", "--script", sys.argv[1]])
"""


def test_an_agents_poll_takes_its_signal_from_the_database(fleet):
    """The mailbox is rows, which no agent reaches: an agent's `tools signals poll` asks
    its engine (no control directory to list), and takes the signal meant for it."""
    alpha, desk = fleet("alpha"), fleet("desk")
    scenario = write_scenario(alpha.ws, [plan("t1"), *DONE])
    (alpha.ws / "agent.py").write_text(POLLING_AGENT)
    write_config(alpha.ws, {"agent": {"backend": "command", "command": [
        sys.executable, str(alpha.ws / "agent.py"), str(scenario)]}})
    proc = spawn(alpha.ws, "session", "start", "objective", "--id", "s", env=alpha.env)
    try:
        wait_for(lambda: (alpha.ws / "ready").exists(), timeout=60)
        r = desk.ralph("signal", "steer", "mid-run steer", "--target", "Executor",
                       "--session", "s")
        assert r.returncode == 0, r.stderr
        (alpha.ws / "dropped").touch()
        code, out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, out + err
    polled = json.loads((alpha.ws / "polled.json").read_text())
    assert [s["message"] for s in polled["signals"]] == ["mid-run steer"]
    with psycopg.connect(alpha.env["RALPH_STORE_URL"]) as conn:
        [(state, outcome)] = conn.execute(
            "SELECT state, outcome FROM ralph_signals WHERE session_id = 's'").fetchall()
    assert state == "handled" and json.loads(outcome)["handled_by"] == "Ralph-Executor"


# --- one Telegram bot for the fleet ---

def test_one_bot_serves_every_machines_sessions(fleet, tmp_path):
    """`ralph bot run` on a third machine: each machine's question reaches the chat, each
    reply answers the session it asked for (the bot's lock and state are the fleet's)."""
    from fake_telegram import FakeTelegram
    token, chat = "123456:FLEET-TOKEN", 111
    no_proxy = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    alpha, beta = fleet("alpha", **no_proxy), fleet("beta", **no_proxy)
    desk = fleet("desk", **no_proxy)
    waits = [plan("t1"),
             {"role": "executor", "ask": {"question": "Go on with {task}?", "timeout": 60},
              "emit": [{"topic": "build.done", "payload": EVIDENCE}]}, *DONE]
    with FakeTelegram(token) as fake:
        bot_config = write_config(tmp_path, {"RObot": {"telegram": {
            "bot_token": token, "api_url": fake.url, "allowed_chat_ids": [chat]}}}, "bot.yml")
        bot = spawn(desk.ws, "bot", "run", "-c", bot_config, env=desk.env)
        engines = []
        try:
            fake.wait_polling()
            again = desk.ralph("bot", "run", "-c", bot_config)   # one bot for the fleet
            assert again.returncode == 2 and "runs already" in again.stderr, again.stderr
            engines = [machine.start(waits, sid) for machine, sid in ((alpha, "a"), (beta, "b"))]
            for sid in ("a", "b"):
                question = fake.wait_message(
                    lambda m, sid=sid: f"from session {sid}\n" in m.get("text", ""), 60)
                reply = fake.push(chat, f"yes, {sid}", reply_to=question)
                assert "Answer recorded" in fake.wait_reply(reply)["text"]
            for proc in engines:
                code, out, err = finish(proc)
                assert code == 0, out + err
        finally:
            for proc in [bot, *engines]:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(10)
    for machine, sid in ((alpha, "a"), (beta, "b")):
        session = machine.view(sid)
        assert session["status"] == "completed"
        r = machine.ralph("session", "tail", sid, "-n", "500", "--json")
        responses = [json.loads(x) for x in r.stdout.splitlines()
                     if json.loads(x)["topic"] == "human.response"]
        assert [(e["payload"]["answer"], e["payload"]["channel"]) for e in responses] == \
            [(f"yes, {sid}", "telegram")]
def test_a_lease_is_seen_only_in_its_own_database(postgres_cluster, tmp_path):
    """Two fleets in two databases of one cluster, a session of the same id in each:
    advisory locks are listed cluster-wide, so one fleet's engine must name no engine
    of the other's (its session is not running there, and is taken there at once)."""
    from datetime import datetime, timezone
    from _planes import database_url
    from ralph.session_store.postgres import PostgresSessions, _db
    url, _root = postgres_cluster
    names = [f"ralph_fleet_{os.urandom(3).hex()}_{i}" for i in (1, 2)]
    fleets: list[PostgresSessions] = []
    with psycopg.connect(url, autocommit=True) as conn:
        for name in names:
            conn.execute(f"CREATE DATABASE {name}")
    try:
        fleets = [PostgresSessions(database_url(url, name), str(tmp_path)) for name in names]
        ours, theirs = [f.create("objective", now=datetime.now(timezone.utc), session_id="s")
                        for f in fleets]
        lease = ours.acquire_lease()
        try:
            assert ours.running_pid() == os.getpid()
            assert theirs.running_pid() is None
            theirs.acquire_lease(wait_seconds=0).release()
        finally:
            lease.release()
    finally:
        for fleet in fleets:
            _db._databases.pop(fleet.url, None)
            fleet.db.close()
        with psycopg.connect(url, autocommit=True) as conn:
            for name in names:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
