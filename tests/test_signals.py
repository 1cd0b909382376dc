"""Issue 3: the live signals mailbox (DESIGN §6, seed 001), end to end.

Every session here is the real `ralph` run as a subprocess. Most use a small recording
agent (`agent.py`, written into the workspace): it saves the prompt it gets on stdin to
`prompts/NNN-it<I>-<role>-<task>-a<attempt>.md`, then plays the demo scenario's step for
it. A step may also carry keys the demo agent itself ignores:

    signals: [{type, message, target, iteration}]   dropped by the humans first
    poll: true           runs `ralph tools signals poll --json`, saved to polled-NNN.json
    snapshot_inputs: true  saves the names in signals/inputs/ to inputs-NNN.txt
    wait_for: FILE       waits (at most 60 s) until FILE exists in the workspace

so a signal can be sent at an exact point of a session, without timing guesses.

The mailbox is in the session's control plane (in the state directory), which agents
may read ($RALPH_CONTROL_DIR) but not write, and `ralph signal` is a human's verb, refused
inside an agent run. So a step's `signals` are asked of the humans: the agent writes a
request, `.drops/NNN.json` in the workspace, and waits until `.drops/NNN.done` says they
are in the mailbox; the humans (`humans(ws)`, a thread of the test, outside every run)
drop each with the real `ralph signal`, in order. `start` and `resume` run with them.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal as os_signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ralph.engine.prompt import build as build_prompt
from support import (EVIDENCE, FAST, REVIEW_OK, base_env, finish, metadata, only_session,
                     progress_markers, ralph, session_dir, signal_file, signal_files, spawn, transitions,
                     wait_for, work_dir, write_config, write_scenario)
from ralph.session_store import BadInput, signals


AGENT = textwrap.dedent('''
    import json, os, subprocess, sys, time
    from ralph.engine import demo_agent

    def main():
        prompt = sys.stdin.read()
        env = os.environ
        ws = env["RALPH_WORKSPACE"]
        pdir = os.path.join(ws, "prompts")
        os.makedirs(pdir, exist_ok=True)
        n = len(os.listdir(pdir)) + 1
        name = "%03d-it%s-%s-%s-a%s" % (n, env["RALPH_ITERATION"], env["RALPH_ROLE"],
                                        env.get("RALPH_TASK_ID", "-"), env["RALPH_ATTEMPT"])
        tmp = os.path.join(ws, ".prompt.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(prompt)
        os.rename(tmp, os.path.join(pdir, name + ".md"))
        names = {"role": env["RALPH_ROLE"], "iteration": env["RALPH_ITERATION"],
                 "task": env.get("RALPH_TASK_ID", ""), "attempt": env["RALPH_ATTEMPT"]}
        step = demo_agent.find_step(demo_agent.load_scenario(sys.argv[1]), names)
        if step is None:
            return 0
        ralph = [sys.executable, "-m", "ralph.engine"]

        def ask_humans(name, request):   # served outside this run; False: it failed
            drops = os.path.join(ws, ".drops")
            os.makedirs(drops, exist_ok=True)
            path = os.path.join(drops, name)
            with open(path + ".tmp", "w") as f:
                json.dump(request, f)
            os.rename(path + ".tmp", path + ".json")
            deadline = time.monotonic() + 60
            while not os.path.exists(path + ".done"):
                if os.path.exists(path + ".failed") or time.monotonic() > deadline:
                    return False
                time.sleep(0.02)   # poll: until the humans served the request
            return True

        if step.get("signals"):  # the humans drop them (outside this run), then it goes on
            if not ask_humans("%03d" % n, step["signals"]):
                return 9
        if step.get("poll"):
            out = subprocess.run(ralph + ["tools", "signals", "poll", "--json"], check=True,
                                 capture_output=True, text=True).stdout
            with open(os.path.join(ws, "polled-%03d.json" % n), "w") as f:
                f.write(out)
        if step.get("snapshot_inputs"):   # the control plane is out of this run's sight
            if not ask_humans("%03d-look" % n, {
                    "list": os.path.join(env["RALPH_CONTROL_DIR"], "signals", "inputs"),
                    "into": "inputs-%03d.txt" % n}):
                return 9
        if step.get("wait_for"):
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(ws, step["wait_for"])):
                if time.monotonic() > deadline:
                    return 9
                time.sleep(0.05)   # poll: until the test writes the file waited for
        return demo_agent.play(step, env)

    sys.exit(main())
''')


# --- scenarios and sessions ---

def plan(*task_ids: str, iteration: int = 1) -> dict:
    return {"role": "planner", "iteration": iteration, "emit": [{"topic": "plan.ready", "json": {
        "tasks": [{"id": t, "title": f"task {t}", "batch": 1} for t in task_ids]}}]}


DONE = {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE", "payload": "nothing left"}]}
EXECUTE = {"role": "executor", "emit": [{"topic": "build.done", "payload": EVIDENCE}]}
REVIEW = {"role": "reviewer", "emit": [{"topic": "review.done", "payload": REVIEW_OK}]}
LIBRARIAN = {"role": "librarian", "iteration": 1,
             "write_iteration": {"knowledge/notes.md": "# notes\n\nlearned things\n"},
             "emit": [{"topic": "knowledge.staged", "payload": "notes.md"}]}


def setup(ws: Path, steps: list[dict], **config) -> Path:
    """The recording agent, a scenario and a ralph.yml using them; returns the config."""
    (ws / "agent.py").write_text(AGENT)
    scenario = write_scenario(ws, steps)
    return write_config(ws, {"agent": {"backend": "command", "command": [
        sys.executable, str(ws / "agent.py"), str(scenario)], "prompt_mode": "stdin"},
        **config})


class _Humans(threading.Thread):
    """The humans of workspace `ws`, outside every run: each request an agent's step makes
    (`.drops/NNN.json`, a list of signals) is served once (whoever serves the workspace
    next skips it), in order, with the real `ralph signal` run from the test; then
    `.drops/NNN.done` lets the agent go on (or `.failed`, and the error is kept for the
    test). A request {"list": DIR, "into": FILE} writes DIR's listing (the control
    plane's, which no run sees) into the workspace's FILE. `env`: the environment of
    `ralph signal` (its store)."""

    def __init__(self, ws: Path, env: dict | None = None):
        super().__init__(daemon=True)
        self.ws = ws
        self.env = env
        self.served: set[str] = set()
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.02):
            self.serve()

    def serve(self) -> None:
        folder = self.ws / ".drops"
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
        except FileNotFoundError:
            return
        for name in names:
            request = folder / name[:-len(".json")]
            if name in self.served or request.with_suffix(".done").exists() \
                    or request.with_suffix(".failed").exists():   # served before
                continue
            self.served.add(name)
            wanted = json.loads((folder / name).read_text())
            if isinstance(wanted, dict):
                (self.ws / wanted["into"]).write_text("\n".join(sorted(
                    os.listdir(wanted["list"]))))
                request.with_suffix(".done").touch()
                continue
            for sig in wanted:
                argv = ["signal", sig["type"], sig.get("message", "")]
                if "target" in sig:
                    argv += ["--target", sig["target"]]
                if "iteration" in sig:
                    argv += ["--iteration", str(sig["iteration"])]
                r = ralph(self.ws, *argv, env=self.env)
                if r.returncode != 0:
                    self.errors.append(f"ralph {' '.join(argv)}: exit {r.returncode}: "
                                       f"{r.stderr.strip()}")
                    request.with_suffix(".failed").touch()
                    break
            else:
                request.with_suffix(".done").touch()


@contextmanager
def humans(ws: Path, env: dict | None = None):
    """The humans serving the agents' requests for signals while inside (see _Humans)."""
    them = _Humans(ws, env)
    them.start()
    try:
        yield them
    finally:
        them.stopping.set()
        them.join(30)
    assert not them.errors, them.errors


