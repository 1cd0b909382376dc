"""DESIGN §10: an agent process never outlives its run, and a run that is over is not heard.

Every session here is the real `ralph` run as a subprocess, with stand-in agents (the
`command` backend) that do what real agent CLIs and their tools do: start a command in
a session of its own (`setsid`), double-fork a daemon, run behind a shell wrapper, trap
SIGTERM to save their work (and try to emit while they do). No mocks: the processes are
real, and are looked for in /proc, by the marks every run carries in its environment
(RALPH_RUN_ID, RALPH_SESSION_DIR), with `engine.containment.find`. Every run runs under
its supervisor (engine/running/supervisor.py), which stops the run should its engine die.

Each agent records the processes it starts as `<pid> <starttime>` (field 22 of
/proc/<pid>/stat), so a pid reused meanwhile is never taken for the process it was.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support import (EVIDENCE, FAST, RALPH, REPO, base_env, events, finish, metadata,
                     new_session, only_session, progress_markers, ralph, session_dirs, spawn,
                     wait_for, work_dir, write_config)
from ralph.engine.running import containment, procfs
from ralph.engine.agents.presets import Claude, Codex, RunSetup

# What every stand-in agent shares (written to the workspace as agentlib.py; the agents
# import it: their own directory is first on sys.path).
AGENTLIB = textwrap.dedent('''
    import json, os, subprocess, sys, time

    ENV = os.environ
    ROLE = ENV.get("RALPH_ROLE", "")
    WS = ENV["RALPH_WORKSPACE"]
    RALPH = [sys.executable, "-m", "ralph.engine"]
    EVIDENCE = %r

    def emit(*args):
        return subprocess.run(RALPH + ["emit", *args], capture_output=True, text=True)

    def normal():
        """The role's outcome: one task t1 planned, built, reviewed; then complete."""
        if ROLE == "planner":
            if ENV["RALPH_ITERATION"] == "1":
                r = emit("plan.ready", "--json", '{"tasks": [{"id": "t1", "title": "T1"}]}')
            else:
                r = emit("LOOP_COMPLETE")
        elif ROLE == "executor":
            r = emit("build.done", EVIDENCE)
        elif ROLE == "reviewer":
            r = emit("review.done", "tests: pass, build: pass")
        else:
            return
        if r.returncode != 0:
            sys.exit("emit failed: " + r.stderr)

    def path(name):
        return os.path.join(WS, name)

    def mark(name, text=""):
        """Write a file of the workspace whole (the test polls for it)."""
        tmp = path("." + name + ".tmp.%%d" %% os.getpid())
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, path(name))

    def starttime(pid):
        with open("/proc/%%d/stat" %% pid, "rb") as f:
            stat = f.read()
        return stat[stat.rfind(b")") + 2:].split()[19].decode()

    def record(name, pid):
        mark(name, "%%d %%s" %% (pid, starttime(pid)))

    def wait_file(name, timeout=30):
        deadline = time.monotonic() + timeout
        while not os.path.exists(path(name)):
            if time.monotonic() > deadline:
                sys.exit("never saw " + name)
            time.sleep(0.02)   # poll: until the file appears

    def setsid_sleep(seconds):
        """A grandchild in a session of its own (what Claude Code's Bash tool does)."""
        pid = os.fork()
        if pid == 0:
            os.setsid()
            os.execvp("sleep", ["sleep", str(seconds)])
        return pid

    def daemon_sleep(seconds):
        """A double-forked daemon: its parent is gone at once, it is nobody's child."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork() == 0:
                os.write(w, str(os.getpid()).encode())
                os.close(w)
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.execvp("sleep", ["sleep", str(seconds)])
            os._exit(0)
        os.close(w)
        daemon = int(os.read(r, 64))
        os.close(r)
        os.waitpid(pid, 0)
        return daemon

    def envless_daemon(name, *argv):
        """Double-forked, in a session of its own, its environment cleared: no mark, and
        nobody's child but the subreaper's. Its pid recorded as `name`."""
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork() == 0:
                record(name, os.getpid())
                os.execvp("env", ["env", "-i", *argv])
            os._exit(0)
        os.waitpid(pid, 0)
        wait_file(name)
''') % EVIDENCE


# the supervisor's own containment, the only one when the human runs agents unconfined
# (`--sandbox none`): the agents here record their pids, which a sandbox's PID namespace
# renumbers. tests/test_sandbox.py proves the same of a sandboxed run.
UNCONFINED = ("--sandbox", "none")


def setup(ws: Path, agent: str, command: list[str] | None = None, **config) -> Path:
    """The agent script `agent` (after `from agentlib import *`) as the command backend of
    every role; the fallback assessor off (no human is there to ask)."""
    (ws / "agentlib.py").write_text(AGENTLIB)
    script = ws / "agent.py"
    script.write_text("from agentlib import *\n" + textwrap.dedent(agent))
    return write_config(ws, {"agent": {"backend": "command",
                                       "command": command or [sys.executable, str(script)],
                                       "prompt_mode": "stdin"},
                             "fallback": {"enabled": False}, **config})


def start(ws: Path, sid: str, **kw):
    return ralph(ws, "session", "start", "contain every agent process", "--id", sid, *UNCONFINED,
                 env=base_env(**FAST), timeout=60, **kw)


def spawn_start(ws: Path, sid: str, **env) -> subprocess.Popen:
    return spawn(ws, "session", "start", "contain every agent process", "--id", sid, *UNCONFINED,
                 env=base_env(**FAST, **env))


def recorded(ws: Path, name: str) -> tuple[int, str]:
    pid, start_time = (ws / name).read_text().split()
    return int(pid), start_time


def alive(proc: tuple[int, str]) -> bool:
    """The process recorded as (pid, starttime) is running (a zombie is not: it has
    exited, only its parent has not reaped it)."""
    pid, start_time = proc
    found = procfs.live(pid)
    return found is not None and str(found[1]) == start_time


def marked(sd: Path, run: str | None = None) -> set[int]:
    """The processes carrying the session's mark (its work area, RALPH_SESSION_DIR)."""
    return containment.find(str(work_dir(sd)), run)


def runs_of(sd: Path, name: str) -> list[str]:
    """The run ids (log names) of `name` (e.g. executor-t1) in iteration 1, in order."""
    logs = work_dir(sd) / "iterations/1/logs"
    return sorted(p.name[:-len(".prompt.md")] for p in logs.glob(f"*-{name}.prompt.md"))


