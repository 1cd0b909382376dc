"""Humans through the CLI channel: durable questions, the loop-level block and its
timeout policies, the in-run ask, kill -9 during a block, guidance in the prompt."""
from __future__ import annotations

import json
import multiprocessing
import signal
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

from support import (DONE, EVIDENCE, events, finish, held, metadata, only_session, plan,
                     prompts, question_files, ralph, recorded, script_agent, session_dir,
                     spawn, wait_for, work_dir)
from support import start as start_demo


def pending_qid(sd: Path) -> str:
    def find():
        qs = [q for q in question_files(sd) if q["status"] == "pending"] if sd.exists() else []
        return qs[0]["id"] if qs else None
    return wait_for(find)


def start(workspace, steps, config=None, sid="h", env=None):
    return start_demo(workspace, steps, objective="human objective", sid=sid, config=config,
                      env=env)


ASKS = [plan("t1"),
        {"role": "executor", "attempt": 1, "emit": [
            {"topic": "human.interact", "json": {"text": "Which database?",
                                                 "options": ["postgres", "sqlite"]}}]},
        *DONE]


def test_loop_block_answered_from_the_cli(workspace):
    proc = start(workspace, ASKS, {"RObot": {"timeout_seconds": 60}})
    sd = session_dir(workspace, "h")
    qid = pending_qid(sd)
    # the wait is what is proven: while the question waits, no agent runs
    time.sleep(0.5)
    assert len(prompts(sd, "executor", "t1")) == 1
    assert metadata(sd)["pending_question"] == qid
    view = json.loads(ralph(workspace, "session", "status", "h", "--json").stdout)
    assert view["pending_questions"][0]["id"] == qid
    assert "ralph session answer h" in ralph(workspace, "session", "status", "h").stdout
    r = ralph(workspace, "session", "answer", "h", "postgres")
    assert r.returncode == 0, r.stderr
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    q = question_files(sd)[0]
    assert q["status"] == "answered" and q["options"] == ["postgres", "sqlite"]
    assert q["context"] == {"session": "h", "state": "EXECUTING_BATCH", "iteration": 1,
                            "role": "executor", "task": "t1"}
    assert yaml.safe_load((sd / f"answers/{qid}.yaml").read_text())["text"] == "postgres"
    second = prompts(sd, "executor", "t1")[1]
    assert "human.response" in second and "postgres" in second
    # the first answer wins; a second is refused and changes nothing
    r = ralph(workspace, "session", "answer", "h", "sqlite", "--question", qid)
    assert r.returncode == 2 and "already answered" in r.stderr
    assert yaml.safe_load((sd / f"answers/{qid}.yaml").read_text())["text"] == "postgres"
    topics = [e["topic"] for e in events(sd)]
    assert topics.count("human.question") == 1 and topics.count("human.response") == 1


def _answer(args):
    session_dir, qid, text = args
    from ralph.session_store import BadInput, questions
    try:
        questions.answer(session_dir, qid, text, now=datetime.now(timezone.utc))
        return text
    except BadInput:
        return None


def test_eight_answerers_exactly_one_wins(workspace):
    from ralph.session_store import create, questions
    now = datetime.now(timezone.utc)
    session = create(str(workspace), "obj", now=now, session_id="race")
    q = questions.ask(session.dir, questions.Question(
        id="q1", text="?", asked_at=now, deadline=now, on_timeout="continue",
        context=questions.QuestionContext(session="race", state="PLANNING", iteration=1)))
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        results = pool.map(_answer, [(session.dir, q.id, f"answer-{i}") for i in range(8)])
    winners = [r for r in results if r]
    assert len(winners) == 1
    assert questions.read_answer(session.dir, "q1").text == winners[0]


def test_several_pending_need_a_question_id(workspace):
    from ralph.session_store import create, questions
    now = datetime.now(timezone.utc)
    session = create(str(workspace), "obj", now=now, session_id="two")
    for qid in ("qa", "qb"):
        questions.ask(session.dir, questions.Question(
            id=qid, text=qid, asked_at=now, deadline=now, on_timeout="continue",
            context=questions.QuestionContext(session="two", state="PLANNING", iteration=1)))
    r = ralph(workspace, "session", "answer", "two", "x")
    assert r.returncode == 2 and "qa" in r.stderr and "qb" in r.stderr
    assert ralph(workspace, "session", "answer", "two", "x", "--question", "qb").returncode == 0
    assert ralph(workspace, "session", "answer", "two", "x").returncode == 0  # only qa left...
    r = ralph(workspace, "session", "answer", "two", "x", "--question", "nope")
    assert r.returncode == 2 and "unknown question" in r.stderr


def test_timeout_continue_tells_the_next_prompt(workspace):
    # a real 1 s timeout: the one test of its wiring through the real `ralph` (the
    # policies, a deadline passing while down: on the frozen clock, test_deadlines.py)
    proc = start(workspace, ASKS, {"RObot": {"timeout_seconds": 1, "on_timeout": "continue"}})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    sd = only_session(workspace)
    assert question_files(sd)[0]["status"] == "timed_out"
    second = prompts(sd, "executor", "t1")[1]
    assert "human.timeout" in second and "Which database?" in second
    assert [e["topic"] for e in events(sd)].count("human.timeout") == 1


