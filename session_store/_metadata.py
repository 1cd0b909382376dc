"""metadata.yaml of a session and of an iteration, as attrs classes.

Small on purpose: history goes to events.jsonl, so these never grow with the session.
"""
# no `from __future__ import annotations`: cattrs reads these classes' annotations at
# each command's start, and every one given as a string costs it a compile

from datetime import datetime

from attrs import field
from attrs.validators import in_

from ._progress import MARKERS, TODO, TaskCounts, TaskLine
from ._record import record
from ._types import PauseKind, State, Status

SCHEMA_VERSION = 1


@record
class LastTransitionRecord:
    n: int
    trigger: str
    source: State
    dest: State
    reason: str | None
    at: datetime


@record
class Orchestrator:
    state: State = State.PLANNING
    previous_state: State | None = None
    pause_reason: str | None = None
    pause_kind: PauseKind | None = None
    transitions: int = 0
    last_signal: str | None = None    # the PAUSE/ABORT signal the last transition applied
    last_transition: LastTransitionRecord | None = None


@record
class Limits:
    max_iterations: int = 50
    max_runtime_seconds: float = 14400.0
    max_cost_usd: float | None = None


@record
class RoleUsage:
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    quota_points: dict[str, float] = field(factory=dict)   # window -> its percent points


@record
class Usage:
    cost_usd: float = 0.0
    runtime_seconds: float = 0.0
    agent_invocations: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    by_role: dict[str, RoleUsage] = field(factory=dict)
    # each task's share of the usage windows its runs read: task -> window -> percent points
    quota_by_task: dict[str, dict[str, float]] = field(factory=dict)

    def add_quota(self, role: str, task: str | None, window: str, points: float) -> None:
        mine = self.by_role.setdefault(role, RoleUsage()).quota_points
        mine[window] = round(mine.get(window, 0.0) + points, 1)
        if task is not None:
            its = self.quota_by_task.setdefault(task, {})
            its[window] = round(its.get(window, 0.0) + points, 1)

    def add(self, role: str, input_tokens: int, output_tokens: int, cost_usd: float) -> None:
        mine = self.by_role.setdefault(role, RoleUsage())
        for usage in (self, mine):
            usage.input_tokens += input_tokens
            usage.output_tokens += output_tokens
            usage.cost_usd = round(usage.cost_usd + cost_usd, 6)


@record
class Assessment:
    """The fallback assessor's last verdict (seed 004)."""
    confidence: float
    factors: dict[str, float]
    triggers: list[str]
    fallback_type: str | None
    mode: str
    at: datetime


@record
class Observations:
    """What the assessor reads: agents' reports and what the engine saw itself. Fixed
    size: counters and the latest reports, never a history."""
    reported: dict[str, float] = field(factory=dict)  # factor scores, complexity, risk, ambiguity
    approaches: list[str] = field(factory=list)
    missing: list[str] = field(factory=list)
    gates_passed: int = 0
    gates_failed: int = 0
    errors: int = 0                    # consecutive failed or empty runs of one unit of work
    error_unit: str | None = None      # that unit: "<iteration>/<role>/<task>"
    progress_runtime: float = 0.0      # usage.runtime_seconds when a task last reached [x]
    blockers_in_iteration: int = 0
    mode: str = "autonomous"           # autonomous | collaborative (asks before each task)
    last: Assessment | None = None


@record
class LimitWait:
    """The agent CLI hit its usage or rate limit: the step it was on is retried at `until`
    (kept here so a kill -9 or a pause waits out the same reset)."""
    agent: str                  # the backend that hit it (claude, codex, ...)
    role: str
    task: str | None
    since: datetime
    until: datetime
    text: str                   # the CLI's own words, as one line
    reset_given: bool = True    # False: the CLI said no reset (agent.limit_wait_seconds)
    switched_to: str | None = None   # on_limit: switch: the backend running meanwhile
    window: str | None = None   # a usage window past limits.quota (no limit hit): its name


