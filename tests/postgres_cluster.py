"""A throwaway PostgreSQL cluster for the tests: Debian's server binaries, a private port
and socket directory, no system service. `.ci/run` starts one for the whole run
(`python3 tests/postgres_cluster.py start DIR` prints its URL); the tests' fixture starts
its own when none is given ($RALPH_TEST_DATABASE_URL), so the fast loop needs nothing.

The server refuses to run as root: as root, the cluster belongs to the `postgres` user
that Debian's package creates.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys


def bindir() -> str | None:
    """Where initdb and pg_ctl are: on PATH, else Debian's versioned directory."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return os.path.dirname(os.path.realpath(found))
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                      key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return os.path.dirname(versions[-1]) if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_owner(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def start(root: str, port: int | None = None) -> str:
    """Make and start a cluster under `root` (or start the one made there before, on
    `port`); returns its URL (database `ralph`)."""
    where = bindir()
    if where is None:
        raise RuntimeError("PostgreSQL's server is not installed (apt-get install postgresql)")
    port = port or _free_port()
    data, sockets = os.path.join(root, "data"), os.path.join(root, "sockets")
    os.makedirs(sockets, exist_ok=True)
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chmod(root, 0o755)
        for path in (root, sockets):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    fresh = not os.path.exists(os.path.join(data, "PG_VERSION"))
    if fresh:
        subprocess.run(_as_owner([f"{where}/initdb", "-D", data, "-U", "ralph", "-A", "trust",
                                  "-E", "UTF8", "--no-instructions"]),
                       check=True, stdout=subprocess.DEVNULL)
    options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c max_connections=400"
    subprocess.run(_as_owner([f"{where}/pg_ctl", "-D", data, "-l", os.path.join(root, "log"),
                              "-o", options, "-w", "start"]),
                   check=True, stdout=subprocess.DEVNULL)
    if fresh:
        subprocess.run(_as_owner([f"{where}/psql", "-h", sockets, "-p", str(port), "-U",
                                  "ralph", "-d", "postgres", "-qc", "CREATE DATABASE ralph"]),
                       check=True, stdout=subprocess.DEVNULL)
    return f"postgresql://ralph@127.0.0.1:{port}/ralph"


def stop(root: str, mode: str = "fast") -> None:
    where = bindir()
    subprocess.run(_as_owner([f"{where}/pg_ctl", "-D", os.path.join(root, "data"), "-m", mode,
                              "-w", "stop"]), stdout=subprocess.DEVNULL)


def restart(root: str) -> None:
    """Stop and start the same cluster (what a database restarting mid-run is)."""
    where = bindir()
    subprocess.run(_as_owner([f"{where}/pg_ctl", "-D", os.path.join(root, "data"), "-m", "fast",
                              "-w", "restart"]), check=True, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    verb, root = sys.argv[1], os.path.abspath(sys.argv[2])
    if verb == "start":
        print(start(root))
    elif verb == "stop":
        stop(root)
    else:
        sys.exit(f"usage: {sys.argv[0]} start|stop DIR")