def test_kill_during_block_resumes_into_the_same_block(workspace):
    proc = start(workspace, ASKS, {"RObot": {"timeout_seconds": 120}})
    sd = session_dir(workspace, "h")
    qid = pending_qid(sd)
    deadline = question_files(sd)[0]["deadline"]
    wait_for(lambda: metadata(sd)["pending_question"] == qid)   # in its block
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    resumed = spawn(workspace, "session", "resume", "h")
    wait_for(lambda: ralph(workspace, "session", "list", "--json").stdout.count('"running": true'))
    # the wait is what is proven: back in its block a while, it asked no second question
    time.sleep(0.3)
    assert [q["id"] for q in question_files(sd)] == [qid]          # same QID
    assert question_files(sd)[0]["deadline"] == deadline            # same deadline
    assert ralph(workspace, "session", "answer", "h", "postgres").returncode == 0
    out, err = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, out + err
    assert "postgres" in prompts(sd, "executor", "t1")[1]


def test_sigint_during_block_leaves_the_question_pending(workspace):
    proc = start(workspace, ASKS, {"RObot": {"timeout_seconds": 120}})
    sd = session_dir(workspace, "h")
    qid = pending_qid(sd)
    wait_for(lambda: metadata(sd)["pending_question"] == qid)   # in its block
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, out + err
    assert question_files(sd)[0]["status"] == "pending"
    assert ralph(workspace, "session", "answer", "h", "postgres", "--question", qid).returncode == 0
    r = ralph(workspace, "session", "resume", "h")
    assert r.returncode == 0, r.stdout + r.stderr