@record
class InterruptedRun:
    """A run cut short (its CLI's limit, a PAUSE, a priority STEER) whose CLI can continue
    its conversation: the next run of the same step continues it, on the same backend."""
    unit: str            # "<iteration>/<role>/<task>"
    agent: str           # its backend
    conversation: str    # the CLI's id of the conversation


@record
class FailedRun:
    """The last agent run that failed (a non-zero exit, a timeout): what a human needs to
    see why, kept until a run of the same step ends well. `stderr_tail` is the agent's own
    words (untrusted: escaped wherever shown)."""
    role: str
    task: str | None
    iteration: int
    exit_code: int | None
    timed_out: bool
    stderr_tail: str
    log: str             # its stderr log, in the work area
    at: datetime

    @property
    def unit(self) -> str:
        return f"{self.iteration}/{self.role}/{self.task or ''}"


@record
class GitInfo:
    """A session's branch in a git workspace: made at `base` (the commit the user's HEAD
    was on), from the user's branch `started_from` (None: a detached HEAD)."""
    branch: str
    base: str
    started_from: str | None = None


@record
class SessionMetadata:
    session_id: str
    objective: str
    created_at: datetime
    updated_at: datetime
    schema_version: int = SCHEMA_VERSION
    revision: int = 0
    status: Status = Status.ACTIVE
    iteration: int = 1
    batch: int = 1
    orchestrator: Orchestrator = field(factory=Orchestrator)
    tasks: TaskCounts = field(factory=TaskCounts)
    limits: Limits = field(factory=Limits)
    usage: Usage = field(factory=Usage)
    pending_question: str | None = None
    fallback: Observations = field(factory=Observations)
    config_path: str | None = None
    completed_at: datetime | None = None
    limit_wait: LimitWait | None = None
    interrupted: InterruptedRun | None = None
    git: GitInfo | None = None     # None: not a git workspace, or git.commits off
    accounts: list[str] = field(factory=list)   # whose usage windows its agents spend
    last_failure: FailedRun | None = None   # the last failed agent run, while it stands


@record
class PlannedTask:
    id: str
    title: str
    description: str = ""
    batch: int = 1


@record
class Rejection:
    task: str
    reason: str


@record
class TaskProgress:
    """Where one planned task stands: the truth its line of progress.md shows, and what
    its attempts came to (their reports are the details, written before each is counted)."""
    marker: str = field(default=TODO, validator=in_(MARKERS))
    note: str | None = None
    attempts: list[str] = field(factory=list)   # each attempt's outcome, oldest first


@record
class IterationMetadata:
    iteration: int
    started_at: datetime
    planning_completed_at: datetime | None = None
    completed_at: datetime | None = None
    tasks_defined: list[PlannedTask] = field(factory=list)
    questioner_done: bool = False
    librarian_done: bool = False
    knowledge_staged: bool = False
    knowledge_decision: str | None = None   # promoted | skipped | carried
    knowledge_decided_by: str | None = None  # the APPROVE/SKIP signal that decided, if any
    rejections: list[Rejection] = field(factory=list)
    knowledge_deadline: datetime | None = None
    failed_batches: list[int] = field(factory=list)   # batches that paused the session
    # the session's task counts when this iteration began, so the session total is
    # always this plus the iteration's own markers (no history in metadata)
    tasks_before: TaskCounts = field(factory=TaskCounts)
    progress: dict[str, TaskProgress] = field(factory=dict)   # by task id; none: todo

    def task_progress(self, task_id: str) -> TaskProgress:
        return self.progress.get(task_id) or TaskProgress()

    def task_lines(self) -> list[TaskLine]:
        """The planned tasks with their markers, in plan order (what progress.md shows)."""
        return [TaskLine(t.id, t.title, t.batch, (p := self.task_progress(t.id)).marker, p.note)
                for t in self.tasks_defined]

    def batches(self) -> list[int]:
        return sorted({t.batch for t in self.tasks_defined})

    def tasks_of_batch(self, batch: int) -> list[PlannedTask]:
        return [t for t in self.tasks_defined if t.batch == batch]
