"""The real Claude Code, Codex and Gemini CLIs (npm, pinned in tests/agents/package.json) driven
by ralph against a scripted model server that speaks their wire protocols
(tests/support/model_server.py): the model answers with tool calls that make each CLI
run `ralph ...` through its own shell tool, as a model would.

Every test runs as the CI user (root in CI), in a workspace outside any git repository,
with only the model endpoint configured, and with a PATH that does not hold `ralph`.
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from support import events, finish, metadata, wait_for, work_dir
from support.agents import CLIS, Rig, processes_marked, wait_for_process
from support.model_server import Brain, Say, Shell, Tool, Turn

pytestmark = pytest.mark.slow


@pytest.fixture(params=CLIS)
def rig(request, tmp_path):
    rigs = []

    def make(brain: Brain | None = None) -> Rig:
        rigs.append(Rig(request.param, tmp_path, brain))
        return rigs[-1]
    yield make
    for r in rigs:
        r.close()


class Sleepy(Brain):
    """An executor whose first attempt runs a long command before it reports. The shell
    and its sleep write their pid and start time to pids.txt: the test checks them by
    their own identity, not with the containment it tests."""

    def __init__(self, seconds: int):
        self.seconds = seconds

    def executor(self, turn: Turn):
        # no $(...): Gemini CLI's shell tool refuses command substitution
        me = '{ printf "%s " "$1"; cut -d" " -f22 "/proc/$1/stat"; } >> "$RALPH_WORKSPACE/pids.txt"'
        if turn.step == 0:
            return Shell(f'note() {{ {me}; }}; note $$; if [ "$RALPH_ATTEMPT" = 1 ]; then '
                         f'sleep {self.seconds} & note $!; wait; fi; '
                         f'{turn.ralph} emit build.done "{self.EVIDENCE}"')
        return Say("Built.")


def work_area(r: Rig):
    """The work area of the rig's session (where its runs' marks point), once it exists."""
    wait_for(lambda: r.session_dir().exists(), timeout=60)
    return work_dir(r.session_dir())


def recorded_alive(ws) -> list[str]:
    """The processes pids.txt names that still run (the same pid and start time)."""
    alive = []
    for line in (ws / "pids.txt").read_text().splitlines():
        pid, start = line.split()
        try:
            stat = open(f"/proc/{pid}/stat", "rb").read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if fields[0] != b"Z" and fields[19].decode() == start:
            alive.append(line)
    return alive


def test_a_whole_session_reaches_complete_with_tokens_and_cost(rig):
    r = rig()
    # no ralph on the agent's PATH: the model calls the absolute path its prompt gives
    # (codex runs it in a login shell, which resets PATH anyway)
    assert not any(os.path.exists(os.path.join(p, "ralph")) for p in r.env["PATH"].split(":"))
    code, out, err = finish(r.start(), timeout=120)
    assert code == 0, out + err
    sd = r.session_dir()
    meta = metadata(sd)
    assert meta["status"] == "completed" and meta["tasks"]["completed"] == 1
    assert (r.ws / "hello.txt").read_text().strip() == "hello"
    evs = events(sd)
    # the planner's last words were "... LOOP_COMPLETE": recognised from its final text
    final = [e for e in evs if e["topic"] == "LOOP_COMPLETE"]
    assert final and final[-1]["payload"] == "final text", [e["topic"] for e in evs]
    # each agent event carries the run it came from
    done = next(e for e in evs if e["topic"] == "build.done")
    assert done["run"].endswith("-executor-t1") and done["source"] == "executor"
    usage = meta["usage"]
    runs = usage["agent_invocations"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert set(usage["by_role"]) == {"planner", "executor", "reviewer", "librarian"}
    assert sum(u["input_tokens"] for u in usage["by_role"].values()) == usage["input_tokens"]
    if r.cli in ("codex", "gemini"):   # tokens only: priced at the preset's list price
        expected = (usage["input_tokens"] * 1.25 + usage["output_tokens"] * 10.0) / 1e6
        assert usage["cost_usd"] == pytest.approx(expected)
    else:                  # Claude reports its own cost
        assert usage["cost_usd"] > 0
    assert runs == 5, runs
    assert any("The ralph command here is `/" in b for b in r.server.bodies())
    status = r.ralph("session", "status", "real")
    assert "tokens" in status.stdout, status.stdout
    assert not processes_marked(work_dir(sd))


def test_pause_mid_run_stops_every_process_and_resume_completes(rig):
    r = rig(Sleepy(30))
    engine = r.start()
    sd = r.session_dir()
    wait_for_process(work_area(r), "sleep 30")
    r.ralph("signal", "pause", "coffee break", "--session", "real")
    code, out, err = finish(engine, timeout=30)
    assert code == 3, out + err
    assert not processes_marked(work_dir(sd)), processes_marked(work_dir(sd))
    assert not recorded_alive(r.ws)
    meta = metadata(sd)
    assert meta["status"] == "paused"
    if r.cli == "claude":   # it streamed its usage before the command: kept though stopped
        assert meta["usage"]["by_role"]["executor"]["input_tokens"] > 0
    code, out, err = finish(r.resume(), timeout=120)
    assert code == 0, out + err
    assert metadata(sd)["status"] == "completed"


def test_abort_mid_tool_command_leaves_no_process_and_no_late_event(rig):
    r = rig(Sleepy(8))
    engine = r.start()
    sd = r.session_dir()
    wait_for_process(work_area(r), "sleep 8")
    asked = time.monotonic()
    r.ralph("signal", "abort", "wrong direction", "--session", "real")
    code, out, err = finish(engine, timeout=30)
    assert code == 4, out + err
    assert time.monotonic() - asked < 10
    assert not processes_marked(work_dir(sd)), processes_marked(work_dir(sd))
    assert not recorded_alive(r.ws)
    # the wait is what is proven: past the command's `sleep 8; ralph emit build.done`, no
    # event lands
    time.sleep(9)
    topics = [e["topic"] for e in events(sd)]
    assert "build.done" not in topics, topics
    assert metadata(sd)["status"] == "aborted"


def processes_of_the_run(session_dir) -> dict[tuple[int, int], str]:
    """Every process of the session's agent run (its supervisor's tree, the supervisor
    too), by identity: (pid, start time) -> command line."""
    from ralph.engine.running import containment, procfs
    [supervisor] = [p for p in procfs.pids()
                    if procfs.comm(p) == containment.SUPERVISOR_NAME and
                    procfs.environ(p, (containment.SESSION_MARK,)).get(
                        containment.SESSION_MARK) == str(work_dir(session_dir))]
    kids: dict[int, list[int]] = {}
    for child, parent in procfs.live_parents().items():
        kids.setdefault(parent, []).append(child)
    found, todo = {}, [supervisor]
    while todo:
        p = todo.pop()
        todo.extend(kids.get(p, ()))
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if (stat := procfs.live(p)) is not None:
            found[(p, stat[1])] = cmd.strip()
    return found


def read_if_there(path) -> str:
    return path.read_text() if path.exists() else ""


def still_running(processes) -> list[str]:
    from ralph.engine.running import procfs
    return [cmd for (pid, start), cmd in processes.items()
            if (stat := procfs.live(pid)) is not None and stat[1] == start]


def test_kill_9_of_the_engine_stops_its_run_and_resume_hears_nothing_from_it(rig):
    r = rig(Sleepy(60))
    engine = r.start()
    sd = r.session_dir()
    wait_for_process(work_area(r), "sleep 60")
    # the shell and its sleep noted (the shell's command line names the sleep already)
    wait_for(lambda: len(read_if_there(r.ws / "pids.txt").splitlines()) == 2, timeout=30)
    run = processes_of_the_run(sd)
    assert any(cmd.startswith("sleep 60") for cmd in run.values()), run
    # the CLI itself is there (codex: its node wrapper, the native binary, `ralph mcp`)
    assert any(f"/{r.cli}" in cmd for cmd in run.values()), run
    dead_run = next(p.name[:-len(".prompt.md")] for p in
                    (work_dir(sd) / "iterations/1/logs").glob("*-executor-t1.prompt.md"))
    engine.send_signal(signal.SIGKILL)
    engine.communicate()
    # no resume: within the grace (and a little) nothing of the run is left
    from ralph.engine.running.containment import GRACE_SECONDS
    wait_for(lambda: not still_running(run) and not recorded_alive(r.ws),
             timeout=GRACE_SECONDS + 5)
    assert not processes_marked(work_dir(sd)), processes_marked(work_dir(sd))
    # what the dead run would say now is refused, and recorded as refused by the next
    # engine, which takes nothing of it
    late = dict(r.env, RALPH_SESSION_DIR=str(work_dir(sd)), RALPH_RUN_ID=dead_run,
                RALPH_ROLE="executor", RALPH_SESSION_ID="real")
    refused = r.ralph("emit", "build.done", Brain.EVIDENCE, env=late)
    assert refused.returncode == 2, refused
    assert "refused" in refused.stderr and "no engine" in refused.stderr, refused.stderr
    code, out, err = finish(r.resume(), timeout=120)
    assert code == 0, out + err
    assert "left by an earlier engine" not in out
    # (the re-run's CLI may also say something after its own run closed: refused too,
    # under its own run; and the dead run's shell, its sleep stopped by SIGTERM, may have
    # reached its own `emit` within the grace: refused the same way)
    records = [e for e in events(sd) if e["topic"] == "emit.refused"
               and e.get("run") == dead_run]
    assert 1 <= len(records) <= 2, records
    for record in records:
        assert record["payload"]["payload"] == Brain.EVIDENCE
        assert record["payload"]["topic"] == "build.done"
        assert record["payload"]["why"] == "its run ended with the engine that ran it"
    assert not processes_marked(work_dir(sd)), processes_marked(work_dir(sd))
    taken = [e for e in events(sd) if e["topic"] == "build.done"]
    assert taken and all(e["run"] != dead_run for e in taken), taken
    assert metadata(sd)["status"] == "completed"


class Asker(Brain):
    """An executor that asks a human from inside its run, then builds what was chosen."""

    def executor(self, turn: Turn):
        if turn.step == 0:
            return Shell(f'{turn.ralph} tools interact ask "Which database?" '
                         f'--option sqlite --option postgres')
        if turn.step == 1:
            chosen = "postgres" if "postgres" in turn.outputs[0] else "none"
            return Shell(f'{turn.ralph} emit build.done "database: {chosen}, {self.EVIDENCE}"')
        return Say("Built.")


def test_ask_answered_from_the_cli_reaches_the_agent(rig):
    r = rig(Asker())
    engine = r.start()
    sd = r.session_dir()
    wait_for(lambda: sd.exists() and list((sd / "questions").glob("*.yaml")), timeout=60)
    answered = r.ralph("session", "answer", "real", "2")    # option 2: postgres
    assert answered.returncode == 0, answered
    code, out, err = finish(engine, timeout=120)
    assert code == 0, out + err
    done = next(e for e in events(sd) if e["topic"] == "build.done")
    assert "database: postgres" in done["payload"], done


class Interactor(Brain):
    """An executor that asks after its run (human.interact), then builds on the answer."""

    def executor(self, turn: Turn):
        if "- human.response:" not in turn.prompt:   # in PENDING EVENTS once answered
            if turn.step == 0:
                return Shell(f'{turn.ralph} emit human.interact "Tabs or spaces?"')
            return Say("Waiting for the human.")
        if turn.step == 0:
            return Shell(f'{turn.ralph} emit build.done "{self.EVIDENCE}"')
        return Say("Built with the human's choice.")


def test_human_interact_answer_reaches_the_next_request(rig):
    r = rig(Interactor())
    engine = r.start()
    sd = r.session_dir()
    wait_for(lambda: sd.exists() and list((sd / "questions").glob("*.yaml")), timeout=60)
    answered = r.ralph("session", "answer", "real", "spaces, four of them")
    assert answered.returncode == 0, answered
    code, out, err = finish(engine, timeout=120)
    assert code == 0, out + err
    # the answer was in what the CLI sent to the model for the executor's next run
    bodies = r.server.bodies()
    assert any("- human.response:" in b and "spaces, four of them" in b for b in bodies)


# --- through ralph's MCP server only (claude and codex take it; gemini uses the shell) ---

class ThroughMcp(Brain):
    """Every role talks to ralph through its MCP tools, never through the shell."""

    def planner(self, turn: Turn):
        if turn.step == 0:
            return Tool("status", {})
        first = _iteration_of(turn.outputs[0]) == 1
        if first and turn.step == 1:
            return Tool("emit", {"topic": "plan.ready", "payload": {"tasks": [
                {"id": "t1", "title": "Write hello.txt", "batch": 1}]}})
        if first:
            return Say("Planned.")
        if turn.step == 1:
            return Tool("emit", {"topic": "LOOP_COMPLETE", "payload": "nothing is left"})
        return Say("Done.")

    def executor(self, turn: Turn):
        if turn.step == 0:
            return Tool("progress", {"message": "writing hello.txt"})
        if turn.step == 1:
            return Tool("ask", {"question": "Greet in English?", "options": ["yes", "no"]})
        if turn.step == 2:
            return Tool("emit", {"topic": "build.done",
                                 "payload": f"english: {turn.outputs[1]}, {self.EVIDENCE}"})
        return Say("Built.")

    def reviewer(self, turn: Turn):
        if turn.step == 0:
            return Tool("emit", {"topic": "review.done", "payload": "tests: pass, build: pass"})
        return Say("Reviewed.")


def _iteration_of(status_output: str) -> int | None:
    """The session's iteration in what the `status` tool returned (codex puts a header of
    its own before the tool's text)."""
    start = status_output.find("{")
    view, _ = json.JSONDecoder().raw_decode(status_output[start:])
    return view.get("iteration")


