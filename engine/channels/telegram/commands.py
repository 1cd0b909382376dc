"""What the bot does for a chat, through the store: answers, guidance, and the commands
/status /tasks /tail /pause /resume /stop /approve /skip /help.

Like every channel it only reads the store and writes store files: answers
(`session.questions.answer(channel="telegram")`) and signal files (guidance is an INFO
signal for ALL; /pause PAUSE, /stop ABORT, /approve APPROVE, /skip SKIP). /resume starts
`ralph session resume ID` as a detached process. Everything here is synchronous store
I/O: the bot calls `Commands.run` off its event loop, in a worker thread.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import datetime, timezone

from ralph.session_store import (AlreadyAnswered, BadInput, ChannelFiles, QuestionCancelled, Status,
                           list_ids, load, questions)

from . import router
from .settings import Log
from ...safe_text import author, clock, excerpt, field, printable
from .texts import clip

HELP = """Commands (SESSION is optional: the primary session by default):
/status [SESSION] - state, iteration, tasks, pending questions
/tasks [SESSION] - the current iteration's tasks
/tail [SESSION] [N] - the last N events (default 10)
/pause [SESSION] [reason] - pause the session (resumable)
/resume [SESSION] - resume a paused session
/stop [SESSION] [reason] - abort the session
/approve [SESSION] - promote the staged knowledge (KNOWLEDGE_APPROVAL)
/skip [SESSION] - keep the staged knowledge staged
/help - this list

