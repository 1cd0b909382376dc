"""Prompt assembly, in DESIGN §5's order: OBJECTIVE, ROBOT GUIDANCE, PENDING EVENTS,
the role's instructions, then the skills."""
from __future__ import annotations

import json

from .humans.blockers import LAST_RESORT

DEFAULT_INSTRUCTIONS = {
    "planner": (
        "You are the Planner. Read the objective, the scratchpad and what earlier iterations "
        "left (failed tasks, rejected reviews). Define the next tasks, in batches that can run "
        "one after another, and publish them:\n"
        "  {ralph} emit plan.ready --json '{\"tasks\": [{\"id\": \"t1\", \"title\": \"...\", "
        "\"description\": \"...\", \"batch\": 1}]}'\n"
        "When nothing is left to do, publish instead:\n"
        "  {ralph} emit LOOP_COMPLETE \"why nothing is left\""),
    "executor": (
        "You are the Executor. Do exactly the task in PENDING EVENTS, in the workspace. Run the "
        "tests and checks, then publish the evidence:\n"
        "  {ralph} emit build.done \"tests: pass, lint: pass, typecheck: pass, audit: pass, "
        "coverage: 85, complexity: 4, duplication: pass\"\n"
        "If you cannot finish: {ralph} emit build.blocked \"why\" or {ralph} emit task.failed \"why\"."),
    "reviewer": (
        "You are the Reviewer. Review the task in PENDING EVENTS and the executor's report. "
        "If it is right, publish:\n"
        "  {ralph} emit review.done \"tests: pass, build: pass\"\n"
        "Otherwise: {ralph} emit review.rejected \"what is wrong\" (the task is replanned)."),
    "librarian": (
        "You are the Librarian. Distil what this iteration learned that future work needs into "
        "markdown files under $RALPH_ITERATION_DIR/knowledge/, then publish:\n"
        "  {ralph} emit knowledge.staged \"the files\"\n"
        "If nothing is worth keeping, write nothing and publish nothing."),
    "questioner": (
        "You are the Questioner. Before the Planner plans, find what is ambiguous or missing "
        "in the objective (scope, constraints, choices only a human can make) and ask the "
        "human, one question at a time, with options and a default where you can:\n"
        "  {ralph} tools interact ask \"question\" --option A --option B --default A\n"
        "The answers reach the Planner. Ask nothing the objective, the specs or the code "
        "already tell you; if nothing is ambiguous, ask nothing and end."),
}

SKILLS = (
    "## SKILLS\n\n"
    "The ralph command here is `{ralph}`: call it by that path (a login shell may reset "
    "PATH and not find a plain `ralph`).\n\n"
    "### Events\n"
    "Publish with `{ralph} emit TOPIC \"payload\"` or `{ralph} emit TOPIC --json '{...}'`; the "
    "session and your role are taken from the environment (RALPH_SESSION_ID, RALPH_ROLE).\n"
    "At your step boundaries, `{ralph} tools signals poll` takes the guidance humans sent you "
    "while you run.\n\n"
    "### Robot (human in the loop)\n"
    "- `{ralph} tools interact ask \"question\" [--option A --option B] [--default TEXT] "
    "[--timeout S]`: block until a human answers; the answer is printed (on timeout: exit 3 "
    "and the default, which you then act on).\n"
    "- `{ralph} emit human.interact \"question\"`: ask after this run; the loop waits for the "
    "answer, which reaches your next prompt as human.response.\n"
    "- `{ralph} tools interact progress \"message\"`: tell the human how it goes (non-blocking).\n"
    "Rules: ask only what the objective, the specs, the code and the scratchpad cannot tell "
    "you; never ask again what was answered (see ROBOT GUIDANCE and PENDING EVENTS); never "
    "ask and report progress in the same turn; offer options and a default when you can.\n")

# Seed 001 §3.1 and §4 step 3.5: in the executor's skills rather than its instructions,
# so that a config's own executor instructions keep it.
STEER_SKILL = (
    "\n### Steering while you work (STEER)\n"
    "Poll with `{ralph} tools signals poll` at each step boundary: before you start, "
    "between reading the context, implementing and verifying, and every few minutes of a "
    "long implementation. INFO adds facts: take them and go on. For each STEER, compare "
    "its message with the files you already changed, the task's success criteria and the "
    "task's objective, then take one branch:\n"
    "- no STEER, or it changes nothing you do: continue.\n"
    "- adjust: it adds a constraint or context without invalidating your work (\"also "
    "handle edge case Z\"): keep it among your constraints and go on from where you are.\n"
    "- restart the task: it contradicts work already done (\"use library X\" when you "
    "integrated Y): redo the implementation with it, and say in your evidence "
    "\"Restarted due to STEER: <summary>\".\n"
    "- escalate: it changes what the task is (\"don't build A, build B\"): do not redefine "
    "the task yourself; publish `{ralph} emit task.failed \"STEER scope change: "
    "<summary>\"` and end your run: the Planner redefines the task.\n"
    "PAUSE and ABORT listed under engine_will_act_on are the engine's: stop starting new "
    "work, the engine stops the run.\n")

MCP_SKILL = (
    "### Your tools (MCP)\n"
    "Use the tools of the `ralph` MCP server first: `emit` (topic, payload: your outcome, "
    "and human.interact), `ask` (question, options, default: waits for a human's answer, "
    "however long), `progress` (message), `signals_poll` (at your step boundaries), "
    "`blocker` (the trace) and `status`; resources ralph://plan, ralph://progress, "
    "ralph://scratchpad. The shell commands below do the same: they are the fallback.\n\n")


def _event_line(event: dict) -> str:
    payload = event.get("payload")
    if not isinstance(payload, str):
        payload = json.dumps(payload, ensure_ascii=False)
    return f"- {event['topic']}: {payload}"


def build(objective: str, role: str, instructions: str | None, guidance: list[str],
          pending_events: list[dict], ralph: str = "ralph", mcp: bool = False) -> str:
    """The prompt; `ralph` is the command agents are to call (an absolute path); with
    `mcp`, the skills name the MCP server's tools first."""
    parts = [f"## OBJECTIVE\n\n{objective.strip()}\n"]
    if guidance:
        if len(guidance) == 1:
            body = guidance[0]
        else:
            body = "\n".join(f"{i}. {g}" for i, g in enumerate(guidance, 1))
        parts.append(f"## ROBOT GUIDANCE\n\n{body}\n")
    events = "\n".join(_event_line(e) for e in pending_events) or "(none)"
    parts.append(f"## PENDING EVENTS\n\n{events}\n")
    role_text = instructions or DEFAULT_INSTRUCTIONS[role].replace("{ralph}", ralph)
    parts.append(f"## ROLE: {role.upper()}\n\n{role_text.strip()}\n")
    skills = SKILLS.replace("{ralph}", ralph)
    if mcp:
        head, rest = skills.split("### Events\n", 1)
        skills = head + MCP_SKILL + "### Events\n" + rest
    if role == "executor":
        skills += STEER_SKILL.replace("{ralph}", ralph)
    parts.append(skills)
    parts.append(LAST_RESORT.replace("  ralph emit", f"  {ralph} emit"))
    return "\n".join(parts)
