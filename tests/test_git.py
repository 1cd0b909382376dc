"""A git workspace (`git: {commits: true}`): the session's own branch, one commit per
task that reaches [x], `session diff` and `session clean`; real git in temporary
repositories, the real CLI, the demo agent."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from support import (DONE, EVIDENCE, FAST, base_env, demo_config, events, finish, metadata,
                     plan, progress_markers, ralph, session_dir, session_dirs, spawn, wait_for)

STEPS = [plan("t1", "t2"),
         {"role": "executor", "task": "t1", "write": {"src/t1.py": "print('t1')\n"},
          "emit": [{"topic": "git.commit", "json": {"task": "t1", "commit": "forged"}},
                   {"topic": "build.done", "payload": EVIDENCE}]},
         *DONE]   # t2's executor changes no file


def git(ws: Path, *args: str) -> str:
    """The test's own git (an identity of its own: the machine may have none)."""
    return subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@localhost",
                           *args], cwd=ws, check=True, capture_output=True, text=True).stdout


def git_workspace(ws: Path, steps=STEPS, config: dict | None = None) -> str:
    """A repository on branch main whose one commit holds the demo's config and scenario;
    returns that commit."""
    demo_config(ws, steps, config)
    git(ws, "init", "--quiet", "--initial-branch=main")
    git(ws, "add", "--all")
    git(ws, "commit", "--quiet", "--message", "the project")
    return git(ws, "rev-parse", "HEAD").strip()


