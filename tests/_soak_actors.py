"""The other processes of the soak test (tests/test_soak.py): humans acting on a running
session from outside its engine, through the store, as the CLI and Telegram do.

    python _soak_actors.py drop SESSION_DIR STOP SEED LOG STOP_AT_ITERATION
        drops INFO and STEER signals (random targets) at random intervals until the
        session reaches STOP_AT_ITERATION or ends; each name is appended to LOG
    python _soak_actors.py answer SESSION_DIR STOP LOG
        answers every pending question as soon as it is seen (the answer names the
        question) until the session ends; each question id is appended to LOG

SESSION_DIR is the session's control plane (where `ralph signal` and `ralph session
answer` write). Both stop when the file STOP exists, too.
"""
import os
import random
import sys
import time
from datetime import datetime, timezone

import yaml

from ralph.session_store import BadInput, questions, signals

TARGETS = ("ALL", "Planner", "Executor", "Reviewer", "Librarian")


def _state(session_dir: str) -> tuple[int, str]:
    """(iteration, status) from metadata.yaml (rewritten whole: never half read)."""
    try:
        with open(os.path.join(session_dir, "metadata.yaml"), "rb") as f:
            meta = yaml.load(f, Loader=yaml.CSafeLoader)
    except FileNotFoundError:
        return 0, "starting"
    return meta["iteration"], meta["status"]


def _stopped(stop: str) -> bool:
    return os.path.exists(stop)


def _log(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()


def drop(session_dir: str, stop: str, seed: int, log: str, stop_at: int) -> int:
    rng = random.Random(seed)
    i = 0
    while not os.path.isdir(os.path.join(session_dir, "signals", "inputs")):
        time.sleep(0.05)   # poll: until the session exists
    while not _stopped(stop):
        # the wait is what is proven: humans act at random moments of a real run
        time.sleep(rng.uniform(0.05, 0.75))
        iteration, status = _state(session_dir)
        if iteration >= stop_at or status in ("completed", "aborted"):
            break
        i += 1
        kind = rng.choice(("INFO", "STEER"))
        target = rng.choice(TARGETS)
        name = signals.drop(session_dir, kind, f"soak signal {i} ({kind} for {target})",
                            now=datetime.now(timezone.utc), target=target)
        _log(log, name)
    return 0


def answer(session_dir: str, stop: str, log: str) -> int:
    done: set[str] = set()
    while not os.path.isdir(os.path.join(session_dir, "questions")):
        time.sleep(0.05)   # poll: until the session exists
    while not _stopped(stop):
        folder = os.path.join(session_dir, "questions")
        for name in sorted(os.listdir(folder)):
            qid = name[:-5]
            if not name.endswith(".yaml") or name.startswith(".") or qid in done:
                continue
            done.add(qid)
            try:
                questions.answer(session_dir, qid, f"the answer to {qid}",
                                 now=datetime.now(timezone.utc))
            except BadInput as e:
                _log(log, f"refused {qid}: {e}")
                continue
            _log(log, qid)
        if _state(session_dir)[1] in ("completed", "aborted"):
            break
        time.sleep(0.02)   # poll: for new questions
    return 0


if __name__ == "__main__":
    what, session_dir, stop = sys.argv[1], sys.argv[2], sys.argv[3]
    if what == "drop":
        sys.exit(drop(session_dir, stop, int(sys.argv[4]), sys.argv[5], int(sys.argv[6])))
    sys.exit(answer(session_dir, stop, sys.argv[4]))
