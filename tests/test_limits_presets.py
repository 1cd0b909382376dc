"""How each preset reads a usage limit and its conversation's id from its CLI's output.

The fast tests read the outputs recorded in tests/agents/LIMITS.md (and their variants:
another day, a weekly limit, another zone, no reset) and hostile garbage, which never
raises. The slow ones run the real CLI binaries against the scripted model server at a
limit, read what they really printed, and continue the conversation once it is over.
"""
from __future__ import annotations

import json
import random
import subprocess
import time
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from ralph.engine.agents.presets import Claude, Codex, Gemini, McpServer, RunEnd, RunSetup
from support.agents import Rig
from support.model_server import Brain, Say, Shell, Turn

UTC = timezone.utc
NOW = datetime(2026, 11, 26, 21, 0, 0, tzinfo=UTC)


def setup(tmp_path, conversation=None, mcp=None) -> RunSetup:
    return RunSetup(log_base=str(tmp_path / "run"), work_dir=str(tmp_path),
                    ask_timeout_seconds=60, mcp=mcp, conversation=conversation)


def end(stdout="", stderr="", exit_code=1, now=NOW) -> RunEnd:
    return RunEnd(stdout, stderr, exit_code, now)


# --- Claude Code: recorded in LIMITS.md §1.3 ---

SESSION = "78d1088f-5d6c-4b0e-9a43-0c1f2e3d4b5a"
RESETS_AT = 1795731404   # 2026-11-26 22:16:44 UTC


def claude_subscriber(result="You've hit your 5-hour limit · resets 10:16pm (UTC)",
                      resets_at=RESETS_AT) -> str:
    info = {"status": "rejected", "resetsAt": resets_at, "rateLimitType": "five_hour",
            "isUsingOverage": False}
    return "\n".join(json.dumps(line) for line in (
        {"type": "system", "subtype": "init", "cwd": "/ws", "session_id": SESSION},
        {"type": "rate_limit_event", "rate_limit_info": {**info, "unifiedWindows": {
            "five_hour": {"utilization": 1, "resetsAt": resets_at, "status": "rejected"}}},
         "uuid": "u1", "session_id": SESSION},
        {"type": "assistant", "message": {"model": "<synthetic>", "content": [
            {"type": "text", "text": result}]}, "session_id": SESSION, "error": "rate_limit",
         "is_api_error_message": True, "api_error_status": 429,
         "api_error": "usage_limit_reached", "api_error_params": {"rate_limit_info": info},
         "api_error_type": "rate_limit_error"},
        {"type": "result", "subtype": "success", "is_error": True,
         "terminal_reason": "api_error", "api_error_status": 429,
         "api_error_type": "rate_limit_error", "api_error": "usage_limit_reached",
         "result": result, "session_id": SESSION, "num_turns": 1, "total_cost_usd": 0}))


def claude_text_only(result: str) -> str:
    """The subscriber's lines with no epoch anywhere: only the words say the reset."""
    return "\n".join(json.dumps(line) for line in (
        {"type": "system", "subtype": "init", "session_id": SESSION},
        {"type": "result", "subtype": "success", "is_error": True, "api_error_status": 429,
         "api_error": "usage_limit_reached", "result": result, "session_id": SESSION}))


CLAUDE_API_KEY = "\n".join(json.dumps(line) for line in (
    {"type": "system", "subtype": "init", "session_id": "e4586107-aaaa-bbbb-cccc-000000000001"},
    {"type": "assistant", "message": {"model": "<synthetic>", "content": [{
        "type": "text", "text": "API Error: Request rejected (429) · This request would exceed "
                                "your account's rate limit. Please try again later."}]},
     "session_id": "e4586107-aaaa-bbbb-cccc-000000000001", "error": "rate_limit",
     "request_id": "req_x", "is_api_error_message": True, "api_error_status": 429,
     "api_error_type": "rate_limit_error"},
    {"type": "result", "subtype": "success", "is_error": True, "terminal_reason": "api_error",
     "api_error_status": 429, "api_error_type": "rate_limit_error",
     "result": "API Error: Request rejected (429) · This request would exceed your account's "
               "rate limit. Please try again later.",
     "session_id": "e4586107-aaaa-bbbb-cccc-000000000001", "num_turns": 1}))