def start(ws: Path, sid: str = "s1", env: dict | None = None, timeout: float = 120):
    with humans(ws, env):
        return ralph(ws, "session", "start", "test the mailbox", "-c", ws / "ralph.yml",
                     "--id", sid, env=env or base_env(**FAST), timeout=timeout)


def spawn_start(ws: Path, sid: str = "s1", env: dict | None = None) -> subprocess.Popen:
    return spawn(ws, "session", "start", "test the mailbox", "-c", ws / "ralph.yml",
                 "--id", sid, env=env or base_env(**FAST))


def resume(ws: Path, sid: str = "s1", *extra, env: dict | None = None):
    with humans(ws):
        return ralph(ws, "session", "resume", sid, *extra, env=env or base_env(**FAST))


def prompts(ws: Path) -> list[tuple[str, str]]:
    """[(file name, prompt text)] in invocation order."""
    pdir = ws / "prompts"
    return [(p.name, p.read_text()) for p in sorted(pdir.iterdir())] if pdir.exists() else []


def prompt_of(ws: Path, pattern: str) -> str:
    found = [text for name, text in prompts(ws) if re.search(pattern, name)]
    assert len(found) == 1, (pattern, [n for n, _ in prompts(ws)])
    return found[0]


def guidance_section(prompt: str) -> str:
    """The text of the prompt's ## ROBOT GUIDANCE section ('' when it has none)."""
    m = re.search(r"^## ROBOT GUIDANCE\n(.*?)(?=^## )", prompt, re.M | re.S)
    return m.group(1) if m else ""


def leftovers(sdir: Path) -> list[str]:
    """*.taken files anywhere in the mailbox (a take or reject never finished)."""
    return [p.name for p in (sdir / "signals").rglob("*.taken")]


def one_line_error(result) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# --- STEER and INFO: guidance in the next prompt, and in the scratchpad ---

def test_steer_and_info_for_all_reach_the_next_prompt_and_the_scratchpad(workspace):
    ws = workspace
    setup(ws, [
        {**plan("t1", "t2"), "signals": [
            {"type": "steer", "message": "use the bar library"},
            {"type": "info", "message": "the target is Azure", "target": "ALL"}]},
        DONE, EXECUTE, REVIEW])
    r = start(ws)
    assert r.returncode == 0, r.stderr
    sdir = only_session(ws)

    # dropped (by the humans) while the planner ran: the engine took them at the
    # plan_ready transition
    # and gave both, squashed in order, to the next invocation (of any role)
    first_exec = prompt_of(ws, r"executor-t1-a1")
    section = guidance_section(first_exec)
    assert "1. use the bar library" in section and "2. the target is Azure" in section
    order = [h for h in ("## OBJECTIVE", "## ROBOT GUIDANCE", "## PENDING EVENTS", "## ROLE")]
    assert [first_exec.index(h) for h in order] == sorted(first_exec.index(h) for h in order)
    # a completed run consumed them: no later prompt carries them again
    later = [n for n, text in prompts(ws) if "use the bar library" in text]
    assert later == [n for n, _ in prompts(ws) if "executor-t1-a1" in n]
    assert not guidance_section(prompt_of(ws, r"^001-.*planner"))

    pad = (work_dir(sdir) / "scratchpad.md").read_text()
    assert pad.count("use the bar library") == 1 and pad.count("the target is Azure") == 1
    assert re.search(r"- \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S* STEER for .*: use the bar library", pad)

    processed = signal_files(sdir, "processed")
    assert sorted(d["type"] for d in processed.values()) == ["INFO", "STEER"]
    for doc in processed.values():
        hm = doc["handling_metadata"]
        assert hm["handled_by"] == "Ralph-Orchestrator" and hm["handled_at"] and hm["action_taken"]
    assert not signal_files(sdir, "inputs") and not leftovers(sdir)


def test_targeted_guidance_waits_for_its_role(workspace):
    """--target Executor, dropped while the last reviewer of iteration 1 runs: not given to
    the Librarian nor to the Planner of iteration 2, but to the Executor of iteration 2."""
    ws = workspace
    setup(ws, [
        plan("t1"),
        plan("t2", iteration=2),
        DONE,
        EXECUTE,
        {**REVIEW, "iteration": 1, "signals": [
            {"type": "steer", "message": "only Firefox", "target": "Executor"},
            {"type": "info", "message": "the planner hint", "target": "Ralph-Planner"},
            {"type": "info", "message": "for the reviewer", "target": "reviewer"}]},
        REVIEW])
    r = start(ws)
    assert r.returncode == 0, r.stderr
    sdir = only_session(ws)

    assert not guidance_section(prompt_of(ws, r"it1-librarian"))
    planner2 = guidance_section(prompt_of(ws, r"it2-planner"))
    assert "the planner hint" in planner2 and "only Firefox" not in planner2
    assert "for the reviewer" not in planner2
    executor2 = guidance_section(prompt_of(ws, r"it2-executor-t2"))
    assert executor2.strip() == "only Firefox"
    reviewer2 = guidance_section(prompt_of(ws, r"it2-reviewer-t2"))
    assert reviewer2.strip() == "for the reviewer"
    for name, text in prompts(ws):  # each reaches exactly one invocation
        assert ("only Firefox" in text) == ("it2-executor" in name)
        assert ("for the reviewer" in text) == ("it2-reviewer" in name)

    pad = (work_dir(sdir) / "scratchpad.md").read_text()
    assert "STEER for Executor: only Firefox" in pad
    assert "INFO for Planner: the planner hint" in pad
    actions = sorted(d["handling_metadata"]["action_taken"]
                     for d in signal_files(sdir, "processed").values())
    assert actions == ["queued for Executor", "queued for Planner", "queued for Reviewer"]
    assert not (sdir / "guidance.yaml").exists() or not yaml.safe_load(
        (sdir / "guidance.yaml").read_text())


