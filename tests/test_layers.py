"""The layers are a DAG: session_store knows nothing above it, states know no engine, and
no files import each other in a circle; the store's backends stand side by side over its
shared layer; the store owns every file name and format; no module grows past ~400 lines."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS = ("session_store", "states", "engine")   # each may import only what is left of it
MAX_LINES = 420
# the store's own names for its files: nothing above it spells them
STORE_FILES = ("metadata.yaml", "events.jsonl", "guidance.yaml", "scratchpad.md",
               "summary.md", "config.yaml", "promoted.yaml",
               "carried_from.yaml", "progress.md", "plan.md", "session.lock",
               "disk-fault.yaml", "disk-reserve", ".ralph-sessions",
               # the work area's: where agents' tools write and the engine replies
               "outbox.jsonl", "engine.lock", "inbox")


def modules(package: str):
    return sorted((REPO / package).rglob("*.py"))


def ours(module: str) -> str:
    """A module as its folder names it: the packages install under `ralph.` (pyproject's
    package-dir), so `ralph.engine.driver` is engine/driver.py."""
    return module.removeprefix("ralph.")


def imported(path: Path, relative: bool = False) -> list[tuple[int, str]]:
    """(line, module) of each import; with `relative`, each name a `from` takes too (relative
    imports included), as `module.name`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, ours(a.name)) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and relative:
            found += [(node.lineno, f"{ours(node.module or '')}.{a.name}") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, ours(node.module)))
    return found


@pytest.mark.parametrize("layer", LAYERS)
def test_no_import_goes_up(layer):
    above = LAYERS[LAYERS.index(layer) + 1:]
    up = [f"{path.relative_to(REPO)}:{line} imports {name}"
          for path in modules(layer) for line, name in imported(path)
          if name.split(".")[0] in above]
    assert not up, "\n".join(up)


@pytest.mark.parametrize("layer", ("states", "engine"))
def test_only_the_store_names_its_files(layer):
    named = [f"{path.relative_to(REPO)}:{n} names {f}"
             for path in modules(layer)
             for n, text in enumerate(path.read_text().splitlines(), 1)
             for f in STORE_FILES if re.search(rf"[\"'/]{re.escape(f)}[\"']", text)]
    assert not named, "\n".join(named)


@pytest.mark.parametrize("layer", LAYERS)
def test_modules_stay_small(layer):
    big = [f"{path.relative_to(REPO)}: {n} lines" for path in modules(layer)
           if (n := len(path.read_text().splitlines())) > MAX_LINES]
    assert not big, "\n".join(big)


# what a state may take from the store: values and the words to read them, never a
# writable object of its (states change the session through the context's intents)
STATES_READ = {"State", "PauseKind", "PlannedTask", "BadInput", "check_id", "progress",
               "structure"}


def test_states_act_through_the_context():
    taken = [f"{path.relative_to(REPO)}:{node.lineno} takes {alias.name} from the store"
             for path in modules("states") if path.name != "context.py"
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) and ours(node.module or "") == "session_store"
             for alias in node.names if alias.name not in STATES_READ]
    assert not taken, "\n".join(taken)


# the file backend's own ways (byte offsets of the bus, paths to watch, its private
# modules): above the store, a bus is read by seq and wakeups come from its verbs
BACKEND_ONLY = {"read_events", "complete_size", "EventReader", "tail_events",
                "engine_watch_paths", "watch_paths", "change_at", "backwards"}


@pytest.mark.parametrize("layer", ("states", "engine"))
def test_nothing_above_the_store_reads_its_files_as_files(layer):
    found = [f"{path.relative_to(REPO)}:{node.lineno} takes {name}"
             for path in modules(layer)
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) and node.module
             and ours(node.module).split(".")[0] == "session_store"
             for name in ([node.module] if ours(node.module).startswith("session_store._")
                          else [])
             + [a.name for a in node.names if a.name in BACKEND_ONLY]]
    assert not found, "\n".join(found)


# the engine's inner layers: a human channel is wired in by the composition root (the
# driver) and the CLI; the core, its config included, never imports one
CHANNEL_WIRING = {"engine/driver.py"}


def test_the_core_never_imports_a_channel():
    found = [f"{path.relative_to(REPO)}:{line} imports {name}"
             for path in modules("engine")
             if not {"channels", "cli"} & set(path.relative_to(REPO).parts)
             and str(path.relative_to(REPO)) not in CHANNEL_WIRING
             for line, name in imported(path, relative=True)
             if "channels" in name.split(".")]
    assert not found, "\n".join(found)


# --- no circle: the files of engine/, states/ and session_store/ import in one direction ---