def test_claude_subscriber_limit_resets_at_its_epoch_and_names_its_session():
    limit = Claude().limit(end(claude_subscriber()))
    assert limit.until == datetime.fromtimestamp(RESETS_AT, UTC)
    assert limit.text == "You've hit your 5-hour limit · resets 10:16pm (UTC)"
    assert Claude().conversation(end(claude_subscriber())) == SESSION


def test_claude_api_key_limit_has_no_reset():
    limit = Claude().limit(end(CLAUDE_API_KEY))
    assert limit.until is None
    assert limit.text.startswith("API Error: Request rejected (429)")
    assert Claude().conversation(end(CLAUDE_API_KEY)) == "e4586107-aaaa-bbbb-cccc-000000000001"


@pytest.mark.parametrize("said, now, until", [
    # a time of day is the next one: later today, or tomorrow once it has gone by
    ("resets 10:16pm (UTC)", NOW, datetime(2026, 11, 26, 22, 16, tzinfo=UTC)),
    ("resets 10:16pm (UTC)", NOW.replace(hour=23), datetime(2026, 11, 27, 22, 16, tzinfo=UTC)),
    ("resets 5am (UTC)", NOW, datetime(2026, 11, 27, 5, 0, tzinfo=UTC)),
    ("resets 12am (UTC)", NOW, datetime(2026, 11, 27, 0, 0, tzinfo=UTC)),
    ("resets 12:30pm (UTC)", NOW, datetime(2026, 11, 27, 12, 30, tzinfo=UTC)),
    # a weekly limit, more than a day ahead, in the user's zone
    ("You've hit your weekly limit · resets Nov 29, 11:17pm (Europe/Paris)", NOW,
     datetime(2026, 11, 29, 23, 17, tzinfo=ZoneInfo("Europe/Paris"))),
    ("resets Jan 2, 2027, 9am (America/New_York)", NOW,
     datetime(2027, 1, 2, 9, 0, tzinfo=ZoneInfo("America/New_York"))),
    # the minute it said has begun: the CLI prints no seconds, so the end of that minute
    ("resets 10:16pm (UTC)", NOW.replace(hour=22, minute=16, second=30),
     datetime(2026, 11, 26, 22, 17, tzinfo=UTC)),
])
def test_claude_reset_said_only_in_words(said, now, until):
    limit = Claude().limit(end(claude_text_only(f"You've hit your 5-hour limit · {said}"),
                               now=now))
    assert limit.until == until


def test_claude_limit_with_words_that_say_no_reset_waits_the_configured_time():
    limit = Claude().limit(end(claude_text_only("You've hit your Opus limit")))
    assert limit.until is None and limit.text == "You've hit your Opus limit"


def test_claude_runs_that_met_no_limit():
    ok = {"type": "result", "subtype": "success", "is_error": False, "result": "done",
          "session_id": SESSION}
    warning = {"type": "rate_limit_event", "session_id": SESSION, "rate_limit_info": {
        "status": "allowed_warning", "resetsAt": RESETS_AT, "rateLimitType": "seven_day",
        "utilization": 0.9}}
    overloaded = {"type": "result", "subtype": "success", "is_error": True,
                  "api_error_status": 529, "api_error_type": "overloaded_error",
                  "result": "API Error: 529 Overloaded", "session_id": SESSION}
    # a rejected window the run went on past (overage): its result is no error
    rejected = json.loads(claude_subscriber().splitlines()[1])
    for lines in ([warning, ok], [overloaded], [rejected, ok], [ok]):
        assert Claude().limit(end("\n".join(map(json.dumps, lines)))) is None
    assert Claude().limit(end("")) is None


def test_claude_continues_a_conversation_with_resume(tmp_path):
    assert "--resume" not in Claude().argv([], setup(tmp_path))
    argv = Claude().argv(["--model", "opus"], setup(tmp_path, SESSION))
    assert argv[argv.index("--resume") + 1] == SESSION
    # the human's arguments as given, after the resume (Claude's --settings follow them)
    assert argv[argv.index("--model"):][:2] == ["--model", "opus"]
    assert argv.index("--resume") < argv.index("--model")
    assert Claude.resumes


# --- Codex: recorded in LIMITS.md §2.2 ---

THREAD = "01a21944-283e-7050-a95f-ff8efe7c2a2c"