Reply to a question's message to answer it. "@SESSION text" is guidance for that session;
any other text is guidance for the primary session ({primary})."""
_KNOWLEDGE = ("{kind} sent to session {{sid}} for iteration {{iteration}}: the staged knowledge "
              "is {what} once the session waits in KNOWLEDGE_APPROVAL (it is in {{state}}).")


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Commands:
    """Carries out the router's actions for one workspace; returns the text to reply."""

    def __init__(self, workspace: str, log: Log, *, primary: str | None = None,
                 files: ChannelFiles):
        self.ws = workspace
        self.fixed_primary = primary
        self.files = files   # the bot's own files: /resume's engines write their output there
        self.log = log

    def run(self, action: router.Action, chat: int | None = None) -> str | None:
        if isinstance(action, router.Ignore):
            self.log(action.reason)
            return None
        if isinstance(action, router.Say):
            return action.text
        if isinstance(action, router.Answer):
            return self.answer(action.session, action.question, action.text, chat)
        if isinstance(action, router.Guidance):
            sid = action.session or self.primary()
            if sid is None:
                return "No open session to guide. /status lists the sessions."
            return self.guidance(sid, action.text)
        handler = getattr(self, "help" if action.name == "start" else action.name)
        return handler(action.session, action.rest)

    def primary(self) -> str | None:
        """The engine's session when an engine runs the bot; else the newest open one."""
        if self.fixed_primary:
            return self.fixed_primary
        newest = None
        for sid in list_ids(self.ws):
            try:
                m = load(self.ws, sid).metadata
            except BadInput:
                continue
            if m.status not in (Status.COMPLETED, Status.ABORTED) and \
                    (newest is None or m.created_at > newest[0]):
                newest = (m.created_at, sid)
        return newest[1] if newest else None

    # --- answers and guidance ---

    def answer(self, sid: str, qid: str, text: str, chat: int | None = None) -> str:
        try:
            session = load(self.ws, sid)
        except BadInput:
            return f"Session {sid} is gone: the answer could not be recorded."
        try:
            session.questions.answer(qid, text, now=_utcnow(), channel="telegram")
        except AlreadyAnswered:
            try:
                earlier = session.questions.read_answer(qid)
            except BadInput:
                earlier = None
            said = f" ({earlier.channel}): {clip(earlier.text, 300)}" if earlier else ""
            return (f"Thank you, but question {qid} of session {sid} was already "
                    f"answered{said}. Your reply changed nothing.")
        except QuestionCancelled:
            return f"Question {qid} of session {sid} was cancelled: it takes no answer now."
        except BadInput as e:
            return f"Your answer could not be recorded: {e}"
        self.log(f"answer to question {qid} of session {sid} from chat {chat}")
        q = session.questions.load(qid)
        if q.status is questions.QuestionStatus.TIMED_OUT:
            return (f"Answer recorded for question {qid}. It had timed out already, so it "
                    f"reaches session {sid}'s next prompt as guidance.")
        return f"Answer recorded for question {qid} of session {sid}."

    def guidance(self, sid: str, text: str) -> str:
        session, why = self._open(sid)
        if session is None:
            return why
        session.signals.drop("INFO", text, now=_utcnow(), target="ALL")
        self.log(f"guidance for session {sid}")
        reply = f"Guidance queued for session {sid}: it reaches the next agent prompt."
        waiting = session.questions.pending()
        if waiting:
            reply += (f"\n(Session {sid} waits for an answer to question {waiting[0].id}: "
                      f"reply to that question's message to answer it.)")
        return reply

    def _open(self, sid: str):
        """(session, None) or (None, why not) for a session that takes signals."""
        try:
            session = load(self.ws, sid)
        except BadInput:
            return None, f"There is no session {sid} in this workspace."
        status = session.metadata.status
        if status in (Status.COMPLETED, Status.ABORTED):
            return None, f"Session {sid} is {status.value}: it takes no more signals."
        return session, None

    def _pick(self, sid: str | None) -> tuple[str | None, str | None]:
        sid = sid or self.primary()
        if sid is None:
            return None, "No open session; name one (/status lists them)."
        return sid, None

    # --- the commands: (session or None, the rest of the line) -> the reply ---

    def help(self, _sid, _rest) -> str:
        return HELP.format(primary=self.primary() or "none open")

    def status(self, sid, _rest) -> str:
        from ...session_list import list_text, list_views
        from ...views import session_view, status_text
        if sid is None and self.primary() is None:
            return clip(list_text(list_views(self.ws)))
        sid, why = self._pick(sid)
        if why:
            return why
        text = status_text(session_view(self.ws, sid, last_events=5))
        others = [v for v in list_views(self.ws) if v["session_id"] != sid]
        if others:
            text += "\n\nOther sessions:\n" + list_text(others)
        return clip(text)

    def tasks(self, sid, _rest) -> str:
        from ...views import session_view
        sid, why = self._pick(sid)
        if why:
            return why
        v = session_view(self.ws, sid, last_events=0)
        t = v["tasks"]
        lines = [f"Session {sid}, iteration {v['iteration']} ({v['state']}): {t['completed']} "
                 f"done, {t['failed']} failed, {t['pending']} pending of {t['total']}"]
        lines += [f"[{field(x['marker'])}] {field(x['id'])}: {printable(x['title'])} "
                  f"(batch {x['batch']})" + (f" - {printable(x['note'])}" if x["note"] else "")
                  for x in v["current_tasks"]]
        if not v["current_tasks"]:
            lines.append("No tasks planned yet in this iteration.")
        return clip("\n".join(lines))

    def tail(self, sid, rest) -> str:
        sid, why = self._pick(sid)
        if why:
            return why
        word = (rest.split() or [""])[0]
        count = max(1, min(int(word), 50)) if word.isdecimal() and len(word) < 5 else 10
        try:
            session = load(self.ws, sid)
        except BadInput as e:
            return str(e)
        records = session.tail(count)
        lines = [f"Last {len(records)} events of session {sid}:"]
        for e in records:
            payload = e.get("payload")
            shown = "" if payload in (None, "", {}) else " " + excerpt(payload, 80)
            lines.append(f"#{field(e.get('seq'), text=False)} {clock(e, 8)} {author(e)} "
                         f"{field(e.get('topic'))}{shown}")
        return clip("\n".join(lines))

    def _signal(self, sid, kind: str, message: str, done: str) -> str:
        sid, why = self._pick(sid)
        if why:
            return why
        session, why = self._open(sid)
        if session is None:
            return why
        if kind == "PAUSE" and session.metadata.status is Status.PAUSED:
            return f"Session {sid} is paused already. /resume {sid} to go on."
        iteration = session.metadata.iteration if kind in ("APPROVE", "SKIP") else None
        session.signals.drop(kind, message, now=_utcnow(), iteration=iteration)
        self.log(f"{kind} signal for session {sid}")
        return done.format(sid=sid, iteration=session.metadata.iteration,
                           state=session.metadata.orchestrator.state.value)

    def pause(self, sid, rest) -> str:
        return self._signal(sid, "PAUSE", rest or "paused from Telegram",
                            "PAUSE sent to session {sid}: it pauses within a second "
                            "(resumable with /resume {sid}).")

    def stop(self, sid, rest) -> str:
        return self._signal(sid, "ABORT", rest or "stopped from Telegram",
                            "ABORT sent to session {sid}: it stops within a second.")

    def approve(self, sid, rest) -> str:
        return self._signal(sid, "APPROVE", rest or "approved from Telegram", _KNOWLEDGE.format(
            kind="APPROVE", what="promoted to the docs"))

    def skip(self, sid, rest) -> str:
        return self._signal(sid, "SKIP", rest or "skipped from Telegram", _KNOWLEDGE.format(
            kind="SKIP", what="kept staged"))

    def resume(self, sid, _rest) -> str:
        if sid is None:
            sid = self._resumable()
            if sid is None:
                return "Which session? /resume SESSION (no session waits to be resumed)."
        session, why = self._open(sid)
        if session is None:
            return why
        pid = session.running_pid()
        if pid is not None:
            return f"Session {sid} is running already (engine pid {pid})."
        fd, log_path = self.files.open_log(f"resume-{sid}")
        from ...agents import containment
        try:
            with containment.spawning():   # not an agent's orphan: the engine started it
                child = subprocess.Popen(
                    [sys.executable, "-P", "-m", "ralph.engine", "session", "resume", sid,
                     "--workspace", self.ws], cwd=self.ws, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
                    start_new_session=True)
                containment.spare(child.pid)
        finally:
            os.close(fd)
        # reaped the moment it ends (no zombie, no periodic check)
        threading.Thread(target=child.wait, name=f"reap-{child.pid}", daemon=True).start()
        self.log(f"resuming session {sid} (pid {child.pid}; output in {log_path})")
        return f"Resuming session {sid} (engine pid {child.pid})."

    def _resumable(self) -> str | None:
        """With no session named: the primary when it is paused, else the only paused one."""
        paused = []
        for sid in list_ids(self.ws):
            try:
                if load(self.ws, sid).metadata.status is Status.PAUSED:
                    paused.append(sid)
            except BadInput:
                continue
        primary = self.primary()
        if primary in paused:
            return primary
        return paused[0] if len(paused) == 1 else None
