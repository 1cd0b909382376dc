"""Usage and rate limits of the agents' CLIs: waited out, never spent.

A run that ends on its CLI's limit (each preset reads its own CLI's words) is no attempt:
no outcome is recorded, the assessor and the blocker ledger never see it, and the same
step runs again once the limit resets. Per `agent.on_limit`:

  wait    the reset (or agent.limit_wait_seconds when the CLI names none, at most
          agent.max_limit_wait_seconds) goes into the session's metadata, then the engine
          waits for it, hearing the mailbox: a kill -9 and a resume wait for the same
          instant, a PAUSE or ABORT acts at once, `resume --now` retries at once
  pause   the session pauses (exit 3), saying when the limit resets
  switch  the step runs on agent.limit_fallback until the reset

The time spent waiting is not the session's runtime: max_runtime_seconds and the
assessor's time without progress count work, not waits.

A usage window past limits.quota's threshold (engine/policy/quota.py) is met the same way before
a run starts: `pace` records the same wait (or switch, or pause), up to the window's reset.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from ralph.session_store import LimitWait, PauseKind
from ralph.states import Next, Trigger

from . import quota
from ..agents.preset import QuotaSeen, UsageLimit
from ..clock import until as sleep_toward
from ..config import AgentConfig, Config, OnLimit
from ..mailbox import Mode
from ..safe_text import printable
from ..quota_view import at_utc
from ..views import describe_limit_wait

MIN_WAIT_SECONDS = 1.0   # a reset already past (clocks disagree) still waits this long


class LimitKeeper:
    def __init__(self, tracker, config: Config, mailbox, *, clock, wakeup, say, publish):
        self.tracker = tracker
        self.config = config
        self.mailbox = mailbox
        self.clock = clock
        self.wakeup = wakeup
        self._say = say
        self._publish = publish
        # the windows a human let through (resume --now), and when: a reading from before
        # holds no run back in this engine; a newer one (a run's since) paces again
        self._waved: dict[str, datetime] = {}

    @property
    def waiting(self) -> LimitWait | None:
        return self.tracker.metadata.limit_wait

    def agent_config(self, role: str) -> AgentConfig:
        """The role's agent, or its fallback while that agent's limit lasts (switch)."""
        agent, w = self.config.agent_for(role), self.waiting
        if w is not None and w.switched_to and agent.backend.value == w.agent \
                and self.clock.now() < w.until:
            return self.config.limit_fallback(role)
        return agent

    def pace(self, role: str, task_id: str | None) -> Next | None:
        """No new run past a usage window's threshold: the wait (or switch, or pause, per
        agent.on_limit) for its reset, recorded as a hard limit's is. None: run (after
        `wait_out`)."""
        if self.waiting is not None:
            return None   # a wait is on already (the same one, after a resume)
        agent = self.agent_config(role)
        account = quota.account_of(agent)
        self.tracker.note_account(account)
        readings = {w: r for w, r in self.tracker.session.quota(account).items()
                    if w not in self._waved or r.seen_at > self._waved[w]}
        block = quota.blocking(readings, self.config.limits.quota, self.clock.now())
        if block is None:
            return None
        return self.hit(role, task_id, agent, UsageLimit(block.until, block.words()),
                        window={"account": account, "window": block.reading.window,
                                "percent": block.reading.percent,
                                "threshold": block.threshold, "spread": block.spread})

    def observed(self, agent: AgentConfig, seen: tuple[QuotaSeen, ...], role: str,
                 task_id: str | None) -> None:
        """What a run's CLI said of its account's windows: each change recorded for every
        session on the account, with a `quota.observed` event and the run's share."""
        if not seen:
            return
        session, account = self.tracker.session, quota.account_of(agent)
        known = session.quota(account)
        self.tracker.note_account(account)
        for reading in quota.readings_of(seen, agent.backend.value, session.id,
                                         self.clock.now()):
            before = known.get(reading.window)
            points = quota.share(before, reading)
            if points:
                self.tracker.add_quota_points(role, task_id, reading.window, points)
            if not quota.changed(before, reading) or not session.record_quota(account, reading):
                continue
            self._publish("quota.observed", {
                "account": account, "agent": reading.agent, "window": reading.window,
                "percent": reading.percent,
                "resets_at": reading.resets_at.isoformat() if reading.resets_at else None,
                "role": role, "task": task_id, "share": points})

    def hit(self, role: str, task_id: str | None, agent: AgentConfig,
            limit: UsageLimit, window: dict | None = None) -> Next | None:
        """A run ended on its CLI's limit: the wait is recorded (durably) before anything
        else. A pause comes back as its Next; None: retry the step (after `wait_out`)."""
        a = self.config.agent
        now = self.clock.now()
        reset = limit.until if limit.until is not None else \
            now + timedelta(seconds=a.limit_wait_seconds)
        retry_at = max(min(reset, now + timedelta(seconds=a.max_limit_wait_seconds)),
                       now + timedelta(seconds=MIN_WAIT_SECONDS))
        earlier = self.waiting
        switch = a.on_limit is OnLimit.SWITCH and (earlier is None or not earlier.switched_to)
        if earlier is not None and earlier.switched_to and agent.backend.value == \
                earlier.switched_to:
            # the fallback is at its limit too: wait for whichever resets first
            retry_at = min(retry_at, earlier.until)
        fallback = self.config.limit_fallback(role).backend.value if switch else None
        action = "pause" if a.on_limit is OnLimit.PAUSE else "switch" if fallback else "wait"
        words = printable(limit.text.strip().splitlines()[0] if limit.text.strip() else
                          "a usage limit")[:300]
        self._publish("limit.reached", {
            "agent": agent.backend.value, "role": role, "task": task_id,
            "reset": limit.until.isoformat() if limit.until else None,
            "retry_at": retry_at.isoformat(), "text": limit.text[:1000], "action": action,
            **({"switched_to": fallback} if fallback else {}),
            **({"quota": window} if window else {})})
        if action == "pause":   # the human resumes when they choose
            return Next(Trigger.PAUSE, f"{agent.backend.value} "
                        f"{'is at its usage window' if window else 'hit its usage limit'} "
                        f"({words}); "
                        f"it resets at {at_utc(reset)}; on_limit: pause", PauseKind.USAGE_LIMIT)
        self.tracker.set_limit_wait(LimitWait(
            agent=agent.backend.value, role=role, task=task_id, since=now, until=retry_at,
            text=words, reset_given=limit.until is not None, switched_to=fallback,
            window=window["window"] if window else None))
        if fallback:
            self._say(f"{agent.backend.value} "
                      f"{'is at its usage window' if window else 'hit its usage limit'} "
                      f"({words}): the {role} runs "
                      f"on {fallback} until {at_utc(retry_at)}")
        return None

    def wait_out(self) -> Next | None:
        """Wait until the recorded limit resets (a switch does not wait): the mailbox is
        heard meanwhile (a PAUSE or ABORT comes back as its Next, guidance is kept for the
        retried run)."""
        w = self.waiting
        if w is None or w.switched_to:
            if w is not None and self.clock.now() >= w.until:
                self.over("the limit reset")
            return None
        self._say(f"{self.describe(w)}: the {w.role}{' ' + w.task if w.task else ''} is "
                  f"retried then (ralph session resume --now retries at once)")
        self.tracker.tick()
        try:
            while (now := self.clock.now()) < w.until:
                self.clock.wait(self.wakeup, sleep_toward(w.until, now))
                self.wakeup.clear()
                self.tracker.rest()
                if (stop := self.mailbox.poll(Mode.CHECKPOINT)) is not None:
                    return stop
        finally:
            self.tracker.rest()
        self.over("the limit reset")
        return None

    def over(self, why: str, waved: bool = False) -> None:
        """The wait is over (its reset came, or a human said retry now: `waved`, and a
        window's reading then holds no run back)."""
        w = self.waiting
        if w is None:
            return
        if waved and w.window:
            self._waved[w.window] = self.clock.now()
        self._publish("limit.over", {"agent": w.agent, "why": why,
                                     "waited_seconds": round((self.clock.now() - w.since)
                                                             .total_seconds(), 3)})
        self.tracker.set_limit_wait(None)

    def describe(self, w: LimitWait) -> str:
        return describe_limit_wait(w, self.clock.now())