def codex_output(message: str) -> str:
    return "\n".join(json.dumps(line, ensure_ascii=False) for line in (
        {"type": "thread.started", "thread_id": THREAD},
        {"type": "turn.started"},
        {"type": "error", "message": message},
        {"type": "turn.failed", "error": {"message": message}}))


PLUS = ("You’ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit "
        "https://chatgpt.com/settings/usage to purchase more credits or try again at 10:10 PM.")


@pytest.mark.parametrize("message, now, until", [
    (PLUS, NOW, datetime(2026, 11, 26, 22, 10, tzinfo=UTC)),
    (PLUS, NOW.replace(hour=23), datetime(2026, 11, 27, 22, 10, tzinfo=UTC)),
    (PLUS, NOW.replace(hour=22, minute=10, second=20), datetime(2026, 11, 26, 22, 11, tzinfo=UTC)),
    ("You’ve hit your usage limit. Try again at Nov 27th, 2026 10:10 PM.", NOW,
     datetime(2026, 11, 27, 22, 10, tzinfo=UTC)),
    ("You’ve hit your usage limit. Try again at Dec 1st, 2026 3:28 AM.", NOW,
     datetime(2026, 12, 1, 3, 28, tzinfo=UTC)),
    ("You've hit your usage limit. Try again at 12:05 AM.", NOW,
     datetime(2026, 11, 27, 0, 5, tzinfo=UTC)),
    # no time said (free plan, no resets_at), or another 429 it gave up on
    ("You’ve hit your usage limit. Try again later.", NOW, None),
    ("You’ve hit your usage limit. Upgrade to Plus to continue using Codex.", NOW, None),
    ("exceeded retry limit, last status: 429 Too Many Requests, request id: abc", NOW, None),
])
def test_codex_limit(message, now, until):
    limit = Codex().limit(end(codex_output(message), now=now))
    assert limit.until == until and limit.text == message
    assert Codex().conversation(end(codex_output(message))) == THREAD


def test_codex_runs_that_met_no_limit():
    said = {"type": "item.completed", "item": {"type": "agent_message", "text": PLUS}}
    done = {"type": "turn.completed", "usage": {"input_tokens": 1, "output_tokens": 1}}
    other = {"type": "turn.failed", "error": {"message": "stream disconnected before completion"}}
    for lines in ([said, done], [other], [{"type": "error", "message": PLUS}, done]):
        assert Codex().limit(end("\n".join(map(json.dumps, lines)))) is None


def test_codex_continues_a_thread_after_its_flags_and_says_times_in_utc(tmp_path):
    mcp = McpServer("/bin/ralph", ["mcp"], {"RALPH_X": "1"})
    argv = Codex().argv(["-m", "o3"], setup(tmp_path, THREAD, mcp))
    assert argv[-3:] == ["resume", THREAD, "-"]
    flags = argv[:-3]
    assert "--sandbox" in flags and "-c" in flags and flags[-2:] == ["-m", "o3"]
    assert Codex().argv([], setup(tmp_path))[-1] == "-"
    assert "resume" not in Codex().argv([], setup(tmp_path))
    assert Codex().env(setup(tmp_path)) == {"TZ": "UTC"}


# --- Gemini CLI: recorded in LIMITS.md §3.3 ---

GEMINI_SESSION = "c598500f-3a4c-41fb-9b02-9002ebacd0f8"


def gemini_stderr(message: str, code=429) -> str:
    error = json.dumps({"session_id": GEMINI_SESSION, "error": {
        "type": "Error", "message": message, "code": code}}, indent=2)
    return ("YOLO mode is enabled. All tool calls will be automatically approved.\n"
            "Error when talking to Gemini API Full report available at: "
            "/tmp/gemini-client-error-Turn.run-sendMessageStream-2026.json "
            "TerminalQuotaError: " + message + "\n"
            "    at classifyGoogleError (file:///x/chunk-JDPZ4CE3.js:1:2) {\n"
            "  cause: { code: 429, message: 'x', details: [ [Object] ] },\n"
            "  retryDelayMs: 400000\n}\n" + error + "\n")


@pytest.mark.parametrize("message, until", [
    ("You have exhausted your daily quota on this model.", None),
    ("Resource has been exhausted (e.g. check quota).\nSuggested retry after 400s.",
     NOW + timedelta(seconds=400)),
    ("Quota exceeded for metric: x, limit: 250\nPlease retry in 12.3s.",
     NOW + timedelta(seconds=12.3)),
    ("Resource has been exhausted (e.g. check quota).\nSuggested retry after 900ms.",
     NOW + timedelta(milliseconds=900)),
])
def test_gemini_limit(message, until):
    limit = Gemini().limit(end(stderr=gemini_stderr(message), exit_code=173))
    assert limit.until == until and limit.text == message


