"""Quota-aware pacing (issue 34, DESIGN §10 round 4): past a usage window's threshold no new
run starts; the session waits for the window's reset, durably, spending nothing; sessions
on one account share what any of them saw.

The demo agent prints Claude Code's own `rate_limit_event` line (a script's `stdout`), and
the engine reads it through the demo's preset as it reads Claude Code's (with the real
CLI: test_real_quota.py). The readers and the pacing rule are tested as parts first.
"""
from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime, timedelta, timezone

import pytest

from support import (DONE, EVIDENCE, REVIEW_OK, base_env, events, finish, metadata, plan, ralph,
                     run_logs, session_dir, spawn, start, topics, wait_for, write_config)

from ralph.engine.agents.preset import RunEnd
from ralph.engine.agents.presets import Claude, Codex
from ralph.engine.agents.quota_readers import claude_quota
from ralph.engine.config_types import Quota
from ralph.engine.policy.quota import blocking, share
from ralph.session_store import QuotaReading
from test_store_contract import store  # noqa: F401  (the fixture: both backends)

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)


def rate_limit_event(percent: float | None, reset: float, window: str = "five_hour",
                     status: str = "allowed_warning", **more) -> str:
    """Claude Code's stream-json line for a window (as measured against the scripted
    server: utilisation is said at a warning or a rejection)."""
    info = {"status": status, "resetsAt": reset, "rateLimitType": window, **more}
    if percent is not None:
        info["utilization"] = percent / 100
    return json.dumps({"type": "rate_limit_event", "rate_limit_info": info,
                       "uuid": "u", "session_id": "s"})


def read(*lines: str):
    return claude_quota(RunEnd("\n".join(lines), "", 0, NOW))


# --- the reader: untrusted output, clamped ---

def test_claude_rate_limit_event_is_read_per_window_latest_wins():
    reset = NOW.timestamp() + 3600
    seen = read(rate_limit_event(91, reset), '{"type": "assistant"}',
                rate_limit_event(95, reset, surpassedThreshold=0.9),
                rate_limit_event(None, reset + 86400, "seven_day", "rejected"))
    assert [(s.window, s.percent) for s in seen] == [("five_hour", 95.0), ("seven_day", 100.0)]
    assert seen[0].resets_at == datetime.fromtimestamp(reset, timezone.utc)
    # the same reading from the Claude preset itself
    assert Claude().quota(RunEnd(rate_limit_event(95, reset), "", 0, NOW)) == seen[:1]


def test_what_an_agent_prints_is_clamped_or_dropped():
    reset = NOW.timestamp() + 3600
    seen = read(rate_limit_event(700, reset, "five_hour"),
                rate_limit_event(-40, 10**12, "seven_day"),       # a reset in 33000 years
                rate_limit_event(50, reset, "../../etc/passwd"),  # no window's name
                rate_limit_event(None, reset, "seven_day_opus"),  # allowed, use not said
                json.dumps({"type": "rate_limit_event", "rate_limit_info": {
                    "rateLimitType": "seven_day_sonnet", "utilization": float("nan")}}),
                json.dumps({"type": "rate_limit_event", "rate_limit_info": {
                    "rateLimitType": "overage", "utilization": True}}),
                json.dumps({"type": "rate_limit_event", "rate_limit_info": "garbage"}),
                json.dumps({"type": "rate_limit_event", "rate_limit_info": {
                    "unifiedWindows": {f"w{i}": {"utilization": 0.5} for i in range(500)}}}))
    by_window = {s.window: s for s in seen}
    assert by_window["five_hour"].percent == 100.0
    assert by_window["seven_day"].percent == 0.0 and by_window["seven_day"].resets_at is None
    assert not {"../../etc/passwd", "seven_day_opus", "seven_day_sonnet", "overage"} & set(
        by_window)
    assert len(seen) <= 8   # whatever it prints, a run tells of a few windows