@pytest.mark.parametrize("backend", ["file", "postgres"])
def test_an_agent_takes_its_own_guidance_with_signals_poll(workspace, backend, request):
    """While an agent runs the engine leaves STEER/INFO alone: the Executor takes the one
    meant for it at a step boundary, and it does not come back in a later prompt. On the
    PostgreSQL store the mailbox is in the database, where the poll's quick look at the
    control plane's files cannot see: the engine answers the poll."""
    from _planes import FilePlane, StorePlane
    ws = workspace
    env = base_env(**FAST)
    if backend == "postgres":
        env["RALPH_STORE_URL"] = request.getfixturevalue("postgres_url")
    setup(ws, [
        plan("t1", "t2"), DONE,
        {**EXECUTE, "task": "t1", "poll": True, "signals": [
            {"type": "steer", "message": "mid-run steer", "target": "Executor"},
            {"type": "info", "message": "not for you", "target": "Reviewer"}]},
        EXECUTE, REVIEW])
    r = start(ws, env=env)
    assert r.returncode == 0, r.stderr
    [polled] = list(ws.glob("polled-*.json"))
    result = json.loads(polled.read_text())
    assert [s["message"] for s in result["signals"]] == ["mid-run steer"]
    plane = FilePlane(ws, "s1") if backend == "file" else \
        StorePlane(ws, "s1", env["RALPH_STORE_URL"])
    by_message = {d["message"]: d for d in plane.mailbox().processed}
    plane.close()
    assert by_message["mid-run steer"]["handling_metadata"]["handled_by"] == "Ralph-Executor"
    assert by_message["not for you"]["handling_metadata"]["handled_by"] == "Ralph-Orchestrator"
    assert all("mid-run steer" not in text for _, text in prompts(ws))
    assert "not for you" in guidance_section(prompt_of(ws, r"reviewer-t1"))
    # the poll it made is the one its prompt asks for, with seed 001's STEER decision tree
    executor_prompt = prompt_of(ws, r"executor-t1")
    assert all(t in steer_skill(executor_prompt) for t in STEER_TREE), executor_prompt
    assert not steer_skill(prompt_of(ws, r"reviewer-t1"))


# seed 001 §3.1's branches and §4 step 3.5's poll, as the executor's skills say them
STEER_TREE = ("tools signals poll` at each step boundary", "continue", "adjust:",
              "restart the task:", "Restarted due to STEER: <summary>", "escalate:",
              "task.failed \"STEER scope change: <summary>\"")


def steer_skill(prompt: str) -> str:
    """The prompt's STEER section ('' when it has none)."""
    m = re.search(r"^### Steering while you work \(STEER\)\n(.*?)(?=^##)", prompt, re.M | re.S)
    return m.group(1) if m else ""


def test_the_steer_decision_tree_stays_with_the_executors_own_instructions():
    """A config's executor instructions replace the role's text, not the STEER skill."""
    own = build_prompt("objective", "executor", "Do it my way.", [], [], ralph="/bin/ralph")
    assert "Do it my way." in own and all(t in steer_skill(own) for t in STEER_TREE)
    assert "/bin/ralph tools signals poll" in steer_skill(own)
    for role in ("planner", "reviewer", "librarian", "questioner"):
        assert not steer_skill(build_prompt("objective", role, None, [], [])), role


# --- PAUSE and ABORT ---

def _running(ws: Path, pattern: str):
    return lambda: any(re.search(pattern, n) for n, _ in prompts(ws))


def test_pause_stops_a_sleeping_agent_and_resume_continues(workspace):
    ws = workspace
    setup(ws, [plan("t1", "t2"), DONE, {**EXECUTE, "task": "t1", "sleep": 60}, EXECUTE, REVIEW])
    began = time.monotonic()
    proc = spawn_start(ws, env=base_env(RALPH_DEMO_SLEEP_SCALE=1))
    wait_for(_running(ws, r"executor-t1"), timeout=30, what="the executor of t1 to start")
    r = ralph(ws, "signal", "pause", "check the API spec first")
    assert r.returncode == 0, r.stderr
    code, out, err = finish(proc)
    assert code == 3, (out, err)
    assert time.monotonic() - began < 15
    sdir = only_session(ws)
    m = metadata(sdir)
    assert m["status"] == "paused"
    assert m["orchestrator"]["state"] == "PAUSED"
    assert m["orchestrator"]["previous_state"] == "EXECUTING_BATCH"
    assert m["orchestrator"]["pause_reason"] == "check the API spec first"
    assert progress_markers(sdir)["1"] == {"t1": "/", "t2": " "}
    assert "Paused by signal" in (sdir / "iterations/1/progress.md").read_text()
    [paused] = signal_files(sdir, "processed").values()
    assert paused["handling_metadata"]["action_taken"] == "paused the session"
    status = ralph(ws, "session", "status", "s1", "--json")
    assert status.returncode == 0

    before = len(prompts(ws))
    r = resume(ws, "s1", "--message", "the spec is fine, go on")  # sleeps scaled to 0
    assert r.returncode == 0, r.stderr
    after = prompts(ws)[before:]
    assert re.search(r"executor-t1-a2", after[0][0])  # the interrupted task runs again
    assert "the spec is fine, go on" in guidance_section(after[0][1])
    assert sum("the spec is fine, go on" in text for _, text in after) == 1
    m = metadata(sdir)
    assert m["status"] == "completed" and m["orchestrator"]["pause_reason"] is None
    assert progress_markers(sdir)["1"] == {"t1": "x", "t2": "x"}
    assert [t["trigger"] for t in transitions(sdir)].count("pause") == 1
    assert "the spec is fine, go on" in (work_dir(sdir) / "scratchpad.md").read_text()


