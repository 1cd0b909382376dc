"""Parallel batches (event_loop.parallel): a batch's tasks at once, each in a git worktree
of its own, merged back in plan order; every accepted task a commit.

The agent is a real program (a command backend) the test writes: its executors meet at a
barrier (each waits until every task of the batch has started, which only a parallel
batch lets happen), write their task's file in their own worktree, and build. Real git,
real processes; the config and the agent live outside the workspace (a git workspace
must be clean to start).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support import (EVIDENCE, REVIEW_OK, base_env, events, finish, metadata,
                     progress_markers, ralph, session_dir, spawn, topics, wait_for)

AGENT = r'''
import json, os, subprocess, sys, time

role, spec = os.environ["RALPH_ROLE"], json.loads(os.environ["PAR_SPEC"])
shared, here = os.environ["PAR_SHARED"], os.getcwd()
prompt = sys.stdin.read()


def ralph(*args):
    subprocess.run([sys.executable, "-m", "ralph.engine", *args], check=True, timeout=60)


if role == "planner":
    if os.environ["RALPH_ITERATION"] == "1":
        ralph("emit", "plan.ready", "--json", json.dumps({"tasks": spec["tasks"]}))
    else:
        print("LOOP_COMPLETE")
elif role == "executor":
    task = os.environ["RALPH_TASK_ID"]
    me = spec["do"].get(task, {})
    runs = os.path.join(shared, f"{task}.runs")
    with open(runs, "a") as f:
        f.write(here + "\n")
    open(os.path.join(shared, f"{task}.started"), "w").close()
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(shared, f"{t}.started"))
                  for t in spec.get("barrier", [])):
        if time.monotonic() > deadline:
            sys.exit("the barrier: the other tasks never started")
        time.sleep(0.02)   # poll: until the barrier's other tasks started
    if me.get("hold"):
        open(os.path.join(shared, f"{task}.held"), "w").close()
        while not os.path.exists(os.path.join(shared, f"{task}.go")):
            time.sleep(0.02)   # poll: until the test lets the held task go
    if "merge.conflict" in prompt and me.get("on_conflict") == "merge":
        with open(os.path.join(here, me["file"]), "a") as f:   # on top of the merged tree
            f.write(me["text"])
    else:
        if "merge.conflict" in prompt and me.get("on_conflict") == "again":
            subprocess.run(["git", "reset", "--quiet", "--hard", "HEAD~1"], check=True)
        with open(os.path.join(here, me.get("file", f"{task}.txt")), "w") as f:
            f.write(me.get("text", f"made by {task}\n"))
    ralph("emit", "build.done", spec["evidence"])
elif role == "reviewer":
    ralph("emit", "review.done", spec["review"])
'''


def git(ws: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(ws), *args], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture
def repo(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    git(ws, "init", "--quiet", "--initial-branch", "main")
    (ws / "README").write_text("a project\n")
    git(ws, "add", "README")
    git(ws, "-c", "user.name=u", "-c", "user.email=u@localhost", "commit", "--quiet", "-m",
        "start")
    return ws


def setup(tmp_path: Path, tasks: list[str], do: dict | None = None, parallel: int = 4,
          barrier: bool = True, writable: tuple[Path, ...] = ()) -> tuple[Path, dict]:
    """The agent and a config outside the workspace (`writable`: more paths its runs may
    write); the environment that runs them."""
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    shared = tmp_path / "shared"
    shared.mkdir()
    config = tmp_path / "ralph.yml"
    config.write_text(yaml.safe_dump({
        # `shared`, where the lanes meet, is outside the workspace: the human's config
        # lets the sandboxed runs write it
        "agent": {"backend": "command", "command": [sys.executable, str(agent)],
                  "writable": [str(shared), *map(str, writable)]},
        "event_loop": {"parallel": parallel}, "RObot": {"timeout_seconds": 5}}))
    spec = {"tasks": [{"id": t, "title": t.upper()} for t in tasks], "do": do or {},
            "barrier": tasks if barrier else [], "evidence": EVIDENCE, "review": REVIEW_OK}
    return config, base_env(PAR_SPEC=json.dumps(spec), PAR_SHARED=str(shared))


def lanes_left(ws: Path) -> tuple[list[str], list[str]]:
    trees = [line for line in git(ws, "worktree", "list", "--porcelain").splitlines()
             if line.startswith("worktree ")]
    return trees, git(ws, "branch", "--list", "ralph-lane/*").split()


def task_commits(ws: Path, branch: str) -> list[str]:
    """The Ralph-Task trailers of the branch's commits, sorted (lanes commit at once: the
    merges, on the first parent, are what keep plan order)."""
    log = git(ws, "log", "--reverse", "--format=%(trailers:key=Ralph-Task,valueonly)",
              branch)
    return sorted(line.strip() for line in log.splitlines() if line.strip())


def test_four_tasks_run_at_once_each_in_its_worktree_and_merge_in_plan_order(tmp_path, repo):
    config, env = setup(tmp_path, ["t1", "t2", "t3", "t4"])
    done = ralph(repo, "session", "start", "four things", "-c", config, "--id", "p",
                 env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    sd = session_dir(repo, "p")
    assert progress_markers(sd)["1"] == {t: "x" for t in ("t1", "t2", "t3", "t4")}
    # every executor ran once, in a worktree of its own, never in the workspace
    shared = tmp_path / "shared"
    trees = [(shared / f"t{n}.runs").read_text().split() for n in range(1, 5)]
    assert all(len(t) == 1 for t in trees) and len({t[0] for t in trees}) == 4
    assert not any(t[0].startswith(str(repo)) for t in trees)
    # one commit per task, merged into the session's branch in plan order
    assert task_commits(repo, "ralph/p") == ["t1", "t2", "t3", "t4"]
    merges = git(repo, "log", "--first-parent", "--merges", "--reverse", "--format=%s",
                 "ralph/p").splitlines()
    assert merges == [f"ralph p: merge task t{n}: T{n}" for n in range(1, 5)]
    for n in range(1, 5):
        assert (repo / f"t{n}.txt").read_text() == f"made by t{n}\n"
    # the user's branch never moved; nothing of the lanes is left
    assert git(repo, "log", "--format=%s", "main").split("\n")[0] == "start"
    trees, branches = lanes_left(repo)
    assert trees == [f"worktree {repo}"] and branches == []
    commits = [e["payload"] for e in events(sd) if e["topic"] == "git.commit"]
    assert sorted(c["task"] for c in commits) == ["t1", "t2", "t3", "t4"]


def conflicting(tmp_path: Path, repo: Path, on_conflict: str, sid: str) -> Path:
    """t1 and t2 both write shared.txt; t2 does `on_conflict` when told of the conflict.
    The session, run to its end: its control plane."""
    do = {"t1": {"file": "shared.txt", "text": "from t1\n"},
          "t2": {"file": "shared.txt", "text": "from t2\n", "on_conflict": on_conflict}}
    # t2 made to conflict again resets its lane's branch: git writes the repository,
    # which the sandbox keeps read-only but by the human's word
    config, env = setup(tmp_path, ["t1", "t2"], do,
                        writable=(repo / ".git",) if on_conflict == "again" else ())
    done = ralph(repo, "session", "start", "two things", "-c", config, "--id", sid,
                 env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return session_dir(repo, sid)


def test_a_conflict_is_retried_on_top_of_the_merged_tree(tmp_path, repo):
    sd = conflicting(tmp_path, repo, "merge", "c")
    assert progress_markers(sd)["1"] == {"t1": "x", "t2": "x"}
    assert (repo / "shared.txt").read_text() == "from t1\nfrom t2\n"
    conflicts = [e["payload"] for e in events(sd) if e["topic"] == "merge.conflict"]
    assert [(c["task"], c["paths"], c["merged"]) for c in conflicts] == \
        [("t2", ["shared.txt"], ["t1"])]
    # t2 ran twice: at first in parallel, then on top of t1's merge
    assert len((tmp_path / "shared" / "t2.runs").read_text().split()) == 2
    assert lanes_left(repo) == ([f"worktree {repo}"], [])


def test_a_conflict_that_persists_fails_the_task_and_asks_a_human(tmp_path, repo):
    sd = conflicting(tmp_path, repo, "again", "f")
    assert progress_markers(sd)["1"] == {"t1": "x", "t2": "F"}
    asked = [e["payload"] for e in events(sd) if e["topic"] == "human.question"]
    assert any("Task t2" in q["text"] and "conflict" in q["text"] for q in asked), asked
    assert (repo / "shared.txt").read_text() == "from t1\n"
    assert lanes_left(repo) == ([f"worktree {repo}"], [])


def test_pause_stops_every_lane_and_resume_runs_only_the_unfinished_tasks(tmp_path, repo):
    do = {"t3": {"hold": True}}
    config, env = setup(tmp_path, ["t1", "t2", "t3"], do, barrier=False)
    proc = spawn(repo, "session", "start", "three things", "-c", config, "--id", "z",
                 env=env)
    shared = tmp_path / "shared"
    wait_for((shared / "t3.held").exists, timeout=60)
    sd = session_dir(repo, "z")
    wait_for(lambda: topics(sd).count("git.commit") >= 2, timeout=60)   # t1, t2 built
    assert ralph(repo, "signal", "pause", "stop the lanes", "--session", "z",
                 env=env).returncode == 0
    code, out, err = finish(proc, timeout=60)
    assert code == 3, out + err
    # t3's run was stopped; what the lanes finished is merged; no lane is left behind
    assert lanes_left(repo) == ([f"worktree {repo}"], [])
    assert progress_markers(sd)["1"] == {"t1": "x", "t2": "x", "t3": "/"}
    assert task_commits(repo, "ralph/z") == ["t1", "t2"]
    (shared / "t3.go").touch()
    resumed = ralph(repo, "session", "resume", "z", env=env, timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert progress_markers(sd)["1"] == {"t1": "x", "t2": "x", "t3": "x"}
    assert task_commits(repo, "ralph/z") == ["t1", "t2", "t3"]
    assert [len((shared / f"{t}.runs").read_text().split()) for t in ("t1", "t2", "t3")] \
        == [1, 1, 2]
    assert lanes_left(repo) == ([f"worktree {repo}"], [])


def test_kill_9_mid_batch_then_resume_reruns_only_the_unfinished(tmp_path, repo):
    do = {"t2": {"hold": True}}
    config, env = setup(tmp_path, ["t1", "t2"], do, barrier=False)
    proc = spawn(repo, "session", "start", "two things", "-c", config, "--id", "k", env=env)
    shared = tmp_path / "shared"
    wait_for((shared / "t2.held").exists, timeout=60)
    sd = session_dir(repo, "k")
    wait_for(lambda: "git.commit" in topics(sd), timeout=60)   # t1 built on its lane
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (shared / "t2.go").touch()
    resumed = ralph(repo, "session", "resume", "k", env=env, timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert progress_markers(sd)["1"] == {"t1": "x", "t2": "x"}
    assert task_commits(repo, "ralph/k") == ["t1", "t2"]
    assert lanes_left(repo) == ([f"worktree {repo}"], [])
    assert metadata(sd)["status"] == "completed"


def test_parallel_outside_git_is_refused_in_one_line(tmp_path):
    ws = tmp_path / "plain"
    ws.mkdir()
    config, env = setup(tmp_path, ["t1", "t2"])
    refused = ralph(ws, "session", "start", "x", "-c", config, env=env)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "event_loop.parallel" in refused.stderr
    assert "git" in refused.stderr and not list(ws.iterdir())


def test_a_sandboxed_cli_in_a_worktree_may_write_the_work_area_too():
    """Codex confines its commands to the directory it runs in: in a lane's worktree, its
    tools (`ralph emit`) must still reach the session's work area, in the workspace."""
    from ralph.engine.agents.presets import Codex, RunSetup
    work = "/ws/.ralph-sessions/s"
    lane = RunSetup(log_base=f"{work}/logs/1-executor", work_dir=work, ask_timeout_seconds=60,
                    tree="/state/worktrees/s/t1")
    argv = Codex().argv([], lane)
    assert argv[argv.index("--add-dir") + 1] == "/ws/.ralph-sessions"   # no session id
    home = RunSetup(log_base=f"{work}/logs/1-executor", work_dir=work, ask_timeout_seconds=60)
    assert "--add-dir" not in Codex().argv([], home)
