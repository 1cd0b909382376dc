"""What the bot writes to the chats: questions, notices from the bus, clipped to fit."""
from __future__ import annotations

import json
from datetime import timezone

from session_store import questions

MAX_TEXT = 3900   # Telegram takes 4096 characters a message


def clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def short(payload, limit: int = 80) -> str:
    text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def question_text(q: questions.Question) -> str:
    c = q.context
    where = [f"state {c.state}", f"iteration {c.iteration}"]
    if c.role:
        where.append(f"role {c.role}")
    if c.task:
        where.append(f"task {c.task}")
    lines = [f"Question {q.id} from session {c.session}", ", ".join(where), "",
             clip(q.text, 3000), ""]
    if q.options:
        lines.append("Options: " + " | ".join(q.options))
    if q.default is not None:
        lines.append(f"Default: {q.default}")
    lines.append(f"Deadline: {q.deadline.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC "
                 f"(then: {q.on_timeout if q.kind == 'loop' else 'the agent goes on'})")
    lines.append("Reply to this message to answer it.")
    return "\n".join(lines)


def notice_text(sid: str, record: dict) -> str | None:
    """What a bus record tells the humans, if anything."""
    topic, payload = record.get("topic"), record.get("payload")
    if topic == "human.progress":
        where = [f"session {sid}"]
        if record.get("iteration") is not None:
            where.append(f"iteration {record['iteration']}")
        if record.get("source") and record["source"] not in ("cli", "engine"):
            where.append(str(record["source"]))
        text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        return f"[{', '.join(where)}] {text}"
    if topic == "session.transition" and isinstance(payload, dict):
        reason = f": {payload['reason']}" if payload.get("reason") else ""
        if payload.get("to") == "PAUSED":
            return f"Session {sid} paused{reason}\n/resume {sid} to go on."
        if payload.get("to") == "COMPLETE":
            if payload.get("trigger") == "abort":
                return f"Session {sid} aborted{reason}"
            return f"Session {sid} completed."
    if topic == "human.timeout" and isinstance(payload, dict):
        why = "could not be delivered" if payload.get("delivery_failed") \
            else "was not answered in time"
        then = f"; policy: {payload['policy']}" if payload.get("policy") else ""
        return f"Question {payload.get('id')} of session {sid} {why}{then}."
    return None