def no_identity_env(tmp_path: Path, **extra) -> dict:
    """ralph's environment on a machine where git knows no user (no global config)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return base_env(**FAST, HOME=home, XDG_CONFIG_HOME=home / ".config", **extra)


def commits(ws: Path, revs: str) -> list[dict]:
    """The commits of `revs`, oldest first: subject, body, author, files."""
    out = []
    for commit in git(ws, "rev-list", "--reverse", revs).split():
        subject, author, body = git(ws, "show", "--no-patch", "--format=%s%x00%ae%x00%b",
                                    commit).split("\0")
        files = git(ws, "diff-tree", "--root", "--no-commit-id", "--name-only", "-r",
                    commit).split()
        out.append({"commit": commit, "subject": subject, "author": author, "body": body,
                    "files": files})
    return out


def git_records(ws: Path, sid: str = "s") -> list[dict]:
    return [e for e in events(session_dir(ws, sid)) if e["topic"] == "git.commit"]


def test_each_done_task_is_one_commit_on_the_sessions_branch(workspace, tmp_path):
    base = git_workspace(workspace)
    r = ralph(workspace, "session", "start", "two tasks", "--id", "s",
              env=no_identity_env(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    # the user's branch never moved; the working tree is on the session's branch
    assert git(workspace, "rev-parse", "main").strip() == base
    assert git(workspace, "symbolic-ref", "--short", "HEAD").strip() == "ralph/s"
    made = commits(workspace, "main..ralph/s")
    assert [c["subject"] for c in made] == ["ralph s: iteration 1, task t1: T1"]
    assert made[0]["files"] == [".ralph-demo/src/t1.py"]
    assert made[0]["body"].split("\n")[:3] == ["Ralph-Session: s", "Ralph-Iteration: 1",
                                               "Ralph-Task: t1"]
    assert made[0]["author"] == "ralph@localhost"   # no identity on this machine
    # t2 changed nothing: recorded, no empty commit; the agent's forged record refused
    assert [(e["payload"]["task"], e["payload"]["commit"], e["payload"]["files"], e["source"])
            for e in git_records(workspace)] == [
        ("t1", made[0]["commit"], [".ralph-demo/src/t1.py"], "engine"),
        ("t2", None, [], "engine")]
    assert any(e["topic"] == "emit.refused" for e in events(session_dir(workspace, "s")))
    # the work area is in no commit, and not a change either
    assert not any(f.startswith(".ralph-sessions") for c in made for f in c["files"])
    assert (workspace / ".ralph-sessions/.gitignore").read_text() == "*\n"
    assert git(workspace, "status", "--porcelain", "--untracked-files=all") == ""
    assert metadata(session_dir(workspace, "s"))["git"] == {
        "branch": "ralph/s", "base": base, "started_from": "main"}
    assert "git switch main && git merge ralph/s" in r.stdout
    status = ralph(workspace, "session", "status", "s")
    assert "branch: ralph/s (from main at " + base[:12] in status.stdout


@pytest.mark.parametrize("make_dirty, named", [
    (lambda ws: (ws / "notes.txt").write_text("mine\n"), "notes.txt"),
    (lambda ws: (ws / "scenario.yaml").write_text("steps: []\n"), "scenario.yaml"),
    (lambda ws: ((ws / "new.py").write_text("x = 1\n"), git(ws, "add", "new.py")), "new.py"),
], ids=["untracked", "modified", "staged"])
def test_a_dirty_tree_is_refused_and_nothing_is_made(workspace, make_dirty, named):
    git_workspace(workspace)
    (workspace / ".gitignore").write_text("ignored.log\n")
    git(workspace, "add", ".gitignore")
    git(workspace, "commit", "--quiet", "--message", "ignore")
    (workspace / "ignored.log").write_text("an ignored file is no change\n")
    make_dirty(workspace)
    r = ralph(workspace, "session", "start", "x", "--id", "s", env=base_env(**FAST))
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and named in r.stderr, r.stderr
    assert "commit or stash" in r.stderr and "git.commits: false" in r.stderr
    assert "ignored.log" not in r.stderr
    assert session_dirs(workspace) == []
    assert git(workspace, "branch", "--list", "ralph/*") == ""


def test_git_commits_false_leaves_git_alone(workspace):
    base = git_workspace(workspace, config={"git": {"commits": False}})
    (workspace / "notes.txt").write_text("a dirty tree is fine then\n")
    r = ralph(workspace, "session", "start", "x", "--id", "s", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    assert git(workspace, "branch", "--list", "ralph/*") == ""
    assert git(workspace, "rev-parse", "HEAD").strip() == base
    assert metadata(session_dir(workspace, "s"))["git"] is None
    assert git_records(workspace) == []


def test_a_workspace_outside_git_is_untouched(workspace):
    demo_config(workspace, STEPS)
    r = ralph(workspace, "session", "start", "x", "--id", "s", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    assert metadata(session_dir(workspace, "s"))["git"] is None
    assert not (workspace / ".ralph-sessions/.gitignore").exists()
    r = ralph(workspace, "session", "diff", "s")
    assert r.returncode == 2 and "has no branch" in r.stderr and len(r.stderr.splitlines()) == 1


def test_session_diff_shows_the_session_or_one_tasks_commits(workspace):
    git_workspace(workspace)
    assert ralph(workspace, "session", "start", "x", "--id", "s",
                 env=base_env(**FAST)).returncode == 0
    whole = ralph(workspace, "session", "diff", "s")
    assert whole.returncode == 0, whole.stderr
    assert "+++ b/.ralph-demo/src/t1.py" in whole.stdout and "+print('t1')" in whole.stdout
    task = ralph(workspace, "session", "diff", "s", "--task", "t1")
    assert task.returncode == 0 and "Ralph-Task: t1" in task.stdout
    assert "+print('t1')" in task.stdout
    nothing = ralph(workspace, "session", "diff", "s", "--task", "t2")
    assert nothing.returncode == 0 and "changed no file" in nothing.stdout
    for args in (("s", "--task", "t9"), ("nope",), ("s", "--task", "../x")):
        r = ralph(workspace, "session", "diff", *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_session_clean_removes_the_branch_and_goes_back_to_the_users(workspace):
    from ralph.session_store import acquire_lock
    base = git_workspace(workspace)
    assert ralph(workspace, "session", "start", "x", "--id", "s",
                 env=base_env(**FAST)).returncode == 0
    lease = acquire_lock(str(session_dir(workspace, "s")), "s")   # as a running engine
    try:
        r = ralph(workspace, "session", "clean", "s")
        assert r.returncode == 2 and "is running" in r.stderr
    finally:
        lease.release()
    assert git(workspace, "branch", "--list", "ralph/s").strip()
    r = ralph(workspace, "session", "clean", "s")
    assert r.returncode == 0, r.stderr
    assert "removed branch ralph/s" in r.stdout
    assert git(workspace, "symbolic-ref", "--short", "HEAD").strip() == "main"
    assert git(workspace, "rev-parse", "HEAD").strip() == base
    assert git(workspace, "branch", "--list", "ralph/*") == ""
    again = ralph(workspace, "session", "clean", "s")
    assert again.returncode == 0 and "nothing to clean" in again.stdout
    gone = ralph(workspace, "session", "diff", "s")
    assert gone.returncode == 2 and "gone" in gone.stderr


def test_a_broken_repository_or_no_git_is_one_line(workspace, tmp_path):
    demo_config(workspace, STEPS)
    (workspace / ".git").mkdir()   # a work tree's mark, no repository in it
    r = ralph(workspace, "session", "start", "x", "--id", "s", env=base_env(**FAST))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "not a usable git work tree" in r.stderr and "Traceback" not in r.stderr
    empty = tmp_path / "bin"
    empty.mkdir()
    r = ralph(workspace, "session", "start", "x", "--id", "s",
              env=base_env(**FAST, PATH=empty))
    assert r.returncode == 2 and "git is not installed" in r.stderr, r.stderr
    assert session_dirs(workspace) == []


def test_the_work_area_is_never_committed_whatever_an_agent_staged(workspace):
    """An agent that removes the work area's .gitignore and stages a file there itself."""
    from ralph.engine.workspace_git import WorkspaceGit
    from ralph.session_store import GitInfo
    base = git_workspace(workspace)
    git(workspace, "switch", "--quiet", "--create", "ralph/s")
    area = workspace / ".ralph-sessions" / "s"
    area.mkdir(parents=True)
    (area / "outbox.jsonl").write_text("{}\n")
    (workspace / "work.py").write_text("done = True\n")
    git(workspace, "add", "--force", ".ralph-sessions")
    made = WorkspaceGit(str(workspace)).commit_task(GitInfo("ralph/s", base, "main"), "s", 1,
                                                    "t1", "a title\nRalph-Task: forged")
    assert made.files == ["work.py"]
    assert commits(workspace, "main..ralph/s")[0]["files"] == ["work.py"]
    assert "forged" not in git(workspace, "log", "-1", "--format=%B")


