"""The driver: run the current state's work, fire the trigger it returns, repeat until
COMPLETE or PAUSED; then the exit code.

`Engine` is where the parts are made and wired, each with its inputs named:
  Tracker        the session's truth in memory, persisted through the store
  Mailbox        the signals the engine takes, guidance for the next prompts
  HumanDesk      questions asked by the loop, the hold, late answers
  RunQuestions   questions agents ask inside their runs, answered back to them
  Approvals      tool calls agents' CLIs ask a human to approve (agent.approve)
  Inlet          what agents' tools send through their runs' outboxes
  LimitKeeper    the agents' usage limits, waited out (or switched around) durably
  Assessor       seed 004's confidence and the help it asks for
  BlockerLedger  seed 003's repeated blockers
  KnowledgeKeeper promotion, keeping, carrying of staged knowledge
  TaskCommits    in a git workspace, a commit per done task on the session's branch
  ParallelBatch  event_loop.parallel: a batch's tasks at once, each on a lane (a worktree)
  AgentRunner    one role invocation, observed by the assessor, ledger and desk
  SessionMachine the table's machine, its hooks calling the parts above
  Hooks          the human's lifecycle hooks (ralph.yml `hooks:`), run at their events
  Work           the context the states see
"""
from __future__ import annotations

import sys

from ralph.session_store import (BadInput, DiskFault, FailedRun, PauseKind, Session, State,
                           Status, StoreUnreachable, unstructure)
from ralph.states import WORK, Next, Trigger

from .agents import containment, make_agent
from .running.sandbox import Sandbox
from .channels import telegram
from .clock import SystemClock, until
from . import config as cfg
from .config import Config
from .console import Console
from .context import Work
from .diagnostics import Diagnostics, enabled as diagnostics_on
from .policy.hooks import Hooks
from .policy.lifecycle import LifecycleHooks
from .humans import Approvals, Assessor, BlockerLedger, HumanDesk, RunQuestions
from .running.inlet import Inlet
from .knowledge import KnowledgeKeeper
from .running.lanes import EngineLock, Wakeups
from .policy.limits import LimitKeeper
from .machine import Hook, SessionMachine
from .mailbox import Mailbox, Mode
from .running.runner import AgentRunner, RunResult, limit_reached
from .tracker import Tracker
from .views import MAX_STDERR_TAIL, failed_run_text, resume_command
from .parallel import ParallelBatch
from .workspace_git import TaskCommits, WorkspaceGit

__all__ = ["Engine"]