@pytest.fixture(autouse=True)
def nothing_left(workspace):
    """Whatever a failing test leaves (marked with one of its sessions) is stopped."""
    yield
    for sd in session_dirs(workspace):
        containment.stop(lambda sd=sd: containment.find(str(work_dir(sd))), grace=0.5)


# --- 1. a finished run: every process it started is stopped, however it hid ---

def test_a_finished_runs_setsid_grandchildren_and_daemons_are_stopped(workspace):
    ws = workspace
    setup(ws, '''
        if ROLE == "executor":
            record("setsid.pid", setsid_sleep(300))
            p = subprocess.Popen(["setsid", "sleep", "301"])   # util-linux setsid(1)
            record("setsid1.pid", p.pid)
            record("daemon.pid", daemon_sleep(302))
            mine, deadline = os.getsid(0), time.monotonic() + 5
            others = [int(open(path(n)).read().split()[0])
                      for n in ("setsid.pid", "setsid1.pid", "daemon.pid")]
            while any(os.getsid(o) == mine for o in others) and time.monotonic() < deadline:
                time.sleep(0.01)   # poll: setsid() is called in the child, a moment after fork
            mark("sessions.json", json.dumps([os.getsid(o) != mine for o in others]))
            mark("executor.run", ENV["RALPH_RUN_ID"])
        elif ROLE == "reviewer":
            # right after the executor's run: is anything of it still there?
            from ralph.engine.running import containment
            left = containment.find(ENV["RALPH_SESSION_DIR"],
                                    open(path("executor.run")).read())
            mark("after-executor.json", json.dumps(sorted(left)))
        normal()
    ''')
    r = start(ws, "c1")
    assert r.returncode == 0, r.stdout + r.stderr
    sd = only_session(ws)
    procs = {name: recorded(ws, name) for name in ("setsid.pid", "setsid1.pid", "daemon.pid")}
    # they were really started, and in sessions of their own
    assert len({pid for pid, _ in procs.values()}) == 3
    assert json.loads((ws / "sessions.json").read_text()) == [True, True, True]
    assert json.loads((ws / "after-executor.json").read_text()) == []
    assert not [name for name, proc in procs.items() if alive(proc)]
    assert marked(sd) == set()
    run = (ws / "executor.run").read_text()
    assert run == runs_of(sd, "executor-t1")[0] and run.endswith("-executor-t1")
    assert "stopped 3 process(es) the executor's run left running" in r.stdout
    assert progress_markers(sd) == {"1": {"t1": "x"}}


# --- 2. PAUSE: a wrapper's child gets its SIGTERM grace, then nothing is left ---

CHILD = '''
    import signal
    if ROLE == "executor" and not os.path.exists(path("ready")):
        def saved(signum, frame):
            time.sleep(0.5)   # the wait is what is proven: the SIGTERM grace outlasts saving work
            mark("term.txt", "saved after SIGTERM %d" % signum)
            sys.exit(0)
        signal.signal(signal.SIGTERM, saved)
        record("child.pid", os.getpid())
        record("wrapper.pid", os.getppid())
        mark("ready")
        time.sleep(60)   # the wait is what is proven: it runs until the PAUSE stops it
        sys.exit("never stopped")
    normal()
'''


def test_pause_gives_a_wrapped_child_its_grace_and_leaves_nothing(workspace):
    ws = workspace
    # `sh -c "python child; ..."`: sh stays, as the run's first process, the child under it
    setup(ws, CHILD, command=["sh", "-c", f"'{sys.executable}' '{ws}/agent.py'; echo wrapped"])
    proc = spawn_start(ws, "p1")
    wait_for(lambda: (ws / "ready").exists(), timeout=20)
    child, wrapper = recorded(ws, "child.pid"), recorded(ws, "wrapper.pid")
    sd = only_session(ws)
    run = runs_of(sd, "executor-t1")[0]
    assert marked(sd, run) >= {child[0], wrapper[0]}
    began = time.monotonic()
    r = ralph(ws, "signal", "pause", "hold on")
    assert r.returncode == 0, r.stderr
    code, out, err = finish(proc)
    assert code == 3, (out, err)
    assert time.monotonic() - began < 10
    # the child handled its SIGTERM to the end (0.5 s), within the 2 s grace
    assert (ws / "term.txt").read_text() == f"saved after SIGTERM {int(signal.SIGTERM)}"
    assert not alive(child) and not alive(wrapper)
    assert marked(sd) == set()
    m = metadata(sd)
    assert m["status"] == "paused" and m["orchestrator"]["pause_reason"] == "hold on"


# --- 3. a finished run's process emits during its SIGTERM grace: refused, not acted on ---

LATE = '''
    import contextlib, io, signal, subprocess, sys
    sys.path.insert(0, sys.argv[1])
    from agentlib import *
    from ralph.engine.tools.emit import main as emit_main   # `ralph emit`, in this process: a
                                                      # new one would be stopped with it

    def late(signum, frame):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = emit_main(["build.done", "late"])
        mark("late.json", json.dumps({"code": code, "stderr": err.getvalue()}))
        sys.exit(0)
    signal.signal(signal.SIGTERM, late)
    mark("armed")
    time.sleep(60)   # the wait is what is proven: it runs until the run's end stops it
'''


def test_an_emit_from_a_finished_run_is_refused_recorded_and_ignored(workspace):
    ws = workspace
    (ws / "late.py").write_text("import json, time\n" + textwrap.dedent(LATE))
    setup(ws, f'''
        if ROLE == "executor":
            # a tool left running in a session of its own, that answers SIGTERM with an emit
            subprocess.Popen([sys.executable, {str(ws / "late.py")!r}, WS],
                             start_new_session=True)
            wait_file("armed")
            mark("executor.run", ENV["RALPH_RUN_ID"])
        normal()
    ''')
    r = start(ws, "l1")
    assert r.returncode == 0, r.stdout + r.stderr
    sd = only_session(ws)
    run = (ws / "executor.run").read_text()
    late = json.loads((ws / "late.json").read_text())
    assert late["code"] == 2
    assert len(late["stderr"].strip().splitlines()) == 1 and "refused" in late["stderr"]
    evs = events(sd)
    [refused] = [e for e in evs if e["topic"] == "emit.refused"]
    # the run's, by its claim; no role vouched for: the engine no longer holds that run
    assert refused["run"] == run and refused["source"] == "unknown"
    assert refused["payload"]["topic"] == "build.done"
    assert refused["payload"]["payload"] == "late"
    assert f"run {run} is over" in refused["payload"]["why"]
    # the engine took the real run's outcome only: a late build.done without evidence
    # would have become a build.blocked and a second executor run
    assert [e["payload"] for e in evs if e["topic"] == "build.done"] == [EVIDENCE]
    assert not [e for e in evs if e["topic"] == "build.blocked"]
    assert runs_of(sd, "executor-t1") == [run]
    assert progress_markers(sd) == {"1": {"t1": "x"}}
    assert marked(sd) == set()