def test_abort_stops_a_sleeping_agent_and_runs_the_cleanup_checklist(workspace):
    ws = workspace
    setup(ws, [plan("t1", "t2", "t3"), DONE,
               {**EXECUTE, "task": "t2", "sleep": 60, "write": {"partial.txt": "kept"}},
               EXECUTE, REVIEW])
    began = time.monotonic()
    proc = spawn_start(ws, env=base_env(RALPH_DEMO_SLEEP_SCALE=1))
    wait_for(_running(ws, r"executor-t2"), timeout=30, what="the executor of t2 to start")
    r = ralph(ws, "signal", "abort", "wrong direction")
    assert r.returncode == 0, r.stderr
    code, out, err = finish(proc)
    assert code == 4, (out, err)
    assert time.monotonic() - began < 15
    sdir = only_session(ws)
    m = metadata(sdir)
    assert m["orchestrator"]["state"] == "COMPLETE"
    assert m["status"] == "aborted" and m["completed_at"]
    assert progress_markers(sdir)["1"] == {"t1": "x", "t2": "F", "t3": " "}
    line = next(text for text in (sdir / "iterations/1/progress.md").read_text().splitlines()
                if "t2" in text)
    assert "Aborted by signal" in line
    it = yaml.safe_load((sdir / "iterations/1/metadata.yaml").read_text())
    assert it["completed_at"]
    [aborted] = signal_files(sdir, "processed").values()
    assert aborted["handling_metadata"]["action_taken"] == "aborted the session"
    assert transitions(sdir)[-1]["trigger"] == "abort"

    # finished: no more signals, no resume
    one_line_error(ralph(ws, "signal", "steer", "too late", "--session", "s1"))
    one_line_error(resume(ws, "s1"))


def test_abort_a_paused_session(workspace):
    ws = workspace
    setup(ws, [plan("t1", "t2"), DONE,
               {**EXECUTE, "task": "t1", "attempt": 1, "signals": [
                   {"type": "pause", "message": "hold on"}], "sleep": 30},
               EXECUTE, REVIEW])
    r = start(ws, env=base_env(RALPH_DEMO_SLEEP_SCALE=1))
    assert r.returncode == 3, r.stderr
    sdir = only_session(ws)
    assert metadata(sdir)["orchestrator"]["pause_reason"] == "hold on"
    assert progress_markers(sdir)["1"]["t1"] == "/"

    r = ralph(ws, "signal", "abort", "never mind")  # a paused session takes signals
    assert r.returncode == 0, r.stderr
    r = resume(ws)
    assert r.returncode == 4, r.stderr
    m = metadata(sdir)
    assert m["status"] == "aborted" and m["orchestrator"]["state"] == "COMPLETE"
    assert progress_markers(sdir)["1"] == {"t1": "F", "t2": " "}
    assert [(t["from"], t["trigger"]) for t in transitions(sdir)][-2:] == [
        ("EXECUTING_BATCH", "pause"), ("PAUSED", "abort")]
    assert yaml.safe_load((sdir / "iterations/1/metadata.yaml").read_text())["completed_at"]
    assert not signal_files(sdir, "inputs") and not leftovers(sdir)
    assert len(prompts(ws)) == 2  # planner, executor t1: nothing ran after the pause


# --- APPROVE and SKIP in KNOWLEDGE_APPROVAL ---

KNOWLEDGE_STEPS = [plan("t1"), DONE, EXECUTE, REVIEW, LIBRARIAN]


def _state(sdir: Path) -> str | None:
    try:
        return metadata(sdir)["orchestrator"]["state"]
    except (FileNotFoundError, TypeError, KeyError, yaml.YAMLError):
        return None


def test_approve_promotes_and_a_stale_approve_is_rejected(workspace):
    ws = workspace
    setup(ws, KNOWLEDGE_STEPS, knowledge={"approval": "required", "timeout_seconds": 60})
    began = time.monotonic()
    proc = spawn_start(ws)
    sdir = wait_for(lambda: session_dir(ws, "s1").is_dir() and session_dir(ws, "s1"),
                    timeout=30, what="the session")
    wait_for(lambda: _state(sdir) == "KNOWLEDGE_APPROVAL", timeout=30,
             what="KNOWLEDGE_APPROVAL")

    r = ralph(ws, "signal", "approve", "old news", "--iteration", "7")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: signal_files(sdir, "rejected"), timeout=30,
             what="the stale APPROVE rejected")
    [stale] = signal_files(sdir, "rejected").values()
    assert stale["type"] == "APPROVE" and "stale" in stale["rejection"]["reason"]
    assert stale["rejection"]["at"]
    # the wait is what is proven: given time to act on the stale APPROVE, it did not
    time.sleep(0.3)
    assert proc.poll() is None and _state(sdir) == "KNOWLEDGE_APPROVAL"  # still waiting
    assert (work_dir(sdir) / "iterations/1/knowledge/notes.md").exists()

    r = ralph(ws, "signal", "approve", "looks good", "--iteration", "1")
    assert r.returncode == 0, r.stderr
    code, out, err = finish(proc)
    assert code == 0, (out, err)
    assert time.monotonic() - began < 30  # far from the 60 s timeout
    assert (ws / ".docs/notes.md").read_text() == "# notes\n\nlearned things\n"
    assert not (work_dir(sdir) / "iterations/1/knowledge/notes.md").exists()
    record = yaml.safe_load((sdir / "iterations/1/knowledge/promoted.yaml").read_text())
    assert record["files"] == [{"staged": "knowledge/notes.md", "promoted_to": ".docs/notes.md"}]
    assert "looks good" in record["why"]
    it = yaml.safe_load((sdir / "iterations/1/metadata.yaml").read_text())
    assert it["knowledge_decision"] == "promoted"
    [approved] = signal_files(sdir, "processed").values()
    assert approved["handling_metadata"]["action_taken"].startswith("promoted")
    assert [(t["from"], t["to"]) for t in transitions(sdir)][-2:] == [
        ("KNOWLEDGE_APPROVAL", "PLANNING"), ("PLANNING", "COMPLETE")]


def test_skip_keeps_knowledge_staged(workspace):
    ws = workspace
    setup(ws, [plan("t1"), DONE, EXECUTE, REVIEW,
               {**LIBRARIAN, "signals": [{"type": "skip", "message": "too specific"}]}],
          knowledge={"approval": "required", "timeout_seconds": 60})
    began = time.monotonic()
    r = start(ws)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - began < 30
    sdir = only_session(ws)
    assert (work_dir(sdir) / "iterations/1/knowledge/notes.md").exists()
    assert not (ws / ".docs").exists()
    assert not (sdir / "iterations/1/knowledge/promoted.yaml").exists()
    it = yaml.safe_load((sdir / "iterations/1/metadata.yaml").read_text())
    assert it["knowledge_decision"] == "skipped"
    [skipped] = signal_files(sdir, "processed").values()
    assert skipped["type"] == "SKIP"
    assert "staged" in skipped["handling_metadata"]["action_taken"]
    assert [t["to"] for t in transitions(sdir)][-3:] == ["KNOWLEDGE_APPROVAL", "PLANNING",
                                                         "COMPLETE"]


