"""The Telegram channel's parts, one at a time: the router (a pure function, table-driven),
the outbox's wakeups (the shared watcher, against the fake Bot API on loopback), and the
store's undeliverable mark racing the waiter that resolves the question."""
from __future__ import annotations

import asyncio
import io
import random
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from ralph.engine.channels.telegram import router
from ralph.engine.channels.telegram.router import (Answer, Command, Guidance, Ignore, Replied, Say,
                                             route)
from fake_telegram import FakeTelegram
from ralph.session_store import (ChannelFiles, Sessions, append_event, create, load, questions,
                           sessions_root, signals)

TOKEN = "123456:PARTS-MARKER-TOKEN"
CHAT = 111
SESSIONS = frozenset({"A", "B", "s.1"})
HEADER = "Question q7 from session B\nstate PLANNING, iteration 1\n\nWhich one?"


def now() -> datetime:
    return datetime.now(timezone.utc)


# --- the router: what a chat wrote -> one action ---

ROUTES = [
    # (chat, text, replied, expected)
    (999, "postgres", None, Ignore("ignored a message from chat 999 (not in allowed_chat_ids)")),
    (999, "/stop", None, Ignore("ignored a message from chat 999 (not in allowed_chat_ids)")),
    (CHAT, None, None, Say("I only read text messages.")),
    (CHAT, "", None, Say("I only read text messages.")),
    # replies: to a remembered question, to the bot's own question message, to anything else
    (CHAT, "postgres", Replied(question=("A", "q1")), Answer("A", "q1", "postgres")),
    (CHAT, "  keep my spaces ", Replied(question=("A", "q1")), Answer("A", "q1", "  keep my spaces ")),
    (CHAT, "sqlite", Replied(text=HEADER, from_bot=True), Answer("B", "q7", "sqlite")),
    (CHAT, "sqlite", Replied(text=HEADER, from_bot=False), Guidance(None, "sqlite")),
    (CHAT, "sqlite", Replied(text="hello", from_bot=True), Guidance(None, "sqlite")),
    (CHAT, "/status", Replied(question=("A", "q1")), Command("status", None, "")),
    (CHAT, "/frobnicate", Replied(question=("A", "q1")), Answer("A", "q1", "/frobnicate")),
    # commands, with a session named by their first word (with or without @)
    (CHAT, "/help", None, Command("help", None, "")),
    (CHAT, "/start", None, Command("start", None, "")),
    (CHAT, "/STATUS@ralph_test_bot", None, Command("status", None, "")),
    (CHAT, "/tail B 50", None, Command("tail", "B", "50")),
    (CHAT, "/tail @B 50", None, Command("tail", "B", "50")),
    (CHAT, "/tail 50", None, Command("tail", None, "50")),
    (CHAT, "/pause A coffee break", None, Command("pause", "A", "coffee break")),
    (CHAT, "/pause nosuch why", None, Command("pause", None, "nosuch why")),
    (CHAT, "/stop\nA", None, Command("stop", "A", "")),
    (CHAT, "/frobnicate", None, Say("Unknown command /frobnicate. /help lists the commands.")),
    (CHAT, "/", None, Say("Unknown command /. /help lists the commands.")),
    # @SESSION routing
    (CHAT, "@B use tabs", None, Guidance("B", "use tabs")),
    (CHAT, "@s.1: use tabs", None, Guidance("s.1", "use tabs")),
    (CHAT, "@B /stop now", None, Command("stop", "B", "now")),
    (CHAT, "@B /tail A 5", None, Command("tail", "A", "5")),
    (CHAT, "@B", None, Say("What should session B be told? Write \"@B your guidance\".")),
    (CHAT, "@nosuch hello", None,
     Say("There is no session nosuch in this workspace; /status lists them.")),
    # anything else: guidance for the primary session
    (CHAT, "  prefer spaces  ", None, Guidance(None, "prefer spaces")),
    (CHAT, "email me @B later", None, Guidance(None, "email me @B later")),
]