# --- 4. the run gate itself: the engine's inlet, its runs, and emits from other processes ---

def emit_as(ws: Path, sd: Path, run: str | None, *args: str) -> subprocess.CompletedProcess:
    """`ralph emit ARGS` as a process of run `run` of the session (None: of no run)."""
    env = base_env(RALPH_SESSION_DIR=work_dir(sd), **({"RALPH_RUN_ID": run} if run else {}))
    return subprocess.run(RALPH + ["emit", *args], cwd=ws, env=env, capture_output=True,
                          text=True, timeout=30)


def refused_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    [line] = r.stderr.strip().splitlines()
    assert "refused" in line
    return line


def engine_inlet(ws: Path, sid: str):
    """What an engine holds of session `sid` to hear agents: its lock and its inlet
    (started: no run open yet)."""
    from ralph.engine.running.inlet import Inlet
    from ralph.session_store import acquire_lock, load
    session = load(str(ws), sid)
    lease = acquire_lock(session.dir, sid)
    inlet = Inlet(session, max_bytes=1 << 20, on_ask=lambda *_: {"refused": "no desk here"},
                  on_ask_gone=lambda rid: None, on_poll=lambda role: {"signals": []},
                  on_approve=lambda *_: {"refused": "no rules here"})
    inlet.start()
    return lease, inlet


def test_the_inlet_opens_and_closes_runs_for_emitters(workspace):
    from ralph.engine.running.inlet import RunInfo
    ws = workspace
    sd = Path(new_session(ws, sid="lease").dir)
    lease, inlet = engine_inlet(ws, "lease")
    try:
        inlet.open_run(RunInfo("r1", "executor", "t1"))
        r = emit_as(ws, sd, "r1", "x.y", "from r1")
        assert r.returncode == 0, r.stderr
        inlet.drain()
        last = events(sd)[-1]
        assert (last["topic"], last["payload"], last["run"], last["source"]) == \
            ("x.y", "from r1", "r1", "executor")

        # another run's: it has no outbox to write (each run has its own)
        line = refused_line(emit_as(ws, sd, "r2", "x.y", "from r2"))
        assert "run r2 has no outbox here" in line
        inlet.drain()
        assert events(sd)[-1] == last

        # a human at a terminal (no run): heard while a run is open, as the CLI's
        r = ralph(ws, "emit", "human.note", "by hand", "--session", "lease")
        assert r.returncode == 0, r.stderr
        inlet.drain()
        last = events(sd)[-1]
        assert (last["topic"], last["source"]) == ("human.note", "cli") and "run" not in last

        inlet.close_run("r1")
        line = refused_line(emit_as(ws, sd, "r1", "x.y", "after close"))
        assert "run r1 is over" in line
        inlet.drain()
        assert events(sd)[-1]["payload"]["why"] == "run r1 is over"
    finally:
        inlet.stop()
        lease.release()
    # no engine: nobody takes it, the run's nor a human's; the run's line stays in the
    # outbox, the human's is written nowhere (a human's event goes to the bus, not there)
    line = refused_line(emit_as(ws, sd, "r1", "x.y", "no engine"))
    assert "no engine" in line
    line = refused_line(ralph(ws, "emit", "human.note", "still here", "--session", "lease"))
    assert "no engine" in line
    before = events(sd)
    assert before[-1]["payload"]["payload"] == "after close"
    # the next engine records the run's as refused when it starts, and takes nothing
    lease, inlet = engine_inlet(ws, "lease")
    inlet.stop()
    lease.release()
    late = events(sd)[len(before):]
    assert [(e["topic"], e["payload"]["payload"], e.get("run")) for e in late] == [
        ("emit.refused", "no engine", "r1")]
    assert late[0]["payload"]["why"] == "its run ended with the engine that ran it"
    seqs = [e["seq"] for e in events(sd)]
    assert seqs == list(range(1, len(seqs) + 1))


RACER = textwrap.dedent('''
    import json, os, sys, time
    from ralph.session_store import outbox
    work, w, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    while not os.path.exists(go):
        time.sleep(0.005)   # poll: until the test says go (all racers at once)
    accepted = refused = 0
    while refused < 20 and accepted + refused < 50000:
        tick = {"w": w, "i": accepted + refused}
        why = outbox.post(work, {"kind": "event", "id": outbox.new_request_id(), "run": "r1",
                                 "topic": "race.tick", "payload": tick})
        if why:
            refused += 1
        else:
            accepted += 1
    print(json.dumps({"accepted": accepted, "refused": refused}))
''')


