"""What `ralph session status` and `list` show: plain data first (the --json form),
then text rendered from it."""
from __future__ import annotations

import json
import os
import shlex
from datetime import datetime, timezone

from ralph.session_store import (PauseKind, State, Status, load, progress,
                           unstructure)

from .quota_view import at_utc, quota_lines, quota_view, window_name
from .safe_text import author, clock, excerpt, field, printable


MAX_STDERR_TAIL = 300   # characters of a failed run's last stderr line kept and shown


def failed_run_text(f: dict) -> str:
    """A failed agent run in one escaped line: whose, how it ended, its last stderr line
    (the agent's words), where its log is."""
    who = f"the {field(f['role'])}" + (f" on {field(f['task'])}" if f["task"] else "")
    ended = "timed out" if f["timed_out"] else \
        f"exited with code {f['exit_code']}" if f["exit_code"] is not None else \
        "ended without an exit code"
    said = f"its last stderr line: {printable(f['stderr_tail'])}" if f["stderr_tail"] \
        else "it wrote nothing on stderr"
    return (f"{who} (iteration {f['iteration']}) {ended}; {said}; its log: "
            f"{printable(f['log'])}")


def resume_command(session_id: str, workspace: str) -> str:
    """`ralph session resume ID`, naming the workspace when it is not the current directory
    (relative to it when inside it): a command to copy and run where it is read."""
    here, there = os.getcwd(), os.path.abspath(workspace)
    if there == here:
        return f"ralph session resume {session_id}"
    inside = os.path.relpath(there, here)
    shown = there if inside.startswith("..") else inside
    return f"ralph session resume {session_id} --workspace {shlex.quote(shown)}"


def higher_limit_flag(held: tuple[str, str, str]) -> str:
    """For a limit that still holds (`limit_still_reached`): the flag that lets the session
    go on, and its least value."""
    key, _, least = held
    return f" --{key.replace('_', '-')} N (N {least})"


def _resume_command(meta, running: bool, workspace: str) -> str | None:
    """For a paused session, or an interrupted one (active, but no engine holds it)."""
    if meta.status not in (Status.PAUSED, Status.ACTIVE) or running:
        return None
    base = resume_command(meta.session_id, workspace)
    held = limit_still_reached(meta)
    if held is not None:
        return base + higher_limit_flag(held)
    if meta.orchestrator.state is State.PAUSED and meta.orchestrator.pause_kind is PauseKind.LIMIT:
        return base + " --max-iterations N (or --max-runtime S / --max-cost USD)"
    return base


def limit_still_reached(meta, *, max_iterations=None, max_runtime=None,
                        max_cost=None) -> tuple[str, str, str] | None:
    """Why resuming a session paused by a limit, with these new limits (None: as it is),
    would pause it again at once (exit 5, two more steps on its path): (the limit's key
    as `resume` flags and the web's resume take it, what holds, the least value that lets
    it go on); None when it would not pause."""
    if meta.status is not Status.PAUSED or meta.orchestrator.pause_kind is not PauseKind.LIMIT:
        return None
    lim, used = meta.limits, meta.usage
    most = max_iterations or lim.max_iterations
    if meta.iteration > most:
        return ("max_iterations", f"max_iterations is {most} and the session stands at "
                                  f"iteration {meta.iteration}", f"at least {meta.iteration}")
    runtime = max_runtime or lim.max_runtime_seconds
    if used.runtime_seconds >= runtime:
        return ("max_runtime", f"max_runtime_seconds is {runtime:g} and the session has run "
                               f"{used.runtime_seconds:.0f}s",
                f"above {used.runtime_seconds:.0f}")
    cost = max_cost or lim.max_cost_usd
    if cost is not None and used.cost_usd >= cost:
        return ("max_cost", f"max_cost_usd is {cost:g} and the session has cost "
                            f"${used.cost_usd:.2f}", f"above {used.cost_usd:.2f}")
    return None


