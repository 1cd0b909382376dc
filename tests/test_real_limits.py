"""Usage limits of the real Claude Code, Codex and Gemini CLIs, waited out (DESIGN §10):
a limit never spends an attempt, an iteration, an error count or a human's question.

Each CLI runs as `ralph session start --agent <cli>` against the scripted model server
(tests/support/model_server.py), which answers as its API does at a usage limit
(tests/agents/LIMITS.md). The executor's first model request is answered (a harmless
command), and that answer puts the account at its limit: the executor's next request is
refused, the CLI gives up and says so in its own words, and the engine reads them through
its preset, waits durably, and runs the same step again, continuing the CLI's
conversation. The model sees it continue: the retried run's first request carries the
earlier command's output.
"""
from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime

import pytest

from support import events, finish, metadata, topics, wait_for, work_dir, write_config
from support.agents import Rig
from support.model_server import Brain, Say, Shell, Turn

pytestmark = pytest.mark.slow

LOOKED = "looked around before building"


class LimitedMidRun(Brain):
    """The executor looks around first; answering that, the model server reaches its usage
    limit (once), resetting at `reset()` (epoch seconds, computed then): the executor's next
    request is refused. `continued` says, for each executor request the model answered,
    whether it carried the earlier look's output: a retry that continues the conversation
    does, one that starts afresh does not (and looks again)."""

    def __init__(self, reset, requests: int | None = None):
        self.reset = reset
        self.requests = requests
        self.server = None         # the Rig's server, set once it exists
        self.resets: list[int] = []
        self.continued: list[bool] = []

    def executor(self, turn: Turn):
        looked = any(LOOKED in output for output in turn.outputs)
        self.continued.append(looked)
        if not looked:
            if not self.resets:
                self.resets.append(self.reset())
                self.server.limit(self.resets[0], self.requests)
            return Shell(f'echo "{LOOKED}"')
        if all(LOOKED in output for output in turn.outputs):
            return Shell(f'echo hello > hello.txt && {turn.ralph} emit build.done '
                         f'"{self.EVIDENCE}"')
        return Say("Done: hello.txt written.")


def seconds_ahead(seconds: int):
    return lambda: int(time.time()) + seconds