def test_knowledge_timeout_carries_it_to_the_next_iteration(workspace):
    ws = workspace
    # a real 1 s timeout: the one test of its wiring through the real `ralph` (the
    # timeout's logic, on the frozen clock: test_deadlines.py)
    setup(ws, KNOWLEDGE_STEPS, knowledge={"approval": "required", "timeout_seconds": 1})
    r = start(ws)
    assert r.returncode == 0, r.stderr
    sdir = only_session(ws)
    work = work_dir(sdir)   # staged and carried knowledge: in the work area
    assert not (work / "iterations/1/knowledge/notes.md").exists()
    assert (work / "iterations/2/knowledge/notes.md").read_text() == "# notes\n\nlearned things\n"
    carried = yaml.safe_load((work / "iterations/2/knowledge/carried_from.yaml").read_text())
    assert carried["carried_from"] == 1 and carried["files"] == ["notes.md"]
    assert not (ws / ".docs").exists()
    it = yaml.safe_load((sdir / "iterations/1/metadata.yaml").read_text())
    assert it["knowledge_decision"] == "carried"


def test_approve_waits_in_inputs_until_knowledge_approval(workspace):
    """Dropped while the Executor runs: it waits in inputs/ through the transitions and the
    reviews, and is consumed once the session is in KNOWLEDGE_APPROVAL."""
    ws = workspace
    setup(ws, [plan("t1"), DONE,
               {**EXECUTE, "signals": [{"type": "approve", "message": "early", "iteration": 1}]},
               {**REVIEW, "snapshot_inputs": True}, LIBRARIAN],
          knowledge={"approval": "required", "timeout_seconds": 60})
    began = time.monotonic()
    r = start(ws)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - began < 30
    sdir = only_session(ws)
    [snapshot] = list(ws.glob("inputs-*.txt"))
    waiting = snapshot.read_text().split()
    assert len(waiting) == 1 and waiting[0] in signal_files(sdir, "processed")
    assert (ws / ".docs/notes.md").exists()
    [approved] = signal_files(sdir, "processed").values()
    assert approved["handling_metadata"]["action_taken"] == \
        "promoted the staged knowledge of iteration 1"


# --- the CLI refuses bad signals ---

def test_signal_cli_refusals(workspace):
    ws = workspace
    setup(ws, [plan("t1"), DONE, EXECUTE, REVIEW])
    one_line_error(ralph(ws, "signal", "steer", "hello", "--session", "nope"))
    one_line_error(ralph(ws, "signal", "steer", "hello"))  # no session at all
    r = start(ws)
    assert r.returncode == 0, r.stderr
    sdir = only_session(ws)
    # completed: it takes no more signals
    one_line_error(ralph(ws, "signal", "info", "late", "--session", "s1"))
    # a paused session for the rest
    setup(ws, [{**plan("t1"), "signals": [{"type": "pause", "message": "p"}]}, DONE])
    assert start(ws, "s2").returncode == 3
    for args in (["shout", "hello"], ["steer", "hello", "--target", "Boss"],
                 ["steer", "hello", "--target", ""], ["approve", "x", "--iteration", "0"],
                 ["approve", "x", "--iteration", "two"], ["steer"]):
        r = ralph(ws, "signal", *args, "--session", "s2")
        one_line_error(r)
        assert "--target" not in args or "target" in r.stderr
    r = ralph(ws, "signal", "STEER", "hello", "--session", "s2", "--target", "ralph-executor")
    assert r.returncode == 0, r.stderr
    [name] = signal_files(session_dir(ws, "s2"), "inputs")
    assert signal_file(r.stdout) == name, r.stdout
    assert re.fullmatch(r"signal\.\d{6}-\d{6}-\d{3}-[0-9a-f]+\.yaml", name)
    doc = signal_files(session_dir(ws, "s2"), "inputs")[name]
    assert doc == {"type": "STEER", "target": "Executor", "message": "hello"}
    assert not signal_files(sdir, "inputs")


# --- concurrency: 4 writers x 250 signals while the engine consumes ---

def _drop_many(session_dir: str, worker: int, count: int, out: str) -> None:
    from datetime import datetime, timezone

    from ralph.session_store import signals
    names = [signals.drop(session_dir, "INFO", f"w{worker}-{i}", now=datetime.now(timezone.utc))
             for i in range(count)]
    Path(out).write_text("\n".join(names))


@pytest.mark.slow
def test_four_writers_a_thousand_signals_each_processed_exactly_once(workspace):
    ws = workspace
    tasks = [f"t{i}" for i in range(1, 9)]
    setup(ws, [plan(*tasks), DONE,
               {**EXECUTE, "task": "t8", "wait_for": "writers-done"},
               {**EXECUTE, "sleep": 0.4}, REVIEW])
    proc = spawn_start(ws, env=base_env(RALPH_DEMO_SLEEP_SCALE=1))
    wait_for(_running(ws, r"executor-t1"), timeout=30, what="the executor of t1 to start")
    sdir = str(session_dir(ws, "s1"))
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_drop_many, args=(sdir, w, 250, str(ws / f"dropped-{w}")))
               for w in range(4)]
    began = time.monotonic()
    for p in workers:
        p.start()
    for p in workers:
        p.join(60)
        assert p.exitcode == 0
    dropped_in = time.monotonic() - began
    assert proc.poll() is None, "the session ended before the writers did"
    consumed_meanwhile = len(list((session_dir(ws, "s1") / "signals/processed").iterdir()))
    (ws / "writers-done").write_text("")
    code, out, err = finish(proc, timeout=120)
    assert code == 0, (out, err)

    dropped = [n for w in range(4) for n in (ws / f"dropped-{w}").read_text().split()]
    assert len(dropped) == len(set(dropped)) == 1000
    session = Path(sdir)
    processed = signal_files(session, "processed")
    assert set(processed) == set(dropped)
    for name, doc in processed.items():
        assert doc["type"] == "INFO"
        hm = doc["handling_metadata"]
        assert hm["handled_by"] == "Ralph-Orchestrator" and hm["action_taken"], name
    assert not signal_files(session, "inputs") and not signal_files(session, "rejected")
    assert not leftovers(session)
    assert not [p for p in (session / "signals").rglob(".*")]  # no writer's temp file left
    pad = (work_dir(session) / "scratchpad.md").read_text()
    for name in dropped:
        assert pad.count(name) == 1, name
    # every message reached a prompt (exactly one: the run that carried it completed)
    texts = [guidance_section(t) for _, t in prompts(ws)]
    for w in range(4):
        for i in range(250):
            assert sum(f". w{w}-{i}\n" in s or s.strip() == f"w{w}-{i}" for s in texts) == 1
    print(f"dropped in {dropped_in:.1f}s; {consumed_meanwhile} consumed meanwhile")


# --- crash between take and handled ---