class Engine:
    def __init__(self, session: Session, config: Config, *, clock=None, agent_for=None,
                 out=None, sandbox: Sandbox | None = None, confinement: str = ""):
        self.session = session
        self.config = config
        self.confinement = confinement   # what its runs can reach, said once it holds the session
        self.clock = clock or SystemClock()
        # one thread at a time runs the engine; a wait lets go (engine/running/lanes.py)
        self.lock = EngineLock()
        self.wakeup = Wakeups(self.lock)   # set by the mailbox watcher and by agents exiting
        self.tracker = tracker = Tracker(session, self.clock)
        self.console = Console(out or sys.stdout, self.clock,
                               status=lambda: tracker.status_line(self.activity()))

        def state() -> State:
            return tracker.state

        outside = cfg.outside_allowed(session.workspace, session.metadata.config_path)
        self.knowledge = KnowledgeKeeper(session, tracker, config.knowledge, state=state,
                                         outside_allowed=outside)
        self.mailbox = Mailbox(session, self.clock, state=state,
                               decide_knowledge=self.knowledge.decide_by_signal)
        self.desk = desk = HumanDesk(session, self.clock, tracker, self.mailbox, config.RObot,
                                     wait=self.wait_until, say=self.say, state=state)
        self.run_questions = asked = RunQuestions(
            session, self.clock, robot=config.RObot, announce=desk.announce_question,
            state=state, reply=lambda rid, data: self.inlet.reply(rid, data),
            wakeup=self.wakeup)
        self.approvals = approvals = Approvals(
            session, self.clock, rules=config.agent.approve, robot=config.RObot,
            announce=desk.announce_question, state=state,
            reply=lambda rid, data: self.inlet.reply(rid, data), wakeup=self.wakeup)
        self.inlet = Inlet(session, max_bytes=config.event_loop.max_event_bytes,
                           on_ask=asked.ask, on_ask_gone=asked.gone,
                           on_poll=self.mailbox.take_for_role, on_approve=approvals.request,
                           wakeup=self.wakeup)
        self.limits = limits = LimitKeeper(tracker, config, self.mailbox, clock=self.clock,
                                           wakeup=self.wakeup, say=self.say,
                                           publish=lambda t, p: self.runner.publish(t, p))
        self.runner = runner = AgentRunner(
            session, tracker, config, self.mailbox, self.inlet, limits,
            agent_for=agent_for or (lambda role: make_agent(limits.agent_config(role))),
            admit=lambda: limit_reached(tracker) or self._hold(), wakeup=self.wakeup,
            say=self.say, clock=self.clock, sandbox=sandbox)
        desk.on_answer.append(self._answered)
        self.assessor = assessor = Assessor(
            session, tracker, desk, config.fallback, state=state,
            work=lambda: (runner.current_task, runner.latest_outcome))
        tracker.on_task_done.append(assessor.task_completed)
        desk.on_answer.append(assessor.after_answer)
        self.ledger = BlockerLedger(session, config.blockers, lambda: tracker.metadata.fallback,
                                    outside_allowed=outside)
        self.diagnostics = Diagnostics(session, self.clock) if diagnostics_on(config) else None
        self.hooks = hooks = LifecycleHooks(
            Hooks(session, config.hooks, self.clock, state=lambda: state().value, say=self.say,
                  observe=self.diagnostics.hook if self.diagnostics else None,
                  sandbox=sandbox),
            session, tracker, say=self.say, publish=self.publish)
        desk.on_question.append(hooks.question)
        runner.observers += [self._assess_run, self._count_blockers, self._ask_humans,
                             hooks.judge_plan]
        if self.diagnostics is not None:
            runner.observers.insert(0, self._diagnose_run)
            runner.gates_judged = self.diagnostics.gates
        runner.run_ended += [lambda unit, run: asked.end_run(run),
                             lambda unit, run: approvals.end_run(run),
                             lambda unit, run: desk.release_in_run_questions(unit),
                             lambda unit, run: desk.announce()]
        runner.woken += [asked.serve, approvals.serve, desk.announce]
        self.machine = SessionMachine(tracker, record=self.record_transition, before={
            Hook.POLL: lambda nxt: self.mailbox.poll(Mode.TRANSITION),
            Hook.POLL_RESUME: lambda nxt: self.mailbox.poll(Mode.RESUME),
            Hook.ASSESS: self._assess,
            Hook.HOLD: lambda nxt: self._hold()})
        repo = WorkspaceGit(session.workspace) if session.metadata.git else None
        self.commits = TaskCommits(repo, session, say=self.say) if repo else None
        self.parallel = ParallelBatch(session, runner, repo, width=config.event_loop.parallel,
                                      lock=self.lock, wakeup=self.wakeup, say=self.say) \
            if repo and config.event_loop.parallel > 1 else None
        self.work = Work(session=session, tracker=tracker, runner=runner, mailbox=self.mailbox,
                         desk=desk, assessor=self.assessor, knowledge=self.knowledge,
                         commits=self.commits, config=config, say=self.say,
                         wait_until=self.wait_until, parallel=self.parallel)

    def _hold(self) -> Next | None:
        """Before each run and transition: approvals whose deadline passed while no hook
        waited are decided; then the hold for a pending loop question."""
        self.approvals.serve()
        return self.desk.hold()

    @property
    def metadata(self):
        return self.session.metadata

    @property
    def current(self) -> State:
        return self.machine.state

    # --- the loop ---

    def run(self, resume: bool = False, message: str | None = None,
            now: bool = False) -> int:
        """Hold the session (a second engine is refused) and run it to COMPLETE or PAUSED;
        `message` (resume --message) reaches the next run; `now` (resume --now) ends the
        wait for an agent's usage limit: the step is retried at once."""
        lease = self.session.acquire_lease()
        self.lock.acquire()
        try:
            if self.commits and self.metadata.status in (Status.ACTIVE, Status.PAUSED):
                self.commits.enter()   # the working tree on the session's branch, or refused
            if self.parallel is not None:
                self.parallel.clear()   # a dead engine's lanes: their tasks run again
            if message:
                self.mailbox.add_message(message)
            if now:
                self.limits.over("ralph session resume --now", waved=True)
            if self.confinement:   # the session held and not refused: it will run
                print(self.confinement, file=sys.stderr, flush=True)
            try:
                # before the engine's first write (a run's outbox): a disk that refused
                # writes works again, and room is kept aside to say why if it refuses one
                self.session.clear_disk_fault()
                self.session.keep_reserve()
                self.inlet.start()
                return self._run(resume, lease)
            except DiskFault as fault:
                self.hooks.error("pre", f"disk: {fault}")
                code = self._stopped_by_disk(fault)
                self.hooks.error("post", f"disk: {fault}")
                return code
            except StoreUnreachable as e:   # nothing to record it in: the console says it
                self.hooks.error("pre", f"store: {e}")
                self.say(f"paused: {e}; once it answers: ralph session resume "
                         f"{self.session.id}")
                self.hooks.error("post", f"store: {e}")
                return 3
            except (BadInput, KeyboardInterrupt, SystemExit):
                raise
            except Exception as e:   # an internal error (exit 1): the hooks hear of it
                for phase in ("pre", "post"):
                    self.hooks.error(phase, f"internal error: {type(e).__name__}: {e}")
                raise
            finally:
                self.inlet.stop()
        finally:
            self.lock.release()
            lease.release()

    def _run(self, resume: bool, lease) -> int:
        self.console.start()
        # a dead engine's runs may have left processes (tools in sessions of their own
        # outlive a SIGKILL'd CLI): none of them goes on, nor is heard
        work = self.session.work_dir
        left = containment.stop(lambda: containment.find(work))
        if left:
            self.say(f"stopped {left} process(es) left by an earlier engine's agent runs")
        # the bus too: what agents append while they run (in-run questions, progress
        # notes) is shown as it lands
        stop_watching = self.session.subscribe(self.wakeup)
        if stop_watching.failed:   # loud: wakeups now come from a 1 s poll
            self.say(f"no file-system watcher works here ({stop_watching.failed}): "
                     f"looking for signals and answers by polling instead")
            self.session.append_event("engine.watcher_failed", {"why": stop_watching.failed})
        stop_bot = telegram.start_for_session(self.session.workspace, self.session.id, self.config)
        try:
            self.reconcile()
            self.desk.recover()
            self.approvals.recover()
            pending = self.mailbox.recover()
            if pending is None and self.current not in (State.PAUSED, State.COMPLETE):
                # an interrupted session: a PAUSE or ABORT queued meanwhile goes first
                pending = self.mailbox.poll(Mode.CHECKPOINT)
            if pending is None and self.current is not State.COMPLETE:
                pending = self.hooks.start(resume)
            if pending is not None and self.current is State.PAUSED:
                # a pre.session.start hook paused a paused session: it stays paused
                self.tracker.set_paused(pending.reason, pending.kind)
                self.tracker.save()
            elif pending is not None:
                self.fire(pending)
            elif resume and self.current is State.PAUSED:
                self.desk.note_resumed()
                self.fire(Next(Trigger.RESUME, "ralph session resume"))
            while self.current not in (State.COMPLETE, State.PAUSED):
                lease.keep()   # (a database's lease ends with a lost connection)
                limit = limit_reached(self.tracker)
                if limit is not None:
                    self.fire(limit)
                    break
                if self.current is State.PLANNING and (stop := self.hooks.iteration_start()):
                    self.fire(stop)
                    break
                self.fire(WORK[self.current](self.work))
            WORK[self.current](self.work)  # PAUSED / COMPLETE: their closing work
            if self.current is State.COMPLETE:   # (a paused session's stay answerable)
                self.approvals.cancel_open()
            self.hooks.ended()
        finally:
            stop_bot()
            stop_watching()
            self.console.stop()
        return self.exit_code()

    def _stopped_by_disk(self, fault: DiskFault) -> int:
        """The disk refused a write: stop here, as a crash would (everything written so
        far is whole, and `resume` recovers from it as from a kill), after recording why
        in the room kept aside. Exit 3: resumable once the disk is healthy."""
        self.session.release_reserve()
        try:
            self.session.mark_disk_fault(fault, self.clock.now())
        except (DiskFault, OSError):
            pass   # not even that fits (a read-only disk): the console says it
        self.say(f"paused: {fault}; free space or repair the disk, then: "
                 f"{resume_command(self.session.id, self.session.workspace)}")
        return 3

    def fire(self, nxt: Next) -> None:
        """Fire `nxt`, or what a hook decided instead (a PAUSE or ABORT taken, a timeout
        policy), until one is fired."""
        before = self.current
        if nxt.trigger is Trigger.PAUSE:
            self.hooks.pausing(nxt)
        while (decision := self.machine.fire(nxt)) is not None:
            if decision.trigger is Trigger.PAUSE and self.current is State.PAUSED:
                # the hold before a resume ended in a pause (a human's answer asked for it):
                # the resume does not happen; the session stays paused, for the new reason
                self.tracker.set_paused(decision.reason, decision.kind)
                self.tracker.save()
                self.say(f"stays {self.current}: {decision.reason}")
                return
            nxt = decision
            if nxt.trigger is Trigger.PAUSE:
                self.hooks.pausing(nxt)
        if nxt.trigger is Trigger.PLAN_READY:
            self.hooks.plan_accepted()
        if nxt.signal is not None:
            self.mailbox.mark_applied(nxt.signal, nxt.trigger)
        self.say(f"{before} -> {self.current} ({nxt.trigger}"
                 f"{': ' + nxt.reason if nxt.reason else ''})")

    def exit_code(self) -> int:
        m = self.metadata
        if m.status is Status.ABORTED:
            return 4
        if m.status is Status.PAUSED:
            return 5 if m.orchestrator.pause_kind is PauseKind.LIMIT else 3
        return 0

    def record_transition(self, lt) -> None:
        """The transition's record, once by its number (persisted metadata is the commit
        point; this record comes after it)."""
        if self.session.once(
                f"session.transition:{lt.n}", "session.transition",
                {"n": lt.n, "from": lt.source.value, "to": lt.dest.value,
                 "trigger": lt.trigger, "reason": lt.reason, "at": lt.at.isoformat()},
                ts=lt.at.isoformat()):
            # the state's work is recorded: guidance delivered to it is done with
            self.mailbox.forget_delivered()
            if self.diagnostics is not None:
                self.diagnostics.transition(lt)

    def reconcile(self) -> None:
        """After a crash between persisting metadata and recording the transition, the
        record is missing: append it, once (a crash between the record and forgetting
        the delivered guidance leaves that guidance for a re-run, as before)."""
        lt = self.metadata.orchestrator.last_transition
        if lt is not None:
            self.record_transition(lt)

    def publish(self, topic: str, payload, source: str = "engine") -> dict:
        return self.runner.publish(topic, payload, source)

    # --- what the parts share ---

    def activity(self) -> str:
        """What runs now: the agent run, or each lane's of a parallel batch."""
        lanes = self.parallel.activity() if self.parallel is not None else ""
        return lanes or self.runner.activity

    def wait_until(self, deadline) -> None:
        """Sleep toward `deadline` (a datetime) until the watcher wakes us; the callers
        loop, so a wait reads the wall clock again at least every CHECK_SECONDS."""
        seconds = until(deadline, self.clock.now())
        if seconds > 0:
            self.clock.wait(self.wakeup, seconds)
        self.wakeup.clear()

    def say(self, text: str) -> None:
        self.console.say(text)

    # --- the runner's observers ---

    def _assess_run(self, result: RunResult) -> None:
        """Fold the run in; a unit failing again and again asks for help before its next
        run (the hold before every run waits for the answer), not only at a transition."""
        o = result.outcome
        unit = f"{self.metadata.iteration}/{result.role}/{result.task.id if result.task else ''}"
        self._record_failure(result, unit)
        if self.assessor.observe_run(unit, result.emitted, result.judged, o.exit_code,
                                     o.timed_out):
            self.assessor.check()

    def _record_failure(self, result: RunResult, unit: str) -> None:
        """A run that failed (a non-zero exit, a timeout) is said at once, with its exit
        code, its last stderr line and its log, and kept for `status`, the page and the
        fallback question; a run of the same step that ends well clears it."""
        o = result.outcome
        if o.exit_code or o.timed_out:
            failed = FailedRun(result.role, result.task.id if result.task else None,
                               self.metadata.iteration, o.exit_code, o.timed_out,
                               o.stderr_tail[:MAX_STDERR_TAIL], result.log, self.clock.now())
            self.tracker.set_failed_run(failed)
            self.say(failed_run_text(unstructure(failed)))
        elif self.metadata.last_failure is not None and self.metadata.last_failure.unit == unit:
            self.tracker.set_failed_run(None)

    def _assess(self, nxt: Next) -> Next | None:
        decision = self.assessor.check(nxt)
        if self.diagnostics is not None:
            self.diagnostics.assessment(self.assessor.obs.last)
        return decision

    def _diagnose_run(self, result: RunResult) -> None:
        assert self.diagnostics is not None   # observes runs only when diagnostics are on
        self.diagnostics.run(result, self.limits.agent_config(result.role))

    def _count_blockers(self, result: RunResult) -> Next | None:
        return self.ledger.observe(result.emitted)

    def _ask_humans(self, result: RunResult) -> None:
        interact = next((e for e in reversed(result.emitted) if e["topic"] == "human.interact"),
                        None)
        if interact is not None:
            self.desk.ask_from_event(interact, result.role, result.task)

    def _answered(self, question, text) -> None:
        self.runner.skip_cooldown = True   # a human answered: the next run starts at once
