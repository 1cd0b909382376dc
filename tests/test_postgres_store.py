"""What only the PostgreSQL store has: its schema, versioned and migrated on open (by one
process at a time, however many start at once; a newer schema than this ralph knows is
refused), a URL that is wrong or refused said in one line, at once, without its password;
and bad data in its rows refused like a bad file (one line, nothing changed)."""
from __future__ import annotations

import multiprocessing
from datetime import datetime, timezone

import psycopg

from support import base_env, ralph

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=timezone.utc)


def _open_store(url: str, barrier, results) -> None:
    from ralph.session_store.postgres import database
    barrier.wait()
    try:
        database(url)
        results.put("ok")
    except Exception as e:  # noqa: BLE001 - reported by the test
        results.put(f"{type(e).__name__}: {e}")


def test_many_processes_opening_a_new_database_migrate_it_once(postgres_url):
    ctx = multiprocessing.get_context("spawn")
    n = 6
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_open_store, args=(postgres_url, barrier, results))
             for _ in range(n)]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert got == ["ok"] * n
    with psycopg.connect(postgres_url) as conn:
        versions = conn.execute("SELECT version FROM ralph_schema").fetchall()
        tables = {r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema()").fetchall()}
    assert sorted(versions) == [(1,), (2,)]
    assert {"ralph_sessions", "ralph_events", "ralph_questions", "ralph_answers",
            "ralph_signals", "ralph_leases", "ralph_channels", "ralph_commits", "ralph_quota"} <= tables


def test_a_schema_newer_than_this_ralph_is_refused(postgres_url, tmp_path):
    from ralph.session_store.postgres import database
    database(postgres_url)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("INSERT INTO ralph_schema (version) VALUES (99)")
    ws = tmp_path / "ws"
    ws.mkdir()
    r = ralph(ws, "session", "list", env=base_env(RALPH_STORE_URL=postgres_url))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "schema is version 99, newer than this ralph knows (2): upgrade ralph" in r.stderr


def test_a_wrong_url_or_a_refused_password_is_one_line_at_once_without_the_password(
        postgres_url, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    info = psycopg.conninfo.conninfo_to_dict(postgres_url)
    refused = f"postgresql://nobody:hunter2secret@{info['host']}:{info['port']}/ralph"
    for url, why in ((refused, 'role "nobody" does not exist'),
                     ("postgresql://ralph:hunter2secret@127.0.0.1:1/ralph", "refused"),
                     ("mysql://ralph@127.0.0.1/ralph", "expected a postgresql:// URL")):
        r = ralph(ws, "session", "list", env=base_env(RALPH_STORE_URL=url), timeout=30)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and why in r.stderr, r.stderr
        assert "hunter2secret" not in r.stderr + r.stdout and "Traceback" not in r.stderr


def test_a_bad_metadata_row_is_refused_in_one_line_and_left_as_it_is(postgres_url, tmp_path,
                                                                      monkeypatch):
    from ralph import session_store
    monkeypatch.setenv("RALPH_STORE_URL", postgres_url)
    ws = tmp_path / "ws"
    ws.mkdir()
    session_store.create(str(ws), "objective", now=NOW, session_id="s1")
    bad = '{"session_id": "s1", "objective": 3}'
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE ralph_sessions SET metadata = %s WHERE id = 's1'", (bad,))
    r = ralph(ws, "session", "status", "s1", env=base_env(RALPH_STORE_URL=postgres_url))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "session s1 metadata: $." in r.stderr and "Traceback" not in r.stderr
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT metadata FROM ralph_sessions").fetchone()[0] == bad


def test_the_store_url_in_a_config_file_is_refused(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "ralph.yml").write_text("store:\n  url: postgresql://ralph@db/ralph\n")
    r = ralph(ws, "validate", "-c", ws / "ralph.yml")
    assert r.returncode == 2 and "$.store" in r.stderr and "RALPH_STORE_URL" in r.stderr

