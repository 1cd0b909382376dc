"""The store a command opens: the workspace's files, or the PostgreSQL database a fleet
of engines shares when the store's URL (RALPH_STORE_URL) names one. The one place that
chooses between the backends (files/ and postgres/, which know nothing of each other);
the database's driver is imported only when a URL asks for it."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ._errors import BadInput
from ._ids import check_id
from ._iteration import METADATA_FILE
from ._metadata import GitInfo, Limits
from ._places import store_url
from ._session import Session, sessions_root
from ._types import Status
from .files import _session as files
from .files._channels import ChannelFiles, Sessions

if TYPE_CHECKING:
    from datetime import datetime

    from ._channel import Channel
    from .postgres import PostgresSessions


def fleet_store(workspace: str | None) -> "PostgresSessions | None":
    """The PostgreSQL store's sessions (the store's URL says where), or None: files."""
    url = store_url()
    if url is None:
        return None
    from .postgres import PostgresSessions
    return PostgresSessions(url, workspace)


def open_sessions(workspace: str) -> "Sessions | PostgresSessions":
    """The sessions a channel serves: the workspace's, or on a fleet's database (the
    store's URL) every machine's."""
    return fleet_store(workspace) or Sessions(workspace)


def open_channel(workspace: str, channel: str) -> "Channel":
    """A channel's state and lock: the workspace's files, or the fleet's rows."""
    url = store_url()
    if url is None:
        return ChannelFiles(workspace, channel)
    from .postgres import PostgresChannel
    return PostgresChannel(workspace, channel, url)


def create(workspace: str, objective: str, *, now: "datetime", session_id: str | None = None,
           limits: Limits | None = None, config_path: str | None = None,
           config_snapshot: str | None = None, git: GitInfo | None = None) -> Session:
    """A new session, whole or not at all (see each backend's `create`)."""
    database = fleet_store(workspace)
    if database is not None:
        return database.create(objective, now=now, session_id=session_id, limits=limits,
                               config_path=config_path, config_snapshot=config_snapshot,
                               git=git)
    return files.create(workspace, objective, now=now, session_id=session_id, limits=limits,
                        config_path=config_path, config_snapshot=config_snapshot, git=git)


def load(workspace: str, session_id: str) -> Session:
    """Read and validate a session's metadata (strict: bad metadata is BadInput, untouched)."""
    database = fleet_store(workspace)
    if database is not None:
        return database.load(session_id)
    return files.load(workspace, session_id)


def list_ids(workspace: str) -> list[str]:
    database = fleet_store(workspace)
    if database is not None:   # the fleet's: every machine's sessions
        return database.ids()
    return files.list_ids(workspace)


def load_work_area(work_dir: str) -> Session:
    """The session whose work area is `work_dir` (as `work_root` names it)."""
    root, session_id = os.path.split(os.path.abspath(work_dir))
    return load(os.path.dirname(root), session_id)


def _saved_at(workspace: str, sid: str) -> float:
    if store_url() is None:
        return os.path.getmtime(os.path.join(sessions_root(workspace), sid, METADATA_FILE))
    try:
        return load(workspace, sid).metadata.updated_at.timestamp()
    except BadInput:
        return 0.0


def resolve_id(workspace: str, session_id: str | None, newest_if_none_open: bool = False,
               named_by: str = "--session ID") -> str:
    """--session, else $RALPH_SESSION_ID, else the one session neither completed nor aborted
    (else, for read-only views, the newest session). `named_by`: how the caller's command
    names a session, for the hint when none or several are open."""
    session_id = session_id or os.environ.get("RALPH_SESSION_ID")
    if session_id:
        return check_id(session_id)
    open_ids = []
    for sid in list_ids(workspace):
        try:
            if load(workspace, sid).metadata.status not in (Status.COMPLETED, Status.ABORTED):
                open_ids.append(sid)
        except BadInput:
            continue
    if len(open_ids) == 1:
        return open_ids[0]
    if not open_ids and newest_if_none_open and list_ids(workspace):
        return max(list_ids(workspace), key=lambda sid: _saved_at(workspace, sid))
    if not open_ids:
        where = sessions_root(workspace) if store_url() is None else "the store"
        raise BadInput(f"no open session in {where}; name one: {named_by}")
    raise BadInput(f"several open sessions ({', '.join(open_ids)}); name one: {named_by}")
