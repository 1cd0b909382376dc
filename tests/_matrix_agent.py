"""A command agent for the crash matrix: it plays demo-agent scenario steps
(engine/demo_agent.py), plus keys that make a scenario act at exact points even when a
crash makes the engine run a step again:

    drop: [{label, type, message, target, iteration, priority} | {label, raw}]
        signals the humans drop while this run goes on, each once per workspace whatever
        the attempt. Humans act from outside the run (an agent never writes the control
        plane): the agent asks the test's humans (test_matrix.Human) with a request file,
        `<workspace>/.matrix-drops/<label>.json` (created whole, exclusively), one at a
        time, and goes on once `<label>.done` says the signal is in the mailbox (`raw`: a
        file written as is into signals/inputs, named `signal.000000-<label>.yaml`, e.g.
        a malformed one); `<label>.failed` says the humans could not (a full disk): the
        run fails, and the next run of the step asks again
    poll: true
        then takes its role's signals at this step boundary, as agents do, with the real
        `ralph tools signals poll --json` (the engine takes them for it and replies
        through the work area's inbox; an empty mailbox is answered without the engine)
    await_stop: true
        when a signal of this step was dropped during this run, wait to be stopped by the
        engine (PAUSE, ABORT, a priority STEER); exit 9 if it never comes. A run whose
        signals went before it (an earlier run of the step) plays the rest of the step.
    ask_once: {text, options, default}
        when no question with this text exists yet in the session (the humans, who see
        its control plane, say: no run does), emit `human.interact` with it
        and stop there; once one exists (asked, answered or timed out), play the rest of
        the step
    approve: {tool_name, tool_input}
        first hand this tool call to the real `ralph tools approve --cli claude`, as Claude
        Code's PreToolUse hook does, and play the step only when it is allowed (exit 1
        otherwise: the step's next run asks again)
    ask_in_run: {question, options, timeout}
        when no question with this text exists yet, ask it inside the run (the demo
        agent's `ask`: the engine asks, the run waits for the reply), then play the step;
        once one exists (an earlier run of the step asked it, its answer goes to this
        run's prompt), play the step without asking

Usage: python _matrix_agent.py SCENARIO.yaml  (the prompt arrives on stdin)
"""
import json
import os
import subprocess
import sys
import time

from ralph.engine import demo_agent

REQUESTS = ".matrix-drops"
PATIENCE = 60.0   # seconds a request may wait for the humans


def request_drops(ws: str, specs: list[dict]) -> list[bool]:
    """Have the humans drop each signal, in order, unless it was dropped before; for each,
    whether it was dropped during this run (asked now, or asked by a run the engine lost
    before the humans acted)."""
    folder = os.path.join(ws, REQUESTS)
    os.makedirs(folder, exist_ok=True)
    during = []
    for spec in specs:
        done = os.path.join(folder, f"{spec['label']}.done")
        if os.path.exists(done):
            during.append(False)
            continue
        asked = os.path.join(folder, f"{spec['label']}.json")
        failed = os.path.join(folder, f"{spec['label']}.failed")
        _create(asked, json.dumps(spec))
        give_up = time.monotonic() + PATIENCE
        while not os.path.exists(done):
            if os.path.exists(failed):
                os.unlink(asked)
                os.unlink(failed)
                raise SystemExit(f"matrix agent: the humans could not drop {spec['label']}")
            if time.monotonic() > give_up:
                raise SystemExit(f"matrix agent: nobody dropped {spec['label']}")
            time.sleep(0.005)   # poll: until the humans dropped it (or could not)
        during.append(True)
    return during


def _create(path: str, text: str) -> None:
    """`path` with `text`, appearing whole; one already there (an earlier run's) stands."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def _asked(text: str) -> bool:
    """Whether a question with this text exists in the session: asked of the humans
    (`<id>.ask` with the text, answered `<id>.asked`: yes or no), who see the control
    plane, out of every run's sight."""
    folder = os.path.join(os.environ["RALPH_WORKSPACE"], REQUESTS)
    os.makedirs(folder, exist_ok=True)
    request = os.path.join(folder, f"{os.getpid()}-{time.time_ns()}")
    _create(request + ".ask", text)
    give_up = time.monotonic() + PATIENCE
    while not os.path.exists(request + ".asked"):
        if time.monotonic() > give_up:
            raise SystemExit("matrix agent: nobody said whether it was asked")
        time.sleep(0.005)   # poll: until the test says whether it was asked
    with open(request + ".asked", encoding="utf-8") as f:
        return f.read() == "yes"


def main() -> int:
    sys.stdin.read()
    env = os.environ
    names = {"role": env["RALPH_ROLE"], "iteration": env["RALPH_ITERATION"],
             "task": env.get("RALPH_TASK_ID", ""), "attempt": env["RALPH_ATTEMPT"]}
    step = demo_agent.find_step(demo_agent.load_scenario(sys.argv[1]), names)
    if step is None:
        return 0
    dropped = request_drops(env["RALPH_WORKSPACE"], step.get("drop") or [])
    if step.get("poll"):
        taken = subprocess.run([sys.executable, "-m", "ralph.engine", "tools", "signals", "poll",
                                "--json"], capture_output=True, text=True)
        print(f"poll: exit {taken.returncode}\n{taken.stdout}{taken.stderr}", flush=True)
    call = step.pop("approve", None)
    if call:
        hook = subprocess.run([sys.executable, "-m", "ralph.engine", "tools", "approve", "--cli",
                               "claude"], input=json.dumps(call), capture_output=True,
                              text=True)
        said = json.loads(hook.stdout)["hookSpecificOutput"] if hook.stdout.strip() else {}
        print(f"approve: {said}", flush=True)
        if said.get("permissionDecision") != "allow":
            return 1
    if step.get("await_stop") and any(dropped):
        time.sleep(60)   # the wait is what is proven: the run is stopped by the signal dropped
        return 9
    ask = step.get("ask_once")
    if ask and not _asked(ask["text"]):
        step = {"emit": [{"topic": "human.interact", "json": ask}]}
    in_run = step.pop("ask_in_run", None)
    if in_run and not _asked(in_run["question"]):
        step["ask"] = in_run
    return demo_agent.play(step, env)


if __name__ == "__main__":
    sys.exit(main())
