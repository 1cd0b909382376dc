"""A full disk and a failing disk, at each kind of durable write of the crash matrix's
full scenario (tests/test_matrix.py), under each of the session's two trees: the
workspace (the work area, the promoted docs) and the state directory (the control
plane), which may well be on another disk.

Full: the tree's disk is a small tmpfs, mounted for the case (at the workspace, or at
the control root of the workspace's sessions in the state directory); right after the
chosen write the engine's process really fills it (RALPH_TEST_FILL_DISK_AT_WRITE: a
ballast file written until ENOSPC). Failing: each case runs under an LD_PRELOAD shim
(tests/support/eio_shim.c, compiled here) that the engine arms at the chosen write
(RALPH_TEST_EIO_AT_WRITE): from then on every write under the tree fails with EIO,
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
from ralph.session_store import control_root
from support import RALPH, base_env
from test_matrix import (SID, Files, Human, Point, _diff, check_humans_and_signals, check_parses,
                         full, points_of, resume, resume_to_the_end, root, start,
                         thinned)

__all__ = ["full", "root"]   # the matrix's fixtures, used here

pytestmark = pytest.mark.slow
DISK_MB = 8
PLACES = ("workspace", "state")   # the tree on the faulty disk


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
def backend():
    """The matrix's full scenario on the file store: the faulty disks are its files'."""
    return Files()


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


def in_tree(point: Point, place: str) -> bool:
    """Whether a write lands on the faulty disk: the workspace's (the work area, the
    promoted docs), or the state directory's (the control plane)."""
    in_workspace = point.write.path.startswith((".ralph-sessions/", ".docs/", ".ralph-demo/"))
    return in_workspace == (place == "workspace")


def points_of_each_kind(base, place: str) -> list[Point]:
    """The first write of each kind on the faulty disk (a repeat is the same code: a fault
    armed elsewhere is met at the tree's next write, a kind covered here), and each
    process's last write (past which the fault may never be met)."""
    points = [pt for pt in points_of(base) if not pt.creating]
    chosen = thinned([pt for pt in points if in_tree(pt, place)], lambda pt: pt.write.kind,
                     lasts=False)
    for p in range(1, len(base.writes) + 1):
        last = [pt for pt in points if pt.process == p][-1]
        if last not in chosen:
            chosen.append(last)
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


def fault_at(tmp: Path, base, point: Point, fault: str, place: str, shim: Path | None,
             met: list[Point]) -> str | None:
    scenario = base.scenario
    where = tmp / f"{fault}-{place}-{point.name}"
    # the workspace on the faulty disk, or (place "state") a plain one whose sessions'
    # control root is on it
    ws = where / "ws" if place == "workspace" else where.with_name(where.name + "-ws")
    faulty = where if place == "workspace" else Path(control_root(str(ws)))
    disk = SmallDisk(faulty) if fault == "full" else Shimmed(faulty, shim)
    ballast = disk.path / ".ballast"
    env = ({"RALPH_TEST_FILL_DISK_AT_WRITE": point.write.n, "RALPH_TEST_BALLAST": ballast}
           if fault == "full" else
           {"RALPH_TEST_EIO_AT_WRITE": point.write.n, "RALPH_TEST_EIO_FLAG": disk.flag,
            "RALPH_TEST_EIO_PREFIX": str(disk.path), "LD_PRELOAD": str(shim)})
    env["RALPH_DEBUG"] = "1"   # an internal error shows its traceback (and fails the case)
    try:
        if point.process == 1:
            ws.mkdir()
        else:
            kit.copy_workspace(base.before[point.process - 1], ws)
        sd, work = kit.session_dir(ws, SID), kit.work_area(ws, SID)
        with Human(ws):
            r = start(ws, base.config, **env) if point.process == 1 else resume(ws, **env)
            said = r.stdout + r.stderr
            why = "no space left on " if fault == "full" else "I/O error on "
            if why in said or r.returncode not in scenario.exits:
                met.append(point)
                assert r.returncode == 3, f"exit {r.returncode}\n{said[-3000:]}"
                assert why in said, said[-2000:]
                assert said.count("Traceback") == 0, said
                assert f"{why}{disk.path}" in said, f"not a path of the faulty disk:\n" \
                                                   f"{said[-2000:]}"
                if fault == "full":   # the room kept aside held the reason; a disk that
                    view = status_of(ws)   # fails every write keeps it on the console only
                    assert view["status"] == "paused" and why in view["pause_reason"], view
            # else the process ended (its scenario's own pause, or done) before it wrote
            # again there: it never met the fault
            if fault == "full":
                ballast.unlink()
            else:
                disk.flag.unlink(missing_ok=True)   # the disk is healthy again
            kit.check_after_kill(ws, SID)
            leftovers = [p.name for p in [*sd.rglob(".*.tmp"), *work.rglob(".*.tmp")]]
            assert not leftovers, f"temp files left: {leftovers}"
            resume_to_the_end(ws, scenario)
        result = kit.check_finished(ws, SID, (".docs", ".ralph-demo/kv"))
        assert result == base.outcome, _diff(result, base.outcome)
        check_parses(ws)
        # the humans cannot answer on a full control plane: the in-run question, which
        # the engine waits for without writing, may time out meanwhile
        check_humans_and_signals(ws, in_run_may_time_out=(fault, place) == ("full", "state"))
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
        return f"{fault} disk ({place}) after write {point.write.n} of process " \
               f"{point.process} ({point.write.kind} {point.write.path}): " \
               f"{type(e).__name__}: {e}"
    finally:
        disk.close()
        kit.remove_workspace(ws)
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


