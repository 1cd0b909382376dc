"""The conversation-driven fallback of seed 004.

On every transition the assessor weighs five factors into a confidence score and checks
the triggers (low confidence, errors, time without progress, complexity, risk, and the
uncertainty agents report). When one fires, the work state is captured to a markdown file
in the iteration and the human gets a structured question of the right fallback type.
The answer goes to the next prompt; the recomputed confidence then decides: autonomous
above `autonomous_continue`, collaborative (a check-in before each task) down to
`full_human_control`, and a pause below it.
"""
from __future__ import annotations

import os
import subprocess

import attrs

from ralph.session_store import Assessment, PauseKind, progress, unstructure

from ralph.states import Next, Trigger

from ..event_schemas import validate_confidence

WEIGHTS = {"task_clarity": 0.25, "solution_certainty": 0.30, "verification_success": 0.20,
           "precedent_match": 0.15, "resource_availability": 0.10}
# the lowest factor (by weighted shortfall) names the kind of help a low score needs
TYPE_OF_FACTOR = {"task_clarity": "clarification", "solution_certainty": "guidance",
                  "verification_success": "error_recovery", "precedent_match": "collaboration",
                  "resource_availability": "escalation"}
TYPE_PRIORITY = ("error_recovery", "approval", "escalation", "clarification", "guidance",
                 "collaboration")
CONTINUE, COLLABORATE, PAUSE = ("Continue autonomously",
                                "Continue, but check in with me before each task",
                                "Pause the session")


def confidence(factors: dict[str, float]) -> float:
    """The weighted sum of the five factors, clamped to [0, 1]."""
    return max(0.0, min(1.0, sum(WEIGHTS[k] * factors[k] for k in WEIGHTS)))


def factors_of(obs, tasks, error_limit: int | None = None) -> dict[str, float]:
    """Agents' reports, with what the engine observes itself taking precedence. A unit of
    work failing again and again lowers verification and certainty with each failure (to
    0 at `error_limit`), so the score never reads "all is well" next to an errors trigger."""
    reported = obs.reported
    factors = {k: float(reported.get(k, 1.0)) for k in WEIGHTS}
    gated = obs.gates_passed + obs.gates_failed
    if gated:
        factors["verification_success"] = obs.gates_passed / gated
    finished = tasks.completed + tasks.failed
    if finished:
        factors["precedent_match"] = tasks.completed / finished
    if obs.blockers_in_iteration:
        factors["resource_availability"] = max(0.0, 1.0 - 0.5 * obs.blockers_in_iteration)
    if error_limit and obs.errors:
        failing = max(0.0, 1.0 - obs.errors / error_limit)
        for factor in ("verification_success", "solution_certainty"):
            factors[factor] = min(factors[factor], failing)
    return factors


def assess(obs, tasks, runtime_seconds: float, cfg, now) -> Assessment:
    factors = factors_of(obs, tasks, cfg.error_count_threshold)
    score = confidence(factors)
    triggers: list[tuple[str, str]] = []   # (fallback type, why)
    if score < cfg.confidence_threshold and obs.mode == "autonomous":
        lowest = max(WEIGHTS, key=lambda k: WEIGHTS[k] * (1 - factors[k]))
        triggers.append((TYPE_OF_FACTOR[lowest], f"low confidence: {score:.2f} "
                                                 f"(lowest: {lowest} {factors[lowest]:.2f})"))
    if obs.errors >= cfg.error_count_threshold:
        unit = " of " + " ".join(obs.error_unit.split("/")[1:]).strip() if obs.error_unit else ""
        triggers.append(("error_recovery", f"{obs.errors} consecutive failures{unit}"))
    idle = runtime_seconds - obs.progress_runtime
    if idle > cfg.no_progress_minutes * 60:
        triggers.append(("guidance", f"no task completed for {idle / 60:.1f} minutes"))
    r = obs.reported
    if r.get("complexity", 0) > cfg.complexity_threshold:
        triggers.append(("escalation", f"complexity {r['complexity']:g} above "
                                       f"{cfg.complexity_threshold:g}"))
    if r.get("risk", 0) > cfg.risk_threshold:
        triggers.append(("approval", f"risk {r['risk']:.2f} above {cfg.risk_threshold:g}"))
    if len(obs.approaches) > cfg.max_approaches:
        triggers.append(("guidance", f"{len(obs.approaches)} possible approaches"))
    if r.get("ambiguity", 0) > cfg.ambiguity_threshold:
        triggers.append(("clarification", f"requirements ambiguity {r['ambiguity']:.2f}"))
    if obs.missing:
        triggers.append(("clarification", f"missing information: {', '.join(obs.missing)}"))
    kinds = {kind for kind, _ in triggers}
    kind = next((t for t in TYPE_PRIORITY if t in kinds), None)
    return Assessment(confidence=round(score, 4), factors={k: round(v, 4) for k, v in factors.items()},
                      triggers=[why for _, why in triggers], fallback_type=kind, mode=obs.mode,
                      at=now)


