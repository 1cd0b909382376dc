"""The context the states work through (states.context.StateContext), over the engine's
parts. It adds no behaviour of its own: each verb is one part's. A parallel batch's lane
works through a LaneWork: the same parts, the lane's runner and worktree."""
from __future__ import annotations

import copy

from ralph.session_store import Attempt, PlannedTask, progress
from ralph.states.context import IterationView, RoleRun, Streaks

from .policy.attempts import run_until_outcome
from .mailbox import Mode
from .views import resume_command


class Work:
    def __init__(self, *, session, tracker, runner, mailbox, desk, assessor, knowledge,
                 commits, config, say, wait_until, parallel=None):
        self._session = session
        self._tracker = tracker
        self._runner = runner
        self._mailbox = mailbox
        self._desk = desk
        self._assessor = assessor
        self._knowledge = knowledge
        self._commits = commits
        self._config = config
        self.say = say
        self.wait_until = wait_until
        self._parallel = parallel   # a ParallelBatch (event_loop.parallel > 1), or None

    @property
    def metadata(self):
        return self._tracker.metadata

    def now(self):
        return self._tracker.clock.now()

    def resume_command(self) -> str:
        return resume_command(self._session.id, self._session.workspace)

    # --- the iteration ---

    def iteration(self) -> IterationView:
        return IterationView(*self._tracker.iteration())

    def earlier_iteration(self, number: int) -> IterationView | None:
        earlier = self._tracker.earlier(number)
        return IterationView(*earlier) if earlier is not None else None

    def tasks(self):
        return self._tracker.tasks()

    def marker(self, task_id: str) -> str:
        return self._tracker.marker(task_id)

    def set_marker(self, task_id: str, marker: str, note: str | None = None) -> None:
        self._tracker.set_marker(task_id, marker, note)

    def record_plan(self, tasks: list[PlannedTask]) -> None:
        self._tracker.record_plan(tasks)

    def record_nothing_left(self) -> None:
        self._tracker.record_nothing_left()

    def record_questioner_done(self) -> None:
        self._tracker.record_questioner_done()

    def record_attempt(self, task: PlannedTask, ran: RoleRun, outcome: str) -> None:
        self._tracker.record_attempt(Attempt(
            task.id, task.title, outcome, ran.exit_code, ran.timed_out, ran.duration,
            [(e["topic"], e["payload"]) for e in ran.events],
            "\n".join(ran.output.splitlines()[-40:])))

    def record_review(self, task: PlannedTask, verdict: str, reason) -> None:
        self._tracker.record_review(task, verdict, reason)

    def record_batch_failed(self, batch: int) -> None:
        self._tracker.record_batch_failed(batch)

    def record_librarian_done(self) -> None:
        self._tracker.record_librarian_done()

    def set_knowledge_deadline(self, deadline) -> None:
        self._tracker.set_knowledge_deadline(deadline)

    def accept_task(self, task: PlannedTask):
        """Its outcome is done: committed (in a git workspace; a git that fails pauses),
        then [x]."""
        if self._commits is not None:   # None: not a git workspace, or git.commits off
            if stop := self._commits.commit(self._tracker.metadata.iteration, task):
                return stop
        self._tracker.set_marker(task.id, progress.DONE)
        return None

    def run_tasks(self, tasks: list[PlannedTask], execute):
        """Each task's work, `execute(ctx, task)`: in plan order, with the hold and the
        mailbox between tasks; with event_loop.parallel, on lanes at once."""
        if self._parallel is not None:
            tasks = self._parallel.settle(self, tasks)
            if len(tasks) > 1:
                return self._parallel.run(self, tasks, execute)
        for task in tasks:
            if stop := self.before_task(task) or execute(self, task) or self.checkpoint():
                return stop
        return None

    def for_lane(self, runner, commits, notes: list[dict]) -> "LaneWork":
        lane = copy.copy(self)
        lane.__class__ = LaneWork
        lane._runner, lane._commits, lane.notes, lane.accepted = runner, commits, notes, False
        return lane

    def publish(self, topic: str, payload) -> dict:
        return self._runner.publish(topic, payload)

    def ask_human(self, text: str, task: PlannedTask) -> None:
        """A question of the engine's about `task`: the hold before the next run waits for
        the answer (or its timeout); the answer reaches the next prompt."""
        self._desk.ask(text, task_id=task.id)

    def finish_iteration(self) -> None:
        self._tracker.finish_iteration()

    # --- agents ---

    def role_enabled(self, role: str) -> bool:
        return self._config.role_enabled(role)

    def human_answers(self, role: str) -> list[tuple[str, str]]:
        asked, n = self._session.questions, self._tracker.metadata.iteration
        return [(q.text, a.text) for q in asked.all()
                if q.context.role == role and q.context.iteration == n
                and (a := asked.read_answer(q.id)) is not None]

    def run_role(self, role: str, task: PlannedTask | None = None):
        return self._runner.run(role, task)

    def run_until_outcome(self, role, task, pending, *, done, failed=(), blocked=None,
                          streaks=Streaks(), after_each=None):
        return run_until_outcome(self._runner, role, task, pending, done=done, failed=failed,
                                 blocked=blocked, streaks=streaks, after_each=after_each)

    # --- humans and the mailbox ---

    def checkpoint(self):
        return self._mailbox.poll(Mode.CHECKPOINT)

    def before_task(self, task: PlannedTask):
        self._assessor.check_in(task)
        return self._desk.hold()

    def take_decision_signals(self):
        return self._mailbox.poll(Mode.KNOWLEDGE)

    # --- knowledge ---

    def knowledge_policy(self) -> tuple[str, float]:
        k = self._config.knowledge
        return k.approval.value, k.timeout_seconds

    def promote_knowledge(self, why: str) -> None:
        self._knowledge.promote(why)

    def keep_knowledge(self) -> None:
        self._knowledge.keep()

    def carry_knowledge(self) -> None:
        self._knowledge.carry()

    # --- the end ---

    def close(self) -> None:
        if not self._session.has_summary():
            self._session.write_summary()


class LaneWork(Work):
    """A lane's context: its task runs in the lane's worktree, with `notes` (a merge's
    conflict) among its pending events; accepted, it is committed on the lane's branch,
    and [x] once merged (engine/parallel.py)."""
    notes: list[dict]
    accepted: bool

    def accept_task(self, task: PlannedTask):
        if stop := self._commits.commit(self._tracker.metadata.iteration, task):
            return stop
        self.accepted = True
        return None

    def run_until_outcome(self, role, task, pending, **kwargs):
        return super().run_until_outcome(role, task, self.notes + pending, **kwargs)
