"""`ralph diagram`: the machine drawn from its one definition (engine/machine.py) with
transitions' diagram support. With a session, its current state is highlighted and
the transitions it took are drawn with their counts (from its session.transition
records), so a paused session's picture shows where it stopped and how it got there.
"""
from __future__ import annotations

import re
import shutil
from collections import Counter

from session_store import BadInput, State, load, read_events

from .machine import rows_for_transitions

TITLE = "ralph session machine"
FORMATS = ("mermaid", "dot", "svg", "png")
INSTALL_HINT = ("svg and png need Graphviz's `dot` on the PATH (Debian/Ubuntu: "
                "apt-get install graphviz; macOS: brew install graphviz); mermaid and dot work "
                "without it")


class _Model:
    pass


def _graph(engine: str, current: State | None):
    from transitions.extensions import GraphMachine
    model = _Model()
    GraphMachine(model=model, states=[s.value for s in State], transitions=rows_for_transitions(),
                 initial=(current or State.PLANNING).value, auto_transitions=False,
                 graph_engine=engine, show_conditions=False, title=TITLE)
    return model.get_graph()


def session_path(workspace: str, session_id: str) -> tuple[State, Counter]:
    """The session's current state, and how often each (from, trigger, to) was taken."""
    session = load(workspace, session_id)
    records, _ = read_events(session.dir)
    taken = Counter((r["payload"]["from"], r["payload"]["trigger"], r["payload"]["to"])
                    for r in records if r["topic"] == "session.transition"
                    and isinstance(r["payload"], dict))
    return session.metadata.orchestrator.state, taken


def _label(triggers: str, src: str, dst: str, taken: Counter) -> tuple[str, bool]:
    parts, any_taken = [], False
    for trigger in (t.strip() for t in triggers.split("|")):
        n = taken.get((src, trigger, dst), 0)
        any_taken |= n > 0
        parts.append(f"{trigger} ×{n}" if n else trigger)
    return " | ".join(parts), any_taken


def mermaid(current: State | None = None, taken: Counter | None = None) -> str:
    source = _graph("mermaid", current).draw(None)
    if current is None:  # the plain machine: no state is "active"
        source = source.replace("Class PLANNING s_active", "Class PLANNING s_default")
    if not taken:
        return source
    visited = {s for key in taken for s in (key[0], key[2])}

    def edge(m):
        label, _ = _label(m["label"], m["src"], m["dst"], taken)
        return f"{m['indent']}{m['src']} --> {m['dst']}: {label}"
    source = re.sub(r"(?m)^(?P<indent>\s*)(?P<src>\w+) --> (?P<dst>\w+): (?P<label>.+)$",
                    edge, source)
    for state in visited - {current.value}:
        source = source.replace(f"Class {state} s_default", f"Class {state} s_previous")
    return source


def dot(current: State | None = None, taken: Counter | None = None) -> str:
    graph = _graph("graphviz", current)
    source = graph.source
    if current is None:
        source = source.replace(
            'PLANNING [label="PLANNING\\l" color=red fillcolor=darksalmon peripheries=2]',
            'PLANNING [label="PLANNING\\l"]')
    if not taken:
        return source

    def edge(m):
        label, hit = _label(m["label"].strip('"'), m["src"], m["dst"], taken)
        style = " color=blue fontcolor=blue penwidth=2.5" if hit else ""
        return f'{m["indent"]}{m["src"]} -> {m["dst"]} [label="{label}"{style}]'
    source = re.sub(r'(?m)^(?P<indent>\s*)(?P<src>\w+) -> (?P<dst>\w+) \[label=(?P<label>"[^"]*"|\w+)\]$',
                    edge, source)
    visited = {s for key in taken for s in (key[0], key[2])} - {current.value}
    for state in visited:
        source = source.replace(f'{state} [label="{state}\\l"]',
                                f'{state} [label="{state}\\l" color=blue fillcolor=azure]')
    return source


def render(fmt: str, current: State | None = None, taken: Counter | None = None) -> bytes:
    if fmt == "mermaid":
        return mermaid(current, taken).encode()
    source = dot(current, taken)
    if fmt == "dot":
        return source.encode()
    if shutil.which("dot") is None:
        raise BadInput(f"--format {fmt}: {INSTALL_HINT}")
    import graphviz
    return graphviz.Source(source).pipe(format=fmt)
