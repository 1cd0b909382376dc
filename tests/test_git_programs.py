"""Issue 31: no program an agent configures in the workspace's repository runs as the
engine, in any git call the engine makes (engine/workspace_git.py lists what was checked).

The attack: the engine runs git in a repository its agents can write. Filters and hooks
were off, but a `merge.<driver>.driver` a `.gitattributes` line selects ran as the engine
in a parallel batch's merge; `gpg.program` ran on the engine's `git log` (with
`log.showSignature`) and merge (`merge.verifySignatures`); a partial clone's remote
(`ext::` with `protocol.ext.allow`) ran on a checkout of a lane's worktree;
`core.worktree` pointed the engine's add, commit and merge at another directory. Each
key is planted as an agent would (.git/config, .gitattributes, an included file) with a
program that leaves a mark, then the engine does what would run it: a task's commit, a
lane's merge, a lane's worktree, the human's `session diff`. Real git; the sessions are
real `ralph session start` with a `command` agent.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ralph.engine.workspace_git import GitError, WorkspaceGit
from ralph.session_store import GitInfo
from support import EVIDENCE, REVIEW_OK, base_env, metadata, progress_markers, ralph, session_dir

LINES = "".join(f"line {n}\n" for n in range(1, 11))


def git(ws: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@localhost", *args],
                          cwd=ws, check=True, capture_output=True, text=True).stdout


def marking_program(tmp_path: Path) -> tuple[str, Path]:
    """A program that writes down that it ran (and passes its input on, as a filter or a
    textconv would); the file it writes."""
    ran = tmp_path / "ran"
    prog = tmp_path / "prog"
    prog.write_text(f'#!/bin/sh\necho "$0 $*" >> {ran}\ncat "$@" 2>/dev/null\nexit 0\n')
    prog.chmod(0o755)
    return str(prog), ran


def signed(ws: Path, rev: str) -> str:
    """`rev` again, with a (bogus) signature: verifying it runs gpg.program."""
    body = git(ws, "cat-file", "commit", rev).replace(
        "\n\n", "\ngpgsig -----BEGIN PGP SIGNATURE-----\n \n -----END PGP SIGNATURE-----\n\n", 1)
    return subprocess.run(["git", "hash-object", "-t", "commit", "-w", "--stdin"], cwd=ws,
                          input=body, check=True, capture_output=True, text=True).stdout.strip()


def plant_gpg(ws: Path, prog: str, tmp_path: Path) -> None:
    git(ws, "config", "gpg.program", prog)
    git(ws, "config", "gpg.ssh.program", prog)
    git(ws, "config", "log.showSignature", "true")
    git(ws, "config", "merge.verifySignatures", "true")
    git(ws, "reset", "--quiet", "--soft", signed(ws, "HEAD"))   # the agent's own commit


def plant_include(ws: Path, prog: str, tmp_path: Path) -> None:
    included = tmp_path / "included.gitconfig"
    included.write_text(f'[merge "evil2"]\n\tdriver = {prog} %A %O %B\n'
                        f'[filter "evil2"]\n\tclean = {prog}\n\tsmudge = {prog}\n')
    git(ws, "config", "include.path", str(included))
    git(ws, "config", "includeIf.onbranch:ralph/**.path", str(included))
    (ws / ".gitattributes").write_text("* merge=evil2 filter=evil2\n")


def plant_worktree(ws: Path, prog: str, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.txt").write_text("not the session's\n")
    git(ws, "config", "core.worktree", str(elsewhere))


def config_key(*pairs: str, attributes: str = "* merge=evil diff=evil\n"):
    def plant(ws: Path, prog: str, tmp_path: Path) -> None:
        for key, value in zip(pairs[::2], pairs[1::2]):
            git(ws, "config", key, value.format(prog=prog))
        (ws / ".gitattributes").write_text(attributes)
    return plant


# each key that makes git run a program, planted (those the engine's calls never reach
# are here too: the engine must never start reaching them)
PLANTED = {
    "merge.<driver>.driver": config_key("merge.evil.driver", "{prog} %A %O %B"),
    "merge.default": config_key("merge.other.driver", "{prog} %A %O %B",
                                "merge.default", "other", attributes="* diff=evil\n"),
    "gpg.program (log.showSignature, merge.verifySignatures)": plant_gpg,
    "include.path, includeIf": plant_include,
    "core.worktree": plant_worktree,
    "core.fsmonitor": config_key("core.fsmonitor", "{prog}"),
    "core.editor, sequence.editor": config_key("core.editor", "{prog}",
                                               "sequence.editor", "{prog}"),
    "core.pager, pager.<cmd>": config_key("core.pager", "{prog}", "pager.log", "{prog}",
                                          "pager.merge", "{prog}", "pager.diff", "{prog}"),
    "diff.external, diff.<driver>.command, .textconv": config_key(
        "diff.external", "{prog}", "diff.evil.command", "{prog}",
        "diff.evil.textconv", "{prog}"),
    "trailer.<token>.cmd, .command": config_key(
        "trailer.ralph-task.cmd", "{prog}", "trailer.ralph-session.command", "{prog}",
        "trailer.sign.cmd", "{prog}", "trailer.sign.ifMissing", "add"),
    "credential.helper, core.askPass, core.sshCommand, core.gitProxy": config_key(
        "credential.helper", "{prog}", "core.askPass", "{prog}",
        "core.sshCommand", "{prog}", "core.gitProxy", "{prog}"),
    "commit.template": config_key("commit.template", "/etc/hostname"),
    "uploadpack.packObjectsHook, core.alternateRefsCommand": config_key(
        "uploadpack.packObjectsHook", "{prog}", "core.alternateRefsCommand", "{prog}"),
    "submodule.recurse, submodule.<name>.update": config_key(
        "submodule.recurse", "true", "submodule.x.update", "!{prog}"),
    "mergetool, difftool, alias": config_key(
        "merge.tool", "evil", "mergetool.evil.cmd", "{prog}", "diff.tool", "evil",
        "difftool.evil.cmd", "{prog}", "alias.merge", "!{prog}", "alias.commit", "!{prog}"),
}


@pytest.fixture
def repo(tmp_path) -> tuple[Path, WorkspaceGit, GitInfo]:
    """A repository on the session's branch, as the engine holds it."""
    ws = tmp_path / "ws"
    ws.mkdir()
    git(ws, "init", "--quiet", "--initial-branch=main")
    (ws / "shared.txt").write_text(LINES)
    git(ws, "add", "--all")
    git(ws, "commit", "--quiet", "-m", "start")
    base = git(ws, "rev-parse", "HEAD").strip()
    git(ws, "switch", "--quiet", "--create", "ralph/s")
    return ws, WorkspaceGit(str(ws)), GitInfo("ralph/s", base, "main")


