"""Quota-aware pacing with the real Claude Code and Codex (issue 34, DESIGN §10 round 4), logged in as
a subscriber (an OAuth token) against the scripted model server (tests/support/
model_server.py), whose answers carry the `anthropic-ratelimit-unified-*` headers of a
5-hour window at 95 %: Claude Code streams a `rate_limit_event` (allowed_warning,
utilization 0.95) and finishes its turn; the engine starts no new run before the reset.

The resets are a few seconds away: the wait is what is proven (the wait's logic on the
frozen clock is test_deadlines.py's, shared with the hard limit's wait).
"""
from __future__ import annotations

import json
import os
import signal
import time
from contextlib import contextmanager
from datetime import datetime

import pytest

from support import events, finish, metadata, topics, wait_for, write_config
from support.agents import Rig
from support.model_server import Brain, Turn

pytestmark = pytest.mark.slow

AHEAD = 25   # seconds from the executor's first answer to the reset: its turn ends sooner


class Following(Brain):
    """Another engine's model on the same account: it records when each role first asks."""

    def __init__(self):
        self.first: dict[str, float] = {}

    def next(self, turn: Turn):
        if turn.step == 0:
            self.first.setdefault(turn.role or "other", time.time())
        return super().next(turn)


class WindowAt95(Following):
    """Answering the executor's first request, the account's 5-hour window reaches 95 %,
    resetting AHEAD seconds later. `first` keeps when each role's first request came."""

    def __init__(self):
        super().__init__()
        self.server = None
        self.reset: int | None = None

    def executor(self, turn: Turn):
        if self.reset is None:
            self.reset = int(time.time()) + AHEAD
            self.server.window(0.95, self.reset)
        return super().executor(turn)


@pytest.fixture
def rig(tmp_path):
    made = []

    def make(brain, name: str = "a", cli: str = "claude") -> Rig:
        (tmp_path / name).mkdir()
        r = Rig(cli, tmp_path / name, brain, subscriber=cli == "claude")
        if isinstance(brain, WindowAt95):
            brain.server = r.server
        # one account for the test's engines (the tests of a worker share a state directory)
        write_config(r.ws, {"agent": {"account": f"{cli}-{tmp_path.name}"[:64]}})
        made.append(r)
        return r
    yield make
    for r in made:
        r.close()


@contextmanager
def left_running_killed(engines: list):
    """Whatever engine of `engines` (a list the test may add to) still runs at the end is
    killed."""
    try:
        yield engines
    finally:
        for engine in engines:
            if engine.poll() is None:
                engine.kill()
                engine.communicate()


def epoch_of(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def quota_wait(r: Rig) -> dict:
    sd = r.session_dir()
    return wait_for(lambda: (sd / "metadata.yaml").exists() and metadata(sd).get("limit_wait"),
                    timeout=120)


def assert_paced_with_nothing_spent(r: Rig, brain: WindowAt95) -> None:
    sd = r.session_dir()
    t = topics(sd)
    assert t.count("limit.reached") == 1 and t.count("limit.over") == 1, t
    assert "task.resume" not in t and "fallback.triggered" not in t, t
    assert "human.question" not in t, t
    observed = [e["payload"] for e in events(sd) if e["topic"] == "quota.observed"]
    assert observed[0]["window"] == "five_hour" and observed[0]["percent"] == 95, observed
    assert observed[0]["role"] == "executor" and epoch_of(observed[0]["resets_at"]) == \
        brain.reset
    reached = next(e["payload"] for e in events(sd) if e["topic"] == "limit.reached")
    assert reached["role"] == "reviewer" and reached["quota"]["percent"] == 95, reached
    assert r.server.refused == 0   # no request met a hard limit: it was never reached
    from ralph.session_store import load
    assert load(str(r.ws), "real").iteration(1).load().task_progress("t1").attempts == \
        ["done"]
    m = metadata(sd)
    assert m["status"] == "completed" and m["fallback"]["errors"] == 0
    assert m["limit_wait"] is None
    # no new run started inside the window: the reviewer's first request came after it
    assert brain.first["reviewer"] >= brain.reset, (brain.first, brain.reset)


@pytest.mark.parametrize("cli", ["claude", "codex"])
def test_at_95_percent_no_new_run_starts_before_the_reset(rig, cli):
    """Claude Code streams the window (rate_limit_event); Codex keeps it in its rollout
    file (its `exec --json` prints none), from the `x-codex-primary-*` headers."""
    brain = WindowAt95()
    r = rig(brain, cli=cli)
    with left_running_killed([r.start()]) as (engine,):
        waiting = quota_wait(r)
        assert waiting["window"] == "five_hour" and waiting["role"] == "reviewer", waiting
        assert epoch_of(waiting["until"]) == brain.reset
        status = r.ralph("session", "status", "real")
        assert f"waiting for {cli}'s 5-hour window until" in status.stdout, status.stdout
        assert "5-hour window 95 %, resets" in status.stdout, status.stdout
        view = json.loads(r.ralph("session", "status", "real", "--json").stdout)
        assert view["quota"][0]["percent"] == 95 and view["limit_wait"]["window"] == \
            "five_hour", view
        code, out, err = finish(engine, timeout=180)
    assert code == 0, out + err
    assert_paced_with_nothing_spent(r, brain)


def test_claude_kill_9_during_the_quota_wait_resumes_into_the_same_wait(rig):
    brain = WindowAt95()
    r = rig(brain)
    with left_running_killed([r.start()]) as (engine,):
        before = quota_wait(r)
        os.kill(engine.pid, signal.SIGKILL)
        engine.communicate()
    assert time.time() < brain.reset, "killed after the reset: the test proves nothing"
    listed = r.ralph("session", "list")
    assert "interrupted" in listed.stdout and "waiting for claude's 5-hour window" in \
        listed.stdout, listed.stdout
    code, out, err = finish(r.resume(), timeout=180)
    assert code == 0, out + err
    assert epoch_of(before["until"]) == brain.reset
    assert "waiting for claude's 5-hour window until" in out, out
    assert_paced_with_nothing_spent(r, brain)


def test_two_engines_on_one_account_the_second_waits_on_the_firsts_reading(rig):
    """Engine A's Claude Code reads 95 %; engine B, another workspace and another model
    server on the same account, starts its session meanwhile: not even its planner runs
    before the reset."""
    brain = WindowAt95()
    a = rig(brain, "a")
    follower = Following()
    b = rig(follower, "b")
    with left_running_killed([a.start()]) as engines:
        quota_wait(a)
        assert time.time() < brain.reset, "the reset came first: the test proves nothing"
        engines.append(b.start())
        waiting = quota_wait(b)
        assert waiting["role"] == "planner" and epoch_of(waiting["until"]) == brain.reset
        for engine in engines:
            code, out, err = finish(engine, timeout=180)
            assert code == 0, out + err
    assert follower.first["planner"] >= brain.reset, (follower.first, brain.reset)
    reached = next(e["payload"] for e in events(b.session_dir()) if
                   e["topic"] == "limit.reached")
    assert reached["quota"]["percent"] == 95 and reached["role"] == "planner", reached
    assert metadata(b.session_dir())["status"] == "completed"
