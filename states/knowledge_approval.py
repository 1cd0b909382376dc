"""KNOWLEDGE_APPROVAL: decide what happens to the knowledge the Librarian staged.

`knowledge.approval`: auto promotes at once, skip keeps it staged, required waits for
an APPROVE or SKIP signal, or the timeout, which carries it forward to the next
iteration. The decision (iteration metadata `knowledge_decision`) is the commit point.
"""
from __future__ import annotations

import os
from datetime import timedelta

from engine.config import Approval
from engine.driver_types import Next
from session_store import BadInput, dump_yaml, move_file, parse_yaml, write_atomic
from session_store._atomic import read_nofollow

PROMOTED = "promoted.yaml"
CARRIED = "carried_from.yaml"


def run(engine) -> Next:
    it, meta = engine.iteration()
    if meta.knowledge_decision is None:
        approval = engine.config.knowledge.approval
        if approval is Approval.AUTO:
            promote(engine, "knowledge.approval: auto")
        elif approval is Approval.SKIP:
            decide(engine, "skipped")
        else:
            _await_decision(engine)
    elif engine.config.knowledge.approval is Approval.REQUIRED:
        # decided by a signal, then a crash cut the poll that took it short: what waited
        # behind it (another APPROVE or SKIP for this iteration) is taken now, as that
        # poll would have (with no effect), rather than left for a later iteration
        engine.checkpoint("knowledge")
    engine.finish_iteration()
    return Next("next_iteration", f"knowledge {meta.knowledge_decision}")


def _await_decision(engine) -> None:
    """Wait for APPROVE or SKIP; at the deadline (kept across restarts) carry it forward."""
    it, meta = engine.iteration()
    if meta.knowledge_deadline is None:
        meta.knowledge_deadline = engine.clock.now() + timedelta(
            seconds=engine.config.knowledge.timeout_seconds)
        engine.save_iteration(meta)
    engine.say(f"knowledge staged in iteration {it.number}: waiting for "
               f"`ralph signal approve` or `ralph signal skip` until "
               f"{meta.knowledge_deadline.isoformat(timespec='seconds')}")
    while True:
        engine.checkpoint("knowledge")  # may decide, or raise Preempted for PAUSE/ABORT
        if meta.knowledge_decision is not None:
            return
        if engine.clock.now() >= meta.knowledge_deadline:
            carry_forward(engine)
            return
        engine.wait(meta.knowledge_deadline)


def carry_forward(engine) -> None:
    """Nobody decided in time: the staged files go to the next iteration's knowledge/,
    with a carried_from marker for its Librarian to reconcile."""
    it, _meta = engine.iteration()
    following = engine.session.iteration(it.number + 1)
    files = it.staged_knowledge()
    marker = following.path("knowledge", CARRIED)
    if not os.path.exists(marker):
        following.write(f"knowledge/{CARRIED}", dump_yaml(
            {"carried_from": it.number, "files": files,
             "at": engine.clock.now().isoformat()}), "knowledge-carried")
    for rel in files:
        move_file(it.path("knowledge", rel), following.path("knowledge", rel), "knowledge-carry")
    decide(engine, "carried")


def decide(engine, decision: str, by: str | None = None) -> None:
    """The commit point; `by` names the APPROVE/SKIP signal that decided, if one did."""
    _it, meta = engine.iteration()
    meta.knowledge_decision = decision
    meta.knowledge_decided_by = by
    engine.save_iteration(meta)


def promote(engine, why: str, by: str | None = None) -> None:
    """Move the staged files to the docs dir; knowledge/promoted.yaml says what went where.

    The list is written before anything moves, so a crash mid-way resumes the same list.
    """
    it, _meta = engine.iteration()
    record_path = it.path("knowledge", PROMOTED)
    docs = os.path.join(engine.session.workspace, engine.config.knowledge.docs_dir)
    try:
        record = parse_yaml(read_nofollow(record_path), record_path)
    except (OSError, BadInput):   # none yet, or a symlink or garbage in its place
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("files"), list):
        record = {"session": engine.session.id, "iteration": it.number, "why": why,
                  "at": engine.clock.now().isoformat(),
                  "files": [{"staged": f"knowledge/{rel}", "promoted_to": os.path.relpath(
                      os.path.join(docs, rel), engine.session.workspace)}
                      for rel in it.staged_knowledge()]}
        write_atomic(record_path, dump_yaml(record), "knowledge-record")
    for entry in record["files"]:
        move = _checked_move(it, docs, engine.session.workspace, entry)
        if move is not None:
            move_file(*move, "knowledge-promote")
    decide(engine, "promoted", by)


def _inside(path: str, root: str) -> bool:
    return path.startswith(os.path.join(root, ""))


def _checked_move(it, docs: str, workspace: str, entry) -> tuple[str, str] | None:
    """(source, destination) of a record entry, or None: the source must be a regular
    file (not a symlink) inside this iteration's knowledge/, the destination inside the
    docs dir. The record lies where the Librarian writes: it is not trusted further."""
    if not isinstance(entry, dict) or not isinstance(entry.get("staged"), str) \
            or not isinstance(entry.get("promoted_to"), str):
        return None
    src = it.path(entry["staged"])
    dst = os.path.join(workspace, entry["promoted_to"])
    if os.path.islink(src) or not os.path.isfile(src) or \
            not _inside(os.path.realpath(src), os.path.realpath(it.path("knowledge"))):
        return None
    if os.path.isdir(dst) or not _inside(os.path.realpath(dst), os.path.realpath(docs)):
        return None
    return src, dst