def test_codex_windows_are_read_from_its_rollout_file_clamped(tmp_path, monkeypatch):
    """`codex exec --json` prints none: the last token_count of the thread's rollout file
    (under $CODEX_HOME, which the run may write: clamped as stdout is)."""
    thread = "01a2249b-5266-7391-b7ef-1f3d971576b0"
    day = tmp_path / "sessions" / "2026" / "11" / "28"
    day.mkdir(parents=True)
    reset = NOW.timestamp() + 600

    def token_count(primary, secondary=None) -> str:
        return json.dumps({"type": "event_msg", "payload": {"type": "token_count", "rate_limits": {
            "primary": primary, "secondary": secondary}}})
    (day / f"rollout-2026-11-28T11-59-00-{thread}.jsonl").write_text("\n".join([
        token_count({"used_percent": 50.0, "window_minutes": 300, "resets_at": reset}),
        "{torn", token_count({"used_percent": 250, "window_minutes": 300, "resets_at": reset},
                             {"used_percent": -3, "window_minutes": 10080,
                              "resets_at": 10**13})]))
    (day / "rollout-2026-11-28T11-59-00-another-thread.jsonl").write_text(
        token_count({"used_percent": 1, "window_minutes": 300}))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path))
    stdout = json.dumps({"type": "thread.started", "thread_id": thread})
    seen = Codex().quota(RunEnd(stdout, "", 0, NOW))
    assert [(s.window, s.percent) for s in seen] == [("five_hour", 100.0), ("seven_day", 0.0)]
    assert seen[0].resets_at.timestamp() == reset and seen[1].resets_at is None
    # a thread id that is no id (a glob, a path) finds nothing
    for bad in ("*", "../../x"):
        assert Codex().quota(RunEnd(json.dumps({"type": "thread.started", "thread_id": bad}),
                                    "", 0, NOW)) == ()


# --- the rule ---

def reading(window: str, percent: float, resets_in: float | None) -> QuotaReading:
    return QuotaReading(window=window, percent=percent, seen_at=NOW, agent="claude",
                        resets_at=NOW + timedelta(seconds=resets_in)
                        if resets_in is not None else None)


def test_past_the_threshold_the_block_lasts_until_the_window_that_resets_last():
    readings = {"five_hour": reading("five_hour", 95, 600),
                "seven_day": reading("seven_day", 92, 86400)}
    block = blocking(readings, Quota(), NOW)
    assert block.reading.window == "seven_day" and block.until == NOW + timedelta(days=1)
    assert "weekly window 92 %" in block.words()
    # per window, and what is reserved for the human
    assert blocking(readings, Quota(pause_at_percent={"all": 96}), NOW) is None
    per_window = blocking(readings, Quota(pause_at_percent={"five_hour": 95, "all": 96}), NOW)
    assert per_window.reading.window == "five_hour" and per_window.threshold == 95
    reserved = blocking(readings, Quota(pause_at_percent={"all": 99}, reserve_percent=6), NOW)
    assert reserved.threshold == 94
    # a window that reset since (or says no reset) holds nothing back
    assert blocking({"five_hour": reading("five_hour", 99, -1)}, Quota(), NOW) is None
    assert blocking({"five_hour": reading("five_hour", 99, None)}, Quota(), NOW) is None


def test_spread_holds_a_window_spent_faster_than_its_time_passes():
    # 45 % used of a 5-hour window with 4 hours left: spending 90 % evenly, 45 % is due
    # 2.5 hours in, an hour and a half from now
    ahead = {"five_hour": reading("five_hour", 45, 4 * 3600)}
    assert blocking(ahead, Quota(), NOW) is None
    block = blocking(ahead, Quota(spread=True), NOW)
    assert block.spread and block.until == NOW + timedelta(hours=1.5)
    behind = {"five_hour": reading("five_hour", 15, 4 * 3600)}
    assert blocking(behind, Quota(spread=True), NOW) is None


def test_a_runs_share_is_the_rise_within_one_window_period():
    before = reading("five_hour", 90, 600)
    assert share(before, reading("five_hour", 93.5, 600)) == 3.5
    assert share(before, reading("five_hour", 4, 18000)) == 4   # it reset meanwhile
    assert share(None, reading("five_hour", 50, 600)) == 0      # no earlier word: unknown


# --- the store's verbs, on both backends ---

def test_every_session_on_an_account_sees_its_newest_reading(store):  # noqa: F811
    one, other = store.new("s1"), store.new("s2")
    account = f"acct-{one.id}-{os.getpid()}"
    first = QuotaReading(window="five_hour", percent=91, resets_at=NOW + timedelta(hours=1),
                         seen_at=NOW, agent="claude", session=one.id)
    assert one.record_quota(account, first)
    older = QuotaReading(window="five_hour", percent=12, resets_at=NOW, agent="codex",
                         seen_at=NOW - timedelta(seconds=1), session=other.id)
    assert not other.record_quota(account, older)   # another engine's newer one stands
    weekly = QuotaReading(window="seven_day", percent=40, resets_at=None, agent="claude",
                          seen_at=NOW + timedelta(seconds=1), session=other.id)
    assert other.record_quota(account, weekly)
    for session in (one, other, store.reopen(one)):
        assert session.quota(account) == {"five_hour": first, "seven_day": weekly}
    assert one.quota(account + "-another") == {}


