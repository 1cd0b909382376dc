"""The Telegram channel against a fake Bot API server (tests/fake_telegram.py), with the
real python-telegram-bot client and real `ralph` processes: questions out with their
context, replies in as answers, @ID routing, commands, chats not allowed, retries and
429, a send that keeps failing counting as a timeout, and a token that never leaks."""
from __future__ import annotations

import signal
import stat
import time
from pathlib import Path

import pytest
import yaml

from ralph.session_store import sessions_root
from support import (DONE, EVIDENCE, base_env, events, finish, metadata, plan, prompts, ralph,
                     session_dir, session_dirs, spawn, wait_for, work_dir, write_config,
                     write_scenario)
from support import start as start_demo
from fake_telegram import FakeTelegram

TOKEN = "123456:TEST-MARKER-TOKEN"
SECRET = "TEST-MARKER-TOKEN"
CHAT = 111
STRANGER = 999


@pytest.fixture
def fake():
    with FakeTelegram(TOKEN) as server:
        yield server


def tg_env(fake: FakeTelegram, **extra) -> dict:
    return base_env(RALPH_TELEGRAM_BOT_TOKEN=TOKEN, RALPH_TELEGRAM_API_URL=fake.url,
                    NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", **extra)


def robot(**over) -> dict:
    return {"enabled": True, "timeout_seconds": 60,
            "telegram": {"allowed_chat_ids": [CHAT]}, **over}


def start(ws: Path, steps, fake, sid="h", robot_config=None, extra=None, env=None):
    return start_demo(ws, steps, objective="telegram objective", sid=sid, env=env or tg_env(fake),
                      config={"RObot": robot_config or robot(), **(extra or {})})


def bot_state_dir(ws: Path) -> Path:
    """Where the bot keeps its state: beside the sessions' control planes."""
    return Path(sessions_root(str(ws))) / ".telegram"


def assert_no_token(ws: Path, *outputs: str) -> None:
    """Not in any file under the workspace or the sessions' control planes (the bot's
    state among them), nor in any output."""
    for path in [*ws.rglob("*"), *Path(sessions_root(str(ws))).rglob("*")]:
        if path.is_file() and not path.is_symlink():
            assert SECRET.encode() not in path.read_bytes(), path
    for out in outputs:
        assert SECRET not in (out or "")
    # and the bot's state was saved whole when it stopped
    assert not list(bot_state_dir(ws).glob(".*.tmp"))


ASKS = [{**plan("t1"), "emit": plan("t1")["emit"] + [
            {"topic": "human.progress", "payload": "planned one task"}]},
        {"role": "executor", "attempt": 1, "emit": [
            {"topic": "human.interact", "json": {"text": "Which database?",
                                                 "options": ["postgres", "sqlite"],
                                                 "default": "sqlite"}}]},
        *DONE]


QUIET_ASKS = [plan("t1"), ASKS[1], *DONE]   # no progress note to take a scripted failure


def is_question(m: dict) -> bool:
    return "Which database?" in m.get("text", "")


# --- config ---

def test_enabled_without_token_or_chats_is_refused(workspace, fake):
    write_config(workspace, {"RObot": {"enabled": True, "telegram": {"allowed_chat_ids": [1]}}})
    r = ralph(workspace, "session", "start", "obj", env=base_env())
    assert r.returncode == 2 and "$.RObot.telegram.bot_token" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    write_config(workspace, {"RObot": {"enabled": True}})
    r = ralph(workspace, "session", "start", "obj", env=tg_env(fake))
    assert r.returncode == 2 and "$.RObot.telegram.allowed_chat_ids" in r.stderr, r.stderr
    assert session_dirs(workspace) == []
    assert not (workspace / ".ralph-sessions").exists() or not [
        p for p in (workspace / ".ralph-sessions").iterdir() if not p.name.startswith(".")]
    assert_no_token(workspace, r.stdout, r.stderr)


def test_settings_precedence_and_repr():
    from ralph.engine import config as cfg
    from ralph.engine.channels import telegram
    config = cfg.parse("RObot: {enabled: true, telegram: {bot_token: 'c:fromconfig', "
                       "api_url: 'http://config.example/', allowed_chat_ids: [5]}}\n", "x")
    s = telegram.settings(config, environ={})
    assert (s.token, s.api_url, s.chats) == ("c:fromconfig", "http://config.example", [5])
    s = telegram.settings(config, environ={"RALPH_TELEGRAM_BOT_TOKEN": "e:fromenv",
                                               "RALPH_TELEGRAM_API_URL": "http://env.example"})
    assert (s.token, s.api_url) == ("e:fromenv", "http://env.example")
    assert "fromenv" not in repr(s)
    config.RObot.telegram.api_url = None
    assert telegram.settings(config, environ={}).api_url == "https://api.telegram.org"
    config.RObot.enabled = False
    assert telegram.settings(config, environ={}) is None


# --- questions and answers ---

def test_question_goes_out_and_a_reply_answers_it(workspace, fake):
    proc = start(workspace, ASKS, fake)
    question = fake.wait_message(is_question)
    text = question["text"]
    for part in ("session h", "iteration 1", "role executor", "task t1", "EXECUTING_BATCH",
                 "postgres | sqlite", "Default: sqlite", "Deadline:", "Reply to this message"):
        assert part in text, text
    assert question["chat"]["id"] == CHAT
    assert question["reply_markup_sent"]["force_reply"] is True
    fake.wait_text("planned one task")

    # chats not allowed are not heard: neither their answers nor their commands
    stranger = [fake.push(STRANGER, "sqlite", reply_to=question),
                fake.push(STRANGER, "/stop"), fake.push(STRANGER, "@h steer elsewhere")]
    fake.wait_confirmed(stranger[-1])
    sd = session_dir(workspace, "h")
    assert not (sd / "answers").exists() or not list((sd / "answers").iterdir())

    first = fake.push(CHAT, "postgres", reply_to=question)
    second = fake.push(CHAT, "sqlite", reply_to=question)
    assert "Answer recorded" in fake.wait_reply(first)["text"]
    assert "already answered" in fake.wait_reply(second)["text"]
    code, out, err = finish(proc)
    assert code == 0, out + err

    qid = yaml.safe_load(next((sd / "questions").glob("*.yaml")).read_text())["id"]
    answer = yaml.safe_load((sd / f"answers/{qid}.yaml").read_text())
    assert (answer["text"], answer["channel"]) == ("postgres", "telegram")
    assert "postgres" in prompts(sd, "executor", "t1")[1]
    assert metadata(sd)["status"] == "completed"
    # the stranger changed nothing and was told nothing; the log has no content of theirs
    assert not list((sd / "signals/processed").iterdir())
    assert not list((sd / "signals/inputs").iterdir())
    assert fake.messages(STRANGER) == []
    assert "ignored a message from chat 999" in err
    assert "steer elsewhere" not in err and "sqlite" not in err
    # notifications: the progress note exactly once, and the end
    assert sum("planned one task" in m["text"] for m in fake.messages()) == 1
    fake.wait_text("Session h completed")
    state_dir = bot_state_dir(workspace)
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    state = yaml.safe_load((state_dir / "state.yaml").read_text())
    assert state["update_offset"] == second + 1
    assert {"session": "h", "question": qid} in state["messages"].values()
    assert fake.wrong_tokens == 0
    assert_no_token(workspace, out, err)


WAITS = [plan("t1"),   # the executor waits for a human inside its run: no race with the clock
         {"role": "executor", "ask": {"question": "Go on in {task}?", "timeout": 60},
          "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
         *DONE]


def asked(fake: FakeTelegram, sid: str) -> dict:
    return fake.wait_message(lambda m: f"from session {sid}\n" in m.get("text", ""), 30)


def test_at_id_routes_guidance_to_that_session(workspace, fake):
    a = start(workspace, WAITS, fake, sid="A")
    fake.wait_polling()   # A's engine runs the bot: A is the primary session
    b = spawn(workspace, "session", "start", "second objective", "--id", "B", env=tg_env(fake))
    question_a, question_b = asked(fake, "A"), asked(fake, "B")
    to_b = fake.push(CHAT, "@B use tabs in B")
    to_a = fake.push(CHAT, "prefer spaces in A")
    nobody = fake.push(CHAT, "@nosuch hello")
    assert "Guidance queued for session B" in fake.wait_reply(to_b)["text"]
    assert "Guidance queued for session A" in fake.wait_reply(to_a)["text"]
    assert "no session nosuch" in fake.wait_reply(nobody)["text"]
    # each reply answers its own session's question
    fake.push(CHAT, "yes, B", reply_to=question_b)
    fake.push(CHAT, "yes, A", reply_to=question_a)
    for proc in (a, b):
        code, out, err = finish(proc)
        assert code == 0, out + err
        assert_no_token(workspace, out, err)
    sd = {sid: session_dir(workspace, sid) for sid in ("A", "B")}
    for sid in ("A", "B"):
        [answer] = [yaml.safe_load(p.read_text()) for p in (sd[sid] / "answers").glob("*.yaml")]
        assert answer["text"] == f"yes, {sid}"
    pad_a, pad_b = ((work_dir(sd[sid]) / "scratchpad.md").read_text() for sid in ("A", "B"))
    assert "prefer spaces in A" in pad_a and "use tabs in B" not in pad_a
    assert "use tabs in B" in pad_b and "prefer spaces in A" not in pad_b
    review_b = prompts(sd["B"], "reviewer", "t1")[0]
    assert "## ROBOT GUIDANCE" in review_b and "use tabs in B" in review_b
    assert "prefer spaces in A" in prompts(sd["A"], "reviewer", "t1")[0]


# --- commands, with `ralph bot run` serving the workspace ---

LIBRARIAN = {"role": "librarian",
             "write_iteration": {"knowledge/notes-{iteration}.md": "# notes\n"},
             "emit": [{"topic": "knowledge.staged", "payload": "notes"}]}


def state_of(sd: Path) -> tuple:
    try:
        m = metadata(sd)
        return m["orchestrator"]["state"], m["iteration"], m["status"]
    except (FileNotFoundError, TypeError, KeyError, yaml.YAMLError):
        return None, None, None


@pytest.mark.slow
def test_commands_act_through_the_store(workspace, fake, tmp_path):
    ws = workspace
    steps = [plan("t1"),
             plan("t2", iteration=2),
             {"role": "planner", "iteration": 3, "sleep": 30, "emit": [{"topic": "LOOP_COMPLETE"}]},
             {"role": "executor", "task": "t1", "ask": {"question": "Ready?", "timeout": 60},
              "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
             {"role": "executor", "task": "t2", "attempt": 1, "sleep": 30,
              "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
             {"role": "executor", "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
             {"role": "reviewer", "emit": [{"topic": "review.done",
                                            "payload": "tests: pass, build: pass"}]},
             LIBRARIAN]
    scenario = write_scenario(ws, steps)
    write_config(ws, {"agent": {"backend": "demo", "script": str(scenario)},
                      "knowledge": {"approval": "required", "timeout_seconds": 60}})
    # the bot's own config, outside the workspace: token and API root from the file
    bot_config = write_config(tmp_path, {"RObot": {"telegram": {
        "bot_token": TOKEN, "api_url": fake.url, "allowed_chat_ids": [CHAT]}}}, "bot.yml")
    env = base_env(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    bot = spawn(ws, "bot", "run", "-c", bot_config, env=env)
    fake.wait_polling()
    session = spawn(ws, "session", "start", "command objective", "--id", "c", env=env)
    sd = session_dir(ws, "c")
    question = fake.wait_text("Ready?", timeout=30)   # the executor waits: time to talk

    def ask(text: str) -> str:
        return fake.wait_reply(fake.push(CHAT, text))["text"]

    assert "/resume" in ask("/help") and "/approve" in ask("/help@ralph_test_bot")
    status = ask("/status")
    assert "session c" in status and "EXECUTING_BATCH" in status
    assert "t1" in ask("/tasks c")
    assert "session.created" in ask("/tail @c 50")
    assert "Unknown command" in ask("/frobnicate")
    fake.push(CHAT, "ready", reply_to=question)

    wait_for(lambda: state_of(sd)[:2] == ("KNOWLEDGE_APPROVAL", 1), timeout=30)
    assert "APPROVE sent to session c" in ask("/approve")
    wait_for(lambda: (ws / ".docs/notes-1.md").exists(), timeout=30)

    wait_for(lambda: list(work_dir(sd).glob("iterations/2/logs/*-executor-t2.stdout")),
             timeout=30)
    assert "PAUSE sent" in ask("/pause c coffee break")
    code, out, err = finish(session, 30)
    assert code == 3, out + err
    assert metadata(sd)["orchestrator"]["pause_reason"] == "coffee break"
    fake.wait_text("Session c paused")
    assert "paused already" in ask("/pause")

    assert "Resuming session c" in ask("/resume")
    wait_for(lambda: state_of(sd)[:2] == ("KNOWLEDGE_APPROVAL", 2), timeout=30)
    assert "SKIP sent to session c" in ask("/skip c")
    wait_for(lambda: yaml.safe_load((sd / "iterations/2/metadata.yaml").read_text())
             .get("knowledge_decision") == "skipped", timeout=30)
    assert (work_dir(sd) / "iterations/2/knowledge/notes-2.md").exists()

    wait_for(lambda: list(work_dir(sd).glob("iterations/3/logs/*-planner.stdout")),
             timeout=30)
    assert "ABORT sent" in ask("/stop")
    wait_for(lambda: state_of(sd)[2] == "aborted", timeout=30)
    assert "takes no more signals" in ask("/stop c")

    second = ralph(ws, "bot", "run", "-c", bot_config, env=env, timeout=30)
    assert second.returncode == 2 and "runs already" in second.stderr

    bot.send_signal(signal.SIGTERM)   # like ^C: the bot stops and saves its state
    code, bot_out, bot_err = finish(bot, 30)
    assert code == 0, bot_out + bot_err
    state = yaml.safe_load((bot_state_dir(ws) / "state.yaml").read_text())
    assert state["update_offset"] == max(fake.pushed) + 1
    assert_no_token(ws, out, err, bot_out, bot_err, second.stdout, second.stderr)


# --- delivery: retries, 429, and a send that keeps failing ---

def test_failed_sends_are_retried_and_429_is_honoured(workspace, fake):
    fake.fail("sendMessage", 500)
    fake.fail("sendMessage", 429, retry_after=1)
    proc = start(workspace, QUIET_ASKS, fake)
    question = fake.wait_message(is_question, timeout=30)
    tries = [c for c in fake.calls_of("sendMessage") if "Which database?" in
             str(c["params"].get("text"))]
    assert len(tries) == 3
    assert tries[1]["at"] - tries[0]["at"] >= 0.9       # the first back-off: 1 s
    assert tries[2]["at"] - tries[1]["at"] >= 0.9       # retry_after: 1
    fake.push(CHAT, "sqlite", reply_to=question)
    code, out, err = finish(proc)
    assert code == 0, out + err
    assert "retry in 1s" in err
    assert_no_token(workspace, out, err)


@pytest.mark.slow
def test_a_send_failing_past_its_retries_counts_as_a_timeout(workspace, fake):
    fake.fail("sendMessage", 500, times=4)
    began = time.monotonic()
    proc = start(workspace, QUIET_ASKS, fake, robot_config=robot(on_timeout="abort"))
    code, out, err = finish(proc)
    assert code == 4, out + err
    assert time.monotonic() - began < 30               # the timeout is 60 s
    sd = session_dir(workspace, "h")
    q = yaml.safe_load(next((sd / "questions").glob("*.yaml")).read_text())
    assert q["delivery_failed"] is True and q["status"] == "timed_out"
    [timeout] = [e for e in events(sd) if e["topic"] == "human.timeout"]
    assert timeout["payload"]["delivery_failed"] is True
    assert metadata(sd)["status"] == "aborted"
    assert len([c for c in fake.calls_of("sendMessage")
                if "Which database?" in str(c["params"].get("text"))]) == 4
    assert not any(is_question(m) for m in fake.messages())
    assert "could not be delivered" in err
    assert_no_token(workspace, out, err)


def test_an_in_run_ask_is_answered_by_a_reply(workspace, fake):
    steps = [plan("t1"),
             {"role": "executor", "ask": {"question": "Name?", "timeout": 30},
              "write": {"name.txt": "{answer}"},
              "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
             *DONE]
    proc = start(workspace, steps, fake)
    question = fake.wait_text("Name?")
    assert "role executor" in question["text"] and "the agent goes on" in question["text"]
    fake.push(CHAT, "Ada", reply_to=question)
    code, out, err = finish(proc)
    assert code == 0, out + err
    assert (workspace / ".ralph-demo/name.txt").read_text() == "Ada"
    assert_no_token(workspace, out, err)


@pytest.mark.slow
def test_another_engine_takes_the_bot_over(workspace, fake):
    ws = workspace

    def config(name: str, steps) -> Path:
        scenario = write_scenario(ws, steps, f"{name}.scenario.yaml")
        return write_config(ws, {"agent": {"backend": "demo", "script": str(scenario)},
                                 "RObot": robot()}, f"{name}.yml")

    a = spawn(ws, "session", "start", "first", "--id", "A", "-c", config("a", WAITS),
              env=tg_env(fake))
    fake.wait_polling()
    b = spawn(ws, "session", "start", "second", "--id", "B", "-c", config("b", WAITS),
              "--accept-config", env=tg_env(fake))   # b.yml: another demo script than a.yml
    question_b = asked(fake, "B")
    fake.push(CHAT, "done", reply_to=asked(fake, "A"))
    code, out_a, err_a = finish(a)
    assert code == 0, out_a + err_a
    fake.wait_text("Session A completed")
    # B's engine stood by; it runs the bot now, and B is the primary session
    wait_for(lambda: len(fake.calls_of("getMe")) == 2, timeout=20)
    reply = fake.wait_reply(fake.push(CHAT, "guidance after the takeover"))
    assert "Guidance queued for session B" in reply["text"]
    fake.push(CHAT, "done", reply_to=question_b)
    code, out_b, err_b = finish(b)
    assert code == 0, out_b + err_b
    pad = work_dir(session_dir(ws, "B")) / "scratchpad.md"
    assert "guidance after the takeover" in pad.read_text()
    fake.wait_text("Session B completed")
    assert sum("Session A completed" in m["text"] for m in fake.messages()) == 1
    assert sum("from session B\n" in m["text"] for m in fake.messages()) == 1   # sent once
    assert_no_token(ws, out_a, err_a, out_b, err_b)


def test_a_rejected_token_is_never_printed(workspace):
    with FakeTelegram("654321:ANOTHER-TOKEN") as other:   # refuses our token: 401
        began = time.monotonic()
        proc = start(workspace, QUIET_ASKS, other, robot_config=robot(on_timeout="abort"))
        code, out, err = finish(proc)
    assert code == 4, out + err           # refused for good: no retries, a timeout at once
    assert time.monotonic() - began < 20
    assert "getMe failed" in err and "InvalidToken" in err and "<token>" in err
    assert other.wrong_tokens >= 2
    assert_no_token(workspace, out, err)


def test_an_approval_goes_out_and_a_reply_decides_the_tool_call(workspace, fake):
    """`agent.approve`: the question of a tool call reaches the chat with its call, its
    options and what its deadline does; a reply with a reason denies it, and the hook of
    the agent's CLI gets the reason."""
    from support.scripted import HOOK, recorded, said, script_agent
    script_agent(workspace, HOOK + '''
record("push", approve("claude", "Bash", {"command": "git push --force"}))
''', {"agent": {"approve": ["Bash(git push*)"]}, "RObot": robot()})
    proc = spawn(workspace, "session", "start", "approve over telegram", "--id", "a",
                 env=tg_env(fake))
    question = fake.wait_text("Approve this tool call? Bash: git push --force")
    assert "Options: allow | deny" in question["text"], question["text"]
    assert "then: the call is denied" in question["text"], question["text"]
    fake.push(CHAT, "deny: open a pull request", reply_to=question)
    assert said(recorded(workspace, "push", "a")) == {
        "hookEventName": "PreToolUse", "permissionDecision": "deny",
        "permissionDecisionReason": "Denied by a human (telegram): open a pull request"}
    code, out, err = finish(proc)
    assert code == 0, out + err
    decided = [e["payload"] for e in events(session_dir(workspace, "a"))
               if e["topic"] == "approval.decided"]
    assert [(d["decision"], d["by"], d["channel"]) for d in decided] == [
        ("deny", "human", "telegram")]
    assert_no_token(workspace, out, err)