def test_gemini_limit_by_its_code_or_its_exit_alone():
    message = "Resource has been exhausted (e.g. check quota).\nSuggested retry after 400s."
    assert Gemini().limit(end(stderr=gemini_stderr(message), exit_code=1)).until == \
        NOW + timedelta(seconds=400)
    bare = Gemini().limit(end(stderr="TerminalQuotaError: Suggested retry after 400s.\n",
                              exit_code=173))
    assert bare.until == NOW + timedelta(seconds=400)


def test_gemini_runs_that_met_no_limit():
    ok = json.dumps({"session_id": GEMINI_SESSION, "response": "done", "stats": {}}, indent=2)
    assert Gemini().limit(end(stdout=ok, exit_code=0)) is None
    assert Gemini().limit(end(stderr=gemini_stderr("bad request", code=400), exit_code=1)) \
        is None
    assert Gemini().limit(end(exit_code=None)) is None


def gemini_chat(home, session: str, *records: dict) -> None:
    """The session file as Gemini CLI 0.61 writes it (JSON lines, no spaces)."""
    chats = home / ".gemini" / "tmp" / "ws" / "chats"
    chats.mkdir(parents=True, exist_ok=True)
    (chats / f"session-2026-11-26T21-25-{session[:8]}.jsonl").write_text("".join(
        json.dumps(r, separators=(",", ":")) + "\n" for r in (
            {"sessionId": session, "projectHash": "a171", "kind": "main"}, *records)))


def test_gemini_conversation_is_one_it_can_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMINI_CLI_HOME", str(tmp_path))
    limited = end(stderr=gemini_stderr("You have exhausted your daily quota on this model."))
    ok = end(stdout="Loaded.\n" + json.dumps({"session_id": GEMINI_SESSION, "response": "x"},
                                             indent=2), exit_code=0)
    assert Gemini().conversation(limited) is None
    # a limit on the first request keeps only the prompt: nothing to resume, a fresh start
    prompt = {"id": "1", "type": "user", "content": [{"text": 'say "type":"gemini"'}]}
    gemini_chat(tmp_path, GEMINI_SESSION, prompt)
    assert Gemini().conversation(limited) is None
    gemini_chat(tmp_path, GEMINI_SESSION, prompt, {"id": "2", "type": "gemini", "content": "",
                                                   "toolCalls": [{"name": "run_shell_command"}]})
    assert Gemini().conversation(limited) == GEMINI_SESSION
    assert Gemini().conversation(ok) == GEMINI_SESSION


def test_gemini_continues_a_session_with_resume(tmp_path):
    argv = Gemini().argv([], setup(tmp_path, GEMINI_SESSION))
    assert argv[argv.index("--resume") + 1] == GEMINI_SESSION
    assert "--resume" not in Gemini().argv([], setup(tmp_path))


# --- hostile output never raises ---

@pytest.mark.parametrize("resets_at", [
    10**20, -10**20, 10**400, float("nan"), float("inf"), "1795731404", True, None, [], {},
    1795731404000, 0, -1, 1.5e308])
def test_claude_reset_out_of_range_is_no_reset(resets_at):
    text = claude_subscriber(result="You've hit your 5-hour limit", resets_at=resets_at)
    assert Claude().limit(end(text)).until is None


@pytest.mark.parametrize("said", [
    "resets 99:99pm (UTC)", "resets 0am (UTC)", "resets 13pm (UTC)", "resets Feb 31, 5am (UTC)",
    "resets Foo 3, 5am (UTC)", "resets 5am (Nowhere/Land)", "resets 5am (Europe)",
    "resets Nov 29, 9999, 5am (UTC)", "resets 5am (" + "A" * 64 + ")", "resets 5am ()"])
def test_claude_nonsense_reset_words_are_no_reset(said):
    assert Claude().limit(end(claude_text_only(said))).until is None


