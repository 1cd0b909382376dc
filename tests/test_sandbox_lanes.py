"""A parallel lane's run works in a worktree inside the state directory (session_store's
`worktrees/`): its sandbox shows it that worktree and nothing else of the state
directory. Real bubblewrap."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from ralph.engine.running.sandbox import Sandbox


@pytest.fixture
def home():
    """A home outside the sandbox's private /tmp (a user's state directory is in theirs)."""
    path = Path(tempfile.mkdtemp(prefix=".ralph-test-sandbox-", dir=os.path.expanduser("~")))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_lane_sees_its_worktree_but_not_the_state_directory_around_it(home):
    """The attack: a lane's agent reads another session's control plane (its answers,
    signals, config) beside its worktree. On the WIP sandbox the state directory was not
    hidden at all for a run whose worktree is in it: `cat` printed the answer."""
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is not installed (.ci/run installs it)")
    state = home / ".local/state/ralph/workspaces/ws-1"
    lane = state / "worktrees/s/t1"
    lane.mkdir(parents=True)
    control = state / "sessions/other"
    control.mkdir(parents=True)
    (control / "answer.yaml").write_text("text: yes, deploy\n")
    work = home / "ws/.ralph-sessions/s"
    work.mkdir(parents=True)
    sandbox = Sandbox(shutil.which("bwrap"), hidden=(str(home / ".local/state/ralph"),),
                      home=str(home))
    env = dict(os.environ)
    script = (f"cat {control}/answer.yaml; ls {state}; echo made > {lane}/made; "
              f"echo planted > {state}/planted; echo noted > {work}/noted")
    r = subprocess.run(sandbox.wrap(["sh", "-c", script], env, tree=str(lane),
                                    work_dir=str(work)),
                       env=env, capture_output=True, text=True, timeout=60)
    assert "yes, deploy" not in r.stdout
    assert r.stdout.split() == ["worktrees"]     # the way to its worktree, nothing beside
    assert "Read-only file system" in r.stderr   # nothing planted in the state directory
    assert (lane / "made").read_text() == "made\n"
    assert (work / "noted").read_text() == "noted\n"
    assert sorted(p.name for p in state.iterdir()) == ["sessions", "worktrees"]