# --- the engine side ---

class Assessor:
    """Observes every run, assesses on every transition, asks for help when a trigger
    fires, and after the human's answer picks the mode (or a pause)."""

    def __init__(self, session, tracker, desk, settings, *, state, work):
        self.session = session
        self.tracker = tracker
        self.desk = desk
        self.settings = settings      # fallback config
        self._state = state           # the machine's current state
        self._work = work             # () -> (current task or None, latest build/verify outcome)

    @property
    def obs(self):
        return self.tracker.metadata.fallback

    def observe_run(self, unit: str, emitted: list[dict], judged: list[dict], exit_code,
                    timed_out) -> bool:
        """Fold one run of a unit of work ("<iteration>/<role>/<task>") into the
        observations; True when that unit has now failed `error_count_threshold` times in a
        row."""
        obs = self.obs
        for event in emitted:
            # what `ralph emit confidence` validates: an agent appending to the bus directly
            # skips that, so an invalid payload is ignored here rather than crash the engine
            if event["topic"] == "confidence" and validate_confidence(event["payload"]) is None:
                payload = event["payload"]
                obs.reported.update({k: float(v) for k, v in payload.items()
                                     if k not in ("approaches", "missing")})
                if "approaches" in payload:
                    obs.approaches = list(payload["approaches"])
                if "missing" in payload:
                    obs.missing = list(payload["missing"])
        for event in judged:
            if event["topic"] in ("build.done", "review.done", "verify.passed"):
                obs.gates_passed += 1
            elif event.get("gate", {}).get("rewritten_from"):
                obs.gates_failed += 1
        failed_topics = {"build.blocked", "review.blocked", "task.failed", "verify.failed"}
        outcomes = {"build.done", "review.done", "review.rejected", "plan.ready",
                    "LOOP_COMPLETE", "human.interact", "knowledge.staged"} | failed_topics
        topics = {e["topic"] for e in judged}
        # a Librarian with nothing worth keeping stages nothing: that is its normal outcome
        silent = not topics & outcomes and unit.split("/")[1] != "librarian"
        if timed_out or exit_code or topics & failed_topics or silent:
            obs.errors = obs.errors + 1 if obs.error_unit == unit else 1
            obs.error_unit = unit
        else:
            obs.errors, obs.error_unit = 0, None
        return obs.errors >= self.settings.error_count_threshold

    def task_completed(self) -> None:
        self.tracker.tick()
        self.obs.progress_runtime = self.tracker.metadata.usage.runtime_seconds

    def assess_now(self) -> Assessment:
        self.tracker.tick()
        m = self.tracker.metadata
        return assess(m.fallback, m.tasks, m.usage.runtime_seconds, self.settings,
                      self.tracker.clock.now())

    def check(self, nxt=None) -> None:
        """The transition hook's work: assess, and when a trigger fires, ask for help (the
        hold that comes next waits for the answer)."""
        if not self.settings.enabled or self.tracker.metadata.pending_question:
            return None
        assessment = self.assess_now()
        self.obs.last = assessment   # written with the transition's metadata
        if assessment.fallback_type is None:
            return None
        work_state = self.capture_work_state(assessment)
        self.session.append_event("fallback.triggered", {
            "type": assessment.fallback_type, "confidence": assessment.confidence,
            "factors": assessment.factors, "triggers": assessment.triggers,
            "work_state": work_state})
        current, _ = self._work()
        text, options = transition_message(assessment, self.obs, self.tracker.metadata,
                                           self._state(), current)
        self.desk.ask(text, options=options, kind="fallback", role="engine",
                      task_id=current.id if current else None,
                      fallback_type=assessment.fallback_type)
        return None

    def capture_work_state(self, a: Assessment) -> str:
        """The work state as a file in the iteration; its path relative to the session."""
        it, _meta = self.tracker.iteration()
        task, latest = self._work()
        asked = self.session.questions
        decisions = [(q.text.splitlines()[0], answer.text) for q in asked.all()
                     if (answer := asked.read_answer(q.id)) is not None]
        path = it.write_work_state(work_state_text(
            a, iteration=it.number, state=self._state(), now=self.tracker.clock.now(),
            tasks=self.tracker.tasks(), task=task, latest=latest, decisions=decisions,
            workspace=self.session.workspace))
        return os.path.relpath(path, self.session.dir)

    def check_in(self, task) -> None:
        """Collaborative mode: ask before each task (and wait: the hold comes next)."""
        obs = self.obs
        if obs.mode != "collaborative" or self.tracker.metadata.pending_question:
            return
        last = obs.last.confidence if obs.last else None
        strict = last is not None and last < self.settings.guided_collaboration
        self.desk.ask(f"Collaborative mode (confidence {last:.0%}): next task {task.id}: "
                      f"{task.title}.\nAny guidance before I start? Answer \"go\" to proceed.",
                      options=["go", PAUSE], kind="checkin", role="engine", task_id=task.id,
                      on_timeout="pause" if strict else None)

    def after_answer(self, question, answer_text: str | None) -> Next | None:
        """The human answered a fallback question: what it addressed is settled; the
        recomputed confidence picks autonomous, collaborative, or a pause."""
        if question.kind not in ("fallback", "checkin"):
            return None
        obs = self.obs
        if answer_text and answer_text.strip().lower() == PAUSE.lower():
            return Next(Trigger.PAUSE, f"paused by the answer to {question.id}",
                        PauseKind.SIGNAL)
        if question.kind != "fallback":
            return None
        kind = question.fallback_type
        addressed = {"clarification": ("task_clarity",), "guidance": ("solution_certainty",),
                     "collaboration": ("solution_certainty",),
                     "escalation": ("resource_availability",),
                     "approval": (), "error_recovery": ()}.get(kind, ())
        for factor in addressed:
            obs.reported[factor] = 1.0
        for key in ("complexity", "risk", "ambiguity"):
            obs.reported.pop(key, None)
        obs.approaches, obs.missing = [], []
        obs.errors, obs.error_unit = 0, None
        obs.progress_runtime = self.tracker.metadata.usage.runtime_seconds
        if kind == "error_recovery":
            obs.gates_passed = obs.gates_failed = 0
        if kind == "escalation":
            obs.blockers_in_iteration = 0
        cfg = self.settings
        obs.mode = "autonomous"
        score = self.assess_now().confidence
        if answer_text and answer_text.strip().lower() == COLLABORATE.lower():
            score = min(score, cfg.autonomous_continue)
        obs.mode = "autonomous" if score > cfg.autonomous_continue else "collaborative"
        obs.last = attrs.evolve(self.assess_now(), confidence=round(score, 4))
        self.tracker.save()
        self.session.append_event("fallback.resolved", {"id": question.id, "confidence": score,
                                                        "mode": obs.mode})
        if score < cfg.full_human_control:
            return Next(Trigger.PAUSE, f"confidence {score:.2f} after the answer to "
                                       f"{question.id} is below {cfg.full_human_control:g}: "
                                       f"a human takes it from here", PauseKind.FAILURE)
        return None

