"""ralph installs under one import namespace: its three folders as ralph.engine,
ralph.states and ralph.session_store, so nothing generic (`engine`, `states`, ...) lands at
the top of site-packages, running it needs no test tools, and the wheel, installed, works
from anywhere (no file of the repository on its path)."""
from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from support import FAST, REPO, base_env

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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    built = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                           "--wheel-dir", str(built), str(REPO)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    [found] = built.glob("ralph-*.whl")
    return found


@pytest.mark.slow
def test_the_wheel_holds_only_the_ralph_namespace(wheel):
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


@pytest.mark.slow
def test_the_installed_wheel_inits_and_runs_a_session_outside_the_repository(wheel, tmp_path):
    """As a user has it: the wheel in a venv of its own (its dependencies seen through a
    path entry, where this run's editable ralph is not), run from a directory outside the
    repository: `ralph init`, `validate`, and a whole demo session, its runs confined and
    supervised from the installed package."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    # a path entry, not a site directory: its .pth files (the editable ralph's) are not run
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                           "--no-deps", "--quiet", str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    ws = tmp_path / "project"
    ws.mkdir()
    env = base_env(**FAST)

    def ralph(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([venv / "bin" / "ralph", *args], cwd=ws, env=env,
                              capture_output=True, text=True, timeout=120)

    where = subprocess.run([python, "-c", "import ralph.engine; print(ralph.engine.__file__)"],
                           cwd=ws, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(str(site)), where.stdout
    r = ralph("init")
    assert r.returncode == 0 and (ws / "ralph.yml").exists(), r.stderr
    assert ralph("validate").returncode == 0
    r = ralph("session", "start", "Build a greeting CLI", "--id", "installed")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "session installed completed" in r.stdout, r.stdout