@pytest.mark.parametrize("chat, text, replied, expected", ROUTES)
def test_route(chat, text, replied, expected):
    assert route(chat, text, allowed=[CHAT], sessions=SESSIONS, replied=replied) == expected


def test_every_routed_command_has_a_handler():
    from ralph.engine.channels.telegram.commands import Commands
    for name in router.COMMANDS:
        assert callable(getattr(Commands, "help" if name == "start" else name))


# --- the outbox: woken by the watcher, looking only where something changed ---

def _ask(session_dir: str, session: str, qid: str, text: str) -> None:
    t = now()
    questions.ask(session_dir, questions.Question(
        id=qid, text=text, asked_at=t, deadline=t + timedelta(hours=1), on_timeout="continue",
        context=questions.QuestionContext(session=session, state="PLANNING", iteration=1)))


def test_outbox_wakes_on_changes_and_looks_only_there(tmp_path):
    from ralph.engine.channels.telegram.outbox import Outbox
    from ralph.engine.channels.telegram.settings import Log
    from ralph.engine.channels.telegram.state import BotState
    from ralph.engine.channels.telegram.transport import Transport
    ws = str(tmp_path)
    dirs = {sid: create(ws, f"objective {sid}", now=now(), session_id=sid).dir for sid in "AB"}
    state_file = Path(sessions_root(ws)) / ".telegram/state.yaml"   # where the bot keeps it
    logs: list[str] = []
    looks: list[tuple[set, set]] = []

    async def main(fake: FakeTelegram):
        log = Log(TOKEN, logs.append)

        async def sleep(seconds):
            await asyncio.sleep(seconds)
            return False
        transport = Transport(TOKEN, fake.url, log, sleep)
        assert await transport.connect(asyncio.Event())
        state = BotState(ChannelFiles(ws, "telegram"), Sessions(ws), log)
        outbox = Outbox(ws, [CHAT], transport, state, log, stopping=lambda: False, primary="A")
        look = outbox._look

        def counted(wanted, offsets, skip, notified):
            looks.append((set(wanted), set(offsets)))
            return look(wanted, offsets, skip, notified)
        outbox._look = counted
        await outbox.start()
        tasks = [asyncio.create_task(outbox.run()), asyncio.create_task(outbox.notify_forever())]

        async def sent(fragment: str) -> dict:
            return await asyncio.to_thread(fake.wait_text, fragment, None, 10)
        try:
            await sent("in session A:\nplanned")   # the primary's bus, replayed
            assert looks[0] == ({"A", "B"}, {"A", "B"})
            first = len(looks)
            await asyncio.sleep(0.5)
            assert len(looks) == first, "the outbox looked with nothing changed: a poll"
            # what it does not follow does not wake it: agents' logs, signals, metadata
            log_file = Path(load(ws, "A").work_dir) / "iterations/1/logs/0001-planner.stdout"
            with open(log_file, "a") as out:
                for i in range(200):
                    out.write(f"agent output {i}\n")
                    out.flush()
            await asyncio.to_thread(signals.drop, dirs["A"], "INFO", "a note", now=now())
            session_a = await asyncio.to_thread(load, ws, "A")
            await asyncio.to_thread(session_a.save, now())
            await asyncio.sleep(0.5)
            assert len(looks) == first, looks[first:]

            await asyncio.to_thread(_ask, dirs["B"], "B", "qb1", "Which database?")
            message = await sent("Question qb1 from session B")
            assert message["reply_markup_sent"]["force_reply"] is True
            assert all(w <= {"B"} and o <= {"B"} for w, o in looks[first:]), looks[first:]
            for _ in range(100):   # remembered once the API's answer is back
                if state.question_for(CHAT, message["message_id"]):
                    break
                await asyncio.sleep(0.05)
            assert state.question_for(CHAT, message["message_id"]) == ("B", "qb1")

            first = len(looks)
            await asyncio.to_thread(append_event, dirs["A"], "human.progress", "halfway")
            await sent("in session A:\nhalfway")
            assert all(w <= {"A"} and o <= {"A"} for w, o in looks[first:]), looks[first:]

            # a session that appears later is watched too, with nothing to set up
            c = await asyncio.to_thread(create, ws, "objective C", now=now(), session_id="C")
            await asyncio.to_thread(_ask, c.dir, "C", "qc1", "Tabs or spaces?")
            await sent("Question qc1 from session C")

            # what was sent is not sent again, whatever changes around it
            await asyncio.to_thread(append_event, dirs["B"], "human.progress", "still here")
            await sent("still here")
            assert sum("qb1" in m["text"] for m in fake.messages()) == 1
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await outbox.stop_watching()
            await state.close()
            await transport.close()

    append_event(dirs["A"], "human.progress", "planned")
    append_event(dirs["B"], "human.progress", "not replayed: B is not the primary")
    with FakeTelegram(TOKEN) as fake:
        asyncio.run(main(fake))
        assert not any("not replayed" in m["text"] for m in fake.messages())
    saved = yaml.safe_load(state_file.read_text())
    assert {"session": "B", "question": "qb1"} in saved["messages"].values()
    assert not any(TOKEN.split(":")[1] in line for line in logs)


