"""Faults beyond kill -9: many writers of one file at once."""
from __future__ import annotations

import subprocess
import sys
import threading

import yaml

from support import REPO, base_env
from session_store import write_atomic

PAD = "x" * 4000     # bigger than one write of a pipe, so a torn file would show


def _parse(text: str) -> str:
    doc = yaml.safe_load(text)
    assert doc["pad"] == PAD, "a torn read"
    return doc["who"]


def test_threads_and_processes_rewriting_one_file_never_tear_it(tmp_path):
    """DESIGN §4: a reader never sees half a file, even with writers in threads of one
    process (a channel's thread beside the engine's) and in other processes at once."""
    path = tmp_path / "question.yaml"
    write_atomic(str(path), yaml.safe_dump({"who": "start", "pad": PAD}))
    errors: list[str] = []
    reads = [0]
    done = threading.Event()

    def write_in_thread(k: int) -> None:
        try:
            for i in range(200):
                write_atomic(str(path), yaml.safe_dump({"who": f"t{k}-{i}", "pad": PAD}))
        except Exception as e:  # noqa: BLE001 - every failure is the test's finding
            errors.append(f"writer t{k}: {type(e).__name__}: {e}")

    def read() -> None:
        while not done.is_set():
            try:
                _parse(path.read_text())
                reads[0] += 1
            except Exception as e:  # noqa: BLE001
                errors.append(f"reader: {type(e).__name__}: {e}")

    script = ("import sys, yaml\nfrom session_store import write_atomic\n"
              "for i in range(200):\n"
              "    write_atomic(sys.argv[1], yaml.safe_dump({'who': f'p{sys.argv[2]}-{i}', "
              f"'pad': {PAD!r}}}))\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), str(k)], cwd=REPO,
                              env=base_env(), stderr=subprocess.PIPE, text=True)
             for k in range(2)]
    threads = [threading.Thread(target=write_in_thread, args=(k,)) for k in range(4)]
    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in threads + readers:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        _out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    done.set()
    for t in readers:
        t.join()
    assert not errors, errors[:5]
    assert reads[0] > 50
    assert _parse(path.read_text()).startswith(("t", "p"))
    assert [p.name for p in tmp_path.iterdir()] == ["question.yaml"]   # no temp file left
