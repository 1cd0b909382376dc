"""Another local user, for the tests of what a user other than the operator can do: a
system user (`nobody`, else one made with useradd) whose programs run through setpriv (or
runuser), with a Python of the system's that such a user may execute. The tests run as
root in CI; where switching users is not possible they skip, unless CI=1 is set."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys

import pytest

OTHER = "ralph-other"   # made when the system has no `nobody`
PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", os.path.realpath(sys.executable))
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}   # nothing of root's


def _unavailable(why: str):
    if os.environ.get("CI"):
        pytest.fail(f"another local user is needed and cannot be had: {why}")
    pytest.skip(why)


def _account() -> pwd.struct_passwd:
    for name in ("nobody", OTHER):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    OTHER], check=True, capture_output=True)
    return pwd.getpwnam(OTHER)


def other_user_command() -> list[str]:
    """The argv prefix that runs a Python script as another local user, without root's
    groups or environment: [switch..., python, -I, -S]."""
    if os.geteuid() != 0:
        _unavailable("switching to another user needs root")
    user = _account()
    if shutil.which("setpriv"):
        switch = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                  "--clear-groups"]
    elif shutil.which("runuser"):
        switch = ["runuser", "-u", user.pw_name, "--"]
    else:
        _unavailable("neither setpriv nor runuser is installed")
    for python in PYTHONS:
        argv = [*switch, python, "-I", "-S"]
        if os.path.exists(python) and subprocess.run(
                [*argv, "-c", "import os; assert os.getuid() != 0"], cwd="/", env=_ENV,
                capture_output=True).returncode == 0:
            return argv
    _unavailable(f"no Python that {user.pw_name} may run among {', '.join(PYTHONS)}")


def run_as_other_user(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `argv` (as other_user_command() starts it) in / with a bare environment."""
    return subprocess.run(argv, cwd="/", env=_ENV, capture_output=True, text=True,
                          timeout=timeout)