CRASH_STEPS = [
    plan("t1", "t2", "t3"), DONE,
    {**EXECUTE, "task": "t1", "signals": [{"type": "steer", "message": "crash-proof steer"}]},
    {**EXECUTE, "task": "t2", "attempt": 1, "sleep": 30,
     "signals": [{"type": "pause", "message": "crash-proof pause"}]},
    EXECUTE, REVIEW]


def _trace(path: Path, ws: Path) -> list[tuple[int, str, str]]:
    out = []
    for line in path.read_text().splitlines():
        n, _pid, kind, where = line.split(" ", 3)
        out.append((int(n), kind, os.path.relpath(where, ws)))
    return out


def _check_signals_once(ws: Path) -> None:
    sdir = only_session(ws)
    m = metadata(sdir)
    assert m["status"] == "completed", m
    assert progress_markers(sdir)["1"] == {"t1": "x", "t2": "x", "t3": "x"}
    processed = signal_files(sdir, "processed")
    assert sorted(d["message"] for d in processed.values()) == [
        "crash-proof pause", "crash-proof steer"]
    for doc in processed.values():
        assert doc["handling_metadata"]["handled_by"] == "Ralph-Orchestrator"
    assert [d["handling_metadata"]["action_taken"] for d in processed.values()
            if d["type"] == "PAUSE"] == ["paused the session"]
    assert not signal_files(sdir, "inputs") and not signal_files(sdir, "rejected")
    assert not leftovers(sdir)
    assert (work_dir(sdir) / "scratchpad.md").read_text().count("crash-proof steer") == 1
    # the PAUSE paused the session exactly once
    assert [t["trigger"] for t in transitions(sdir)].count("pause") == 1
    assert [t["trigger"] for t in transitions(sdir)].count("resume") == 1
    # the STEER went to the next executor runs until one completed: t2's, never t3's
    carried = [n for n, text in prompts(ws) if "crash-proof steer" in guidance_section(text)]
    assert [re.sub(r"^\d+-", "", n) for n in carried] == [
        "it1-executor-t2-a1.md", "it1-executor-t2-a2.md"], carried
    guidance = sdir / "guidance.yaml"
    assert not guidance.exists() or not yaml.safe_load(guidance.read_text())  # all delivered


def _run_to_the_end(ws: Path, env: dict, first: subprocess.CompletedProcess) -> None:
    """Resume a killed or paused session until it completes (a PAUSE may pause it once)."""
    codes = [first.returncode]
    for _ in range(3):
        r = resume(ws, env=env)
        codes.append(r.returncode)
        assert r.returncode in (0, 3), (codes, r.stdout, r.stderr)
        if r.returncode == 0:
            return
    pytest.fail(f"never completed: exit codes {codes}")


@pytest.mark.slow
def test_killed_between_take_and_handled_each_signal_is_handled_once(tmp_path):
    """A STEER (taken at the checkpoint after t1) and a PAUSE (taken while t2's executor
    runs): a traced run gives the engine's durable writes from each `signal-take` to its
    `signal-handled`; a fresh session is SIGKILLed right after each of them, then resumed
    to the end. Each signal is handled exactly once: one processed file with its
    handling_metadata, the note once in the scratchpad, one pause."""
    env = base_env(RALPH_DEMO_SLEEP_SCALE=1)
    traced = tmp_path / "traced"
    traced.mkdir()
    setup(traced, CRASH_STEPS)
    r = start(traced, env={**env, "RALPH_TEST_WRITE_TRACE": str(tmp_path / "trace")})
    assert r.returncode == 3, r.stderr
    _run_to_the_end(traced, env, r)
    _check_signals_once(traced)

    writes = _trace(tmp_path / "trace", traced)
    points = []
    for i, (_n, kind, _where) in enumerate(writes):
        if kind == "signal-take":  # the take and every write up to its signal-handled
            for m, kind2, _ in writes[i:]:
                points.append((m, kind2))
                if kind2 == "signal-handled":
                    break
    kinds = [k for _, k in points]
    assert kinds.count("signal-take") == 2 and kinds.count("signal-handled") == 2, writes
    assert {"guidance", "scratchpad", "metadata", "event"} <= set(kinds), writes

    def kill_at(point) -> str | None:
        n, kind = point
        ws = tmp_path / f"k{n:03d}"
        ws.mkdir()
        setup(ws, CRASH_STEPS)
        try:
            r = start(ws, env={**env, "RALPH_TEST_CRASH_AT_WRITE": str(n)})
            assert r.returncode == -os_signal.SIGKILL, (r.returncode, r.stderr)
            assert leftovers(only_session(ws)), "not killed between take and handled"
            _run_to_the_end(ws, env, r)
            _check_signals_once(ws)
        except Exception as e:  # noqa: BLE001 - collect every kill point's failure
            return f"killed after write {n} ({kind}): {type(e).__name__}: {e}"
        return None

    with ThreadPoolExecutor(max_workers=2) as pool:
        failures = [f for f in pool.map(kill_at, points) if f]
    assert not failures, "\n".join(failures)


# --- bad input: whatever lands in inputs/ ends in rejected/ or processed/ ---

MAX = signals.MAX_SIGNAL_BYTES
ANY_TYPE = st.sampled_from(["STEER", "INFO", "PAUSE", "APPROVE", "SKIP", "steer", "Info",
                            "pause", "approve", "skip"])
ANY_TARGET = st.sampled_from(["ALL", "all", "Orchestrator", "Planner", "Executor", "Reviewer",
                              "Librarian", "Questioner", "Ralph-Executor", "ralph-reviewer"])
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats()
           | st.text(max_size=30) | st.binary(max_size=10))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)
VALID = st.fixed_dictionaries({"type": ANY_TYPE}, optional={
    "target": ANY_TARGET, "message": st.none() | st.text(max_size=200),
    "iteration": st.integers(1, 3)})
WRONG_TYPES = st.fixed_dictionaries({}, optional={
    "type": VALUES | ANY_TYPE, "target": VALUES | ANY_TARGET, "message": VALUES,
    "iteration": VALUES})
UNKNOWN_FIELDS = st.builds(lambda doc, extra: {**doc, **extra}, VALID, st.dictionaries(
    st.text(min_size=1, max_size=12).filter(lambda k: k not in signals.FIELDS), VALUES,
    min_size=1, max_size=3))
HUGE = st.builds(lambda kind, n: f"type: {kind}\nmessage: ".encode() + b"x" * n + b"\n",
                 ANY_TYPE, st.sampled_from([MAX - 100, MAX + 1, 2 * MAX]))


def _alias_bomb(field: str) -> bytes:
    """~600 bytes that YAML expands to 9**9 items through aliases."""
    lines, prev = ["a: &a [x, x, x, x, x, x, x, x, x]"], "a"
    for i in range(1, 9):
        lines.append(f"b{i}: &b{i} [" + ", ".join([f"*{prev}"] * 9) + "]")
        prev = f"b{i}"
    return ("\n".join(f"  - {line.split(': ', 1)[1]}" for line in lines).join(
        ["z:\n", f"\n{field}: *{prev}\n"])).encode()


