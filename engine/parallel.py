"""A parallel batch (`event_loop.parallel` > 1): up to N tasks of a batch at once.

Each runs on a lane: a thread of the engine with a runner of its own, in a git worktree
of its own on a branch of its own (`ralph-lane/<session>/<task>`), made where the
session's branch stood when the batch began. A lane's task that is done is committed on
its branch. When the lanes are over, their branches are merged into the session's branch
in plan order, and only then is a task [x]: the merge is its commit point. A merge that
conflicts is undone and the task runs again on top of what was merged, with the
conflicting paths in its prompt; a second conflict fails it ([F], with the paths).

The lanes share the engine (engine/running/lanes.py: one thread runs it at a time, a wait lets
go), so they share its limits, its cost and its usage limit's wait; a PAUSE or ABORT one
of them takes stops every lane's run. Whatever ends the batch, its worktrees and lane
branches go; a resume re-runs the tasks that are neither [x] nor [F].
"""
from __future__ import annotations

import os
import threading

from ralph.session_store import GitInfo, PauseKind, PlannedTask, progress, worktree_root
from ralph.states import Next, Trigger

from .running.lanes import EngineLock, Wakeups
from .running.runner import AgentRunner, Batch
from .workspace_git import LANE_PREFIX, GitError, TaskCommits, WorkspaceGit


