"""git in a git workspace (`git: {commits: true}`): the session's own branch, one commit
per task that reaches [x], and what a session changed.

git runs here as the engine, in a repository agents can write: so never through a
shell, always with a timeout, and with every config key that makes git run a program, or
work elsewhere, neutralised for each call (engine/git_config.py says how, key by key).
The work area (`work_root`) is never staged nor counted as a change, whatever an agent
did to the .gitignore kept there.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import NamedTuple

from ralph.session_store import BadInput, GitInfo, PauseKind, PlannedTask, Session, work_root
from ralph.states import Next, Trigger

from .git_config import a_repository, config_env, environment, overrides, work_tree_top

BRANCH_PREFIX = "ralph/"
LANE_PREFIX = "ralph-lane/"   # a parallel task's branch: ralph-lane/<session>/<task>
TIMEOUT_SECONDS = 120
TRAILERS = ("Ralph-Session", "Ralph-Iteration", "Ralph-Task")
SHOWN_PATHS = 3   # the dirty paths a refusal names
RECORDED_FILES = 100   # the paths a git.commit record lists (the commit has them all)



class GitError(Exception):
    """git is missing, or refused: one line saying why."""


class TaskCommit(NamedTuple):
    commit: str | None    # None: the task changed no file
    files: list[str]


def in_work_tree(workspace: str) -> bool:
    """Whether the workspace lies in a git work tree: a `.git` in it or above it (no git
    call, so a workspace without git never runs it). A workspace not made yet (ralph makes
    it) is none: nothing of it is the repository's."""
    if not os.path.isdir(workspace):
        return False
    path = os.path.realpath(workspace)
    if os.path.exists(os.path.join(path, ".git")):
        return True   # the workspace's own: a repository, or a broken one (refused)
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
        if a_repository(os.path.join(path, ".git")):
            return True