def test_closing_a_run_cuts_concurrent_emitters_cleanly(workspace):
    """Four processes post for r1 as fast as they can while the run is closed: every
    request before the cut is taken, every one after it refused, none lost."""
    from ralph.engine.running.inlet import RunInfo
    from ralph.session_store import outbox
    ws = workspace
    sd = Path(new_session(ws, sid="race").dir)
    lease, inlet = engine_inlet(ws, "race")
    racers = []
    posted = Path(outbox.outbox_path(str(work_dir(sd)), "r1"))
    try:
        inlet.open_run(RunInfo("r1", "executor", None))
        racers = [subprocess.Popen([sys.executable, "-c", RACER, str(work_dir(sd)), str(w),
                                    str(ws / "go")], env=base_env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for w in range(4)]
        (ws / "go").touch()
        wait_for(lambda: posted.read_bytes().count(b'"race.tick"') >= 200, timeout=20)
        inlet.drain()   # the engine reads while they post (as on every wakeup of a run)
        inlet.close_run("r1")
        results = []
        for p in racers:
            out, err = p.communicate(timeout=30)
            assert p.returncode == 0, err
            results.append(json.loads(out))
        inlet.drain()   # what they posted after the cut
    finally:
        for p in racers:
            if p.poll() is None:
                p.kill()
        inlet.stop()
        lease.release()
    attempts = sum(r["accepted"] + r["refused"] for r in results)
    ticks = [e for e in events(sd) if e["topic"] == "race.tick" or
             (e["topic"] == "emit.refused" and e["payload"]["topic"] == "race.tick")]
    assert len(ticks) == attempts          # no request lost, none doubled
    taken = [e for e in ticks if e["topic"] == "race.tick"]
    refused = [e for e in ticks if e["topic"] == "emit.refused"]
    assert len(taken) == sum(r["accepted"] for r in results) >= 200
    assert len(refused) == sum(r["refused"] for r in results) == 80
    assert max(e["seq"] for e in taken) < min(e["seq"] for e in refused)   # one cut
    assert all(e["run"] == "r1" for e in ticks)
    assert {e["source"] for e in taken} == {"executor"}   # the run's role, from the engine
    assert all(e["payload"]["why"].startswith("run r1 is over") for e in refused)
    # each attempt of each racer is there once, in its order (a refused one keeps its payload)
    sent = [e["payload"] if e["topic"] == "race.tick" else e["payload"]["payload"]
            for e in ticks]
    for w, result in enumerate(results):
        assert [p["i"] for p in sent if p["w"] == w] == \
            list(range(result["accepted"] + result["refused"]))
    seqs = [e["seq"] for e in events(sd)]
    assert seqs == list(range(1, len(seqs) + 1))


# --- 5. kill -9 of the engine: its run's supervisor stops the run, no resume needed ---

RUN_PROCESSES = ("agent.pid", "grandchild.pid", "daemon.pid", "envless.pid")  # TRAPPING's


def kill_9(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.communicate()


def started_until_ready(ws: Path, sid: str, **env) -> subprocess.Popen:
    """A session whose executor is `ready` (killed if it never gets there)."""
    engine = spawn_start(ws, sid, **env)
    try:
        wait_for(lambda: (ws / "ready").exists(), timeout=20)
    except BaseException:
        kill_9(engine)
        raise
    return engine


@pytest.mark.slow   # it waits out the grace, as it must
def test_kill_9_of_the_engine_stops_every_process_of_its_run_without_resume(workspace):
    ws = workspace
    setup(ws, TRAPPING)
    kill_9(started_until_ready(ws, "k1"))
    procs = [recorded(ws, name) for name in RUN_PROCESSES]
    supervisor = recorded(ws, "supervisor.pid")
    try:
        sd = only_session(ws)
        run = (ws / "executor.run").read_text()
        assert procs[3][0] not in marked(sd)           # only the tree has it
        # within the grace (and a little): nothing of the run is left, no resume asked
        wait_for(lambda: not [p for p in procs + [supervisor] if alive(p)],
                 timeout=containment.GRACE_SECONDS + 3)
        assert (ws / "term.txt").read_text() == "saved"   # SIGTERM first, then the grace
        assert marked(sd) == set()
        [stderr] = (work_dir(sd) / "iterations/1/logs").glob(f"{run}.stderr")
        assert f"ralph: stopped 4 process(es) of run {run}: its engine is gone" in \
            stderr.read_text()
        r = ralph(ws, "session", "resume", "k1", *UNCONFINED, env=base_env(**FAST), timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "left by an earlier engine" not in r.stdout
        assert metadata(sd)["status"] == "completed"
        assert progress_markers(sd) == {"1": {"t1": "x"}}
        # the task ran again as a new run: nothing of the killed one is heard as the new one's
        assert runs_of(sd, "executor-t1")[0] == run and len(runs_of(sd, "executor-t1")) == 2
        [built] = [e for e in events(sd) if e["topic"] == "build.done"]
        assert built["run"] == runs_of(sd, "executor-t1")[1]
    finally:
        for p in procs + [supervisor]:
            kill_if_alive(p)


def kill_9_engine_and_supervisor(engine: subprocess.Popen, ws: Path) -> None:
    """Both at once (the OOM killer may take both): stopped first, so that neither sees
    the other die and stops the run."""
    supervisor = recorded(ws, "supervisor.pid")
    for pid in (engine.pid, supervisor[0]):
        os.kill(pid, signal.SIGSTOP)
    os.kill(supervisor[0], signal.SIGKILL)
    kill_9(engine)
    wait_for(lambda: not alive(supervisor), timeout=5)


def test_what_outlived_its_engine_and_its_supervisor_is_stopped_on_resume(workspace):
    ws = workspace
    setup(ws, TRAPPING)
    kill_9_engine_and_supervisor(started_until_ready(ws, "k2"), ws)
    agent, grandchild, daemon, envless = (recorded(ws, name) for name in RUN_PROCESSES)
    try:
        sd = only_session(ws)
        # the agent dies with its supervisor (PR_SET_PDEATHSIG); what it started does not
        wait_for(lambda: not alive(agent), timeout=5)
        # the wait is what is proven: a while after the agent died, they still live
        time.sleep(0.2)
        assert alive(grandchild) and alive(daemon)
        [killed_run] = runs_of(sd, "executor-t1")
        assert marked(sd, killed_run) >= {grandchild[0], daemon[0]}
        r = ralph(ws, "session", "resume", "k2", *UNCONFINED, env=base_env(**FAST), timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        # found by their mark (the one without was init's: out of every tree)
        assert "stopped 2 process(es) left by an earlier engine's agent runs" in r.stdout
        assert not alive(grandchild) and not alive(daemon)
        assert marked(sd) == set()
        assert metadata(sd)["status"] == "completed"
    finally:
        for p in (grandchild, daemon, envless):
            kill_if_alive(p)


# --- the supervisor between the engine and the agent: what passes through it ---

PASSED = """
import os, signal, sys
prompt = sys.stdin.read()
parent = open("/proc/%d/comm" % os.getppid()).read().strip()
print("prompt: " + prompt.upper() + ", under " + parent + ", in " + os.getcwd())
print("a line on stderr", file=sys.stderr)
sys.stdout.flush()
if prompt == "crash":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(len(prompt))
"""


@pytest.mark.parametrize("prompt, code", [("hello", 5), ("crash", -9)])
def test_the_agents_stdin_streams_and_exit_code_pass_through_its_supervisor(
        tmp_path, prompt, code):
    from ralph.engine.agents import CommandAgent, Invocation
    from ralph.engine.agents.presets import Command
    from ralph.engine.config import PromptMode
    (tmp_path / "agent.py").write_text(PASSED)
    (tmp_path / "logs").mkdir()
    agent = CommandAgent(Command([sys.executable, str(tmp_path / "agent.py")],
                                 PromptMode.STDIN))
    env = base_env(RALPH_RUN_ID="r1", RALPH_SESSION_DIR=tmp_path)
    outcome = agent.run(Invocation(role="executor", prompt=prompt, env=env,
                                   cwd=str(tmp_path), log_base=str(tmp_path / "logs/r1"),
                                   timeout=30))
    assert outcome.exit_code == code
    assert outcome.stdout == (f"prompt: {prompt.upper()}, under "
                              f"{containment.SUPERVISOR_NAME}, in {tmp_path}\n")
    assert outcome.stderr_tail == "a line on stderr"
    assert not outcome.timed_out and outcome.stopped is None and outcome.left_behind == 0


def test_an_agent_that_exits_at_once_is_heard_at_once(tmp_path):
    """`true` and `false` exit before the supervisor looks: their codes still arrive (a
    Popen object dropped at once reaped them behind the supervisor's back)."""
    from ralph.engine.agents import CommandAgent, Invocation
    from ralph.engine.agents.presets import Command
    from ralph.engine.config import PromptMode
    (tmp_path / "logs").mkdir()
    env = base_env(RALPH_RUN_ID="r1", RALPH_SESSION_DIR=tmp_path)
    for n in range(20):
        program, code = ("true", 0) if n % 2 else ("false", 1)
        outcome = CommandAgent(Command([program], PromptMode.STDIN)).run(Invocation(
            role="executor", prompt="", env=env, cwd=str(tmp_path),
            log_base=str(tmp_path / f"logs/{n:04d}"), timeout=30))
        assert (outcome.exit_code, outcome.timed_out) == (code, False), (n, outcome)


def test_an_agent_that_kills_its_supervisor_ends_its_run_and_leaves_nothing(workspace):
    ws = workspace
    setup(ws, """
        import signal
        if ROLE == "executor" and not os.path.exists(path("ready")):
            record("grandchild.pid", setsid_sleep(300))
            record("supervisor.pid", os.getppid())
            mark("ready")
            os.kill(os.getppid(), signal.SIGKILL)
            # the wait is what is proven: killed with its supervisor (PR_SET_PDEATHSIG)
            time.sleep(60)
            sys.exit("outlived its supervisor")
        normal()
    """)
    r = start(ws, "ks")
    grandchild = recorded(ws, "grandchild.pid")
    try:
        # the grandchild, the engine's once its supervisor died, went with the run
        assert r.returncode == 0, r.stdout + r.stderr
        assert not alive(grandchild) and not alive(recorded(ws, "supervisor.pid"))
        # (the agent too, when the engine looks before its PR_SET_PDEATHSIG landed)
        assert re.search(r"stopped [12] process\(es\) the executor's run left running",
                         r.stdout), r.stdout
        sd = only_session(ws)
        assert len(runs_of(sd, "executor-t1")) == 2   # the killed run failed: once more
        assert marked(sd) == set()
    finally:
        kill_if_alive(grandchild)


def test_an_engine_package_planted_in_the_workspace_never_runs_as_a_supervisor(workspace):
    ws = workspace
    setup(ws, """
        os.chdir("/")   # its own `python -m ralph.engine emit`: not from what it plants
        if ROLE == "planner" and not os.path.exists(path("engine")):
            os.makedirs(path("engine/running"))
            for package in ("engine", "engine/running"):
                open(path(package + "/__init__.py"), "w").close()
            with open(path("engine/running/supervisor.py"), "w") as f:
                f.write("open(%r, 'w').write('ran')" % path("planted.ran"))
        normal()
    """)
    r = start(ws, "pl")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ws / "engine/running/supervisor.py").exists()
    assert not (ws / "planted.ran").exists()


# --- 6. an agent that cannot run here is refused before any session exists ---

def one_line_refusal(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    [line] = r.stderr.strip().splitlines()
    return line


def test_an_agent_cli_not_installed_is_refused_up_front(workspace):
    ws = workspace
    empty = ws / "bin"           # a PATH with no claude on it (/usr/bin:/bin may have one)
    empty.mkdir()
    r = ralph(ws, "session", "start", "objective", "--id", "nc", "--agent", "claude",
              env=base_env(PATH=empty))
    line = one_line_refusal(r)
    assert "claude" in line and "not installed" in line
    assert not (ws / ".ralph-sessions" / "nc").exists()
    assert session_dirs(ws) == []


def test_a_command_that_does_not_exist_is_refused_up_front(workspace):
    ws = workspace
    write_config(ws, {"agent": {"backend": "command", "command": [str(ws / "no-such-agent")]}})
    line = one_line_refusal(ralph(ws, "session", "start", "objective", "--id", "nx"))
    assert "no-such-agent" in line and "not installed" in line
    assert session_dirs(ws) == []


def test_a_command_that_cannot_be_started_pauses_with_why(workspace):
    """On the PATH and executable, but its interpreter is missing: execve fails in each
    of the four runs, and the pause says so."""
    ws = workspace
    agent = ws / "agent.sh"
    agent.write_text("#!/no/such/interpreter\necho never\n")
    agent.chmod(0o755)
    write_config(ws, {"agent": {"backend": "command", "command": [str(agent)]},
                      "fallback": {"enabled": False}})
    r = start(ws, "ni")
    assert r.returncode == 3, r.stdout + r.stderr
    sd = only_session(ws)
    reason = metadata(sd)["orchestrator"]["pause_reason"]
    assert "last exit code 127" in reason and str(agent) in reason
    assert "No such file or directory" in reason
    logs = work_dir(sd) / "iterations/1/logs"
    stderr = sorted(logs.glob("*-planner.stderr"))
    assert len(stderr) == 4
    assert all(f"cannot start {agent}" in p.read_text() for p in stderr)


# --- 7. a failing agent: retried, then paused with its own last words ---

def test_a_failing_agent_pauses_with_its_last_stderr_line(workspace):
    ws = workspace
    setup(ws, '''
        print("connecting to the model...", file=sys.stderr)
        print("fatal: no credentials for the model", file=sys.stderr)
        sys.exit(1)
    ''')
    r = start(ws, "f1")
    assert r.returncode == 3, r.stdout + r.stderr
    sd = only_session(ws)
    assert len(runs_of(sd, "planner")) == 4
    reason = metadata(sd)["orchestrator"]["pause_reason"]
    assert "fatal: no credentials for the model" in reason and "exit code 1" in reason
    status = ralph(ws, "session", "status", "f1")
    assert status.returncode == 0, status.stderr
    assert "fatal: no credentials for the model" in status.stdout
    view = json.loads(ralph(ws, "session", "status", "f1", "--json").stdout)
    assert view["pause_reason"] == reason
    assert marked(sd) == set()


# --- 8. presets on real-shaped output ---

def _assistant(mid: str, content: list[dict], **usage) -> str:
    return json.dumps({"type": "assistant", "session_id": "s-1", "parent_tool_use_id": None,
                       "message": {"id": mid, "type": "message", "role": "assistant",
                                   "model": "claude-sonnet-4-5", "content": content,
                                   "stop_reason": None, "usage": usage}})


CLAUDE_STREAM = "\n".join([
    json.dumps({"type": "system", "subtype": "init", "session_id": "s-1", "cwd": "/w",
                "tools": ["Bash", "Read"], "model": "claude-sonnet-4-5"}),
    # one message streamed as two lines (text, then a tool call), with the same id
    _assistant("msg_01", [{"type": "text", "text": "Let me look at the tests."}],
               input_tokens=10, cache_creation_input_tokens=200,
               cache_read_input_tokens=3000, output_tokens=5),
    _assistant("msg_01", [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                           "input": {"command": "pytest -q"}}],
               input_tokens=10, cache_creation_input_tokens=200,
               cache_read_input_tokens=3000, output_tokens=40),
    json.dumps({"type": "user", "message": {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 passed"}]}}),
    _assistant("msg_02", [{"type": "text", "text": "All three pass."}],
               input_tokens=12, cache_read_input_tokens=3300, output_tokens=80),
])
CLAUDE_RESULT = json.dumps({
    "type": "result", "subtype": "success", "is_error": False, "duration_ms": 8123,
    "num_turns": 2, "result": "All three pass, the task is done.", "session_id": "s-1",
    "total_cost_usd": 0.0421,
    "usage": {"input_tokens": 22, "cache_creation_input_tokens": 200,
              "cache_read_input_tokens": 6300, "output_tokens": 125}})


def test_claude_report_of_a_run_stopped_midway_keeps_its_tokens():
    # stopped before its result line, the last line cut off mid-write
    report = Claude().report(CLAUDE_STREAM + "\n" + '{"type": "assistant", "message": {"id"')
    assert report.input_tokens == (10 + 200 + 3000) + (12 + 3300)
    assert report.output_tokens == 40 + 80        # msg_01 counted once, at its last usage
    assert report.cost_usd is None                 # priced from the tokens by the runner
    assert report.text == "All three pass."


def test_claude_report_result_line_wins():
    report = Claude().report(CLAUDE_STREAM + "\n" + CLAUDE_RESULT + "\n")
    assert report.text == "All three pass, the task is done."
    assert (report.input_tokens, report.output_tokens) == (22 + 200 + 6300, 125)
    assert report.cost_usd == pytest.approx(0.0421)


def test_codex_report_sums_turns_and_keeps_the_last_message():
    stream = "\n".join([
        "Reading prompt from stdin...",
        json.dumps({"type": "thread.started", "thread_id": "0199-abc"}),
        json.dumps({"type": "turn.started"}),
        json.dumps({"type": "item.completed", "item": {"id": "item_0", "type": "reasoning",
                                                       "text": "**Planning the change**"}}),
        json.dumps({"type": "item.completed", "item": {
            "id": "item_1", "type": "command_execution", "command": "bash -lc 'pytest -q'",
            "aggregated_output": "3 passed\n", "exit_code": 0, "status": "completed"}}),
        json.dumps({"type": "item.completed", "item": {"id": "item_2", "type": "agent_message",
                                                       "text": "Tests pass."}}),
        json.dumps({"type": "turn.completed", "usage": {
            "input_tokens": 1000, "cached_input_tokens": 800, "output_tokens": 50}}),
        json.dumps({"type": "turn.started"}),
        json.dumps({"type": "item.completed", "item": {"id": "item_3", "type": "agent_message",
                                                       "text": "Done.\nLOOP_COMPLETE"}}),
        json.dumps({"type": "turn.completed", "usage": {
            "input_tokens": 1500, "cached_input_tokens": 1200, "output_tokens": 70}}),
    ])
    report = Codex().report(stream + "\n")
    assert report.text == "Done.\nLOOP_COMPLETE"
    assert (report.input_tokens, report.output_tokens) == (2500, 120)
    assert report.cost_usd is None


@pytest.mark.parametrize("ask_seconds, default_ms, most_ms", [
    (30, 120_000, 600_000),             # 90 s: below both of the Bash tool's own
    (3600, 3_660_000, 3_660_000),       # an hour's question, and a minute more
])
def test_claude_bash_timeouts_outlast_a_question(ask_seconds, default_ms, most_ms):
    env = Claude().env(RunSetup(log_base="/nonexistent/0001-planner", work_dir="/nonexistent",
                                ask_timeout_seconds=ask_seconds))
    assert int(env["BASH_DEFAULT_TIMEOUT_MS"]) == default_ms
    assert int(env["BASH_MAX_TIMEOUT_MS"]) == most_ms


FAKE_CLAUDE = '''
    # a stand-in `claude` on the PATH: records its environment, does the role's work,
    # prints stream-json like Claude Code
    mark("claude-env-" + ROLE, json.dumps({k: ENV.get(k) for k in
                                           ("BASH_DEFAULT_TIMEOUT_MS", "BASH_MAX_TIMEOUT_MS")}))
    sys.stdin.read()
    normal()
    print(%r)
    print(%r)
'''


def test_a_claude_on_the_path_runs_with_its_timeouts_and_its_costs_land(workspace):
    ws = workspace
    bin_dir = ws / "bin"
    bin_dir.mkdir()
    (ws / "agentlib.py").write_text(AGENTLIB)
    claude = bin_dir / "claude"
    claude.write_text(f"#!{sys.executable}\nimport json, sys\nsys.path.insert(0, {str(ws)!r})\n"
                      "from agentlib import *\n"
                      + textwrap.dedent(FAKE_CLAUDE % (CLAUDE_STREAM, CLAUDE_RESULT)))
    claude.chmod(0o755)
    write_config(ws, {"agent": {"backend": "claude", "mcp": False},
                      "RObot": {"timeout_seconds": 3600}, "fallback": {"enabled": False}})
    r = ralph(ws, "session", "start", "objective", "--id", "cl",
              env=base_env(PATH=f"{bin_dir}:/usr/bin:/bin"), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    for role in ("planner", "executor", "reviewer"):
        env = json.loads((ws / f"claude-env-{role}").read_text())
        assert env == {"BASH_DEFAULT_TIMEOUT_MS": "3660000", "BASH_MAX_TIMEOUT_MS": "3660000"}
    usage = metadata(only_session(ws))["usage"]
    runs = usage["agent_invocations"]
    assert usage["output_tokens"] == 125 * runs
    assert usage["cost_usd"] == pytest.approx(0.0421 * runs)


# --- every way a run ends: ABORT, timeout, the engine stopped by a signal ---

TRAPPING = """
    import signal
    if ROLE == "executor" and not os.path.exists(path("ready")):
        def saved(signum, frame):
            time.sleep(0.3)   # the wait is what is proven: the SIGTERM grace outlasts saving work
            mark("term.txt", "saved")
            sys.exit(0)
        signal.signal(signal.SIGTERM, saved)
        record("grandchild.pid", setsid_sleep(300))
        record("daemon.pid", daemon_sleep(301))
        envless_daemon("envless.pid", "sleep", "302")
        record("agent.pid", os.getpid())
        record("supervisor.pid", os.getppid())
        mark("executor.run", ENV["RALPH_RUN_ID"])
        mark("ready")
        time.sleep(60)   # the wait is what is proven: the late event comes in its SIGTERM grace
        sys.exit("never stopped")
    normal()
"""


def stopped_cleanly(ws: Path, sd: Path) -> None:
    """The trapping agent saved its work within the grace; it, its setsid'ed grandchild
    and its daemons are gone; nothing carries the session's mark."""
    procs = [recorded(ws, n) for n in RUN_PROCESSES]
    assert (ws / "term.txt").read_text() == "saved"
    assert not [p for p in procs if alive(p)]
    assert marked(sd) == set()


def test_abort_stops_every_process_of_the_run(workspace):
    ws = workspace
    setup(ws, TRAPPING)
    proc = spawn_start(ws, "a1")
    wait_for(lambda: (ws / "ready").exists(), timeout=20)
    assert ralph(ws, "signal", "abort", "wrong way").returncode == 0
    code, out, err = finish(proc)
    assert code == 4, (out, err)
    sd = only_session(ws)
    stopped_cleanly(ws, sd)
    assert metadata(sd)["status"] == "aborted"


def test_a_timed_out_run_is_stopped_whole(workspace):
    ws = workspace
    setup(ws, TRAPPING)
    config = ws / "ralph.yml"
    config.write_text(config.read_text().replace("prompt_mode: stdin",
                                                 "prompt_mode: stdin\n  timeout_seconds: 1.5"))
    began = time.monotonic()
    r = start(ws, "to")
    # the only task timed out: its batch failed whole, which pauses (DESIGN §11)
    assert r.returncode == 3, r.stdout + r.stderr
    assert time.monotonic() - began < 10
    sd = only_session(ws)
    stopped_cleanly(ws, sd)
    assert "the executor timed out" in metadata(sd)["orchestrator"]["pause_reason"]


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_engine_stopped_by_a_signal_leaves_nothing_running(workspace, sig, code):
    ws = workspace
    setup(ws, TRAPPING)
    proc = spawn_start(ws, "e1")
    wait_for(lambda: (ws / "ready").exists(), timeout=20)
    proc.send_signal(sig)
    got, out, err = finish(proc)
    assert got == code, (out, err)
    sd = only_session(ws)
    stopped_cleanly(ws, sd)
    # resumable, and the next engine finds nothing to stop
    r = ralph(ws, "session", "resume", "e1", *UNCONFINED, env=base_env(**FAST), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "left by an earlier engine" not in r.stdout
    assert metadata(sd)["status"] == "completed"


def test_a_run_ignoring_sigterm_is_killed_after_the_grace(workspace):
    ws = workspace
    setup(ws, """
        import signal
        if ROLE == "executor" and not os.path.exists(path("ready")):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            record("grandchild.pid", setsid_sleep(300))
            record("agent.pid", os.getpid())
            mark("ready")
            time.sleep(60)   # the wait is what is proven: SIGTERM ignored, it runs until SIGKILL
            sys.exit("never stopped")
        normal()
    """)
    proc = spawn_start(ws, "i1")
    wait_for(lambda: (ws / "ready").exists(), timeout=20)
    began = time.monotonic()
    assert ralph(ws, "signal", "pause", "stop").returncode == 0
    code, out, err = finish(proc)
    took = time.monotonic() - began
    assert code == 3, (out, err)
    # the grace was waited for (the agent might have been saving its work), no longer
    assert containment.GRACE_SECONDS <= took < containment.GRACE_SECONDS + 5
    sd = only_session(ws)
    assert not alive(recorded(ws, "agent.pid")) and not alive(recorded(ws, "grandchild.pid"))
    assert marked(sd) == set()


# --- what the engine reports it stopped ---

def test_the_console_counts_what_a_stopped_run_left_not_the_run_itself(workspace):
    ws = workspace
    setup(ws, TRAPPING)
    config = ws / "ralph.yml"
    config.write_text(config.read_text().replace("prompt_mode: stdin",
                                                 "prompt_mode: stdin\n  timeout_seconds: 1.5"))
    r = start(ws, "cn")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "stopped 3 process(es) the executor's run left running" in r.stdout, r.stdout


# --- processes that carry no mark: found only through the run's process tree ---

STUBBORN = """
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stat = open("/proc/self/stat").read()
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write("%d %s" % (os.getpid(), stat[stat.rfind(")") + 2:].split()[19]))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(300)   # the wait is what is proven: SIGTERM ignored, it runs until SIGKILL
"""


def kill_if_alive(proc: tuple[int, str]) -> None:
    if alive(proc):
        os.kill(proc[0], signal.SIGKILL)


def test_an_unmarked_descendant_is_killed_even_when_its_parents_die_first(workspace):
    ws = workspace
    (ws / "stubborn.py").write_text(textwrap.dedent(STUBBORN))
    setup(ws, f"""
        if ROLE == "executor" and not os.path.exists(path("ready")):
            record("wrapper.pid", os.getppid())
            subprocess.Popen(["env", "-i", sys.executable, {str(ws / "stubborn.py")!r},
                              path("stubborn.pid")])
            wait_file("stubborn.pid")
            mark("ready")
            time.sleep(60)   # the wait is what is proven: it runs until the engine stops it
        normal()
    """, command=["sh", "-c", f"'{sys.executable}' '{ws}/agent.py'; echo wrapped"])
    proc = spawn_start(ws, "u1")
    wait_for(lambda: (ws / "ready").exists(), timeout=20)
    stubborn, wrapper = recorded(ws, "stubborn.pid"), recorded(ws, "wrapper.pid")
    try:
        sd = only_session(ws)
        run = runs_of(sd, "executor-t1")[0]
        assert stubborn[0] not in marked(sd)            # no mark: only the tree has it
        assert stubborn[0] in containment.find(str(work_dir(sd)), run, root=wrapper[0])
        assert ralph(ws, "signal", "pause", "stop").returncode == 0
        code, out, err = finish(proc)
        assert code == 3, (out, err)
        assert not alive(stubborn)
    finally:
        kill_if_alive(stubborn)


def test_an_unmarked_daemon_of_a_finished_run_is_stopped(workspace):
    ws = workspace
    setup(ws, """
        if ROLE == "executor":
            envless_daemon("envless.pid", "sleep", "300")
        normal()
    """)
    r = start(ws, "d1")
    envless = recorded(ws, "envless.pid")
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        assert envless[0] not in marked(only_session(ws))
        assert not alive(envless)
    finally:
        kill_if_alive(envless)


# --- the session's mark is its directory's path: as the engine spells it ---

def test_leftovers_are_found_when_the_workspace_is_named_through_a_symlink(workspace,
                                                                          tmp_path):
    ws = workspace
    link = tmp_path / "link"
    link.symlink_to(ws)
    setup(ws, """
        if ROLE == "executor" and not os.path.exists(path("ready")):
            record("grandchild.pid", setsid_sleep(300))
            record("supervisor.pid", os.getppid())
            mark("ready")
            time.sleep(60)   # the wait is what is proven: it runs until the engine stops it
        normal()
    """)
    # started as RALPH_WORKSPACE=<the link>, killed, resumed from the real directory
    kill_9_engine_and_supervisor(started_until_ready(ws, "sy", RALPH_WORKSPACE=link), ws)
    grandchild = recorded(ws, "grandchild.pid")
    try:
        assert grandchild[0] in containment.find(str(link / ".ralph-sessions" / "sy"))
        r = ralph(ws, "session", "resume", "sy", *UNCONFINED, env=base_env(**FAST), timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert not alive(grandchild), r.stdout
    finally:
        kill_if_alive(grandchild)


# --- which agent run a process is part of, however it hides (the human's verbs ask) ---

WHERE = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, %r)
    from ralph.engine.running.containment import agent_run_of
    run, out = agent_run_of(), sys.argv[1]
    with open(out + ".tmp", "w") as f:
        json.dump(run and [run.supervisor, run.run_id, run.session_dir], f)
    os.rename(out + ".tmp", out)
""") % str(REPO)

HIDING = """
    if ROLE == "executor" and not os.path.exists(path("ready")):
        record("supervisor.pid", os.getppid())
        mark("executor.run", ENV["RALPH_RUN_ID"])
        where = [sys.executable, path("where.py")]
        subprocess.run(where + [path("plain.json")])
        subprocess.run(["env", "-i", *where, path("env-i.json")])
        subprocess.run(["setsid", "-f", "env", "-i", *where, path("setsid-f.json")])
        envless_daemon("daemon.pid", *where, path("daemon.json"))
        # in a PID namespace of its own: seeing the outer /proc, or its own (as in codex's
        # bwrap sandbox, where only its ancestors' marks tell)
        unshare = ["unshare", "--pid", "--fork"] + \
            (["--user", "--map-root-user"] if os.geteuid() else [])
        subprocess.run([*unshare, "env", "-i", *where, path("pid-ns.json")])
        subprocess.run([*unshare, "--mount-proc", "sh", "-c", '"$@"; exit', "sh",
                        "env", "-i", *where, path("pid-ns-proc.json")])
        # asked about from outside, by its pid
        subprocess.run(["setsid", "-f", "env", "-i", "sh", "-c",
                        'echo $$ > "$0.tmp" && mv "$0.tmp" "$0" && exec sleep 300',
                        path("hidden.pid")])
        for name in ("setsid-f.json", "daemon.json", "hidden.pid"):
            wait_file(name)
        mark("ready")
        wait_file("asked")
    normal()
"""


def test_every_process_of_a_run_is_known_as_the_runs_however_it_hides(workspace):
    ws = workspace
    setup(ws, HIDING)
    (ws / "where.py").write_text(WHERE)
    engine = spawn_start(ws, "w1")
    sibling = subprocess.Popen(["sleep", "300"])   # started beside the engine, not by it
    try:
        wait_for(lambda: (ws / "ready").exists(), timeout=20)
        sd = only_session(ws)
        run = (ws / "executor.run").read_text()
        supervisor = recorded(ws, "supervisor.pid")[0]
        work = str(work_dir(sd))
        expected = [supervisor, run, work]   # the run's mark: its session's work area
        for name in ("plain", "env-i", "setsid-f", "daemon", "pid-ns"):
            assert json.loads((ws / f"{name}.json").read_text()) == expected, name
        assert json.loads((ws / "pid-ns-proc.json").read_text()) == [None, run, work]
        hidden = int((ws / "hidden.pid").read_text())
        assert hidden not in marked(sd)   # no mark, not the agent's descendant: the tree's
        found = containment.agent_run_of(hidden)
        assert [found.supervisor, found.run_id, found.session_dir] == expected
        assert str(found) == f"agent run {run} of the session in {work} (supervisor pid " \
                             f"{supervisor})"
        # outside every run: this process, a sibling of the engine, the engine itself
        for pid in (None, os.getpid(), sibling.pid, engine.pid):
            assert containment.agent_run_of(pid) is None, pid
        # a process carrying a run's marks is taken at its word (only a run sets them)
        claims = subprocess.Popen(["sleep", "300"], env=base_env(RALPH_RUN_ID="r9",
                                                                 RALPH_SESSION_DIR=work))
        try:   # once exec'd whole (its environment is there when its command line is)
            wait_for(lambda: Path(f"/proc/{claims.pid}/cmdline").read_bytes())
            assert str(containment.agent_run_of(claims.pid)) == \
                f"agent run r9 of the session in {work} (by its marks)"
        finally:
            claims.kill()
            claims.wait()
        (ws / "asked").touch()
        code, out, err = finish(engine)
        assert code == 0, out + err
        assert containment.agent_run_of(hidden) is None   # stopped with its run: gone
    finally:
        sibling.kill()
        sibling.wait()
        if engine.poll() is None:
            kill_9(engine)
