"""Bench 9: the Telegram channel, against a real HTTP Bot API on loopback
(tests/fake_telegram.py) and `ralph bot run` as a subprocess.

1. Question out: the bench writes a question file (session_store.questions.ask, as the
   engine does) and times until the Bot API receives the `sendMessage` carrying it (the
   fake's own receive time; one clock). Baseline: the same bot with the old cadence, its
   outbox looking at every session on a fixed 200 ms poll (_telegram_poller.py).
2. Reply in: an agent blocks in `ralph tools interact ask` (a real subprocess, in an
   agent run a real engine holds open: the engine asks the question); once the question
   reached the chat, the bench queues a reply to it at the Bot API (the bot's pending
   getUpdates returns it at once) and times until the ask prints the answer (the agent
   is unblocked), and, as information, until the ask process has exited.
   Baseline: the same ask answered by writing the answer file directly (what `ralph
   session answer` does): the floor that any channel adds to.
3. Idle: CPU (utime + stime of every thread, /proc/<pid>/stat) and wakeups of a bot
   serving a workspace of 100 sessions, each with a question already delivered, while
   nothing happens. Baseline over the same window: a `python -c "import time;
   time.sleep(...)"` process; for context, the 200 ms-poll bot over 100 other sessions.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

from _common import (HeldRun, Row, median, ms, now, percentile, ralph_script, ratio, say,
                     session_env, stop_process)
from idle_cpu import TICK, cpu_seconds, switches

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from fake_telegram import FakeTelegram  # noqa: E402  (the test suite's Bot API)

TOKEN = "424242:BENCH-TOKEN"
CHAT = 111
POLL_INTERVAL = 0.2   # the old outbox's cadence


def _bot_config(workspace: str, url: str) -> str:
    path = os.path.join(workspace, "bot.yml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"RObot:\n  telegram:\n    bot_token: '{TOKEN}'\n    api_url: '{url}'\n"
                f"    allowed_chat_ids: [{CHAT}]\n")
    return path


def _start_bot(workspace: str, url: str, poll: float | None) -> subprocess.Popen:
    args = ["bot", "run", "-c", _bot_config(workspace, url)]
    argv = [ralph_script()] + args if poll is None else \
        [sys.executable, os.path.join(HERE, "_telegram_poller.py"), str(poll)] + args
    log = open(os.path.join(workspace, "bot.log"), "wb")
    try:
        return subprocess.Popen(argv, cwd=workspace, env=session_env(NO_PROXY="127.0.0.1"),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def _wait(predicate, what: str, proc: subprocess.Popen, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"telegram bench: {what} (bot exit {proc.poll()})")
        time.sleep(0.001)


def _workspace(base: str, label: str, sessions: int) -> tuple[str, list[str]]:
    from ralph.session_store import create
    workspace = tempfile.mkdtemp(prefix=f"ralph-bench-telegram-{label}-", dir=base)
    dirs = [create(workspace, f"bench {label} {i}", now=now(), session_id=f"{label}{i:03d}").dir
            for i in range(sessions)]
    return workspace, dirs


def _ask(session_dir: str, qid: str, text: str) -> None:
    from ralph.session_store import questions
    t = now()
    sid = os.path.basename(session_dir)
    questions.ask(session_dir, questions.Question(
        id=qid, text=text, asked_at=t, deadline=t + timedelta(hours=2), on_timeout="continue",
        context=questions.QuestionContext(session=sid, state="EXECUTING_BATCH", iteration=1)))


def _sent_at(fake: FakeTelegram, fragment: str):
    """The receive time of the sendMessage carrying `fragment`, once it came."""
    for call in fake.calls_of("sendMessage"):
        if fragment in str(call["params"].get("text")):
            return call["at"]
    return None


def question_out(base: str, fake: FakeTelegram, poll: float | None, count: int,
                 seed: int) -> list[float]:
    label = "poll" if poll else "watch"
    workspace, [sdir] = _workspace(base, f"out-{label}", 1)
    rng = random.Random(seed)
    bot = _start_bot(workspace, fake.url, poll)
    try:
        calls = len(fake.calls_of("getUpdates"))
        _wait(lambda: len(fake.calls_of("getUpdates")) > calls, "the bot never polled", bot)
        latencies = []
        for i in range(count):
            time.sleep(0.05 + rng.uniform(0, POLL_INTERVAL))   # at any phase of a poll
            qid = f"q{label}{i:04d}"
            t0 = time.monotonic()
            _ask(sdir, qid, f"Bench question {i}?")
            latencies.append(_wait(lambda: _sent_at(fake, f"Question {qid} "),
                                   f"question {qid} never sent", bot) - t0)
        return latencies
    finally:
        stop_process(bot)
        shutil.rmtree(workspace, ignore_errors=True)


def reply_in(base: str, fake: FakeTelegram, count: int, seed: int) -> dict[str, list[float]]:
    """Alternately: a reply through the bot, and the answer file written directly."""
    from ralph.session_store import questions
    workspace = tempfile.mkdtemp(prefix="ralph-bench-telegram-in-", dir=base)
    rng = random.Random(seed)
    bot = _start_bot(workspace, fake.url, None)   # first: it holds the workspace's bot
    held = None
    out = {"telegram": [], "direct": [], "telegram exit": [], "direct exit": []}
    try:
        calls = len(fake.calls_of("getUpdates"))
        _wait(lambda: len(fake.calls_of("getUpdates")) > calls, "the bot never polled", bot)
        held = HeldRun(workspace, "in")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RALPH_")}
        env.update(held.env)   # the agent run's own environment
        for i in range(2 * count):
            way = "telegram" if i % 2 == 0 else "direct"
            text = f"Unblock {i}?"
            agent = subprocess.Popen([ralph_script(), "tools", "interact", "ask", text,
                                      "--timeout", "120"], cwd=workspace, env=env, text=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
            try:
                message = _wait(lambda: next((m for m in fake.messages(CHAT)
                                              if text in m["text"]), None),
                                f"{text!r} never reached the chat", bot)
                qid = message["text"].split()[1]
                time.sleep(0.05 + rng.uniform(0, 0.1))
                t0 = time.monotonic()
                if way == "telegram":
                    fake.push(CHAT, f"yes {i}", reply_to=message)
                else:
                    questions.answer(held.dir, qid, f"yes {i}", now=now(), channel="bench")
                line = agent.stdout.readline()
                t1 = time.monotonic()
                agent.wait(timeout=30)
                t2 = time.monotonic()
                if line.strip() != f"yes {i}":
                    raise RuntimeError(f"telegram bench: the agent printed {line!r}")
                out[way].append(t1 - t0)
                out[f"{way} exit"].append(t2 - t0)
            finally:
                stop_process(agent)
        held.stop()
        return out
    finally:
        if held is not None:
            held.stop()
        stop_process(bot)
        shutil.rmtree(workspace, ignore_errors=True)


def idle(base: str, fake: FakeTelegram, sessions: int, seconds: float) -> dict:
    procs, workspaces = {}, []
    try:
        for label, poll in (("watch", None), ("poll", POLL_INTERVAL)):
            workspace, dirs = _workspace(base, f"idle-{label}", sessions)
            workspaces.append(workspace)
            for sdir in dirs:
                _ask(sdir, f"q{os.path.basename(sdir)}", "Waiting for a human")
            procs[label] = _start_bot(workspace, fake.url, poll)
        for label, bot in procs.items():
            _wait(lambda: sum(f"from session idle-{label}" in m["text"]
                              for m in fake.messages()) >= sessions,
                  f"the {label} bot did not send its {sessions} questions", bot, timeout=120)
        procs["sleep"] = subprocess.Popen(
            [sys.executable, "-c", f"import time; time.sleep({seconds + 30})"],
            stdin=subprocess.DEVNULL)
        time.sleep(2.0)   # the sends' replies, the state saves: settled
        say(f"telegram: measuring idle bots over {sessions} sessions for {seconds:g} s")
        before = {k: (cpu_seconds(p.pid), switches(p.pid)) for k, p in procs.items()}
        start = time.perf_counter()
        time.sleep(seconds)
        window = time.perf_counter() - start
        after = {k: (cpu_seconds(p.pid), switches(p.pid)) for k, p in procs.items()}
        for label in ("watch", "poll"):
            if procs[label].poll() is not None:
                raise RuntimeError(f"telegram bench: the {label} bot exited")
        return {k: (after[k][0] - before[k][0], (after[k][1][0] - before[k][1][0]) / window,
                    after[k][1][1]) for k in procs} | {"window": window}
    finally:
        for p in procs.values():
            stop_process(p)
        for workspace in workspaces:
            shutil.rmtree(workspace, ignore_errors=True)


def run(base: str, count: int = 40, warmup: int = 3, sessions: int = 100,
        seconds: float = 30.0) -> list[Row]:
    n = count + warmup
    with FakeTelegram(TOKEN) as fake:
        say(f"telegram: {n} questions out, through the watcher")
        watch = question_out(base, fake, None, n, seed=9)[warmup:]
        say(f"telegram: {n} questions out, through a {POLL_INTERVAL * 1000:.0f} ms poll")
        poll = question_out(base, fake, POLL_INTERVAL, n, seed=9)[warmup:]
        say(f"telegram: {n} replies in, and {n} answers written directly, alternated")
        replies = reply_in(base, fake, n, seed=9)
        tg, direct = replies["telegram"][warmup:], replies["direct"][warmup:]
        tg_exit, direct_exit = replies["telegram exit"][warmup:], replies["direct exit"][warmup:]
        cpu = idle(base, fake, sessions, seconds)
    w50, w99, p50, p99 = (percentile(watch, 50), percentile(watch, 99), percentile(poll, 50),
                          percentile(poll, 99))
    t50, t99, d50 = percentile(tg, 50), percentile(tg, 99), percentile(direct, 50)
    window = cpu["window"]

    def cell(label):
        used, wake, threads = cpu[label]
        return f"{used:.2f} s CPU ({used / window * 100:.2f} % of a core), {wake:.1f} wakeups/s"
    share = cpu["watch"][0] / window * 100
    floor = cell("sleep") + " (`python -c time.sleep`)"
    resolution = f"resolution {1000 / TICK:.0f} ms"

    def vs_floor(label):
        return ratio(cpu[label][0], cpu["sleep"][0], 1) if cpu["sleep"][0] else \
            f"n/a (baseline 0 at {resolution})"
    return [
        Row("9 telegram", "question file written -> sendMessage received, p50",
            ms(w50), ms(p50) + f" ({POLL_INTERVAL * 1000:.0f} ms poll)", ratio(w50, p50, 3),
            note=f"aim p50 <= 20 ms: {'met' if w50 <= 0.020 else 'NOT met'}; {len(watch)} "
                 f"questions; mean {ms(sum(watch) / len(watch))} vs {ms(sum(poll) / len(poll))}"),
        Row("9 telegram", "question file written -> sendMessage received, p99",
            ms(w99), ms(p99) + f" ({POLL_INTERVAL * 1000:.0f} ms poll)", ratio(w99, p99, 3),
            note=f"max {ms(max(watch))} vs {ms(max(poll))}"),
        Row("9 telegram", "reply received -> agent (`tools interact ask`) unblocked, p50",
            ms(t50), ms(d50) + " (answer file written directly)", ratio(t50, d50, 2),
            note=f"aim p50 <= 20 ms: {'met' if t50 <= 0.020 else 'NOT met'}; p99 {ms(t99)} "
                 f"(direct {ms(percentile(direct, 99))}); {len(tg)} replies; the reply goes "
                 f"getUpdates -> route -> answer file -> the engine (the asker's run) -> "
                 f"its reply in the work area's inbox -> the agent's watcher -> the answer "
                 f"printed"),
        Row("9 telegram", "reply received -> the `ask` process has exited, p50",
            ms(percentile(tg_exit, 50)), ms(percentile(direct_exit, 50)) + " (direct)",
            ratio(percentile(tg_exit, 50), percentile(direct_exit, 50), 2),
            note="information: the interpreter's exit after the answer is printed (every "
                 "`ralph` command pays it)"),
        Row("9 telegram", f"bot CPU while {sessions} sessions idle ({window:.0f} s)",
            cell("watch"), floor, vs_floor("watch"),
            note=f"aim <= 0.5 % of a core: {'met' if share <= 0.5 else 'NOT met'}; "
                 f"{cpu['watch'][2]} threads; CPU from /proc/<pid>/stat ({resolution}); "
                 f"each session has a delivered question; getUpdates long-polls 25 s"),
        Row("9 telegram", f"context: the same bot on the old cadence, {sessions} sessions",
            cell("poll"), floor, vs_floor("poll"),
            note=f"a {POLL_INTERVAL * 1000:.0f} ms look at every session and a 1 s getUpdates "
                 f"long-poll; its median question-out latency above: {ms(median(poll))}"),
    ]