@pytest.fixture(params=[c for c in CLIS if c != "gemini"])
def mcp_rig(request, tmp_path):
    rigs = []

    def make(brain: Brain, sub: str = "") -> Rig:
        (tmp_path / sub).mkdir(exist_ok=True)
        rigs.append(Rig(request.param, tmp_path / sub, brain))
        return rigs[-1]
    yield make
    for r in rigs:
        r.close()


def test_a_whole_session_through_mcp_only(mcp_rig):
    """Every event and the human question through `ralph mcp`, none through the shell."""
    r = mcp_rig(ThroughMcp())
    engine = r.start()
    sd = r.session_dir()
    wait_for(lambda: sd.exists() and list((sd / "questions").glob("*.yaml")), timeout=60)
    answered = r.ralph("session", "answer", "real", "1")     # option 1: yes
    assert answered.returncode == 0 and "gets it now" in answered.stdout, answered
    code, out, err = finish(engine, timeout=120)
    assert code == 0, out + err
    evs = events(sd)
    topics = [e["topic"] for e in evs]
    assert {"plan.ready", "human.progress", "human.question", "build.done", "review.done",
            "LOOP_COMPLETE"} <= set(topics), topics
    assert next(e for e in evs if e["topic"] == "build.done")["payload"].startswith(
        "english: yes,")
    assert all(e.get("run") for e in evs if e["source"] in ("planner", "executor", "reviewer"))
    assert metadata(sd)["status"] == "completed"
    # the model never used the shell: everything went through the MCP tools
    assert "shell" not in r.server.calls and "mcp:ask" in r.server.calls, r.server.calls
    assert not processes_marked(work_dir(sd))


