"""A full disk and a failing disk, at each kind of durable write of the crash matrix's
full scenario (tests/test_matrix.py).

Full: each case runs on its own small tmpfs, mounted for it; right after the chosen write
the engine's process really fills it (RALPH_TEST_FILL_DISK_AT_WRITE: a ballast file
written until ENOSPC). Failing: each case runs under an LD_PRELOAD shim
(tests/support/eio_shim.c, compiled here) that the engine arms at the chosen write
(RALPH_TEST_EIO_AT_WRITE): from then on every write under the workspace fails with EIO,
reads go on. The engine must stop with exit 3 and a reason naming the error and the
path, leave every file parseable and nothing half-written; once the ballast is removed
(or the shim disarmed), `resume` must complete with the same outcome as an uninterrupted
run: every signal handled once, every answer kept.

Mounting needs root (CI runs as root), the shim gcc; elsewhere these tests skip.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

import _crashkit as kit
from support import RALPH, base_env
from test_matrix import (SID, Human, Point, _diff, check_parses, full, resume,
                         resume_to_the_end, root, start)

__all__ = ["full", "root"]   # the matrix's fixtures, used here

pytestmark = pytest.mark.slow
DISK_MB = 8


class SmallDisk:
    """A tmpfs of DISK_MB mounted at `path` for the life of one case."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m,mode=0700",
                               "tmpfs", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            path.rmdir()
            if os.environ.get("CI"):
                pytest.fail(f"cannot mount a tmpfs (.ci/run runs as root): {done.stderr}")
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
        shutil.rmtree(self.path, ignore_errors=True)


@pytest.fixture(scope="module")
def can_mount(tmp_path_factory):
    SmallDisk(tmp_path_factory.mktemp("probe") / "disk").close()


@pytest.fixture(scope="module")
def eio_shim(tmp_path_factory) -> Path:
    so = tmp_path_factory.mktemp("shim") / "eio_shim.so"
    done = subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(so),
                           str(Path(__file__).parent / "support" / "eio_shim.c"), "-ldl"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot build the EIO shim: {done.stderr}")
        pytest.skip(f"cannot build the EIO shim (gcc): {done.stderr.strip()[:200]}")
    return so


def points_of_each_kind(base) -> list[Point]:
    """The first write of each kind in each process, and each process's last write."""
    chosen, seen = [], set()
    for p, writes in enumerate(base.writes, 1):
        for w in writes:
            if (p, w.kind) not in seen and not w.path.startswith(".ralph-sessions/.creating-"):
                seen.add((p, w.kind))
                chosen.append(Point(p, w))
        if Point(p, writes[-1]) not in chosen:
            chosen.append(Point(p, writes[-1]))
    only = os.environ.get("RALPH_TEST_DISK_POINTS")   # e.g. p1-055,p2-003 while developing
    return [pt for pt in chosen if pt.name in only.split(",")] if only else chosen