# --- what the human reads ---

QUESTIONS = {
    "clarification": ["Could you clarify the requirements for this task?",
                      "What are the expected outcomes?",
                      "Are there any constraints I should be aware of?"],
    "guidance": ["Which approach would you prefer, or do you have another suggestion?"],
    "approval": ["This step is high-risk. Do you approve going ahead, and with what care?"],
    "collaboration": ["Tasks like this have not gone well so far. How should we approach it "
                      "together?"],
    "escalation": ["This needs more than I have (complexity or resources). Who or what can "
                   "help, and how should I proceed meanwhile?"],
    "error_recovery": ["Runs keep failing (the last failure is under Progress so far). How "
                       "should I recover: retry differently, skip, or change the plan?"],
}


def transition_message(a: Assessment, obs, m, state, task) -> tuple[str, list[str]]:
    """Seed 004's transition message, as plain text (every channel shows it as it is: no
    markup): the question a human reads, and its options. The last failed run says why,
    escaped (its stderr line is the agent's)."""
    from ..views import failed_run_text
    needs = list(QUESTIONS[a.fallback_type])
    if a.fallback_type == "guidance" and obs.approaches:
        needs = [f"I've identified {len(obs.approaches)} possible approaches:",
                 *[f"  - {x}" for x in obs.approaches]] + needs
    if obs.missing:
        needs.append(f"Missing: {', '.join(obs.missing)}")
    options = list(obs.approaches) if a.fallback_type == "guidance" and obs.approaches \
        else [CONTINUE, COLLABORATE, PAUSE]
    t = m.tasks
    failed = [f"- last failed run: {failed_run_text(unstructure(m.last_failure))}"] \
        if m.last_failure is not None else []
    lines = [
        "I've encountered a situation that requires your guidance.", "",
        f"Current task: {task.id + ': ' + task.title if task else state.value}",
        f"Issue: {a.fallback_type.replace('_', ' ').title()}",
        f"Confidence level: {a.confidence:.1%}", "",
        "Progress so far:",
        f"- iteration {m.iteration}, {state.value}: {t.completed} of "
        f"{t.total} tasks done, {t.failed} failed",
        *[f"- {why}" for why in a.triggers], *failed, "",
        "What I need:", *[f"- {q}" for q in needs], "",
        "Options I've considered:", *[f"{i}. {o}" for i, o in enumerate(options, 1)]]
    return "\n".join(lines), options