# --- config ---

@pytest.mark.parametrize("quota, path", [
    ({"pause_at_percent": 120}, "$.limits.quota.pause_at_percent: expected a percent"),
    ({"pause_at_percent": {"five_hour": 0}}, "$.limits.quota.pause_at_percent.five_hour:"),
    ({"pause_at_percent": {"Five Hours": 50}}, "$.limits.quota.pause_at_percent.Five Hours:"),
    ({"reserve_percent": 100}, "$.limits.quota.reserve_percent: expected a percent"),
    ({"spread": "yes"}, "$.limits.quota.spread:"),
    ({"pause_at": 80}, "$.limits.quota: unknown key pause_at"),
])
def test_bad_quota_config_is_one_line_and_exit_2(tmp_path, quota, path):
    write_config(tmp_path, {"limits": {"quota": quota}})
    r = ralph(tmp_path, "validate")
    assert r.returncode == 2 and path in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_bad_account_label_is_one_line_and_exit_2(tmp_path):
    write_config(tmp_path, {"roles": {"executor": {"agent": {"account": "../../x"}}}})
    r = ralph(tmp_path, "validate")
    assert r.returncode == 2 and "$.roles.executor.agent.account: expected" in r.stderr


# --- the engine, with the demo agent saying Claude Code's line ---

def executor_at(percent: float, reset: float) -> dict:
    """t1's executor: builds it, and its CLI says the 5-hour window is at `percent`."""
    return {"role": "executor", "stdout": rate_limit_event(percent, reset),
            "emit": [{"topic": "build.done", "payload": EVIDENCE}]}


def steps_at(percent: float, reset: float) -> list[dict]:
    return [plan("t1"), executor_at(percent, reset),
            {"role": "reviewer", "emit": [{"topic": "review.done", "payload": REVIEW_OK}]},
            *DONE]


def account_config(tmp_path, **quota) -> dict:
    """A label of its own (the tests of one worker share its state directory)."""
    config: dict = {"agent": {"account": f"acct-{tmp_path.name}"[:64]}}
    if quota:
        config["limits"] = {"quota": quota}
    return config


def ts(event: dict) -> float:
    return datetime.fromisoformat(event["ts"]).timestamp()


def test_past_the_threshold_no_new_run_starts_before_the_reset(tmp_path):
    """The executor's run says 95 % of the 5-hour window: the run finished its turn, the
    reviewer's starts only after the reset, with nothing spent; status says why."""
    reset = int(time.time()) + 12   # long enough for a loaded machine to ask status twice
    proc = start(tmp_path, steps_at(95, reset), config=account_config(tmp_path))
    sd = session_dir(tmp_path, "s")
    waiting = wait_for(lambda: (sd / "metadata.yaml").exists() and metadata(sd).get(
        "limit_wait"), timeout=60)
    assert waiting["window"] == "five_hour" and waiting["role"] == "reviewer", waiting
    status = ralph(tmp_path, "session", "status", "s").stdout
    assert "waiting for demo's 5-hour window window until" not in status
    assert "waiting for demo's 5-hour window until" in status, status
    assert f"quota: acct-{tmp_path.name} 5-hour window 95 %, resets" in status, status
    view = json.loads(ralph(tmp_path, "session", "status", "s", "--json").stdout)
    assert view["quota"][0]["percent"] == 95 and view["quota"][0]["window"] == "five_hour"
    assert view["limit_wait"]["window"] == "five_hour"
    code, out, err = finish(proc, timeout=90)
    assert code == 0, out + err
    e = events(sd)
    observed = [x["payload"] for x in e if x["topic"] == "quota.observed"]
    assert len(observed) == 1 and observed[0]["percent"] == 95 and \
        observed[0]["role"] == "executor" and observed[0]["task"] == "t1", observed
    reached = next(x["payload"] for x in e if x["topic"] == "limit.reached")
    assert reached["quota"]["window"] == "five_hour" and reached["quota"]["threshold"] == 90
    assert reached["role"] == "reviewer" and reached["action"] == "wait"
    reviewed = next(x for x in e if x["topic"] == "review.done")
    assert ts(reviewed) >= reset, (reviewed["ts"], reset)
    t = topics(sd)
    assert t.count("limit.reached") == 1 and t.count("limit.over") == 1
    assert "task.resume" not in t and "fallback.triggered" not in t
    assert "human.question" not in t
    m = metadata(sd)
    assert m["fallback"]["errors"] == 0 and m["limit_wait"] is None
    assert m["status"] == "completed"
    # the reviewer ran once: no attempt was spent on the wait
    assert len(run_logs(sd, "*-reviewer-t1.stdout")) == 1