SPECIAL = [
    b"", b"\n", b"null\n", b"[]\n", b"type: STEER\n", b"\xef\xbb\xbftype: INFO\nmessage: bom\n",
    b"type: INFO\nmessage: nul \x00 byte\n", b"\xff\xfe\x00t\x00y\x00p\x00e",
    b"type: INFO\nmessage: !!python/object/apply:os.system [echo hi]\n",
    b"type: INFO\n---\ntype: PAUSE\n", b"type: [INFO]\n", b"{type: INFO, type: STEER}\n",
    b"type: INFO\niteration: " + b"9" * 4000 + b"\n", b"type: INFO\niteration: 1e400\n",
    b"type: INFO\nmessage: &m [*m]\n", b"[" * 5000 + b"]" * 5000,
    b"type: STEER\ntarget: Ralph-\n", b"type: STEER\ntarget: ralph-ralph-executor\n",
    b"type: ABORTED\n", b"type: approve\niteration: true\n", b"type: skip\niteration: 0\n",
    b"type: STEER\nmessage: |\n  multi\n  line\n", b"\ttype: INFO\n", b"type: INFO\nmessage: 12\n",
    _alias_bomb("type"), _alias_bomb("message"), _alias_bomb("iteration"),
]


def _yaml(doc) -> bytes:
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False).encode()


SIGNAL_FILES = st.one_of(
    st.binary(max_size=200), st.text(max_size=200).map(str.encode),
    VALID.map(_yaml), VALID.map(_yaml), WRONG_TYPES.map(_yaml), UNKNOWN_FIELDS.map(_yaml),
    VALUES.map(_yaml), st.sampled_from(SPECIAL))
HYPOTHESIS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _mailbox(root: str) -> str:
    for sub in ("inputs", "processed", "rejected"):
        os.makedirs(os.path.join(root, "signals", sub), exist_ok=True)
    return root


def _now():
    from datetime import datetime, timezone
    return datetime.now(timezone.utc)


@settings(max_examples=150, **HYPOTHESIS)
@given(raw=SIGNAL_FILES | HUGE)
def test_read_never_raises_and_every_file_is_rejected_or_handled(raw):
    with tempfile.TemporaryDirectory() as d:
        _mailbox(d)
        name = "signal.000000-000000-000-test.yaml"
        Path(d, "signals/inputs", name).write_bytes(raw)
        signal, reason, got = signals.read(d, name)
        assert (signal is None) != (reason is None)
        assert got == raw or got == b"?"
        if reason is not None:
            assert isinstance(reason, str) and reason and len(reason) < 2000
            assert signals.reject(d, name, reason, got, now=_now())
            doc = yaml.safe_load(Path(d, "signals/rejected", name).read_bytes())
            assert doc["rejection"]["reason"] == reason and doc["rejection"]["at"]
            assert len(raw) > MAX or signals.read(d, name)[2] == b""  # gone from inputs
        else:
            assert signal.type in signals.TYPES and signal.target in signals.TARGETS
            assert isinstance(signal.message, str)
            assert signals.take(d, name) and not signals.take(d, name)
            signals.mark_handled(d, signal, handled_by="test", action="none", now=_now())
            doc = yaml.safe_load(Path(d, "signals/processed", name).read_bytes())
            assert doc["handling_metadata"]["handled_by"] == "test"
            assert {k: v for k, v in doc.items() if k != "handling_metadata"} == signal.fields()
        assert sorted(os.listdir(Path(d, "signals/inputs"))) == []
        assert not [n for n in os.listdir(Path(d, "signals/processed")) if n.endswith(".taken")]
        assert not [n for n in os.listdir(Path(d, "signals/rejected")) if n.endswith(".taken")]


@settings(max_examples=300, **HYPOTHESIS)
@given(data=VALUES | VALID | WRONG_TYPES | UNKNOWN_FIELDS)
def test_validate_returns_a_signal_or_says_which_field_is_wrong(data):
    try:
        signal = signals.validate(data, "x")
    except BadInput as e:
        assert str(e).startswith("$"), e
        assert len(str(e)) < 2000
        return
    assert signal.type in signals.TYPES and signal.target in signals.TARGETS


def test_validate_error_about_an_alias_bomb_is_short():
    bomb = ["x"] * 9
    for _ in range(8):
        bomb = [bomb] * 9   # 9**9 leaves: a full repr would never end
    for field in ("type", "target", "iteration"):
        with pytest.raises(BadInput) as e:
            signals.validate({"type": "STEER", **{field: bomb}})
        assert len(str(e.value)) < 500


def test_odd_entries_in_inputs_never_block_nor_crash(tmp_path):
    d = _mailbox(str(tmp_path))
    inputs = tmp_path / "signals/inputs"
    os.mkfifo(inputs / "a-fifo")                            # opening it must not block
    (tmp_path / "valid.yaml").write_bytes(b"type: STEER\nmessage: via a link\n")
    (inputs / "a-link").symlink_to(tmp_path / "valid.yaml")  # symlinks are refused
    (inputs / "a-dir").mkdir()                               # moved aside whole, unread
    (inputs / "a-dir" / "inner.yaml").symlink_to(tmp_path / "valid.yaml")
    assert signals.waiting(d) == ["a-dir", "a-fifo", "a-link"]
    reasons = {}
    for name in signals.waiting(d):
        signal, reason, raw = signals.read(d, name)
        assert signal is None and reason
        assert signals.reject(d, name, reason, raw, now=_now())
        reasons[name] = reason
    assert reasons == {"a-dir": "not a signal file: a directory (moved aside whole, never read)",
                       "a-fifo": "not a signal file: a FIFO",
                       "a-link": "not a signal file: a symlink (never followed)"}
    assert os.listdir(inputs) == []
    rejected = tmp_path / "signals/rejected"
    docs = {n: yaml.safe_load((rejected / n).read_text()) for n in reasons}
    assert {n: doc["rejection"]["reason"] for n, doc in docs.items()} == reasons
    (kept,) = [p for p in rejected.iterdir() if p.is_dir()]
    assert re.fullmatch(r"a-dir\.[0-9a-f]{8}\.dir", kept.name)
    assert os.readlink(kept / "inner.yaml") == str(tmp_path / "valid.yaml")   # untouched
    assert (tmp_path / "valid.yaml").read_bytes() == b"type: STEER\nmessage: via a link\n"