def next_minute(at_least: int = 8):
    """Codex says a reset to the minute ("try again at 10:10 PM"): the next whole minute at
    least `at_least` seconds away, so the reset it says is the server's to the second."""
    def reset() -> int:
        now = time.time()
        minute = (int(now) // 60 + 1) * 60
        return minute if minute - now >= at_least else minute + 60
    return reset


@pytest.fixture
def rigs(tmp_path):
    made = []

    def make(cli: str, brain: LimitedMidRun, config: dict | None = None,
             subscriber: bool = False) -> Rig:
        r = Rig(cli, tmp_path, brain, subscriber=subscriber)
        brain.server = r.server
        made.append(r)
        if config:
            write_config(r.ws, config)
        return r
    yield make
    for r in made:
        r.close()


def recorded_attempts(r: Rig, task: str = "t1") -> list[str]:
    from ralph.session_store import load
    return load(str(r.ws), "real").iteration(1).load().task_progress(task).attempts


def limit_wait(r: Rig) -> dict:
    """The session's recorded wait, once there is one."""
    sd = r.session_dir()
    return wait_for(lambda: (sd / "metadata.yaml").exists() and metadata(sd).get("limit_wait"),
                    timeout=90)


def assert_said_waiting(r: Rig) -> None:
    status = r.ralph("session", "status", "real")
    assert f"waiting for {r.cli}'s usage limit until" in status.stdout, status.stdout
    listed = r.ralph("session", "list")
    assert f"waiting for {r.cli}'s usage limit until" in listed.stdout, listed.stdout
    view = json.loads(r.ralph("session", "status", "real", "--json").stdout)
    assert view["limit_wait"]["agent"] == r.cli and view["limit_wait"]["task"] == "t1", view


def conversations(r: Rig) -> list[str | None]:
    """The conversation id each executor run's CLI printed (Claude's session_id, Codex's
    thread_id, Gemini's session_id), in run order."""
    ids = []
    for log in sorted((work_dir(r.session_dir()) / "iterations/1/logs").glob(
            "*-executor-t1.stdout")):
        text = log.read_text()
        stderr = log.with_suffix(".stderr")
        text += stderr.read_text() if stderr.exists() else ""
        ids.append(_conversation_in(r.cli, text))
    return ids


def _conversation_in(cli: str, text: str) -> str | None:
    if cli == "gemini":   # one JSON document, after whatever it printed before it
        start = text.rfind('{\n  "session_id"')
        return json.loads(text[start:text.rindex("}") + 1])["session_id"] if start >= 0 \
            else None
    key = "thread_id" if cli == "codex" else "session_id"
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get(key):
            return event[key]
    return None


def assert_waited_out_with_nothing_spent(r: Rig, brain: LimitedMidRun) -> dict:
    """The limit was reached once and waited out once, at no cost; the retried run
    continued the conversation. The limit.reached payload."""
    sd = r.session_dir()
    t = topics(sd)
    assert t.count("limit.reached") == 1 and t.count("limit.over") == 1, t
    assert "fallback.triggered" not in t, t
    assert "human.question" not in t, t
    assert recorded_attempts(r) == ["done"]
    m = metadata(sd)
    assert m["status"] == "completed" and m["fallback"]["errors"] == 0
    assert m["limit_wait"] is None
    assert r.server.refused >= 1
    reached = next(e["payload"] for e in events(sd) if e["topic"] == "limit.reached")
    assert reached["agent"] == r.cli and reached["role"] == "executor", reached
    assert reached["task"] == "t1" and reached["action"] == "wait", reached
    over = next(e["payload"] for e in events(sd) if e["topic"] == "limit.over")
    assert over["why"] == "the limit reset", over
    # the retry continued the conversation: its first request carried the look's output
    assert brain.continued[:2] == [False, True], brain.continued
    ids = conversations(r)
    assert len(ids) == 2 and ids[0] and ids[0] == ids[1], ids
    return reached


def epoch_of(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def run_to_the_limit_and_past_it(r: Rig, brain: LimitedMidRun) -> tuple[dict, dict]:
    """Start the session, see it wait (status, list, --json), let it finish: (the recorded
    wait, the limit.reached payload)."""
    engine = r.start()
    try:
        waiting = limit_wait(r)
        assert_said_waiting(r)
        code, out, err = finish(engine, timeout=150)
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.communicate()
    assert code == 0, out + err
    assert time.time() >= epoch_of(waiting["until"])
    return waiting, assert_waited_out_with_nothing_spent(r, brain)


def test_claude_subscriber_limit_waits_for_its_reset_and_continues(rigs):
    brain = LimitedMidRun(seconds_ahead(6))
    r = rigs("claude", brain, subscriber=True)
    waiting, reached = run_to_the_limit_and_past_it(r, brain)
    # the reset Claude Code read from the server's headers, to the second
    assert epoch_of(waiting["until"]) == brain.resets[0], (waiting, brain.resets)
    assert epoch_of(reached["reset"]) == brain.resets[0], reached
    assert "You've hit your 5-hour limit" in reached["text"], reached


def test_codex_limit_waits_for_the_minute_it_names_and_continues(rigs):
    brain = LimitedMidRun(next_minute())
    r = rigs("codex", brain)
    waiting, reached = run_to_the_limit_and_past_it(r, brain)
    # "try again at 10:10 PM": the server's reset, a whole minute
    assert epoch_of(waiting["until"]) == brain.resets[0], (waiting, brain.resets)
    assert "hit your usage limit" in reached["text"], reached


@pytest.mark.parametrize("cli, words", [
    # the server says a reset less than 5 minutes away as a daily quota, with no time
    ("gemini", "exhausted your daily quota"),
    # an API key (not a subscriber): a 429 with x-should-retry: false, no reset said
    ("claude", "Request rejected (429)")])
def test_a_limit_with_no_reset_said_waits_limit_wait_seconds(rigs, cli, words):
    # one request refused: a time would make the test depend on how fast the CLI asks
    brain = LimitedMidRun(seconds_ahead(60), requests=1)
    r = rigs(cli, brain, config={"agent": {"limit_wait_seconds": 4}})
    waiting, reached = run_to_the_limit_and_past_it(r, brain)
    assert reached["reset"] is None, reached
    waited = epoch_of(waiting["until"]) - epoch_of(waiting["since"])
    assert waited == pytest.approx(4, abs=0.01), waiting
    assert words in reached["text"], reached


def test_claude_kill_9_during_the_wait_and_resume_waits_for_the_same_reset(rigs):
    brain = LimitedMidRun(seconds_ahead(8))
    r = rigs("claude", brain, subscriber=True)
    engine = r.start()
    try:
        before = limit_wait(r)
        os.kill(engine.pid, signal.SIGKILL)
        engine.communicate()
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.communicate()
    assert time.time() < brain.resets[0], "killed after the reset: the test proves nothing"
    listed = r.ralph("session", "list")
    assert "interrupted" in listed.stdout and "waiting for claude's usage limit" in \
        listed.stdout, listed.stdout
    code, out, err = finish(r.resume(), timeout=150)
    assert code == 0, out + err
    assert time.time() >= brain.resets[0]
    # the same wait: its reset kept across the kill, reached once, over once
    assert epoch_of(before["until"]) == brain.resets[0], (before, brain.resets)
    assert "waiting for claude's usage limit until" in out, out
    assert_waited_out_with_nothing_spent(r, brain)