def test_in_run_ask_answered_and_timed_out(workspace):
    steps = [plan("t1", "t2"),
             {"role": "executor", "task": "t1", "ask": {"question": "Name?", "timeout": 60},
              "write": {"name.txt": "{answer}"},
              "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
             {"role": "executor", "task": "t2", "ask": {"question": "Color?", "timeout": 1,
                                                       "default": "blue"},
              "write": {"color.txt": "{answer}"},
              "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
             *DONE]
    proc = start(workspace, steps)
    sd = session_dir(workspace, "h")
    qid = pending_qid(sd)
    assert question_files(sd)[0]["kind"] == "in_run"
    assert ralph(workspace, "session", "answer", "h", "Ada").returncode == 0
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert (workspace / ".ralph-demo/name.txt").read_text() == "Ada"
    assert (workspace / ".ralph-demo/color.txt").read_text() == "blue"   # the default, after exit 3
    statuses = {q["text"]: q["status"] for q in question_files(sd)}
    assert statuses == {"Name?": "answered", "Color?": "timed_out"}
    assert qid


ASKER = """
    record("quick", ralph("tools", "interact", "ask", "Quick?", "--timeout", "0.5",
                          "--default", "no"))
    asker = subprocess.Popen([sys.executable, "-m", "ralph.engine", "tools", "interact", "ask",
                              "Really?", "--timeout", "60"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    hold("asked")   # until the test sees it pending (no run sees the control plane)
    # the agent answers its own question: refused, with its environment or without
    record("self", [ralph("session", "answer", "yes"),
                    ralph("session", "answer", "yes", **{k: None for k in os.environ
                                                          if k.startswith("RALPH_")})])
    out, err = asker.communicate(timeout=90)
    record("really", {"code": asker.returncode, "out": out, "err": err})
    record("progress", ralph("tools", "interact", "progress", "halfway there"))
"""


def test_interact_ask_cli_exit_codes(workspace):
    """`ralph tools interact ask` inside a run: 3 and the default on its timeout, 0 and
    the human's answer; the agent cannot answer it itself; outside a run it is refused."""
    script_agent(workspace, ASKER, {"RObot": {"timeout_seconds": 120}})
    proc = spawn(workspace, "session", "start", "obj", "--id", "cli")
    sd = session_dir(workspace, "cli")
    with held(workspace, "asked", "cli"):
        qid = wait_for(lambda: [q["id"] for q in question_files(sd)
                                if q["status"] == "pending"])
    assert len(qid) == 1
    tried = recorded(workspace, "self", "cli")
    for r in tried:
        assert r["code"] == 2 and "refused inside" in r["err"], r
        assert len(r["err"].strip().splitlines()) == 1, r
    # a terminal is no agent run: it has nobody to ask for
    r = ralph(workspace, "tools", "interact", "ask", "From a terminal?", "--timeout", "5",
              "--session", "cli")
    assert r.returncode == 2 and "agent runs only" in r.stderr, r.stderr
    assert ralph(workspace, "session", "answer", "cli", "yes", "--question", qid[0]
                 ).returncode == 0
    code, out, err = finish(proc)
    assert code == 0, out + err
    quick, really = recorded(workspace, "quick", "cli"), recorded(workspace, "really", "cli")
    assert quick["code"] == 3 and quick["out"].strip() == "no", quick
    assert really["code"] == 0 and really["out"].strip() == "yes", really
    assert recorded(workspace, "progress", "cli")["code"] == 0
    assert {q["text"]: q["status"] for q in question_files(sd)} == {
        "Quick?": "timed_out", "Really?": "answered"}
    evs = events(sd)
    progress = [e for e in evs if e["topic"] == "human.progress"]
    assert [(e["payload"], e["source"]) for e in progress] == [("halfway there", "executor")]
    refused = [e["payload"]["command"] for e in evs if e["topic"] == "cli.refused"]
    assert refused == ["session answer", "session answer"]
    assert [(e["payload"]["id"], e["payload"]["answer"]) for e in evs
            if e["topic"] == "human.response"] == [(qid[0], "yes")]


def test_guidance_is_squashed_numbered_and_recorded(workspace):
    script_agent(workspace, 'hold("told")')
    proc = spawn(workspace, "session", "start", "human objective", "--id", "h")
    sd = session_dir(workspace, "h")
    with held(workspace, "told", "h"):   # while the executor runs
        for message in ("use tabs", "target Python 3.11"):
            assert ralph(workspace, "signal", "info", message, "--session", "h").returncode == 0
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    reviewer = prompts(sd, "reviewer", "t1")[0]
    assert "## ROBOT GUIDANCE\n\n1. use tabs\n2. target Python 3.11\n" in reviewer
    order = [reviewer.index(h) for h in ("## OBJECTIVE", "## ROBOT GUIDANCE", "## PENDING EVENTS")]
    assert order == sorted(order)
    # used in one prompt only
    assert "use tabs" not in prompts(sd, "planner", iteration=2)[0]
    pad = (work_dir(sd) / "scratchpad.md").read_text()
    assert "use tabs" in pad and "target Python 3.11" in pad


FALLBACK_OPTIONS = ["Continue autonomously", "Continue, but check in with me before each task",
                    "Pause the session"]


def _asking(workspace, *qids, options=FALLBACK_OPTIONS) -> Path:
    """A session (no engine) with a pending question per id, each with `options`."""
    from datetime import timedelta

    from ralph.session_store import create, questions
    asked = datetime.now(timezone.utc)
    session = create(str(workspace), "obj", now=asked, session_id="q")
    for qid in qids:
        questions.ask(session.dir, questions.Question(
            id=qid, text="What now?\n1. ...", asked_at=asked,
            deadline=asked + timedelta(hours=1), on_timeout="continue", options=list(options),
            context=questions.QuestionContext(session="q", state="EXECUTING_BATCH",
                                              iteration=1)))
    return Path(session.dir)


def _stored(sd: Path, qid: str) -> str | None:
    path = sd / f"answers/{qid}.yaml"
    return yaml.safe_load(path.read_text())["text"] if path.exists() else None


def test_options_are_answered_by_number_text_or_unique_prefix(workspace):
    """Issue 13, item 3: "3" answers "3. Pause the session"; so do its text in any case
    and a unique prefix. The option's text is what is stored, from any channel."""
    sd = _asking(workspace, "q1", "q2", "q3", "q4", "q5", "q6")
    for qid, given in (("q1", "3"), ("q2", "pause the SESSION"), ("q3", "  pau")):
        r = ralph(workspace, "session", "answer", "q", given, "--question", qid)
        assert r.returncode == 0, r.stderr
        assert _stored(sd, qid) == "Pause the session"
        assert "'Pause the session'" in r.stdout
    # a prefix of two options is refused in one line naming both, and writes nothing
    r = ralph(workspace, "session", "answer", "q", "continue", "--question", "q4")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "1. 'Continue autonomously'" in r.stderr and "2. 'Continue, but" in r.stderr
    assert _stored(sd, "q4") is None
    assert ralph(workspace, "session", "answer", "q", "Continue,", "--question",
                 "q4").returncode == 0
    assert _stored(sd, "q4") == FALLBACK_OPTIONS[1]
    # free text that names no option is a human's own answer: kept as written
    assert ralph(workspace, "session", "answer", "q", "use postgres, then go on",
                 "--question", "q5").returncode == 0
    assert _stored(sd, "q5") == "use postgres, then go on"
    # the store resolves it, so Telegram (and any channel) gets the same
    from ralph.session_store import questions
    given = questions.answer(str(sd), "q6", "1", now=datetime.now(timezone.utc),
                             channel="telegram")
    assert given.text == "Continue autonomously" == _stored(sd, "q6")


def test_a_second_answer_without_question_says_already_answered(workspace):
    """Issue 13, item 12: the second answer is refused as "already answered", not as
    "no pending question"; the first stays."""
    sd = _asking(workspace, "q1")
    assert ralph(workspace, "session", "answer", "q", "2").returncode == 0
    r = ralph(workspace, "session", "answer", "q", "1")
    assert r.returncode == 2 and "already answered" in r.stderr, r.stderr
    assert _stored(sd, "q1") == FALLBACK_OPTIONS[1]