def test_below_the_threshold_runs_go_on_and_each_runs_share_is_kept(tmp_path):
    reset = int(time.time()) + 3600
    steps = [{**plan("t1"), "stdout": rate_limit_event(40, reset)},
             executor_at(52.5, reset),
             {"role": "reviewer", "emit": [{"topic": "review.done", "payload": REVIEW_OK}]},
             *DONE]
    done = start(tmp_path, steps, config=account_config(tmp_path), wait=True)
    assert done.returncode == 0, done.stdout + done.stderr
    sd = session_dir(tmp_path, "s")
    assert "limit.reached" not in topics(sd)
    usage = metadata(sd)["usage"]
    assert usage["by_role"]["executor"]["quota_points"] == {"five_hour": 12.5}
    assert usage["quota_by_task"] == {"t1": {"five_hour": 12.5}}
    status = ralph(tmp_path, "session", "status", "s").stdout
    assert "window share (points): executor 5-hour 12.5" in status, status
    assert "task t1 5-hour 12.5" in status


def test_a_reading_is_recorded_for_the_runs_own_account_only(tmp_path):
    """Whatever the output names, the reading is the run's account's."""
    reset = int(time.time()) + 3600
    line = rate_limit_event(50, reset, account="someone-else", accountId="victim")
    steps = [{**plan("t1"), "stdout": line}, *steps_at(10, reset)[1:]]
    done = start(tmp_path, steps, config=account_config(tmp_path), wait=True)
    assert done.returncode == 0, done.stdout + done.stderr
    from ralph.session_store import load, state_root
    session = load(str(tmp_path), "s")
    accounts = sorted(os.listdir(os.path.join(state_root(), "accounts")))
    assert f"acct-{tmp_path.name}.json" in accounts
    assert not [a for a in accounts if "victim" in a or "someone" in a]
    assert session.quota(f"acct-{tmp_path.name}")["five_hour"].percent == 10


def test_kill_9_during_the_quota_wait_resumes_into_the_same_wait(tmp_path):
    reset = int(time.time()) + 8
    proc = start(tmp_path, steps_at(97, reset), config=account_config(tmp_path))
    sd = session_dir(tmp_path, "s")
    waiting = wait_for(lambda: (sd / "metadata.yaml").exists() and metadata(sd).get(
        "limit_wait"), timeout=60)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = spawn(tmp_path, "session", "resume", "s")
    code, out, err = finish(resumed, timeout=90)
    assert code == 0, out + err
    e = events(sd)
    over = [x for x in e if x["topic"] == "limit.over"]
    assert len(over) == 1 and ts(over[0]) >= reset
    assert ts(next(x for x in e if x["topic"] == "review.done")) >= reset
    assert [x["topic"] for x in e].count("limit.reached") == 1
    assert datetime.fromisoformat(waiting["until"]).timestamp() == reset
    assert metadata(sd)["status"] == "completed"


def test_two_engines_on_one_account_the_second_waits_on_the_firsts_reading(tmp_path):
    """Session A's executor reads 95 %; session B (another workspace, the same account)
    starts no run, not even its planner, before the reset."""
    reset = int(time.time()) + 8
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    config = account_config(tmp_path)
    first = start(a, steps_at(95, reset), config=config)
    sa = session_dir(a, "s")
    wait_for(lambda: (sa / "metadata.yaml").exists() and metadata(sa).get("limit_wait"),
             timeout=60)
    second = start(b, steps_at(10, reset + 3600), config=config)
    for proc in (first, second):
        code, out, err = finish(proc, timeout=90)
        assert code == 0, out + err
    sb = session_dir(b, "s")
    e = events(sb)
    reached = next(x["payload"] for x in e if x["topic"] == "limit.reached")
    assert reached["role"] == "planner" and reached["quota"]["percent"] == 95, reached
    planned = next(x for x in e if x["topic"] == "plan.ready")
    assert ts(planned) >= reset, (planned["ts"], reset)