class AsksThroughMcp(Brain):
    def executor(self, turn: Turn):
        if turn.step == 0:
            return Tool("ask", {"question": "Which database?",
                                "options": ["sqlite", "postgres"]})
        if turn.step == 1:
            chosen = "postgres" if "postgres" in turn.outputs[0] else "none"
            return Tool("emit", {"topic": "build.done",
                                 "payload": f"database: {chosen}, {self.EVIDENCE}"})
        return Say("Built.")


def test_an_ask_answered_after_150_seconds_still_reaches_the_agent(tmp_path):
    """Longer than Claude's 120 s Bash default and codex's 60 s MCP default: both CLIs at
    once, each blocked in the MCP `ask` for 150 s, then answered from the CLI."""
    for cli in ("claude", "codex"):
        (tmp_path / cli).mkdir()
    rigs = [Rig(cli, tmp_path / cli, AsksThroughMcp()) for cli in ("claude", "codex")]
    engines = []
    try:
        engines += [r.start() for r in rigs]
        for r in rigs:
            wait_for(lambda: r.session_dir().exists()
                     and list((r.session_dir() / "questions").glob("*.yaml")), timeout=60)
        # the wait is what is proven: each CLI's ask outlives its own 60/120 s default
        time.sleep(150)
        for r in rigs:
            answered = r.ralph("session", "answer", "real", "postgres")
            assert answered.returncode == 0 and "gets it now" in answered.stdout, answered
        for r, engine in zip(rigs, engines):
            code, out, err = finish(engine, timeout=120)
            assert code == 0, (r.cli, out + err)
            done = next(e for e in events(r.session_dir()) if e["topic"] == "build.done")
            assert "database: postgres" in done["payload"], (r.cli, done)
            assert not processes_marked(work_dir(r.session_dir()))
    finally:
        for engine in engines:
            if engine.poll() is None:
                engine.kill()
                engine.communicate()
        for r in rigs:
            r.close()