class ParallelBatch:
    def __init__(self, session, runner: AgentRunner, repo: WorkspaceGit, *, width: int,
                 lock: EngineLock, wakeup: Wakeups, say):
        self.session = session
        self.runner = runner
        self.repo = repo
        self.width = width
        self.lock = lock
        self.wakeup = wakeup
        self._say = say
        self.root = worktree_root(session.workspace, session.id)
        self.running: dict[str, AgentRunner] = {}   # task id -> its lane's runner

    def activity(self) -> str:
        return " | ".join(r.activity for r in self.running.values() if r.activity)

    def clear(self) -> None:
        """What a batch cut short (or a dead engine) left: no worktree, no lane branch."""
        left = self.repo.clear_lanes(self.session.id, self.root)
        if left:
            self._say(f"removed {left} worktree(s) and lane branch(es) an earlier batch left")

    def settle(self, work, tasks: list[PlannedTask]) -> list[PlannedTask]:
        """The tasks left to run. A merge is a task's commit point: one merged when the
        engine died before its [x] (only the last merge can be: each [x] follows its
        merge) is [x] now, not run again (its commit would be made and merged twice)."""
        merged = self.repo.merged_task(self.session.id, work.metadata.iteration)
        if merged is None or merged not in {t.id for t in tasks}:
            return tasks
        work.set_marker(merged, progress.DONE)
        self._say(f"task {merged}: merged into the session's branch before the engine "
                  f"stopped: done")
        return [t for t in tasks if t.id != merged]

    def run(self, work, tasks: list[PlannedTask], execute) -> Next | None:
        """Run `tasks` (plan order) on up to `width` lanes; `execute(ctx, task)` is the
        state's work for one task, on the context it is given. A git that fails (an agent
        broke the repository, say) pauses the session with why."""
        try:
            return self._run(work, tasks, execute)
        except GitError as e:
            self._clear_quietly()
            return Next(Trigger.PAUSE, f"the parallel batch stopped: {e}", PauseKind.FAILURE)

    def _clear_quietly(self) -> None:
        try:
            self.clear()
        except GitError:   # the next start (or `ralph session clean`) removes them
            pass

    def _run(self, work, tasks: list[PlannedTask], execute) -> Next | None:
        self.clear()
        base = self.repo.head()
        batch = Batch(self.wakeup)
        queue, built, failures = list(tasks), {}, []
        self._say(f"{len(tasks)} tasks on {min(self.width, len(tasks))} lanes, each in a "
                  f"worktree of its own from {base[:12]}")

        def lane() -> None:
            self.lock.acquire()
            try:
                while queue and batch.stop is None:
                    task = queue.pop(0)
                    decision = self._one(work, task, execute, base, batch, built)
                    if decision is not None:
                        batch.stopped(decision)
            except BaseException as e:   # the engine failed here (a disk fault): it stops
                failures.append(e)
                batch.stopped(Next(Trigger.PAUSE, f"a lane failed: {e}", PauseKind.FAILURE))
            finally:
                self.wakeup.leave()
                self.lock.release()

        threads = [threading.Thread(target=lane, name=f"lane-{n}", daemon=True)
                   for n in range(min(self.width, len(tasks)))]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            self.wakeup.wait(1.0)   # lets the lanes run the engine
            self.wakeup.clear()
        if failures:   # the first failure is what the engine says (not a git's after it)
            self._clear_quietly()
            raise failures[0]
        if batch.stop is not None:   # what the lanes finished is kept; the rest runs again
            self._merge(work, tasks, None, built)
            self.clear()
            return batch.stop
        return self._merge(work, tasks, execute, built)

    def _one(self, work, task: PlannedTask, execute, base: str, batch: Batch,
             built: dict, notes: list[dict] | None = None) -> Next | None:
        """One task on a lane: its worktree, its run to an outcome, its commit there."""
        tree = os.path.join(self.root, task.id)
        branch = f"{LANE_PREFIX}{self.session.id}/{task.id}"
        self.repo.add_worktree(tree, branch, base)
        runner = self.runner.lane(tree, batch)
        commits = TaskCommits(WorkspaceGit(tree), self.session, say=self._say,
                              info=GitInfo(branch=branch, base=base))
        lane_work = work.for_lane(runner, commits, notes or [])
        self.running[task.id] = runner
        try:
            decision = work.before_task(task) or execute(lane_work, task)
        finally:
            del self.running[task.id]
        if decision is None and lane_work.accepted:
            built[task.id] = (tree, branch)
        else:
            self.repo.remove_lane(tree, branch)
        return decision

    def _merge(self, work, tasks: list[PlannedTask], execute, built: dict) -> Next | None:
        """The lanes' branches into the session's, in plan order; a conflict: one retry on
        top of what is merged (with no `execute`, a batch that stops: the task stays [/]
        and runs again on resume)."""
        merged = []
        for task in tasks:
            retried = False
            while task.id in built:
                tree, branch = built.pop(task.id)
                conflict = self.repo.merge(branch, f"ralph {self.session.id}: merge task "
                                                   f"{task.id}: {task.title[:80]}")
                self.repo.remove_lane(tree, branch)
                if conflict is None:
                    work.set_marker(task.id, progress.DONE)
                    merged.append(task.id)
                    self._say(f"task {task.id}: merged into the session's branch")
                elif execute is None:
                    self._say(f"task {task.id}: its changes conflict with the merged tasks' "
                              f"({', '.join(conflict[:5])}): it runs again on resume")
                elif retried:
                    why = (f"its changes conflict with those of {', '.join(merged)} "
                           f"({', '.join(conflict[:5])}), also when run again on top of them")
                    work.set_marker(task.id, progress.FAILED, why)
                    # the next planning has it among the failed tasks; a human says how
                    work.ask_human(f"Task {task.id} ({task.title}): {why}. How should the "
                                   f"conflict be resolved? Your answer reaches the next "
                                   f"planning.", task)
                else:
                    retried = True
                    self._say(f"task {task.id}: its changes conflict with the merged tasks' "
                              f"({', '.join(conflict[:5])}): it runs again on top of them")
                    note = work.publish("merge.conflict", {
                        "task": task.id, "paths": conflict[:100], "merged": merged,
                        "why": "your earlier changes conflicted with tasks merged before "
                               "yours: redo the task on top of the tree as it is now"})
                    decision = self._one(work, task, execute, self.repo.head(),
                                         Batch(self.wakeup), built, [note])
                    if decision is not None:
                        self.clear()
                        return decision
        return None