def module_of(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Each module file under `packages` -> the module files it imports (paths relative to
    `root`). Every import counts: at the top, in a function, under TYPE_CHECKING. A
    function's import only delays a circle to the first call (it is how one is hidden, not
    how one is undone), and a TYPE_CHECKING one is a circle of the types. `from m import x`
    names the module m.x when there is one, else m; a package's __init__ imported on the way
    to one of its modules is not counted (it is the package's face, not what is used)."""
    def rel(path: Path) -> str:
        return str(path.relative_to(root))

    files = {module_of(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [ours(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] \
                    if node.level else []
                module = ".".join(base + ([ours(node.module)] if node.module else []))
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in files else module
                           for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in files and t != name}
    return {rel(files[name]): {rel(files[t]) for t in targets} for name, targets in graph.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            component.append(v)
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def circle_report(root: Path, packages: tuple[str, ...]) -> list[str]:
    graph = import_graph(root, packages)
    return [f"a circle of {len(c)} files: " + ", ".join(
                f"{m} (imports {', '.join(sorted(graph[m] & set(c)))})" for m in c)
            for c in circles(graph)]


def test_no_files_import_each_other_in_a_circle():
    found = circle_report(REPO, LAYERS)
    assert not found, "\n".join(found)


def test_a_circle_is_found_and_its_files_named(tmp_path):
    """The check above fails on a circle: three files, one of them reaching back lazily
    from a function through a relative import, and a file that only joins them."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.sub import b\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("from .c import thing\n")
    (tmp_path / "pkg" / "sub" / "c.py").write_text("def thing():\n    from .. import a\n")
    (tmp_path / "pkg" / "d.py").write_text("import pkg.a\n")
    assert circle_report(tmp_path, ("pkg",)) == [
        "a circle of 3 files: pkg/a.py (imports pkg/sub/b.py), pkg/sub/b.py (imports "
        "pkg/sub/c.py), pkg/sub/c.py (imports pkg/a.py)"]
    (tmp_path / "pkg" / "sub" / "c.py").write_text("def thing():\n    return 1\n")
    assert circle_report(tmp_path, ("pkg",)) == []


# the store's two backends stand beside each other over its shared layer (session_store/
# _*.py): each imports only that layer, never the other nor the top that chooses between
# them (_open.py, __init__.py); the shared layer imports neither (a third backend is one
# more folder)
BACKENDS = ("files", "postgres")
STORE_TOP = ("session_store/__init__.py", "session_store/_open.py")


def test_the_stores_backends_are_siblings_over_its_shared_layer():
    graph = import_graph(REPO, ("session_store",))

    def backend(path: str) -> str | None:
        parts = path.split("/")
        return parts[1] if len(parts) > 2 and parts[1] in BACKENDS else None

    wrong = [f"{m} imports {t}" for m, targets in sorted(graph.items()) for t in sorted(targets)
             if (backend(t) is not None and backend(t) != backend(m) and m not in STORE_TOP)
             or (t in STORE_TOP and m not in STORE_TOP)]
    assert not wrong, "\n".join(wrong)
    assert all((REPO / "session_store" / b / "__init__.py").is_file() for b in BACKENDS)


def test_the_file_watcher_is_the_stores_own():
    assert not (REPO / "engine/inotify.py").exists()
    assert "def watch(" not in (REPO / "engine/mailbox.py").read_text()


# a session's questions, signals and run lease are verbs of its handle (`session.questions`,
# `session.signals`, `session.running_pid()`, `session.acquire_lease()`): nothing above the
# store hands it a session's path back, so a database backend can implement the handle
DIR_VERBS = re.compile(
    r"(?<![.\w])(questions|signals)\.(ask|save_question|load_question|ids|questions|pending"
    r"|answer|read_answer|has_answer|resolve|mark_asker_gone|mark_undeliverable|drop|waiting"
    r"|read|take|mark_handled|reject|taken_unmarked|finish_rejections|read_taken|guidance"
    r"|queue_guidance|delivered|forget_delivered)\("
    r"|\b(questions|signals)\.[a-z_]+\((self\.)?(_dir|session\.dir|d|sdir)\b"
    r"|running_pid\(\s*[^)\s]|\bacquire_lock\b")
# (module, the text that may stay): why it has a path and no session
PATH_TO_THE_STORE = {
    ("engine/tools/emit.py", "signals.waiting(control)"):
        "an agent's step-boundary poll on the cold path: $RALPH_CONTROL_DIR, no session loaded",
}
# where engine code keeps the control plane's path itself, never handing it to the store
SESSION_DIR_KEPT = {
    "engine/cli/sessions.py": "`session start` tells the human where the control files are",
    "engine/views.py": "the session view shows its control_dir",
    "engine/humans/fallback.py": "the work state's name in the event: relative to the session",
}


@pytest.mark.parametrize("layer", ("states", "engine"))
def test_no_session_path_goes_to_the_store(layer):
    found = [f"{rel}:{n}: {text.strip()}"
             for path in modules(layer) if (rel := str(path.relative_to(REPO)))
             for n, text in enumerate(path.read_text().splitlines(), 1)
             if DIR_VERBS.search(text)
             and not any(rel == where and allowed in text
                         for where, allowed in PATH_TO_THE_STORE)]
    assert not found, "\n".join(found)
    kept = [f"{rel}:{n}: {text.strip()}"
            for path in modules(layer) if (rel := str(path.relative_to(REPO)))
            for n, text in enumerate(path.read_text().splitlines(), 1)
            if re.search(r"\bsession\.dir\b|\bself\._dir\b", text)
            and rel not in SESSION_DIR_KEPT]
    assert not kept, "\n".join(kept)


def test_the_allow_lists_are_current():
    for (where, allowed), _why in PATH_TO_THE_STORE.items():
        assert allowed in (REPO / where).read_text(), where
    for where in SESSION_DIR_KEPT:
        assert re.search(r"\bsession\.dir\b", (REPO / where).read_text()), where