@pytest.mark.parametrize("message", [
    "You’ve hit your usage limit. Try again at 13:99 PM.",
    "You’ve hit your usage limit. Try again at 0:10 AM.",
    "You’ve hit your usage limit. Try again at Feb 30th, 2026 10:10 PM.",
    "You’ve hit your usage limit. Try again at Nov 27th, 9999 10:10 PM.",
    "You’ve hit your usage limit. Try again at Nov 27th, 0001 10:10 PM."])
def test_codex_nonsense_reset_words_are_no_reset(message):
    assert Codex().limit(end(codex_output(message))).until is None


@pytest.mark.parametrize("delay", ["99999999999s", "1.5.5s", "34560001s", "s", "1e9s"])
def test_gemini_nonsense_delays_are_no_reset(delay):
    message = f"Resource has been exhausted.\nSuggested retry after {delay}."
    assert Gemini().limit(end(stderr=gemini_stderr(message), exit_code=173)).until is None


@pytest.mark.parametrize("value", [
    "--dangerously-skip-permissions", "-", "", "a b", "x" * 200, 42, None, ["id"], "../../etc",
    "id\nrm -rf /"])
def test_a_conversation_id_that_could_be_anything_else_is_none(value, tmp_path):
    assert Claude().conversation(end(json.dumps({"type": "system", "session_id": value}))) \
        is None
    assert Codex().conversation(end(json.dumps({"type": "thread.started", "thread_id": value}))) \
        is None
    for preset in (Claude(), Codex(), Gemini()):
        argv = preset.argv([], setup(tmp_path, value if isinstance(value, str) else None))
        assert "--resume" not in argv and "resume" not in argv


def test_garbage_never_raises():
    recorded = [claude_subscriber(), CLAUDE_API_KEY, codex_output(PLUS),
                gemini_stderr("Suggested retry after 400s."), "{" * 10_000, "\n{" * 2_000,
                '{"type": "result", "is_error": true, "api_error_status": 429, "result": 7}',
                '{"type": "turn.failed", "error": "You’ve hit your usage limit"}',
                '{"type": "rate_limit_event", "rate_limit_info": [1]}',
                '{"type": "assistant", "message": {"content": [{"text": 5}, 3]}, '
                '"api_error": "usage_limit_reached"}',
                '{"error": {"code": 429, "message": {"x": 1}}, "session_id": {"a": 1}}']
    rng = random.Random(22)
    samples = list(recorded)
    for _ in range(150):
        text = rng.choice(recorded)
        cut = rng.randrange(len(text) + 1)
        samples.append(text[:cut] + rng.choice(["", "\n", "{", "\"", "\udcff", "NaN", "9" * 400])
                       + text[cut + rng.randrange(20):])
    naive = datetime(2026, 11, 26, 21, 0)
    for text in samples:
        for preset in (Claude(), Codex(), Gemini()):
            for now in (NOW, naive):
                for run in (end(text, now=now), end(stderr=text, exit_code=173, now=now)):
                    preset.limit(run)
                    preset.conversation(run)


# --- the real CLIs at the scripted server's limit ---

def run_cli(rig: Rig, preset, prompt: str, conversation: str | None = None,
            tmp=None) -> tuple[subprocess.CompletedProcess, RunEnd]:
    """Run the CLI as ralph's CommandAgent would: the preset's argv and env over the
    rig's, the prompt on stdin, in the workspace."""
    run_setup = setup(tmp, conversation)
    done = subprocess.run(preset.argv([], run_setup), input=prompt, cwd=rig.ws,
                          env={**rig.env, **preset.env(run_setup)}, capture_output=True,
                          text=True, timeout=240)
    return done, RunEnd(done.stdout, done.stderr, done.returncode, datetime.now(UTC))


PROMPT = "## OBJECTIVE\nRemember the word kumquat.\n\n## ROLE: other\n"


def continues(rig: Rig, preset, conversation: str, tmp) -> None:
    """A run given the conversation continues it: the CLI says the same id, and every
    request the model gets holds the first prompt's word."""
    since = len(rig.server.requests)
    done, later = run_cli(rig, preset, "What was the word?", conversation, tmp=tmp)
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    assert preset.limit(later) is None
    assert preset.conversation(later) == conversation
    bodies = rig.server.bodies()[since:]
    assert bodies and all("kumquat" in body for body in bodies)


@pytest.fixture
def rigs(tmp_path):
    made = []

    def make(cli: str, brain: Brain | None = None, subscriber: bool = False) -> Rig:
        made.append(Rig(cli, tmp_path, brain, subscriber=subscriber))
        return made[-1]
    yield make
    for r in made:
        r.close()


