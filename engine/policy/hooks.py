"""Lifecycle hooks: the human's commands run at `pre.EVENT` and `post.EVENT` (ralph.yml
`hooks:`), each a real process with a timeout.

A hook gets the event as JSON on its stdin and the session in its environment
(RALPH_SESSION_ID, RALPH_WORKSPACE, RALPH_SESSION_DIR, RALPH_STATE, RALPH_ITERATION,
RALPH_HOOK, RALPH_HOOK_EVENT), never a secret of ralph's; its stdout and stderr go to a log
in the work area's `hooks/`. Each run is recorded on the bus as `hook.ran`.

At least once: a hook that finished (or failed with on_error: warn) is recorded under a
key naming its event (`hook:pre.iteration.start[0]:iteration.start:2`), and is not run
again for that event after a crash; one the engine died under (or before its record) runs
again on resume, as a webhook is redelivered. A failed block or pause hook is recorded
without a key: the step is tried again on resume, and so is the hook.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Callable, NamedTuple

from ..running.sandbox import Sandbox
from ..config import HookSpec, OnError
from ..secrets import secret

GRACE_SECONDS = 2.0
_TAIL_BYTES = 4096   # what of a failing hook's output its reason quotes (the last line)


class HookFailure(NamedTuple):
    """A pre hook that failed with on_error block or pause: the step's caller decides."""
    hook: str           # pre.plan.ready[0]
    on_error: OnError
    reason: str         # `hook pre.plan.ready[0] (check-plan) failed: exit 1: <last line>`


class Hooks:
    def __init__(self, session, hooks: dict[str, list[HookSpec]], clock, *,
                 state: Callable[[], str], say: Callable[[str], None],
                 observe: Callable[[dict], None] | None = None,
                 sandbox: Sandbox | None = None):
        self.session = session
        self.hooks = hooks
        self.clock = clock
        self._state = state
        self._say = say
        self._observe = observe   # diagnostics: each hook run's record
        self._sandbox = sandbox   # a hook runs confined as an agent does (None: unconfined)
        self._base_env = {k: v for k, v in os.environ.items()
                          if not k.startswith("RALPH_TEST_") and not secret(k)}

    def __contains__(self, name: str) -> bool:
        return bool(self.hooks.get(name))

    def pre(self, event: str, payload=None, key: str | None = None) -> HookFailure | None:
        """Run `pre.EVENT`'s hooks in order; the first that fails with block or pause
        stops the rest and comes back (warn: said, and the next one runs)."""
        return self._run(f"pre.{event}", event, payload, key)

    def post(self, event: str, payload=None, key: str | None = None) -> None:
        self._run(f"post.{event}", event, payload, key)

    def _run(self, name: str, event: str, payload, key: str | None) -> HookFailure | None:
        for i, spec in enumerate(self.hooks.get(name, ())):
            hook = f"{name}[{i}]"
            once = f"hook:{hook}:{key}" if key is not None else None
            if once is not None and self.session.done(once):
                continue   # ran for this event before a crash: not again
            failure = self._run_one(hook, event, spec, payload, once)
            if failure is not None and spec.on_error is not OnError.WARN:
                return HookFailure(hook, spec.on_error, failure)
        return None

    def _run_one(self, hook: str, event: str, spec: HookSpec, payload,
                 once: str | None) -> str | None:
        """Run one hook; the reason it failed, or None."""
        m = self.session.metadata
        env = dict(self._base_env)
        env.update({"RALPH_SESSION_ID": self.session.id,
                    "RALPH_WORKSPACE": self.session.workspace,
                    "RALPH_SESSION_DIR": self.session.work_dir,
                    "RALPH_STATE": self._state(), "RALPH_ITERATION": str(m.iteration),
                    "RALPH_HOOK": hook, "RALPH_HOOK_EVENT": event})
        for name in ("RALPH_RUN_ID", "RALPH_ROLE", "RALPH_TASK_ID", "RALPH_ATTEMPT"):
            env.pop(name, None)   # a hook is no agent run: its tools' events are refused
        stdin = json.dumps({"hook": hook, "event": event, "session_id": self.session.id,
                            "workspace": self.session.workspace, "state": self._state(),
                            "iteration": m.iteration, "payload": payload},
                           default=str).encode("utf-8")
        log_fd, log = self.session.open_hook_log(hook, self.clock.now())
        started = time.monotonic()
        exit_code, timed_out, failure = self._spawn(spec, env, stdin, log_fd)
        duration = time.monotonic() - started
        if failure is None and exit_code != 0:
            failure = f"exit {exit_code}"
        if failure is not None:
            last = _last_line(self.session, log)
            failure = f"hook {hook} ({spec.command[0]}) failed: {failure}" + \
                (f": {last}" if last else "")
        record = {"hook": hook, "event": event, "exit_code": exit_code,
                  "duration_seconds": round(duration, 3), "timed_out": timed_out,
                  "failure": failure, "on_error": spec.on_error.value, "log": log}
        if once is not None and (failure is None or spec.on_error is OnError.WARN):
            self.session.once(once, "hook.ran", record)
        else:
            self.session.append_event("hook.ran", record)
        if self._observe is not None:
            self._observe(record)
        if failure is not None:
            self._say(f"{failure} (on_error: {spec.on_error.value}; its output: {log})")
        return failure

    def _spawn(self, spec: HookSpec, env: dict, stdin: bytes,
               log_fd: int) -> tuple[int | None, bool, str | None]:
        """(exit code, timed out, why it could not run): a process group of its own, so a
        timeout stops whatever it started too."""
        command = spec.command
        if self._sandbox is not None:   # a script the agents could rewrite runs as they do
            command = self._sandbox.wrap(command, env, tree=self.session.workspace,
                                         work_dir=self.session.work_dir)
        try:
            try:
                proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log_fd,
                                        stderr=log_fd, env=env, cwd=self.session.workspace,
                                        start_new_session=True)
            except OSError as e:
                os.write(log_fd, f"ralph: cannot run {spec.command[0]!r}: {e.strerror}\n"
                         .encode())
                return None, False, f"cannot run ({e.strerror})"
        finally:
            os.close(log_fd)
        try:
            proc.stdin.write(stdin)
        except (BrokenPipeError, OSError):
            pass   # a hook that does not read its stdin is no failure
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
        try:
            return proc.wait(spec.timeout_seconds), False, None
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            return None, True, f"timed out after {spec.timeout_seconds:g}s"


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the hook's process group, a grace, then SIGKILL to whatever of it is
    left (what it started too)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass


def _last_line(session, log: str) -> str:
    """The last line the hook wrote, read without following a link planted in the work
    area."""
    data = session.work.read(os.path.relpath(log, session.work_dir)) or b""
    lines = data[-_TAIL_BYTES:].decode("utf-8", errors="replace").strip().splitlines()
    return lines[-1][:200] if lines else ""