def session_view(workspace: str, session_id: str, last_events: int = 10) -> dict:
    session = load(workspace, session_id)
    m = session.metadata
    it = session.iteration()
    current = it.load() if it.exists() else None
    pid = session.running_pid()
    status, reason = standing_on_disk(session, pid)
    return {
        "session_id": m.session_id,
        "objective": m.objective,
        "state": m.orchestrator.state.value,
        "previous_state": m.orchestrator.previous_state.value if m.orchestrator.previous_state else None,
        "status": status,
        "running": pid is not None,
        "engine_pid": pid,
        "engine_stopped": engine_stopped(session, pid),
        "iteration": m.iteration,
        "batch": m.batch,
        "pause_reason": reason,
        "pause_kind": m.orchestrator.pause_kind.value if m.orchestrator.pause_kind else None,
        **limit_view(m),
        "resume_command": _resume_command(m, pid is not None, workspace),
        # paused by a limit that still holds: the one a resume must raise (the page asks)
        "limit_to_raise": dict(zip(("limit", "why", "least"), held))
        if (held := limit_still_reached(m)) else None,
        "tasks": unstructure(_live_counts(current, m)),
        "current_tasks": [{"id": t.id, "title": t.title, "batch": t.batch,
                           "marker": t.marker, "note": t.note}
                          for t in (current.task_lines() if current else [])],
        "pending_questions": [_question_view(q, m.session_id) for q in session.questions.pending()],
        # what the engine will take: a writer's hidden temp file is no signal
        "waiting_signals": session.signals.waiting(),
        "assessment": _assessment_view(m.fallback),
        "usage": unstructure(m.usage),
        "quota": quota_view(session, m),
        "limits": {"max_iterations": m.limits.max_iterations,
                   "max_runtime_seconds": m.limits.max_runtime_seconds,
                   "max_cost_usd": m.limits.max_cost_usd},
        "created_at": m.created_at.isoformat(),
        "updated_at": m.updated_at.isoformat(),
        "completed_at": m.completed_at.isoformat() if m.completed_at else None,
        "git": unstructure(m.git) if m.git else None,
        "last_failure": unstructure(m.last_failure) if m.last_failure else None,
        # the control plane (out of agents' reach) and the agents' work area
        "control_dir": session.dir,
        "work_dir": session.work_dir,
        **place_view(session),
        "last_events": session.tail(last_events),
    }


def limit_view(m) -> dict:
    """The wait for an agent's usage limit, in words ("waiting for claude's usage limit
    until 05:00 UTC (2h 13m)") and as data."""
    w = m.limit_wait
    if w is None or m.status is not Status.ACTIVE:
        return {"waiting": None, "limit_wait": None}
    return {"waiting": describe_limit_wait(w, datetime.now(timezone.utc)),
            "limit_wait": {"agent": w.agent, "role": w.role, "task": w.task,
                           "until": w.until.isoformat(), "since": w.since.isoformat(),
                           "text": w.text, "switched_to": w.switched_to,
                           "window": w.window}}


def describe_limit_wait(w, now: datetime) -> str:
    """"waiting for claude's usage limit until 05:00 (2h 13m)" (UTC)."""
    left = max(0, int((w.until - now).total_seconds()))
    what = f"{w.agent}'s {window_name(w.window)} window" if w.window else \
        f"{w.agent}'s usage limit"
    doing = f"running on {w.switched_to} while {what} lasts" if \
        w.switched_to else f"waiting for {what}"
    return f"{doing} until {at_utc(w.until)} ({_span(left)})"


def _span(seconds: int) -> str:
    if seconds >= 3600:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    if seconds >= 60:
        return f"{seconds // 60}m {seconds % 60}s"
    return f"{seconds}s"


def place_view(session) -> dict:
    """Where a fleet's session runs (its machine and workspace); nothing on the file
    store, whose sessions are all this workspace's."""
    if session.machine is None:
        return {}
    return {"machine": session.machine, "workspace": session.workspace}


def engine_stopped(session, pid: int | None) -> bool:
    """The engine holding the lock is stopped (SIGSTOP, a debugger, a suspended machine):
    it holds the session but makes no progress until it is continued. (Another machine's
    engine is not looked at: its pid means nothing here.)"""
    if not pid or pid < 0 or not session.runs_here():
        return False
    from .running.procfs import proc_state
    state = proc_state(pid)
    return state is not None and state[0] in ("T", "t")


def standing_on_disk(session, pid) -> tuple[str, str | None]:
    """(status, pause reason): an engine that stopped because its disk refused a write
    left the session paused for that reason (until a resume clears it), also when it was
    resuming a paused session and stopped before it could say so."""
    m = session.metadata
    fault = session.disk_fault() if pid is None else None
    if fault is not None and m.status in (Status.ACTIVE, Status.PAUSED):
        return "paused", f"{fault.get('reason')} (at {fault.get('at')})"
    return m.status.value, m.orchestrator.pause_reason


def _live_counts(current, m):
    """The task counts as of the current iteration's markers (the session's metadata has
    them as of the last transition)."""
    if current is None:
        return m.tasks
    return progress.session_counts(current.tasks_before, current.task_lines())


def _assessment_view(obs) -> dict | None:
    a = obs.last
    if a is None:
        return None
    return {"confidence": a.confidence, "factors": a.factors, "triggers": a.triggers,
            "fallback_type": a.fallback_type, "mode": obs.mode, "at": a.at.isoformat()}


