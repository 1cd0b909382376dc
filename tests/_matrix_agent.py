"""A command agent for the crash matrix: it plays demo-agent scenario steps
(engine/demo_agent.py), plus three keys that make a scenario act at exact points even
when a crash makes the engine run a step again:

    drop: [{label, type, message, target, iteration, priority} | {label, raw}]
        each signal is dropped once per workspace, whatever the attempt: the marker
        `.matrix-dropped/<label>` is created (exclusively) first, then the signal is
        dropped (`raw`: a file written as is into signals/inputs, named
        `signal.000000-<label>.yaml`, e.g. a malformed one)
    await_stop: true
        when this run dropped a signal, wait to be stopped by the engine (PAUSE, ABORT,
        a priority STEER); exit 9 if it never comes. A run that dropped nothing (the
        signal went already) plays the rest of the step instead.
    ask_once: {text, options, default}
        when no question with this text exists yet in the session, emit `human.interact`
        with it and stop there; once one exists (asked, answered or timed out), play the
        rest of the step

Usage: python _matrix_agent.py SCENARIO.yaml  (the prompt arrives on stdin)
"""
import os
import signal
import sys
import time
from datetime import datetime, timezone

from engine import demo_agent
from session_store import signals, write_atomic


def _drop(ws: str, sdir: str, spec: dict) -> bool:
    marks = os.path.join(ws, ".matrix-dropped")
    os.makedirs(marks, exist_ok=True)
    try:
        os.close(os.open(os.path.join(marks, spec["label"]), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    try:
        if "raw" in spec:
            # named to sort before the time-named ones dropped with it: the engine takes
            # (or rejects) inputs oldest name first, whether it looks between drops or after
            write_atomic(os.path.join(sdir, "signals", "inputs",
                                      f"signal.000000-{spec['label']}.yaml"), spec["raw"],
                         "agent-file")
        else:
            signals.drop(sdir, spec["type"], spec.get("message", ""),
                         now=datetime.now(timezone.utc), target=spec.get("target", "ALL"),
                         iteration=spec.get("iteration"), priority=spec.get("priority", False))
    except Exception:
        # not dropped (a full disk): the next run of this step drops it again
        os.unlink(os.path.join(marks, spec["label"]))
        raise
    time.sleep(0.003)   # names start with the time in ms: keep the drops in order
    return True


def _drop_all(ws: str, sdir: str, specs: list[dict]) -> list[bool]:
    """Drop in a child process, as `ralph signal` would be: the engine may stop or lose
    this agent the moment a PAUSE lands (SIGTERM to its group; SIGKILL when the engine
    dies, through the agent's parent-death signal, which a child does not inherit), and
    a writer killed between the link and the unlink of create_exclusive leaves its hidden
    temp name behind (ignored by the engine). The child, SIGTERM blocked, finishes."""
    if not specs:
        return []
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 1
        try:
            os.write(w, bytes(int(_drop(ws, sdir, spec)) for spec in specs))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        done = f.read()
    os.waitpid(pid, 0)
    return [bool(b) for b in done]


def _asked(sdir: str, text: str) -> bool:
    import yaml
    folder = os.path.join(sdir, "questions")
    for name in os.listdir(folder):
        if name.endswith(".yaml") and not name.startswith("."):
            with open(os.path.join(folder, name), "rb") as f:
                if (yaml.safe_load(f) or {}).get("text") == text:
                    return True
    return False


def main() -> int:
    sys.stdin.read()
    env = os.environ
    names = {"role": env["RALPH_ROLE"], "iteration": env["RALPH_ITERATION"],
             "task": env.get("RALPH_TASK_ID", ""), "attempt": env["RALPH_ATTEMPT"]}
    step = demo_agent.find_step(demo_agent.load_scenario(sys.argv[1]), names)
    if step is None:
        return 0
    ws, sdir = env["RALPH_WORKSPACE"], env["RALPH_SESSION_DIR"]
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    dropped = _drop_all(ws, sdir, step.get("drop") or [])
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if step.get("await_stop") and any(dropped):
        time.sleep(60)
        return 9
    ask = step.get("ask_once")
    if ask and not _asked(sdir, ask["text"]):
        step = {"emit": [{"topic": "human.interact", "json": ask}]}
    return demo_agent.play(step, env)


if __name__ == "__main__":
    sys.exit(main())