@pytest.mark.parametrize("place", PLACES)
def test_a_full_disk_at_each_kind_of_write_pauses_and_resumes(can_mount, full, tmp_path, place):
    run_faults(full, tmp_path, "full", place, None)


@pytest.mark.parametrize("place", PLACES)
def test_a_failing_disk_at_each_kind_of_write_pauses_and_resumes(eio_shim, full, tmp_path,
                                                                 place):
    run_faults(full, tmp_path, "eio", place, eio_shim)


def run_faults(full, tmp_path: Path, fault: str, place: str, shim: Path | None) -> None:
    chosen = points_of_each_kind(full, place)
    began = time.monotonic()
    met: list[Point] = []
    failures = kit.run_all(lambda pt: fault_at(tmp_path, full, pt, fault, place, shim, met),
                           chosen)
    kinds = Counter(pt.write.kind for pt in chosen)
    print(f"\n{fault} disk ({place}): {len(chosen)} write points in "
          f"{time.monotonic() - began:.0f}s, the fault met at {len(met)}; "
          + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    assert not failures, f"{len(failures)} of {len(chosen)} points failed:\n" + \
        "\n".join(failures)
    # the engine must meet the fault nearly everywhere: only a process's last writes come
    # too late (none of the tree's follows), or an agent's failed write (its temp file
    # removed) gives back the room for the engine's few next writes, and the session goes
    # on untouched
    lasts = {pt for p in range(1, len(full.writes) + 1)
             for pt in [[x for x in chosen if x.process == p][-1]]}
    missed = [pt.name for pt in chosen if pt not in met and pt not in lasts]
    assert len(missed) <= len(chosen) // 10, f"the fault never reached the engine at {missed}"
    if not os.environ.get("RALPH_TEST_DISK_POINTS"):
        assert len(chosen) >= {"workspace": 5, "state": 19}[place], "the scenario shrank"


def test_one_shot_commands_on_a_full_disk_refuse_in_one_line(can_mount, tmp_path):
    """The workspace and the state directory on one full disk: an agent's `ralph emit` (the
    outbox, in the work area), a human's `ralph signal` and `ralph session answer` (the
    control plane) each refuse in one line, and change nothing in either tree."""
    disk = SmallDisk(tmp_path / "disk")
    try:
        with kit.state_in(disk.path):
            one_shot_commands_on_a_full_disk(disk.path)
    finally:
        disk.close()


def one_shot_commands_on_a_full_disk(disk: Path) -> None:
    ws = disk / "ws"
    ws.mkdir()
    r = subprocess.run(RALPH + ["session", "start", "fill me", "--id", "d1",
                                "--max-iterations", "1"], cwd=ws,
                       env=base_env(RALPH_DEMO_SLEEP_SCALE="0"), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode in (0, 5), r.stderr
    sd, work = kit.session_dir(ws, "d1"), kit.work_area(ws, "d1")
    assert sd.is_relative_to(disk) and work.is_relative_to(disk)
    (sd / "questions" / "q-open.yaml").write_text(
        "id: q-open\ntext: go?\nasked_at: '2026-11-25T00:00:00+00:00'\n"
        "deadline: '2099-01-01T00:00:00+00:00'\non_timeout: continue\n"
        "context: {session: d1, state: PLANNING, iteration: 1}\nstatus: pending\n")

    def files() -> list[str]:
        return sorted(str(p) for tree in (ws, kit.state_of(ws)) for p in tree.rglob("*"))
    before = files()
    [channel] = (work / "runs").iterdir()   # the last run's, which the next start retires
    posted = channel / "outbox.jsonl"
    bus, outbox = (sd / "events.jsonl").read_bytes(), posted.read_bytes()
    with open(disk / "ballast", "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    agent = base_env(RALPH_SESSION_DIR=str(work), RALPH_RUN_ID=channel.name)
    big = "x" * 20000   # more than the slack in the last page of a file
    for argv, env in ((["emit", "note.x", big], agent),
                      (["signal", "info", "a note", "--session", "d1"], base_env()),
                      (["session", "answer", "d1", "yes", "--question", "q-open"], base_env())):
        r = subprocess.run(RALPH + argv, cwd=ws, env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2, (argv, r.returncode, r.stderr)
        assert r.stderr.count("\n") == 1 and "no space left on " in r.stderr, r.stderr
    assert files() == before
    assert (sd / "events.jsonl").read_bytes() == bus
    assert posted.read_bytes() == outbox