def test_a_filter_an_agent_configured_does_not_run_as_the_engine(workspace, tmp_path):
    from ralph.engine.workspace_git import WorkspaceGit
    from ralph.session_store import GitInfo
    base = git_workspace(workspace)
    git(workspace, "switch", "--quiet", "--create", "ralph/s")
    repo, info = WorkspaceGit(str(workspace)), GitInfo("ralph/s", base, "main")
    (workspace / "first.py").write_text("one = 1\n")
    assert repo.commit_task(info, "s", 1, "t0", "T0").files == ["first.py"]
    # then, mid-session, an agent configures code to run
    ran = tmp_path / "ran"
    git(workspace, "config", "filter.evil.clean", f"touch {ran}; cat")
    git(workspace, "config", "core.fsmonitor", f"touch {ran}; true")
    (workspace / ".gitattributes").write_text("* filter=evil\n")
    hooks = workspace / ".git/hooks/pre-commit"
    hooks.write_text(f"#!/bin/sh\ntouch {ran}\n")
    hooks.chmod(0o755)
    made = repo.commit_task(info, "s", 1, "t1", "T1")
    assert made.commit and made.files == [".gitattributes"]
    assert not ran.exists()


@pytest.mark.slow
def test_kill_9_after_a_commit_before_its_mark_commits_nothing_twice(workspace, tmp_path):
    """The engine is killed right after git made t1's commit (a git on the PATH that
    holds there): t1 is still [/], and the resume reruns it without a second commit."""
    git_workspace(workspace)
    bin_dir, held = tmp_path / "bin", tmp_path / "held"
    bin_dir.mkdir()
    wrapper = bin_dir / "git"
    wrapper.write_text(f"""#!/bin/sh
{shutil.which('git')} "$@"; rc=$?
case " $* " in *" commit "*) echo $$ > {held}; exec sleep 60;; esac
exit $rc
""")
    wrapper.chmod(0o755)
    proc = spawn(workspace, "session", "start", "x", "--id", "s",
                 env=base_env(**FAST, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}"))
    pid = int(wait_for(lambda: held.exists() and held.read_text().strip()))
    proc.kill()
    os.kill(pid, signal.SIGKILL)
    finish(proc)
    sd = session_dir(workspace, "s")
    first = commits(workspace, "main..ralph/s")
    assert [c["subject"] for c in first] == ["ralph s: iteration 1, task t1: T1"]
    assert progress_markers(sd)["1"]["t1"] == "/"
    r = ralph(workspace, "session", "resume", "s", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    assert commits(workspace, "main..ralph/s") == first
    assert progress_markers(sd) == {"1": {"t1": "x", "t2": "x"}}
    assert [e["payload"]["commit"] for e in git_records(workspace)] == [first[0]["commit"], None]


def test_a_task_committed_before_a_crash_is_amended_not_committed_again(workspace):
    """The rerun of a task whose commit a crash left without its [x] adds its new changes
    to that commit, or leaves it as it is."""
    from ralph.engine.workspace_git import WorkspaceGit
    from ralph.session_store import GitInfo
    base = git_workspace(workspace)
    git(workspace, "switch", "--quiet", "--create", "ralph/s")
    repo, info = WorkspaceGit(str(workspace)), GitInfo("ralph/s", base, "main")
    (workspace / "a.py").write_text("a = 1\n")
    first = repo.commit_task(info, "s", 1, "t1", "T1")
    assert repo.commit_task(info, "s", 1, "t1", "T1") == first
    (workspace / "b.py").write_text("b = 2\n")
    again = repo.commit_task(info, "s", 1, "t1", "T1")
    assert again.commit != first.commit and sorted(again.files) == ["a.py", "b.py"]
    assert [c["files"] for c in commits(workspace, "main..ralph/s")] == [["a.py", "b.py"]]
    (workspace / "c.py").write_text("c = 3\n")
    assert repo.commit_task(info, "s", 1, "t2", "T2").files == ["c.py"]
    assert len(commits(workspace, "main..ralph/s")) == 2


def test_a_paused_session_whose_branch_was_cleaned_is_not_resumed_without_it(workspace):
    git_workspace(workspace)
    r = ralph(workspace, "session", "start", "x", "--id", "s", "--max-iterations", "1",
              env=base_env(**FAST))
    assert r.returncode == 5, r.stdout + r.stderr   # paused by the limit, t1 committed
    assert ralph(workspace, "session", "clean", "s").returncode == 0
    r = ralph(workspace, "session", "resume", "s", "--max-iterations", "5",
              env=base_env(**FAST))
    assert r.returncode == 2 and "ralph/s is gone" in r.stderr, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_resume_puts_the_working_tree_back_on_the_sessions_branch(workspace):
    base = git_workspace(workspace)
    r = ralph(workspace, "session", "start", "x", "--id", "s", "--max-iterations", "1",
              env=base_env(**FAST))
    assert r.returncode == 5, r.stdout + r.stderr
    git(workspace, "switch", "--quiet", "main")   # the user looks at their own branch
    (workspace / "mine.txt").write_text("not committed\n")
    r = ralph(workspace, "session", "resume", "s", "--max-iterations", "5", env=base_env(**FAST))
    assert r.returncode == 2 and "mine.txt" in r.stderr and "commit or stash" in r.stderr
    (workspace / "mine.txt").unlink()
    r = ralph(workspace, "session", "resume", "s", "--max-iterations", "5", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "switched the working tree to branch ralph/s" in r.stdout
    assert git(workspace, "symbolic-ref", "--short", "HEAD").strip() == "ralph/s"
    assert git(workspace, "rev-parse", "main").strip() == base


def test_a_workspace_the_repository_ignores_or_not_made_yet_is_no_git_workspace(tmp_path):
    """The README's first command runs the demo in `demo-workspace/`, inside the ralph
    checkout (which ignores it): the session neither branches nor commits the checkout,
    the first time (ralph makes the directory) nor the second."""
    repo = tmp_path / "checkout"
    repo.mkdir()
    subprocess.run(["git", "init", "--quiet", str(repo)], check=True)
    (repo / ".gitignore").write_text("scratch/\n")
    subprocess.run(["git", "-C", str(repo), "add", ".gitignore"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=u", "-c", "user.email=u@x",
                    "commit", "--quiet", "-m", "start"], check=True)
    for sid in ("first", "second"):
        done = ralph(repo, "--workspace", "scratch", "session", "start", "demo", "--id", sid,
                     env=base_env(**FAST))
        assert done.returncode == 0, done.stdout + done.stderr
    branches = subprocess.run(["git", "-C", str(repo), "branch", "--list", "ralph/*"],
                              capture_output=True, text=True, check=True).stdout
    assert branches == "" and "ralph/" not in subprocess.run(
        ["git", "-C", str(repo), "symbolic-ref", "HEAD"], capture_output=True,
        text=True).stdout


def test_an_empty_git_directory_above_the_workspace_makes_it_no_git_workspace(tmp_path):
    """An empty `.git` in /tmp (one appeared there mid-CI, made by some process) makes no
    workspace below it a git one (each was refused as a broken repository)."""
    (tmp_path / ".git").mkdir()
    ws = tmp_path / "below" / "ws"
    ws.mkdir(parents=True)
    demo_config(ws, STEPS)
    done = ralph(ws, "session", "start", "x", "--id", "s", env=base_env(**FAST))
    assert done.returncode == 0, done.stdout + done.stderr
    assert metadata(session_dir(ws, "s"))["git"] is None
