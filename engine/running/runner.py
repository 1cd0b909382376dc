"""The agent runner: one role invocation, as a pipeline of one concern per step.

  admit    -> no run past a limit, none while a human question is pending, none past a
              usage window's threshold (engine/policy/quota.py), the wait for an agent's usage
              limit, the cooldown
  prepare  -> the run's environment, guidance, prompt and log files
  execute  -> the backend runs it; PAUSE/ABORT stop it; a priority STEER starts it over;
              a run that ended on its CLI's usage limit is no attempt: the limit is
              waited out (engine/policy/limits.py) and the step runs again
  collect  -> what it emitted (gated), its completion line, its cost
  observe  -> the observers (assessor, blocker ledger, human desk) see the result; the
              first that returns a decision (a pause) stops the work

Agents never see a secret of ralph's (the bot token, the web token, any RALPH_*_TOKEN,
_KEY, _SECRET, _PASSWORD, the store's URL) or the tests' variables. They talk to the
engine through the work area (RALPH_SESSION_DIR): the control plane is out of their
reach.
"""
from __future__ import annotations

import os
import shlex
import threading
from dataclasses import dataclass
from typing import Callable

from ralph.session_store import (REFUSED, InterruptedRun, PauseKind, PlannedTask, RunFiles,
                                 Session, outbox)
from ralph.states import COMPLETION, Next, Trigger
from ralph.states.context import RoleRun

from .. import prompt
from ..agents import (ApprovalHook, Invocation, McpServer, Outcome, containment, preset_for,
                      ralph_argv)
from ..agents.preset import reported_usd
from ..config import AgentConfig
from ..mailbox import Mailbox, Mode, Rerun
from ..policy import gates
from ..policy.limits import LimitKeeper
from ..secrets import secret
from ..tools.approve import Rule
from ..tracker import Tracker
from .inlet import Inlet, RunInfo
from .sandbox import Sandbox

MCP_ENV = ("PATH", "HOME", "PYTHONPATH", "LANG", "TMPDIR")   # what `ralph mcp` runs with


@dataclass(slots=True)
class RunResult:
    """What the observers see of a run."""
    role: str
    task: PlannedTask | None
    emitted: list[dict]        # as the agent emitted them
    judged: list[dict]         # as the gates took them
    outcome: Outcome
    log: str = ""              # its stderr log (the work area's logs/)


Observer = Callable[[RunResult], "Next | None"]


class Batch:
    """What the lanes of a parallel batch share: the PAUSE or ABORT one of them took,
    which stops every lane's run."""

    def __init__(self, wakeup):
        self.stop: Next | None = None
        self._wakeup = wakeup

    def stopped(self, decision: Next) -> None:
        if self.stop is None:
            self.stop = decision
            self._wakeup.set()


@dataclass(slots=True)
class _Prepared:
    invocation: Invocation
    guidance_ids: list[str]
    unit: str
    agent: AgentConfig      # the agent it runs on (the fallback while a limit lasts)
    attempt: tuple[int, str]   # its key in the runner's attempt counts


