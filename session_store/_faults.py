"""A disk that refuses writes: room kept aside to record why the engine stopped, and the
record itself, in the session's control plane (a part of the Session handle)."""
from __future__ import annotations

import os
from datetime import datetime

from ._atomic import (disk, fsync_dir, open_private, read_nofollow, temp_name,
                      unlink_quietly, write_atomic)
from ._errors import BadInput, DiskFault
from ._schema import dump_plain, parse_yaml

RESERVE_FILE = "disk-reserve"        # room kept aside to record a full disk
RESERVE_BYTES = 64 * 1024
DISK_FAULT_FILE = "disk-fault.yaml"  # why the engine stopped: its disk refused a write


class DiskFaults:
    dir: str

    def keep_reserve(self) -> None:
        """Set room aside on the session's disk (a small allocated file), given back when
        the disk fills so that the engine can still record why it stopped."""
        path = os.path.join(self.dir, RESERVE_FILE)
        try:
            if os.stat(path).st_size >= RESERVE_BYTES:
                return
        except OSError:
            pass
        tmp = temp_name(path)
        try:
            fd = open_private(tmp)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError:          # no room for it: nothing is kept aside
            unlink_quietly(tmp)

    def release_reserve(self) -> None:
        unlink_quietly(os.path.join(self.dir, RESERVE_FILE))

    def mark_disk_fault(self, fault: DiskFault, now: datetime) -> None:
        """Record why the engine stopped; views show the session paused for it."""
        write_atomic(os.path.join(self.dir, DISK_FAULT_FILE), dump_plain(
            {"reason": str(fault), "path": fault.path, "errno": fault.errno,
             "at": now.isoformat()}), "disk-fault")

    def disk_fault(self) -> dict | None:
        path = os.path.join(self.dir, DISK_FAULT_FILE)
        try:
            fault = parse_yaml(read_nofollow(path), path)
        except (OSError, BadInput):
            return None
        return fault if isinstance(fault, dict) else None

    def clear_disk_fault(self) -> None:
        path = os.path.join(self.dir, DISK_FAULT_FILE)
        if os.path.lexists(path):
            with disk(path):
                os.unlink(path)
                fsync_dir(self.dir)