# --- the undeliverable mark: never a second writer of the question file ---

def test_the_mark_is_a_file_of_its_own_that_moves_the_deadline(tmp_path):
    sdir = create(str(tmp_path), "mark", now=now(), session_id="m").dir
    _ask(sdir, "m", "q1", "Which one?")
    path = Path(sdir) / "questions/q1.yaml"
    before = path.read_bytes()
    at = now()
    assert questions.mark_undeliverable(sdir, "q1", at) is True
    assert questions.mark_undeliverable(sdir, "q1", now()) is False   # once
    assert path.read_bytes() == before   # the question file is its waiter's alone
    q = questions.load_question(sdir, "q1")
    assert q.delivery_failed is True and q.deadline == at
    assert [p.id for p in questions.questions(sdir)] == ["q1"]   # the mark is no question
    # answered first: nothing to mark
    _ask(sdir, "m", "q2", "Another?")
    questions.answer(sdir, "q2", "yes", now=now())
    assert questions.mark_undeliverable(sdir, "q2", now()) is False
    # a session written before the mark existed: the field in the question file still counts
    old = questions.load_question(sdir, "q2")
    old.delivery_failed, old.deadline = True, at
    questions.save_question(sdir, old)
    assert questions.load_question(sdir, "q2").delivery_failed is True