def test_a_session_rejects_non_files_and_duplicate_keys_with_the_reason(workspace):
    """Planted in inputs/ while the planner runs: what would abort the session if read
    as PyYAML reads it (the last `type:` wins) or if followed (a link, a directory holding
    a signal), and entries no reader may open. The engine rejects each with its reason,
    opens none of them, walks no directory, and the session completes."""
    ws = workspace
    setup(ws, [{**plan("t1"), "wait_for": "planted"}, DONE, EXECUTE, REVIEW])
    proc = spawn_start(ws)
    wait_for(_running(ws, r"planner"), timeout=30, what="the planner to run")
    sdir = only_session(ws)
    inputs, _, rejected = (Path(p) for p in signals.dirs(str(sdir)))
    abort = ws / "abort.yaml"
    abort.write_bytes(b"type: ABORT\nmessage: obey me\n")
    (sdir / "aside").write_bytes(b"type: INFO\nmessage: harmless\ntype: ABORT\n")
    os.rename(sdir / "aside", inputs / "signal.1-dup.yaml")
    (sdir / "aside").mkdir()
    (sdir / "aside" / "signal.inner.yaml").write_bytes(abort.read_bytes())
    (sdir / "aside" / "outside").symlink_to(abort)
    os.rename(sdir / "aside", inputs / "signal.2-dir.yaml")
    (inputs / "signal.3-link.yaml").symlink_to(abort)
    os.mkfifo(inputs / "signal.4-fifo.yaml")
    # a socket's path must be short: bound from inside the directory
    subprocess.run([sys.executable, "-c", "import os, socket; os.chdir(os.sys.argv[1]); "
                    "socket.socket(socket.AF_UNIX).bind('signal.5-sock.yaml')", str(inputs)],
                   check=True)
    (ws / "planted").write_text("")

    code, out, err = finish(proc, timeout=120)
    assert code == 0 and "Traceback" not in err, (code, out, err)
    assert metadata(sdir)["orchestrator"]["state"] == "COMPLETE"
    assert os.listdir(inputs) == []
    reasons = {name: doc["rejection"]["reason"]
               for name, doc in signal_files(sdir, "rejected").items()}
    assert reasons == {
        "signal.1-dup.yaml": "signal.1-dup.yaml: $: duplicate key type (line 3)",
        "signal.2-dir.yaml": "not a signal file: a directory (moved aside whole, never read)",
        "signal.3-link.yaml": "not a signal file: a symlink (never followed)",
        "signal.4-fifo.yaml": "not a signal file: a FIFO",
        "signal.5-sock.yaml": "not a signal file: a socket"}
    (kept,) = [p for p in rejected.iterdir() if p.is_dir()]
    assert kept.name.startswith("signal.2-dir.yaml.") and kept.name.endswith(".dir")
    assert sorted(p.name for p in kept.iterdir()) == ["outside", "signal.inner.yaml"]
    assert os.readlink(kept / "outside") == str(abort)
    assert abort.read_bytes() == b"type: ABORT\nmessage: obey me\n"
    assert not signal_files(sdir, "processed") and not leftovers(sdir)


def _generated_batch(n: int) -> list[bytes]:
    """`n` signal files drawn by hypothesis (run as an inner test that collects them)."""
    drawn: list[bytes] = []

    @settings(max_examples=n, **HYPOTHESIS)
    @given(raw=SIGNAL_FILES)
    def collect(raw):
        drawn.append(raw)

    collect()
    return drawn


@pytest.mark.slow
def test_a_session_consumes_a_generated_batch_of_bad_and_good_signals(workspace):
    ws = workspace
    setup(ws, [{**plan("t1", "t2"), "sleep": 1.5}, DONE, EXECUTE, REVIEW, LIBRARIAN],
          knowledge={"approval": "required", "timeout_seconds": 1})
    batch = _generated_batch(200) + SPECIAL + [
        b"type: STEER\nmessage: " + b"x" * (MAX - 100) + b"\n",
        b"type: INFO\nmessage: " + b"x" * (MAX + 1) + b"\n"]
    proc = spawn_start(ws, env=base_env(RALPH_DEMO_SLEEP_SCALE=1))
    sdir = wait_for(lambda: session_dir(ws, "s1").is_dir() and session_dir(ws, "s1"),
                    timeout=30, what="the session")
    inputs = sdir / "signals/inputs"
    names = []
    for i, raw in enumerate(batch):  # written aside, renamed in, while the planner runs
        name = f"signal.000000-000000-{i:03d}-gen.yaml"
        (sdir / "aside").write_bytes(raw)
        os.rename(sdir / "aside", inputs / name)
        names.append(name)
    os.mkfifo(sdir / "aside")
    os.rename(sdir / "aside", inputs / "signal.fifo")
    (inputs / "signal.dir.yaml").mkdir()
    (inputs / "signal.link.yaml").symlink_to(ws / "ralph.yml")
    names += ["signal.fifo", "signal.dir.yaml", "signal.link.yaml"]

    code, out, err = finish(proc, timeout=120)
    codes = [code]
    while code == 3:  # a PAUSE from the batch paused it; resume until it completes
        assert len(codes) < 5, codes
        r = resume(ws)
        code, out, err = r.returncode, r.stdout, r.stderr
        codes.append(code)
    assert code == 0, (codes, out, err)
    assert "Traceback" not in err

    processed, rejected = signal_files(sdir, "processed"), signal_files(sdir, "rejected")
    assert not set(processed) & set(rejected)
    assert set(processed) | set(rejected) == set(names), set(names) - set(processed) - set(rejected)
    assert list(inputs.iterdir()) == []   # the directory too: moved aside, beside its reason
    assert not leftovers(sdir)
    for doc in processed.values():
        assert doc["handling_metadata"]["handled_by"] and doc["handling_metadata"]["action_taken"]
    for name, doc in rejected.items():
        assert doc["rejection"]["reason"] and doc["rejection"]["at"], name
    # each file is where read() says it belongs
    for i, raw in enumerate(batch):
        name = f"signal.000000-000000-{i:03d}-gen.yaml"
        tmp = _mailbox(str(ws / "check"))
        Path(tmp, "signals/inputs", name).write_bytes(raw)
        signal, reason, _ = signals.read(tmp, name)
        Path(tmp, "signals/inputs", name).unlink()
        if signal is None:
            assert name in rejected, (name, raw[:200])
        elif signal.type in ("APPROVE", "SKIP") and signal.iteration not in (None, 1):
            assert name in rejected and "stale" in rejected[name]["rejection"]["reason"]
        else:
            assert name in processed, (name, raw[:200])
    pauses = sum(1 for d in processed.values() if d["type"] == "PAUSE")
    assert codes.count(3) == (1 if pauses else 0)
    print(f"{len(processed)} processed, {len(rejected)} rejected, exit codes {codes}")