@pytest.mark.slow
def test_kill_at_every_write_around_a_quota_wait_then_resume_waits_and_completes(tmp_path):
    """The crash matrix, for a window past its threshold (as test_limits.py's for a
    limit): killed after each durable write from the reading's record to the paced run's
    outcome (the reading, the wait in metadata, its end), the session resumes, waits if
    the window has not reset, and completes with nothing spent."""
    import subprocess

    import _crashkit as kit
    from support import RALPH, demo_config

    def run(ws, **env) -> subprocess.CompletedProcess:
        demo_config(ws, steps_at(95, time.time() + 2),
                    {"agent": {"account": f"crash-{tmp_path.name}-{ws.name}"[:64]}})
        return subprocess.run(RALPH + ["session", "start", "objective", "--id", "s"], cwd=ws,
                              env=base_env(**env), capture_output=True,
                              text=True, timeout=120)

    base = tmp_path / "base"
    base.mkdir()
    trace = tmp_path / "trace"
    assert run(base, RALPH_TEST_WRITE_TRACE=trace).returncode == 0
    writes = kit.read_trace(trace, base, "s")
    at = [i for i, w in enumerate(writes) if w.kind == "event"]
    said = [events(session_dir(base, "s"))[n]["topic"] for n in range(len(at))]
    observed = at[said.index("quota.observed")]
    reviewed = at[said.index("review.done")]
    points = writes[observed - 1:reviewed + 2]
    assert len(points) >= 4, points
    expected = kit.outcome(base, "s")

    def kill_at(w) -> str | None:
        ws = tmp_path / f"w{w.n:03d}"
        ws.mkdir()
        try:
            kit.killed_then_resumed(ws, "s", run, w.n, expected)
            m = metadata(session_dir(ws, "s"))
            assert m["limit_wait"] is None and m["fallback"]["errors"] == 0
            assert "task.resume" not in topics(session_dir(ws, "s"))
        except Exception as e:  # noqa: BLE001 - reported per point below
            return f"killed after write {w.n} ({w.kind} {w.path}): {type(e).__name__}: {e}"
        kit.remove_workspace(ws)
        return None

    failures = kit.run_all(kill_at, points)
    assert not failures, "\n".join(failures)


def test_a_fleet_on_one_account_shares_the_reading_through_postgresql(tmp_path, postgres_url,
                                                                     monkeypatch):
    """Two machines (a state directory each, one PostgreSQL store): machine B's session
    starts no run before the reset machine A's run read."""
    reset = int(time.time()) + 10
    config = account_config(tmp_path)
    machines = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        machines[name] = (tmp_path / name, base_env(
            RALPH_STORE_URL=postgres_url, RALPH_STATE_DIR=tmp_path / f"state-{name}",
            RALPH_MACHINE=name))
    (a, env_a), (b, env_b) = machines["a"], machines["b"]
    first = start(a, steps_at(95, reset), sid="sa", config=config, env=env_a)
    wait_for(lambda: json.loads(ralph(a, "session", "status", "sa", "--json", env=env_a)
                                .stdout or "{}").get("limit_wait"), timeout=60)
    second = start(b, steps_at(10, reset + 3600), sid="sb", config=config, env=env_b)
    for proc in (first, second):
        code, out, err = finish(proc, timeout=90)
        assert code == 0, out + err
    # through the database: machine B's state directory holds no reading of the account
    assert not (tmp_path / "state-b" / "accounts").exists()
    for name, value in (("RALPH_STORE_URL", postgres_url),
                        ("RALPH_STATE_DIR", str(tmp_path / "state-b")), ("RALPH_MACHINE", "b")):
        monkeypatch.setenv(name, value)
    from ralph.session_store import load
    session = load(str(b), "sb")
    said = session.events_after(0)
    reached = next(e["payload"] for e in said if e["topic"] == "limit.reached")
    assert reached["role"] == "planner" and reached["quota"]["percent"] == 95, reached
    assert ts(next(e for e in said if e["topic"] == "plan.ready")) >= reset
    assert session.metadata.status.value == "completed"


def test_pause_then_resume_now_during_a_quota_wait_runs_at_once(tmp_path):
    """The human's verbs act on the wait: a PAUSE signal pauses it (exit 3); `resume --now`
    lets the window through (it is not waited for again on the same reading)."""
    reset = int(time.time()) + 3600
    proc = start(tmp_path, steps_at(95, reset), config=account_config(tmp_path))
    sd = session_dir(tmp_path, "s")
    wait_for(lambda: (sd / "metadata.yaml").exists() and metadata(sd).get("limit_wait"),
             timeout=60)
    assert ralph(tmp_path, "signal", "pause", "not now", "--session", "s").returncode == 0
    code, out, err = finish(proc, timeout=60)
    assert code == 3, out + err
    resumed = ralph(tmp_path, "session", "resume", "s", "--now")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    over = [e["payload"] for e in events(sd) if e["topic"] == "limit.over"]
    assert over and over[-1]["why"] == "ralph session resume --now", over
    assert topics(sd).count("limit.reached") == 1
    assert metadata(sd)["status"] == "completed"