class TwoTasks(Brain):
    """Plans two independent tasks; each executor writes its own file where it runs."""

    def planner(self, turn: Turn):
        if turn.step == 0:
            return Shell('echo "iteration=$RALPH_ITERATION"')
        if "iteration=1" in turn.outputs[0]:
            if turn.step == 1:
                plan = {"tasks": [{"id": t, "title": f"Write {t}.txt", "batch": 1}
                                  for t in ("t1", "t2")]}
                return Shell(f"{turn.ralph} emit plan.ready --json '{json.dumps(plan)}'")
            return Say("The plan is published.")
        return Say("Everything in the objective is done.\nLOOP_COMPLETE")

    def executor(self, turn: Turn):
        if turn.step == 0:
            return Shell(f'echo "made by $RALPH_TASK_ID" > "$RALPH_TASK_ID.txt" && pwd && '
                         f'{turn.ralph} emit build.done "{self.EVIDENCE}"')
        return Say("Done.")


def test_a_parallel_batch_runs_each_task_in_its_worktree_and_merges_them(rig, tmp_path):
    """event_loop.parallel with the real CLI: each executor works in its own git worktree
    (codex's sandbox is let reach the work area), its task a commit, merged in plan order."""
    import subprocess
    r = rig(TwoTasks())

    def git(*args):
        return subprocess.run(["git", "-C", str(r.ws), *args], capture_output=True,
                              text=True, check=True).stdout
    git("init", "--quiet", "--initial-branch", "main")
    (r.ws / "README").write_text("a project\n")
    git("add", "README")
    git("-c", "user.name=u", "-c", "user.email=u@localhost", "commit", "--quiet", "-m", "start")
    config = tmp_path / "parallel.yml"   # outside the workspace: a clean tree starts
    config.write_text("event_loop: {parallel: 2}\nRObot: {timeout_seconds: 5}\n")
    code, out, err = finish(r.start("-c", str(config)), timeout=300)
    assert code == 0, out[-3000:] + err[-3000:]
    sd = r.session_dir()
    assert metadata(sd)["tasks"]["completed"] == 2
    for t in ("t1", "t2"):
        assert (r.ws / f"{t}.txt").read_text() == f"made by {t}\n"
    trailers = git("log", "--format=%(trailers:key=Ralph-Task,valueonly)", "ralph/real").split()
    assert sorted(trailers) == ["t1", "t2"]
    assert git("log", "--merges", "--format=%s", "ralph/real").count("merge task") == 2
    assert git("worktree", "list").count("\n") == 1 and not git("branch", "--list",
                                                                "ralph-lane/*").strip()
    # each executor's commit was made in its worktree, on its lane's branch
    assert sorted(e["payload"]["task"] for e in events(sd) if e["topic"] == "git.commit") \
        == ["t1", "t2"]