def test_marking_undeliverable_while_the_waiter_resolves_never_regresses(tmp_path):
    """The waiter (the engine's, of an in-run `ask`: it times the question out at its
    deadline, in this thread) and the channel (another thread) race on one question each
    round: the channel gives up on it just before, at or after the waiter's own deadline.
    The question always ends timed_out and stays so, the asker is told so, and a late
    answer to it reaches the next prompt as guidance."""
    from ralph.engine.config import Config
    from ralph.engine.driver import Engine
    from ralph.engine.running.inlet import RunInfo
    from ralph.session_store import outbox
    ws = str(tmp_path)
    sdir = create(ws, "race", now=now(), session_id="r").dir
    engine = Engine(load(ws, "r"), Config(), agent_for=lambda role: None, out=io.StringIO())
    work = engine.session.work_dir
    run = RunInfo("0001-executor-t1", "executor", "t1")
    engine.inlet.start()
    engine.inlet.open_run(run)   # the run's questions come through its outbox
    rng = random.Random(15)
    # from the waiter's deadline: well before, well after, then around it (its resolve
    # takes a write: a channel that rewrote the question file could land inside it)
    offsets = [-0.5, 0.3] + [rng.uniform(-0.004, 0.008) for _ in range(40)]
    marked = []
    for round_, offset in enumerate(offsets):
        asked = threading.Event()
        seen = {q.id for q in questions.questions(sdir)}

        def channel():
            while not asked.is_set():
                new = [q for q in questions.questions(sdir) if q.id not in seen]
                if new:
                    left = (new[0].deadline - now()).total_seconds() + offset
                    # the wait is what is proven: the channel gives up at `offset` from the
                    # deadline the engine waits for in real time (the race)
                    time.sleep(max(0.0, left))
                    marked.append(questions.mark_undeliverable(sdir, new[0].id, now()))
                    return
                time.sleep(0.0005)   # poll: until the engine asked this round's question
        thread = threading.Thread(target=channel)
        thread.start()
        rid = outbox.new_request_id()
        assert outbox.post(work, {"kind": "ask", "id": rid, "run": run.id,
                                  "text": f"Round {round_}?", "default": "left",
                                  "timeout": 0.6 if round_ == 0 else 0.05}) is None
        engine.inlet.drain()   # the engine takes the question
        # the runner's loop: woken by the deadline's timer (or by its own watchers), it
        # serves the questions askers wait for until this one's reply is written
        while (reply := outbox.read_reply(work, run.id, rid)) is None:
            engine.wakeup.wait(0.05)
            engine.wakeup.clear()
            engine.run_questions.serve()
        asked.set()
        thread.join(5)
        assert reply == {"answered": False, "default": "left"}
    engine.inlet.close_run(run.id)
    engine.run_questions.end_run(run.id)
    engine.inlet.stop()
    assert True in marked and False in marked, marked   # both orders happened
    asked_ = questions.questions(sdir)
    assert len(asked_) == len(offsets)
    for q in asked_:
        assert q.status is questions.QuestionStatus.TIMED_OUT, q
        questions.answer(sdir, q.id, f"late for {q.id}", now=now(), channel="telegram")
    engine.desk.deliver_answers()
    late = {g["id"] for g in signals.guidance(sdir)}
    assert late == {f"late-{q.id}" for q in asked_}
    for q in questions.questions(sdir):
        assert q.status is questions.QuestionStatus.TIMED_OUT and q.late_answer_delivered


# --- the commands: a reply to a question, whatever became of the question ---

ANSWER_REPLIES = [
    ("pending: recorded", None, "sqlite", "Answer recorded for question q1 of session A."),
    ("answered already: the first answer wins", "answered", "sqlite",
     "Thank you, but question q1 of session A was already answered (cli): postgres. "
     "Your reply changed nothing."),
    ("cancelled: takes none", "cancelled", "sqlite",
     "Question q1 of session A was cancelled: it takes no answer now."),
    ("an ambiguous option: said why", None, "s",
     "Your answer could not be recorded: answer 's' to q1 matches several options "
     "(2. 'sqlite'; 3. 'spanner'): answer with one's number or more of its text"),
]


@pytest.mark.parametrize("before, text, reply", [row[1:] for row in ANSWER_REPLIES],
                         ids=[row[0] for row in ANSWER_REPLIES])
def test_a_reply_to_a_question(tmp_path, before, text, reply):
    from ralph.engine.channels.telegram.commands import Commands
    from ralph.engine.channels.telegram.settings import Log
    ws = str(tmp_path)
    sdir = create(ws, "objective", now=now(), session_id="A").dir
    _ask(sdir, "A", "q1", "Which database?")
    q = questions.load_question(sdir, "q1")
    q.options = ["postgres", "sqlite", "spanner"]
    questions.save_question(sdir, q)
    if before == "answered":
        questions.answer(sdir, "q1", "postgres", now=now())
    elif before == "cancelled":
        questions.resolve(sdir, q, questions.QuestionStatus.CANCELLED, now())
    commands = Commands(ws, Log(TOKEN, sink=lambda line: None), files=ChannelFiles(ws, "telegram"))
    assert commands.answer("A", "q1", text, chat=CHAT) == reply