def edit(path: Path, n: int, text: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    lines[n - 1] = text + "\n"
    path.write_text("".join(lines))


@pytest.mark.parametrize("key", PLANTED)
def test_a_planted_program_never_runs_in_the_engines_git(repo, tmp_path, key):
    """Planted mid-session, as an agent would: then the engine commits a task, adds a
    lane's worktree, merges the lane (both sides changed the same file) and shows the
    human the session's diff; every call works as before and the program never ran."""
    ws, engine_git, info = repo
    prog, ran = marking_program(tmp_path)
    PLANTED[key](ws, prog, tmp_path)
    # the lane: from here, line 10 changed in its worktree, committed there
    lane = tmp_path / "lane"
    engine_git.add_worktree(str(lane), "ralph-lane/s/t2", engine_git.head())
    edit(lane / "shared.txt", 10, "line ten, by t2")
    lane_git = WorkspaceGit(str(lane))
    made = lane_git.commit_task(GitInfo("ralph-lane/s/t2", info.base, None), "s", 1, "t2", "T2")
    assert made.files == ["shared.txt"]
    if key.startswith("gpg"):   # its tip, signed as the agent made it
        git(lane, "reset", "--quiet", "--soft", signed(lane, "HEAD"))
    # the session's branch: line 1 changed, the task committed
    edit(ws / "shared.txt", 1, "line one, by t1")
    made = engine_git.commit_task(info, "s", 1, "t1", "T1")
    assert made.commit and "shared.txt" in made.files and "secret.txt" not in made.files
    assert engine_git.merge("ralph-lane/s/t2", "merge t2") is None
    assert (ws / "shared.txt").read_text().splitlines()[::9] == \
        ["line one, by t1", "line ten, by t2"]            # git's own text merge
    engine_git.remove_lane(str(lane), "ralph-lane/s/t2")
    assert "line ten, by t2" in engine_git.diff(info)
    assert not ran.exists(), ran.read_text()
    if key == "core.worktree":   # nothing read or written elsewhere
        assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == ["secret.txt"]


def test_a_partial_clones_remote_never_runs_when_a_lane_is_checked_out(repo, tmp_path):
    """A blob removed and the repository made a partial clone of a remote whose URL runs
    a command (`ext::`, allowed by `protocol.ext.allow`): checking out a lane's worktree
    would fetch the blob from it, running the command as the engine. No transport is
    allowed: the checkout fails, in one line, and nothing ran."""
    ws, engine_git, info = repo
    ran = tmp_path / "ran"
    for key, value in (("core.repositoryFormatVersion", "1"),
                       ("extensions.partialClone", "origin"),
                       ("remote.origin.promisor", "true"),
                       ("remote.origin.url", f"ext::sh -c touch% {ran}"),
                       ("protocol.ext.allow", "always"), ("protocol.allow", "always")):
        git(ws, "config", key, value)
    blob = git(ws, "rev-parse", "HEAD:shared.txt").strip()
    (ws / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    with pytest.raises(GitError):
        engine_git.add_worktree(str(tmp_path / "lane"), "ralph-lane/s/t1", engine_git.head())
    assert not ran.exists()


def test_a_driver_name_holding_an_equals_sign_is_neutralised_too(repo, tmp_path):
    """`-c merge.a=b.driver=...` would set `merge.a` instead: the overrides go through
    GIT_CONFIG_KEY_n/VALUE_n, key and value apart."""
    ws, engine_git, info = repo
    prog, ran = marking_program(tmp_path)
    git(ws, "config", "merge.a=b.driver", f"{prog} %A %O %B")
    (ws / ".gitattributes").write_text("* merge=a=b\n")
    engine_git.commit_task(info, "s", 1, "t0", "T0")
    lane = tmp_path / "lane"
    engine_git.add_worktree(str(lane), "ralph-lane/s/t2", engine_git.head())
    edit(lane / "shared.txt", 10, "ten")
    WorkspaceGit(str(lane)).commit_task(GitInfo("ralph-lane/s/t2", info.base, None), "s", 1,
                                        "t2", "T2")
    edit(ws / "shared.txt", 1, "one")
    engine_git.commit_task(info, "s", 1, "t1", "T1")
    assert engine_git.merge("ralph-lane/s/t2", "merge t2") is None
    assert not ran.exists()


# --- whole sessions: the agent plants, the engine commits and merges ---

AGENT = r'''
import json, os, subprocess, sys

role, spec = os.environ["RALPH_ROLE"], json.loads(os.environ["GP_SPEC"])
sys.stdin.read()


def ralph(*args):
    subprocess.run([sys.executable, "-m", "ralph.engine", *args], check=True, timeout=60)


if role == "planner":
    if os.environ["RALPH_ITERATION"] == "1":
        ralph("emit", "plan.ready", "--json", json.dumps({"tasks": [
            {"id": t, "title": t.upper()} for t in spec["lines"]]}))
    else:
        print("LOOP_COMPLETE")
elif role == "executor":
    task = os.environ["RALPH_TASK_ID"]
    if task == spec["planter"]:
        subprocess.run(["sh", "-c", spec["plant"]], check=True)
    with open("shared.txt") as f:
        lines = f.readlines()
    n = spec["lines"][task]
    lines[n - 1] = f"line {n}, by {task}\n"
    with open("shared.txt", "w") as f:
        f.writelines(lines)
    ralph("emit", "build.done", spec["evidence"])
elif role == "reviewer":
    ralph("emit", "review.done", spec["review"])
'''


def session(tmp_path: Path, ws: Path, lines: dict[str, int], plant: str,
            parallel: int) -> Path:
    """`ralph session start` in the repository: one task per entry of `lines` (each
    changes that line of shared.txt), the first task's executor running `plant` first;
    returns the session's control plane, the session completed."""
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    config = tmp_path / "ralph.yml"
    # the human's config (outside the workspace) lets runs write .git, which the sandbox
    # otherwise shows them read-only: what the engine's git calls must withstand anyway
    config.write_text(yaml.safe_dump({
        "agent": {"backend": "command", "command": [sys.executable, str(agent)],
                  "writable": [str(ws / ".git")]},
        "event_loop": {"parallel": parallel}, "RObot": {"timeout_seconds": 5}}))
    spec = {"lines": lines, "planter": next(iter(lines)), "plant": plant,
            "evidence": EVIDENCE, "review": REVIEW_OK}
    done = ralph(ws, "session", "start", "edit shared.txt", "-c", config, "--id", "g",
                 env=base_env(GP_SPEC=json.dumps(spec)), timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    sd = session_dir(ws, "g")
    assert metadata(sd)["status"] == "completed"
    return sd


def test_a_merge_driver_an_agent_planted_never_runs_in_a_parallel_batchs_merge(repo,
                                                                                 tmp_path):
    """The attack as filed: in a parallel batch, t1's executor (in its worktree) plants a
    merge driver for every file (.git/config and .gitattributes, committed with its
    task); t1 and t2 both change shared.txt, so the engine's merge of t2 runs a merge
    driver. git's own text merge runs instead: both changes merged, the session
    completes, the program never ran (on main, it ran, and t2's change was lost)."""
    ws, _, _ = repo
    git(ws, "switch", "--quiet", "main")
    git(ws, "branch", "-D", "ralph/s")
    prog, ran = marking_program(tmp_path)
    plant = (f"git config merge.evil.driver '{prog} %A %O %B' && "
             f"echo '* merge=evil' > .gitattributes")
    sd = session(tmp_path, ws, {"t1": 1, "t2": 10}, plant, parallel=2)
    assert progress_markers(sd)["1"] == {"t1": "x", "t2": "x"}
    assert (ws / "shared.txt").read_text().splitlines()[::9] == ["line 1, by t1",
                                                                  "line 10, by t2"]
    assert not ran.exists(), ran.read_text()


def test_every_key_an_agent_plants_at_once_runs_nothing_and_the_session_completes(repo,
                                                                                    tmp_path):
    """One executor commits on its own, signed (as it may), then plants every key of
    PLANTED (but core.worktree, which would send its own git elsewhere); the engine
    commits the task (reading HEAD's message: on main, that verified the signature with
    the planted gpg.program) and the next, and completes."""
    ws, _, _ = repo
    git(ws, "switch", "--quiet", "main")
    git(ws, "branch", "-D", "ralph/s")
    prog, ran = marking_program(tmp_path)
    keys = {"merge.evil.driver": f"{prog} %A %O %B", "filter.evil.clean": prog,
            "filter.evil.smudge": prog, "core.fsmonitor": prog, "core.editor": prog,
            "sequence.editor": prog, "core.pager": prog, "pager.log": prog,
            "diff.external": prog, "diff.evil.textconv": prog, "diff.evil.command": prog,
            "trailer.sign.cmd": prog, "credential.helper": prog, "core.askPass": prog,
            "core.sshCommand": prog, "gpg.program": prog, "log.showSignature": "true",
            "merge.verifySignatures": "true", "alias.commit": f"!{prog}"}
    sign = ("git -c user.name=a -c user.email=a@localhost commit --quiet --allow-empty -m mine"
            " && git reset --quiet --soft $(git cat-file commit HEAD | sed '/^committer /a "
            "gpgsig -----BEGIN PGP SIGNATURE-----' | git hash-object -t commit -w --stdin)")
    plant = sign + " && " + " && ".join(f"git config '{k}' '{v}'" for k, v in keys.items()) + \
        " && echo '* merge=evil diff=evil filter=evil' > .gitattributes" \
        " && mkdir -p .git/hooks && printf '#!/bin/sh\\n%s\\n' " + f"'{prog}'" + \
        " > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit"
    sd = session(tmp_path, ws, {"t1": 1, "t2": 10}, plant, parallel=1)
    assert progress_markers(sd)["1"] == {"t1": "x", "t2": "x"}
    assert not ran.exists(), ran.read_text()