class AgentRunner:
    def __init__(self, session: Session, tracker: Tracker, config, mailbox: Mailbox,
                 inlet: Inlet, limits: LimitKeeper, *, agent_for,
                 admit: Callable[[], "Next | None"], wakeup: threading.Event,
                 say: Callable[[str], None], clock, sandbox: Sandbox | None = None):
        self.session = session
        self.tracker = tracker
        self.config = config
        self.mailbox = mailbox
        self.inlet = inlet
        self.limits = limits
        self._agent_for = agent_for
        self.sandbox = sandbox         # what each run can reach (None: the human said none)
        self._admit = admit            # limits, then the hold for a pending human question
        self.wakeup = wakeup
        self._say = say
        self.clock = clock
        self.observers: list[Observer] = []
        # each gets the run's unit of work and its id
        self.run_ended: list[Callable[[str, str], None]] = []
        self.woken: list[Callable[[], None]] = []   # run on every wakeup while an agent runs
        # diagnostics: each run's gate verdicts (role, task id, judged events, gated topics)
        self.gates_judged: Callable[[str, str | None, list[dict], tuple], None] | None = None
        self.skip_cooldown = False     # a human answered: the next run starts at once
        self.current_task: PlannedTask | None = None
        self.latest_outcome: str | None = None    # the last build/verify evidence seen
        self.activity = ""
        self._gate_notes: dict[str, list[dict]] = {}   # role -> what the gates did to its run
        self._last_run_ended: float | None = None
        self._stopping: Next | Rerun | None = None
        self._open_run: str | None = None     # the run whose outbox lines are taken now
        self.tree = session.workspace   # where its agents work (a lane's: its worktree)
        self.batch: Batch | None = None    # a parallel batch's lanes share its stop
        self._bus = session.reader()
        self._attempts: dict[tuple[int, str], int] = {}   # (iteration, role[-task]): runs
        self._ralph = ralph_argv()
        # what every run inherits: the engine's environment, less the secrets and the
        # tests' hooks (read once: os.environ decodes every item on each look)
        self._base_env = {k: v for k, v in os.environ.items()
                          if not k.startswith("RALPH_TEST_") and not secret(k)}

    def run(self, role: str, task: PlannedTask | None = None,
            pending: list[dict] | None = None) -> RoleRun | Next:
        """One agent invocation (again at once after a priority STEER). Its events come
        back gated."""
        if stop := self._batch_stopped() or self._admit() \
                or self.limits.pace(role, task.id if task else None) \
                or self.limits.wait_out() or self._cool_down():
            return stop
        self.current_task = task
        while True:
            prepared = self._prepare(role, task, list(pending or []))
            outcome = self._execute(RunInfo(prepared.invocation.env[containment.RUN_MARK],
                                            role, task.id if task else None),
                                    prepared.invocation)
            for ended in self.run_ended:
                ended(prepared.unit, prepared.invocation.env[containment.RUN_MARK])
            if not outcome.stopped and not outcome.limit:
                break
            # what its CLI said of its account's usage windows (a run cut short's too)
            self._observe_quota(role, task, prepared, outcome)
            # a run cut short is continued where its CLI can (a resume, a limit, a STEER)
            self._interrupted(prepared, outcome)
            self._account_cost(role, [], outcome)   # a stopped run still cost what it did
            if outcome.limit:
                self._forget_attempt(prepared)
                stop = self.limits.hit(role, task.id if task else None, prepared.agent,
                                       outcome.limit) or self.limits.wait_out()
                if stop:
                    return stop
                continue
            if isinstance(self._stopping, Rerun):
                self._say(f"priority STEER: {role}{' ' + task.id if task else ''} runs again now")
                continue
            return self._stopping
        self.mailbox.delivered(prepared.guidance_ids, prepared.unit)
        result = self._collect(role, task, outcome,
                               prepared.invocation.env[containment.RUN_MARK])
        self._observe_quota(role, task, prepared, outcome)   # after its events are read
        result.log = prepared.invocation.log_base + ".stderr"
        decision = next((d for observe in self.observers if (d := observe(result))), None)
        if decision is not None:
            return decision
        return RoleRun(role, result.judged, outcome.exit_code, outcome.timed_out,
                       outcome.duration, outcome.report.text, outcome.stderr_tail)

    def publish(self, topic: str, payload, source: str = "engine") -> dict:
        """An event the engine injects: through the same gate as an agent's."""
        gated, reason, _warning = gates.judge(topic, payload)
        if reason:
            payload = {"reason": reason, "rewritten_from": topic, "payload": payload}
        record = self.session.append_event(gated, payload, source=source)
        self._bus.read_new()
        return record

    # --- the steps ---

    def _cool_down(self) -> Next | None:
        """cooldown_delay_seconds between agent runs, skipped right after a human answer;
        the mailbox is still heard meanwhile."""
        delay = self.config.event_loop.cooldown_delay_seconds
        if self._last_run_ended is None or delay <= 0 or self.skip_cooldown:
            self.skip_cooldown = False
            return None
        end = self._last_run_ended + delay
        while (left := end - self.clock.monotonic()) > 0:
            self.clock.wait(self.wakeup, left)
            self.wakeup.clear()
            if (stop := self.mailbox.poll(Mode.CHECKPOINT)) is not None:
                return stop
        return None

    def _prepare(self, role: str, task: PlannedTask | None, pending: list[dict]) -> _Prepared:
        it, _ = self.tracker.iteration()
        self.inlet.drain()
        self._bus.read_new()   # what came before this run is not its output
        seq = self.tracker.count_invocation()
        name = f"{role}-{task.id}" if task else role
        # counted here once seeded from the logs (a resume's): the logs are the agents' to
        # delete (a `git clean`), the count is not
        key = (it.number, name)
        attempt = self._attempts[key] = 1 + self._attempts.get(key, it.runs_of(name))
        files: RunFiles = it.run_files(seq, name)
        env = dict(self._base_env)
        env.update({
            "RALPH_WORKSPACE": self.tree, "RALPH_SESSION_ID": self.session.id,
            "RALPH_SESSION_DIR": self.session.work_dir, "RALPH_ROLE": role,
            "RALPH_ITERATION": str(it.number), "RALPH_ITERATION_DIR": it.work_dir,
            "RALPH_STATE": self.tracker.state.value, "RALPH_ATTEMPT": str(attempt),
            # the run's mark: its events are taken while it is open, its processes found
            containment.RUN_MARK: os.path.basename(files.base)})
        # the runs' channels read-only, its own outbox the one it writes: no run (a parallel
        # lane's) speaks through another's, nor forges a reply in its own inbox
        run_id = env[containment.RUN_MARK]
        own_outbox = outbox.outbox_path(self.session.work_dir, run_id)
        shown = (os.path.dirname(outbox.run_dir(self.session.work_dir, run_id)),)
        if self.session.mailbox_dir is not None:
            # its own session's, read-only (a poll's quick look, `ralph mcp`'s status and
            # plan); the rest of the state directory is hidden
            env["RALPH_CONTROL_DIR"] = self.session.mailbox_dir
            shown += (self.session.mailbox_dir,)
        if len(self._ralph) == 1:   # a plain `ralph` works too, where PATH holds
            env["PATH"] = os.path.dirname(self._ralph[0]) + os.pathsep + env.get("PATH", "")
        if task:
            env["RALPH_TASK_ID"] = task.id
        else:
            env.pop("RALPH_TASK_ID", None)
        agent = self.limits.agent_config(role)   # with the role's overrides
        mcp = None
        if agent.mcp and preset_for(agent).supports_mcp:
            mcp = McpServer(self._ralph[0], [*self._ralph[1:], "mcp"],
                            {k: v for k, v in env.items()
                             if k.startswith("RALPH_") or k in MCP_ENV})
        unit = f"{it.number}/{role}/{task.id if task else ''}"
        conversation = self._continued(unit, agent)
        guidance = self.mailbox.guidance_for(role, task.id if task else None, unit)
        carried = [e for e in self._gate_notes.pop(role, []) if e not in pending]
        human_events = [{"topic": g["topic"], "payload": g["message"]}
                        for g in guidance if g.get("topic")]
        text = prompt.build(self.tracker.metadata.objective, role,
                            getattr(self.config.roles, role).instructions,
                            guidance=[g["message"] for g in guidance if not g.get("topic")],
                            pending_events=human_events + carried + pending,
                            ralph=shlex.join(self._ralph), mcp=mcp is not None)
        it.write_prompt(files, text)
        self.activity = f"{role}{' ' + task.id if task else ''} (attempt {attempt})"
        self._say(f"{self.tracker.state} iteration {it.number}: {self.activity}")
        return _Prepared(Invocation(role=role, prompt=text, env=env, cwd=self.tree,
                                    log_base=files.base,
                                    timeout=agent.timeout_seconds,
                                    ask_timeout=self.config.RObot.timeout_seconds,
                                    ended=self._end_run, mcp=mcp,
                                    conversation=conversation, now=self.clock.now,
                                    in_worktree=self.tree != self.session.workspace,
                                    approve=self._approval_hook(env),
                                    sandbox=self.sandbox, read_only=shown,
                                    writable=(own_outbox,)),
                         [g["id"] for g in guidance], unit, agent, key)

    def _approval_hook(self, env: dict[str, str]) -> ApprovalHook | None:
        rules = self.config.agent.approve
        if not rules:
            return None
        longest = max(r.timeout_seconds or self.config.RObot.timeout_seconds for r in rules)
        return ApprovalHook(self._ralph, tuple(dict.fromkeys(
            Rule(r.rule).tool_text for r in rules)), int(longest + 60),
            {k: v for k, v in env.items() if k.startswith("RALPH_")})

    def _continued(self, unit: str, agent: AgentConfig) -> str | None:
        """The conversation an interrupted run of this step left, to continue on the same
        backend; any other step starts afresh (a fresh context between tasks)."""
        cut = self.tracker.metadata.interrupted
        self.tracker.set_interrupted(None)
        if cut is not None and cut.unit == unit and cut.agent == agent.backend.value:
            self._say(f"continuing the {agent.backend.value} conversation of the interrupted "
                      f"run")
            return cut.conversation
        return None

    def _interrupted(self, prepared: _Prepared, outcome: Outcome) -> None:
        if outcome.conversation:
            self.tracker.set_interrupted(InterruptedRun(
                prepared.unit, prepared.agent.backend.value, outcome.conversation))

    def _observe_quota(self, role: str, task: PlannedTask | None, prepared: _Prepared,
                       outcome: Outcome) -> None:
        self.limits.observed(prepared.agent, outcome.quota, role, task.id if task else None)

    def _forget_attempt(self, prepared: _Prepared) -> None:
        """A run that ended on its CLI's limit was no attempt: the retry has its number."""
        self._attempts[prepared.attempt] -= 1

    def _execute(self, run: RunInfo, inv: Invocation) -> Outcome:
        self._stopping = None
        role = run.role
        self.inlet.open_run(run)
        self._open_run = run.id
        try:
            outcome = self._agent_for(role).run(inv, self.wakeup, self._stop_requested)
        finally:
            self._end_run()
        if outcome.left_behind:
            self._say(f"stopped {outcome.left_behind} process(es) the {role}'s run left "
                      f"running")
        self._last_run_ended = self.clock.monotonic()
        if outcome.stopped and isinstance(self._stopping, Rerun):
            self.skip_cooldown = True
        return outcome

    def _end_run(self) -> None:
        """The run is over: what it emits from now on is refused."""
        if self._open_run is not None:
            run, self._open_run = self._open_run, None
            self.inlet.close_run(run)

    def _stop_requested(self) -> str | None:
        """Asked by the backend whenever it wakes: what its agent sent (the outbox), then
        PAUSE / ABORT / a priority STEER (a PAUSE or ABORT another lane took stops this
        lane's run too)."""
        self.inlet.drain()
        for woken in self.woken:
            woken()
        self._stopping = self._batch_stopped() or self.mailbox.poll(Mode.AGENT)
        if self.batch is not None and isinstance(self._stopping, Next):
            self.batch.stopped(self._stopping)
        return self._stopping.reason if self._stopping else None

    def _batch_stopped(self) -> Next | None:
        return self.batch.stop if self.batch is not None else None

    def lane(self, tree: str, batch: "Batch") -> "AgentRunner":
        """A runner for one lane of a parallel batch: the same parts and observers, its
        own runs, in its own worktree."""
        lane = AgentRunner(self.session, self.tracker, self.config, self.mailbox,
                           self.inlet, self.limits, agent_for=self._agent_for,
                           admit=self._admit, wakeup=self.wakeup, say=self._say,
                           clock=self.clock, sandbox=self.sandbox)
        lane.observers, lane.run_ended, lane.woken = self.observers, self.run_ended, self.woken
        lane.gates_judged = self.gates_judged
        lane._attempts = self._attempts
        lane.tree, lane.batch = tree, batch
        return lane

    def _collect(self, role: str, task: PlannedTask | None, outcome: Outcome,
                 run_id: str) -> RunResult:
        # its own events, and what a human emitted meanwhile; never a refused one, nor
        # a late one of an earlier run
        emitted = [e for e in self._bus.read_new() if e.get("source") != "engine"
                   and e["topic"] != REFUSED and e.get("run") in (None, run_id)]
        said = outcome.stdout.splitlines() + outcome.report.text.splitlines()
        if COMPLETION not in {e["topic"] for e in emitted} and any(
                line.strip() == COMPLETION for line in said):
            # a LOOP_COMPLETE line on stdout or in its final words counts as the event,
            # emitted last
            emitted.append(self.session.append_event(COMPLETION, "final text", source=role))
            self._bus.read_new()
        self._account_cost(role, emitted, outcome)
        judged = self._gate(emitted, role, task)
        self.latest_outcome = next((f"{e['topic']}: {e['payload']}" for e in reversed(judged)
                                    if e["topic"].startswith(("build.", "verify."))),
                                   self.latest_outcome)
        return RunResult(role, task, emitted, judged, outcome)

    def _gate(self, emitted: list[dict], role: str, task: PlannedTask | None) -> list[dict]:
        """Judge a run's events. Each rewrite or note is recorded on the bus and reaches the
        same role's next prompt, so the agent learns why."""
        judged = gates.judge_run(emitted)
        if self.gates_judged is not None:
            self.gates_judged(role, task.id if task else None, judged, tuple(gates.GATES))
        notes = []
        for event in judged:
            gate = event.get("gate")
            if gate and "rewritten_from" in gate:
                record = self.session.append_event(event["topic"], {
                    "reason": gate["reason"], "rewritten_from": gate["rewritten_from"],
                    "original_seq": event["seq"], "task": task.id if task else None})
                event["payload"] = record["payload"]
                notes.append(event)
            elif gate:
                notes.append(self.session.append_event("gate.note", {
                    **gate, "topic": event["topic"], "original_seq": event["seq"]}))
        if notes:
            self._gate_notes[role] = notes
            self._bus.read_new()
        return [e for e in judged if "ignored" not in e.get("gate", {})]

    def _account_cost(self, role: str, emitted: list[dict], outcome: Outcome) -> None:
        """Tokens and cost: what the CLI reported (a run stopped mid-way keeps what it
        streamed), tokens priced where it reports no USD, plus `cost` events ({"usd": N})."""
        report = outcome.report
        spent = sum(reported_usd(e["payload"].get("usd")) or 0.0 for e in emitted
                    if e["topic"] == "cost" and isinstance(e["payload"], dict))
        if report.cost_usd is not None:
            spent += report.cost_usd
        else:
            agent = self.config.agent_for(role)
            prices = (agent.prices.input, agent.prices.output) if agent.prices else \
                preset_for(agent).price_per_mtok
            spent += (report.input_tokens * prices[0] + report.output_tokens * prices[1]) / 1e6
        if spent or report.input_tokens or report.output_tokens:
            self.tracker.add_usage(role, report.input_tokens, report.output_tokens, spent)


def limit_reached(tracker: Tracker) -> Next | None:
    """max_iterations (at PLANNING), max_runtime_seconds, max_cost_usd: a pause, exit 5."""
    tracker.tick()
    m, limits = tracker.metadata, tracker.metadata.limits
    reason = None
    if tracker.state.value == "PLANNING" and m.iteration > limits.max_iterations:
        reason = f"max_iterations reached ({limits.max_iterations})"
    elif m.usage.runtime_seconds >= limits.max_runtime_seconds:
        reason = f"max_runtime_seconds reached ({limits.max_runtime_seconds:g})"
    elif limits.max_cost_usd is not None and m.usage.cost_usd >= limits.max_cost_usd:
        reason = f"max_cost_usd reached ({limits.max_cost_usd:g})"
    return Next(Trigger.PAUSE, reason, PauseKind.LIMIT) if reason else None