class WorkspaceGit:
    """The workspace's repository, as the engine and the human's commands use it."""

    def __init__(self, workspace: str):
        self.workspace = os.path.abspath(workspace)
        self._work_area = os.path.relpath(work_root(workspace), self.workspace)
        self._exe = shutil.which("git")
        self._top = work_tree_top(self.workspace)

    # --- running git ---

    def run(self, *args: str, input: str | None = None, check: bool = True,
            identity: bool = False, reading_config: bool = False) -> subprocess.CompletedProcess:
        """git ARGS; `reading_config`: without the overrides (reading config runs nothing)."""
        if self._exe is None:
            raise GitError("the workspace is in a git work tree but git is not installed; "
                           "install it, or set git.commits: false")
        argv, env = [self._exe, "--no-pager", *args], environment()
        if not reading_config:
            # the work tree is the workspace's, whatever `core.worktree` says
            argv[2:2] = [f"--work-tree={self._top}"] if self._top else []
            env.update(config_env([*self._safe(), *(self._identity() if identity else ())]))
        try:
            done = subprocess.run(argv, cwd=self.workspace, env=env, input=input,
                                  capture_output=True, text=True, errors="surrogateescape",
                                  timeout=TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            raise GitError(f"git {args[0]} did not finish in {TIMEOUT_SECONDS}s") from None
        except OSError as e:
            raise GitError(f"git cannot run ({e.strerror})") from None
        if check and done.returncode != 0:
            why = (done.stderr.strip() or done.stdout.strip()).splitlines()
            raise GitError(f"git {args[0]} failed: {why[-1] if why else f'exit {done.returncode}'}")
        return done

    def _safe(self) -> list[tuple[str, str]]:
        """The overrides, read anew for every call: an agent may add a driver at any time
        (a filter's commands run on every add and checkout, a merge driver's in a merge)."""
        names = self.run("config", "--null", "--name-only", "--get-regexp",
                         r"^(filter|merge)\..*\.", check=False, reading_config=True)
        return overrides(names.stdout.split("\0"), self._exe or "git")

    def _identity(self) -> list[tuple[str, str]]:
        """A commit needs an author: the user's, else ralph's (a machine with none set)."""
        has = [self.run("config", key, check=False, reading_config=True).stdout.strip()
               for key in ("user.name", "user.email")]
        return [] if all(has) else [("user.name", "ralph"), ("user.email", "ralph@localhost")]

    def _outside_work_area(self) -> list[str]:
        return ["--", ".", f":(exclude){self._work_area}"]

    def ignored(self) -> bool:
        """The repository ignores the workspace (a scratch directory in a checkout, like
        the README's demo-workspace): its sessions are not the repository's work."""
        return self.run("check-ignore", "--quiet", ".", check=False).returncode == 0

    # --- the session's branch ---

    def check_can_start(self, session_id: str) -> None:
        """Refuse a start on a dirty tree (changes, staged or not, and files neither
        tracked nor ignored) or where the session's branch exists already."""
        top = self.run("rev-parse", "--show-toplevel", check=False)
        if top.returncode != 0:
            why = top.stderr.strip().splitlines() or [f"exit {top.returncode}"]
            raise GitError(f"{self.workspace} is not a usable git work tree ({why[-1]}); "
                           f"repair it, or set git.commits: false")
        if self.run("rev-parse", "--verify", "--quiet", "HEAD", check=False).returncode != 0:
            raise GitError("the repository has no commit yet: make one first (the session's "
                           "branch starts from HEAD), or set git.commits: false")
        dirty = self.dirty()
        if dirty:
            more = f" and {len(dirty) - SHOWN_PATHS} more" if len(dirty) > SHOWN_PATHS else ""
            raise GitError(f"the working tree has changes ({', '.join(dirty[:SHOWN_PATHS])}"
                           f"{more}): commit or stash them first, or set git.commits: false")
        branch = BRANCH_PREFIX + session_id
        if self._exists(branch):
            raise GitError(f"branch {branch} exists already: `ralph session clean "
                           f"{session_id}` or `git branch -D {branch}` first")

    def dirty(self) -> list[str]:
        out = self.run("status", "--porcelain", "-z", "--untracked-files=all",
                       *self._outside_work_area()).stdout
        entries, paths = out.split("\0"), []
        it = iter(entries)
        for entry in it:
            if entry:
                paths.append(entry[3:])
                if entry[0] in "RC":   # a rename's source follows
                    next(it, None)
        return paths

    def begin(self, session_id: str) -> GitInfo:
        """The session's branch, as metadata records it before it is made (enter)."""
        return GitInfo(branch=BRANCH_PREFIX + session_id, base=self.head(),
                       started_from=self.current_branch())

    def enter(self, info: GitInfo, *, committed: bool) -> str | None:
        """Put the working tree on the session's branch, made at its base when missing
        and nothing was `committed` yet (a start cut short); the user's branch never
        moves. Returns what was done, for the console, or None when it was there."""
        self._ignore_work_area()
        made = None
        if not self._exists(info.branch):
            if committed:
                raise GitError(f"its branch {info.branch} is gone, and the commits of its "
                               f"tasks with it; the session cannot go on without them")
            self.run("branch", info.branch, info.base)
            made = f"made branch {info.branch} at {info.base[:12]}"
        if self.current_branch() == info.branch:
            return made
        dirty = self.dirty()
        if dirty:
            raise GitError(f"the working tree is on {self.current_branch() or 'a detached HEAD'}"
                           f" with changes ({', '.join(dirty[:SHOWN_PATHS])}), not on the "
                           f"session's branch {info.branch}: commit or stash them first")
        self.run("switch", "--quiet", info.branch)
        return made or f"switched the working tree to branch {info.branch}"

    def current_branch(self) -> str | None:
        head = self.run("symbolic-ref", "--quiet", "--short", "HEAD", check=False)
        return head.stdout.strip() or None

    def _exists(self, branch: str) -> bool:
        return self.run("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}",
                        check=False).returncode == 0

    def _ignore_work_area(self) -> None:
        """A `.gitignore` of `*` in the work root keeps the user's `git status` quiet; an
        agent may remove it, so the engine never relies on it (the pathspecs exclude it)."""
        try:
            fd = os.open(work_root(self.workspace), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            f = os.open(".gitignore", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                        0o644, dir_fd=fd)
            os.write(f, b"*\n")
            os.close(f)
        except OSError:   # there already (or planted): the pathspecs still exclude it
            pass
        finally:
            os.close(fd)

    # --- a task's commit ---

    def commit_task(self, info: GitInfo, session_id: str, iteration: int, task_id: str,
                    title: str) -> TaskCommit:
        """Stage every change of the workspace but the work area and commit it as the task's.
        Idempotent: when HEAD is already this task's commit (the engine died between the
        commit and the task's [x]), the rerun's changes amend it, or it stands as it is."""
        if self.current_branch() != info.branch:
            raise GitError(f"the working tree is on {self.current_branch() or 'a detached HEAD'}"
                           f", not on the session's branch {info.branch} (an agent switched "
                           f"it?): `git switch {info.branch}`, then resume")
        self.run("add", "--all", *self._outside_work_area())
        # what an agent staged there itself (`git add -f`) leaves the index too
        self.run("reset", "--quiet", "HEAD", "--", self._work_area)
        staged = self._names("diff", "--cached", "--no-renames")
        trailers = {f"{k}: {v}" for k, v in zip(TRAILERS, (session_id, iteration, task_id))}
        already = self.run("log", "-1", "--format=%B").stdout.splitlines()
        if trailers <= {line.strip() for line in already}:
            if staged:
                self.run("commit", "--quiet", "--amend", "--no-verify", "--cleanup=verbatim",
                         "--file=-", input=self._message(session_id, iteration, task_id, title),
                         identity=True)
            return TaskCommit(self.head(), self._names("diff-tree", "--root", "--no-commit-id",
                                                        "-r", "HEAD"))
        if not staged:
            return TaskCommit(None, [])
        self.run("commit", "--quiet", "--no-verify", "--cleanup=verbatim", "--file=-",
                 input=self._message(session_id, iteration, task_id, title), identity=True)
        return TaskCommit(self.head(), staged)

    @staticmethod
    def _message(session_id: str, iteration: int, task_id: str, title: str) -> str:
        # the planner's title: one line (a line of its own could pass for a trailer)
        line = " ".join((title.splitlines() or [""])[0].split())[:100]
        return (f"ralph {session_id}: iteration {iteration}, task {task_id}: {line}\n\n"
                + "".join(f"{k}: {v}\n" for k, v in zip(TRAILERS, (session_id, iteration,
                                                                    task_id))))

    def head(self) -> str:
        return self.run("rev-parse", "HEAD").stdout.strip()


    # --- a parallel batch's lanes: a worktree and a branch per running task ---

    def add_worktree(self, path: str, branch: str, base: str) -> None:
        """A worktree at `path` on `branch`, made (anew) at `base`."""
        self.run("worktree", "add", "--quiet", "--force", "-B", branch, path, base)

    def merge(self, branch: str, message: str) -> list[str] | None:
        """Merge `branch` into the working tree's branch (a merge commit, in plan order);
        on a conflict nothing is merged and the conflicting paths come back."""
        done = self.run("merge", "--no-ff", "--no-edit", "-m", message, branch, check=False,
                        identity=True)
        if done.returncode == 0:
            return None
        conflicted = self._names("diff", "--diff-filter=U")
        self.run("merge", "--abort", check=False)
        if not conflicted:
            why = (done.stderr.strip() or done.stdout.strip()).splitlines()
            raise GitError(f"git merge {branch} failed: {why[-1] if why else done.returncode}")
        return conflicted

    def merged_task(self, session_id: str, iteration: int) -> str | None:
        """The task HEAD merges: HEAD a merge commit whose second parent is one task's
        commit of `session_id`'s `iteration`, or None."""
        parents = self.run("rev-list", "--parents", "-n", "1", "HEAD").stdout.split()
        if len(parents) != 3:
            return None
        lines = {line.strip() for line in self.run("log", "-1", "--format=%B",
                                                   parents[2]).stdout.splitlines()}
        tasks = [line[len("Ralph-Task: "):] for line in lines if line.startswith("Ralph-Task: ")]
        if {f"Ralph-Session: {session_id}", f"Ralph-Iteration: {iteration}"} <= lines \
                and len(tasks) == 1:
            return tasks[0]
        return None

    def remove_lane(self, path: str, branch: str) -> None:
        self.run("worktree", "remove", "--force", path, check=False)
        self.run("branch", "-D", branch, check=False)

    def clear_lanes(self, session_id: str, root: str) -> int:
        """Every worktree under `root` and every lane branch of the session (what a batch
        cut short, or a dead engine, left): removed. How many there were."""
        listed = self.run("worktree", "list", "--porcelain", check=False).stdout
        trees = [line[len("worktree "):] for line in listed.splitlines()
                 if line.startswith("worktree ") and
                 line[len("worktree "):].startswith(os.path.join(root, ""))]
        for tree in trees:
            self.run("worktree", "remove", "--force", tree, check=False)
        self.run("worktree", "prune", check=False)
        branches = self.run("for-each-ref", "--format=%(refname:short)",
                            f"refs/heads/{LANE_PREFIX}{session_id}/", check=False).stdout.split()
        for branch in branches:
            self.run("branch", "-D", branch, check=False)
        return len(trees) + len(branches)

    def _names(self, *args: str) -> list[str]:
        return [n for n in self.run(*args, "--name-only", "-z").stdout.split("\0") if n]

    # --- the human's commands ---

    def task_commits(self, info: GitInfo, session_id: str, task_id: str) -> list[str]:
        """The commits of the session's branch whose Ralph-Task trailer is `task_id`,
        oldest first."""
        log = self.run("log", "--reverse", "--format=%H%x00%B%x01",
                       f"{info.base}..refs/heads/{info.branch}").stdout
        found = []
        for record in log.split("\x01"):
            commit, _, body = record.strip("\n").partition("\0")
            lines = {line.strip() for line in body.splitlines()}
            if f"Ralph-Session: {session_id}" in lines \
                    and f"Ralph-Task: {task_id}" in lines:
                found.append(commit)
        return found

    def diff(self, info: GitInfo, commits: list[str] | None = None) -> str:
        """What the session changed (its base to its branch), or what `commits` did."""
        plain = ("--no-ext-diff", "--no-textconv", "--no-color")
        if commits is None:
            return self.run("diff", *plain, f"{info.base}..refs/heads/{info.branch}").stdout
        return self.run("show", *plain, "--format=medium", *commits).stdout

    def has_branch(self, info: GitInfo) -> bool:
        return self._exists(info.branch)

    def remove_branch(self, info: GitInfo) -> str:
        """Remove the session's branch; the working tree leaves it first, for the user's
        branch (or the base, detached, when it started from no branch)."""
        said = []
        if self.current_branch() == info.branch:
            back = info.started_from if info.started_from and self._exists(info.started_from) \
                else None
            self.run("switch", "--quiet", *((back,) if back else ("--detach", info.base)))
            said.append(f"switched the working tree to {back or info.base[:12]}")
        self.run("branch", "-D", info.branch)
        return "; ".join([*said, f"removed branch {info.branch}"])


class TaskCommits:
    """The states' `commit_task`: a task that reached its outcome `done` becomes a commit
    on the session's branch before its [x], recorded on the bus (`git.commit`, with a
    null commit when it changed no file). A git that fails pauses the session with why;
    the task stays [/], so a resume runs it again and commits it then."""

    def __init__(self, repo: WorkspaceGit, session: Session, *, say,
                 info: GitInfo | None = None):
        self._repo = repo
        self._session = session
        self._info = info or session.metadata.git   # a lane's: its own branch
        self._session_id = session.id
        self._say = say

    def enter(self) -> None:
        """Before the session's work: the working tree on its branch, or a refusal in one
        line (BadInput)."""
        committed = commit_record(self._session, lambda p: p.get("commit")) is not None
        try:
            done = self._repo.enter(self._info, committed=committed)
        except GitError as e:
            raise BadInput(f"session {self._session_id}: {e}") from None
        if done:
            self._say(done)

    def commit(self, iteration: int, task: PlannedTask) -> Next | None:
        try:
            made = self._repo.commit_task(self._info, self._session_id, iteration, task.id,
                                          task.title)
        except GitError as e:
            return Next(Trigger.PAUSE, f"task {task.id} is done but not committed: {e}",
                        PauseKind.FAILURE)
        payload = {"task": task.id, "iteration": iteration, "commit": made.commit,
                   "files": made.files[:RECORDED_FILES]}
        if len(made.files) > RECORDED_FILES:
            payload["more_files"] = len(made.files) - RECORDED_FILES
        self._session.append_event("git.commit", payload)
        self._say(f"task {task.id}: " + (
            f"commit {made.commit[:12]} on {self._info.branch} ({len(made.files)} file(s))"
            if made.commit else "changed no file: no commit"))
        return None


def commit_record(session: Session, wanted) -> dict | None:
    """The newest `git.commit` record of the engine whose payload `wanted` accepts."""
    return session.last_event(lambda r: r["topic"] == "git.commit"
                              and r.get("source") == "engine"
                              and isinstance(r["payload"], dict) and wanted(r["payload"]))