def work_state_text(a: Assessment, *, iteration: int, state, now, tasks, task, latest: str | None,
                    decisions: list[tuple[str, str]], workspace: str) -> str:
    """Seed 004's WorkStateCapture, as markdown."""
    done = [t for t in tasks if t.marker == progress.DONE]
    rest = [t for t in tasks if t.marker not in progress.FINISHED]
    body = [
        f"# Work state — iteration {iteration}, {state.value}",
        "", f"Captured {now.isoformat(timespec='seconds')} because: "
            f"{'; '.join(a.triggers)}", "",
        "## Current step", "",
        f"{state.value}" + (f", task {task.id}: {task.title}" if task else ""),
        "", "## Completed steps", "",
        *([f"- [x] {t.id}: {t.title}" for t in done] or ["(none yet)"]),
        "", "## Changed files", "", *_changed_files(workspace),
        "", "## Latest test results", "", latest or "(no test results reported yet)",
        "", "## Decisions", "",
        *([f"- {q} → {ans}" for q, ans in decisions] or ["(none yet)"]),
        "", "## Next steps", "",
        *([f"- [{t.marker}] {t.id}: {t.title}" for t in rest] or ["(no task left in this plan)"]),
        "", "## Confidence breakdown", "",
        "| factor | weight | score |", "|---|---|---|",
        *[f"| {k} | {WEIGHTS[k]:.2f} | {a.factors[k]:.2f} |" for k in WEIGHTS],
        f"| **confidence** | | **{a.confidence:.2f}** |", ""]
    return "\n".join(body)


def _changed_files(workspace: str) -> list[str]:
    try:
        out = subprocess.run(["git", "status", "--porcelain"], cwd=workspace, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ["(git is not available)"]
    if out.returncode != 0:
        return ["(the workspace is not a git repository)"]
    return [f"- {line}" for line in out.stdout.splitlines()] or ["(no uncommitted changes)"]
