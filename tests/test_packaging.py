"""ralph installs under one import namespace: its three folders as ralph.engine,
ralph.states and ralph.session_store, so nothing generic (`engine`, `states`, ...) lands at
the top of site-packages, and running it needs no test tools."""
from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile

import pytest

from support import REPO

FOLDERS = ("engine", "states", "session_store")


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_package_of_the_three_folders_is_listed_under_ralph():
    found = {"ralph." + str(init.parent.relative_to(REPO)).replace("/", ".")
             for folder in FOLDERS for init in (REPO / folder).rglob("__init__.py")
             if "__pycache__" not in init.parts}
    listed = set(pyproject()["tool"]["setuptools"]["packages"])
    assert listed == found, f"missing: {found - listed}; not a package: {listed - found}"


def test_running_needs_no_test_tools():
    project = pyproject()["project"]
    needed = " ".join(project["dependencies"]).lower()
    for tool in ("pytest", "playwright", "mypy", "ruff", "hypothesis", "mkdocs"):
        assert tool not in needed, f"{tool} is a dependency of running ralph"


@pytest.mark.slow
def test_the_wheel_holds_only_the_ralph_namespace(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                           "--wheel-dir", str(tmp_path), str(REPO)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    [wheel] = tmp_path.glob("ralph-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"ralph", next(t for t in tops if t.endswith(".dist-info"))}, tops
    for folder in FOLDERS:
        assert f"ralph/{folder}/__init__.py" in names
    assert "ralph/engine/scenarios/demo.yaml" in names or \
        any(n.startswith("ralph/engine/scenarios/") and n.endswith(".yaml") for n in names)
    assert any(n.startswith("ralph/engine/channels/web/static/") for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "ralph = ralph.engine.entry:main" in zipfile.ZipFile(wheel).read(entry).decode()