def _question_view(q, session_id: str) -> dict:
    now = datetime.now(timezone.utc)
    return {"id": q.id, "text": q.text, "kind": q.kind, "options": q.options,
            "default": q.default, "asked_at": q.asked_at.isoformat(),
            "age_seconds": round((now - q.asked_at).total_seconds()),
            "deadline": q.deadline.isoformat(), "on_timeout": q.on_timeout,
            "role": q.context.role, "task": q.context.task,
            "answer_command": f"ralph session answer {session_id} \"...\" --question {q.id}"}


def answer_outcome(session, question) -> str:
    """What becomes of an answer, said to whoever gives it (the CLI, the web page)."""
    from ralph.session_store import questions
    running = session.running_pid() is not None
    resume = f"when the session is resumed ({resume_command(session.id, session.workspace)})"
    if question.kind == "approval":
        if question.status is questions.QuestionStatus.TIMED_OUT:
            return "the approval had timed out (its rule's default decided the call): " \
                   "the answer changes nothing"
        from .tools.approve import decision_of
        answer = session.questions.read_answer(question.id)
        allowed, words = decision_of(answer.text) if answer else (False, None)
        said = "it allows the call" if allowed else "it denies the call" + (
            f" (the agent is told: {printable(words)})" if words else "")
        if running:
            return f"{said}; the tool call waiting for it is decided now"
        return f"{said} when the same unit of work makes it again {resume}"
    if question.status is questions.QuestionStatus.TIMED_OUT:
        return "the question had timed out: the answer reaches the next prompt as guidance"
    if question.kind == "in_run":
        c = question.context
        who = printable(f"{c.role or 'agent'} {c.task or ''}".strip())
        if not running:
            return f"no engine runs the session: it reaches the next run of {who} {resume}"
        if question.asker_gone:
            return f"the agent that asked stopped waiting: it reaches the next run of {who}"
        return f"the waiting {who} gets it now"
    return "the session goes on with it" + ("" if running else f" {resume}")


def standing(v: dict) -> str:
    """Where a session stands, in words: "paused in EXECUTING_BATCH" (the state it paused
    from, never "paused in PAUSED"), "interrupted in ..." (active, no engine holds it)."""
    status, state = v["status"], v["state"]
    if status in ("completed", "aborted"):
        return status
    if state == "PAUSED" and v.get("previous_state"):
        state = v["previous_state"]
    if status == "active" and not v["running"]:
        status = "interrupted"
    return f"{status} in {state}"