def status_of(ws: Path) -> dict:
    r = subprocess.run(RALPH + ["session", "status", SID, "--json"], cwd=ws, env=base_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


class Shimmed:
    """A plain directory whose writes fail with EIO once the engine arms the shim."""

    def __init__(self, path: Path, shim: Path):
        self.path = path
        path.mkdir(parents=True)
        self.flag = path.parent / f"{path.name}.eio"
        self.shim = shim

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self.flag.unlink(missing_ok=True)


def fault_at(tmp: Path, base, point: Point, fault: str, shim: Path | None,
             met: list[Point]) -> str | None:
    scenario = base.scenario
    where = tmp / f"{fault}-{point.name}"
    disk = SmallDisk(where) if fault == "full" else Shimmed(where, shim)
    ws = disk.path / "ws"
    ballast = disk.path / "ballast"
    env = ({"RALPH_TEST_FILL_DISK_AT_WRITE": point.write.n, "RALPH_TEST_BALLAST": ballast}
           if fault == "full" else
           {"RALPH_TEST_EIO_AT_WRITE": point.write.n, "RALPH_TEST_EIO_FLAG": disk.flag,
            "RALPH_TEST_EIO_PREFIX": str(ws), "LD_PRELOAD": str(shim)})
    env["RALPH_DEBUG"] = "1"   # an internal error shows its traceback (and fails the case)
    try:
        if point.process == 1:
            ws.mkdir()
        else:
            shutil.copytree(base.before[point.process - 1], ws, symlinks=True)
        sd = kit.session_dir(ws, SID)
        with Human(sd):
            r = start(ws, base.config, **env) if point.process == 1 else resume(ws, **env)
            said = r.stdout + r.stderr
            why = "no space left on " if fault == "full" else "I/O error on "
            if why in said or r.returncode not in scenario.exits:
                met.append(point)
                assert r.returncode == 3, f"exit {r.returncode}\n{said[-3000:]}"
                assert why in said, said[-2000:]
                assert said.count("Traceback") == 0, said
                if fault == "full":   # the room kept aside held the reason; a disk that
                    view = status_of(ws)   # fails every write keeps it on the console only
                    assert view["status"] == "paused" and why in view["pause_reason"], view
            # else the process ended (its scenario's own pause, or done) before it wrote
            # again: it never met the fault
            if fault == "full":
                ballast.unlink()
            else:
                disk.flag.unlink(missing_ok=True)   # the disk is healthy again
            kit.check_after_kill(ws, SID)
            leftovers = [p.name for p in sd.rglob(".*.tmp")]
            assert not leftovers, f"temp files left: {leftovers}"
            resume_to_the_end(ws, scenario)
        result = kit.check_finished(ws, SID, (".docs", ".ralph-demo/kv"))
        assert result == base.outcome, _diff(result, base.outcome)
        check_parses(ws)
        scenario.check(ws)
        assert not (sd / "disk-fault.yaml").exists()
    except Exception as e:  # noqa: BLE001 - reported per point
        st = os.statvfs(disk.path)
        big = sorted(((p.stat().st_size, str(p.relative_to(disk.path))) for p in
                      disk.path.rglob("*") if p.is_file()), reverse=True)[:5]
        holders = [f"{pid}:{os.readlink(f'/proc/{pid}/fd/{fd}')}" for pid in os.listdir("/proc")
                   if pid.isdigit() for fd in _fds(pid)
                   if str(disk.path) in _link(f"/proc/{pid}/fd/{fd}")]
        e = AssertionError(f"{e}\nfree {st.f_bavail * st.f_frsize} bytes; biggest {big}; "
                           f"open on the disk: {holders}")
        return f"{fault} disk after write {point.write.n} of process {point.process} " \
               f"({point.write.kind} {point.write.path}): {type(e).__name__}: {e}"
    finally:
        disk.close()
    return None


def _fds(pid: str) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def test_a_full_disk_at_each_kind_of_write_pauses_and_resumes(can_mount, full, tmp_path):
    run_faults(full, tmp_path, "full", None)


def test_a_failing_disk_at_each_kind_of_write_pauses_and_resumes(eio_shim, full, tmp_path):
    run_faults(full, tmp_path, "eio", eio_shim)


def run_faults(full, tmp_path: Path, fault: str, shim: Path | None) -> None:
    chosen = points_of_each_kind(full)
    began = time.monotonic()
    met: list[Point] = []
    failures = kit.run_all(lambda pt: fault_at(tmp_path, full, pt, fault, shim, met), chosen)
    kinds = Counter(pt.write.kind for pt in chosen)
    print(f"\n{fault} disk: {len(chosen)} write points in {time.monotonic() - began:.0f}s; "
          + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    assert not failures, f"{len(failures)} of {len(chosen)} points failed:\n" + \
        "\n".join(failures)
    # the engine must meet the fault nearly everywhere: only a process's last write comes
    # too late, or an agent's failed write (its temp file removed) gives back the room
    # for the engine's few next writes, and the session goes on untouched
    lasts = {Point(p, writes[-1]) for p, writes in enumerate(full.writes, 1)}
    missed = [pt.name for pt in chosen if pt not in met and pt not in lasts]
    assert len(missed) <= len(chosen) // 10, f"the fault never reached the engine at {missed}"
    if not os.environ.get("RALPH_TEST_DISK_POINTS"):
        assert len(chosen) >= 25


def test_one_shot_commands_on_a_full_disk_refuse_in_one_line(can_mount, tmp_path):
    disk = SmallDisk(tmp_path / "disk")
    try:
        ws = disk.path / "ws"
        ws.mkdir()
        r = subprocess.run(RALPH + ["session", "start", "fill me", "--id", "d1",
                                    "--max-iterations", "1"], cwd=ws,
                           env=base_env(RALPH_DEMO_SLEEP_SCALE="0"), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode in (0, 5), r.stderr
        sd = ws / ".ralph-sessions" / "d1"
        qdir = sd / "questions"
        (qdir / "q-open.yaml").write_text(
            "id: q-open\ntext: go?\nasked_at: '2026-11-25T00:00:00+00:00'\n"
            "deadline: '2099-01-01T00:00:00+00:00'\non_timeout: continue\n"
            "context: {session: d1, state: PLANNING, iteration: 1}\nstatus: pending\n")
        before = sorted(str(p.relative_to(ws)) for p in ws.rglob("*"))
        bus = (sd / "events.jsonl").read_bytes()
        with open(disk.path / "ballast", "wb", buffering=0) as f:
            for size in (1 << 20, 1 << 12, 1):
                try:
                    while True:
                        f.write(b"\0" * size)
                except OSError:
                    pass
        env = base_env(RALPH_SESSION_DIR=str(sd))
        big = "x" * 20000   # more than the slack in the last page of a file
        for argv in (["emit", "note.x", big], ["signal", "info", "a note", "--session", "d1"],
                     ["session", "answer", "d1", "yes", "--question", "q-open"]):
            r = subprocess.run(RALPH + argv, cwd=ws, env=env, capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 2, (argv, r.returncode, r.stderr)
            assert r.stderr.count("\n") == 1 and "no space left on " in r.stderr, r.stderr
        assert sorted(str(p.relative_to(ws)) for p in ws.rglob("*")) == before
        assert (sd / "events.jsonl").read_bytes() == bus
    finally:
        disk.close()