@pytest.mark.slow
def test_real_claude_subscriber_limit_then_resume(rigs, tmp_path):
    rig = rigs("claude", subscriber=True)
    reset = int(time.time()) + 3600
    rig.server.limit(reset)
    done, first = run_cli(rig, Claude(), PROMPT, tmp=tmp_path)
    assert done.returncode == 1 and rig.server.refused == 1
    limit = Claude().limit(first)
    assert limit.until == datetime.fromtimestamp(reset, UTC)
    assert "5-hour limit" in limit.text
    session = Claude().conversation(first)
    assert session
    rig.server.lift()   # the limit is over (an hour early)
    continues(rig, Claude(), session, tmp_path)


@pytest.mark.slow
def test_real_claude_api_key_limit_has_no_reset(rigs, tmp_path):
    rig = rigs("claude")
    rig.server.limit(int(time.time()) + 60)
    done, first = run_cli(rig, Claude(), PROMPT, tmp=tmp_path)
    limit = Claude().limit(first)
    assert done.returncode == 1 and rig.server.refused == 1
    assert limit.until is None and "429" in limit.text


@pytest.mark.slow
def test_real_codex_limit_then_resume(rigs, tmp_path):
    rig = rigs("codex")
    # codex says the reset to the minute: the server's is a whole minute ahead
    reset = (int(time.time()) // 60 + 1) * 60
    if reset - time.time() < 15:
        reset += 60
    rig.server.limit(reset, requests=1)
    done, first = run_cli(rig, Codex(), PROMPT, tmp=tmp_path)
    assert done.returncode == 1 and rig.server.refused == 1
    limit = Codex().limit(first)
    assert limit.until == datetime.fromtimestamp(reset, UTC), limit
    thread = Codex().conversation(first)
    assert thread
    continues(rig, Codex(), thread, tmp_path)


class LimitAfterAShellCall(Brain):
    """Answers the first request with a shell call and then meets the limit: Gemini CLI
    keeps a session only once the model has answered."""

    def __init__(self, limit):
        self.limit = limit

    def other(self, turn: Turn):
        if turn.step == 0:
            self.limit()
            return Shell("echo noted")
        return Say("ok")


@pytest.mark.slow
def test_real_gemini_limit_with_a_delay_then_resume(rigs, tmp_path, monkeypatch):
    reset = []
    rig = rigs("gemini", LimitAfterAShellCall(
        lambda: reset.append(int(time.time()) + 400) or rig.server.limit(reset[0])))
    monkeypatch.setenv("HOME", rig.env["HOME"])   # the engine's HOME is its CLI's
    monkeypatch.delenv("GEMINI_CLI_HOME", raising=False)
    done, first = run_cli(rig, Gemini(), PROMPT, tmp=tmp_path)
    assert done.returncode == 173 and rig.server.refused >= 1
    limit = Gemini().limit(first)
    # it says a delay, not a time: the reset is off by the time the CLI took to end after
    # it (seconds on a loaded machine), never by the delay itself
    assert abs(limit.until - datetime.fromtimestamp(reset[0], UTC)) < timedelta(seconds=30)
    session = Gemini().conversation(first)
    assert session
    rig.server.lift()   # the limit is over (400 s early)
    continues(rig, Gemini(), session, tmp_path)


@pytest.mark.slow
def test_real_gemini_daily_quota_on_the_first_request(rigs, tmp_path, monkeypatch):
    rig = rigs("gemini")
    monkeypatch.setenv("HOME", rig.env["HOME"])
    monkeypatch.delenv("GEMINI_CLI_HOME", raising=False)
    # under 5 minutes: said as a daily quota, with no time; counted, not timed, so a slow
    # start of the CLI cannot outlive it: its router's request and its chat's are refused
    rig.server.limit(int(time.time()) + 4, requests=2)
    done, first = run_cli(rig, Gemini(), PROMPT, tmp=tmp_path)
    assert done.returncode == 173
    limit = Gemini().limit(first)
    assert limit.until is None and "daily quota" in limit.text
    assert Gemini().conversation(first) is None   # nothing was saved: start afresh
    done, second = run_cli(rig, Gemini(), PROMPT, tmp=tmp_path)
    assert done.returncode == 0 and Gemini().limit(second) is None