def status_text(v: dict) -> str:
    """The status view as text. Every string from the session (the objective, reasons,
    questions, task titles and notes, events) is shown escaped, as one line (a question's
    further lines indented under it): what an agent wrote can neither drive the terminal
    nor start a line of its own."""
    lines = [f"session {v['session_id']}: {standing(v)}"
             f" ({'engine running, pid ' + str(v['engine_pid']) if v['running'] else 'no engine running'})",
             f"objective: {printable(v['objective'].splitlines()[0]) if v['objective'] else ''}",
             f"iteration {v['iteration']}, batch {v['batch']}; tasks: {v['tasks']['completed']} done, "
             f"{v['tasks']['failed']} failed, {v['tasks']['pending']} pending of {v['tasks']['total']}"]
    if v.get("machine"):
        lines.append(f"on {field(v['machine'])}, workspace {field(v['workspace'])}")
    if v["engine_stopped"]:
        last = field(v["last_events"][-1].get("ts"))[:19] if v["last_events"] \
            else v["updated_at"][:19]
        lines.append(f"engine pid {v['engine_pid']} is stopped (SIGSTOP or a suspended "
                     f"machine): it holds the session but has made no progress since {last}; "
                     f"`kill -CONT {v['engine_pid']}` lets it go on (deadlines that passed "
                     f"meanwhile apply once)")
    if v["git"]:
        g = v["git"]
        started = field(g["started_from"] or "a detached HEAD")
        lines.append(f"branch: {field(g['branch'])} (from {started} at {field(g['base'])[:12]};"
                     f" `ralph session diff {v['session_id']}` shows what it changed)")
    if v["pause_reason"]:
        lines.append(f"paused: {printable(v['pause_reason'])}")
    if v["waiting"]:
        w = v["limit_wait"]
        now = f"{v['resume_command'] or resume_command(v['session_id'], '.')} --now"
        lines.append(f"{v['waiting']}: the {field(w['role'])}"
                     f"{' ' + field(w['task']) if w['task'] else ''} is retried then ("
                     + (f"to retry sooner, pause it, then: {now}" if v["running"] else
                        f"to retry at once: {now}") + f"); it said: {printable(w['text'])}")
    if v["last_failure"]:
        lines.append(f"last failed run: {failed_run_text(v['last_failure'])}")
    if v["resume_command"]:
        lines.append(f"resume: {v['resume_command']}")
    for q in v["pending_questions"]:
        # several lines: each escaped and indented under the question's own line
        first, *rest = q["text"].split("\n")
        lines.append(f"question {q['id']} ({_asker(q)}, asked {age_text(q['age_seconds'])} ago, "
                     f"deadline {q['deadline'][:19]}, on timeout: {field(q['on_timeout'])}): "
                     f"{printable(first)}")
        lines += [f"    {printable(line)}".rstrip() for line in rest]
        if q["options"]:
            lines.append("  options: " + "  ".join(f"{i}. {printable(o)}" for i, o in
                                                   enumerate(q["options"], 1)))
        lines.append(f"  answer: {q['answer_command']}")
    if v["waiting_signals"]:
        lines.append(f"signals waiting: {len(v['waiting_signals'])}")
    a = v["assessment"]
    if a:
        factors = ", ".join(f"{field(k)} {x:.2f}" for k, x in a["factors"].items())
        lines.append(f"confidence {a['confidence']:.2f} ({factors}); mode {field(a['mode'])}"
                     + (f"; triggers: {printable('; '.join(a['triggers']))}"
                        if a["triggers"] else ""))
    u, lim = v["usage"], v["limits"]
    runs, most = u["agent_invocations"], lim["max_iterations"]
    # a session paused at its max_iterations stands at the next one, not yet run
    iterations = f"{most} of {most} iterations run (the limit)" if v["iteration"] > most \
        else f"iteration {v['iteration']} of {most}"
    lines.append(f"usage: {runs} agent run{'s' * (runs != 1)}, {u['runtime_seconds']:.0f}s of "
                 f"{lim['max_runtime_seconds']:.0f}s, ${u['cost_usd']:.2f}"
                 + (f" of ${lim['max_cost_usd']:.2f}" if lim["max_cost_usd"] is not None else "")
                 + f", {iterations}")
    if u["input_tokens"] or u["output_tokens"]:
        lines.append("tokens (in/out): " + ", ".join(
            [f"{u['input_tokens']:,}/{u['output_tokens']:,}"]
            + [f"{field(role)} {r['input_tokens']:,}/{r['output_tokens']:,} ${r['cost_usd']:.2f}"
               for role, r in u["by_role"].items()]))
    lines += quota_lines(v)
    if v["current_tasks"]:
        lines.append("")
        lines += [f"  [{field(t['marker'])}] {field(t['id'])}: {printable(t['title'])} "
                  f"(batch {t['batch']})" + (f" — {printable(t['note'])}" if t["note"] else "")
                  for t in v["current_tasks"]]
    if v["last_events"]:
        lines.append("")
        lines += ["  " + event_line(e) for e in v["last_events"]]
    return "\n".join(lines)


def _asker(q: dict) -> str:
    """Whose question: an agent's (its role and task), else the engine's own."""
    if not q["role"]:
        return "from ralph"
    return f"from the {field(q['role'])}" + (f" on {field(q['task'])}" if q["task"] else "")


def age_text(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def event_line(e: dict) -> str:
    """One bus record as one escaped line, whatever it holds: a field that is absent or
    of the wrong type shows as "?", the payload is cut to 160 characters, the author is
    who appended it ("ralph" for the engine). Only the engine's transitions read as
    transitions."""
    payload = e.get("payload")
    if e.get("topic") == "session.transition" and e.get("source") == "engine" \
            and isinstance(payload, dict):
        payload = f"{payload.get('from')} -> {payload.get('to')} ({payload.get('trigger')}" \
            + (f": {payload['reason']})" if payload.get("reason") else ")")
    return (f"#{field(e.get('seq'), text=False):<5} {clock(e, 12):<12} "
            f"{field(e.get('state'), '-'):<18} {author(e):<9} {field(e.get('topic'))}  "
            f"{excerpt(payload, 160)}")


def tail(workspace: str, session_id: str, *, follow: bool, count: int, as_json: bool) -> int:
    """Print the last `count` events; with `follow`, every new one as it lands (woken by
    inotify on the session directory) until the session is completed or aborted."""
    import sys
    import threading

    session = load(workspace, session_id)
    seq = session.last_seq()

    def show(batch):
        for e in batch:
            # JSON's \u escapes keep the record exact and every control character off
            # the terminal (C1 and bidi controls too: ensure_ascii)
            print(json.dumps(e) if as_json else event_line(e), flush=True)
    show(session.tail(count) if count > 0 else [])
    if not follow:
        return 0
    woken = threading.Event()
    stop = session.follow(woken)
    try:
        while True:
            woken.wait(1.0)
            woken.clear()
            batch = session.events_after(seq)
            seq = batch[-1]["seq"] if batch else seq
            show(batch)
            if any(e["topic"] == "session.transition" and e.get("source") == "engine"
                   and isinstance(e.get("payload"), dict) and e["payload"].get("to") == "COMPLETE"
                   for e in batch):
                return 0
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 0
    finally:
        stop()
