"""`iterations/<N>/knowledge/`: what the Librarian staged, and what became of it.

The Librarian stages files in the work area's `iterations/<N>/knowledge/`. Promotion
moves them into the workspace's docs dir; `promoted.yaml`, in the control plane's
`iterations/<N>/knowledge/` (out of the Librarian's reach), lists what went where and
is written before anything moves, so a crash mid-way resumes the same list.
Carrying forward moves them into the next iteration with a `carried_from.yaml` marker.
The decision (promoted | skipped | carried) is recorded in the iteration's metadata by
the caller, which makes it the commit point.
"""
from __future__ import annotations

import os
from datetime import datetime

from ._atomic import make_dirs, read_nofollow, rename_durable, write_atomic
from ._errors import BadInput
from ._schema import dump_yaml, parse_yaml

PROMOTED = "promoted.yaml"
CARRIED = "carried_from.yaml"
BOOKKEEPING = (PROMOTED, CARRIED)


class Knowledge:
    def __init__(self, iteration_dir: str, record_dir: str | None = None, work=None):
        self.root = os.path.join(iteration_dir, "knowledge")
        self._iteration_dir = iteration_dir
        self._record = os.path.join(record_dir or iteration_dir, "knowledge", PROMOTED)
        self._work = work   # the WorkArea that holds iteration_dir, if any

    def _leads_out(self) -> bool:
        """knowledge/ is reached through a link an agent planted in the work area (in its
        place, or in place of a directory above it): nothing there is staged, since a walk
        or a move would take files from outside the workspace into the docs."""
        return self._work is not None and \
            self._work.leads_out(os.path.relpath(self.root, self._work.path))

    def staged(self) -> list[str]:
        """Regular files under knowledge/ (a symlink is no knowledge: promoting it would
        put a link to anywhere into the docs; os.walk does not enter linked directories)."""
        if self._leads_out():
            return []
        found = []
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                path = os.path.join(dirpath, name)
                if name not in BOOKKEEPING and not name.startswith(".") and \
                        os.path.isfile(path) and not os.path.islink(path):
                    found.append(os.path.relpath(path, self.root))
        return sorted(found)

    def promote(self, docs: str, workspace: str, *, record: dict,
                outside_allowed: bool = False) -> str | None:
        """Move the staged files into `docs`; `record` (session, iteration, why, at) heads
        promoted.yaml. A record left by an interrupted promotion is finished as it was.
        A docs dir that leads out of the workspace (a link an agent planted, say) is
        refused unless `outside_allowed` (the human's own config said so): returns why."""
        path = self._record
        if not outside_allowed and not _inside(os.path.realpath(docs),
                                               os.path.realpath(workspace)):
            return f"the docs dir {docs} leads outside the workspace {workspace}"
        if self._leads_out():
            return f"the knowledge dir {self.root} leads outside the workspace (a link)"
        try:
            found = parse_yaml(read_nofollow(path), path)
        except (OSError, BadInput):   # none yet, or a symlink or garbage in its place
            found = None
        if not isinstance(found, dict) or not isinstance(found.get("files"), list):
            found = {**record, "files": [
                {"staged": f"knowledge/{rel}",
                 "promoted_to": os.path.relpath(os.path.join(docs, rel), workspace)}
                for rel in self.staged()]}
            make_dirs(os.path.dirname(path))
            write_atomic(path, dump_yaml(found), "knowledge-record")
        for entry in found["files"]:
            move = self._checked_move(docs, workspace, entry)
            if move is not None:
                make_dirs(os.path.dirname(move[1]))
                rename_durable(*move, "knowledge-promote")
        return None

    def carry_to(self, following: "Knowledge", *, carried_from: int, now: datetime) -> None:
        """Nobody decided in time: the staged files go to the next iteration's knowledge/,
        with a carried_from marker for its Librarian to reconcile. Nothing moves from or
        into a knowledge/ that leads out of the workspace."""
        if following._leads_out():
            return
        files = self.staged()
        marker = os.path.join(following.root, CARRIED)
        if not os.path.exists(marker):
            make_dirs(following.root)
            write_atomic(marker, dump_yaml({"carried_from": carried_from, "files": files,
                                            "at": now.isoformat()}), "knowledge-carried")
        for rel in files:
            dst = os.path.join(following.root, rel)
            make_dirs(os.path.dirname(dst))
            rename_durable(os.path.join(self.root, rel), dst, "knowledge-carry")

    def _checked_move(self, docs: str, workspace: str, entry) -> tuple[str, str] | None:
        """(source, destination) of a record entry, or None: the source must be a regular
        file (not a symlink) inside this knowledge/, the destination inside the docs dir.
        Each entry is checked again all the same (a record is data, not a permission)."""
        if not isinstance(entry, dict) or not isinstance(entry.get("staged"), str) \
                or not isinstance(entry.get("promoted_to"), str):
            return None
        src = os.path.join(self._iteration_dir, entry["staged"])
        dst = os.path.join(workspace, entry["promoted_to"])
        if os.path.islink(src) or not os.path.isfile(src) or \
                not _inside(os.path.realpath(src), os.path.realpath(self.root)):
            return None
        if os.path.isdir(dst) or not _inside(os.path.realpath(dst), os.path.realpath(docs)):
            return None
        return src, dst


def _inside(path: str, root: str) -> bool:
    return path.startswith(os.path.join(root, ""))
