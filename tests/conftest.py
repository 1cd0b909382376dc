"""pytest's hooks and fixtures for every test. The helpers live in tests/support/ (import
them from `support`); their names are also importable from here, as before."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.cli import FAST, RALPH, REPO, base_env, ralph, spawn, wait_for  # noqa: F401
from support.disk import (events, metadata, only_session, progress_markers,  # noqa: F401
                          session_dirs)
from support.scenarios import write_config, write_scenario  # noqa: F401
from support.sessions import clock, session, workspace  # noqa: F401  (fixtures)


@pytest.fixture
def web(workspace):
    """start(*args, env=None): a real `ralph web` in the workspace (tests/_web.py), stopped
    at the end of the test."""
    from _web import WebServer
    servers = []

    def start(*args, env=None):
        servers.append(WebServer(workspace, *args, env=env))
        return servers[-1]
    yield start
    for s in servers:
        s.stop(expect=None)


@pytest.fixture(scope="session")
def postgres_cluster():
    """The URL of a PostgreSQL database for the run: $RALPH_TEST_DATABASE_URL (`.ci/run`
    starts one), else a throwaway cluster of our own (tests/postgres_cluster.py), stopped
    at the end. No server installed: the PostgreSQL tests skip, or fail under CI=1."""
    import postgres_cluster
    url = os.environ.get("RALPH_TEST_DATABASE_URL")
    if url:
        yield url, None
        return
    if postgres_cluster.bindir() is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL's server is not installed (CI installs it: .ci/run)")
        pytest.skip("PostgreSQL's server is not installed")
    import shutil
    import tempfile
    root = tempfile.mkdtemp(prefix="ralph-test-postgres-")   # (the server's user walks it)
    try:
        yield postgres_cluster.start(root), root
    finally:
        postgres_cluster.stop(root, "immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_cluster, request):
    """A database URL of the run's cluster whose tables are this test's own (a schema
    of its own, first on the search path)."""
    import re
    import uuid
    import psycopg
    url, _root = postgres_cluster
    schema = "t_" + re.sub(r"\W", "_", request.node.name)[:40].lower() + "_" + uuid.uuid4().hex[:6]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    joiner = "&" if "?" in url else "?"
    yield f"{url}{joiner}options=-csearch_path%3D{schema}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


# --- test artefacts (the browser tests' screenshots), listed at the end of the run ---

ARTIFACTS = pytest.StashKey[list]()
STATE = pytest.StashKey[str]()   # the state directory this run made (removed at its end)


# outside the repository and every private folder of a sandbox; ~/.cache is not hidden
PYCACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ralph-tests-pycache"


def artifacts_dir() -> Path:
    """$RALPH_TEST_ARTIFACTS, else ralph-test-artifacts/ in the temp directory."""
    import tempfile
    root = os.environ.get("RALPH_TEST_ARTIFACTS") or os.path.join(tempfile.gettempdir(),
                                                                  "ralph-test-artifacts")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def pytest_configure(config):
    config.stash[ARTIFACTS] = []
    # a run started in a shell's background (`cmd &`, nohup) ignores SIGINT, and every
    # engine it spawns would inherit that (an ignored signal outlives exec): the tests that
    # interrupt an engine as a terminal's ^C does would wait for it in vain. A handler
    # does not outlive exec: the children get SIGINT's default, as from a terminal
    import signal
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # the sessions' control planes: one state directory for the run, outside every test's
    # workspace (as ~/.local/state/ralph is outside a user's); workspaces key it apart.
    # Under xdist each worker makes its own, as each machine of a fleet has one (what is
    # kept per state directory, a bot's lease, is not shared by tests that run at once)
    # bytecode cached for the run's thousands of processes, even under
    # PYTHONDONTWRITEBYTECODE (recompiling the engine in each costs a crash matrix a quarter
    # of its time), in a folder every agent run still reads: the sandbox gives each run a
    # /tmp of its own, where a cache would be missing, and Python would compile each module
    # of the standard library in every confined run (0.2 CPU-s each)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    made = os.environ.get("RALPH_TEST_STATE_MADE")
    if not os.environ.get("RALPH_STATE_DIR") or made == os.environ["RALPH_STATE_DIR"]:
        import tempfile
        os.environ["RALPH_STATE_DIR"] = config.stash[STATE] = tempfile.mkdtemp(
            prefix="ralph-state-")
        os.environ["RALPH_TEST_STATE_MADE"] = config.stash[STATE]


# started first, before the rest of the slow tier: a long test xdist hands out late ends the
# run alone (CI's run ended on the soak, started in the last five of its 25 minutes; then on
# the 150-second ask, a wait that costs no CPU and overlaps everything when started first)
FIRST = ("tests/test_soak.py::",
         "tests/test_real_agents.py::test_an_ask_answered_after_150_seconds")


def pytest_collection_modifyitems(config, items):
    """The slow tier first, the soak at its head: under xdist (`-n`), the long tests start
    at once and the quick ones fill the workers around them (worksteal), instead of one
    worker ending the run alone on a crash matrix (the stable sort keeps each tier's own
    order). Measured slower: handing out the longest first one at a time (`--dist load
    --maxschedchunk 1`), and laying the collection out so that each worker starts with an
    even share of the long tests: three workers then ran crash matrices at once, their
    kills and fsyncs contending, and the quick tests waited."""
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 not item.nodeid.startswith(FIRST)))


def pytest_unconfigure(config):
    made = config.stash.get(STATE, None)
    if made:
        import shutil
        shutil.rmtree(made, ignore_errors=True)


def _cpu_seconds() -> float:
    import resource
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


CPU_BEGAN = pytest.StashKey[float]()
SPENT: list[tuple[float, str]] = []   # (CPU seconds, test), as the reports come in


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[CPU_BEGAN] = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The CPU a test spent (its setup, call and teardown, with the processes it waited
    for: engines, agents, CLIs) rides on its last report, to the xdist controller: on CI's
    two cores the suite's time is its CPU, which --durations does not show."""
    outcome = yield
    if call.when == "teardown" and CPU_BEGAN in item.stash:
        outcome.get_result().user_properties.append(
            ("cpu_seconds", _cpu_seconds() - item.stash[CPU_BEGAN]))


def pytest_runtest_logreport(report):
    SPENT.extend((value, report.nodeid) for name, value in report.user_properties
                 if name == "cpu_seconds")


def pytest_terminal_summary(terminalreporter, config):
    if SPENT:
        terminalreporter.write_sep("=", f"most CPU: {min(25, len(SPENT))} of {len(SPENT)} tests, "
                                        f"{sum(c for c, _ in SPENT) / 60:.1f} CPU minutes in all")
        for cpu, nodeid in sorted(SPENT, reverse=True)[:25]:
            terminalreporter.write_line(f"{cpu:8.2f}s cpu {nodeid}")
    saved = config.stash.get(ARTIFACTS, [])
    if saved:
        terminalreporter.write_line(f"test artefacts ({len(saved)}), look at them:")
        for path in saved:
            terminalreporter.write_line(f"  {path}")
